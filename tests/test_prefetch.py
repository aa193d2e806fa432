from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import anyio
import pytest

from aiostream_hf import ClosedResourceError, SourceError
from aiostream_hf._prefetch import Job, Prefetcher, Ramp

pytestmark = pytest.mark.anyio


def _jobs(costs: list[int], log: list[str], gates: dict[int, anyio.Event] | None = None):
    async def jobs() -> AsyncIterator[Job[int]]:
        for i, cost in enumerate(costs):

            async def run(i: int = i) -> int:
                log.append(f"start {i}")
                if gates and i in gates:
                    await gates[i].wait()
                return i

            yield Job(cost, run)

    return jobs()


async def test_results_come_in_order_even_when_jobs_finish_out_of_order() -> None:
    log: list[str] = []
    gate = anyio.Event()
    got: list[int] = []

    async def open_gate_when_others_are_done() -> None:
        await anyio.wait_all_tasks_blocked()
        assert got == []  # 1..4 are done but wait behind job 0
        gate.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(open_gate_when_others_are_done)
        async with Prefetcher(_jobs([1] * 5, log, {0: gate}), max_count=5, max_bytes=100) as p:
            async for value in p:
                got.append(value)
    assert got == [0, 1, 2, 3, 4]


async def test_jobs_begin_in_order_on_every_backend() -> None:
    """Each job runs up to its first checkpoint before the next begins, so a job can take
    its place in an order shared with later jobs (trio may run tasks started together in
    any order: on the old ``start_soon`` the log came out of order there)."""
    for _ in range(10):  # trio reverses a batch of tasks at random: give it chances
        log: list[str] = []
        gate = anyio.Event()
        gates = dict.fromkeys(range(8), gate)
        got: list[int] = []

        async def open_gate(gate: anyio.Event) -> None:
            await anyio.wait_all_tasks_blocked()
            gate.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(open_gate, gate)
            async with Prefetcher(_jobs([1] * 8, log, gates), max_count=8, max_bytes=100) as p:
                got = [value async for value in p]
        assert log == [f"start {i}" for i in range(8)]
        assert got == list(range(8))


async def test_readahead_is_bounded_by_count() -> None:
    log: list[str] = []
    async with Prefetcher(_jobs([1] * 10, log), max_count=3, max_bytes=100) as p:
        async for value in p:
            # never more than 3 results held, the current one included
            assert p.statistics().held <= 3
            await anyio.wait_all_tasks_blocked()
            # the one being consumed is released: at most 3 more have started
            assert len(log) <= min(10, value + 1 + 3)
        assert p.statistics().max_held == 3
        assert p.statistics().delivered == 10


@pytest.mark.parametrize(
    ("cost", "ahead"),
    [
        (100, 3),  # a whole unit counts as one: max_count of them
        (250, 3),  # larger ones too
        (50, 6),  # half a unit counts as half (2 quarters): twice as many
        (26, 6),  # just over a quarter counts as two (rounded up)
        (25, 12),  # a quarter or less counts as one quarter: four times as many, no more
        (1, 12),
    ],
)
async def test_jobs_under_unit_bytes_count_as_their_share_of_one(cost: int, ahead: int) -> None:
    """Small row groups run more ahead (enough bytes in flight to hide a round trip):
    with ``unit_bytes``, a job counts against ``max_count`` as its share of a unit, in
    quarters, at least one quarter."""
    log: list[str] = []
    gate = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def check() -> None:
            await anyio.wait_all_tasks_blocked()
            assert len(log) == ahead  # all waiting at the gate: that many started
            gate.set()

        tg.start_soon(check)
        jobs = _jobs([cost] * 40, log, dict.fromkeys(range(40), gate))
        async with Prefetcher(jobs, max_count=3, max_bytes=10**6, unit_bytes=100) as p:
            got = [value async for value in p]
    assert got == list(range(40))
    assert p.statistics().max_held == ahead


async def test_a_big_job_waits_for_room_a_small_one_would_fit_in() -> None:
    """Three quarters held: a small job fits, a whole unit waits until one is taken."""
    log: list[str] = []
    gates = {i: anyio.Event() for i in range(5)}
    costs = [25] * 3 + [100, 25]  # three quarters, then a unit, then a quarter
    async with Prefetcher(
        _jobs(costs, log, gates), max_count=1, max_bytes=10**6, unit_bytes=100
    ) as p:
        await anyio.wait_all_tasks_blocked()
        assert sorted(log) == [f"start {i}" for i in range(3)]  # the unit does not fit beside
        for i in range(3):
            gates[i].set()
            assert await p.__anext__() == i
        await anyio.wait_all_tasks_blocked()
        assert log[-1] == "start 3"  # nothing else held: the unit runs
        gates[3].set()
        gates[4].set()
        assert [value async for value in p] == [3, 4]


