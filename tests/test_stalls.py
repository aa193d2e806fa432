"""Where an iteration's time goes (``_stalls``): the clock's rules on a clock the test
moves by hand, then the figures every stream reports, held to what the server counted.

No figure is compared with a duration: the clock's rules run on a fake clock, and the
streams' figures are held to their sums and to the server's counts. Whether the
bottleneck named is the right one is measured in benchmarks/stalls.py, against runs
whose bottleneck is known (docs/where-time-goes.md).
"""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

import aiostream_hf as ash
from aiostream_hf import _stalls
from aiostream_hf._stalls import StageClock, Stalls
from aiostream_hf.testing import (
    HubServer,
    make_lerobot_dataset,
    make_repo,
    make_text_parquet,
    make_webdataset_shards,
)

pytestmark = pytest.mark.anyio


class _Now:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def __iadd__(self, dt: float) -> _Now:
        self.t += dt
        return self


def test_the_consumers_wait_is_charged_to_the_stage_of_the_oldest_job() -> None:
    now = _Now()
    clock = StageClock(now)
    first, second = clock.next_job(), clock.next_job()
    with clock.consumer_waiting():
        with clock.stage("network", first):
            now += 1.0  # the unit waited for is being read
            with clock.stage("decode", second):
                now += 2.0  # a later unit decodes: still the first one's read
        with clock.stage("decode", second):
            now += 0.5  # the first delivered, then the second decodes
        now += 0.25  # nothing under way: the engine's own work
    now += 4.0  # the consumer's own time
    s = clock.stalls()
    assert s == Stalls(
        seconds=7.75,
        waited=3.75,
        waited_network=3.0,
        waited_decode=0.5,
        waited_engine=0.25,
        network_busy=3.0,
        decode_busy=2.5,
        blocked_on_consumer=0.0,
        bottleneck="consumer",
    )
    assert s.input_bound == pytest.approx(3.75 / 7.75)


def test_a_wait_split_among_stages_is_still_the_bottleneck() -> None:
    """The consumer waited longer than it worked: the input is the bottleneck, at the
    stage waited on most, even when its own time is longer than any one stage."""
    now = _Now()
    clock = StageClock(now)
    job = clock.next_job()
    with clock.consumer_waiting():
        with clock.stage("network", job):
            now += 1.0
        with clock.stage("decode", job):
            now += 1.5
        now += 1.0
    now += 3.0
    assert clock.stalls().bottleneck == "decode"
    now += 0.5  # now it worked as long as it waited
    assert clock.stalls().bottleneck == "consumer"


def test_work_outside_any_job_counts_first() -> None:
    """The producer's own reads (a resolution, job -1) are what the consumer waits for,
    whatever the jobs do beside them."""
    now = _Now()
    clock = StageClock(now)
    job = clock.next_job()
    with clock.consumer_waiting(), clock.stage("decode", job), clock.stage("network", -1):
        now += 1.0
    assert clock.stalls().waited_network == 1.0
    assert clock.stalls().bottleneck == "network"


def test_a_job_reading_ahead_of_its_decode_waits_on_the_decode() -> None:
    """A TAR shard's next block is read while the last one is parsed: the consumer
    waits on the parse; once the parse waits for bytes, on the network."""
    now = _Now()
    clock = StageClock(now)
    job = clock.next_job()
    with (
        clock.consumer_waiting(),
        clock.stage("network", job),
        clock.stage("decode", job) as key,
    ):
        now += 1.0
        clock.switch(key, "network")  # the decode thread waits for its bytes
        now += 2.0
        clock.switch(key, "decode")
        now += 0.5
    s = clock.stalls()
    assert (s.waited_decode, s.waited_network, s.decode_busy) == (1.5, 2.0, 1.5)
    assert s.bottleneck == "network"


def test_the_time_a_unit_waits_to_be_taken_is_the_consumers() -> None:
    now = _Now()
    clock = StageClock(now)
    with clock.blocked():
        now += 3.0
    now += 1.0
    s = clock.stalls()
    assert (s.blocked_on_consumer, s.waited, s.bottleneck) == (3.0, 0.0, "consumer")


def test_an_ended_clock_stops() -> None:
    now = _Now()
    clock = StageClock(now)
    assert clock.stalls().bottleneck is None  # no time yet
    with clock.consumer_waiting():
        now += 2.0
        clock.end()
        now += 5.0
    now += 5.0
    s = clock.stalls()
    assert (s.seconds, s.waited, s.waited_engine, s.bottleneck) == (2.0, 2.0, 2.0, "engine")


def test_the_clock_is_shared_by_two_threads() -> None:
    """A sync iteration's consumer marks its waits from its own thread while the event
    loop marks reads: the counts never go wrong (each mark is under the lock)."""
    clock = StageClock()
    job = clock.next_job()

    def consumer() -> None:
        for _ in range(2000):
            with clock.consumer_waiting():
                pass

    thread = threading.Thread(target=consumer)
    thread.start()
    for _ in range(2000):
        with clock.stage("network", job):
            pass
    thread.join()
    s = clock.stalls()
    assert s.waited == pytest.approx(s.waited_network + s.waited_decode + s.waited_engine)
    assert clock._busy == {"network": 0, "decode": 0}
    assert clock._consumer_waits == 0
    assert not clock._active


