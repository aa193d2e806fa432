"""PyTorch integration: ``IterableDataset``s over ``stream()`` and ``lerobot.stream()``.

    ds = ash.torch.StreamDataset("hf://datasets/org/name", split="train")
    loader = torchdata.stateful_dataloader.StatefulDataLoader(ds, num_workers=4)

    robot = ash.torch.LeRobotStreamDataset("hf://datasets/lerobot/pusht",
                                           delta_timestamps={"action": [0.0, 0.1]})

    both = ash.torch.MixDataset([ds, robot], [0.8, 0.2], stop="all_exhausted")

A dataset resolves its source once, in the process that builds it, and
pickles what workers need (the ``Manifest``, or the LeRobot metadata) to
DataLoader workers: workers make no API request. Work is split across rank x
worker: files (row groups when there are fewer files than consumers), or
LeRobot episodes (items when there are fewer episodes than consumers).
``state_dict()``/``load_state_dict()`` follow torchdata's Stateful protocol,
so ``StatefulDataLoader`` checkpoints each worker's exact position.
``set_epoch(n)`` reaches persistent workers through shared memory. ``MixDataset``
mixes such datasets by weight: each consumer mixes its own share of every member.
"""

from __future__ import annotations

import abc
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

try:
    import torch
    import torch.distributed
    import torch.utils.data
except ImportError as exc:
    raise ImportError(
        f"aiostream_hf.torch needs PyTorch, which cannot be imported ({exc}): "
        "pip install 'aiostream-hf[torch]'"
    ) from exc

from . import _elastic, _job_ranks, _ranks, lerobot
from ._exceptions import SourceError
from ._mix import Mix, Stop
from ._stream import stream

__all__ = [
    "LeRobotStreamDataset",
    "MixDataset",
    "StepStatistics",
    "StreamDataset",
    "TimedLoader",
    "dataset_states",
    "distributed_rank",
    "job_state",
]

_T = TypeVar("_T")


def distributed_rank() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when initialised, else RANK/WORLD_SIZE."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return _ranks.environment_rank() or (0, 1)


class _TorchBroadcast:
    """``_job_ranks.Broadcast`` over the default process group."""

    def __init__(self) -> None:
        self.rank = torch.distributed.get_rank()
        self.world = torch.distributed.get_world_size()

    def __call__(self, payload: Any) -> Any:
        box = [payload]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]


def _job_broadcast() -> _TorchBroadcast | None:
    """How the job's ranks share a resolution: torch.distributed when initialised."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return _TorchBroadcast()
    return None


def _check_flag(share_resolution: object) -> None:
    if not isinstance(share_resolution, bool):
        raise SourceError(f"share_resolution={share_resolution!r}: give True or False")


def dataset_states(loader_state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The stream states of every consumer in one rank's ``StatefulDataLoader.state_dict()``
    (one per DataLoader worker, or the loader's own with ``num_workers=0``), for
    ``aiostream_hf.merge_states``. A state whose worker snapshots lag behind the batches
    yielded (``snapshot_every_n_steps`` > 1) is refused: its positions are not exact."""
    if not isinstance(loader_state, Mapping):
        raise SourceError(
            f"loader_state is a {type(loader_state).__name__}: give a StatefulDataLoader's "
            "state_dict()"
        )
    snapshot = loader_state.get("_snapshot")
    if snapshot is None:  # num_workers=0: the dataset's state is the loader's
        found = loader_state.get("dataset_state")
        if not isinstance(found, Mapping):
            raise SourceError(
                "loader_state holds no dataset state: give the state_dict() of a "
                "StatefulDataLoader over an aiostream_hf.torch dataset"
            )
        return [_stream_of(found)]
    if loader_state.get("_steps_since_snapshot"):
        raise SourceError(
            f"loader_state is {loader_state['_steps_since_snapshot']} batches past its workers' "
            "snapshot (snapshot_every_n_steps > 1): the workers' positions are not those of "
            "the batches yielded; make the StatefulDataLoader with snapshot_every_n_steps=1"
        )
    workers = snapshot.get("_worker_snapshots") or {}
    out = []
    for key in sorted(workers, key=lambda k: int(str(k).rsplit("_", 1)[-1])):
        found = workers[key].get("dataset_state")
        if not isinstance(found, Mapping):
            raise SourceError(f"loader_state's {key} holds no dataset state: {found!r}")
        out.append(_stream_of(found))
    return out


