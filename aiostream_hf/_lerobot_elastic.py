"""Elastic LeRobot streams (``StreamOptions(elastic=True)``): the units are episodes.

The epoch's episodes are put in one order by (seed, epoch) (``_elastic.unit_order``), and
a consumer reads every n-th of what is left (``_elastic.share``), each episode's frames in
their own order by (seed, epoch, episode), as without ``elastic``. A consumer's plan is
its share as groups of one episode each, so that a LeRobot cursor (group, episode, frame)
names a unit and a position in it. A state is made exact at the item (``settle``): the
checkpoint of the batch the last item came from, walked forward over the items delivered
after it, without reading anything (frames are named by number, the shuffle buffer's
draws replayed from its RNG state).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._elastic import (
    Base,
    check_elastic,
    consumer_state,
    share,
    unit_order,
)
from ._engine import ShuffleBuffer, as_rng_state
from ._exceptions import SourceError
from ._lerobot_meta import EpisodeInfo
from ._lerobot_plan import _fingerprint, _following, _Plan

__all__ = [
    "LeRobotShare",
    "check_lerobot_state",
    "first_frame",
    "job_to_lerobot",
    "lerobot_share",
    "settle",
]


@dataclass(frozen=True)
class LeRobotShare:
    """A consumer's episodes (one per group, in order), the frame each starts at (by group),
    the state's ``elastic`` field and the shuffle buffer's seed."""

    order: list[list[EpisodeInfo]]
    starts: dict[int, int]
    elastic: dict[str, Any]
    seed: str


def lerobot_share(stream: Any, plan: _Plan, resume: Mapping[str, Any] | None) -> LeRobotShare:
    """The share of a LeRobot stream (consumer ``rank`` of ``world_size``) from the loaded
    state's base (None: the epoch's start); a state over other episodes is refused."""
    episodes = list(plan.episodes)
    digest = _fingerprint(plan)["digest"]
    saved = resume.get("elastic") if resume is not None else None
    base = Base()
    if saved is not None:
        if saved.get("dataset") != digest or saved.get("units") != len(episodes):
            raise SourceError(
                f"state was saved over other episodes ({saved.get('units')} episodes, dataset "
                f"{saved.get('dataset')}) than this stream reads ({len(episodes)}, {digest}): "
                "resume with the same dataset, revision, split and episodes"
            )
        base = Base.from_state(saved["base"], len(episodes), "state['elastic']['base']")
    shuffle = bool(stream._shuffle_buffer)
    order = unit_order(len(episodes), seed=stream._seed, epoch=stream._epoch, shuffle=shuffle)
    mine = share(base, len(episodes), stream._rank, stream._world_size)
    groups = [[episodes[order[g]]] for g, _ in mine]
    starts = {i: _frame(start) for i, (_, start) in enumerate(mine) if start is not None}
    elastic = {
        "stream": stream._identity(),
        "dataset": digest,
        "units": len(episodes),
        # as loaded, so that it equals the base of the job's other states
        "base": dict(saved["base"]) if saved is not None else base.to_state(),
    }
    seed = f"{stream._seed}:{stream._epoch}:buffer:{base.key()}:{stream._rank}"
    return LeRobotShare(groups, starts, elastic, seed)


def _frame(position: Mapping[str, Any]) -> int:
    frame = position.get("frame")
    if isinstance(frame, bool) or not isinstance(frame, int) or frame < 0:
        raise SourceError(
            f"state['elastic']['base']['partial'] holds {dict(position)!r}, not a LeRobot "
            "position ({'frame': n}): load the states the streams saved, unchanged"
        )
    return frame


def first_frame(g: int, e: int, start: tuple[int, int, int], starts: Mapping[int, int]) -> int:
    """The first frame to read of episode ``e`` of group ``g``: the cursor's (``start``:
    group, episode, frame) when it is there, and never before the group's start."""
    least = starts.get(g, 0) if e == 0 else 0
    return max(start[2], least) if (g, e) == start[:2] else least


