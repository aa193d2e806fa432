"""The machine-wide byte cache (``_byte_cache``, ``StreamOptions(byte_cache_bytes=)``).

Epochs through it against the local Hub server, whose byte counts say what was fetched;
eviction, a damaged block, a full disk and a writer killed mid-write; and eight
processes reading the same files at once, each block fetched once."""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import aiostream_hf as ash
from aiostream_hf import _fetcher
from aiostream_hf._byte_cache import ByteCache
from aiostream_hf._fetcher import RangeFetcher
from aiostream_hf._models import FileRef
from aiostream_hf._resolver import Resolver
from aiostream_hf.testing import (
    HubServer,
    make_lerobot_dataset,
    make_repo,
    make_text_parquet,
    make_webdataset_shards,
)

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent
TOKEN = "hf_cachetesttoken"
BLOCK = 1024 * 1024


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    text = make_repo(root, "org/text", {})
    for i in range(2):
        make_text_parquet(
            text / "data" / f"train-{i}.parquet", rows=800, row_group_size=100, seed=i
        )
    make_webdataset_shards(make_repo(root, "org/shards", {}), shards=2, samples_per_shard=30)
    make_lerobot_dataset(root, "org/robot", episodes=[10, 12], width=64, height=48, codec="h264")
    # one file of several blocks (random bytes: the fetcher reads it, no decoder)
    make_repo(root, "org/big", {"big.tar": random.Random(3).randbytes(3 * BLOCK + 12_345)})
    private = make_repo(root, "org/private", {})
    make_text_parquet(private / "data" / "train.parquet", rows=200, row_group_size=100)
    return root


@pytest.fixture(scope="module")
def hub(root: Path) -> Iterator[HubServer]:
    # every file through the CDN: its bytes are counted there
    with HubServer(root, lfs_threshold=0, private={"org/private": [TOKEN]}) as server:
        yield server


def _files_size(root: Path, repo: str) -> int:
    folder = root / "datasets" / repo
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _options(tmp_path: Path, **kw: Any) -> ash.StreamOptions:
    return ash.StreamOptions(cache_dir=tmp_path / "cache", byte_cache_bytes=1 << 30, **kw)


async def _rows(source: str, hub: HubServer, options: ash.StreamOptions, **kw: Any) -> Any:
    async with ash.stream(source, endpoint=hub.endpoint, options=options, **kw) as s:
        rows = [row async for row in s]
    return rows, s.statistics()


def _served(hub: HubServer) -> tuple[int, int]:
    stats = hub.wait_idle()  # a response's last MiB is counted once it was sent
    return stats.by_bucket.get("cdn", 0), stats.bytes_served


@pytest.mark.parametrize(("repo", "kw"), [("org/text", {}), ("org/shards", {"split": "train"})])
async def test_the_second_epoch_fetches_nothing(
    hub: HubServer, root: Path, tmp_path: Path, repo: str, kw: dict[str, Any]
) -> None:
    options = _options(tmp_path)
    plain, _ = await _rows(f"hf://datasets/{repo}", hub, ash.StreamOptions(cache_dir=tmp_path))
    cdn, served = _served(hub)
    first, stats = await _rows(f"hf://datasets/{repo}", hub, options, **kw)
    cdn_1, served_1 = _served(hub)
    second, stats_2 = await _rows(f"hf://datasets/{repo}", hub, options, **kw)
    cdn_2, served_2 = _served(hub)
    assert first == second == plain
    # each byte at most once (the rest: the API's answers, as the cache folder is new)
    assert served_1 - served <= _files_size(root, repo) + 16_384
    assert stats.fetcher["byte_cache"]["misses"] > 0
    assert (cdn_2 - cdn_1, served_2 - served_1) == (0, 0)  # the second epoch: nothing
    assert stats_2.fetcher["byte_cache"]["misses"] == 0
    assert stats_2.fetcher["bytes_received"] == 0
    assert stats_2.requests["cdn"] == 0


async def test_a_lerobot_epoch_through_the_cache(hub: HubServer, tmp_path: Path) -> None:
    """Its data, metadata and videos: every file carries its version from the listing."""
    options = _options(tmp_path)

    async def items() -> list[Any]:
        async with ash.lerobot.stream(
            "hf://datasets/org/robot", endpoint=hub.endpoint, options=options
        ) as s:
            return [
                (int(item["index"]), int(item["observation.images.top"].sum())) async for item in s
            ]

    first = await items()
    assert len(first) == 22
    cdn, served = _served(hub)
    assert await items() == first
    assert _served(hub)[0] == cdn  # no request for any byte
    assert _served(hub)[1] - served < 16_384  # the API's answers only