def test_unit_bytes_below_one_is_refused() -> None:
    with pytest.raises(SourceError, match="unit_bytes=0"):
        Prefetcher(_jobs([1], []), max_count=1, max_bytes=1, unit_bytes=0)


async def test_readahead_is_bounded_by_bytes_but_a_big_job_runs_alone() -> None:
    log: list[str] = []
    costs = [40, 40, 40, 500, 10]
    async with Prefetcher(_jobs(costs, log), max_count=10, max_bytes=100) as p:
        seen = []
        async for value in p:
            seen.append(value)
            assert p.statistics().held_bytes <= 100 or p.statistics().held == 1
        assert seen == [0, 1, 2, 3, 4]
        assert p.statistics().max_held_bytes == 500  # the oversize job, alone


async def test_a_failing_job_raises_in_order_after_earlier_results() -> None:
    async def jobs() -> AsyncIterator[Job[int]]:
        async def ok() -> int:
            return 1

        async def bad() -> int:
            raise ValueError("unit 2 is corrupt")

        yield Job(1, ok)
        yield Job(1, bad)
        yield Job(1, ok)

    got = []
    with pytest.raises(ValueError, match="unit 2 is corrupt"):
        async with Prefetcher(jobs(), max_count=4, max_bytes=10) as p:
            async for value in p:
                got.append(value)
    assert got == [1]


async def test_a_failing_job_source_raises_after_the_jobs_before_it() -> None:
    async def jobs() -> AsyncIterator[Job[int]]:
        async def ok() -> int:
            return 7

        yield Job(1, ok)
        raise OSError("footer of file 2 unreadable")

    got = []
    with pytest.raises(OSError, match="footer of file 2"):
        async with Prefetcher(jobs(), max_count=4, max_bytes=10) as p:
            async for value in p:
                got.append(value)
    assert got == [7]


async def test_leaving_early_cancels_readahead() -> None:
    log: list[str] = []
    never = anyio.Event()
    async with Prefetcher(_jobs([1] * 4, log, {1: never}), max_count=4, max_bytes=10) as p:
        async for value in p:
            assert value == 0
            break
    assert not never.is_set()  # job 1 was cancelled, not awaited forever


async def test_cancellation_from_outside_propagates() -> None:
    log: list[str] = []
    never = anyio.Event()
    with anyio.move_on_after(0.05) as scope:
        async with Prefetcher(_jobs([1, 1], log, {0: never}), max_count=2, max_bytes=10) as p:
            async for _ in p:
                pytest.fail("nothing should be delivered")
    assert scope.cancelled_caught


async def test_iterating_outside_the_context_is_an_error() -> None:
    p: Prefetcher[int] = Prefetcher(_jobs([1], []), max_count=1, max_bytes=1)
    with pytest.raises(ClosedResourceError):
        async for _ in p:
            pass


async def test_a_done_job_counts_for_what_its_result_holds() -> None:
    # Reserved at 50 bytes each while loading (bytes, then rows beside them),
    # each result then holds 30 (its rows only). With a budget of 100: two
    # load at first; once both are done (60 held), a third needs 110 and waits
    # until the consumer takes one. These jobs never wait, and a job begins (here:
    # ends) before the next one does: the most held is 30 + 50.
    started: list[int] = []

    async def jobs() -> AsyncIterator[Job[int]]:
        for i in range(6):

            async def run(i: int = i) -> int:
                started.append(i)
                return i

            yield Job(50, run, held=lambda _: 30)

    async with Prefetcher(jobs(), max_count=8, max_bytes=100) as p:
        await anyio.wait_all_tasks_blocked()
        assert started == [0, 1]  # both started, in order
        assert p.statistics().held_bytes == 60  # what the two results hold, not 100
        async for value in p:
            await anyio.wait_all_tasks_blocked()
            assert p.statistics().held_bytes <= 100
            assert len(started) == min(6, value + 3)
        stats = p.statistics()
        assert stats.delivered == 6
        assert stats.max_held_bytes == 80


async def test_a_result_that_holds_less_than_reserved_frees_room_for_the_next() -> None:
    # Reserved at 60 of a 100-byte budget: only one may start; once done it
    # holds 1 byte, so the next starts before the consumer takes the first.
    order: list[str] = []

    async def jobs() -> AsyncIterator[Job[int]]:
        for i in range(3):

            async def run(i: int = i) -> int:
                order.append(f"start {i}")
                return i

            yield Job(60, run, held=lambda _: 1)

    async with Prefetcher(jobs(), max_count=8, max_bytes=100) as p:
        await anyio.wait_all_tasks_blocked()
        assert order[:2] == ["start 0", "start 1"]
        assert [v async for v in p] == [0, 1, 2]


