"""A file's head read beside its plan (aiostream_hf._head): its bytes serve the first
units, a range running past it costs only its rest, a failed head is dropped, and a
cancelled one stays cancelled. Against the local Hub server over loopback."""

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
from aiostream_hf._head import HeadFirst, HeadRead
from aiostream_hf._models import FileRef
from aiostream_hf._options import StreamOptions
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
    fetcher: RangeFetcher, head: HeadRead, ranges: list[tuple[int, int]], *, run_head: bool = True
) -> list[bytes]:
    """The ranges through HeadFirst while the head is read beside them (as the stream
    does: the head in its own task)."""
    async with anyio.create_task_group() as tg:
        if run_head:
            tg.start_soon(head.read, fetcher)
        got = await HeadFirst(fetcher, head).read_buffers(head.file, ranges)
    return [bytes(b) for b in got]


async def test_ranges_in_the_head_are_cut_from_it_and_only_the_rest_is_fetched(
    blob: tuple[Path, bytes],
) -> None:
    root, data = blob
    ranges = [(10, 100), (40_000, 60_000), (70_000, 80_000), (49_000, 50_000)]
    with HubServer(root) as hub:
        file = _ref(hub, data)
        async with RangeFetcher(StreamOptions(coalesce_gap=0, **FAST)) as fetcher:
            head = HeadRead(file, 4, 50_000)
            got = await _read(fetcher, head, ranges)
            received = fetcher.statistics().bytes_received
    assert got == [data[s:e] for s, e in ranges]
    # The head once, the part of (40k, 60k) past it, and (70k, 80k): no byte twice.
    assert received == (50_000 - 4) + 10_000 + 10_000


async def test_ranges_elsewhere_in_the_file_do_not_wait_for_the_head(
    blob: tuple[Path, bytes],
) -> None:
    root, data = blob
    with HubServer(root) as hub:
        file = _ref(hub, data)
        async with RangeFetcher(StreamOptions(**FAST)) as fetcher:
            head = HeadRead(file, 4, 50_000)  # never read: a wait for it would hang
            with anyio.fail_after(30):
                got = await _read(fetcher, head, [(60_000, 70_000)], run_head=False)
    assert got == [data[60_000:70_000]]


async def test_a_failed_head_read_is_dropped_and_its_ranges_fetched(
    blob: tuple[Path, bytes],
) -> None:
    """The head's request and its two retries answer 503 (the server's first three CDN
    requests): the head holds nothing, raises nothing, and the ranges are fetched in
    full, their bytes right."""
    root, data = blob
    faults = Faults(error_at=(1, 2, 3), targets=("cdn",))
    ranges = [(10, 100), (40_000, 60_000)]
    with HubServer(root, faults=faults) as hub:
        file = _ref(hub, data)
        async with RangeFetcher(StreamOptions(coalesce_gap=0, **FAST)) as fetcher:
            head = HeadRead(file, 4, 50_000)
            await head.read(fetcher)
            assert head.done.is_set()
            assert head.data is None
            got = await _read(fetcher, head, ranges, run_head=False)
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
            head = HeadRead(file, 4, 50_000)
            with pytest.raises(ash.FileChangedError, match="blob.parquet"):
                await head.read(fetcher)
    assert head.done.is_set()
    assert head.data is None


async def test_a_cancelled_head_read_is_not_swallowed(blob: tuple[Path, bytes]) -> None:
    root, data = blob
    with HubServer(root, faults=Faults(latency_ms=5_000)) as hub:
        file = _ref(hub, data)
        async with RangeFetcher(StreamOptions(**FAST)) as fetcher:
            head = HeadRead(file, 4, 50_000)
            with anyio.move_on_after(0.2) as scope:
                await head.read(fetcher)
                pytest.fail("the head read returned under a cancelled scope")
    assert scope.cancelled_caught
    assert head.done.is_set()  # whoever waits for it is not left hanging
    assert head.data is None


def test_a_head_read_needs_a_range() -> None:
    file = FileRef(url="https://example.invalid/x.parquet", path="x.parquet", size=10)
    with pytest.raises(ValueError, match="0 <= start < end"):
        HeadRead(file, 5, 5)


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
