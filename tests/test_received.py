"""Bytes a stream has received, kept by file (aiostream_hf._received): a tail read and a
head read beside a file's plan serve the later reads of their bytes, a range running past
them costs only its rest, a failed kept read is dropped, a cancelled one stays cancelled,
and a forgotten file is fetched again. Against the local Hub server over loopback."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import anyio
import pyarrow.parquet as pq
import pytest

import aiostream_hf as ash
from aiostream_hf._fetcher import RangeFetcher
from aiostream_hf._models import FileRef
from aiostream_hf._options import StreamOptions
from aiostream_hf._received import Received
from aiostream_hf.testing import Faults, HubServer, make_repo, make_text_parquet

pytestmark = pytest.mark.anyio

FAST = {"backoff_base": 0.01, "backoff_max": 0.05, "max_retries": 2}
BLOB = "data/blob.parquet"  # any bytes: the head does not read them as Parquet
SIZE = 100_000


@pytest.fixture
def blob(tmp_path: Path) -> tuple[Path, bytes]:
    root = tmp_path / "hub"
    data = random.Random(5).randbytes(SIZE)
    make_repo(root, "org/blob", {BLOB: data})
    return root, data


def _ref(hub: HubServer, data: bytes) -> FileRef:
    return FileRef(
        url=hub.url("org/blob", BLOB),
        path=BLOB,
        size=len(data),
        etag=hashlib.sha256(data).hexdigest(),
    )


async def _read(
    received: Received,
    file: FileRef,
    ranges: list[tuple[int, int]],
    *,
    head: tuple[int, int] | None = (4, 50_000),
) -> list[bytes]:
    """The ranges while the head is read beside them (as the stream does: the head in
    its own task, started first)."""
    async with anyio.create_task_group() as tg:
        if head is not None:
            tg.start_soon(received.keep, file, *head)
            await anyio.wait_all_tasks_blocked()  # the head's request is out
        got = await received.read_buffers(file, ranges)
    return [bytes(b) for b in got]


async def test_ranges_in_the_head_are_cut_from_it_and_only_the_rest_is_fetched(
    blob: tuple[Path, bytes],
) -> None:
    root, data = blob
    ranges = [(10, 100), (40_000, 60_000), (70_000, 80_000), (49_000, 50_000)]
    with HubServer(root) as hub:
        file = _ref(hub, data)
        async with RangeFetcher(StreamOptions(coalesce_gap=0, **FAST)) as fetcher:
            received = Received(fetcher)
            got = await _read(received, file, ranges)
            pieces = await received.read_pieces(file, [(40_000, 60_000)])
            bytes_received = fetcher.statistics().bytes_received
    assert got == [data[s:e] for s, e in ranges]
    # The head once; (40k, 60k), running past it, whole (read_buffers gives one buffer
    # and joins none); (70k, 80k); then read_pieces fetches only (50k, 60k).
    assert bytes_received == (50_000 - 4) + 20_000 + 10_000 + 10_000
    # A range cut by the head's end comes in two pieces, the first cut from the head.
    assert [(at, len(view)) for at, view in pieces[0]] == [(40_000, 10_000), (50_000, 10_000)]
    assert b"".join(view for _, view in pieces[0]) == data[40_000:60_000]


async def test_a_tail_read_serves_the_reads_of_its_bytes(blob: tuple[Path, bytes]) -> None:
    """A tail read (a Parquet footer's) is kept: a range inside it is not fetched; a
    range reaching into it is fetched whole by read_ranges (one buffer each, none joined
    on the event loop), and up to where the tail begins by read_pieces."""
    root, data = blob
    with HubServer(root) as hub:
        file = _ref(hub, data)
        async with RangeFetcher(StreamOptions(coalesce_gap=0, **FAST)) as fetcher:
            received = Received(fetcher)
            tail, size = await received.read_tail(file, 20_000)
            requests = fetcher.statistics().requests
            inside = await received.read_buffers(file, [(90_000, 95_000)])
            assert fetcher.statistics().requests == requests  # nothing fetched
            ranges = [(70_000, 85_000), (99_990, SIZE)]
            (across, end) = await received.read_ranges(file, ranges)
            (pieces,) = await received.read_pieces(file, [(70_000, 85_000)])
            assert [(at, len(v)) for at, v in pieces] == [(70_000, 10_000), (80_000, 5_000)]
            assert received.held_bytes() == 20_000
            received.forget(file)
            assert received.held_bytes() == 0
            again = await received.read_buffers(file, [(90_000, 95_000)])
            bytes_received = fetcher.statistics().bytes_received
    assert (tail, size) == (data[80_000:], SIZE)
    assert bytes(inside[0]) == data[90_000:95_000]
    assert (across, end) == (data[70_000:85_000], data[99_990:])
    assert bytes(again[0]) == data[90_000:95_000]
    # The tail, (70k, 85k) whole, its part before the tail, and after forget the range
    # inside the tail once more.
    assert bytes_received == 20_000 + 15_000 + 10_000 + 5_000


class _Gated:
    """A byte source (a unit test's) whose read of ``gated`` waits for ``gate``."""

    def __init__(self, data: bytes, gated: tuple[int, int]) -> None:
        self.data = data
        self.gated = gated
        self.gate = anyio.Event()
        self.asked: list[list[tuple[int, int]]] = []

    async def read_buffers(self, file: FileRef, ranges: Any) -> list[memoryview]:
        self.asked.append(list(ranges))
        if list(ranges) == [self.gated]:
            await self.gate.wait()
        return [memoryview(self.data[s:e]) for s, e in ranges]


async def test_ranges_elsewhere_in_the_file_do_not_wait_for_the_head() -> None:
    data = random.Random(5).randbytes(SIZE)
    source = _Gated(data, (4, 50_000))
    received = Received(source)  # type: ignore[arg-type]  # reads buffers only
    file = FileRef(url="https://example.invalid/blob", path="blob", size=SIZE)
    inside: list[memoryview] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(received.keep, file, 4, 50_000)
        await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(5):
            elsewhere = await received.read_buffers(file, [(60_000, 70_000)])

        async def read_inside() -> None:
            inside.extend(await received.read_buffers(file, [(100, 200)]))

        tg.start_soon(read_inside)
        await anyio.wait_all_tasks_blocked()
        assert inside == []  # bytes of the head wait for it...
        source.gate.set()
    assert bytes(elsewhere[0]) == data[60_000:70_000]
    assert bytes(inside[0]) == data[100:200]
    assert source.asked == [[(4, 50_000)], [(60_000, 70_000)]]  # ...and are not fetched


async def test_a_failed_head_read_is_dropped_and_its_ranges_fetched(
    blob: tuple[Path, bytes],
) -> None:
    """The head's request and its two retries answer 503 (the server's first three CDN
    requests): nothing is kept, nothing raised, and the ranges are fetched in full,
    their bytes right."""
    root, data = blob
    faults = Faults(error_at=(1, 2, 3), targets=("cdn",))
    ranges = [(10, 100), (40_000, 60_000)]
    with HubServer(root, faults=faults) as hub:
        file = _ref(hub, data)
        async with RangeFetcher(StreamOptions(coalesce_gap=0, **FAST)) as fetcher:
            received = Received(fetcher)
            await received.keep(file, 4, 50_000)  # the first three CDN requests: 503
            assert received.held_bytes() == 0
            got = await _read(received, file, ranges, head=None)
        assert hub.stats().by_status.get(503) == 3
    assert got == [data[s:e] for s, e in ranges]


async def test_a_head_read_of_a_changed_file_raises(blob: tuple[Path, bytes]) -> None:
    """The file changed after its first answer (and the CDN ignores If-Match): the head
    read raises FileChangedError, as any read of the file would; it is not dropped."""
    root, data = blob
    faults = Faults(replace_after=1, replace_path=BLOB, ignore_if_match=("cdn", "resolvers"))
    with HubServer(root, faults=faults) as hub:
        file = _ref(hub, data)
        async with RangeFetcher(StreamOptions(**FAST)) as fetcher:
            assert await fetcher.read(file, 60_000, 60_010) == data[60_000:60_010]  # pins it
            received = Received(fetcher)
            with pytest.raises(ash.FileChangedError, match="blob.parquet"):
                await received.keep(file, 4, 50_000)
            assert received.held_bytes() == 0


async def test_a_cancelled_head_read_is_not_swallowed_and_its_waiters_fetch(
    blob: tuple[Path, bytes],
) -> None:
    root, data = blob
    with HubServer(root, faults=Faults(latency_ms=1_000)) as hub:
        file = _ref(hub, data)
        async with RangeFetcher(StreamOptions(**FAST)) as fetcher:
            received = Received(fetcher)
            got: list[memoryview] = []

            async def waiter() -> None:
                got.extend(await received.read_buffers(file, [(10, 100)]))

            async with anyio.create_task_group() as tg:
                with anyio.move_on_after(0.2) as scope:
                    tg.start_soon(waiter)
                    await received.keep(file, 4, 50_000)
                    pytest.fail("the head read returned under a cancelled scope")
            assert scope.cancelled_caught
            assert received.held_bytes() == 0
    # The waiter was not left hanging: it fetched its range itself.
    assert [bytes(b) for b in got] == [data[10:100]]


async def test_a_kept_read_needs_a_range(blob: tuple[Path, bytes]) -> None:
    root, data = blob
    with HubServer(root) as hub:
        async with RangeFetcher(StreamOptions(**FAST)) as fetcher:
            with pytest.raises(ValueError, match="0 <= start < end"):
                await Received(fetcher).keep(_ref(hub, data), 5, 5)


def _straddling(root: Path, tmp_path: Path) -> tuple[Path, Any]:
    """A Parquet file whose first row group (~150 KB) runs past a 128 KiB head."""
    repo = make_repo(root, "org/one", {})
    path = repo / "data" / "train.parquet"
    table = make_text_parquet(path, rows=1000, row_group_size=200, min_text=500, max_text=1000)
    meta = pq.ParquetFile(path).metadata
    assert meta.row_group(0).total_byte_size > 128 << 10
    return path, table


async def test_a_stream_reads_its_first_files_head_beside_its_plan_and_no_byte_twice(
    tmp_path: Path,
) -> None:
    root = tmp_path / "hub"
    path, table = _straddling(root, tmp_path)
    size = path.stat().st_size
    opts = ash.StreamOptions(cache_dir=tmp_path / "cache", block_size=128 << 10, **FAST)
    with HubServer(root, faults=Faults(latency_ms=2)) as hub:
        s = ash.stream("hf://datasets/org/one", endpoint=hub.endpoint, options=opts)
        async with s:
            rows = [row async for row in s]
        served = hub.stats()
    assert rows == table.to_pylist()
    # Every byte but the leading magic, once: the tail (the footer), the head beside
    # it, and the rest, the first row group's part past the head included.
    assert s.statistics().fetcher["bytes_received"] == size - 4
    assert served.by_bucket["resolvers"] == 1  # the head and the tail share one


async def test_a_stream_reading_some_columns_reads_no_head(tmp_path: Path) -> None:
    """A head would hold column chunks nobody asked for: with ``columns`` none is read."""
    root = tmp_path / "hub"
    path, table = _straddling(root, tmp_path)
    opts = ash.StreamOptions(cache_dir=tmp_path / "cache", block_size=128 << 10, **FAST)
    with HubServer(root) as hub:
        s = ash.stream("hf://datasets/org/one", endpoint=hub.endpoint, options=opts, columns=["id"])
        async with s:
            rows = [row async for row in s]
    assert rows == table.select(["id"]).to_pylist()
    text_bytes = sum(
        pq.ParquetFile(path).metadata.row_group(i).column(1).total_compressed_size for i in range(5)
    )
    assert s.statistics().fetcher["bytes_received"] < path.stat().st_size - text_bytes
