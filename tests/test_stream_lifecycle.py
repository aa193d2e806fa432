"""A stream's lifecycle under structured concurrency, on asyncio and trio.

`async with` owns the stream's background tasks; iteration reads from a bounded
channel, so nothing is held across the user's code. Every way of leaving a loop is
clean: nothing printed, no task, thread or socket left (counted in a fresh process).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import aiostream_hf as ash
from aiostream_hf.testing import (
    Faults,
    HubServer,
    make_lerobot_dataset,
    make_repo,
    make_text_parquet,
)

pytestmark = pytest.mark.anyio

REPO = "org/lifecycle"
ROBOT = "org/robot"
ROWS = 600


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    root = tmp_path_factory.mktemp("hub")
    data = tmp_path_factory.mktemp("data")
    files: dict[str, Any] = {}
    for i in range(3):
        path = data / f"part-{i}.parquet"
        make_text_parquet(path, rows=ROWS // 3, row_group_size=50, seed=i, start_id=i * 200)
        files[f"data/train-{i:05d}-of-00003.parquet"] = path
    make_repo(root, REPO, files)
    make_lerobot_dataset(root, ROBOT, episodes=[8, 8], width=32, height=32)
    # Its own process: the client process's threads and sockets are the stream's alone.
    with HubServer(root, faults=Faults(latency_ms=5), subprocess=True) as server:
        yield server


def _stream(hub: HubServer, tmp_path: Path, **kw: Any) -> ash.Stream:
    options = ash.StreamOptions(cache_dir=tmp_path / "cache", prefetch_count=2)
    return ash.stream(f"hf://datasets/{REPO}", endpoint=hub.endpoint, options=options, **kw)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_every_exit_is_silent_and_leaves_nothing(
    hub: HubServer, tmp_path: Path, backend: str
) -> None:
    script = Path(__file__).with_name("lifecycle_script.py")
    done = subprocess.run(
        [sys.executable, str(script), backend, hub.endpoint, REPO, ROBOT, str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    result = json.loads(done.stdout)
    assert result["outcomes"] == {
        "bare": "UsageError",
        "break": 1,
        "task_group": "ok",
        "body_error": "KeyError",
        "cancelled": True,
        "after_gc": ROWS,
        "lerobot_bare": "UsageError",
        "lerobot_break": 1,
        "lerobot_task_group": "ok",
        "mix_bare": "UsageError",
        "mix_break": 1,
        "mix_task_group": "ok",
        "mix_body_error": "KeyError",
        "mix_cancelled": True,
        "mix_after_gc": 2 * ROWS,
    }
    assert result["after"] == result["before"]


async def test_a_bare_async_for_fails_at_once(hub: HubServer, tmp_path: Path) -> None:
    hub.reset_stats()
    s = _stream(hub, tmp_path)
    with pytest.raises(ash.UsageError, match="async with"):
        async for _ in s:
            pass
    assert hub.stats().requests == 0  # nothing was started


async def test_an_error_in_the_loop_body_is_not_wrapped(hub: HubServer, tmp_path: Path) -> None:
    with pytest.raises(LookupError) as info:
        async with _stream(hub, tmp_path) as s:
            async for _ in s:
                raise LookupError("the user's own")
    assert info.value.args == ("the user's own",)


async def test_a_producer_error_reaches_the_consumer_after_the_rows_before_it(
    hub: HubServer, tmp_path: Path
) -> None:
    s = ash.stream(
        f"hf://datasets/{REPO}",
        columns=["no_such_column"],
        endpoint=hub.endpoint,
        options=ash.StreamOptions(cache_dir=tmp_path / "cache"),
    )
    with pytest.raises(ash.SourceError, match="no_such_column"):
        async with s:
            async for _ in s:
                pass


async def test_cancelling_the_consumer_stops_the_stream(hub: HubServer, tmp_path: Path) -> None:
    """A sibling task cancels the consumer while its loop body waits on the first sample
    (set off by the sample itself, not by a deadline, so a slow machine changes nothing)."""
    got = 0
    first = anyio.Event()
    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as scope:

            async def cancel_after_the_first() -> None:
                await first.wait()
                scope.cancel()

            tg.start_soon(cancel_after_the_first)
            async with _stream(hub, tmp_path) as s:
                async for _ in s:
                    got += 1
                    first.set()
                    await anyio.sleep(60)
        tg.cancel_scope.cancel()  # a stream that ended without a sample: fail, not hang
    assert scope.cancelled_caught
    assert got == 1


async def test_a_next_cancelled_where_it_waits_loses_no_sample(
    hub: HubServer, tmp_path: Path
) -> None:
    """Each sample is first asked for in a cancelled scope; where that waits (the first
    one, which starts the producer; the next unit) it is cancelled and asked for again."""
    got: list[int] = []
    cancelled = 0
    async with _stream(hub, tmp_path) as s:
        it = aiter(s)
        while True:
            with anyio.CancelScope() as scope:
                scope.cancel()
                try:
                    got.append((await anext(it))["id"])
                    continue
                except StopAsyncIteration:
                    break
            cancelled += scope.cancelled_caught
            try:
                got.append((await anext(it))["id"])
            except StopAsyncIteration:
                break
    assert cancelled > 1
    assert sorted(got) == list(range(ROWS))


async def test_a_new_loop_waits_for_the_old_one_to_be_closed(
    hub: HubServer, tmp_path: Path
) -> None:
    async with _stream(hub, tmp_path) as s:
        first = aiter(s)
        await anext(first)
        with pytest.raises(ash.UsageError, match="already being iterated"):
            [row["id"] async for row in s]  # it used to end the first one silently
        await anext(first)  # which goes on
        await first.aclose()
        rows = [row["id"] async for row in s]  # a new loop restarts
    assert sorted(rows) == list(range(ROWS))


async def test_streams_in_sibling_tasks_of_a_user_task_group(
    hub: HubServer, tmp_path: Path
) -> None:
    counts: dict[int, int] = {}

    async def consume(i: int) -> None:
        async with _stream(hub, tmp_path, shuffle=True, seed=i) as s:
            counts[i] = sum([1 async for _ in s])

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(consume, i)
    assert counts == {i: ROWS for i in range(4)}


async def test_a_closed_stream_refuses_reuse(hub: HubServer, tmp_path: Path) -> None:
    s = _stream(hub, tmp_path)
    async with s:
        pass
    with pytest.raises(ash.ClosedResourceError):
        async with s:
            pass
