"""Where an iteration's time goes: is the consumer waiting for data, and on what?

    s = ash.stream(...)
    for row in s: ...
    s.statistics().stalls.bottleneck   # "network", "decode", "engine" or "consumer"

Each iteration of a stream has a ``StageClock``. The consumer's wall time splits in
two: the time it waited for the next unit of samples, and its own (the loop body,
and the shaping of samples on its thread). Each moment the consumer waits is charged
to what the engine was doing for the unit it waited for: reading bytes ("network":
a request, a read of a local file, a wait for a concurrency slot), decoding them
("decode": running on a decode thread or waiting for one), or neither ("engine":
resolving files, planning, work on the event loop). Of the reads and decodes under
way at that moment, the one of the oldest job counts (jobs are numbered as the
readahead starts them, in the order the consumer takes their results): the unit
the consumer waits for, not one read ahead for later. Work outside any job (the
producer's own: resolving a source) counts first.

Beside the split, the clock keeps the time at least one read was in flight
(``network_busy``), at least one decode ran or waited for a thread
(``decode_busy``), and the time the producer held a loaded unit the consumer had
not yet taken (``blocked_on_consumer``): the readahead was full, the consumer is
the slower side.

Stages are marked where the work is: the fetcher's reads (``network``), the decode
threads (``run_decode``). They find the clock of the iteration they work for in a
context variable that the iteration's producer sets (``metered``); the tasks the
producer starts (readahead jobs) inherit it, each under a job number of its own
(``job``). With no clock set (a reader used on its own), marking costs one lookup.
Plain synchronous state behind a lock: the consumer of a sync iteration is on
another thread than the producer.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import anyio
import anyio.to_thread

__all__ = ["StageClock", "Stalls", "bytes_wait", "job", "metered", "network", "run_decode"]

T = TypeVar("T")
Stage = Literal["network", "decode"]
Bottleneck = Literal["network", "decode", "engine", "consumer"]

_CLOCK: contextvars.ContextVar[StageClock | None] = contextvars.ContextVar(
    "aiostream_hf_stage_clock", default=None
)
# The job a task works for: its number in the order the readahead started jobs; the
# producer's own work (no job) is -1, before every job.
_JOB: contextvars.ContextVar[int] = contextvars.ContextVar("aiostream_hf_job", default=-1)
# A job that reads and decodes at once (a TAR shard: the next block is read while the
# last is parsed) waits on its decode: the read is ahead of it.
_RANK: dict[Stage, int] = {"decode": 0, "network": 1}
# The decode a thread runs (``run_decode``), for ``bytes_wait``.
_DECODE: contextvars.ContextVar[tuple[StageClock, int] | None] = contextvars.ContextVar(
    "aiostream_hf_decode", default=None
)


@dataclass(frozen=True)
class Stalls:
    """Where an iteration's time went, in seconds since it started.

    seconds: wall time since the iteration started (to its end, once it ended).
    waited: time the consumer waited for the next samples; the rest of ``seconds``
        is its own (its loop body, and shaping samples on its thread).
    waited_network / waited_decode / waited_engine: ``waited``, split by what the
        unit waited for was doing: being read (network, or a local disk), decoded
        (or waiting for a decode thread), or neither (resolving, planning).
    network_busy / decode_busy: time at least one read was in flight / at least one
        decode ran or waited for a thread (reads ahead included).
    blocked_on_consumer: time the producer held a loaded unit the consumer had not
        taken yet (the readahead was full).
    bottleneck: "consumer" when the consumer's own time (the model, the loop body) is
        at least its wait: the data keeps up. Otherwise the stage it waited on most:
        "network", "decode" or "engine". None before any time has passed.
    """

    seconds: float = 0.0
    waited: float = 0.0
    waited_network: float = 0.0
    waited_decode: float = 0.0
    waited_engine: float = 0.0
    network_busy: float = 0.0
    decode_busy: float = 0.0
    blocked_on_consumer: float = 0.0
    bottleneck: Bottleneck | None = None

    @property
    def input_bound(self) -> float:
        """The share of the consumer's time spent waiting for data (0 to 1)."""
        return self.waited / self.seconds if self.seconds > 0 else 0.0