def test_marks_outside_an_iteration_cost_nothing() -> None:
    """A reader used on its own (no iteration's clock in its context) marks nothing."""
    with _stalls.network(), _stalls.bytes_wait():
        _stalls.job()
    assert _stalls._CLOCK.get() is None


async def test_run_decode_marks_a_decode_and_its_byte_waits() -> None:
    now = _Now()
    clock = StageClock(now)
    seen: list[dict[str, int]] = []

    def decode() -> int:
        seen.append(dict(clock._busy))
        with _stalls.bytes_wait():
            seen.append(dict(clock._busy))
        return 7

    async def producer() -> int:
        _stalls._CLOCK.set(clock)  # as ``metered`` does in an iteration's producer
        _stalls.job()
        return await _stalls.run_decode(decode)

    assert await producer() == 7
    assert seen == [{"network": 0, "decode": 1}, {"network": 1, "decode": 0}]
    assert clock._busy == {"network": 0, "decode": 0}


# -- every stream's figures ----------------------------------------------------------------


def _check(s: Stalls) -> None:
    assert s.seconds > 0
    assert s.waited == pytest.approx(s.waited_network + s.waited_decode + s.waited_engine)
    assert 0 <= s.waited <= s.seconds
    assert s.bottleneck in ("network", "decode", "engine", "consumer")
    assert s.network_busy > 0  # the files were read over HTTP
    assert s.decode_busy > 0  # and decoded on threads


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "hub"


async def test_a_parquet_streams_figures_add_up_and_match_the_server(root: Path) -> None:
    repo = make_repo(root, "org/text", {})
    for i in range(3):
        make_text_parquet(repo / "data" / f"train-{i}.parquet", rows=300, row_group_size=100)
    with HubServer(root) as hub:
        async with ash.stream("hf://datasets/org/text", endpoint=hub.endpoint) as s:
            n = sum([1 async for _ in s])
        served = hub.stats()
    stats = s.statistics()
    assert n == 900
    _check(stats.stalls)
    assert stats.requests == {**served.by_bucket, "total": served.requests}
    assert stats.bytes_received <= served.bytes_served


def test_a_sync_webdataset_streams_figures(root: Path) -> None:
    make_webdataset_shards(root / "datasets" / "org" / "shards", shards=3, samples_per_shard=20)
    with HubServer(root) as hub:
        s = ash.stream("hf://datasets/org/shards", split="train", endpoint=hub.endpoint)
        with s:
            assert sum(1 for _ in s) == 60
        served = hub.stats()
    stats = s.statistics()
    _check(stats.stalls)
    assert stats.requests == {**served.by_bucket, "total": served.requests}


async def test_a_lerobot_streams_figures(root: Path) -> None:
    make_lerobot_dataset(root, "org/robot", episodes=[8, 8], width=64, height=48, codec="h264")
    with HubServer(root) as hub:
        async with ash.lerobot.stream("hf://datasets/org/robot", endpoint=hub.endpoint) as s:
            assert sum([1 async for _ in s]) == 16
        served = hub.stats()
    stats = s.statistics()
    _check(stats.stalls)
    assert stats.requests == {**served.by_bucket, "total": served.requests}


async def test_a_loop_left_early_stops_its_clock(root: Path) -> None:
    repo = make_repo(root, "org/text", {})
    make_text_parquet(repo / "data" / "train.parquet", rows=300, row_group_size=100)
    with HubServer(root) as hub:
        async with ash.stream("hf://datasets/org/text", endpoint=hub.endpoint) as s:
            async for _ in s:
                break
            left: Any = s.statistics().stalls
            await anyio.sleep(0.05)  # the consumer's own time, once the loop is left
            assert s.statistics().stalls == left  # stopped when the loop was left


# -- the recorded run ----------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def test_the_recorded_run_named_every_bottleneck_made_and_the_page_shows_it() -> None:
    """benchmarks/stalls.py made each bottleneck on purpose; its record must name each
    one in every round, and docs/where-time-goes.md must show that record."""
    record = json.loads((ROOT / "benchmarks/results/checks/stalls.json").read_text())
    for made in ("network", "decode", "consumer"):
        run = record["summary"][made]
        assert run["named_every_round"] == [made] * record["setup"]["rounds"]
        assert all(r["named"] == made for r in record["runs"] if r["run"] == made)
    spec = importlib.util.spec_from_file_location("stalls_bench", ROOT / "benchmarks/stalls.py")
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    page = (ROOT / "docs/where-time-goes.md").read_text()
    assert f"{bench.BEGIN}\n{bench.table(record)}\n{bench.END}" in page
