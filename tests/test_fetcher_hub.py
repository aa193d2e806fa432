"""RangeFetcher against the local Hub server over loopback: bytes, request counts, faults."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from aiostream_hf._exceptions import FetchError, FileChangedError, RetriesExhaustedError
from aiostream_hf._fetcher import RangeFetcher
from aiostream_hf._models import FileRef
from aiostream_hf._options import StreamOptions
from aiostream_hf.testing import Faults, HubServer, RateLimits, make_repo

pytestmark = pytest.mark.anyio

REPO = "org/blobs"
BLOB = "data/blob.parquet"
SMALL = "README.md"
PARTS = [f"data/part-{i}.parquet" for i in range(5)]


@dataclass
class Served:
    """A running HubServer over org/blobs and FileRefs pinned to its commit."""

    hub: HubServer
    root: Path
    files: dict[str, bytes]
    commit: str

    def ref(self, path: str) -> FileRef:
        data = self.files[path]
        lfs = path.endswith(".parquet")
        etag = (
            hashlib.sha256(data).hexdigest()
            if lfs
            else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        )
        return FileRef(
            url=self.hub.url(REPO, path, revision=self.commit),
            path=path,
            size=len(data),
            etag=etag,
        )

    def fetcher(self, **options: Any) -> RangeFetcher:
        opts: dict[str, Any] = {"max_concurrency": 8, "backoff_base": 0.01, "backoff_max": 0.1}
        opts.update(options)
        return RangeFetcher(StreamOptions(**opts), endpoint=self.hub.endpoint)

    def resolvers(self) -> int:
        return self.hub.stats().by_bucket.get("resolvers", 0)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Start a HubServer (thread mode) with the given options over a fresh repo."""
    root = tmp_path / "hub"
    root.mkdir()
    files: dict[str, bytes] = {
        BLOB: os.urandom(3_000_000),
        SMALL: b"# blobs\n\nA small plain file, served by the Hub itself.\n" * 40,
    }
    files.update({p: os.urandom(20_000) for p in PARTS})
    make_repo(root, REPO, files)
    with contextlib.ExitStack() as stack:

        def start(**kwargs: Any) -> Served:
            hub = stack.enter_context(HubServer(root, **kwargs))
            commit = httpx2.get(f"{hub.endpoint}/api/datasets/{REPO}").json()["sha"]
            return Served(hub, root, files, commit)

        yield start


def random_ranges(rng: random.Random, size: int, n: int, longest: int) -> list[tuple[int, int]]:
    out = []
    for _ in range(n):
        start = rng.randrange(size)
        out.append((start, min(size, start + rng.randint(1, longest))))
    return out


async def test_random_ranges_are_exact(serve: Callable[..., Served]) -> None:
    s = serve()
    blob, small = s.files[BLOB], s.files[SMALL]
    rng = random.Random(1)
    async with s.fetcher(max_range_size=256 * 1024, coalesce_gap=4096) as f:
        for a, b in random_ranges(rng, len(blob), 20, 300_000):
            assert await f.read(s.ref(BLOB), a, b) == blob[a:b]
        ranges = random_ranges(rng, len(blob), 60, 50_000)
        assert await f.read_ranges(s.ref(BLOB), ranges) == [blob[a:b] for a, b in ranges]
        small_ranges = random_ranges(rng, len(small), 30, 200)
        assert await f.read_ranges(s.ref(SMALL), small_ranges) == [
            small[a:b] for a, b in small_ranges
        ]
        for a, b in small_ranges[:10]:
            assert await f.read(s.ref(SMALL), a, b) == small[a:b]
        assert await f.read_tail(s.ref(BLOB), 70_000) == (blob[-70_000:], len(blob))
        unsized = FileRef(url=s.ref(BLOB).url, path=BLOB)
        assert await f.read_tail(unsized, 1234) == (blob[-1234:], len(blob))
        assert await f.read_tail(s.ref(SMALL), 10_000) == (small, len(small))
        blocks = [b async for b in f.iter_bytes(s.ref(BLOB), block_size=256 * 1024)]
        assert b"".join(blocks) == blob
        assert max(len(b) for b in blocks) == 256 * 1024
        stats = f.statistics()
    assert stats.max_in_flight <= 8
    assert stats.in_flight == 0
    assert stats.retries == 0