class StageClock:
    """The clock of one iteration: see the module's docstring."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._lock = threading.Lock()
        self._began = self._mark = now()
        self._ended: float | None = None
        self._jobs = itertools.count()
        # (job, rank, stage) of each read or decode under way, by a key of its own
        self._active: dict[int, tuple[int, int, Stage]] = {}
        self._keys = itertools.count()
        self._busy = {"network": 0, "decode": 0}
        self._consumer_waits = 0
        self._blocked = 0
        self._waited = {"network": 0.0, "decode": 0.0, "engine": 0.0}
        self._busy_seconds = {"network": 0.0, "decode": 0.0}
        self._blocked_seconds = 0.0

    def next_job(self) -> int:
        """The number of a job the readahead starts now."""
        return next(self._jobs)

    def _advance(self, now: float) -> None:
        """Charge the time since the last change to the state it had (under the lock)."""
        if self._ended is not None:
            return
        dt = now - self._mark
        self._mark = now
        if dt <= 0:
            return
        for stage in ("network", "decode"):
            if self._busy[stage]:
                self._busy_seconds[stage] += dt
        if self._blocked:
            self._blocked_seconds += dt
        if self._consumer_waits:
            self._waited[self._head_stage()] += dt

    def _head_stage(self) -> str:
        """What the oldest job under way (the consumer's next unit) is doing."""
        if not self._active:
            return "engine"
        _, _, stage = min(self._active.values())
        return stage

    @contextlib.contextmanager
    def stage(self, stage: Stage, job: int) -> Iterator[int]:
        """A read or a decode of ``job`` is under way within the block (its key)."""
        key = next(self._keys)
        with self._lock:
            self._advance(self._now())
            self._active[key] = (job, _RANK[stage], stage)
            self._busy[stage] += 1
        try:
            yield key
        finally:
            with self._lock:
                self._advance(self._now())
                _, _, now_in = self._active.pop(key)
                self._busy[now_in] -= 1

    def switch(self, key: int, stage: Stage) -> None:
        """The work under ``key`` is in ``stage`` now (a decode waiting for its bytes)."""
        with self._lock:
            self._advance(self._now())
            job, _, was = self._active[key]
            self._active[key] = (job, _RANK[stage], stage)
            self._busy[was] -= 1
            self._busy[stage] += 1

    def consumer_waiting(self) -> contextlib.AbstractContextManager[None]:
        """The consumer waits for the next unit within the block."""
        return self._while("_consumer_waits")

    def blocked(self) -> contextlib.AbstractContextManager[None]:
        """The producer holds a loaded unit the consumer has not taken, within the block."""
        return self._while("_blocked")

    @contextlib.contextmanager
    def _while(self, count: str) -> Iterator[None]:
        """The state counted by the attribute ``count`` holds within the block."""
        with self._lock:
            self._advance(self._now())
            setattr(self, count, getattr(self, count) + 1)
        try:
            yield
        finally:
            with self._lock:
                self._advance(self._now())
                setattr(self, count, getattr(self, count) - 1)

    def end(self) -> None:
        """The iteration ended: the figures stop here."""
        with self._lock:
            self._advance(self._now())
            self._ended = self._mark

    def stalls(self) -> Stalls:
        with self._lock:
            self._advance(self._now())
            seconds = (self._ended if self._ended is not None else self._mark) - self._began
            waited = sum(self._waited.values())
            own = max(0.0, seconds - waited)
            stages: dict[Bottleneck, float] = {
                "network": self._waited["network"],
                "decode": self._waited["decode"],
                "engine": self._waited["engine"],
            }
            slowest: Bottleneck = max(stages, key=stages.__getitem__)
            bottleneck = None if seconds <= 0 else "consumer" if own >= waited else slowest
            return Stalls(
                seconds=seconds,
                waited=waited,
                waited_network=self._waited["network"],
                waited_decode=self._waited["decode"],
                waited_engine=self._waited["engine"],
                network_busy=self._busy_seconds["network"],
                decode_busy=self._busy_seconds["decode"],
                blocked_on_consumer=self._blocked_seconds,
                bottleneck=bottleneck,
            )


# -- marking stages (where the work is) --------------------------------------------------


@contextlib.contextmanager
def network() -> Iterator[None]:
    """A read (a request, a local file read) for the current iteration's job."""
    clock = _CLOCK.get()
    if clock is None:
        yield
        return
    with clock.stage("network", _JOB.get()):
        yield


async def run_decode(
    fn: Callable[..., T], *args: Any, limiter: anyio.CapacityLimiter | None = None
) -> T:
    """``anyio.to_thread.run_sync(fn, *args, limiter=limiter)``, marked as a decode of
    the current job (the wait for a thread of ``limiter`` included)."""
    clock = _CLOCK.get()
    if clock is None:
        return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)
    with clock.stage("decode", _JOB.get()) as key:
        # The thread runs in a copy of this context: it finds its decode there.
        token = _DECODE.set((clock, key))
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)
        finally:
            _DECODE.reset(token)


@contextlib.contextmanager
def bytes_wait() -> Iterator[None]:
    """A decode thread waits, within the block, for bytes still being read: the time
    is the network's, not the decoder's."""
    found = _DECODE.get()
    if found is None:
        yield
        return
    clock, key = found
    clock.switch(key, "network")
    try:
        yield
    finally:
        clock.switch(key, "decode")


def job() -> None:
    """The current task works for a new job of its iteration (a readahead's job task
    calls it first): its reads and decodes count after those of earlier jobs."""
    clock = _CLOCK.get()
    if clock is not None:
        _JOB.set(clock.next_job())


async def metered(units: AsyncIterator[T], clock: StageClock) -> AsyncGenerator[T, None]:
    """``units``, with ``clock`` the clock of the task that iterates them (the
    iteration's producer, which runs nothing else) and the time each unit waits to be
    taken charged to ``blocked_on_consumer``."""
    _CLOCK.set(clock)
    try:
        async for unit in units:
            with clock.blocked():
                yield unit
    finally:
        aclose = getattr(units, "aclose", None)
        if aclose is not None:
            await aclose()
