"""A shuffled stream that reads several units side by side: ``StreamOptions(shuffle_units=K)``.

A plain shuffled stream fills its buffer from one unit after another (a Parquet row
group or slice, a TAR shard, in the epoch's permuted order): the buffer holds the
samples of one unit, or of two at a boundary, so neighbours in the output mostly come
from the same unit unless the buffer is larger than a unit. With ``shuffle_units=K``
the consumer reads K units at once and draws every sample from one of them at random:

- Consumer ``c`` of ``n`` (rank x DataLoader worker) runs K **lanes**, lane ``k`` being
  the stream of consumer ``c + n * k`` of ``n * K``. The lanes' shares are disjoint and
  together are exactly the consumer's share (every n-th unit, or with ``elastic`` the
  items ``c, c + n, ...`` of the epoch's remaining units): nothing is read twice or lost.
- Each lane has a shuffle buffer of ``ceil(shuffle / K)`` samples and reads ahead with
  ``prefetch_bytes / K`` bytes and ``prefetch_count / K`` units (at least one): the
  consumer holds the samples and bytes of one plain stream with these options, spread
  over K units.
- The next sample comes from a lane drawn at random (uniformly, by ``seed``, epoch and
  rank, with numpy as ``mix()`` draws; a lane that ended leaves the draw). So two
  neighbours come from the same lane with probability about ``1 / K``.

The lanes are ``mix(..., stop="all_exhausted")`` of plain streams, so a state is exact
at every sample (the draws and each lane's position), and with ``elastic=True`` the
states of all consumers merge (``merge_states``) into one job state, the lanes' states
merged as those of a job of ``n * K`` consumers: a job of any size with the same
``shuffle_units`` loads it, every sample once over the epoch, no unit read again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ._elastic import INTERLEAVED, JOB_KIND
from ._engine import check_state
from ._exceptions import SourceError
from ._mix import Mix
from ._models import Manifest
from ._options import StreamOptions
from ._ranks import rank_and_world

__all__ = ["Interleaved", "interleaved"]

KIND = INTERLEAVED
_STATE_VERSION = 1


def interleaved(
    make: Callable[..., Any],
    shuffle: int,
    rank: int | None,
    world_size: int | None,
    options: StreamOptions,
) -> Interleaved:
    """The K-lane stream of consumer ``rank`` of ``world_size`` (K: ``options.shuffle_units``);
    ``make(rank=, world_size=, shuffle=, options=)`` builds one lane (a plain ``Stream``)."""
    units = options.shuffle_units
    r, w = rank_and_world(rank, world_size)
    per_lane = replace(
        options,
        prefetch_bytes=max(1, options.prefetch_bytes // units),
        prefetch_count=max(1, options.prefetch_count // units),
    )
    buffer = max(1, math.ceil(shuffle / units))
    lanes = [
        make(rank=r + w * k, world_size=w * units, shuffle=buffer, options=per_lane)
        for k in range(units)
    ]
    shape = lanes[0]._sample_shape()
    if shape is not None:
        raise SourceError(
            f"StreamOptions(shuffle_units={units}) draws single rows from {units} units, but "
            f"this stream yields {shape}: set shuffle_units=1, or yield rows and batch them "
            "(e.g. with a DataLoader's batch_size)"
        )
    return Interleaved(lanes, units=units, seed=lanes[0]._seed, rank=r, world_size=w)


class Interleaved(Mix):
    """A stream whose samples are drawn from K lanes, each reading its units in turn
    through its own shuffle buffer: see the module docstring. Iterates, closes,
    resumes and reports statistics as a ``mix()`` of its lanes."""

    def __init__(
        self, lanes: Sequence[Any], *, units: int, seed: int, rank: int, world_size: int
    ) -> None:
        super().__init__(lanes, seed=seed, stop="all_exhausted", consumer=rank, what="lanes")
        self._units = units
        self._rank = rank
        self._world_size = world_size

    @property
    def manifest(self) -> Manifest | None:
        """The files being read, once resolved (every lane reads the same manifest)."""
        manifest: Manifest | None = getattr(self._members[0], "manifest", None)
        return manifest

    def state_dict(self) -> dict[str, Any]:
        """The exact position: the draws and every lane's state (see ``mix()``)."""
        return {
            "version": _STATE_VERSION,
            "kind": KIND,
            "epoch": self._epoch,
            "seed": self._seed,
            "shuffle_units": self._units,
            "rank": self._rank,
            "world_size": self._world_size,
            "lanes": super().state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` was taken: a state of this stream (same arguments, same
        rank and world_size), or a job state of ``merge_states`` (any layout, elastic)."""
        if not isinstance(state, Mapping):
            raise SourceError(f"state is a {type(state).__name__}, not a state_dict() (a dict)")
        if state.get("kind") == JOB_KIND:
            self._load_interleaved_job(state)
            return
        check_state(
            state,
            version=_STATE_VERSION,
            kind=KIND,
            same={
                "seed": self._seed,
                "shuffle_units": self._units,
                "rank": self._rank,
                "world_size": self._world_size,
            },
        )
        lanes = state.get("lanes")
        if not isinstance(lanes, Mapping):
            raise SourceError(
                f"state['lanes'] is a {type(lanes).__name__}, not the lanes' state: load a "
                "state_dict() of this stream, unchanged"
            )
        super().load_state_dict(lanes)

    def _load_interleaved_job(self, job: Mapping[str, Any]) -> None:
        if job.get("of") != KIND:
            raise SourceError(
                f"the job state is of {job.get('of')!r} streams, not of streams with "
                f"StreamOptions(shuffle_units={self._units}): resume with the options the "
                "job was saved with"
            )
        for key, mine in (("seed", self._seed), ("shuffle_units", self._units)):
            if job.get(key) != mine:
                raise SourceError(
                    f"the job state was saved with {key}={job.get(key)!r} but this stream has "
                    f"{key}={mine!r}: resume with the same arguments and options"
                )
        lanes_job = job.get("lanes")
        if not isinstance(lanes_job, Mapping):
            raise SourceError(
                f"the job state's 'lanes' is {type(lanes_job).__name__}: load merge_states()'s "
                "result, unchanged"
            )
        # each lane takes its share of the lanes' job
        self._load_members([lanes_job] * len(self._members), int(job.get("epoch") or 0))