async def test_one_resolver_request_per_file_however_many_reads(
    serve: Callable[..., Served],
) -> None:
    s = serve()
    blob = s.files[BLOB]
    rng = random.Random(2)
    s.hub.reset_stats()
    async with s.fetcher() as f:
        ref = s.ref(BLOB)
        ranges = random_ranges(rng, len(blob), 32, 20_000)
        got: dict[int, bytes] = {}

        async def read(i: int, a: int, b: int) -> None:
            got[i] = await f.read(ref, a, b)

        async with anyio.create_task_group() as tg:  # 32 concurrent first reads
            for i, (a, b) in enumerate(ranges):
                tg.start_soon(read, i, a, b)
        assert got == {i: blob[a:b] for i, (a, b) in enumerate(ranges)}
        assert s.resolvers() == 1
        for a, b in random_ranges(rng, len(blob), 40, 20_000):
            assert await f.read(ref, a, b) == blob[a:b]
        async with f.iter_bytes(ref, 1_000_000, 2_000_000, block_size=100_000) as stream:
            assert b"".join([b async for b in stream]) == blob[1_000_000:2_000_000]
        stats = f.statistics()
        hub = s.hub.stats()
    assert hub.by_bucket["resolvers"] == 1
    assert hub.by_bucket["cdn"] == 32 + 40 + 1
    assert stats.requests["resolve"] == 1


async def test_reads_survive_cuts_and_errors(serve: Callable[..., Served]) -> None:
    s = serve()
    blob = s.files[BLOB]
    s.hub.set_faults(Faults(cut_rate=0.05, error_rate=0.02, targets=("cdn", "resolvers"), seed=3))
    rng = random.Random(3)
    async with s.fetcher(max_range_size=128 * 1024) as f:
        for _ in range(10):
            ranges = random_ranges(rng, len(blob), 30, 60_000)
            assert await f.read_ranges(s.ref(BLOB), ranges) == [blob[a:b] for a, b in ranges]
        for path in PARTS:
            data = s.files[path]
            assert await f.read(s.ref(path), 0, len(data)) == data
        stats = f.statistics()
    faults = s.hub.stats().faults
    assert faults.get("cut", 0) + faults.get("error", 0) > 0
    assert stats.retries > 0
    assert stats.retries >= faults.get("error", 0)


async def test_iter_bytes_resumes_through_many_cuts(serve: Callable[..., Served]) -> None:
    s = serve()
    blob = s.files[BLOB]
    s.hub.set_faults(Faults(cut_rate=0.3, cut_at=(1,), targets=("cdn",), seed=4))
    async with s.fetcher() as f:
        got = bytearray()
        async with f.iter_bytes(s.ref(BLOB), block_size=64 * 1024) as stream:
            async for block in stream:
                assert len(block) <= 64 * 1024
                got += block
        stats = f.statistics()
    assert bytes(got) == blob
    cuts = s.hub.stats().faults["cut"]
    assert cuts >= 1
    assert stats.resumes == cuts  # every cut resumed, from where it stopped
    assert stats.requests["stream"] == cuts + 1
    assert s.hub.stats().bytes_served < 2 * len(blob)  # not re-downloaded from the start


async def test_a_resolvers_quota_is_waited_out(serve: Callable[..., Served]) -> None:
    s = serve(rate_limits=RateLimits(resolvers=2, window_s=1))
    async with s.fetcher(max_concurrency=4) as f:
        got: dict[str, bytes] = {}

        async def read(path: str) -> None:
            got[path] = await f.read(s.ref(path), 0, 1000)

        async with anyio.create_task_group() as tg:
            for path in PARTS:
                tg.start_soon(read, path)
        stats = f.statistics()
    hub = s.hub.stats()
    assert got == {p: s.files[p][:1000] for p in PARTS}
    assert hub.by_status[302] == len(PARTS)  # each file resolved once, in the end
    assert hub.throttled == stats.throttled == 0  # the quota was counted, not run into
    assert f.client.statistics().paced > 0  # and its resets waited for


async def test_an_expired_cdn_url_is_resolved_again_once(serve: Callable[..., Served]) -> None:
    s = serve(cdn_url_ttl_s=1.5)
    blob = s.files[BLOB]
    async with s.fetcher() as f:
        assert await f.read(s.ref(BLOB), 0, 100) == blob[:100]
        await anyio.sleep(1.6)  # let the signed URL expire (setup, not an assertion)
        for i in range(1, 5):
            assert (
                await f.read(s.ref(BLOB), i * 100, i * 100 + 100) == blob[i * 100 : i * 100 + 100]
            )
        stats = f.statistics()
    assert s.resolvers() == 2
    assert stats.re_resolutions == 1
    assert stats.retries == 0