async def test_blocks_are_kept_per_token_and_private_to_the_user(
    hub: HubServer, tmp_path: Path
) -> None:
    options = _options(tmp_path)
    source = "hf://datasets/org/private"
    rows, _ = await _rows(source, hub, options, token=TOKEN)
    cdn, _ = _served(hub)
    with pytest.raises(ash.RepoNotFoundError):  # without the token: not even listed
        await _rows(source, hub, options)
    again, stats = await _rows(source, hub, options, token=TOKEN)
    assert again == rows
    assert _served(hub)[0] == cdn
    folder = options.resolved_byte_cache_dir()
    blocks = list((folder / "blocks").rglob("*.blk"))
    assert blocks
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in blocks)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    # the same file's blocks under another token are other blocks: nothing is shared
    cache = ByteCache(folder, 1 << 30)
    file = FileRef("u", "data/train.parquet", size=10, etag="e")
    assert cache._key(file, "scope-a", 0) != cache._key(file, "scope-b", 0)


async def test_eviction_keeps_the_cache_under_its_limit(
    hub: HubServer, root: Path, tmp_path: Path
) -> None:
    limit = 2 * BLOCK
    options = ash.StreamOptions(cache_dir=tmp_path / "cache", byte_cache_bytes=limit)
    assert _files_size(root, "org/text") > 2 * limit
    rows, stats = await _rows("hf://datasets/org/text", hub, options)
    again, _ = await _rows("hf://datasets/org/text", hub, options)
    assert rows == again
    cache = stats.fetcher["byte_cache"]
    assert cache["evicted"] > 0
    held = sum(p.stat().st_size for p in options.resolved_byte_cache_dir().rglob("*.blk"))
    assert held <= limit


