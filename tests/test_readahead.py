"""LaneReadahead: lanes of many items, in order, within count and byte budgets."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import anyio
import anyio.lowlevel
import pytest

from aiostream_hf import ClosedResourceError, SourceError
from aiostream_hf._prefetch import Ramp
from aiostream_hf._readahead import Emit, Lane, LaneReadahead

pytestmark = pytest.mark.anyio


class Log:
    def __init__(self) -> None:
        self.running = 0
        self.max_running = 0
        self.started: list[int] = []
        self.finished: list[int] = []


def lanes(
    sizes: list[int],
    log: Log,
    *,
    cost: int = 10,
    fail: int | None = None,
    slow: Callable[[int], bool] = lambda lane: False,
) -> AsyncIterator[Lane[tuple[int, int]]]:
    async def gen() -> AsyncIterator[Lane[tuple[int, int]]]:
        for i, n in enumerate(sizes):

            async def lane(emit: Emit[tuple[int, int]], i: int = i, n: int = n) -> None:
                log.started.append(i)
                log.running += 1
                log.max_running = max(log.max_running, log.running)
                try:
                    for j in range(n):
                        if slow(i):
                            await anyio.sleep(0.001)
                        else:
                            await anyio.lowlevel.checkpoint()
                        if fail == i and j == n // 2:
                            raise ValueError(f"lane {i} broke at item {j}")
                        await emit(cost, (i, j))
                finally:
                    log.running -= 1
                    log.finished.append(i)

            yield lane

    return gen()


async def test_items_come_in_lane_order_while_later_lanes_run_ahead() -> None:
    log = Log()
    sizes = [5, 0, 7, 3, 6]
    # lane 0 is slow: the lanes after it finish first, and wait behind it
    ahead = LaneReadahead(
        lanes(sizes, log, slow=lambda i: i == 0), max_open=3, max_lanes=5, max_bytes=10_000
    )
    async with ahead:
        got = [item async for item in ahead]
    assert got == [(i, j) for i, n in enumerate(sizes) for j in range(n)]
    assert log.max_running == 3
    assert log.finished.index(0) > log.finished.index(2)
    stats = ahead.statistics()
    assert (stats.started, stats.delivered, stats.held) == (5, 21, 0)


async def test_bytes_held_stay_within_the_budget_plus_one_item() -> None:
    log = Log()
    ahead = LaneReadahead(lanes([5] * 6, log, cost=20), max_open=3, max_lanes=6, max_bytes=55)
    async with ahead:
        n = 0
        async for _ in ahead:
            n += 1
            await anyio.wait_all_tasks_blocked()  # let every lane run as far as it may
            assert ahead.statistics().held_bytes <= 55 + 20
    assert n == 30
    assert 40 <= ahead.statistics().max_held_bytes <= 55 + 20


async def test_a_budget_smaller_than_one_item_still_makes_progress() -> None:
    log = Log()
    ahead = LaneReadahead(lanes([4, 4, 4], log, cost=100), max_open=2, max_lanes=3, max_bytes=1)
    async with ahead:
        assert len([x async for x in ahead]) == 12


async def test_a_lane_error_comes_after_its_items_and_stops_the_others() -> None:
    log = Log()
    ahead = LaneReadahead(
        lanes([3, 6, 50, 50], log, fail=1), max_open=4, max_lanes=4, max_bytes=10**6
    )
    got = []
    with pytest.raises(ValueError, match="lane 1 broke at item 3"):
        async with ahead:
            async for item in ahead:
                got.append(item)
    assert got == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert log.running == 0  # the lanes after it were cancelled and cleaned up


async def test_breaking_out_cancels_running_lanes() -> None:
    log = Log()
    ahead = LaneReadahead(
        lanes([10**6] * 3, log, slow=lambda i: True), max_open=3, max_lanes=3, max_bytes=10**9
    )
    async with ahead:
        async for item in ahead:
            if item == (0, 5):
                break
    assert log.running == 0
    assert sorted(log.finished) == [0, 1, 2]


async def test_misuse_is_refused() -> None:
    with pytest.raises(SourceError, match="max_lanes >= max_open"):
        LaneReadahead(lanes([], Log()), max_open=3, max_lanes=2, max_bytes=1)
    ahead = LaneReadahead(lanes([1], Log()), max_open=1, max_lanes=1, max_bytes=1)
    with pytest.raises(ClosedResourceError, match="inside `async with`"):
        async for _ in ahead:
            pass
    async with ahead:
        assert [x async for x in ahead] == [(0, 0)]
    with pytest.raises(ClosedResourceError, match="runs once"):
        async with ahead:
            pass


async def test_a_ramp_opens_the_next_lane_once_an_item_reached_the_consumer() -> None:
    log = Log()
    ramp = Ramp(8)
    readahead = LaneReadahead(
        lanes([3] * 6, log), max_open=3, max_lanes=8, max_bytes=1 << 20, ramp=ramp
    )
    async with readahead as items:
        await anyio.wait_all_tasks_blocked()
        assert log.started == [0]  # one file open before anything is delivered
        assert readahead.statistics().window == 1
        got = [await items.__anext__()]
        await anyio.wait_all_tasks_blocked()
        assert ramp.window == 2
        assert log.started == [0, 1]
        got += [item async for item in items]
    assert got == [(i, j) for i in range(6) for j in range(3)]
    assert log.max_running <= 3
    assert readahead.statistics().window == 8