async def test_a_ramp_starts_one_job_ahead_and_grows_by_one_per_delivered_result() -> None:
    log: list[str] = []
    ramp = Ramp(4)
    async with Prefetcher(_jobs([1] * 12, log), max_count=4, max_bytes=100, ramp=ramp) as p:
        await anyio.wait_all_tasks_blocked()
        assert log == ["start 0"]  # nothing delivered yet: one job runs
        assert p.statistics().window == 1
        delivered = 0
        async for value in p:
            delivered += 1
            assert value == delivered - 1
            await anyio.wait_all_tasks_blocked()
            window = min(4, 1 + delivered)
            assert p.statistics().window == ramp.window == window
            # the consumer holds `delivered` results; the window runs ahead of them
            assert len(log) == min(12, delivered + window)
        assert p.statistics().max_held == 4  # it reached its bound, and stayed in it


async def test_a_readahead_bounded_by_a_ramp_it_does_not_grow_is_woken_when_it_grows() -> None:
    log: list[str] = []
    ramp = Ramp(8)
    jobs = _jobs([1] * 12, log)
    async with Prefetcher(jobs, max_count=3, max_bytes=100, ramp=ramp, grow_ramp=False) as p:
        await anyio.wait_all_tasks_blocked()
        assert log == ["start 0"]
        ramp.grow()  # another readahead delivered one: this one may run one more
        await anyio.wait_all_tasks_blocked()
        assert log == ["start 0", "start 1"]
        for _ in range(5):
            ramp.grow()
        await anyio.wait_all_tasks_blocked()
        assert len(log) == 3  # its own max_count still bounds it
        assert await p.__anext__() == 0
        await anyio.wait_all_tasks_blocked()
        assert ramp.window == 7  # not grown by this readahead's deliveries
        assert len(log) == 4


async def test_two_readaheads_sharing_a_ramp_take_the_next_job_only_when_one_may_run() -> None:
    """A Parquet stream's shape: one readahead plans files (``ramp_first``: each plan
    opens a file), a second loads their units and grows the ramp; together they hold at
    most its window of files, a file planned and loading counting once. Before the first
    unit is delivered, one plan has started (the file being loaded), not the next too."""
    plans: list[str] = []
    ramp = Ramp(8)

    async def plan_jobs() -> AsyncIterator[Job[int]]:
        i = 0
        async for job in _jobs([1] * 40, plans):
            yield replace(job, group=i)  # the file it plans
            i += 1

    planned = Prefetcher(
        plan_jobs(), max_count=8, max_bytes=100, ramp=ramp, grow_ramp=False, ramp_first=True
    )

    async def unit_jobs() -> AsyncIterator[Job[int]]:
        async for plan in planned:

            async def load(plan: int = plan) -> int:
                return plan

            yield Job(1, load, group=plan)

    async with planned, Prefetcher(unit_jobs(), max_count=8, max_bytes=100, ramp=ramp) as loaded:
        await anyio.wait_all_tasks_blocked()
        assert plans == ["start 0"]
        delivered = 0
        async for value in loaded:
            assert value == delivered
            delivered += 1
            await anyio.wait_all_tasks_blocked()
            window = min(8, 1 + delivered)
            # the files delivered, and a window of units loaded and files planned together
            assert len(plans) == min(40, delivered + window)
            assert loaded.statistics().held + planned.statistics().held == min(
                window, 40 - delivered
            )
        assert delivered == 40


async def test_a_readahead_without_ramp_first_may_always_run_one_job() -> None:
    """Without ``ramp_first``, a readahead holding nothing runs its next job even with
    the ramp full (so two readaheads never wait on each other forever); with it, the
    job waits until a delivery makes room."""
    ramp = Ramp(4)
    held = Prefetcher(_jobs([1], []), max_count=4, max_bytes=100, ramp=ramp)
    free_log: list[str] = []
    strict_log: list[str] = []
    free = Prefetcher(_jobs([1], free_log), max_count=4, max_bytes=100, ramp=ramp, grow_ramp=False)
    strict = Prefetcher(
        _jobs([1], strict_log),
        max_count=4,
        max_bytes=100,
        ramp=ramp,
        grow_ramp=False,
        ramp_first=True,
    )
    async with held:
        await anyio.wait_all_tasks_blocked()  # one job held: the ramp (window 1) is full
        async with free, strict:
            await anyio.wait_all_tasks_blocked()
            assert free_log == ["start 0"]
            assert strict_log == []
            assert await held.__anext__() == 0  # grows the window to 2, frees a group
            await anyio.wait_all_tasks_blocked()
            assert strict_log == ["start 0"]