def settle(
    cursor: Mapping[str, Any],
    skip: int,
    lerobot: LeRobotShare,
    frames: Callable[[EpisodeInfo], list[int]],
    buffer_size: int,
) -> dict[str, Any]:
    """The cursor ``skip`` items after ``cursor`` (a checkpoint): the producer's walk
    from it over frame numbers, through the shuffle buffer, to where the items delivered
    end; no data is read."""
    order = lerobot.order
    g0, e0, f0 = cursor["group"], cursor["episode"], cursor["frame"]
    seq = cursor["seq"]
    shuffle: ShuffleBuffer[tuple[int, int]] | None = None
    if buffer_size:
        shuffle = ShuffleBuffer(buffer_size)
        held = [(int(e), int(p)) for e, p in cursor.get("buffer") or ()]
        shuffle.restore(held, None if cursor.get("rng") is None else as_rng_state(cursor["rng"]))
    taken = 0

    def at(g: int, e: int, f: int) -> dict[str, Any]:
        held, rng = shuffle.state() if shuffle is not None else ([], None)
        return {
            "group": g,
            "episode": e,
            "frame": f,
            "seq": seq,
            "skip": 0,
            "buffer": [list(x) for x in held],
            "rng": rng,
        }

    for g in range(g0, len(order)):
        group = order[g]
        for e in range(e0 if g == g0 else 0, len(group)):
            episode = group[e]
            positions = frames(episode)
            for f in range(first_frame(g, e, (g0, e0, f0), lerobot.starts), episode.length):
                seq += 1
                row = (episode.index, positions[f])
                if shuffle is not None and shuffle.push(row) is None:
                    continue
                taken += 1
                if taken == skip:
                    return at(*_following(order, g, e, f))
    while shuffle is not None and len(shuffle):
        shuffle.pop()
        taken += 1
        if taken == skip:
            return at(len(order), 0, 0)
    raise SourceError(
        f"the LeRobot stream's position is {skip} items past its checkpoint, more than its "
        "share holds: a bug; please report it"
    )


def job_to_lerobot(job: Mapping[str, Any], stream: Any, version: int) -> dict[str, Any]:
    """A job state (``merge_states``) as the state of LeRobot ``stream``: nothing of its
    share taken, its share of the job's buffered frames."""
    if not stream._options.elastic:
        raise SourceError(
            "a job state (merge_states) loads into streams with StreamOptions(elastic=True) "
            "only: set it, as the streams that saved the states had it"
        )
    rank, world = stream._rank, stream._world_size
    base, elastic = consumer_state(job, "lerobot", {"seed": stream._seed})
    if job.get("elastic") is None:  # merged before any consumer began: the start
        elastic = {}
    if elastic and elastic.get("stream") != stream._identity():
        raise SourceError(
            "the job state is of another LeRobot stream (dataset, split, episodes, "
            "delta_timestamps, image_format, batch_items or shuffle differ): resume with "
            "the same arguments"
        )
    if elastic:  # its share of the buffered frames is in its cursor; not all of them
        held = {"buffer": [], "buffered": len(base.buffer)}
        elastic = {**elastic, "base": {**base.to_state(), **held}}
    cursor = {
        "group": 0,
        "episode": 0,
        "frame": 0,
        "seq": 0,
        "skip": 0,
        "buffer": [list(x) for x in base.buffer[rank::world]],
        "rng": None,
    }
    return {
        "version": version,
        "kind": "lerobot",
        "epoch": job.get("epoch"),
        "seed": stream._seed,
        "rank": rank,
        "world_size": world,
        "shuffle": stream._shuffle_buffer,
        "dataset": None,
        "cursor": cursor if elastic else None,
        "items": 0,
        "elastic": elastic or None,
    }


def check_lerobot_state(state: Mapping[str, Any], stream: Any) -> None:
    """A LeRobot state's ``elastic`` field against ``stream`` (see check_stream_state)."""
    saved = state.get("elastic")
    if not stream._options.elastic:
        if saved is not None:
            raise SourceError(
                "state was saved by a stream with StreamOptions(elastic=True): load it into "
                "one with the same options"
            )
        return
    if saved is None:
        if state.get("cursor") is None:
            return
        raise SourceError(
            "state has no 'elastic' field: it was saved by a stream without "
            "StreamOptions(elastic=True); resume with the options it was saved with"
        )
    check_elastic(state, stream._identity(), stream._rank, stream._world_size)
