"""A video's parsed index kept in the byte cache's store (``_video_index_cache``).

Against the local Hub server, whose counts say which requests a reader made: a warm open
(another client, another process) reads no index and resolves nothing, and sends its
frames' reads straight to the CDN; a damaged entry, another version of the file and
another token find nothing usable and read the index again; entries count under the
cache's limit. The frames are always those a reader without the cache returns."""

from __future__ import annotations

import json
import os
import stat
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import aiostream_hf as ash
from aiostream_hf import _mp4, video
from aiostream_hf._byte_cache import ByteCache
from aiostream_hf._models import FileRef
from aiostream_hf._video_index_cache import DamagedEntry, decode, encode
from aiostream_hf.testing import HubServer, make_repo, make_video

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent
TOKEN, OTHER_TOKEN = "hf_indextesttoken", "hf_indexothertoken"
URL = "hf://datasets/org/videos/clip.mp4"
TIMES = [0.5, 2.0]
NEW_TIMES = [6.2, 8.6]  # other frames, in other 1 MiB blocks (about 3 GOPs of 0.5 s each)


def _video(path: Path, seed: int = 0) -> None:
    # Lossless: over 1 MiB, so that opening it reads its index, not the whole file.
    make_video(
        path,
        frames=300,
        width=320,
        height=240,
        seed=seed,
        options={"g": "15", "qp": "0", "preset": "ultrafast"},
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    _video(make_repo(root, "org/videos", {}) / "clip.mp4")
    _video(make_repo(root, "org/private", {}) / "clip.mp4")
    assert (root / "datasets/org/videos/clip.mp4").stat().st_size > 2 * _mp4.TAIL_READ_SIZE
    return root


@pytest.fixture(scope="module")
def hub(root: Path) -> Iterator[HubServer]:
    with HubServer(root, private={"org/private": [TOKEN, OTHER_TOKEN]}) as server:
        yield server


def _options(tmp_path: Path, **kw: Any) -> ash.StreamOptions:
    kw.setdefault("byte_cache_bytes", 1 << 30)
    kw.setdefault("pin_ttl", 3600)
    return ash.StreamOptions(cache_dir=tmp_path / "cache", **kw)


async def _open(
    hub: HubServer, options: ash.StreamOptions, times: list[float], url: str = URL, **kw: Any
) -> tuple[np.ndarray[Any, Any], video.VideoStatistics, dict[str, int], dict[str, int]]:
    """The frames at ``times``, the reader's statistics, its byte cache's counts and the
    requests the server saw meanwhile, by bucket."""
    before = dict(hub.wait_idle().by_bucket)
    async with video.open(url, options=options, endpoint=hub.endpoint, **kw) as reader:
        frames = await reader.frames_at(times)
        fetched = reader._source.statistics()  # type: ignore[union-attr]
        cache = {**fetched.byte_cache, **{f"requests_{k}": v for k, v in fetched.requests.items()}}
        stats = reader.statistics()
    after = hub.wait_idle().by_bucket
    sent = {k: after.get(k, 0) - before.get(k, 0) for k in ("api", "resolvers", "cdn")}
    return frames.data, stats, cache, sent


async def _plain(hub: HubServer, tmp_path: Path, times: list[float], **kw: Any) -> Any:
    """The frames a reader without the byte cache returns (the oracle)."""
    options = ash.StreamOptions(cache_dir=tmp_path / "plain")
    frames, stats, _, _ = await _open(hub, options, times, **kw)
    assert not stats.index_cached
    return frames


def _entries(options: ash.StreamOptions) -> list[Path]:
    return sorted((options.resolved_byte_cache_dir() / "entries").rglob("*.ent"))


async def test_a_second_client_opens_without_reading_the_index(
    hub: HubServer, tmp_path: Path
) -> None:
    options = _options(tmp_path)
    frames, cold, cache, sent = await _open(hub, options, TIMES)
    assert np.array_equal(frames, await _plain(hub, tmp_path, TIMES))
    assert not cold.index_cached
    assert cold.index_requests >= 1
    assert cache["entries_written"] == 2  # the index and the CDN route
    # One request resolves the file: its /resolve/ URL's HEAD (commit, size, ETag and
    # the CDN URL it redirects to); the index is read from the CDN straight away.
    assert (sent["api"], sent["resolvers"]) == (0, 1)
    # Another client (its own fetcher, resolver and client), other frames: no request
    # but the frames' reads, each straight to the CDN.
    frames, warm, cache, sent = await _open(hub, options, NEW_TIMES)
    assert np.array_equal(frames, await _plain(hub, tmp_path, NEW_TIMES))
    assert warm.index_cached
    assert (warm.index_requests, warm.index_bytes) == (0, 0)
    assert cache["entry_hits"] == 2
    assert warm.frame_requests >= 1
    assert cache["misses"] >= 1  # the frames' bytes were not in the cache
    assert cache["requests_resolve"] == 0  # straight to the CDN URL kept
    reads = cache["requests_range"] + cache["requests_stream"]
    assert reads >= 1
    assert sent == {"api": 0, "resolvers": 0, "cdn": reads}


async def test_a_second_process_opens_without_reading_the_index(
    hub: HubServer, tmp_path: Path, anyio_backend: str
) -> None:
    """The same in another process, on this test's backend: the resolution from the
    resolver's cache on disk, the index and the route from the byte cache's."""
    options = _options(tmp_path)
    _, cold, _, _ = await _open(hub, options, TIMES)
    assert not cold.index_cached
    before = dict(hub.wait_idle().by_bucket)
    script = HERE / "video_index_cache_script.py"
    argv = [sys.executable, str(script), anyio_backend, hub.endpoint, str(options.cache_dir)]
    with anyio.fail_after(120):
        proc = await anyio.run_process([*argv, *map(str, NEW_TIMES)], check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    out = json.loads(proc.stdout)
    after = hub.wait_idle().by_bucket
    sent = {k: after.get(k, 0) - before.get(k, 0) for k in ("api", "resolvers", "cdn")}
    assert out["video"]["index_cached"]
    assert out["video"]["index_requests"] == 0
    assert out["byte_cache"]["entry_hits"] == 2
    assert sent["cdn"] >= 1
    assert sent == {"api": 0, "resolvers": 0, "cdn": out["requests"]}
    import hashlib

    oracle = await _plain(hub, tmp_path, NEW_TIMES)
    assert out["digest"] == hashlib.sha256(oracle.tobytes()).hexdigest()


@pytest.mark.parametrize("damage", ["flipped", "truncated", "stamped"])
async def test_a_damaged_entry_is_read_again(hub: HubServer, tmp_path: Path, damage: str) -> None:
    """A byte changed (CRC), a cut file (its length), and a well-formed entry of another
    format version: none is trusted; the index is read from the network again, the
    frames are right, and the entry is written anew."""
    options = _options(tmp_path)
    await _open(hub, options, TIMES)
    (index,) = [p for p in _entries(options) if p.stat().st_size > 1024]  # (the route: less)
    data = bytearray(index.read_bytes())
    if damage == "flipped":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncated":
        data = data[: len(data) // 3]
    if damage == "stamped":  # a valid entry (length, CRC) of a format not this one's
        payload = bytearray(data[24:])  # after the store's header
        struct.pack_into("<I", payload, 8, 99)  # the format version
        cache = ByteCache(options.resolved_byte_cache_dir(), 1 << 30)
        assert cache._write_entry(index, bytes(payload))
    else:
        index.write_bytes(bytes(data))
    frames, stats, cache_counts, sent = await _open(hub, options, NEW_TIMES)
    assert np.array_equal(frames, await _plain(hub, tmp_path, NEW_TIMES))
    assert not stats.index_cached
    assert stats.index_requests >= 1
    assert cache_counts["corrupt"] == 1
    assert cache_counts["entries_written"] >= 1  # kept again
    _, again, _, _ = await _open(hub, options, TIMES)
    assert again.index_cached


async def test_another_version_of_the_file_does_not_find_it(
    hub: HubServer, root: Path, tmp_path: Path
) -> None:
    """The file changed on the Hub (a new commit, another ETag): its entry is another."""
    repo = make_repo(root, "org/changing", {})
    _video(repo / "clip.mp4", seed=0)
    url = "hf://datasets/org/changing/clip.mp4"
    options = _options(tmp_path, pin_ttl=0)  # the branch pinned afresh at each open
    _, first, _, _ = await _open(hub, options, TIMES, url=url)
    _, again, _, _ = await _open(hub, options, TIMES, url=url)
    assert (first.index_cached, again.index_cached) == (False, True)
    _video(repo / "clip.mp4", seed=1)  # other pixels: another ETag
    frames, changed, _, _ = await _open(hub, options, TIMES, url=url)
    assert not changed.index_cached
    assert changed.index_requests >= 1
    assert np.array_equal(frames, await _plain(hub, tmp_path, TIMES, url=url))
    assert len([p for p in _entries(options) if p.stat().st_size > 1024]) == 2


async def test_entries_are_kept_per_token_and_private_to_the_user(
    hub: HubServer, tmp_path: Path
) -> None:
    options = _options(tmp_path)
    url = "hf://datasets/org/private/clip.mp4"
    _, first, _, _ = await _open(hub, options, TIMES, url=url, token=TOKEN)
    _, again, _, _ = await _open(hub, options, TIMES, url=url, token=TOKEN)
    assert (first.index_cached, again.index_cached) == (False, True)
    # Another token that may read the repo: the first token's entries are not its own.
    # (The same frames: their blocks, kept under the first token, are not its own either.)
    _, other, other_cache, _ = await _open(hub, options, TIMES, url=url, token=OTHER_TOKEN)
    assert not other.index_cached
    assert other.index_requests >= 1
    assert other_cache["misses"] >= 1
    assert other_cache["hits"] == 0
    entries = _entries(options)
    assert len(entries) == 4  # an index and a route per token
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in entries)
    folder = options.resolved_byte_cache_dir()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


async def test_entries_count_under_the_limit_and_are_evicted(tmp_path: Path) -> None:
    cache = ByteCache(tmp_path / "bytes", limit=1 << 20)
    a = FileRef("u", "a.mp4", size=10, etag="e")
    b = FileRef("u", "b.mp4", size=10, etag="e")
    assert await cache.write_entry(a, "", "video-index/v1", b"a" * 600_000)
    os.utime(next((tmp_path / "bytes" / "entries").rglob("*.ent")), (1, 1))  # the older
    assert await cache.write_entry(b, "", "video-index/v1", b"b" * 600_000)  # over: evicts
    stats = cache.statistics()
    assert (stats.evicted, stats.evicted_bytes) == (1, 600_000)
    assert await cache.read_entry(a, "", "video-index/v1") is None
    assert await cache.read_entry(b, "", "video-index/v1") == b"b" * 600_000
    # an entry longer than MAX_ENTRY is not kept at all
    huge = FileRef("u", "c.mp4", size=10, etag="e")
    cache.limit = 1 << 40
    import aiostream_hf._byte_cache as bc

    assert not await cache.write_entry(huge, "", "x", b"\0" * (bc.MAX_ENTRY + 1))


async def test_an_evicted_index_is_read_again(hub: HubServer, tmp_path: Path) -> None:
    """With a limit the frames' blocks overflow, the index entry (the oldest) goes, and is
    counted; the next open reads the index from the network."""
    options = _options(tmp_path, byte_cache_bytes=1 << 18)  # less than the frames' blocks
    _, first, cache, _ = await _open(hub, options, TIMES)
    assert not first.index_cached
    assert cache["entries_written"] == 2
    assert cache["evicted"] > 2  # the entries, written first, and blocks
    frames, again, _, _ = await _open(hub, options, NEW_TIMES)
    assert not again.index_cached
    assert again.index_requests >= 1
    assert np.array_equal(frames, await _plain(hub, tmp_path, NEW_TIMES))


def test_decode_checks_every_count_and_value() -> None:
    """An entry with a valid CRC is still checked before anything is allocated from it."""
    n = 4
    table = _mp4.SampleTable(
        name="v.mp4",
        track_id=1,
        timescale=15360,
        codec="h264",
        fourcc="avc1",
        width=64,
        height=48,
        extradata=b"\x01\x02",
        offset=np.array([48, 100, 150, 220], dtype=np.int64),
        size=np.array([52, 50, 70, 30], dtype=np.int64),
        dts=np.arange(n, dtype=np.int64) * 512,
        pts=np.arange(n, dtype=np.int64) * 512,
        cts=np.arange(n, dtype=np.int64) * 512,
        duration=np.full(n, 512, dtype=np.int64),
        is_key=np.array([True, False, False, False]),
        shown=np.ones(n, dtype=np.bool_),
    )
    payload = encode(table)
    back = decode(payload, "v.mp4", 250)
    for name in ("offset", "size", "dts", "pts", "cts", "duration", "is_key", "shown"):
        assert np.array_equal(getattr(back, name), getattr(table, name))
    assert (back.codec, back.extradata, back.width) == ("h264", b"\x01\x02", 64)
    with pytest.raises(DamagedEntry, match="outside the file"):
        decode(payload, "v.mp4", 249)  # a sample past the file's end: another file
    many = bytearray(payload)
    struct.pack_into("<Q", many, 12, 1 << 40)  # a count of samples no file has
    with pytest.raises(DamagedEntry, match="samples"):
        decode(bytes(many), "v.mp4", 250)
    more = bytearray(payload)
    struct.pack_into("<Q", more, 12, n + 1)  # one more sample than the entry holds
    with pytest.raises(DamagedEntry, match="bytes where"):
        decode(bytes(more), "v.mp4", 250)
    with pytest.raises(DamagedEntry):
        decode(payload[:10], "v.mp4", 250)
    bad_codec = payload.replace(b'"codec":"h264"', b'"codec":"av1!"')
    with pytest.raises(DamagedEntry, match="codec"):
        decode(bad_codec, "v.mp4", 250)


@pytest.mark.parametrize("kept", ["expired", "forged"])
async def test_a_kept_route_that_is_no_use_is_resolved_again_and_replaced(
    hub: HubServer, tmp_path: Path, kept: str
) -> None:
    """The CDN URL kept beside the index: one past its time is not used, one the CDN
    refuses (a signature that does not match) is resolved again; the new one is kept."""
    options = _options(tmp_path)
    await _open(hub, options, TIMES)
    (route,) = [p for p in _entries(options) if p.stat().st_size <= 1024]
    found = json.loads(route.read_bytes()[24:])  # after the store's header
    if kept == "expired":
        found["reuse_until"] = 1.0
    else:
        found["url"] = found["url"].replace("sig=", "sig=0")
    cache = ByteCache(options.resolved_byte_cache_dir(), 1 << 30)
    assert cache._write_entry(route, json.dumps(found).encode())
    frames, warm, counts, sent = await _open(hub, options, NEW_TIMES)
    assert np.array_equal(frames, await _plain(hub, tmp_path, NEW_TIMES))
    assert warm.index_cached
    assert sent["resolvers"] == 1  # resolved again, once
    assert counts["entries_written"] == 1  # the new route
    _, again, _, sent = await _open(hub, options, TIMES)
    assert again.index_cached
    assert (sent["api"], sent["resolvers"]) == (0, 0)  # the new route serves