async def test_a_group_held_by_one_readahead_admits_its_jobs_in_the_other() -> None:
    """A file planned in one readahead and loading in the other counts once against the
    ramp: with the window full of group 7, another readahead's job of group 7 runs."""
    ramp = Ramp(4)
    log: list[str] = []

    async def of_group(group: int) -> AsyncIterator[Job[int]]:
        async def run() -> int:
            log.append(f"start {group}")
            return group

        yield Job(1, run, group=group)

    held = Prefetcher(of_group(7), max_count=4, max_bytes=100, ramp=ramp)
    same = Prefetcher(
        of_group(7), max_count=4, max_bytes=100, ramp=ramp, grow_ramp=False, ramp_first=True
    )
    other = Prefetcher(
        of_group(8), max_count=4, max_bytes=100, ramp=ramp, grow_ramp=False, ramp_first=True
    )
    async with held:
        await anyio.wait_all_tasks_blocked()
        async with same, other:
            await anyio.wait_all_tasks_blocked()
            assert log == ["start 7", "start 7"]  # group 7's, twice; group 8's waits
            assert same.statistics().started == 1
            assert other.statistics().started == 0


async def test_a_result_delivered_without_growing_the_ramp_still_wakes_the_other_readahead() -> (
    None
):
    """A job whose result does not grow the ramp (a file's head read, ``grows=False``)
    is held no more once delivered: the other readahead, waiting for room in the ramp,
    runs its next job then, not at the next delivery that grows it."""
    ramp = Ramp(2, start=2)

    async def quiet() -> AsyncIterator[Job[int]]:
        async def run() -> int:
            return -1

        yield Job(1, run, grows=False)

    log: list[str] = []
    other = Prefetcher(_jobs([1] * 4, log), max_count=4, max_bytes=100, ramp=ramp, grow_ramp=False)
    async with Prefetcher(quiet(), max_count=4, max_bytes=100, ramp=ramp) as first:
        await anyio.wait_all_tasks_blocked()  # the quiet job holds one of the ramp's 2
        async with other:
            await anyio.wait_all_tasks_blocked()
            assert log == ["start 0"]  # the other's first: the ramp is full
            assert await first.__anext__() == -1
            assert ramp.window == 2  # not grown
            await anyio.wait_all_tasks_blocked()
            assert log == ["start 0", "start 1"]


def test_a_ramp_refuses_a_bound_or_start_below_one_and_never_passes_its_bound() -> None:
    with pytest.raises(SourceError, match="bound=0"):
        Ramp(0)
    with pytest.raises(SourceError, match="start=0"):
        Ramp(4, start=0)
    with pytest.raises(SourceError, match="share=0"):
        Ramp(4, share=0)
    ramp = Ramp(3, start=9)
    assert ramp.window == 3
    for _ in range(5):
        ramp.grow()
    assert ramp.window == 3


async def test_the_jobs_of_a_group_held_count_once_against_a_ramp() -> None:
    """A Parquet file's row groups cost no resolution once its file is open: with a ramp
    at one, every job of the first group starts at once, and the second group's first
    job waits for a delivery (which grows the ramp)."""
    started: list[tuple[int, int]] = []
    ramp = Ramp(8)

    async def jobs() -> AsyncIterator[Job[tuple[int, int]]]:
        for group in range(3):
            for i in range(4):

                async def run(key: tuple[int, int] = (group, i)) -> tuple[int, int]:
                    started.append(key)
                    return key

                yield Job(1, run, group=group, more_in_group=i < 3)

    async with Prefetcher(jobs(), max_count=8, max_bytes=100, ramp=ramp) as ahead:
        await anyio.wait_all_tasks_blocked()
        assert sorted(started) == [(0, i) for i in range(4)]  # tasks start in any order
        got = [await ahead.__anext__()]
        await anyio.wait_all_tasks_blocked()
        assert (1, 0) in started  # one delivery: the window is two, the next group opens
        got += [item async for item in ahead]
    assert got == [(g, i) for g in range(3) for i in range(4)]


def test_a_ramp_shared_by_n_workers_stays_at_its_start_for_n_deliveries_then_grows() -> None:
    """One of a DataLoader's 4 workers: its window stays at one while it delivers its
    first three results (the 4 workers hold 4 ahead together), then grows by one per
    result, to its bound."""
    ramp = Ramp(6, share=4)
    windows = []
    for _ in range(8):
        ramp.grow()
        windows.append(ramp.window)
    assert windows == [1, 1, 1, 2, 3, 4, 5, 6]
    lone = Ramp(6)
    lone.grow()
    assert lone.window == 2  # share=1: grows from the first result on
