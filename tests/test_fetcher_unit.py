"""RangeFetcher against httpx2.MockTransport: the arithmetic, the protocol, the failure paths.

A fake Hub (``https://hub.test``) answers /resolve/ URLs: LFS-like files with a
302 to a fake CDN (``https://cdn.test``), small files directly. Tests inject
failures with ``FakeHub.override`` and assert on the requests it saw.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from aiostream_hf._client import ratelimit as _ratelimit
from aiostream_hf._exceptions import (
    ClosedResourceError,
    FetchError,
    FileChangedError,
    RangeMismatchError,
    RateLimitedError,
    RetriesExhaustedError,
    UnreachableError,
)
from aiostream_hf._fetcher import RangeFetcher, coalesce_ranges
from aiostream_hf._models import FileRef
from aiostream_hf._options import StreamOptions
from aiostream_hf._retry import retry_after as _retry_after

pytestmark = pytest.mark.anyio

HUB = "https://hub.test"
CDN = "https://cdn.test"
SHA = "c0ffee" * 6 + "abcd"
TOKEN = "hf_secret"

Override = Callable[[httpx2.Request], Awaitable[httpx2.Response | None]]


class CutStream(httpx2.AsyncByteStream):
    """A body that breaks after ``data``, as a connection closed mid-body does."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data
        raise httpx2.RemoteProtocolError("peer closed connection without sending complete body")