async def test_a_refused_cdn_url_is_resolved_again_only_once(serve: Callable[..., Served]) -> None:
    s = serve(cdn_url_ttl_s=1e-6)  # every signed URL is expired when handed out
    async with s.fetcher() as f:
        with pytest.raises(FetchError) as info:
            await f.read(s.ref(BLOB), 0, 100)
        stats = f.statistics()
    assert info.value.status == 403
    assert s.ref(BLOB).url in str(info.value)
    assert stats.re_resolutions == 1
    assert s.resolvers() == 2
    assert s.hub.stats().by_bucket["cdn"] == 2


async def test_a_file_changed_between_reads_is_an_error(serve: Callable[..., Served]) -> None:
    s = serve()
    blob, small = s.files[BLOB], s.files[SMALL]
    repo = s.root / "datasets" / "org" / "blobs"
    async with s.fetcher() as f:
        assert await f.read(s.ref(BLOB), 0, 1000) == blob[:1000]
        assert await f.read(s.ref(SMALL), 0, 10) == small[:10]
        (repo / BLOB).write_bytes(os.urandom(len(blob)))
        (repo / SMALL).write_bytes(small.upper())
        with pytest.raises(FileChangedError) as lfs:
            await f.read(s.ref(BLOB), 1000, 2000)
        with pytest.raises(FileChangedError) as plain:
            await f.read(s.ref(SMALL), 10, 20)
    assert lfs.value.status == 412
    assert BLOB in str(lfs.value)
    assert SMALL in str(plain.value)


async def test_an_unknown_file_is_a_fetch_error_naming_the_url(
    serve: Callable[..., Served],
) -> None:
    s = serve()
    missing = FileRef(url=s.hub.url(REPO, "data/missing.parquet", revision=s.commit), path="x")
    async with s.fetcher() as f:
        with pytest.raises(FetchError, match="not found") as info:
            await f.read(missing, 0, 10)
    assert info.value.status == 404
    assert missing.url in str(info.value)
    assert info.value.url == missing.url


# -- one version per file, against the server's hostile modes ---------------------------------


@pytest.mark.parametrize(
    ("faults", "as_url"),
    [
        ({"ignore_if_match": ("cdn",)}, False),  # a Hub file whose CDN ignores If-Match
        ({"ignore_if_match": ("cdn",)}, True),  # a URL source: no etag known beforehand
        ({"etag_style": "weak"}, True),
        ({"etag_style": "none"}, True),  # Last-Modified only
        ({"etag_style": "none", "last_modified": False, "replace_size": 2_999_000}, True),
        ({}, False),  # a server that honours If-Match: 412
    ],
)
async def test_a_file_replaced_after_its_first_read_never_mixes_versions(
    serve: Callable[..., Served], faults: dict[str, Any], as_url: bool
) -> None:
    """The footer-like tail read pins the version; the server then serves other bytes
    for the file. Every later read fails with FileChangedError, or gives old bytes."""
    s = serve(faults=Faults(replace_after=1, replace_path=BLOB, **faults))
    ref = s.ref(BLOB)
    if as_url:
        ref = FileRef(url=ref.url, path=BLOB)  # no size, no etag: what a URL source knows
    old = s.files[BLOB]
    async with s.fetcher(max_retries=1) as f:
        tail, _ = await f.read_tail(ref, 1000)
        assert tail == old[-1000:]
        with pytest.raises(FileChangedError, match="blob.parquet"):
            await f.read(ref, 0, 1000)
        with pytest.raises(FileChangedError):
            async with f.iter_bytes(ref, block_size=1 << 20) as blocks:
                async for _ in blocks:
                    pass


async def test_a_server_without_validators_is_counted(serve: Callable[..., Served]) -> None:
    s = serve(faults=Faults(etag_style="none", last_modified=False))
    ref = s.ref(BLOB)
    async with s.fetcher() as f:
        data = await f.read(FileRef(url=ref.url, path=BLOB), 0, 100)
        stats = f.statistics()
    assert data == s.files[BLOB][:100]
    assert stats.unvalidated_files == 1