def _stream_of(dataset_state: Mapping[str, Any]) -> dict[str, Any]:
    stream = dataset_state.get("stream")
    if not isinstance(stream, Mapping):
        raise SourceError(
            f"a dataset state holds no stream state ({dataset_state!r}): the loader was "
            "checkpointed before any of its workers began; nothing to merge"
        )
    return dict(stream)


def job_state(loader_states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One job state from every rank's ``StatefulDataLoader.state_dict()`` taken at the same
    step (gather them, e.g. with ``torch.distributed.all_gather_object``): the states of
    all ranks x workers, merged (``aiostream_hf.merge_states``). Each rank of a job of any
    size then calls ``dataset.load_state_dict(job)`` before iterating its DataLoader (with
    any ``num_workers``), instead of the loader's ``load_state_dict``."""
    if isinstance(loader_states, Mapping):
        raise SourceError(
            "job_state takes a list of loader states, one per rank: job_state([state])"
        )
    states: list[dict[str, Any]] = []
    for state in loader_states:
        states += dataset_states(state)
    return _elastic.merge_states(states)


class _Resumable(Protocol):
    """What a dataset needs of a stream: ``Stream`` and ``LeRobotStream`` both are."""

    def __iter__(self) -> Iterator[Any]: ...

    def set_epoch(self, epoch: int) -> None: ...

    def statistics(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _no_rank(kind: str, kwargs: dict[str, Any]) -> None:
    for key in ("rank", "world_size"):
        if key in kwargs:
            raise SourceError(
                f"{kind} takes no {key}=: it reads rank and world size from "
                "torch.distributed (or RANK/WORLD_SIZE) and splits across workers itself"
            )


class _StreamIterable(torch.utils.data.IterableDataset[Any]):
    """The torch side of a dataset: consumers, epochs, the Stateful protocol."""

    def __init__(self) -> None:
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._stream: _Resumable | None = None
        self._pending_state: dict[str, Any] | None = None

    @abc.abstractmethod
    def _open(self, consumer: int, consumers: int) -> _Resumable:
        """The stream of consumer ``consumer`` of ``consumers`` (rank x worker)."""

    def set_epoch(self, epoch: int) -> None:
        """Shuffle orders depend on (seed, epoch); persistent workers see it too."""
        self._epoch.fill_(epoch)

    def _consumer(self) -> tuple[int, int]:
        rank, world = distributed_rank()
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * workers + worker, world * workers

    def __iter__(self) -> Iterator[Any]:
        consumer, consumers = self._consumer()
        s = self._open(consumer, consumers)
        s.set_epoch(int(self._epoch))
        pending = self._pending_state
        # A job state stays with the parent's dataset (each worker gets a copy): it is the
        # position of its own epoch, and an epoch set after it (set_epoch) starts afresh.
        if (
            pending is not None
            and pending.get("kind") == _elastic.JOB_KIND
            and int(pending.get("epoch") or 0) < int(self._epoch)
        ):
            self._pending_state = None
        if self._pending_state is not None:
            s.load_state_dict(self._pending_state)
            self._pending_state = None
        self._stream = s
        return iter(s)

    def statistics(self) -> Any:
        """The ``statistics()`` of this process's stream (samples, requests, ``stalls``),
        None before it is iterated. A DataLoader's workers each have their own stream;
        with ``num_workers=0`` it is the loader's. ``TimedLoader`` times the loop."""
        return None if self._stream is None else self._stream.statistics()

    def state_dict(self) -> dict[str, Any]:
        """This consumer's exact position (torchdata Stateful protocol)."""
        # A stream loaded with a state reports that state until its pipeline takes it
        # up (StatefulDataLoader snapshots a worker right after iter()).
        if self._stream is None:
            return {"stream": self._pending_state}
        return {"stream": self._stream.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A consumer's state (torchdata Stateful protocol: from ``state_dict()``), or a job
        state (``job_state()``, ``aiostream_hf.merge_states``) for every consumer of a
        job of any size: load it into the dataset before the DataLoader's iteration, and
        each worker takes its share of what is left (``StreamOptions(elastic=True)``)."""
        if state.get("kind") == _elastic.JOB_KIND:
            self._pending_state = dict(state)
            return
        self._pending_state = state.get("stream")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_stream"] = None  # a live stream stays in its process
        return state


class StreamDataset(_StreamIterable):
    """A torch IterableDataset streaming ``source`` with ``stream(**stream_kwargs)``.

    Under torch.distributed (a process group initialised, more than one rank) the job
    resolves a Hub source once: global rank 0 resolves and broadcasts the manifest, so
    every rank builds its datasets like a collective: the same ones, in the same order.
    ``share_resolution=False`` resolves in each rank instead (per machine, or through
    ``StreamOptions.manifest_dir``), for a dataset that only some ranks build.
    """

    def __init__(self, source: Any, *, share_resolution: bool = True, **stream_kwargs: Any) -> None:
        _no_rank("StreamDataset", stream_kwargs)
        _check_flag(share_resolution)
        super().__init__()
        broadcast = _job_broadcast() if share_resolution else None
        self.manifest, self._stream_kwargs = _job_ranks.resolve_for_ranks(
            source, stream_kwargs, broadcast
        )

    def _open(self, consumer: int, consumers: int) -> _Resumable:
        return stream(self.manifest, rank=consumer, world_size=consumers, **self._stream_kwargs)


class LeRobotStreamDataset(_StreamIterable):
    """A torch IterableDataset of LeRobot items: ``lerobot.stream(repo, **stream_kwargs)``.

    The metadata (``meta/``) is read once, here, and the selection (``split``,
    ``episodes``, ``delta_timestamps``) checked; workers get the metadata pickled
    and make no API request. Each consumer (rank x worker) reads every n-th episode
    (every n-th item when there are fewer episodes than consumers). Items are dicts
    of numpy arrays, which the default ``collate_fn`` turns into tensors. Under
    torch.distributed, rank 0 reads the metadata of a Hub dataset and broadcasts it (as
    ``StreamDataset`` does its manifest; ``share_resolution=False``: each rank reads).
    """

    def __init__(
        self,
        repo: str | os.PathLike[str] | lerobot.LeRobotMetadata,
        *,
        share_resolution: bool = True,
        **stream_kwargs: Any,
    ) -> None:
        _no_rank("LeRobotStreamDataset", stream_kwargs)
        _check_flag(share_resolution)
        super().__init__()
        probe = lerobot.stream(repo, **stream_kwargs)  # checks the arguments
        broadcast = _job_broadcast() if share_resolution else None
        self.metadata: lerobot.LeRobotMetadata = _job_ranks.metadata_for_ranks(probe, broadcast)
        probe._build_plan()  # bad episodes, split or delta_timestamps fail here, once
        self._stream_kwargs = stream_kwargs

    def _open(self, consumer: int, consumers: int) -> _Resumable:
        return lerobot.stream(
            self.metadata, rank=consumer, world_size=consumers, **self._stream_kwargs
        )


class MixDataset(_StreamIterable):
    """A torch IterableDataset mixing datasets by weight: ``mix()`` in every consumer.

        web = StreamDataset("hf://datasets/org/web", split="train")
        code = StreamDataset("hf://datasets/org/code", split="train")
        ds = MixDataset([web, code], [0.7, 0.3], seed=0, stop="all_exhausted")

    ``datasets`` are ``StreamDataset`` and ``LeRobotStreamDataset`` (or ``MixDataset``)
    objects: each resolved its source (or read its metadata) once, here, when it was
    made, so workers make no API request. Each consumer (rank x DataLoader worker) opens
    its share of every member, as the member alone would, and mixes them with draws of
    its own (from seed, epoch and its number). With ``stop="all_exhausted"`` the
    consumers together deliver every sample of every member exactly once; with
    ``"first_exhausted"`` each consumer stops at the end of the first of its shares to
    end. ``state_dict()``/``load_state_dict()`` (torchdata's Stateful protocol) hold each
    consumer's draws and every member's position; ``set_epoch(n)`` reaches every member.
    """

    def __init__(
        self,
        datasets: Sequence[_StreamIterable],
        weights: Sequence[float] | None = None,
        *,
        seed: int = 0,
        stop: Stop = "first_exhausted",
    ) -> None:
        super().__init__()
        if not isinstance(datasets, Sequence) or isinstance(datasets, (str, bytes)):
            raise SourceError(
                f"datasets is a {type(datasets).__name__}: give a list of StreamDataset or "
                "LeRobotStreamDataset objects"
            )
        for i, d in enumerate(datasets):
            if not isinstance(d, _StreamIterable):
                raise SourceError(
                    f"datasets[{i}] is a {type(d).__name__}, not a StreamDataset or "
                    "LeRobotStreamDataset: make one per source, then mix them"
                )
        self._members = list(datasets)
        self._weights = weights
        self._seed = seed
        self._stop: Stop = stop
        self._open(0, 1)  # bad weights, stop, seed or members fail here, in the parent

    def _open(self, consumer: int, consumers: int) -> Mix:
        return Mix(
            [d._open(consumer, consumers) for d in self._members],
            self._weights,
            seed=self._seed,
            stop=self._stop,
            consumer=consumer if consumers > 1 else None,
            what="datasets",
        )


# -- how much of a step is spent waiting for data ------------------------------------------


@dataclass(frozen=True)
class StepStatistics:
    """How a training loop's steps split between waiting for data and working.

    steps: batches handed to the loop (a step ends when the loop asks for the next).
    waited: seconds the loop waited for its batches (inside the loader's ``next``).
    worked: seconds between a batch and the loop's next request: the step itself.
    wait_share: ``waited / (waited + worked)`` over the steps ended so far: the share
        of training time lost to input. Near 0: the data keeps up.
    last_wait_share / recent_wait_share: the same for the last step ended, and over
        the last ``window`` steps ended, time-weighted (None before the first).
    """

    steps: int
    waited: float
    worked: float
    wait_share: float | None
    last_wait_share: float | None
    recent_wait_share: float | None


class TimedLoader(Generic[_T]):
    """A loader (a ``DataLoader``, ``StatefulDataLoader``, any iterable) whose loop is
    timed: each step's wait for its batch, and its work until the next request.

        loader = ash.torch.TimedLoader(DataLoader(ds, batch_size=32, num_workers=4))
        for batch in loader:
            train_step(batch)
        loader.statistics().wait_share   # 0.02: 2% of the time waited for data

    Any other attribute is the loader's (``loader.state_dict()``, ``len(loader)``), so
    the wrapper can stand where the loader was. The figures add up over epochs. Memory:
    the shares of the last ``window`` steps.
    """

    def __init__(
        self,
        loader: Iterable[_T],
        *,
        window: int = 100,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise SourceError(f"TimedLoader(window={window!r}): give a step count >= 1")
        self.loader = loader
        self._clock = clock
        self._steps = 0
        self._waited = 0.0  # of the steps ended
        self._worked = 0.0
        self._wait: float | None = None  # the wait of the step under way
        self._recent: deque[tuple[float, float]] = deque(maxlen=window)  # (waited, worked)

    def __iter__(self) -> Iterator[_T]:
        it = iter(self.loader)
        handed: float | None = None  # when the last batch was handed to the loop
        while True:
            asked = self._clock()
            if handed is not None:
                self._step_ended(asked - handed)
            try:
                batch = next(it)
            except StopIteration:
                return
            handed = self._clock()
            self._wait = handed - asked
            self._steps += 1
            yield batch

    def _step_ended(self, worked: float) -> None:
        wait, self._wait = self._wait, None
        if wait is None:
            return
        self._waited += wait
        self._worked += worked
        self._recent.append((wait, worked))

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def statistics(self) -> StepStatistics:
        recent = self._recent
        return StepStatistics(
            steps=self._steps,
            waited=self._waited + (self._wait or 0.0),
            worked=self._worked,
            wait_share=_share(self._waited, self._worked),
            last_wait_share=_share(*recent[-1]) if recent else None,
            recent_wait_share=_share(sum(w for w, _ in recent), sum(k for _, k in recent))
            if recent
            else None,
        )


def _share(waited: float, worked: float) -> float | None:
    """The share of time waited (None when no time passed)."""
    total = waited + worked
    return waited / total if total > 0 else None
