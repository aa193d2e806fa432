"""Prefetcher: ordered readahead of decode units, bounded by count and by bytes.

    async with Prefetcher(jobs, max_count=8, max_bytes=512 << 20) as results:
        async for item in results:   # in the order of ``jobs``
            ...

A job is ``(cost, fn)``: ``cost`` is the bytes the job will hold (known before
it runs, e.g. the sum of its byte ranges) and ``fn`` an async callable that
does the work. Jobs start in order while fewer than ``max_count`` results are
held and their costs fit in ``max_bytes`` (one job always may start, so a job
larger than the budget still runs, alone). A job's ``held`` measures its
result once done: from then on the result counts for what it really holds
(a decoded row group, rather than the estimate reserved while it loaded). A
result is released when the consumer takes the next one.

With ``unit_bytes``, a job costing less counts as its share of one against
``max_count`` (in quarters, at least one quarter): small units (row groups of a few
hundred KB) run up to four times as many ahead, so that enough bytes are in
flight to hide a round trip, while units of ``unit_bytes`` or more count as one.

A ``Ramp`` makes the count bound start small and grow as results reach the
consumer (slow start), so that a reader that stops early (a first batch, a
``head``) opened a few files, not ``max_count`` of them; see ``Ramp``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, TypeVar

import anyio
import anyio.abc
from anyio.abc import TaskGroup

from ._exceptions import ClosedResourceError, SourceError
from ._stalls import job as job_started

__all__ = [
    "Background",
    "Job",
    "PrefetchStatistics",
    "Prefetcher",
    "Ramp",
    "aclose_source",
]

T = TypeVar("T")
_B = TypeVar("_B", bound="Background")

#: A job counts against ``max_count`` in these parts of one (with ``unit_bytes``).
_PARTS = 4


@dataclass(frozen=True)
class Job(Generic[T]):
    cost: int
    run: Callable[[], Awaitable[T]]
    held: Callable[[T], int] | None = None
    #: Jobs of one group (a Parquet file's row groups) count once against a ramp: the
    #: ramp bounds what opening a group costs (a file's resolver request), and a group
    #: already held costs nothing more. None: a group of its own.
    group: Hashable | None = None
    #: Another job of this group comes next (so taking it opens nothing new).
    more_in_group: bool = False
    #: Its result, delivered, grows the ramp: False for a job that delivers no rows
    #: (a file's head read), which must not open more files than the rows would.
    grows: bool = True


@dataclass(frozen=True)
class PrefetchStatistics:
    """``window``: the count bound now (``max_count``, or less while a ``Ramp`` grows)."""

    started: int
    delivered: int
    held: int
    held_bytes: int
    max_held: int
    max_held_bytes: int
    max_count: int
    max_bytes: int
    window: int


class Ramp:
    """A readahead window that starts at ``start`` and grows by one per result
    delivered to the consumer, up to ``bound`` (slow start: it doubles each time a
    whole window is delivered, as TCP's congestion window does per round trip).

    The readaheads bounded by a ramp hold, together, at most ``window`` groups of
    results (running or done): a group is a file's jobs, which cost one opening (a
    resolver request) however many there are; a job without a group is one of its
    own. One readahead may always hold one job, so none waits on the others forever.
    A stream's first sample so costs ``start`` files' requests, not ``bound``'s, and a
    long read runs at ``bound`` after ``bound - start`` results. Memory stays within
    the readaheads' own bounds: the window only lowers them.

    A Parquet stream plans files through one readahead (a resolver request and a
    tail read each) and loads their row groups through another: both share one ramp,
    so the files planned and the files loading ahead of the consumer are at most the
    window together, a file planned and loading counting once. The plans' readahead
    waits for the ramp even for its first job (``Prefetcher``'s ``ramp_first``): at a
    window of one, the next file is planned once the last one's units are delivered.
    The readahead that delivers to the consumer calls ``grow()``, which wakes every
    readahead bounded by the ramp. Plain synchronous state, on one event loop.

    With ``share`` = N (a stream in one of a DataLoader's N worker processes), the
    window stays at ``start`` until N results are delivered, then grows as above. The
    N workers start N units ahead together, the window a lone stream reaches after N
    results, and the loader itself reads ``prefetch_factor`` batches ahead per worker:
    growing at once would cost a loader's first batch two resolver requests per file
    it holds (one file read, one planned), not one.
    """

    def __init__(self, bound: int, *, start: int = 1, share: int = 1) -> None:
        if bound < 1 or start < 1 or share < 1:
            raise SourceError(f"Ramp: bound={bound}, start={start} and share={share} must be >= 1")
        self.bound = bound
        self.window = min(start, bound)
        # One of ``share`` processes reading side by side (DataLoader workers) grows
        # once it has delivered ``share`` results.
        self._share = share
        self._delivered = 0
        # (groups, wake) of each readahead bounded by it: two at most, for a stream
        self._bounded: list[tuple[Callable[[], Iterable[Hashable]], Callable[[], None]]] = []

    def bounded(self, groups: Callable[[], Iterable[Hashable]], wake: Callable[[], None]) -> None:
        """A readahead is bounded by this ramp: ``groups()`` gives the keys of the groups
        it holds (a file's: its plan and its units count once, in either readahead),
        ``wake()`` is called when one more may run (a result delivered, the window grown)."""
        self._bounded.append((groups, wake))

    def _held(self) -> set[Hashable]:
        held: set[Hashable] = set()
        for groups, _ in self._bounded:
            held.update(groups())
        return held

    def has_room(self, group: Hashable | None = None) -> bool:
        """True while the readaheads bounded by this ramp hold fewer groups than
        ``window``, or when they hold ``group`` already (taking more of it opens nothing)."""
        held = self._held()
        return len(held) < self.window or (group is not None and group in held)

    def grow(self) -> None:
        """One result reached the consumer (it is held no more): one more may run ahead,
        and the window grows by one (up to ``bound``) once ``share`` results are delivered."""
        self._delivered += 1
        if self._delivered >= self._share:
            self.window = min(self.bound, self.window + 1)
        self.wake()

    def wake(self) -> None:
        """A result is held no more (delivered, growing the window or not): wake the
        readaheads bounded by this ramp, one of which may run one more now."""
        for _, wake in self._bounded:
            wake()


class _Slot(Generic[T]):
    __slots__ = ("cost", "done", "error", "group", "grows", "more_in_group", "value")

    def __init__(
        self, cost: int, group: Hashable | None = None, more: bool = False, grows: bool = True
    ) -> None:
        self.cost = cost
        self.group = group
        self.more_in_group = more
        self.grows = grows
        self.done = anyio.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


class Background(ABC):
    """Runs ``_produce`` in a task group of its own from ``async with`` until the exit,
    which cancels it: the consumer is gone. Once only. The consumer's own error (or
    GeneratorExit) leaves as it is, not in an ExceptionGroup: the tasks raise nothing
    else (their errors reach the consumer as results)."""

    _tg: TaskGroup | None = None
    _closed: bool = False

    @abstractmethod
    async def _produce(self) -> None:
        """Start the work, in order, within the budgets; runs until done or cancelled."""

    async def __aenter__(self: _B) -> _B:
        if self._closed or self._tg is not None:
            raise ClosedResourceError(f"a {type(self).__name__} runs once: create a new one")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._produce)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._tg is not None
        self._closed = True
        self._tg.cancel_scope.cancel()
        if e is None or isinstance(e, anyio.get_cancelled_exc_class()):
            return await self._tg.__aexit__(et, e, tb)
        await self._tg.__aexit__(None, None, None)
        return None


async def aclose_source(source: object) -> None:
    """Close an async generator a task iterated, however its loop ended, so that a
    cancelled producer leaves no generator for the garbage collector to finalize."""
    aclose = getattr(source, "aclose", None)
    if aclose is not None:
        await aclose()


class Prefetcher(Background, Generic[T]):
    """Runs jobs ahead of the consumer, in order, within a count and a byte budget.

    ``ramp``: the groups held by every readahead bounded by the ramp are at most its
    window (see ``Ramp``); each result delivered grows it, unless ``grow_ramp=False``
    (a readahead feeding another one, which grows it as its results reach the consumer).
    Each readahead may always hold one job, whatever the ramp, unless ``ramp_first``:
    then even its first job waits for the ramp (a readahead of plans, whose every job
    opens a file, beside the readahead of their units, which keeps that right).
    ``unit_bytes``: a job costing less counts as its share of one against ``max_count``
    (at least a quarter); None: every job counts as one.
    """

    def __init__(
        self,
        jobs: AsyncIterable[Job[T]],
        *,
        max_count: int,
        max_bytes: int,
        ramp: Ramp | None = None,
        grow_ramp: bool = True,
        ramp_first: bool = False,
        unit_bytes: int | None = None,
    ) -> None:
        if max_count < 1 or max_bytes < 1 or (unit_bytes is not None and unit_bytes < 1):
            raise SourceError(
                f"Prefetcher: max_count={max_count}, max_bytes={max_bytes} and "
                f"unit_bytes={unit_bytes} must be >= 1"
            )
        self._unit_bytes = unit_bytes
        self._jobs = jobs
        self._max_count = max_count
        self._max_bytes = max_bytes
        self._ramp = ramp
        self._grow_ramp = grow_ramp and ramp is not None
        self._ramp_first = ramp_first
        self._slots: deque[_Slot[T]] = deque()
        self._held_bytes = 0
        self._space = anyio.Event()  # set when a slot is released
        self._more = anyio.Event()  # set when a slot is added or the jobs end
        self._jobs_done = False
        self._jobs_error: Exception | None = None
        self._started = self._delivered = 0
        self._max_held = self._max_held_bytes = 0
        if ramp is not None:
            ramp.bounded(self._groups_held, self._wake)

    def statistics(self) -> PrefetchStatistics:
        return PrefetchStatistics(
            started=self._started,
            delivered=self._delivered,
            held=len(self._slots),
            held_bytes=self._held_bytes,
            max_held=self._max_held,
            max_held_bytes=self._max_held_bytes,
            max_count=self._max_count,
            max_bytes=self._max_bytes,
            window=self._window(),
        )

    def _window(self) -> int:
        if self._ramp is None:
            return self._max_count
        return min(self._max_count, self._ramp.window)

    def _wake(self) -> None:
        self._space.set()

    def _parts(self, cost: int) -> int:
        """What a job of ``cost`` counts against ``max_count``, in ``_PARTS`` of one."""
        if self._unit_bytes is None or cost >= self._unit_bytes:
            return _PARTS
        return max(1, -(-cost * _PARTS // self._unit_bytes))

    def _parts_held(self) -> int:
        return sum(self._parts(slot.cost) for slot in self._slots)

    def _groups_held(self) -> Iterator[Hashable]:
        """What this readahead holds against its ramp: its groups' keys (each job without
        one is a group of its own)."""
        return (id(slot) if slot.group is None else slot.group for slot in self._slots)

    def _has_room(self) -> bool:
        """One more job may run by count and by the ramp: before the next job is taken,
        for taking it can itself cost requests (a Parquet unit's job takes its file's
        plan). When the job taken last says another of its group comes next, that one
        opens nothing new: it is taken, and judged by ``_fits``. A readahead holding
        nothing takes its next job: with ``ramp_first`` it is judged by ``_fits``, once
        its group is known (a plan of a file whose head is already loading runs)."""
        if not self._slots:
            return True
        ramp_full = self._ramp is not None and not self._ramp.has_room()
        if ramp_full and not self._slots[-1].more_in_group:
            return False
        return self._parts_held() < self._max_count * _PARTS

    def _fits(self, job: Job[T]) -> bool:
        # The ramp lets one more job of its group run; the first job held always may,
        # unless ``ramp_first`` (the other readahead then keeps that right).
        judged = self._ramp_first or bool(self._slots)
        if self._ramp is not None and judged and not self._ramp.has_room(job.group):
            return False
        if not self._slots:
            return True  # one job always may run, whatever the budgets
        parts = self._parts_held() + self._parts(job.cost)
        return parts <= self._max_count * _PARTS and self._held_bytes + job.cost <= self._max_bytes

    async def _wait_for_space(self) -> None:
        self._space = anyio.Event()
        await self._space.wait()

    async def _produce(self) -> None:
        assert self._tg is not None
        jobs = aiter(self._jobs)
        try:
            while True:
                # The next job is taken only once one more may run by count: taking it
                # can itself cost requests (a Parquet unit's job takes its file's plan).
                while not self._has_room():
                    await self._wait_for_space()
                try:
                    job = await anext(jobs)
                except StopAsyncIteration:
                    break
                while not self._fits(job):
                    await self._wait_for_space()
                slot: _Slot[T] = _Slot(job.cost, job.group, job.more_in_group, job.grows)
                self._slots.append(slot)
                self._held_bytes += job.cost
                self._started += 1
                self._max_held = max(self._max_held, len(self._slots))
                self._max_held_bytes = max(self._max_held_bytes, self._held_bytes)
                # Begun in order: up to its first checkpoint before the next one starts.
                await self._tg.start(self._run, job, slot)
                self._more.set()
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # planning failed: delivered after the units before it
            self._jobs_error = exc
        finally:
            await aclose_source(jobs)
            self._jobs_done = True
            self._more.set()

    async def _run(
        self,
        job: Job[T],
        slot: _Slot[T],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        task_status.started()  # the job goes on at once, to its first checkpoint
        job_started()  # its reads and decodes count after those of the jobs before it
        try:
            slot.value = await job.run()
            if job.held is not None:
                self._recost(slot, job.held(slot.value))
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # delivered to the consumer, in order
            slot.error = exc
        finally:
            slot.done.set()

    def _recost(self, slot: _Slot[T], cost: int) -> None:
        self._held_bytes += cost - slot.cost
        slot.cost = cost
        self._max_held_bytes = max(self._max_held_bytes, self._held_bytes)
        self._space.set()

    def __aiter__(self) -> Prefetcher[T]:
        if self._tg is None:
            raise ClosedResourceError("iterate a Prefetcher inside `async with`")
        return self

    async def __anext__(self) -> T:
        # A method, not an async generator: a consumer that stops early leaves
        # nothing behind for the garbage collector to finalize.
        while not self._slots:
            if self._jobs_done:
                if self._jobs_error is not None:
                    raise self._jobs_error
                raise StopAsyncIteration
            self._more = anyio.Event()
            if self._slots or self._jobs_done:
                continue
            await self._more.wait()
        slot = self._slots[0]
        await slot.done.wait()
        self._slots.popleft()
        self._held_bytes -= slot.cost
        self._space.set()
        if slot.error is not None:
            raise slot.error
        self._delivered += 1
        if self._grow_ramp and slot.grows:
            assert self._ramp is not None
            self._ramp.grow()
        elif self._ramp is not None:
            self._ramp.wake()  # one result fewer held: another readahead may fit now
        return slot.value  # type: ignore[return-value]