async def test_a_trickling_server_is_given_up_on(serve: Callable[..., Served]) -> None:
    """1 byte every 50 ms never trips a per-read timeout; min_throughput catches it."""
    s = serve(faults=Faults(trickle_every=1, trickle_interval_ms=50, targets=("cdn",)))
    async with s.fetcher(timeout=0.5, min_throughput=1000.0, max_retries=1) as f:
        with pytest.raises(RetriesExhaustedError, match="min_throughput"):
            await f.read(s.ref(BLOB), 0, 100_000)
        assert f.statistics().stalls == 2


async def test_buffers_received_in_place_are_exact_through_cuts(
    serve: Callable[..., Served],
) -> None:
    """read_buffers: each body is received straight into one buffer of its size. The
    views equal the file's bytes, read-only, through cut bodies (a resume writes at the
    byte it resumes from) and coalesced or split ranges."""
    s = serve()
    blob = s.files[BLOB]
    s.hub.set_faults(Faults(cut_rate=0.3, cut_at=(1,), targets=("cdn",), seed=5))
    rng = random.Random(5)
    async with s.fetcher(max_range_size=256 * 1024, coalesce_gap=4096) as f:
        for _ in range(6):
            ranges = random_ranges(rng, len(blob), 12, 400_000)
            views = await f.read_buffers(s.ref(BLOB), ranges)
            assert all(isinstance(v, memoryview) and v.readonly for v in views)
            assert [bytes(v) for v in views] == [blob[a:b] for a, b in ranges]
        whole = await f.read_buffers(s.ref(BLOB), [(0, len(blob))])
        assert bytes(whole[0]) == blob
        stats = f.statistics()
    assert s.hub.stats().faults.get("cut", 0) > 0
    assert stats.resumes > 0


@pytest.mark.parametrize("path", ["http", "byte cache", "local file"])
async def test_buffers_are_read_only_bytes_on_every_path(
    serve: Callable[..., Served], tmp_path: Path, path: str
) -> None:
    """read_buffers gives read-only views of unsigned bytes (equal to ``bytes``, as a
    decoder compares them) whether the bytes come from the server, from the byte cache
    (its second read, from blocks on disk) or from a local file; Arrow's buffers under
    them were views of signed chars, which compared unequal to the same bytes."""
    s = serve()
    blob = s.files[BLOB]
    ranges = [(0, 10), (70_000, 1_200_000), (2_999_000, 3_000_000)]
    ref = s.ref(BLOB)
    options: dict[str, Any] = {}
    if path == "byte cache":
        options = {"cache_dir": tmp_path / "cache", "byte_cache_bytes": 1 << 30}
    elif path == "local file":
        local = tmp_path / "blob.parquet"
        local.write_bytes(blob)
        ref = FileRef(url=local.as_uri(), path=BLOB, size=len(blob))
    async with s.fetcher(**options) as f:
        for _ in range(2):  # through the byte cache: fetched, then read from its blocks
            views = await f.read_buffers(ref, ranges)
            assert all(v.readonly and v.format == "B" for v in views)
            assert views == [blob[a:b] for a, b in ranges]
        if path == "byte cache":
            assert f.statistics().byte_cache["hits"] > 0


async def test_buffers_are_exact_where_the_response_cannot_be_read_in_place(
    serve: Callable[..., Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another urllib3 or Python without the private parts read_buffers receives in place
    with: each body is read and copied, the same bytes, through cuts."""
    import aiostream_hf._transport

    monkeypatch.setattr(aiostream_hf._transport, "_in_place", lambda raw: False)
    s = serve()
    blob = s.files[BLOB]
    s.hub.set_faults(Faults(cut_rate=0.3, cut_at=(1,), targets=("cdn",), seed=6))
    rng = random.Random(6)
    async with s.fetcher(max_range_size=256 * 1024, coalesce_gap=4096) as f:
        for _ in range(4):
            ranges = random_ranges(rng, len(blob), 12, 400_000)
            views = await f.read_buffers(s.ref(BLOB), ranges)
            assert [bytes(v) for v in views] == [blob[a:b] for a, b in ranges]
        stats = f.statistics()
    assert stats.resumes > 0


async def test_a_trickling_server_is_given_up_on_in_place(serve: Callable[..., Served]) -> None:
    """A body read in place still shows its pace: min_throughput catches a trickle."""
    s = serve(faults=Faults(trickle_every=1, trickle_interval_ms=50, targets=("cdn",)))
    async with s.fetcher(timeout=0.5, min_throughput=1000.0, max_retries=1) as f:
        with pytest.raises(RetriesExhaustedError, match="min_throughput"):
            await f.read_buffers(s.ref(BLOB), [(0, 100_000)])
        assert f.statistics().stalls == 2
