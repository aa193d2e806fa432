"""LaneReadahead: ordered readahead of sequential sources, each read by its own task.

    async def lane(emit):                  # one file, read front to back
        async for cost, item in ...:
            await emit(cost, item)         # waits while the budget is full

    async with LaneReadahead(lanes, max_open=3, max_lanes=8, max_bytes=512 << 20) as items:
        async for item in items:   # every item of lane 0, then of lane 1, ...
            ...

A lane is an async callable that gives its items, in order, to ``emit``: one
file read front to back (a TAR shard: one long GET, parsed block by block). It
runs as a task of its own, so it may run tasks of its own (read the next block
while the last one is parsed); an async generator could not.
``Prefetcher`` runs jobs that each give one result; a lane gives many, and how
many is known only when it ends, so the next lane must open before the current
one ends without knowing where it ends: that is this class.

Bounds: at most ``max_open`` lanes run at once (open GETs), at most
``max_lanes`` lanes are held (running, or finished and not yet consumed), and
the items held weigh at most ``max_bytes``. A lane that has produced an item
waits, holding it, until the item fits; the lane the consumer reads from may
always hold one item, so the consumer never waits on a budget filled by the
lanes after it. Memory is therefore at most ``max_bytes`` plus one item per
running lane. A lane's error reaches the consumer in order, after the items
the lane gave before it. With a ``Ramp`` (``_prefetch.Ramp``), the lanes held are
also at most its window, which grows by one per item delivered: the next file
opens once the first item of the stream has reached the consumer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable
from functools import partial
from typing import Generic, TypeVar

import anyio

from ._exceptions import ClosedResourceError, SourceError
from ._prefetch import Background, PrefetchStatistics, Ramp, aclose_source
from ._stalls import job as job_started

__all__ = ["Emit", "Lane", "LaneReadahead"]

T = TypeVar("T")

Emit = Callable[[int, T], Awaitable[None]]
Lane = Callable[[Emit[T]], Awaitable[None]]


class _LaneState(Generic[T]):
    __slots__ = ("done", "error", "items")

    def __init__(self) -> None:
        self.items: deque[tuple[int, T]] = deque()
        self.done = False
        self.error: BaseException | None = None


class LaneReadahead(Background, Generic[T]):
    """Runs lanes ahead of the consumer, in order, within count and byte budgets."""

    def __init__(
        self,
        lanes: AsyncIterable[Lane[T]],
        *,
        max_open: int,
        max_lanes: int,
        max_bytes: int,
        ramp: Ramp | None = None,
    ) -> None:
        if max_open < 1 or max_lanes < max_open or max_bytes < 1:
            raise SourceError(
                f"LaneReadahead: need max_open >= 1, max_lanes >= max_open and max_bytes >= 1 "
                f"(got {max_open}, {max_lanes}, {max_bytes})"
            )
        self._lanes_source = lanes
        self._max_open = max_open
        self._max_lanes = max_lanes
        self._max_bytes = max_bytes
        self._lanes: deque[_LaneState[T]] = deque()  # held lanes, the consumer's first
        self._open = 0
        self._held_bytes = 0
        self._held_items = 0
        self._changed = anyio.Event()  # replaced, then set, on every change of state
        self._sources_done = False
        self._sources_error: Exception | None = None
        self._started = self._delivered = 0
        self._max_held = self._max_held_bytes = 0
        self._ramp = ramp
        if ramp is not None:
            ramp.bounded(partial(map, id, self._lanes), self._notify)

    def statistics(self) -> PrefetchStatistics:
        """Counts of items (chunks); ``started`` counts lanes."""
        return PrefetchStatistics(
            started=self._started,
            delivered=self._delivered,
            held=self._held_items,
            held_bytes=self._held_bytes,
            max_held=self._max_held,
            max_held_bytes=self._max_held_bytes,
            max_count=self._max_lanes,
            max_bytes=self._max_bytes,
            window=self._window(),
        )

    def _window(self) -> int:
        """Lanes that may be held now: ``max_lanes``, or the ramp's window while it grows."""
        if self._ramp is None:
            return self._max_lanes
        return min(self._max_lanes, self._ramp.window)

    # -- coordination (plain synchronous state) ----------------------------------------------

    def _notify(self) -> None:
        event, self._changed = self._changed, anyio.Event()
        event.set()

    def _may_open(self) -> bool:
        if not self._lanes:
            return True
        return (
            self._open < self._max_open
            and len(self._lanes) < self._max_lanes
            and (self._ramp is None or self._ramp.has_room())
            and self._held_bytes < self._max_bytes
        )

    def _may_hold(self, lane: _LaneState[T], cost: int) -> bool:
        if self._held_bytes + cost <= self._max_bytes:
            return True
        return not lane.items and lane is self._lanes[0]  # the consumer waits on it

    def _hold(self, lane: _LaneState[T], cost: int, item: T) -> None:
        lane.items.append((cost, item))
        self._held_bytes += cost
        self._held_items += 1
        self._max_held = max(self._max_held, self._held_items)
        self._max_held_bytes = max(self._max_held_bytes, self._held_bytes)
        self._notify()

    # -- tasks -------------------------------------------------------------------------------

    async def _produce(self) -> None:
        assert self._tg is not None
        lanes = aiter(self._lanes_source)
        try:
            async for lane in lanes:
                while not self._may_open():
                    await self._changed.wait()
                state: _LaneState[T] = _LaneState()
                self._lanes.append(state)
                self._open += 1
                self._started += 1
                self._tg.start_soon(self._run, lane, state)
                self._notify()
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # delivered after the lanes before it
            self._sources_error = exc
        finally:
            await aclose_source(lanes)
            self._sources_done = True
            self._notify()

    async def _emit(self, state: _LaneState[T], cost: int, item: T) -> None:
        while not self._may_hold(state, cost):
            await self._changed.wait()
        self._hold(state, cost, item)

    async def _run(self, lane: Lane[T], state: _LaneState[T]) -> None:
        job_started()  # lanes start in order: its reads count after the lanes before it
        try:
            await lane(partial(self._emit, state))
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # delivered to the consumer, after the lane's items
            state.error = exc
        finally:
            state.done = True
            self._open -= 1
            self._notify()

    # -- the consumer ------------------------------------------------------------------------

    def __aiter__(self) -> LaneReadahead[T]:
        if self._tg is None:
            raise ClosedResourceError("iterate a LaneReadahead inside `async with`")
        return self

    async def __anext__(self) -> T:
        # A method, not an async generator: nothing is left to finalize on an early exit.
        while True:
            if not self._lanes:
                if self._sources_done:
                    if self._sources_error is not None:
                        raise self._sources_error
                    raise StopAsyncIteration
                await self._changed.wait()
                continue
            lane = self._lanes[0]
            if lane.items:
                cost, item = lane.items.popleft()
                self._held_bytes -= cost
                self._held_items -= 1
                self._delivered += 1
                if self._ramp is not None:
                    self._ramp.grow()
                self._notify()
                return item
            if lane.done:
                self._lanes.popleft()
                self._notify()
                if lane.error is not None:
                    raise lane.error
                continue
            await self._changed.wait()