def test_eviction_skips_a_file_gone_before_its_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that goes between the folder's listing and its stat (a writer's temporary
    file renamed, another process's eviction) is skipped: the blocks beside it are still
    counted and evicted, and the listing is closed (it was left to the collector, an
    "unclosed scandir iterator" warning)."""
    import aiostream_hf._byte_cache as bc

    cache = ByteCache(tmp_path / "cache", 4 * BLOCK)
    cache._prepare()
    for i in range(8):
        cache._store(cache._path(f"{i:02d}" + "0" * 62), bytes(BLOCK))
    listed = os.scandir

    class Gone:
        name = "gone.blk"
        path = "/nonexistent/gone.blk"

        def stat(self, follow_symlinks: bool = True) -> os.stat_result:
            raise FileNotFoundError(self.path)

    class Listing:
        def __init__(self, path: Any) -> None:
            self._it = listed(path)

        def __enter__(self) -> Any:
            return iter([Gone(), *self._it])

        def __exit__(self, *exc: object) -> None:
            self._it.close()

        def __iter__(self) -> Any:  # the old code iterated it without `with`
            return iter([Gone(), *self._it])

    monkeypatch.setattr(bc.os, "scandir", Listing)  # os's own: pathlib's globs use it
    cache.evict()
    monkeypatch.undo()
    held = sum(p.stat().st_size for p in (tmp_path / "cache").rglob("*.blk"))
    assert cache.statistics().evicted > 0
    assert held <= 4 * BLOCK


async def test_a_damaged_block_is_fetched_again(hub: HubServer, tmp_path: Path) -> None:
    options = _options(tmp_path)
    rows, _ = await _rows("hf://datasets/org/text", hub, options)
    blocks = sorted(options.resolved_byte_cache_dir().rglob("*.blk"))
    damaged = blocks[len(blocks) // 2]
    data = bytearray(damaged.read_bytes())
    data[-10] ^= 0xFF
    damaged.write_bytes(bytes(data))
    truncated = blocks[0]
    truncated.write_bytes(truncated.read_bytes()[:100])
    cdn, _ = _served(hub)
    again, stats = await _rows("hf://datasets/org/text", hub, options)
    assert again == rows
    cache = stats.fetcher["byte_cache"]
    assert (cache["corrupt"], cache["misses"]) == (2, 2)
    assert _served(hub)[0] > cdn


async def test_a_full_disk_reads_on_without_keeping(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    def full(f: Any, data: bytes) -> None:
        f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ByteCache, "_write", staticmethod(full))
    options = _options(tmp_path)
    plain, _ = await _rows("hf://datasets/org/text", hub, ash.StreamOptions(cache_dir=tmp_path))
    with caplog.at_level(logging.WARNING, logger="aiostream_hf"):
        rows, stats = await _rows("hf://datasets/org/text", hub, options)
    assert rows == plain
    assert stats.fetcher["byte_cache"]["write_failures"] > 0
    warned = [r for r in caplog.records if "byte cache" in r.getMessage()]
    assert len(warned) == 1
    assert "the disk is full" in warned[0].getMessage()
    assert not list(options.resolved_byte_cache_dir().rglob("*.blk"))
    assert not list(options.resolved_byte_cache_dir().rglob("*.tmp"))  # nothing left


def test_a_writer_killed_mid_write_leaves_nothing_wrong(hub: HubServer, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "byte_cache_script.py"), "stall", hub.endpoint, str(cache_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "writing"  # half a block is on disk
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()
    folder = cache_dir / "bytes"
    (tmp,) = list(folder.rglob("*.tmp"))
    assert not list(folder.rglob("*.blk"))  # the block it was writing is not visible
    options = ash.StreamOptions(cache_dir=cache_dir, byte_cache_bytes=1 << 30)
    plain = ash.StreamOptions(cache_dir=tmp_path / "plain")
    result = subprocess.run(
        [sys.executable, str(HERE / "byte_cache_script.py"), "read", hub.endpoint, str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    read = json.loads(result.stdout)
    import anyio

    expected, _ = anyio.run(_rows, "hf://datasets/org/text", hub, plain)
    assert read["ids"] == [row["id"] for row in expected]
    assert read["corrupt"] == 0
    # the killed writer's temporary file goes at the next eviction pass once stale
    old = time.time() - 3600
    os.utime(tmp, (old, old))
    ByteCache(folder, options.byte_cache_bytes).evict()
    assert not tmp.exists()


def test_eight_processes_fetch_each_block_once(hub: HubServer, root: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "byte_cache_script.py"),
                "read",
                hub.endpoint,
                str(cache_dir),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    outs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0
        outs.append(json.loads(out))
    assert all(o["ids"] == outs[0]["ids"] for o in outs)
    assert len(outs[0]["ids"]) == 1600
    blocks = len(list((cache_dir / "bytes" / "blocks").rglob("*.blk")))
    assert sum(o["misses"] for o in outs) == blocks  # each block fetched by one process
    assert sum(o["bytes_written"] for o in outs) <= _files_size(root, "org/text")


@pytest.mark.parametrize("at_once", [16 * BLOCK, 2 * BLOCK])
async def test_a_sequential_read_gets_chunks_of_block_size_as_from_local_disk(
    hub: HubServer, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: int
) -> None:
    """A sequential reader (a TAR shard's parser) is given ``block_size`` bytes a chunk
    from the cache, as from a local file, not a chunk per cache block: each chunk is a
    hand-off to the parser's thread and on to the stream, and a chunk per 1 MiB block
    made a TAR epoch from the cache 0.8x local disk. Fetched (epoch 1) and from disk
    (epoch 2) alike, from the start and from a byte mid-block; a span longer than
    ``_CACHED_SPAN_AT_ONCE`` (2 MiB here) is taken a chunk at a time."""
    monkeypatch.setattr(_fetcher, "_CACHED_SPAN_AT_ONCE", at_once)
    chunk = 3 * BLOCK // 2
    options = _options(tmp_path, block_size=chunk)
    data = (root / "datasets" / "org" / "big" / "big.tar").read_bytes()
    async with Resolver(options=options) as resolver:
        manifest = await resolver.resolve("hf://datasets/org/big", endpoint=hub.endpoint)
    (file,) = [f for f in manifest.files if f.path == "big.tar"]
    async with RangeFetcher(options, endpoint=hub.endpoint) as fetcher:
        served = []
        for start in (0, 0, 777_777):
            async with fetcher.iter_bytes(file, start) as blocks:
                chunks = [bytes(c) async for c in blocks]
            assert b"".join(chunks) == data[start:]
            rest = len(data) - start
            assert [len(c) for c in chunks] == [chunk] * (rest // chunk) + [rest % chunk]
            served.append(_served(hub))
        cached = fetcher.statistics().byte_cache
    assert cached["misses"] == 4  # each block fetched once, in epoch 1
    assert served[0] == served[1] == served[2]  # then nothing


# -- the cache's own arithmetic, on a fake fetch -------------------------------------------


async def test_spans_across_blocks_are_cut_and_joined_exactly(tmp_path: Path) -> None:
    data = random.Random(0).randbytes(10_000)
    file = FileRef("mem://f", "f", size=len(data), etag="v1")
    asked: list[list[tuple[int, int]]] = []

    async def fetch(ranges: list[tuple[int, int]]) -> Sequence[bytes]:
        asked.append(ranges)
        return [data[s:e] for s, e in ranges]

    cache = ByteCache(tmp_path, 1 << 20, block=1000)
    rng = random.Random(1)
    for _ in range(30):
        spans = []
        for _ in range(rng.randint(1, 4)):
            s = rng.randrange(0, len(data))
            spans.append((s, rng.randint(s, min(len(data), s + 3000))))
        assert await cache.read(file, "scope", spans, fetch, max_request=2500) == [
            data[s:e] for s, e in spans
        ]
    for ranges in asked:
        for s, e in ranges:
            assert s % 1000 == 0
            assert e - s <= 2500 or e - s == 1000  # whole blocks, at most max_request
    assert cache.statistics().misses == 10  # every block fetched once


@pytest.mark.parametrize(
    ("path", "block"), [("videos/ep.mp4", 1000), ("clips/a.WEBM", 1000), ("data/f.parquet", 4000)]
)
async def test_a_video_file_is_kept_in_its_own_smaller_blocks(
    tmp_path: Path, path: str, block: int
) -> None:
    """A video's reads are a GOP each here and there: its blocks are ``video_block``, so a
    cold read fetches little more than it needs; other files keep ``block``. Every
    process picks the same size for a file (by its suffix), so they share its blocks."""
    data = random.Random(2).randbytes(40_000)
    file = FileRef(f"mem://{path}", path, size=len(data), etag="v1")
    asked: list[tuple[int, int]] = []

    async def fetch(ranges: list[tuple[int, int]]) -> Sequence[bytes]:
        asked.extend(ranges)
        return [data[s:e] for s, e in ranges]

    cache = ByteCache(tmp_path, 1 << 20, block=4000, video_block=1000)
    assert cache.block_of(file) == block
    gop = (12_345, 14_567)
    assert await cache.read(file, "scope", [gop], fetch, max_request=1 << 20) == [
        data[12_345:14_567]
    ]
    assert asked == [(gop[0] // block * block, -(-gop[1] // block) * block)]
    asked.clear()
    again = ByteCache(tmp_path, 1 << 20, block=4000, video_block=1000)  # another process
    assert await again.read(file, "scope", [gop], fetch, max_request=1 << 20) == [
        data[12_345:14_567]
    ]
    assert asked == []  # its blocks, found under the same keys


async def test_a_read_cancelled_while_taking_its_locks_leaves_none_held(tmp_path: Path) -> None:
    """The locks are taken in a worker thread that a cancellation waits for: its answer
    is lost, so the locks it took must be released by the cancelled read itself."""
    import anyio
    import anyio.from_thread
    import filelock

    cache = ByteCache(tmp_path, 1 << 20, block=1000)
    file = FileRef("mem://f", "f", size=3000, etag="v1")
    taken = anyio.Event()
    original = cache._lock_all
    kept: list[list[filelock.FileLock]] = []  # alive: their finalizer would release them

    def lock_all(locks: list[filelock.FileLock]) -> bool:
        kept.append(locks)
        held = original(locks)
        anyio.from_thread.run_sync(taken.set)
        time.sleep(0.2)  # cancelled meanwhile: the thread ends, its answer is dropped
        return held

    cache._lock_all = lock_all  # type: ignore[method-assign]

    async def fetch(ranges: list[tuple[int, int]]) -> Sequence[bytes]:
        raise AssertionError("not reached: the read was cancelled before its fetch")

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def cancel_when_taken() -> None:
                await taken.wait()
                scope.cancel()

            tg.start_soon(cancel_when_taken)
            await cache.read(file, "s", [(0, 3000)], fetch, max_request=3000)
    assert scope.cancelled_caught
    for i in range(3):
        lock = filelock.FileLock(cache._path(cache._key(file, "s", i), "locks", ".lock"))
        lock.acquire(timeout=0)  # free: no lock was left held
        lock.release()
