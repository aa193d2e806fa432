"""stream() over Parquet through the local Hub server: rows, economy, faults, errors."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import aiostream_hf as ash
from aiostream_hf._models import FileRef, Manifest
from aiostream_hf._resolver import Resolver
from aiostream_hf.formats import ByteSource, Decoder, ReadRequest, Unit
from aiostream_hf.formats.parquet import ParquetDecoder
from aiostream_hf.testing import (
    Faults,
    HubServer,
    RateLimits,
    make_repo,
    make_repo_split_naming,
    make_repo_yaml_configs,
    make_text_parquet,
)

pytestmark = pytest.mark.anyio

FAST = dict(backoff_base=0.001, backoff_max=0.01)


def _options(tmp_path: Path, **kw: Any) -> ash.StreamOptions:
    return ash.StreamOptions(cache_dir=tmp_path / "cache", **{**FAST, **kw})


async def _collect(s: ash.Stream) -> list[Any]:
    async with s:
        return [row async for row in s]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "hub"
    r.mkdir()
    return r


def _corpus(folder: Path) -> dict[str, Path]:
    """Parquet variants: compressions, dictionary, page versions, nested, decimals, sizes."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 300
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "text": pa.array([f"row {i} " * (i % 7) for i in range(n)], pa.large_string()),
            "blob": pa.array([bytes([i % 256]) * (i % 13) for i in range(n)], pa.large_binary()),
            "tags": pa.array([[f"t{j}" for j in range(i % 4)] for i in range(n)]),
            "point": pa.array([{"x": i, "y": float(i) / 3} for i in range(n)]),
            "attrs": pa.array([[("k", i)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
            "ts": pa.array(range(n), pa.timestamp("us", tz="UTC")),
            "price": pa.array([i * 1.25 for i in range(n)]).cast(pa.decimal128(12, 2)),
        }
    )
    files: dict[str, Path] = {}
    for codec in ("none", "snappy", "gzip", "brotli", "zstd", "lz4"):
        if codec != "none" and not pa.Codec.is_available(codec):
            continue
        p = folder / f"{codec}.parquet"
        pq.write_table(table, p, compression=codec, row_group_size=64)
        files[codec] = p
    variants: dict[str, dict[str, Any]] = {
        "nodict-v2": dict(use_dictionary=False, data_page_version="2.0", row_group_size=100),
        "dict-v1": dict(use_dictionary=True, data_page_version="1.0", row_group_size=1),
        "one-group": dict(row_group_size=100_000),
    }
    for name, kw in variants.items():
        p = folder / f"{name}.parquet"
        pq.write_table(table.slice(0, 120) if name == "dict-v1" else table, p, **kw)
        files[name] = p
    empty = folder / "empty.parquet"
    pq.write_table(table.slice(0, 0), empty)
    files["empty"] = empty
    big = folder / "big-groups.parquet"
    make_text_parquet(big, rows=100_000, row_group_size=100_000, min_text=5, max_text=20)
    files["big-groups"] = big
    return files


async def test_rows_equal_pyarrow_local_reads_for_a_corpus_of_variants(
    root: Path, tmp_path: Path
) -> None:
    repo = make_repo(root, "org/corpus", {"README.md": "# corpus\n"})
    files = _corpus(repo / "variants")
    with HubServer(root) as hub:
        for name, path in files.items():
            source = f"hf://datasets/org/corpus/variants/{path.name}"
            opts = _options(tmp_path)
            got = await _collect(ash.stream(source, endpoint=hub.endpoint, options=opts))
            assert got == pq.read_table(path).to_pylist(), name
            if name == "snappy":
                cols = ["id", "point"]
                s = ash.stream(source, endpoint=hub.endpoint, options=opts, columns=cols)
                assert await _collect(s) == pq.read_table(path, columns=cols).to_pylist()
                arrow = ash.stream(source, endpoint=hub.endpoint, options=opts, output="arrow")
                batches = await _collect(arrow)
                assert all(isinstance(b, pa.RecordBatch) for b in batches)
                assert pa.Table.from_batches(batches).equals(pq.read_table(path))


async def test_splits_configs_and_data_files(root: Path, tmp_path: Path) -> None:
    naming = make_repo_split_naming(root)["default"]
    configs = make_repo_yaml_configs(root)
    with HubServer(root) as hub:
        kw: dict[str, Any] = dict(endpoint=hub.endpoint, options=_options(tmp_path))
        for split in ("train", "test"):
            got = await _collect(ash.stream("hf://datasets/org/split-naming", split=split, **kw))
            assert got == naming[split].to_pylist()
        fr = await _collect(
            ash.stream("hf://datasets/org/yaml-configs", config="fr", split="train", **kw)
        )
        assert fr == configs["fr"]["train"].to_pylist()
        explicit = await _collect(
            ash.stream(
                "hf://datasets/org/split-naming",
                data_files={"validation": "data/test-*.parquet"},
                split="validation",
                **kw,
            )
        )
        assert explicit == naming["test"].to_pylist()


async def test_streaming_a_file_costs_one_resolver_request(root: Path, tmp_path: Path) -> None:
    repo = make_repo(root, "org/one", {})
    table = make_text_parquet(repo / "data" / "train.parquet", rows=2000, row_group_size=100)
    with HubServer(root) as hub:
        opts = _options(tmp_path, coalesce_gap=0)
        s = ash.stream("hf://datasets/org/one", endpoint=hub.endpoint, options=opts)
        rows = await _collect(s)
        stats = hub.stats()
    assert rows == table.to_pylist()
    assert stats.by_bucket["resolvers"] == 1
    # the footer, the two row groups loaded before one is measured, then the rest side
    # by side in a few reads (each a quarter of a block at most)
    assert 2 <= stats.by_bucket["cdn"] <= 8
    assert stats.by_bucket["api"] == 2  # pin + tree


@pytest.mark.parametrize(("rows", "row_group_size"), [(8, 4), (400, 50)])
async def test_no_byte_is_fetched_twice(
    root: Path, tmp_path: Path, rows: int, row_group_size: int
) -> None:
    """The tail read that brings the footer also holds the last column chunks (all of
    them, for a small file): they are taken from it, not fetched again."""
    repo = make_repo(root, "org/small", {})
    path = repo / "data" / "train.parquet"
    table = make_text_parquet(path, rows=rows, row_group_size=row_group_size)
    size = path.stat().st_size
    with HubServer(root) as hub:
        s = ash.stream("hf://datasets/org/small", endpoint=hub.endpoint, options=_options(tmp_path))
        got = await _collect(s)
        cdn = hub.stats().by_bucket["cdn"]
    assert got == table.to_pylist()
    received = s.statistics().fetcher["bytes_received"]
    assert received <= size
    assert (size <= 64 * 1024) == (rows == 8)
    if size <= 64 * 1024:  # the tail read holds the whole file: one read
        assert received == size
        assert cdn == 1


async def test_thirty_two_concurrent_streams_resolve_once(root: Path, tmp_path: Path) -> None:
    make_repo_split_naming(root)
    with HubServer(root) as hub:
        opts = _options(tmp_path)
        counts: list[int] = []

        async def one() -> None:
            s = ash.stream(
                "hf://datasets/org/split-naming", split="train", endpoint=hub.endpoint, options=opts
            )
            counts.append(len(await _collect(s)))

        async with anyio.create_task_group() as tg:
            for _ in range(32):
                tg.start_soon(one)
        stats = hub.stats()
    assert counts == [100] * 32
    assert stats.by_endpoint["dataset_info"] == 1
    assert stats.by_endpoint["tree"] == 1


async def test_every_row_exactly_once_under_cuts_and_503s(root: Path, tmp_path: Path) -> None:
    repo = make_repo(root, "org/faulty", {})
    expected: list[dict[str, Any]] = []
    for i in range(4):
        t = make_text_parquet(
            repo / "data" / f"train-{i:05d}-of-00004.parquet",
            rows=500,
            row_group_size=50,
            start_id=i * 500,
            seed=i,
        )
        expected += t.to_pylist()
    faults = Faults(cut_rate=0.05, error_rate=0.02, targets=("cdn", "resolvers"), seed=3)
    with HubServer(root, faults=faults) as hub:
        opts = _options(tmp_path, coalesce_gap=0)
        rows = await _collect(
            ash.stream("hf://datasets/org/faulty", endpoint=hub.endpoint, options=opts)
        )
        stats = hub.stats()
    assert [r["id"] for r in rows] == [r["id"] for r in expected]
    assert rows == expected
    assert stats.faults.get("cut", 0) + stats.faults.get("error", 0) > 0


async def test_a_resolvers_quota_is_waited_out(root: Path, tmp_path: Path) -> None:
    repo = make_repo(root, "org/quota", {})
    expected = []
    for i in range(6):
        expected += make_text_parquet(
            repo / f"part-{i}.parquet", rows=20, start_id=i * 20, min_text=5, max_text=10
        ).to_pylist()
    quota = RateLimits(resolvers=2, window_s=1)
    with HubServer(root, rate_limits=quota, faults=Faults(latency_ms=20)) as hub:
        opts = _options(tmp_path, max_concurrency=4)
        async with Resolver(options=opts) as resolver:
            manifest = await resolver.resolve("hf://datasets/org/quota", endpoint=hub.endpoint)
        # Three ranks of one manifest in one event loop (one client, one host gate), as
        # DataLoader workers start: their first resolver requests leave together, before
        # any answer says how many may follow, so more than the quota are in flight (one
        # stream alone ramps up from one file, and is then paced by the RateLimit header).
        rows: list[Any] = []

        async def rank(r: int) -> None:
            s = ash.stream(manifest, options=opts, rank=r, world_size=3)
            rows.extend(await _collect(s))

        async with anyio.create_task_group() as tg:
            for r in range(3):
                tg.start_soon(rank, r)
        stats = hub.stats()
    assert sorted(r["id"] for r in rows) == [r["id"] for r in expected]
    # 6 files at 2 per window need 3 windows: the first request's RateLimit header
    # opens the count, the rest of each window's quota is spent and the reset waited
    # for, so the server refuses nothing (before the shared count: a burst of 429s).
    assert stats.throttled == 0
    assert stats.by_bucket["resolvers"] == 6


class _CountsAtDecode(ParquetDecoder):
    """Parquet, noting the server's resolver requests as each of the first ``decodes``
    units is decoded (``counts``; ``resolvers``, the first): nothing reaches the consumer
    before a unit is decoded, and the readahead's window grows only as units reach it,
    so a count bounds what the stream asked before that unit's rows. ``pause``: each of
    those decodes waits that long first (room for the stream to plan ahead, if it would)."""

    def __init__(self, hub: HubServer, pause: float = 0.0, decodes: int = 1) -> None:
        self._hub = hub
        self._pause = pause
        self._decodes = decodes
        self._lock = threading.Lock()
        self.counts: list[int] = []

    @property
    def resolvers(self) -> int | None:
        return self.counts[0] if self.counts else None

    def decode(self, unit: Any, fetched: Any, request: Any) -> pa.Table:
        with self._lock:  # decodes run on worker threads, maybe two at once
            noted = len(self.counts) < self._decodes
            if noted:
                if self._pause:
                    # The wait only gives a stream that would plan too far ahead the time
                    # to do it; a right one plans no more however long it is.
                    time.sleep(self._pause)
                self.counts.append(self._hub.stats().by_bucket.get("resolvers", 0))
        return super().decode(unit, fetched, request)


async def _resolved_many(hub: HubServer, opts: ash.StreamOptions) -> Manifest:
    """org/many's manifest, resolved before the stream: the server's counts start after."""
    async with Resolver(options=opts) as resolver:
        manifest = await resolver.resolve("hf://datasets/org/many", endpoint=hub.endpoint)
    hub.reset_stats()
    return manifest


def _many_files(root: Path, files: int, *, rows: int, row_group_size: int) -> list[Any]:
    repo = make_repo(root, "org/many", {})
    expected: list[Any] = []
    for i in range(files):
        path = repo / "data" / f"train-{i:05d}-of-{files:05d}.parquet"
        table = make_text_parquet(
            path,
            rows=rows,
            row_group_size=row_group_size,
            start_id=i * rows,
            min_text=5,
            max_text=10,
            seed=i,
        )
        expected += table.to_pylist()
    return expected


async def test_resolver_requests_ramp_up_from_one_file(root: Path, tmp_path: Path) -> None:
    """A stream over many small files plans only the file it reads before its first row
    (one resolver request), not a whole readahead of files, nor the next one; then the
    window grows to prefetch_count and the epoch delivers every row once."""
    expected = _many_files(root, 40, rows=10, row_group_size=10)
    with HubServer(root, faults=Faults(latency_ms=5)) as hub:
        opts = _options(tmp_path)
        manifest = await _resolved_many(hub, opts)
        counting = _CountsAtDecode(hub, pause=0.3)
        s = ash.stream(manifest, format=counting, options=opts)
        async with s:
            rows = []
            async for row in s:
                if not rows:
                    first = s.statistics()
                rows.append(row)
        stats = hub.stats()
    assert counting.resolvers is not None
    assert counting.resolvers == 1
    assert first.prefetch_window <= 3  # one unit delivered, or two (the channel holds one)
    assert [r["id"] for r in rows] == [r["id"] for r in expected]
    assert rows == expected
    assert stats.by_bucket["resolvers"] == 40  # each file once: the ramp re-reads nothing
    assert stats.by_bucket.get("api", 0) == 0  # the manifest was given
    end = s.statistics()
    assert end.prefetch_window == opts.prefetch_count == 8
    assert end.max_prefetched <= 8


async def test_a_dataloader_workers_stream_ramps_once_it_delivered_one_file_per_worker(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In one of 6 DataLoader workers, a stream holds one file at a time until it has
    delivered 6 (the workers together hold 6 ahead): its first rows cost one resolver
    request per file read, none planned ahead, then it ramps to prefetch_count and
    reads every row once."""
    import aiostream_hf._engine

    monkeypatch.setattr(aiostream_hf._engine, "loader_workers", lambda: 6)
    expected = _many_files(root, 40, rows=10, row_group_size=10)
    with HubServer(root, faults=Faults(latency_ms=5)) as hub:
        opts = _options(tmp_path)
        manifest = await _resolved_many(hub, opts)
        counting = _CountsAtDecode(hub, pause=0.1, decodes=4)
        s = ash.stream(manifest, format=counting, options=opts)
        windows = []
        async with s:
            rows = []
            async for row in s:
                rows.append(row)
                windows.append(s.statistics().prefetch_window)
        stats = hub.stats()
    # At a row of file k (from 1), k or k+1 files were delivered (the channel holds one).
    assert set(windows[: 4 * 10]) == {1}
    # As file k is decoded, the files 1..k are planned: the next only once it is delivered.
    assert counting.counts == [1, 2, 3, 4]
    assert windows[-1] == opts.prefetch_count == 8
    assert rows == expected
    assert stats.by_bucket["resolvers"] == 40


@pytest.mark.parametrize(("block_size", "ahead"), [(8 << 20, None), (1, 2)])
async def test_small_row_groups_load_together_or_run_more_ahead(
    root: Path, tmp_path: Path, block_size: int, ahead: int | None
) -> None:
    """Row groups far smaller than ``block_size`` load together once a unit is measured:
    their bytes in one request, their decodes in one hand-off. Units of a block or more
    load one by one, counted against ``prefetch_count``."""
    files: dict[str, Path] = {}
    expected = []
    for i in range(2):
        data = tmp_path / f"small-{i}.parquet"
        make_text_parquet(data, rows=600, row_group_size=10, min_text=5, max_text=10, seed=i)
        files[f"data/train-0000{i}-of-00002.parquet"] = data
        expected += pq.read_table(data).to_pylist()
    make_repo(root, "org/small", files)
    opts = _options(tmp_path, prefetch_count=2, block_size=block_size)
    with HubServer(root, faults=Faults(latency_ms=5)) as hub:
        s = ash.stream("hf://datasets/org/small", endpoint=hub.endpoint, options=opts)
        async with s:
            it = aiter(s)
            rows = [await anext(it)]
            for _ in range(3000 if ahead else 0):  # until the readahead is full (30 s)
                if s.statistics().max_prefetched >= ahead:
                    break
                await anyio.sleep(0.01)
            rows += [row async for row in it]
        served = hub.stats()
    assert rows == expected
    stats = s.statistics()
    assert stats.units == 120
    if ahead is None:
        # The first file: its tail read (the footer and the last row groups) and its
        # head, read beside it, hold every row group. The second, planned once a unit
        # was measured: its tail, then the rest of its row groups in one read.
        assert served.by_bucket["cdn"] == 4
    else:
        assert stats.max_prefetched == ahead  # full, and never more


async def test_a_ramped_stream_reads_units_of_many_files_once_under_faults(
    root: Path, tmp_path: Path
) -> None:
    """Files of several row groups, with 503s and cut bodies: every row exactly once."""
    expected = _many_files(root, 12, rows=30, row_group_size=10)
    faults = Faults(error_every=7, cut_every=5, latency_ms=2)
    with HubServer(root, faults=faults) as hub:
        s = ash.stream("hf://datasets/org/many", endpoint=hub.endpoint, options=_options(tmp_path))
        rows = await _collect(s)
    assert rows == expected
    assert s.statistics().prefetch_window == 8


async def test_columns_filter_batches_shuffle_and_ranks(root: Path, tmp_path: Path) -> None:
    repo = make_repo(root, "org/ops", {})
    tables = [
        make_text_parquet(
            repo / f"train-{i}.parquet",
            rows=200,
            row_group_size=20,
            start_id=i * 200,
            seed=i,
            min_text=5,
            max_text=10,
        )
        for i in range(3)
    ]
    full = pa.concat_tables(tables)
    with HubServer(root) as hub:
        kw: dict[str, Any] = dict(endpoint=hub.endpoint, options=_options(tmp_path))
        src = "hf://datasets/org/ops"
        flt = pc.field("id") >= 450
        got = await _collect(ash.stream(src, filter=flt, columns=["id"], **kw))
        assert got == [{"id": i} for i in range(450, 600)]
        batches = await _collect(ash.stream(src, batch_size=128, columns=["id", "score"], **kw))
        assert [len(b["id"]) for b in batches] == [128] * 4 + [88]
        assert sum((b["id"] for b in batches), []) == list(range(600))
        a = await _collect(ash.stream(src, shuffle=50, seed=1, **kw))
        b = await _collect(ash.stream(src, shuffle=50, seed=1, **kw))
        c = await _collect(ash.stream(src, shuffle=50, seed=2, **kw))
        assert a == b != c
        assert sorted(r["id"] for r in a) == list(range(600))
        assert a != full.to_pylist()
        for world in (2, 5):  # 5 > 3 files: ranks split row groups instead
            shares = [
                [r["id"] for r in await _collect(ash.stream(src, rank=k, world_size=world, **kw))]
                for k in range(world)
            ]
            assert sorted(sum(shares, [])) == list(range(600))
            assert all(shares)


async def test_clear_errors_for_bad_input(root: Path, tmp_path: Path) -> None:
    make_repo_split_naming(root)
    make_repo(root, "org/private", {"data.parquet": b"x"})
    make_repo(root, "org/notparquet", {"data/train.parquet": b"this is not parquet" * 10})
    with HubServer(root, private={"org/private": ["tok"]}) as hub:
        kw: dict[str, Any] = dict(endpoint=hub.endpoint, options=_options(tmp_path))
        with pytest.raises(ash.RepoNotFoundError, match="org/missing"):
            await _collect(ash.stream("hf://datasets/org/missing", **kw))
        with pytest.raises(ash.RevisionNotFoundError, match="nope"):
            await _collect(ash.stream("hf://datasets/org/split-naming@nope", **kw))
        with pytest.raises(ash.SplitNotFoundError, match="tain.*test, train"):
            await _collect(ash.stream("hf://datasets/org/split-naming", split="tain", **kw))
        with pytest.raises(ash.ConfigNotFoundError, match="klingon"):
            await _collect(ash.stream("hf://datasets/org/split-naming", config="klingon", **kw))
        with pytest.raises(ash.RepoNotFoundError, match="org/private"):
            await _collect(ash.stream("hf://datasets/org/private", **kw))
        with pytest.raises(ash.DecodeError, match="data/train.parquet"):
            await _collect(ash.stream("hf://datasets/org/notparquet", **kw))
        with pytest.raises(ash.SourceError, match="gs://"):
            ash.stream("gs://bucket/x.parquet")
        with pytest.raises(ash.SourceError, match="batch_size"):
            ash.stream("hf://datasets/org/split-naming", batch_size=0)
        hub.set_faults(error_every=1, targets=("cdn",))
        opts = _options(tmp_path, max_retries=2)
        with pytest.raises(ash.RetriesExhaustedError, match="503.*3 attempts|3 attempts.*503"):
            await _collect(
                ash.stream("hf://datasets/org/split-naming", endpoint=hub.endpoint, options=opts)
            )


def _ids(rows: Sequence[dict[str, Any]]) -> list[int]:
    return [r["id"] for r in rows]


async def test_local_files_and_statistics(tmp_path: Path) -> None:
    path = tmp_path / "local.parquet"
    table = make_text_parquet(path, rows=100, row_group_size=10, min_text=5, max_text=10)
    s = ash.stream(os.fspath(path), options=_options(tmp_path))
    rows = await _collect(s)
    stats = s.statistics()
    assert _ids(rows) == _ids(table.to_pylist())
    assert stats.samples == 100
    assert stats.units == 10
    assert stats.time_to_first_sample is not None
    with pytest.raises(ash.ClosedResourceError):
        async for _ in s:
            pass


async def test_plain_http_urls_with_brace_expansion(root: Path, tmp_path: Path) -> None:
    repo = make_repo(root, "org/http", {})
    tables = [
        make_text_parquet(
            repo / f"part-{i}.parquet", rows=30, start_id=i * 30, seed=i, min_text=5, max_text=10
        )
        for i in range(3)
    ]
    with HubServer(root) as hub:
        url = hub.url("org/http", "part-{0..2}.parquet").replace("%7B", "{").replace("%7D", "}")
        rows = await _collect(ash.stream(url, options=_options(tmp_path)))
        stats = hub.stats()
    assert rows == pa.concat_tables(tables).to_pylist()
    assert stats.by_bucket.get("api", 0) == 0  # plain URLs need no Hub API


def test_sync_iteration_and_break(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "local.parquet"
    table = make_text_parquet(path, rows=500, row_group_size=50, min_text=5, max_text=10)
    s = ash.stream(os.fspath(path), options=_options(tmp_path))
    assert [r["id"] for r in s] == [r["id"] for r in table.to_pylist()]

    def ours() -> int:  # anyio's idle worker threads come and go on their own
        return sum(not t.name.startswith("AnyIO worker") for t in threading.enumerate())

    threads = ours()
    with ash.stream(os.fspath(path), options=_options(tmp_path), batch_size=10) as s2:
        for i, batch in enumerate(s2):
            assert len(batch["id"]) == 10
            if i == 2:
                break
    assert ours() == threads
    with pytest.raises(ash.ClosedResourceError):
        iter(s2)


@pytest.mark.parametrize("output", ["python", "arrow"])
async def test_readahead_budget_counts_decoded_rows(tmp_path: Path, output: str) -> None:
    # Repetitive text compresses ~100x: a budget that counted fetched bytes
    # only would hold every row group decoded at once. The readahead holds
    # decoded tables within prefetch_bytes (one unit may overshoot it).
    path = tmp_path / "squeezed.parquet"
    n, group = 4_000, 200
    table = pa.table({"id": range(n), "text": ["abcdefgh" * 512] * n})  # 4 KiB per row
    pq.write_table(table, path, row_group_size=group, compression="zstd")
    decoded_group = group * 4096
    compressed = path.stat().st_size
    assert compressed * 20 < n * 4096
    budget = 3 * decoded_group
    s = ash.stream(
        os.fspath(path),
        output=output,  # type: ignore[arg-type]
        options=_options(tmp_path, prefetch_bytes=budget, prefetch_count=64),
    )
    got = 0
    async with s:
        async for item in s:
            got += item.num_rows if output == "arrow" else 1
    stats = s.statistics()
    assert got == n
    assert decoded_group <= stats.max_prefetched_bytes <= budget + 2 * decoded_group
    assert stats.max_prefetched < n // group


@pytest.mark.parametrize("source", ["hub", "url"])
async def test_a_file_replaced_mid_stream_gives_an_error_never_wrong_rows(
    root: Path, tmp_path: Path, source: str
) -> None:
    """The server serves other bytes after the footer read, and its CDN ignores If-Match:
    the rows decoded before the change are right, then FileChangedError names the file."""
    repo = make_repo(root, "org/changing", {})
    path = "data/train-00000-of-00001.parquet"
    table = make_text_parquet(repo / path, rows=400, row_group_size=50)
    faults = Faults(replace_after=1, replace_path=path, ignore_if_match=("cdn", "resolvers"))
    rows: list[dict[str, Any]] = []
    with HubServer(root, faults=faults) as hub:
        src = (
            "hf://datasets/org/changing"
            if source == "hub"
            else f"{hub.endpoint}/datasets/org/changing/resolve/main/{path}"
        )
        s = ash.stream(src, endpoint=hub.endpoint, options=_options(tmp_path, max_retries=1))
        with pytest.raises(ash.FileChangedError, match="train-00000-of-00001.parquet"):
            async with s:
                async for row in s:
                    rows.append(row)
    assert rows == table.to_pylist()[: len(rows)]


class _WatchedDecoder(Decoder[Unit]):
    """Four units of 16 bytes each; records when each unit's fetch begins and when each
    decode begins and ends. Unit 0's decode waits (at most 30 s) for unit 1's fetch."""

    name = "watched"
    extensions = (".watched",)

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.second_fetched = threading.Event()

    def _note(self, what: str, index: int) -> None:
        with self.lock:
            self.events.append((what, index))

    async def plan(self, file: FileRef, source: ByteSource, request: ReadRequest) -> list[Unit]:
        return [Unit(file, i, cost=16, num_rows=1) for i in range(4)]

    async def fetch(self, unit: Unit, source: ByteSource) -> Any:
        self._note("fetch", unit.index)
        if unit.index == 1:
            self.second_fetched.set()
        start = unit.index * 16
        return await source.read(unit.file, start, start + 16)

    def decode(self, unit: Unit, fetched: Any, request: ReadRequest) -> pa.Table:
        self._note("decode", unit.index)
        if unit.index == 0:
            self.second_fetched.wait(30)
        self._note("decoded", unit.index)
        return pa.table({"unit": [unit.index], "bytes": [bytes(fetched)]})


async def test_the_next_unit_fetches_while_the_first_decodes(tmp_path: Path) -> None:
    """A start waits on the network: the second unit's fetch begins before the first unit
    is decoded. No more start on a guess: the third waits for a unit to be measured."""
    path = tmp_path / "four.watched"
    path.write_bytes(bytes(range(64)))
    decoder = _WatchedDecoder()
    s = ash.stream(os.fspath(path), format=decoder, options=_options(tmp_path))
    async with s:
        rows = [row async for row in s]
    assert [row["unit"] for row in rows] == [0, 1, 2, 3]
    assert [row["bytes"] for row in rows] == [bytes(range(i * 16, i * 16 + 16)) for i in range(4)]
    events = decoder.events
    assert events.index(("fetch", 1)) < events.index(("decoded", 0))
    # The third unit starts once a unit is measured (the first, or the second if its
    # decode ended first), never on a guess.
    measured = min(events.index(("decoded", 0)), events.index(("decoded", 1)))
    assert measured < events.index(("fetch", 2))


async def test_a_corrupt_row_group_in_a_run_loaded_together_comes_after_the_rows_before_it(
    root: Path, tmp_path: Path
) -> None:
    # Tiny row groups load together once one is measured; when one of a run fails to
    # decode, the rows of the row groups before it are delivered, then its error.
    path = tmp_path / "runs.parquet"
    table = make_text_parquet(path, rows=300, row_group_size=10, min_text=200, max_text=400)
    meta = pq.ParquetFile(path).metadata
    bad = 20
    chunk = meta.row_group(bad).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    make_repo(root, "org/runs", {"data/train.parquet": bytes(data)})
    rows: list[dict[str, Any]] = []
    with HubServer(root) as hub:
        s = ash.stream("hf://datasets/org/runs", endpoint=hub.endpoint, options=_options(tmp_path))
        with pytest.raises(ash.DecodeError, match=f"row group {bad} of"):
            async with s:
                async for row in s:
                    rows.append(row)
        served = hub.stats()
    assert rows == table.slice(0, bad * 10).to_pylist()
    assert served.by_bucket["cdn"] < bad  # the row groups before it came in runs


async def test_a_rank_keeping_some_units_of_each_file_ramps_up_from_one_file(
    root: Path, tmp_path: Path
) -> None:
    """With fewer files than ranks, every rank plans every file and keeps every
    world_size-th unit: rank 1 of 4 keeps the second row group of each file, never its
    last. That unit still ends the file for this rank, so the readahead does not take
    the next file's unit (and with it the next file's plan) early: before the first row
    the stream has planned the file it reads only, as with whole files."""
    expected = _many_files(root, 3, rows=40, row_group_size=10)
    with HubServer(root, faults=Faults(latency_ms=5)) as hub:
        opts = _options(tmp_path)
        manifest = await _resolved_many(hub, opts)
        counting = _CountsAtDecode(hub, pause=0.3)
        s = ash.stream(manifest, format=counting, options=opts, rank=1, world_size=4)
        async with s:
            rows = [row async for row in s]
        stats = hub.stats()
    assert counting.resolvers is not None
    assert counting.resolvers == 1  # the file it reads; the next once a unit is delivered
    # The second row group (rows 10-19) of each file, in file order, each once.
    mine = [r for i, r in enumerate(expected) if (i % 40) // 10 == 1]
    assert rows == mine
    assert stats.by_bucket["resolvers"] == 3


def test_the_least_a_row_group_decodes_to_counts_its_flat_fixed_widths(tmp_path: Path) -> None:
    from aiostream_hf.formats.parquet import parse_footer, plan_row_groups

    table = pa.table(
        {
            "i": pa.array([1, 2, 3], pa.int64()),
            "f": pa.array([1.0, 2.0, 3.0], pa.float32()),
            "s": pa.array(["a", "bb", ""]),
            "l": pa.array([[1], [], [2, 3]], pa.list_(pa.int32())),  # may be empty: 0
            "b": pa.array([True, False, True]),  # bits: 0
            "k": pa.array([b"x" * 16] * 3, pa.binary(16)),
        }
    )
    path = tmp_path / "widths.parquet"
    pq.write_table(table, path)
    data = path.read_bytes()
    footer = parse_footer(data, len(data), path.name)
    (plan,) = plan_row_groups(footer)
    assert plan.least_decoded == 3 * (8 + 4 + 4 + 16)
    (only_i,) = plan_row_groups(footer, ["i"])
    assert only_i.least_decoded == 3 * 8


async def test_a_row_group_that_decodes_past_the_budget_is_refused_before_decoding(
    tmp_path: Path,
) -> None:
    """Four million equal int32 values: a file of a few KB (RLE) whose one row group
    decodes to 16 MiB. Over prefetch_bytes it is refused at its plan, naming the way
    out (before, a 170-byte file of this kind took 4.5 GB with prefetch_bytes of 16 MiB);
    within it, it is read."""
    rows = 1 << 22
    path = tmp_path / "constant.parquet"
    pq.write_table(pa.table({"x": pa.array(np.zeros(rows, np.int32))}), path, row_group_size=rows)
    assert path.stat().st_size < 64 << 10
    small = _options(tmp_path, prefetch_bytes=8 << 20)
    with pytest.raises(ash.DecodeError, match=r"raise prefetch_bytes to at least 16,777,216"):
        await _collect(ash.stream(str(path), options=small, output="arrow"))
    big = _options(tmp_path, prefetch_bytes=64 << 20)
    tables = await _collect(ash.stream(str(path), options=big, output="arrow"))
    assert sum(t.num_rows for t in tables) == rows


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_page_headers_give_the_values_of_a_list_chunk(tmp_path: Path, version: str) -> None:
    """The data pages' headers add up to the chunk's values (levels: an empty list is
    one), as the footer counts them, over many pages of either data page version."""
    from aiostream_hf.formats._thrift import chunk_values
    from aiostream_hf.formats.parquet import _chunk_range, parse_footer

    rows = [[1, 2, 3], [], [4], None] * 5000
    path = tmp_path / "lists.parquet"
    pq.write_table(
        pa.table({"l": pa.array(rows, pa.list_(pa.int32())), "s": ["x"] * len(rows)}),
        path,
        data_page_version=version,
        data_page_size=4096,  # many pages
    )
    data = path.read_bytes()
    footer = parse_footer(data, len(data), path.name)
    chunk = footer.metadata.row_group(0).column(0)
    start, _ = _chunk_range(footer, 0, chunk, 0)
    end = start + chunk.total_compressed_size
    read = lambda offset, n: data[offset : offset + n]  # noqa: E731
    assert chunk_values(read, start, end, path.name) == chunk.num_values == 6 * 5000
    assert chunk_values(lambda offset, n: b"\xff" * n, start, end, path.name) == 0  # garbage


async def test_a_list_row_group_whose_pages_announce_too_many_values_is_refused(
    tmp_path: Path,
) -> None:
    """One row holding four million int32 values: the footer's row count (1) bounds
    nothing, the page headers say 16 MiB. Over prefetch_bytes it is refused before it is
    decoded (a 148-byte file of this kind took 2.9 GB); within it, it is read."""
    values = 1 << 22
    path = tmp_path / "one-long-list.parquet"
    column = pa.ListArray.from_arrays([0, values], pa.array(np.zeros(values, np.int32)))
    pq.write_table(pa.table({"l": column}), path)
    assert path.stat().st_size < 256 << 10
    small = _options(tmp_path, prefetch_bytes=8 << 20)
    with pytest.raises(ash.DecodeError, match=r"list columns' pages announce"):
        await _collect(ash.stream(str(path), options=small, output="arrow"))
    big = _options(tmp_path, prefetch_bytes=64 << 20)
    tables = await _collect(ash.stream(str(path), options=big, output="arrow"))
    assert sum(len(pc.list_flatten(t.column("l"))) for t in tables) == values


def test_the_row_groups_of_a_footer_are_counted_from_its_thrift(tmp_path: Path) -> None:
    from aiostream_hf.formats._thrift import row_group_count

    for columns, groups in [(1, 1), (3, 17), (200, 40)]:
        table = pa.table({f"c{i}": list(range(groups)) for i in range(columns)})
        path = tmp_path / f"{columns}x{groups}.parquet"
        pq.write_table(table, path, row_group_size=1)
        data = path.read_bytes()
        length = int.from_bytes(data[-8:-4], "little")
        assert row_group_count(data[-8 - length : -8], path.name) == groups
    assert row_group_count(b"\xff" * 64, "garbage") is None


async def test_a_footer_of_too_many_row_groups_is_refused_before_it_is_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted from the footer's Thrift before pyarrow parses it (a 31 MB footer of a
    million row groups took 1 GB to parse and 1.3 GB more to plan); the limit is
    lowered here under a five-row-group file."""
    import aiostream_hf.formats.parquet as parquet_module

    monkeypatch.setattr(parquet_module, "MAX_ROW_GROUPS", 4)
    path = tmp_path / "five.parquet"
    pq.write_table(pa.table({"x": list(range(5))}), path, row_group_size=1)
    with pytest.raises(ash.DecodeError, match=r"lists 5 row groups, over MAX_ROW_GROUPS=4"):
        await _collect(ash.stream(str(path), options=_options(tmp_path)))
    monkeypatch.setattr(parquet_module, "MAX_ROW_GROUPS", 5)
    assert len(await _collect(ash.stream(str(path), options=_options(tmp_path)))) == 5


PARQUET_TESTING = Path(__file__).parent / "data" / "parquet-testing"


async def test_a_file_whose_footer_miscounts_its_rows_streams_as_pyarrow_reads_it(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """parquet-testing's repeated_no_annotation.parquet: its footer says 0 rows, its row
    group holds 6. Read from a local file and from the Hub, as pyarrow's read_table."""
    fixture = PARQUET_TESTING / "repeated_no_annotation.parquet"
    expected = pq.read_table(fixture)
    assert expected.num_rows == 6
    repo = make_repo(root, "org/miscounted", {"README.md": "# miscounted\n"})
    (repo / "data").mkdir()
    (repo / "data" / fixture.name).write_bytes(fixture.read_bytes())
    with caplog.at_level("WARNING", logger="aiostream_hf"), HubServer(root) as hub:
        local = ash.stream(str(fixture), options=_options(tmp_path), output="arrow")
        assert pa.Table.from_batches(await _collect(local)).equals(expected)
        source = f"hf://datasets/org/miscounted/data/{fixture.name}"
        remote = ash.stream(source, endpoint=hub.endpoint, options=_options(tmp_path))
        assert await _collect(remote) == expected.to_pylist()
    warned = [r.getMessage() for r in caplog.records if "its footer says 0 rows" in r.getMessage()]
    assert len(warned) == 2, warned


async def test_the_stream_decodes_a_large_row_groups_columns_on_its_decode_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's decode pool (aiostream_hf._decode_pool), not formats/, runs a row
    group's column groups side by side."""
    import aiostream_hf.formats.parquet as parquet_module

    monkeypatch.setattr(parquet_module, "_PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(parquet_module, "usable_cpus", lambda: 2)
    path = tmp_path / "wide.parquet"
    table = pa.table({"a": list(range(1000)), "b": [f"b{i}" for i in range(1000)]})
    pq.write_table(table, path, row_group_size=1000)
    threads: list[str] = []
    iter_batches = pq.ParquetFile.iter_batches

    def spy(self: pq.ParquetFile, batch_size: int, **kw: Any) -> Any:
        threads.append(threading.current_thread().name)
        return iter_batches(self, batch_size, **kw)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    s = ash.stream(str(path), options=_options(tmp_path), output="arrow")
    assert pa.Table.from_batches(await _collect(s)).equals(pq.read_table(path))
    assert len(threads) == 2
    assert all(name.startswith("aiostream-parquet") for name in threads), threads