def serve(data: bytes, etag: str, request: httpx2.Request) -> httpx2.Response:
    """Answer a GET with Range (and If-Range) as a correct server does."""
    headers = {"ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
    spec = request.headers.get("Range")
    if_range = request.headers.get("If-Range")
    if spec is None or (if_range is not None and if_range.strip('"') != etag):
        return httpx2.Response(200, headers=headers, content=data)
    first, _, last = spec.removeprefix("bytes=").partition("-")
    if first == "":
        start, end = max(0, len(data) - int(last)), len(data)
    else:
        start, end = int(first), min(len(data), int(last) + 1 if last else len(data))
    headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
    return httpx2.Response(206, headers=headers, content=data[start:end])


class FakeHub:
    """The Hub and its CDN as one MockTransport handler."""

    def __init__(self, files: Mapping[str, bytes], *, lfs: Iterable[str] = ()) -> None:
        self.files = dict(files)
        self.lfs = set(lfs)
        self.requests: list[httpx2.Request] = []
        self.times: list[float] = []
        self.override: Override | None = None
        self.hub_headers: dict[str, str] = {}
        self.expires: Callable[[], float] = lambda: time.time() + 3600

    def etag(self, path: str) -> str:
        data = self.files[path]
        if path in self.lfs:
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    def ref(self, path: str, *, size: bool = True, etag: bool = True) -> FileRef:
        return FileRef(
            url=f"{HUB}/datasets/org/data/resolve/{SHA}/{path}",
            path=path,
            size=len(self.files[path]) if size else None,
            etag=self.etag(path) if etag else None,
        )

    def on(self, host: str) -> list[httpx2.Request]:
        return [r for r in self.requests if r.url.host == host]

    @property
    def hub(self) -> list[httpx2.Request]:
        return self.on("hub.test")

    @property
    def cdn(self) -> list[httpx2.Request]:
        return self.on("cdn.test")

    async def handler(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        self.times.append(anyio.current_time())
        if self.override is not None:
            answer = await self.override(request)
            if answer is not None:
                return answer
        if request.url.host == "hub.test":
            response = self._hub(request)
            response.headers.update(self.hub_headers)
            return response
        path = request.url.path.removeprefix("/blob/")
        if path not in self.files:
            return httpx2.Response(404, content=b"<Error>NoSuchKey</Error>")
        if_match = request.headers.get("If-Match")
        if if_match is not None and if_match.strip('"') != self.etag(path):
            return httpx2.Response(412, content=b"<Error>PreconditionFailed</Error>")
        return serve(self.files[path], self.etag(path), request)

    def _hub(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path.partition(f"/resolve/{SHA}/")[2]
        if path not in self.files:
            return httpx2.Response(
                404,
                headers={"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"},
            )
        if path in self.lfs:
            etag = f'"{self.etag(path)}"'
            location = f"{CDN}/blob/{path}?expires={int(self.expires())}&sig=s3cr3t"
            return httpx2.Response(
                302,
                headers={
                    "Location": location,
                    "X-Linked-Etag": etag,
                    "X-Linked-Size": str(len(self.files[path])),
                    "ETag": etag,
                },
            )
        return serve(self.files[path], self.etag(path), request)


def make_fetcher(fake: FakeHub, token: str | None = TOKEN, **options: Any) -> RangeFetcher:
    opts: dict[str, Any] = {"max_concurrency": 4, "backoff_base": 0.001, "backoff_max": 0.005}
    opts.update(options)
    return RangeFetcher(
        StreamOptions(**opts),
        token=token,
        endpoint=HUB,
        transport=httpx2.MockTransport(fake.handler),
    )


@pytest.fixture
def fake() -> FakeHub:
    return FakeHub(
        {
            "data/blob.parquet": os.urandom(1000),
            "data/other.parquet": os.urandom(700),
            "README.md": b"# a small plain file served by the Hub itself\n" * 4,
        },
        lfs={"data/blob.parquet", "data/other.parquet"},
    )


@contextlib.contextmanager
def socket_port() -> Iterator[int]:
    """A loopback port that nothing listens on once the block ends."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


BLOB = "data/blob.parquet"
OTHER = "data/other.parquet"
SMALL = "README.md"


# -- coalescing and splitting --------------------------------------------------------------


def test_coalesce_merges_ranges_closer_than_the_gap() -> None:
    assert coalesce_ranges([(0, 10), (15, 20), (100, 110)], gap=10, max_size=1000) == [
        (0, 20),
        (100, 110),
    ]
    # exactly `gap` apart is not closer than the gap; touching and overlapping always merge
    assert coalesce_ranges([(0, 10), (20, 30)], gap=10, max_size=1000) == [(0, 10), (20, 30)]
    assert coalesce_ranges([(10, 20), (0, 10)], gap=0, max_size=1000) == [(0, 20)]
    assert coalesce_ranges([(0, 50), (10, 20), (40, 60)], gap=0, max_size=1000) == [(0, 60)]
    assert coalesce_ranges([(5, 5), (7, 7)], gap=10, max_size=1000) == []


def test_coalesce_splits_at_max_size_and_skips_parts_of_gap_only() -> None:
    assert coalesce_ranges([(0, 250)], gap=0, max_size=100) == [(0, 100), (100, 200), (200, 250)]
    # merged to (0, 300); the middle part would hold only gap bytes: no request for it
    assert coalesce_ranges([(0, 10), (290, 300)], gap=1000, max_size=100) == [(0, 100), (200, 300)]


async def test_read_ranges_sends_the_coalesced_and_split_ranges(fake: FakeHub) -> None:
    data = fake.files[BLOB]
    ranges = [(150, 160), (0, 10), (15, 20), (100, 110), (300, 550), (3, 8), (999, 1000)]
    async with make_fetcher(fake, coalesce_gap=10, max_range_size=100) as f:
        got = await f.read_ranges(fake.ref(BLOB), ranges)
    assert got == [data[s:e] for s, e in ranges]
    cdn_ranges = sorted(r.headers["Range"] for r in fake.cdn)
    assert cdn_ranges == sorted(
        [
            "bytes=0-19",
            "bytes=100-109",
            "bytes=150-159",
            "bytes=300-399",
            "bytes=400-499",
            "bytes=500-549",
            "bytes=999-999",
        ]
    )
    assert len(fake.hub) == 1  # one resolver request for all seven parts


async def test_read_of_a_large_range_is_split_into_concurrent_parts(fake: FakeHub) -> None:
    data = fake.files[BLOB]
    async with make_fetcher(fake, max_range_size=300) as f:
        assert await f.read(fake.ref(BLOB), 100, 1000) == data[100:]
        assert await f.read(fake.ref(BLOB), 5, 5) == b""
        stats = f.statistics()
    assert sorted(r.headers["Range"] for r in fake.cdn) == [
        "bytes=100-399",
        "bytes=400-699",
        "bytes=700-999",
    ]
    assert stats.requests["range"] == 3
    assert stats.requests["resolve"] == 1


# -- redirects, singleflight, tokens ------------------------------------------------------


async def test_concurrent_first_reads_share_one_resolver_request(fake: FakeHub) -> None:
    data = fake.files[BLOB]
    ref = fake.ref(BLOB)
    got: dict[int, bytes] = {}
    async with make_fetcher(fake) as f:

        async def read(i: int) -> None:
            got[i] = await f.read(ref, i * 10, i * 10 + 10)

        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(read, i)
        for i in range(16, 24):  # later reads go straight to the CDN
            await read(i)
        stats = f.statistics()
    assert got == {i: data[i * 10 : i * 10 + 10] for i in range(24)}
    assert len(fake.hub) == 1
    assert len(fake.cdn) == 24
    assert stats.requests["resolve"] == 1
    assert stats.requests["range"] == 24
    assert stats.max_in_flight <= 4


async def test_token_goes_to_the_hub_and_never_to_the_cdn(fake: FakeHub) -> None:
    async with make_fetcher(fake) as f:
        await f.read(fake.ref(BLOB), 0, 100)
        await f.read(fake.ref(BLOB), 100, 200)
        await f.read(fake.ref(SMALL), 0, 10)
        plain = FileRef(url=f"{CDN}/blob/{OTHER}", path=OTHER)
        await f.read(plain, 0, 10)  # a plain HTTP URL on another host: no token either
    assert fake.hub
    assert all(r.headers["Authorization"] == f"Bearer {TOKEN}" for r in fake.hub)
    assert fake.cdn
    assert all("Authorization" not in r.headers for r in fake.cdn)


async def test_if_match_goes_with_every_read_of_a_resolved_url(fake: FakeHub) -> None:
    async with make_fetcher(fake) as f:
        await f.read(fake.ref(BLOB), 0, 10)
        await f.read(fake.ref(SMALL), 0, 10)
        await f.read(fake.ref(SMALL), 10, 20)
    assert {r.headers["If-Match"] for r in fake.cdn} == {f'"{fake.etag(BLOB)}"'}
    # the Hub serves the small file itself: its first read resolved it, the second is a range
    assert "If-Match" not in fake.hub[1].headers
    assert fake.hub[2].headers["If-Match"] == f'"{fake.etag(SMALL)}"'


async def test_small_files_are_read_from_the_hub_directly(fake: FakeHub) -> None:
    data = fake.files[SMALL]
    async with make_fetcher(fake) as f:
        assert await f.read(fake.ref(SMALL), 2, 9) == data[2:9]
        assert await f.read(fake.ref(SMALL), 20, 40) == data[20:40]
        stats = f.statistics()
    assert not fake.cdn
    assert [r.headers["Range"] for r in fake.hub] == ["bytes=2-8", "bytes=20-39"]
    assert stats.requests["resolve"] == 1
    assert stats.requests["range"] == 1


async def test_a_cancelled_leader_hands_the_resolution_to_a_waiting_read(fake: FakeHub) -> None:
    data = fake.files[BLOB]
    ref = fake.ref(BLOB)
    resolving = anyio.Event()

    async def hang_first_resolve(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host == "hub.test" and len(fake.hub) == 1:
            resolving.set()
            await anyio.sleep_forever()
        return None

    fake.override = hang_first_resolve
    leader_scope = anyio.CancelScope()
    got: list[bytes] = []
    async with make_fetcher(fake) as f:

        async def leader() -> None:
            with leader_scope:
                await f.read(ref, 0, 10)

        async def follower() -> None:
            got.append(await f.read(ref, 10, 20))

        async with anyio.create_task_group() as tg:
            tg.start_soon(leader)
            await resolving.wait()
            tg.start_soon(follower)
            await anyio.wait_all_tasks_blocked()
            assert len(fake.hub) == 1  # the follower waits for the leader's resolution
            leader_scope.cancel()
        assert f.statistics().in_flight == 0
    assert leader_scope.cancelled_caught
    assert got == [data[10:20]]
    assert len(fake.hub) == 2  # the follower resolved in its place


async def test_a_resolution_error_reaches_every_waiting_read(fake: FakeHub) -> None:
    ref = FileRef(url=f"{HUB}/datasets/org/data/resolve/{SHA}/missing.bin", path="missing.bin")
    errors: list[BaseException] = []
    async with make_fetcher(fake) as f:

        async def read() -> None:
            try:
                await f.read(ref, 0, 10)
            except FetchError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(read)
    assert len(errors) == 5
    assert all(isinstance(e, FetchError) and e.status == 404 for e in errors)
    assert len(fake.hub) == 1


async def test_a_refused_cdn_url_is_resolved_again_once(fake: FakeHub) -> None:
    data = fake.files[BLOB]

    async def refuse_first(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host == "cdn.test" and len(fake.cdn) == 1:
            return httpx2.Response(403, content=b"<Error>Expired</Error>")
        return None

    fake.override = refuse_first
    async with make_fetcher(fake) as f:
        assert await f.read(fake.ref(BLOB), 0, 50) == data[:50]
        stats = f.statistics()
    assert len(fake.hub) == 2
    assert stats.re_resolutions == 1
    assert stats.retries == 0  # a re-resolution is not a retry


async def test_a_cdn_that_keeps_refusing_fails_after_one_re_resolution(fake: FakeHub) -> None:
    async def refuse(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host == "cdn.test":
            return httpx2.Response(410, content=b"<Error>Gone</Error>")
        return None

    fake.override = refuse
    async with make_fetcher(fake) as f:
        with pytest.raises(FetchError) as info:
            await f.read(fake.ref(BLOB), 0, 50)
        assert f.statistics().re_resolutions == 1
    assert info.value.status == 410
    assert fake.ref(BLOB).url in str(info.value)
    assert "s3cr3t" not in str(info.value)  # signed URLs are not printed with their query
    assert len(fake.hub) == 2
    assert len(fake.cdn) == 2


async def test_an_expired_cdn_url_is_resolved_again_before_use(fake: FakeHub) -> None:
    data = fake.files[BLOB]
    fake.expires = lambda: time.time() - 60  # already expired when handed out
    async with make_fetcher(fake) as f:
        assert await f.read(fake.ref(BLOB), 0, 10) == data[:10]  # a fresh URL is tried once
        fake.expires = lambda: time.time() + 3600
        assert await f.read(fake.ref(BLOB), 10, 20) == data[10:20]
        assert await f.read(fake.ref(BLOB), 20, 30) == data[20:30]
        stats = f.statistics()
    assert len(fake.hub) == 2
    assert stats.re_resolutions == 1
    assert len(fake.cdn) == 3


# -- retries, backoff, rate limits -------------------------------------------------------


async def test_5xx_and_network_errors_are_retried(fake: FakeHub) -> None:
    data = fake.files[BLOB]
    answers: list[str] = ["503", "connect", "500", "ok"]

    async def flaky(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host != "cdn.test":
            return None
        what = answers.pop(0)
        if what == "connect":
            raise httpx2.ConnectError("connection refused", request=request)
        if what != "ok":
            return httpx2.Response(int(what), headers={"Retry-After": "0.001"})
        return None

    fake.override = flaky
    async with make_fetcher(fake) as f:
        assert await f.read(fake.ref(BLOB), 0, 100) == data[:100]
        stats = f.statistics()
    assert answers == []
    assert stats.retries == 3
    assert len(fake.cdn) == 4


async def test_retries_exhausted_error_names_url_status_and_attempts(fake: FakeHub) -> None:
    async def always_503(request: httpx2.Request) -> httpx2.Response | None:
        return httpx2.Response(503) if request.url.host == "cdn.test" else None

    fake.override = always_503
    ref = fake.ref(BLOB)
    async with make_fetcher(fake, max_retries=2) as f:
        with pytest.raises(RetriesExhaustedError) as info:
            await f.read(ref, 0, 100)
        assert f.statistics().retries == 2
    err = info.value
    assert err.url == ref.url
    assert err.status == 503
    assert err.attempts == 3
    assert ref.url in str(err)
    assert "503" in str(err)
    assert "3 attempts" in str(err)
    assert len(fake.cdn) == 3


async def test_a_429_pauses_the_whole_host(fake: FakeHub) -> None:
    """While the CDN host is paused, no request to it is sent, from any read."""
    blob, other = fake.files[BLOB], fake.files[OTHER]
    throttled_at: list[float] = []
    answered = anyio.Event()

    async def throttle_once(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host == "cdn.test" and not throttled_at:
            throttled_at.append(anyio.current_time())
            answered.set()
            return httpx2.Response(429, headers={"Retry-After": "0.3"})
        return None

    async with make_fetcher(fake) as f:
        # Resolve both files first, so that the reads below only talk to the CDN.
        await f.read(fake.ref(BLOB), 0, 1)
        await f.read(fake.ref(OTHER), 0, 1)
        fake.override = throttle_once
        before = len(fake.cdn)
        got: dict[str, bytes] = {}

        async def read(path: str) -> None:
            got[path] = await f.read(fake.ref(path), 0, 100)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read, BLOB)
            await answered.wait()
            tg.start_soon(read, OTHER)  # another file on the same host
            await anyio.wait_all_tasks_blocked()
            assert len(fake.cdn) == before + 1  # only the throttled request: both reads wait
        stats = f.statistics()
    assert got == {BLOB: blob[:100], OTHER: other[:100]}
    assert stats.throttled == 1
    assert stats.retries == 1
    later = fake.times[-2:]  # the retry and the other read, both after the pause
    assert len(fake.cdn) == before + 3
    assert all(t >= throttled_at[0] + 0.3 for t in later)


async def test_after_a_pause_one_request_probes_before_the_others(fake: FakeHub) -> None:
    """All four reads are throttled; when the pause ends one goes alone, then the rest."""
    events: list[str] = []
    window_end: list[float] = []

    async def limited(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host != "cdn.test":
            return None
        now = anyio.current_time()
        if not window_end:
            window_end.append(now + 0.2)
        n = len(fake.cdn)
        events.append(f"start {n}")
        await anyio.sleep(0.01)  # a round trip, so that requests overlap
        events.append(f"end {n}")
        if now < window_end[0]:
            left = f"{window_end[0] - now:.3f}"
            return httpx2.Response(
                429, headers={"Retry-After": left, "RateLimit": f'"cdn";r=0;t={left}'}
            )
        return None

    async with make_fetcher(fake, max_concurrency=4) as f:
        ref = fake.ref(BLOB)
        await f.read(ref, 0, 1)  # resolve first
        fake.override = limited
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(f.read, ref, i * 10, i * 10 + 10)
        stats = f.statistics()
    assert stats.throttled == 4  # at most max_concurrency 429s: the first burst
    after = events[8:]  # the four 429s started and ended first
    assert after[:2] == ["start 6", "end 6"]  # the probe went alone
    assert sorted(after[2:]) == sorted(f"{e} {n}" for n in (7, 8, 9) for e in ("start", "end"))


async def test_ratelimit_remaining_zero_pauses_the_host_until_reset(fake: FakeHub) -> None:
    data = fake.files[SMALL]
    fake.hub_headers = {"RateLimit": '"resolvers";r=0;t=0.2'}
    async with make_fetcher(fake) as f:
        assert await f.read(fake.ref(SMALL), 0, 5) == data[:5]
        assert await f.read(fake.ref(SMALL), 5, 10) == data[5:10]
        stats = f.statistics()
    assert stats.throttled == 0  # the header said to wait: no 429 needed
    first, second = fake.times
    assert second >= first + 0.2


async def test_429_without_retry_after_uses_the_ratelimit_reset(fake: FakeHub) -> None:
    data = fake.files[SMALL]
    throttled: list[float] = []

    async def once(request: httpx2.Request) -> httpx2.Response | None:
        if not throttled:
            throttled.append(anyio.current_time())
            return httpx2.Response(429, headers={"RateLimit": '"resolvers";r=0;t=0.15'})
        return None

    fake.override = once
    async with make_fetcher(fake) as f:
        assert await f.read(fake.ref(SMALL), 0, 5) == data[:5]
    assert fake.times[1] >= throttled[0] + 0.15


def test_retry_after_and_ratelimit_header_forms() -> None:
    assert _retry_after("7") == 7.0
    assert _retry_after("0.25") == 0.25
    soon = datetime.now(timezone.utc) + timedelta(seconds=30)
    in_30s = _retry_after(format_datetime(soon, usegmt=True))
    assert in_30s is not None
    assert 28 <= in_30s <= 30
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past: now
    assert _retry_after("soon") is None
    assert _ratelimit('"resolvers";r=0;t=42') == (0, 42.0)
    assert _ratelimit('"api";r=499;t=300') == (499, 300.0)
    assert _ratelimit("limit=100, remaining=3, reset=9") == (3, 9.0)
    assert _ratelimit('"api";q=500;w=300') is None


async def test_a_failing_part_fails_read_ranges_with_that_error(fake: FakeHub) -> None:
    async def break_one_part(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host == "cdn.test" and request.headers["Range"] == "bytes=500-549":
            return httpx2.Response(500)
        return None

    fake.override = break_one_part
    async with make_fetcher(fake, max_retries=1, coalesce_gap=0) as f:
        with pytest.raises(RetriesExhaustedError) as info:  # the error itself, not a group
            await f.read_ranges(fake.ref(BLOB), [(0, 10), (500, 550), (900, 910)])
        assert f.statistics().in_flight == 0
    assert info.value.status == 500
    assert info.value.attempts == 2


# -- integrity ----------------------------------------------------------------------------


async def test_a_206_for_another_range_is_a_mismatch(fake: FakeHub) -> None:
    data = fake.files[BLOB]

    async def shifted(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host != "cdn.test":
            return None
        return httpx2.Response(
            206, headers={"Content-Range": f"bytes 1-10/{len(data)}"}, content=data[1:11]
        )

    fake.override = shifted
    async with make_fetcher(fake) as f:
        with pytest.raises(RangeMismatchError, match="asked for bytes 0-9, got 1-10"):
            await f.read(fake.ref(BLOB), 0, 10)
    assert len(fake.cdn) == 1  # not retried: the server is wrong, not flaky


@pytest.mark.parametrize(
    ("content_range", "body"),
    [
        ("bytes 0-9/1000", b"x" * 9),  # shorter body than the range
        ("bytes 0-9/999", b"x" * 10),  # another total size
        ("bytes 0-9", b"x" * 10),  # malformed
        (None, b"x" * 10),  # missing
    ],
)
async def test_206_checks_content_range_and_length(
    fake: FakeHub, content_range: str | None, body: bytes
) -> None:
    async def bad(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host != "cdn.test":
            return None
        headers = {} if content_range is None else {"Content-Range": content_range}
        return httpx2.Response(206, headers=headers, content=body)

    fake.override = bad
    async with make_fetcher(fake) as f:
        with pytest.raises(RangeMismatchError):
            await f.read(fake.ref(BLOB), 0, 10)


async def test_a_200_is_sliced_when_small_and_refused_when_huge(fake: FakeHub) -> None:
    data = fake.files[BLOB]

    async def ignore_range(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host != "cdn.test":
            return None
        return httpx2.Response(200, content=data)

    fake.override = ignore_range
    async with make_fetcher(fake) as f:
        assert await f.read(fake.ref(BLOB), 400, 900) == data[400:900]  # 1000 <= 2 * 500
        with pytest.raises(RangeMismatchError, match="whole file"):
            await f.read(fake.ref(BLOB), 400, 410)


async def test_412_is_file_changed(fake: FakeHub) -> None:
    ref = fake.ref(BLOB)
    async with make_fetcher(fake) as f:
        await f.read(ref, 0, 10)
        fake.files[BLOB] = os.urandom(1000)  # replaced on the CDN: If-Match fails
        with pytest.raises(FileChangedError) as info:
            await f.read(ref, 10, 20)
    assert info.value.status == 412
    assert BLOB in str(info.value)
    assert ref.url in str(info.value)


async def test_a_redirect_to_another_etag_is_file_changed(fake: FakeHub) -> None:
    ref = fake.ref(BLOB)
    fake.files[BLOB] = os.urandom(1000)  # the Hub now links another blob
    async with make_fetcher(fake) as f:
        with pytest.raises(FileChangedError, match="links it to etag"):
            await f.read(ref, 0, 10)
    assert not fake.cdn


async def test_a_direct_answer_with_another_etag_is_file_changed(fake: FakeHub) -> None:
    ref = fake.ref(SMALL)
    fake.files[SMALL] = b"new contents, same name" * 10
    async with make_fetcher(fake) as f:
        with pytest.raises(FileChangedError, match=SMALL):
            await f.read(ref, 0, 10)


async def test_404_and_401_say_what_is_wrong(fake: FakeHub) -> None:
    missing = FileRef(url=f"{HUB}/datasets/org/data/resolve/{SHA}/nope.bin", path="nope.bin")
    async with make_fetcher(fake) as f:
        with pytest.raises(FetchError, match="not found") as info:
            await f.read(missing, 0, 10)
    assert info.value.status == 404
    assert missing.url in str(info.value)
    assert "EntryNotFound" in str(info.value)

    async def private(request: httpx2.Request) -> httpx2.Response | None:
        return httpx2.Response(401, headers={"X-Error-Code": "RepoNotFound"})

    fake.override = private
    async with make_fetcher(fake, token=None) as f:
        with pytest.raises(FetchError, match="no token was sent: pass token=") as info:
            await f.read(fake.ref(BLOB), 0, 10)
    assert info.value.status == 401
    assert not isinstance(info.value, RetriesExhaustedError)
    elsewhere = FileRef(url="https://other-hub.test/datasets/org/x/resolve/main/a", path="a")
    async with make_fetcher(fake) as f:
        with pytest.raises(FetchError, match="token is sent only to the Hub endpoint"):
            await f.read(elsewhere, 0, 10)
    assert "Authorization" not in fake.requests[-1].headers


async def test_statistics_are_a_frozen_record(fake: FakeHub) -> None:
    async with make_fetcher(fake) as f:
        await f.read(fake.ref(BLOB), 0, 10)
        stats = f.statistics()
        await f.read(fake.ref(BLOB), 10, 20)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.retries = 1  # type: ignore[misc]
    assert dataclasses.asdict(stats)["requests"] == {
        "resolve": 1,
        "range": 1,
        "stream": 0,
        "local": 0,
    }
    assert stats.total_requests == 2
    assert stats.bytes_received == 10


# -- tails and streams --------------------------------------------------------------------


async def test_read_tail_with_and_without_a_known_size(fake: FakeHub) -> None:
    data = fake.files[BLOB]
    async with make_fetcher(fake) as f:
        assert await f.read_tail(fake.ref(BLOB), 100) == (data[-100:], 1000)
        assert await f.read_tail(fake.ref(BLOB, size=False), 64) == (data[-64:], 1000)
        assert await f.read_tail(fake.ref(BLOB, size=False), 5000) == (data, 1000)
    assert [r.headers["Range"] for r in fake.cdn] == ["bytes=900-999", "bytes=-64", "bytes=-5000"]


async def test_read_tail_in_parts(fake: FakeHub) -> None:
    """``part_size``: the tail comes in concurrent parts. Without a known size, the Hub's
    redirect tells it (X-Linked-Size): the first request stops there, and the parts go
    to the CDN. A file the Hub serves itself (no redirect) gives its tail in one answer."""
    data = fake.files[BLOB]
    readme = fake.files[SMALL]
    async with make_fetcher(fake) as f:
        assert await f.read_tail(fake.ref(BLOB, size=False), 250, part_size=100) == (
            data[-250:],
            1000,
        )
        resolved = list(fake.hub)
        assert await f.read_tail(fake.ref(BLOB), 150, part_size=100) == (data[-150:], 1000)
        small = await f.read_tail(fake.ref(SMALL, size=False), 100, part_size=30)
        stats = f.statistics()
    assert small == (readme[-100:], len(readme))
    assert [r.headers["Range"] for r in resolved] == ["bytes=-250"]  # answered by the 302
    assert sorted(r.headers["Range"] for r in fake.cdn) == [
        "bytes=750-849",
        "bytes=850-949",
        "bytes=850-949",
        "bytes=950-999",
        "bytes=950-999",
    ]
    assert [r.headers["Range"] for r in fake.hub] == ["bytes=-250", "bytes=-100"]
    assert stats.requests["resolve"] == 2
    assert stats.bytes_received == 250 + 150 + 100  # no byte twice


async def test_iter_bytes_resumes_a_cut_body_with_if_range(fake: FakeHub) -> None:
    data = fake.files[BLOB]
    etag = f'"{fake.etag(BLOB)}"'

    async def cut_first(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host == "cdn.test" and len(fake.cdn) == 1:
            return httpx2.Response(
                206,
                headers={"Content-Range": f"bytes 100-999/{len(data)}", "ETag": etag},
                stream=CutStream(data[100:437]),
            )
        return None

    fake.override = cut_first
    async with make_fetcher(fake) as f:
        blocks = [b async for b in f.iter_bytes(fake.ref(BLOB), 100, block_size=128)]
        stats = f.statistics()
    assert b"".join(blocks) == data[100:]
    assert all(len(b) <= 128 for b in blocks)
    first, second = fake.cdn
    assert first.headers["Range"] == "bytes=100-999"
    assert "If-Range" not in first.headers
    assert second.headers["Range"] == "bytes=437-999"  # from the last byte received
    assert second.headers["If-Range"] == etag
    assert stats.resumes == 1
    assert stats.retries == 1
    assert stats.requests["stream"] == 2


async def test_iter_bytes_resume_onto_another_version_is_file_changed(fake: FakeHub) -> None:
    data = fake.files[BLOB]
    ref = fake.ref(BLOB)

    async def cut_then_change(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host == "cdn.test" and len(fake.cdn) == 1:
            return httpx2.Response(
                206,
                headers={"Content-Range": f"bytes 0-999/{len(data)}", "ETag": f'"{ref.etag}"'},
                stream=CutStream(data[:300]),
            )
        if request.url.host == "cdn.test":
            return httpx2.Response(200, headers={"ETag": '"another"'}, content=os.urandom(1000))
        return None

    fake.override = cut_then_change
    async with make_fetcher(fake) as f:
        got = bytearray()

        async def drain() -> None:
            async with f.iter_bytes(ref, block_size=100) as blocks:
                async for block in blocks:
                    got.extend(block)

        with pytest.raises(FileChangedError):
            await drain()
        assert f.statistics().in_flight == 0
    assert bytes(got) == data[:300]  # what came before the change, nothing after


async def test_iter_bytes_of_unknown_size_reads_to_the_end(fake: FakeHub) -> None:
    data = fake.files[SMALL]
    async with make_fetcher(fake) as f:
        stream = f.iter_bytes(fake.ref(SMALL, size=False), 3, block_size=16)
        assert b"".join([b async for b in stream]) == data[3:]
    assert fake.hub[0].headers["Range"] == "bytes=3-"


# -- cancellation and lifecycle ------------------------------------------------------------


async def test_cancelling_a_read_mid_flight_releases_its_slot(fake: FakeHub) -> None:
    data = fake.files[BLOB]
    sent = anyio.Event()

    async def hang(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host == "cdn.test":
            sent.set()
            await anyio.sleep_forever()
        return None

    fake.override = hang
    scope = anyio.CancelScope()
    after_read: list[bytes] = []
    async with make_fetcher(fake, max_concurrency=1) as f:

        async def reader() -> None:
            with scope:
                after_read.append(await f.read(fake.ref(BLOB), 0, 10))

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await sent.wait()
            assert f.statistics().in_flight == 1
            scope.cancel()
        assert scope.cancelled_caught  # the cancellation reached the scope: nothing swallowed it
        assert after_read == []
        assert f.statistics().in_flight == 0
        fake.override = None
        with anyio.fail_after(5):  # with the only slot leaked this would hang
            assert await f.read(fake.ref(BLOB), 0, 10) == data[:10]


async def test_cancelling_a_read_in_its_backoff_propagates(fake: FakeHub) -> None:
    async def slow_503(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host == "cdn.test":
            return httpx2.Response(503, headers={"Retry-After": "60"})
        return None

    fake.override = slow_503
    async with make_fetcher(fake) as f:
        with anyio.CancelScope() as scope:

            async def cancel_when_blocked() -> None:
                await anyio.wait_all_tasks_blocked()
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_when_blocked)
                await f.read(fake.ref(BLOB), 0, 10)
            pytest.fail("the read returned after its scope was cancelled")
        assert scope.cancelled_caught
        assert f.statistics().in_flight == 0
    assert len(fake.cdn) == 1


async def test_a_closed_fetcher_refuses_use(fake: FakeHub) -> None:
    f = make_fetcher(fake)
    async with f:
        await f.read(fake.ref(BLOB), 0, 10)
    await f.aclose()  # closing twice is fine
    assert f.closed
    with pytest.raises(ClosedResourceError):
        await f.read(fake.ref(BLOB), 0, 10)
    with pytest.raises(ClosedResourceError):
        await f.read_tail(fake.ref(BLOB), 10)
    with pytest.raises(ClosedResourceError):
        f.iter_bytes(fake.ref(BLOB))
    with pytest.raises(ClosedResourceError):
        async with f:
            pass


async def test_closing_the_fetcher_closes_an_open_stream(fake: FakeHub) -> None:
    f = make_fetcher(fake)
    async with f:
        stream = f.iter_bytes(fake.ref(BLOB), block_size=100)
        assert len(await stream.__anext__()) == 100
        assert f.statistics().in_flight == 1
    assert f.statistics().in_flight == 0
    with pytest.raises(ClosedResourceError):
        await stream.__anext__()


# -- local files ---------------------------------------------------------------------------


async def test_file_urls_are_read_from_disk(tmp_path: Path, fake: FakeHub) -> None:
    data = os.urandom(5000)
    path = tmp_path / "local.bin"
    path.write_bytes(data)
    ref = FileRef(url=path.as_uri(), path=str(path), size=len(data))
    unknown = FileRef(url=path.as_uri(), path=str(path))
    async with make_fetcher(fake) as f:
        assert await f.read(ref, 10, 4000) == data[10:4000]
        assert await f.read_ranges(ref, [(4000, 5000), (0, 3)]) == [data[4000:], data[:3]]
        assert await f.read_tail(unknown, 100) == (data[-100:], 5000)
        assert b"".join([b async for b in f.iter_bytes(unknown, 7, block_size=999)]) == data[7:]
        missing = FileRef(url=(tmp_path / "nope.bin").as_uri(), path="nope.bin")
        with pytest.raises(FetchError, match="not found"):
            await f.read(missing, 0, 1)
        stats = f.statistics()
    assert fake.requests == []  # no HTTP
    assert stats.requests["local"] >= 4


async def test_tls_is_set_up_on_the_first_https_request_only() -> None:
    """Plain HTTP pays for no CA bundle; https gets the verifying context, made once."""
    import ssl

    from aiostream_hf._transport import ThreadedTransport, tls_context

    made: list[ssl.SSLContext] = []

    def tls() -> ssl.SSLContext:
        made.append(tls_context())
        return made[-1]

    transport = ThreadedTransport(2, tls)
    async with transport:
        plain = transport._pool("http")
        assert set(transport._pools) == {"http"}
        assert made == []
        secure = transport._pool("https")
        assert set(transport._pools) == {"http", "https"}
        assert transport._pool("https") is secure
        assert transport._pool("http") is plain
        assert len(made) == 1
    assert tls_context() is tls_context()
    assert tls_context().verify_mode == ssl.CERT_REQUIRED
    assert tls_context().check_hostname
    assert transport._pools == {}
    with pytest.raises(RuntimeError, match="closed"):
        transport._pool("http")


# -- one version per file, pinned at first contact -------------------------------------------


URL_FILE = "https://files.test/data/table.parquet"


def plain_server(
    versions: list[bytes], headers_of: Callable[[int], dict[str, str]], *, switch_after: int = 1
) -> tuple[Callable[[httpx2.Request], httpx2.Response], list[httpx2.Request]]:
    """A plain HTTP server (no Hub) that serves ``versions[0]`` for the first
    ``switch_after`` requests, then ``versions[1]``, with ``headers_of(version)``;
    it ignores If-Match and If-Range, as careless servers do."""
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        v = 0 if len(seen) <= switch_after else 1
        data = versions[v]
        first, _, last = request.headers["Range"].removeprefix("bytes=").partition("-")
        if first == "":
            start, end = max(0, len(data) - int(last)), len(data)
        else:
            start, end = int(first), min(len(data), int(last) + 1 if last else len(data))
        headers = {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}", **headers_of(v)}
        return httpx2.Response(206, headers=headers, content=data[start:end])

    return handler, seen


def plain_fetcher(
    handler: Callable[[httpx2.Request], httpx2.Response], **options: Any
) -> RangeFetcher:
    opts: dict[str, Any] = {"backoff_base": 0.001, "backoff_max": 0.005, "max_retries": 2}
    opts.update(options)
    return RangeFetcher(
        StreamOptions(**opts), endpoint=HUB, transport=httpx2.MockTransport(handler)
    )


@pytest.mark.parametrize(
    ("flavour", "headers_of"),
    [
        ("strong etag", lambda v: {"ETag": f'"v{v}"'}),
        ("weak etag", lambda v: {"ETag": f'W/"v{v}"'}),
        ("last-modified only", lambda v: {"Last-Modified": f"Wed, 0{v + 1} Dec 2026 10:00:00 GMT"}),
    ],
)
async def test_a_file_replaced_between_two_reads_is_file_changed(
    flavour: str, headers_of: Callable[[int], dict[str, str]]
) -> None:
    """The footer read pins the version; a row-group read of the new bytes fails,
    though the server ignores If-Match (a URL source: no etag known beforehand)."""
    old, new = os.urandom(1000), os.urandom(1000)
    handler, seen = plain_server([old, new], headers_of)
    ref = FileRef(url=URL_FILE, path="table.parquet", size=1000)
    async with plain_fetcher(handler) as f:
        tail, _ = await f.read_tail(ref, 100)
        assert tail == old[-100:]
        with pytest.raises(FileChangedError, match="table.parquet") as info:
            await f.read(ref, 0, 100)
    assert "changed" in str(info.value)
    if flavour == "strong etag":  # the pinned strong ETag goes as If-Match
        assert seen[1].headers["If-Match"] == '"v0"'


async def test_a_size_change_without_validators_is_file_changed() -> None:
    handler, _ = plain_server([os.urandom(1000), os.urandom(1200)], lambda v: {})
    ref = FileRef(url=URL_FILE, path="table.parquet")
    async with plain_fetcher(handler) as f:
        await f.read_tail(ref, 100)
        with pytest.raises(FileChangedError, match="size went from 1000 to 1200"):
            await f.read(ref, 0, 100)


async def test_a_file_served_with_no_validator_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = os.urandom(1000)
    handler, _ = plain_server([data, data], lambda v: {})
    ref = FileRef(url=URL_FILE, path="table.parquet", size=1000)
    with caplog.at_level("WARNING", logger="aiostream_hf"):
        async with plain_fetcher(handler) as f:
            assert await f.read(ref, 0, 10) == data[:10]
            assert await f.read(ref, 10, 20) == data[10:20]
            stats = f.statistics()
    assert stats.unvalidated_files == 1  # once per file, not per read
    assert [r.getMessage() for r in caplog.records if "no ETag" in r.getMessage()] == [
        "https://files.test/data/table.parquet is served with no ETag and no Last-Modified: "
        "if it changes while it is read, the change cannot be detected"
    ]


async def test_a_cdn_that_ignores_if_match_cannot_mix_versions(fake: FakeHub) -> None:
    """A Hub file whose CDN serves new bytes (with their own etag) after the first read."""
    ref = fake.ref(BLOB)

    async def replaced(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host == "cdn.test" and len(fake.cdn) > 1:
            return serve(os.urandom(1000), "new-version", request)  # no 412 for If-Match
        return None

    fake.override = replaced
    async with make_fetcher(fake) as f:
        await f.read_tail(ref, 64)
        with pytest.raises(FileChangedError, match="blob.parquet"):
            await f.read(ref, 0, 64)


async def test_a_resume_with_a_weak_etag_is_checked_too() -> None:
    """A cut body resumed from a server whose weak ETag changed: no half-old, half-new."""
    old, new = os.urandom(1000), os.urandom(1000)
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        if len(seen) == 1:
            return httpx2.Response(
                206,
                headers={"Content-Range": "bytes 0-999/1000", "ETag": 'W/"a"'},
                stream=CutStream(old[:400]),
            )
        start = int(request.headers["Range"].removeprefix("bytes=").partition("-")[0])
        return httpx2.Response(
            206,
            headers={"Content-Range": f"bytes {start}-999/1000", "ETag": 'W/"b"'},
            content=new[start:],
        )

    ref = FileRef(url=URL_FILE, path="table.parquet", size=1000)
    got = bytearray()
    async with plain_fetcher(handler) as f:
        with pytest.raises(FileChangedError, match='W/"a"'):
            async with f.iter_bytes(ref, block_size=100) as blocks:
                async for block in blocks:
                    got.extend(block)
    assert bytes(got) == old[:400]
    assert "If-Range" not in seen[1].headers  # a weak ETag cannot go in If-Range


# -- stalls, unreachable hosts, long rate-limit waits ------------------------------------------


class TrickleStream(httpx2.AsyncByteStream):
    """A body of ``data`` sent one byte at a time, ``gap`` seconds apart."""

    def __init__(self, data: bytes, gap: float) -> None:
        self.data = data
        self.gap = gap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(len(self.data)):
            await anyio.sleep(self.gap)
            yield self.data[i : i + 1]


async def test_a_trickling_body_is_a_stall_and_is_given_up() -> None:
    """Bytes keep coming (so no read timeout fires), but far under min_throughput."""
    data = os.urandom(1000)
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        start = int(request.headers["Range"].removeprefix("bytes=").partition("-")[0])
        return httpx2.Response(
            206,
            headers={"Content-Range": f"bytes {start}-999/1000", "ETag": '"a"'},
            stream=TrickleStream(data[start:], 0.02),
        )

    ref = FileRef(url=URL_FILE, path="table.parquet", size=1000)
    options = {"timeout": 0.2, "min_throughput": 1000.0, "max_retries": 1}
    async with plain_fetcher(handler, **options) as f:
        with pytest.raises(RetriesExhaustedError, match="min_throughput") as info:
            await f.read(ref, 0, 1000)
        stats = f.statistics()
    assert info.value.attempts == 2
    assert stats.stalls == 2
    assert len(seen) == 2
    second_start = int(seen[1].headers["Range"].removeprefix("bytes=").partition("-")[0])
    assert second_start > 0  # the retry resumed after the bytes received


async def test_an_endpoint_that_refuses_connections_fails_fast() -> None:
    with socket_port() as port:
        url = f"http://127.0.0.1:{port}/datasets/org/name/resolve/main/a.parquet"
    ref = FileRef(url=url, path="a.parquet", size=10)
    options = StreamOptions(max_retries=8, backoff_base=5.0)  # the usual retries would wait
    async with RangeFetcher(options, endpoint=f"http://127.0.0.1:{port}") as f:
        with pytest.raises(UnreachableError, match="HF_ENDPOINT") as info:
            await f.read(ref, 0, 10)
        assert f.client.statistics().unreachable_hosts == 1
    assert info.value.attempts == 2  # one quick retry, then the error


async def test_a_host_that_answered_before_gets_the_usual_retries(fake: FakeHub) -> None:
    async def refuse_later(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host == "cdn.test" and len(fake.cdn) > 1:
            raise httpx2.ConnectError("connection refused", request=request)
        return None

    fake.override = refuse_later
    async with make_fetcher(fake, max_retries=3) as f:
        await f.read(fake.ref(BLOB), 0, 10)
        with pytest.raises(RetriesExhaustedError) as info:
            await f.read(fake.ref(BLOB), 10, 20)
    assert info.value.attempts == 4


async def test_a_wait_longer_than_allowed_fails_at_once_and_says_until_when(
    fake: FakeHub, caplog: pytest.LogCaptureFixture
) -> None:
    async def busy(request: httpx2.Request) -> httpx2.Response | None:
        return httpx2.Response(
            429, headers={"Retry-After": "86400", "RateLimit": '"resolvers";r=0;t=86400'}
        )

    fake.override = busy
    with caplog.at_level("WARNING", logger="aiostream_hf"):
        async with make_fetcher(fake, max_rate_limit_wait=60.0) as f:
            with pytest.raises(RateLimitedError, match="max_rate_limit_wait") as info:
                await f.read(fake.ref(BLOB), 0, 10)
            client = f.client.statistics()
    assert info.value.resume_at is not None
    assert abs(info.value.resume_at - (time.time() + 86400)) < 600
    assert len(fake.requests) == 1  # no second request: the wait was refused at once
    assert (client.pauses, client.rate_limit_failures) == (1, 1)
    warned = [r.getMessage() for r in caplog.records if "rate-limited us" in r.getMessage()]
    assert len(warned) == 1
    assert 'bucket "resolvers"' in warned[0]
    assert "hub.test:443" in warned[0]


async def test_a_local_file_replaced_between_two_reads_is_file_changed(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    path.write_bytes(os.urandom(1000))
    ref = FileRef(url=path.as_uri(), path="t.bin", size=1000)
    async with RangeFetcher(StreamOptions(), endpoint=HUB) as f:
        await f.read_tail(ref, 10)
        replacement = tmp_path / "new.bin"
        replacement.write_bytes(os.urandom(1000))  # the same size, other bytes
        os.replace(replacement, path)
        with pytest.raises(FileChangedError, match="another file is at its path"):
            await f.read(ref, 0, 10)
        with pytest.raises(FileChangedError):
            async with f.iter_bytes(ref, block_size=100) as blocks:
                async for _ in blocks:
                    pass


async def test_a_cdn_that_refuses_connections_gets_the_usual_retries(fake: FakeHub) -> None:
    """The Hub sent us there, so the CDN host exists: a refusal is retried as usual."""

    async def refuse_cdn(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host == "cdn.test":
            raise httpx2.ConnectError("connection refused", request=request)
        return None

    fake.override = refuse_cdn
    async with make_fetcher(fake, max_retries=3) as f:
        with pytest.raises(RetriesExhaustedError) as info:
            await f.read(fake.ref(BLOB), 0, 10)
    assert info.value.attempts == 4
    assert len(fake.cdn) == 4


def test_absurd_server_delays_are_read_within_a_year() -> None:
    """``Retry-After``/``RateLimit`` numbers past what a clock holds (inf, 1e18, twenty
    digits) are read as a year; NaN and negative ones as none/now. Before, they reached
    ``time.gmtime`` and failed the read with OverflowError/OSError."""
    from aiostream_hf._client import _clock
    from aiostream_hf._retry import MAX_HEADER_DELAY_S

    assert _retry_after("inf") == MAX_HEADER_DELAY_S
    assert _retry_after("1e400") == MAX_HEADER_DELAY_S
    assert _retry_after("1e18") == MAX_HEADER_DELAY_S
    assert _retry_after("-5") == 0.0
    assert _retry_after("nan") is None  # not a number: backoff, as for garbage
    assert _retry_after("Fri, 31 Dec 9999 23:59:59 GMT") == MAX_HEADER_DELAY_S
    assert _ratelimit('"api";r=0;t=99999999999999999999') == (0, MAX_HEADER_DELAY_S)
    assert _clock(1e18) == "a time too far ahead to tell"
    assert _clock(0).startswith("1970-01-01")


@pytest.mark.parametrize("header", ["inf", "1e18", "99999999999999999999"])
async def test_a_429_asking_for_forever_is_a_rate_limited_error(fake: FakeHub, header: str) -> None:
    async def forever(request: httpx2.Request) -> httpx2.Response | None:
        return httpx2.Response(429, headers={"Retry-After": header})

    fake.override = forever
    async with make_fetcher(fake) as f:
        with pytest.raises(RateLimitedError, match="max_rate_limit_wait"):
            await f.read(fake.ref(BLOB), 0, 10)
    assert len(fake.requests) == 1


async def test_a_ratelimit_header_on_a_good_answer_cannot_overflow(fake: FakeHub) -> None:
    """A good answer saying its bucket resets in 1e20 s pauses the host (read as a
    year), and the next read is refused with RateLimitedError, not an OverflowError."""
    data = fake.files[BLOB]

    async def good_with_absurd_reset(request: httpx2.Request) -> httpx2.Response | None:
        fake.override = None
        try:
            answer = await fake.handler(request)
        finally:
            fake.override = good_with_absurd_reset
        answer.headers["RateLimit"] = '"api";r=0;t=99999999999999999999'
        return answer

    fake.override = good_with_absurd_reset
    async with make_fetcher(fake, max_rate_limit_wait=1.0) as f:
        assert await f.read(fake.ref(BLOB), 0, 10) == data[:10]
        with pytest.raises(RateLimitedError, match="max_rate_limit_wait"):
            await f.read(fake.ref(BLOB), 10, 20)


async def test_a_5xx_retry_after_waits_at_most_max_rate_limit_wait(fake: FakeHub) -> None:
    """A 503 asking for 1e12 s between retries waits at most ``max_rate_limit_wait``
    (here 0.05 s) per retry, not the 300 s of the Hub's window; the retries run out."""
    slept: list[float] = []
    real_sleep = anyio.sleep

    async def spy(delay: float) -> None:
        slept.append(delay)
        await real_sleep(0)

    async def unavailable(request: httpx2.Request) -> httpx2.Response | None:
        if request.url.host == "cdn.test":
            return httpx2.Response(503, headers={"Retry-After": "1e12"})
        return None

    fake.override = unavailable
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(anyio, "sleep", spy)
        async with make_fetcher(fake, max_retries=2, max_rate_limit_wait=0.05) as f:
            with pytest.raises(RetriesExhaustedError):
                await f.read(fake.ref(BLOB), 0, 10)
    assert slept
    assert max(slept) <= 0.05
