"""RangeFetcher: bounded-concurrency HTTP range reads with redirects, retries and checks.

Every decoder reads bytes through one ``RangeFetcher`` per event loop::

    async with RangeFetcher(options, token=token, endpoint=endpoint) as fetcher:
        footer, size = await fetcher.read_tail(file, 64 * 1024)
        chunks = await fetcher.read_ranges(file, [(0, 100), (4096, 8192)])
        async with fetcher.iter_bytes(file) as blocks:
            async for block in blocks:
                ...

How a read travels:

- Resolution. The first read of a Hub file sends its range GET to the file's
  ``/resolve/`` URL without following redirects. A 302 names a signed CDN URL:
  it is cached (keyed by the file URL, until the ``expires=`` of its query) and
  the range is sent there; a 200/206 means the Hub serves the file itself, and
  that is cached too. Concurrent first reads of one file wait for the one
  resolver request in flight (a dict of URL -> pending event, updated in plain
  synchronous code). A CDN answer of 401/403/410 drops the cached URL and the
  read re-resolves once.
- Concurrency. An ``anyio.CapacityLimiter(max_concurrency)`` is held by every
  request from send to the end of its body. ``read_ranges`` merges ranges
  closer than ``coalesce_gap`` and splits requests over ``max_range_size``
  into parts fetched concurrently.
- Retries. 408, 429, 5xx and network errors (refused connections, timeouts,
  bodies cut mid-way) are retried with jittered exponential backoff, up to
  ``max_retries`` failures in a row without progress. ``Retry-After`` and
  ``RateLimit: "<bucket>";r=<remaining>;t=<seconds>`` are honoured. A 429 (or
  ``r=0``) pauses the whole host; when the pause ends one request goes first
  and its ``RateLimit`` header says how many may follow. A body cut mid-way
  resumes from the last byte received, with ``If-Range``.
- Integrity. Every 206 must be the range asked for (``Content-Range`` and
  length). A 200 to a range request is used (sliced) only when the whole file
  is at most twice the bytes asked for.
- One version per file. The first answer for a file pins its version (``_versions``:
  ETag, else Last-Modified, and size; for Hub files served directly, the manifest's
  etag). Every later answer for it, to any request of this fetcher, must show the
  same version, else ``FileChangedError``: never a silent mix of two versions, even
  from a server that ignores ``If-Match``. ``If-Match`` (the pinned strong ETag, else
  the manifest's) goes with every read from a resolved URL, and a resume asks
  ``If-Range`` with the pinned validator. A server that gives no validator at all is
  counted (``unvalidated_files``) and logged: its changes cannot be seen.
- Stalls. A body that arrives slower than ``min_throughput`` bytes/s, measured over
  each ``timeout`` seconds spent waiting for it, is dropped and resumed like a cut
  one; so is one with no bytes for ``timeout`` seconds.
- Unreachable hosts. A host that never answered and refuses the connection (or has
  no DNS name) is tried once more, then ``UnreachableError`` names it.
- Tokens go to the Hub's host only, never to the CDN.
- Objects of an S3 listing (``_s3``) are read from their own URL from the first request
  (no resolution: ``If-Match`` carries the listing's ETag at once), each attempt signed
  by the client as it is sent (SigV4); an error answer's ``<Code>`` names the problem.
- ``file://`` URLs are read from disk with ``os.pread`` in worker threads.
- ``read_buffers`` receives each body in place (``_transport.READINTO``): one buffer
  of Arrow's memory pool per request, written by the socket reads themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, TypeAlias, cast

import anyio
import anyio.to_thread
import httpx2
import pyarrow as pa

from . import _s3
from ._access import Access, auth_headers, check_token, default_endpoint, normalize_endpoint, origin
from ._client import HubClient, Pending, RequestSigner, Route
from ._exceptions import (
    AiostreamError,
    ClosedResourceError,
    FetchError,
    FileChangedError,
    RangeMismatchError,
    RetriesExhaustedError,
    SourceError,
)
from ._models import FileRef
from ._options import StreamOptions
from ._retry import retry_after, retryable_status
from ._transport import READINTO
from ._versions import Version, normalize_etag

__all__ = ["ByteStream", "FetcherStatistics", "RangeFetcher", "coalesce_ranges"]

#: A span's bytes: as joined from pieces (bytes), or received in place into a buffer
#: of Arrow's memory pool (reused from span to span: no fresh pages to fault in and
#: zero for each, as a new bytearray would take).
Buffer: TypeAlias = bytes | pa.Buffer

REQUEST_KINDS = ("resolve", "range", "stream", "local")
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CDN_DENIED = frozenset({401, 403, 410})
_MAX_HOPS = 10
# Re-resolve a cached CDN URL this many seconds before its ``expires=``.
_EXPIRY_MARGIN_S = 1.0
_RETRYABLE_ERRORS = (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)
_CONNECT_ERRORS = (httpx2.ConnectError, httpx2.ConnectTimeout)
logger = logging.getLogger("aiostream_hf")
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)
_UNSATISFIED_RANGE = re.compile(r"^\s*bytes\s+\*/(\d+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class FetcherStatistics:
    """What a fetcher has done since it was created.

    requests: requests sent, by kind: "resolve" (to a file's own URL, to learn
        where it is served), "range" (range reads), "stream" (iter_bytes) and
        "local" (reads of file:// URLs, in worker threads).
    bytes_received: body bytes received (including bytes skipped or discarded).
    retries: requests repeated after a retryable failure (resumes included).
    throttled: 429 answers received.
    resumes: reads resumed from the last byte received after a cut body.
    re_resolutions: cached CDN URLs dropped (expired, or refused) and resolved again.
    in_flight / max_in_flight: requests holding a concurrency slot now / at the peak.
    stalls: bodies dropped (and resumed) for arriving slower than ``min_throughput``.
    unvalidated_files: files served with no ETag and no Last-Modified: a change to one
        of them while it is read cannot be detected.
    """

    requests: Mapping[str, int]
    bytes_received: int
    retries: int
    throttled: int
    resumes: int
    re_resolutions: int
    in_flight: int
    max_in_flight: int
    stalls: int = 0
    unvalidated_files: int = 0

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())


def coalesce_ranges(
    ranges: Sequence[tuple[int, int]], *, gap: int, max_size: int
) -> list[tuple[int, int]]:
    """The requests that cover ``ranges`` (start, end exclusive), sorted.

    Ranges that overlap, touch, or lie less than ``gap`` bytes apart become
    one request; a request longer than ``max_size`` is cut into parts of
    ``max_size`` (the last one shorter). Parts that would hold only gap
    bytes are left out. Empty ranges need no request.
    """
    if max_size <= 0:
        raise ValueError(f"max_size={max_size!r}: must be > 0")
    spans = sorted((s, e) for s, e in ranges if e > s)
    merged: list[list[int]] = []
    for s, e in spans:
        if merged and (s <= merged[-1][1] or s - merged[-1][1] < gap):
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    parts: list[tuple[int, int]] = []
    i = 0  # first span that may still overlap the next part (spans are sorted by start)
    for s, e in merged:
        p = s
        while p < e:
            q = min(e, p + max_size)
            while i < len(spans) and spans[i][1] <= p:
                i += 1
            if any(ss < q and se > p for ss, se in spans[i:] if ss < q):
                parts.append((p, q))
            p = q
    return parts


class RangeFetcher:
    """The HTTP range reader every decoder uses: one client, bounded concurrency.

    ``options`` sets concurrency, range sizes and retry patience. ``access`` (the
    stream's ``Access``, found once when it opened: ``find_access``) gives the token,
    sent as ``Authorization: Bearer`` to its endpoint's origin only; or pass ``token``
    and ``endpoint`` themselves (no token is looked up here; the endpoint defaults to
    ``HF_ENDPOINT`` as it is now). ``transport`` replaces the network
    (``httpx2.MockTransport`` in unit tests).

    Create one per event loop and close it (``async with`` or ``aclose()``);
    a closed fetcher raises ``ClosedResourceError``.
    """

    def __init__(
        self,
        options: StreamOptions | None = None,
        *,
        access: Access | None = None,
        token: str | None = None,
        endpoint: str | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
        client: HubClient | None = None,
    ) -> None:
        self.options = options if options is not None else StreamOptions()
        if access is None:
            # Explicit values only: a stream hands its readers the Access it found once
            # (``find_access``); the endpoint's default is HF_ENDPOINT as it is now.
            access = Access(
                default_endpoint() if endpoint is None else normalize_endpoint(endpoint),
                None if token is None else check_token(token),
            )
        elif token is not None or endpoint is not None:
            raise SourceError("RangeFetcher: pass access= or token=/endpoint=, not both")
        self.access = access
        self._token = access.token
        self._endpoint = access.endpoint
        self._hub_origin = origin(access.endpoint)
        n = self.options.max_concurrency
        if client is not None and transport is not None:
            raise SourceError("RangeFetcher: pass a client or a transport, not both")
        # The client is shared (its pool, host gates and CDN URL cache) when given;
        # else this fetcher makes its own and closes it.
        self._owns_client = client is None
        self._hub = (
            client if client is not None else HubClient(max_connections=n, transport=transport)
        )
        self._timeout = httpx2.Timeout(self.options.timeout)
        self._pacing = self.options.pacing()
        # CDN URLs are cached per token: a private file's signed URL, learned with a
        # token, is never handed to a reader without it.
        self._route_scope = hashlib.sha256((token or "").encode()).hexdigest()[:16]
        self._limiter = anyio.CapacityLimiter(n)
        self._closed = False
        # Transfers holding an open response, closed by aclose().
        self._open_transfers: set[_Transfer] = set()
        self._requests = dict.fromkeys(REQUEST_KINDS, 0)
        self._bytes_received = 0
        self._retries = 0
        self._throttled = 0
        self._resumes = 0
        self._re_resolutions = 0
        self._in_flight = 0
        self._max_in_flight = 0
        self._stalls = 0
        # The version of each file pinned at its first answer, by (file URL, direct):
        # a CDN may label a file otherwise than the Hub does, so each is pinned apart.
        self._versions: dict[tuple[str, bool], Version] = {}
        self._unvalidated = 0
        self._local_versions: dict[str, _LocalVersion] = {}
        self._s3: _s3.S3Context | None = None  # made at the first read of an S3 object

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> RangeFetcher:
        self._check_open()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close open streams and the HTTP client (shielded from cancellation)."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            try:
                for transfer in list(self._open_transfers):
                    await transfer.aclose()
            finally:
                if self._owns_client:
                    await self._hub.aclose()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError(
                "this RangeFetcher is closed: create a new one (one per event loop)"
            )
        self._hub.check_open()

    @property
    def client(self) -> HubClient:
        """The client this fetcher's requests go through."""
        return self._hub

    # -- public reads ----------------------------------------------------------------------

    async def read(self, file: FileRef, start: int, end: int) -> bytes:
        """The bytes ``start`` to ``end`` (exclusive) of ``file``: exactly those, or an error."""
        return (await self.read_ranges(file, [(start, end)]))[0]

    async def read_ranges(
        self,
        file: FileRef,
        ranges: Sequence[tuple[int, int]],
        *,
        part_size: int | None = None,
    ) -> list[bytes]:
        """One bytes per (start, end exclusive) range, in the order given.

        Ranges closer than ``options.coalesce_gap`` share a request; requests
        over ``options.max_range_size`` (``part_size``, when given) are split; all
        are fetched concurrently.
        """
        data = await self._read_spans(file, ranges, part_size=part_size, in_place=False)
        return cast(list[bytes], data)  # bytes: not received in place

    async def read_buffers(
        self, file: FileRef, ranges: Sequence[tuple[int, int]]
    ) -> list[memoryview]:
        """``read_ranges``, as read-only views: each request's body is received in place,
        into one buffer of its size (a socket read straight into it, without the GIL),
        never joined from pieces. For decoders that take any buffer (Parquet)."""
        data = await self._read_spans(file, ranges, part_size=None, in_place=True)
        return [memoryview(b) for b in data]

    async def read_pieces(
        self, file: FileRef, ranges: Sequence[tuple[int, int]]
    ) -> list[list[tuple[int, memoryview]]]:
        """``read_buffers``, each range as its one piece ``(start, view)`` (``ByteSource``)."""
        views = await self.read_buffers(file, ranges)
        return [[(start, view)] for (start, _), view in zip(ranges, views, strict=True)]

    async def _read_spans(
        self,
        file: FileRef,
        ranges: Sequence[tuple[int, int]],
        *,
        part_size: int | None,
        in_place: bool,
    ) -> list[bytes | bytearray | memoryview]:
        self._check_open()
        spans = [_check_range(file, s, e) for s, e in ranges]
        if not spans:
            return []
        path = _local_path(file.url)
        if path is not None:
            return list(await self._read_local(file, path, spans))
        max_size = self.options.max_range_size if part_size is None else part_size
        parts = coalesce_ranges(spans, gap=self.options.coalesce_gap, max_size=max_size)
        data = await self._fetch_parts(file, parts, in_place=in_place)
        if in_place:  # views: cut without a copy, read-only for the decoder
            return _assemble(spans, parts, [memoryview(b).toreadonly() for b in data])
        return _assemble(spans, parts, data)

    async def read_tail(
        self, file: FileRef, n: int, *, part_size: int | None = None
    ) -> tuple[bytes, int]:
        """The last ``n`` bytes of ``file`` (all of it if shorter) and its total size.

        With ``file.size`` known this is a plain range read; otherwise one
        suffix request (``Range: bytes=-n``) whose ``Content-Range`` gives the size.

        ``part_size``: the tail comes in concurrent parts of at most this many bytes,
        each over its own connection (a server that caps each connection's speed then
        serves them side by side). Without a known size, a redirect that tells the size
        (the Hub's ``X-Linked-Size``) ends the first request; the parts go to where it
        points, in the same round trip as the suffix read would have.
        """
        self._check_open()
        if n < 1:
            raise ValueError(f"read_tail(n={n!r}) of {file.url}: n must be >= 1")
        path = _local_path(file.url)
        if path is not None:
            self._requests["local"] += 1
            data, size, seen = await anyio.to_thread.run_sync(
                _pread_tail, file, path, n, limiter=self._limiter
            )
            self._check_local_version(file, seen)
            self._bytes_received += len(data)
            return data, size
        if file.size is not None:
            start = max(0, file.size - n)
            read = await self.read_ranges(file, [(start, file.size)], part_size=part_size)
            return read[0], file.size
        transfer = _Transfer(self, file, start=None, end=None, suffix=n, kind="range")
        transfer.stop_when_sized = part_size is not None and n > part_size
        data = await transfer.collect()
        if transfer.sized is not None:  # stopped at a redirect, which told the size
            sized = dataclasses.replace(file, size=transfer.sized)
            return await self.read_tail(sized, n, part_size=part_size)
        assert transfer.total is not None  # known once a suffix read succeeded
        return data, transfer.total

    def iter_bytes(
        self,
        file: FileRef,
        start: int = 0,
        end: int | None = None,
        *,
        block_size: int | None = None,
    ) -> ByteStream:
        """Blocks of ``file`` from ``start`` to ``end`` (default: its end), in order.

        One long GET; a body cut mid-way resumes from the last byte received
        (counted as a retry), so the blocks are one seamless byte stream. At
        most one block (``block_size``, default ``options.block_size``) is held.
        Use ``async with`` (or ``aclose()``) to release the request if you stop early.
        """
        self._check_open()
        size = file.size
        if end is None and size is not None:
            end = size
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"iter_bytes({start}, {end}) of {file.url}: need 0 <= start <= end")
        if size is not None and end is not None and end > size:
            raise ValueError(f"iter_bytes({start}, {end}) of {file.url}: the file has {size} bytes")
        block = self.options.block_size if block_size is None else block_size
        if block < 1:
            raise ValueError(f"iter_bytes(block_size={block!r}): must be >= 1")
        path = _local_path(file.url)
        source: _Chunks
        if path is not None:
            source = _LocalTransfer(self, file, path, start, end, block)
        else:
            source = _Transfer(self, file, start=start, end=end, kind="stream", chunk_size=block)
        return ByteStream(source)

    def statistics(self) -> FetcherStatistics:
        return FetcherStatistics(
            requests=dict(self._requests),  # a copy: dataclasses.asdict() works on it
            bytes_received=self._bytes_received,
            retries=self._retries,
            throttled=self._throttled,
            resumes=self._resumes,
            re_resolutions=self._re_resolutions,
            in_flight=self._in_flight,
            max_in_flight=self._max_in_flight,
            stalls=self._stalls,
            unvalidated_files=self._unvalidated,
        )

    # -- range reads -----------------------------------------------------------------------

    async def _fetch_parts(
        self, file: FileRef, parts: list[tuple[int, int]], *, in_place: bool = False
    ) -> list[Buffer]:
        results: list[Buffer] = [b""] * len(parts)
        if len(parts) == 1:
            s, e = parts[0]
            results[0] = await self._read_span(file, s, e, in_place=in_place)
            return results
        failures: list[AiostreamError] = []

        async def fetch(i: int, s: int, e: int) -> None:
            try:
                results[i] = await self._read_span(file, s, e, in_place=in_place)
            except AiostreamError as exc:
                failures.append(exc)
                tg.cancel_scope.cancel()  # the other parts are no use now

        async with anyio.create_task_group() as tg:
            for i, (s, e) in enumerate(parts):
                tg.start_soon(fetch, i, s, e)
        if failures:
            raise failures[0]
        return results

    async def _read_span(
        self, file: FileRef, start: int, end: int, *, in_place: bool = False
    ) -> Buffer:
        transfer = _Transfer(self, file, start=start, end=end, kind="range")
        data: Buffer
        if in_place:
            data = pa.allocate_buffer(end - start)  # the span was checked against the file
            await transfer.collect_into(data)
        else:
            data = await transfer.collect()
        if len(data) != end - start:  # the transfer checks as it goes; this is the contract
            raise RangeMismatchError(
                f"{file.url}: asked for bytes {start}-{end - 1}, got {len(data)} bytes",
                url=file.url,
            )
        return data

    async def _read_local(
        self, file: FileRef, path: str, spans: list[tuple[int, int]]
    ) -> list[bytes]:
        self._requests["local"] += 1
        data, seen = await anyio.to_thread.run_sync(
            _pread_ranges, file, path, spans, limiter=self._limiter
        )
        self._check_local_version(file, seen)
        self._bytes_received += sum(len(d) for d in data)
        return data

    def _check_local_version(self, file: FileRef, seen: _LocalVersion) -> None:
        """A local file is pinned at its first read by (device, inode, size, mtime):
        replaced or rewritten in place since, it is ``FileChangedError``."""
        pinned = self._local_versions.setdefault(file.url, seen)
        if pinned != seen:
            raise FileChangedError(
                f"{file.path}: the file changed while it was read (replaced, or written "
                f"since its first read: {_describe_local(pinned, seen)}); read it again "
                f"({file.url})",
                url=file.url,
            )

    # -- redirect cache and singleflight (plain synchronous state) -------------------------

    async def _route(self, transfer: _Transfer) -> Route | None:
        """Where to send ``transfer``'s next request; None: to the file's own URL (resolve)."""
        while True:
            found = self._route_nowait(transfer)
            if not isinstance(found, Pending):
                return found
            await found.done.wait()
            if isinstance(found.error, FetchError):
                raise _copy_error(found.error) from found.error

    def _route_key(self, transfer: _Transfer) -> str:
        return f"{self._route_scope}:{transfer.file.url}"

    def _route_nowait(self, transfer: _Transfer) -> Route | Pending | None:
        if transfer.leader:
            return None
        if _s3.is_s3(transfer.file):  # a listed object: its URL serves it, as listed
            return transfer.own_route or Route(transfer.file.url, direct=True)
        found, dropped = self._hub.route_nowait(self._route_key(transfer), transfer.own_route)
        if dropped:
            self._re_resolutions += 1
        if found is None:
            transfer.leader = True
        return found

    def _set_route(self, transfer: _Transfer, route: Route) -> None:
        self._hub.set_route(self._route_key(transfer), route, leader=transfer.leader)
        transfer.own_route = route
        transfer.leader = False

    def _invalidate(self, transfer: _Transfer, route: Route) -> None:
        if self._hub.invalidate(self._route_key(transfer), route):
            self._re_resolutions += 1
        transfer.own_route = None

    def _resolution_ended(self, transfer: _Transfer, error: FetchError | None) -> None:
        """The leader failed (error) or went away (None: a waiting read takes over)."""
        if not transfer.leader:
            return
        transfer.leader = False
        self._hub.resolution_ended(self._route_key(transfer), error)

    # -- concurrency slots, host pauses and rate-limit budgets -----------------------------

    async def _acquire(self, host: str, owner: _Transfer, url: str) -> None:
        """Wait until ``host`` may be sent a request to ``url`` (the client's gate and the
        rate-limit quota), then take a slot of this fetcher's and one of the client's."""
        if owner.wait_deadline is None:
            owner.wait_deadline = anyio.current_time() + self.options.max_rate_limit_wait
        await self._hub.acquire(
            host,
            owner,
            self._limiter,
            deadline=owner.wait_deadline,
            url=url,
            pacing=self._pacing,
            token=self._token if auth_headers(url, self._token, self._endpoint) else None,
        )
        self._in_flight += 1
        self._max_in_flight = max(self._max_in_flight, self._in_flight)

    def _release_slot(self, host: str, owner: _Transfer) -> None:
        self._in_flight -= 1
        self._hub.release(host, owner, self._limiter)

    def _note_response(self, host: str, owner: _Transfer, response: httpx2.Response) -> None:
        """The client learns the host's rate-limit state; a 429 pauses the host for all."""
        o = self.options
        if response.status_code == 429:
            self._throttled += 1
        self._hub.note_response(
            host,
            owner,
            response.headers,
            response.status_code,
            failures=owner.failures,
            backoff_base=o.backoff_base,
            backoff_max=o.backoff_max,
        )

    def _retry_delay(self, failures: int, server_delay: float | None) -> float:
        o = self.options
        return self._hub.retry_delay(
            failures,
            server_delay,
            base=o.backoff_base,
            cap=o.backoff_max,
            most=o.max_rate_limit_wait,
        )

    # -- requests --------------------------------------------------------------------------

    async def _signer(self, file: FileRef) -> RequestSigner | None:
        """What signs the requests for ``file``: the S3 context for a listed object."""
        if not _s3.is_s3(file):
            return None
        if self._s3 is None:
            self._s3 = await _s3.context(self.options, file.path)
        return self._s3

    def _headers(self, transfer: _Transfer, url: str, route: Route | None) -> dict[str, str]:
        headers = {"Range": transfer.range_header()}
        if route is not None:  # not resolving: the bytes come from this answer
            pinned = self._versions.get((transfer.file.url, route.direct))
            etag = transfer.file.etag
            # Once pinned, only a strong ETag can go in If-Match (it compares strongly):
            # a weak or missing one is checked against the pin instead.
            if pinned is not None:
                if_match = pinned.if_match()
            else:
                if_match = f'"{normalize_etag(etag)}"' if etag else None
            if if_match is not None:
                headers["If-Match"] = if_match
            if pinned is not None and transfer.opened_at is not None:  # a resume
                if_range = pinned.if_range()
                if if_range is not None:
                    headers["If-Range"] = if_range
        headers.update(auth_headers(url, self._token, self._endpoint))
        return headers

    def _check_version(self, transfer: _Transfer, seen: Version, *, direct: bool) -> None:
        """Pin the file's version at its first answer; later answers must show it."""
        file = transfer.file
        key = (file.url, direct)
        pinned = self._versions.get(key)
        if pinned is None:
            if direct and file.etag and seen.etag and seen.etag != normalize_etag(file.etag):
                raise transfer._changed(f"it is now served with {seen.describe()}")
            self._versions[key] = seen
            if not seen.validated:
                self._unvalidated += 1
                logger.warning(
                    "%s is served with no ETag and no Last-Modified: if it changes while "
                    "it is read, the change cannot be detected",
                    _display(transfer.last_url),
                )
            return
        why = pinned.differs(seen)
        if why is not None:
            raise transfer._changed(why)

    def _is_hub(self, url: str) -> bool:
        return origin(url) == self._hub_origin


# -- transfers ------------------------------------------------------------------------------


class _Chunks(Protocol):
    async def next_chunk(self) -> bytes | None: ...

    async def aclose(self) -> None: ...


class ByteStream:
    """An async iterator of blocks of one file (see ``RangeFetcher.iter_bytes``)."""

    def __init__(self, source: _Chunks) -> None:
        self._source = source
        self._done = False

    def __aiter__(self) -> ByteStream:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        chunk = await self._source.next_chunk()
        if chunk is None:
            await self.aclose()
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        self._done = True
        await self._source.aclose()

    async def __aenter__(self) -> ByteStream:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


@dataclass(frozen=True)
class _Retry:
    status: int | None
    delay: float | None  # the server's Retry-After, if any
    error: BaseException | None = None
    sleep: bool = True  # False for 429: the host pause is the wait


class _Stall(Exception):
    """A body that arrives slower than ``min_throughput``."""


class _Signal:
    def __init__(self, name: str) -> None:
        self.name = name


_FOLLOW = _Signal("follow")  # the answer named a new URL: send the request there
_RERESOLVE = _Signal("reresolve")  # the cached URL was refused: resolve again
_AT_EOF = _Signal("eof")  # 416 for a read to the end that starts at the end
_SIZED = _Signal("sized")  # a redirect told the size of a suffix read: stop there

_Outcome = _Retry | _Signal | None


class _Transfer:
    """One contiguous span of one file, read over as many responses as it takes.

    ``pos`` is the next byte wanted (None for a suffix read until the first
    answer), ``end`` the end (exclusive; None until known for reads to EOF).
    Holds a concurrency slot only while a response is open.
    """

    def __init__(
        self,
        fetcher: RangeFetcher,
        file: FileRef,
        *,
        start: int | None,
        end: int | None,
        kind: str,
        suffix: int | None = None,
        chunk_size: int | None = None,
    ) -> None:
        self.fetcher = fetcher
        self.file = file
        self.pos = start
        self.end = end
        self.suffix = suffix
        self.kind = kind
        self.chunk_size = chunk_size
        self.total = file.size
        self.failures = 0  # in a row, without progress
        self.last_status: int | None = None
        self.last_url = file.url
        self.leader = False
        self.own_route: Route | None = None
        self.reresolved = False
        self.skip = 0  # bytes of a 200 answer before the ones wanted
        self.exact = True  # a 206 body ends exactly at ``end``; a 200 body goes on
        self.response: httpx2.Response | None = None
        self.chunks: AsyncGenerator[bytes, None] | None = None
        self.pieces: list[bytes] = []  # the block being filled (iter_bytes), as received
        self.filled = 0  # bytes in ``pieces``
        self.slot_host: str | None = None
        self.opened_at: int | None = None
        # A rate-limited host is waited for until then, at the most (anyio clock; set
        # at the first request).
        self.wait_deadline: float | None = None
        # Throughput over the time spent waiting for the body (not for the consumer).
        self.waited = 0.0
        self.waited_bytes = 0
        self.stalled: _Stall | None = None
        self.stall_count = 0
        self.error_body = b""  # the start of an S3 error answer (its <Code>)
        self.into: memoryview | None = None  # collect_into's buffer, byte ``base`` first
        self.base = 0
        # A suffix read that ends at a redirect telling the file's size (X-Linked-Size),
        # which is then in ``sized``: its caller reads the tail knowing the size.
        self.stop_when_sized = False
        self.sized: int | None = None

    # -- reading ---------------------------------------------------------------------------

    async def collect(self) -> bytes:
        # The pieces joined once at the end: a growing buffer would reallocate as
        # it doubles and then be copied out, three times the bytes at the peak.
        pieces: list[bytes] = []
        try:
            while (chunk := await self.next_chunk()) is not None:
                pieces.append(chunk)
        finally:
            await self.aclose()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def collect_into(self, buffer: pa.Buffer) -> None:
        """Fill ``buffer`` with the span (``start`` to ``end``, exactly its size).

        A body the transport can read in place (``readinto``) is received straight
        into it; any other (a 200 whose head is skipped, a mock transport) is copied
        in piece by piece, at the piece's own offset.
        """
        assert self.pos is not None
        assert self.end is not None
        assert len(buffer) == self.end - self.pos
        self.into, self.base = memoryview(buffer), self.pos
        try:
            while (chunk := await self.next_chunk()) is not None:
                if not (isinstance(chunk, memoryview) and chunk.obj is buffer):
                    assert self.pos is not None
                    at = self.pos - len(chunk) - self.base
                    self.into[at : at + len(chunk)] = chunk
        finally:
            self.into = None
            await self.aclose()
        if self.pos != self.end:  # the buffer is not zeroed: never hand out a gap in it
            raise RangeMismatchError(
                f"{self.file.url}: bytes {self.base}-{self.end - 1} ended at {self.pos}",
                url=self.file.url,
            )

    async def next_chunk(self) -> bytes | None:
        """The next block (``chunk_size`` bytes, the last one shorter), None at the end.

        Without a ``chunk_size``, the pieces as they arrive. Bytes received
        before a cut stay in the block being filled, so a resume asks only
        for the bytes after them.
        """
        self.fetcher._check_open()
        try:
            if self.chunk_size is None:
                return await self._next_piece()
            while self.filled < self.chunk_size:
                piece = await self._next_piece()
                if piece is None:
                    break
                self.pieces.append(piece)
                self.filled += len(piece)
            if not self.filled:
                return None
            return self._take_block()
        except BaseException:
            await self.aclose()
            raise

    async def _received_in_place(
        self, readinto: Callable[[memoryview], Awaitable[int]], into: memoryview
    ) -> AsyncGenerator[bytes, None]:
        """The body, read into ``into`` at the byte it starts from: each piece a view
        of what one read put there. Ends when the span is full or the body ends."""
        while True:
            assert self.pos is not None  # _next_piece moves it past each piece we give
            at = self.pos - self.base
            if at >= len(into):
                return
            n = await readinto(into[at:])
            if not n:
                return
            yield into[at : at + n]  # type: ignore[misc]  # a view, read as bytes are

    def _take_block(self) -> bytes:
        """The first ``chunk_size`` bytes of the pieces (all, if fewer), in one copy."""
        assert self.chunk_size is not None
        pieces, self.pieces = self.pieces, []
        if self.filled <= self.chunk_size:
            self.filled = 0
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        over = self.filled - self.chunk_size  # the last piece runs past the block
        last = pieces[-1]
        cut = len(last) - over
        pieces[-1] = last[:cut]
        self.pieces, self.filled = [last[cut:]], over
        return b"".join(pieces)

    async def _next_piece(self) -> bytes | None:
        while True:
            if (
                self.pos is not None
                and self.end is not None
                and self.pos >= self.end
                and (self.response is None or not self.exact)
            ):
                await self.aclose()
                return None
            if self.stalled is not None:
                stall, self.stalled = self.stalled, None
                self.fetcher._stalls += 1
                self.stall_count += 1
                # Progress does not excuse a stall: stalls count on towards max_retries.
                self.failures = max(self.failures, self.stall_count - 1)
                await self.aclose()
                await self._body_failed(stall)
                continue
            if self.chunks is None:
                if await self._open() in (_AT_EOF, _SIZED):
                    return None
                continue
            try:
                began = anyio.current_time()
                chunk = await self.chunks.__anext__()
                self._note_wait(anyio.current_time() - began, len(chunk))
            except StopAsyncIteration:
                await self.aclose()
                assert self.pos is not None
                if self.end is None:  # read to EOF of a body of unknown length
                    self.end = self.pos
                    if self.total is None:
                        self.total = self.pos
                    return None
                if self.pos < self.end:
                    await self._body_failed(None)
                    continue
                return None
            except _RETRYABLE_ERRORS as exc:
                await self.aclose()
                await self._body_failed(exc)
                continue
            except httpx2.StreamError as exc:  # closed under us: by RangeFetcher.aclose()
                self.fetcher._check_open()
                raise FetchError(f"{self.file.url}: {exc}", url=self.file.url) from exc
            if not chunk:
                continue
            self.fetcher._bytes_received += len(chunk)
            if self.skip:
                if len(chunk) <= self.skip:
                    self.skip -= len(chunk)
                    continue
                chunk = chunk[self.skip :]
                self.skip = 0
            assert self.pos is not None
            if self.end is not None and self.pos + len(chunk) > self.end:
                if self.exact:
                    raise RangeMismatchError(
                        f"{self.file.url}: the answer for bytes up to {self.end - 1} "
                        f"ran past them (server: {_display(self.last_url)})",
                        url=self.file.url,
                    )
                chunk = chunk[: self.end - self.pos]
            self.pos += len(chunk)
            self.failures = 0  # progress: failures count again from zero
            self.reresolved = False
            return chunk

    def _note_wait(self, seconds: float, n: int) -> None:
        """Count a chunk's wait; past each ``timeout`` seconds of waiting, a body slower
        than ``min_throughput`` is marked stalled (dropped and resumed at the next read)."""
        o = self.fetcher.options
        self.waited += seconds
        self.waited_bytes += n
        if o.min_throughput <= 0 or self.waited < o.timeout:
            return
        if self.waited_bytes < o.min_throughput * self.waited:
            self.stalled = _Stall(
                f"{self.waited_bytes} bytes in {self.waited:.0f} s from "
                f"{_display(self.last_url)}, under StreamOptions.min_throughput="
                f"{o.min_throughput:g} bytes/s"
            )
        self.waited, self.waited_bytes = 0.0, 0

    async def _body_failed(self, exc: BaseException | None) -> None:
        """A body ended early or broke: resume from ``pos`` (a retry), or give up."""
        if self.opened_at is not None and self.pos is not None and self.pos > self.opened_at:
            self.fetcher._resumes += 1
        await self._failed(_Retry(None, None, exc))

    async def _failed(self, retry: _Retry) -> None:
        self.failures += 1
        if retry.status is not None:
            self.last_status = retry.status
        if self.failures > self.fetcher.options.max_retries:
            if retry.status is not None:
                what = f"HTTP {retry.status}"
            elif retry.error is not None:
                what = f"{type(retry.error).__name__}: {retry.error}"
                if self.last_status is not None:
                    what += f" (last HTTP status {self.last_status})"
            else:
                what = "the body ended early"
            raise RetriesExhaustedError(
                f"{self.file.url}: gave up after {self.failures} attempts; "
                f"last: {what} from {_display(self.last_url)}",
                url=self.file.url,
                status=self.last_status,
                attempts=self.failures,
            ) from retry.error
        self.fetcher._retries += 1
        delay = self.fetcher._retry_delay(self.failures, retry.delay) if retry.sleep else 0.0
        if retry.status != 429:  # a 429's wait is the host's pause, logged with it
            self.fetcher.client.note_retry(
                self.last_url,
                _failure(retry),
                self.failures,
                self.fetcher.options.max_retries,
                delay,
            )
        if delay > 0:
            await anyio.sleep(delay)

    def range_header(self) -> str:
        if self.pos is None:
            return f"bytes=-{self.suffix}"
        if self.end is None:
            return f"bytes={self.pos}-"
        return f"bytes={self.pos}-{self.end - 1}"

    # -- opening a response ----------------------------------------------------------------

    async def _open(self) -> _Signal | None:
        try:
            return await self._open_response()
        except FetchError as exc:
            self.fetcher._resolution_ended(self, exc)  # readers waiting on us get it too
            raise
        finally:
            self.fetcher._resolution_ended(self, None)  # cancelled: a waiting read takes over

    async def _open_response(self) -> _Signal | None:
        f = self.fetcher
        hops = 0
        signer = await f._signer(self.file)
        while True:
            f._check_open()
            route = await f._route(self)
            f._check_open()  # closed while we waited for another read's resolution
            url = self.file.url if route is None else route.url
            f.access.check_online(url)
            host = _host_key(url, self.file)
            headers = f._headers(self, url, route)
            await f._acquire(host, self, url)
            self.slot_host = host
            self.last_url = url
            response: httpx2.Response | None = None
            outcome: _Outcome
            try:
                f._check_open()  # closed while we waited for a slot
                f._requests["resolve" if route is None else self.kind] += 1
                try:
                    request = f._hub.http.build_request(
                        "GET", url, headers=headers, timeout=f._timeout
                    )
                    response = await f._hub.send(request, stream=True, signer=signer)
                except _RETRYABLE_ERRORS as exc:
                    quick = None
                    # A host we were sent to by a redirect (a CDN) exists: its refusals
                    # get the usual retries. The file's own host, never reached, fails fast.
                    first_hand = route is None or route.direct
                    if first_hand and isinstance(exc, _CONNECT_ERRORS):
                        quick = f._hub.connect_failed(host, _display(url), exc, self.failures + 1)
                    outcome = _Retry(None, quick or None, exc)
                except httpx2.HTTPError as exc:
                    raise FetchError(
                        f"{self.file.url}: cannot request {_display(url)}: {exc}",
                        url=self.file.url,
                    ) from exc
                else:
                    f._note_response(host, self, response)
                    if signer is not None and response.status_code in (400, 401, 403):
                        self.error_body = await _s3.error_body(response)
                    outcome = self._accept(response, route, url)
            except BaseException:
                await self._drop(response)
                raise
            if outcome is None:
                assert response is not None
                self.response = response
                in_place = response.extensions.get(READINTO)
                if self.into is not None and in_place is not None and self.exact and not self.skip:
                    self.chunks = self._received_in_place(in_place, self.into)
                else:
                    self.chunks = response.aiter_bytes()  # identity-encoded: as sent
                self.opened_at = self.pos
                f._open_transfers.add(self)
                return None
            await self._drop(response)
            if isinstance(outcome, _Retry):
                await self._failed(outcome)
            elif outcome is _FOLLOW:
                hops += 1
                if hops > _MAX_HOPS:
                    raise FetchError(
                        f"{self.file.url}: more than {_MAX_HOPS} redirects", url=self.file.url
                    )
            elif outcome is _AT_EOF:
                return _AT_EOF
            if self.sized is not None:
                return _SIZED
            # _RERESOLVE: the next turn resolves again

    def _accept(self, response: httpx2.Response, route: Route | None, url: str) -> _Outcome:
        """Judge an answer (headers only): None if its body is the bytes wanted."""
        f = self.fetcher
        file = self.file
        status = response.status_code
        headers = response.headers
        if status in _REDIRECTS:
            location = headers.get("Location")
            if not location:
                raise FetchError(
                    f"{file.url}: HTTP {status} without a Location from {_display(url)}",
                    url=file.url,
                    status=status,
                )
            if route is None or f._is_hub(url):
                self._check_linked(headers)
                size = headers.get("X-Linked-Size", "")
                if self.stop_when_sized and self.pos is None and size.isdigit() and int(size):
                    self.sized = int(size)
            target = str(response.url.join(location))
            f._set_route(self, Route(target, direct=False, reuse_until=_reuse_until(target)))
            return _FOLLOW
        if status in (200, 206):
            direct = route is None or route.direct
            if route is None:
                f._set_route(self, Route(file.url, direct=True))
            f._check_version(
                self, Version.of(headers, _answer_size(status, headers)), direct=direct
            )
            encoding = headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise RangeMismatchError(
                    f"{file.url}: {_display(url)} sent a {encoding}-encoded body "
                    "to a range request (asked for identity)",
                    url=file.url,
                    status=status,
                )
            if status == 206:
                self._accept_partial(headers, url)
            else:
                self._accept_whole(headers, url)
            return None
        if status == 412:
            raise self._changed(f"{_display(url)} answered 412 to If-Match", status=412)
        if status in _CDN_DENIED and route is not None and not route.direct:
            if not self.reresolved:
                self.reresolved = True
                f._invalidate(self, route)
                return _RERESOLVE
            raise FetchError(
                f"{file.url}: HTTP {status} from {_display(url)} even after resolving the "
                "file again (the signed URL is refused)",
                url=file.url,
                status=status,
            )
        if retryable_status(status):
            delay = retry_after(headers.get("Retry-After"))
            return _Retry(status, delay, sleep=status != 429)
        if status == 416:
            m = _UNSATISFIED_RANGE.match(headers.get("Content-Range", ""))
            if m is not None and self.end is None and self.pos == int(m.group(1)):
                self.end = self.total = self.pos  # a read to the end, from the end
                return _AT_EOF
            size = f"the file has {m.group(1)} bytes" if m else "no size given"
            raise FetchError(
                f"{file.url}: range {self.range_header()} not satisfiable ({size})",
                url=file.url,
                status=416,
            )
        raise self._http_error(status, headers, url, route)

    def _accept_partial(self, headers: httpx2.Headers, url: str) -> None:
        file = self.file
        m = _CONTENT_RANGE.match(headers.get("Content-Range", ""))
        if m is None:
            raise RangeMismatchError(
                f"{file.url}: 206 without a valid Content-Range "
                f"({headers.get('Content-Range')!r}) from {_display(url)}",
                url=file.url,
                status=206,
            )
        first, last = int(m.group(1)), int(m.group(2))
        total = None if m.group(3) == "*" else int(m.group(3))
        if total is not None:
            if self.total is not None and total != self.total:
                raise RangeMismatchError(
                    f"{file.url}: Content-Range says the file has {total} bytes, "
                    f"expected {self.total} (from {_display(url)})",
                    url=file.url,
                    status=206,
                )
            self.total = total
        if self.pos is None:  # a suffix read: the size comes with the answer
            if total is None:
                raise RangeMismatchError(
                    f"{file.url}: the answer to {self.range_header()} gave no total size",
                    url=file.url,
                    status=206,
                )
            assert self.suffix is not None
            self.pos, self.end = max(0, total - self.suffix), total
        elif self.end is None:  # a read to the end
            if total is not None:
                self.end = total
            elif first == self.pos:
                self.end = last + 1
        expected = (self.pos, self.end)
        if (first, last + 1) != expected:
            raise RangeMismatchError(
                f"{file.url}: asked for bytes {self.pos}-{(self.end or 0) - 1}, "
                f"got {first}-{last} from {_display(url)}",
                url=file.url,
                status=206,
            )
        length = _content_length(headers)
        if length is not None and length != last + 1 - first:
            raise RangeMismatchError(
                f"{file.url}: Content-Range {first}-{last} with Content-Length {length} "
                f"from {_display(url)}",
                url=file.url,
                status=206,
            )
        self.skip, self.exact = 0, True

    def _accept_whole(self, headers: httpx2.Headers, url: str) -> None:
        """A 200 to a range request: the whole file. Use it if it is not much more than asked."""
        file = self.file
        length = _content_length(headers)
        if length is not None:
            if self.total is not None and length != self.total:
                raise RangeMismatchError(
                    f"{file.url}: {_display(url)} sent the whole file ({length} bytes) "
                    f"but it has {self.total}",
                    url=file.url,
                    status=200,
                )
            self.total = length
        total = self.total
        if self.pos is None:
            if total is None:
                raise RangeMismatchError(
                    f"{file.url}: {_display(url)} ignored {self.range_header()} and gave no size",
                    url=file.url,
                    status=200,
                )
            assert self.suffix is not None
            self.pos, self.end = max(0, total - self.suffix), total
        if self.end is None and total is not None:
            self.end = total
        if total is None:
            if self.pos != 0:
                raise RangeMismatchError(
                    f"{file.url}: {_display(url)} ignored {self.range_header()} "
                    "(answered 200 of unknown length)",
                    url=file.url,
                    status=200,
                )
        else:
            assert self.end is not None
            wanted = self.end - self.pos
            if total > 2 * wanted:
                raise RangeMismatchError(
                    f"{file.url}: {_display(url)} ignored {self.range_header()} and answered "
                    f"200 with the whole file ({total} bytes for {wanted} asked): "
                    "not downloading it",
                    url=file.url,
                    status=200,
                )
        self.skip, self.exact = self.pos, False

    def _check_linked(self, headers: httpx2.Headers) -> None:
        file = self.file
        linked = headers.get("X-Linked-Etag") or headers.get("ETag")
        if linked and file.etag and normalize_etag(linked) != normalize_etag(file.etag):
            raise self._changed(f"the Hub now links it to etag {linked}")
        size = headers.get("X-Linked-Size")
        if size and size.isdigit() and file.size is not None and int(size) != file.size:
            raise self._changed(f"the Hub now says it has {size} bytes, not {file.size}")

    def _changed(self, why: str, status: int | None = None) -> FileChangedError:
        expected = f" (expected etag {self.file.etag})" if self.file.etag else ""
        return FileChangedError(
            f"{self.file.path}: the file changed while it was read{expected}: {why}; "
            f"resolve the source again ({self.file.url})",
            url=self.file.url,
            status=status,
            attempts=self.failures + 1,
        )

    def _http_error(
        self, status: int, headers: httpx2.Headers, url: str, route: Route | None
    ) -> FetchError:
        file = self.file
        code = headers.get("X-Error-Code")
        detail = headers.get("X-Error-Message")
        note = f" ({': '.join(x for x in (code, detail) if x)})" if code or detail else ""
        where = file.url if url == file.url else f"{file.url} (served by {_display(url)})"
        if status == 404 and route is not None and route.direct:
            return self._changed(f"{where} answered 404{note}: it was removed", status=404)
        if _s3.is_s3(file):
            ctx, attempts = self.fetcher._s3, self.failures + 1
            return _s3.read_error(ctx, file, status, self.error_body, attempts)
        if status == 404:
            message = f"{file.path}: not found: HTTP 404 from {where}{note}"
        elif status in (401, 403) and self.fetcher._is_hub(url):
            access = self.fetcher.access
            fix = (
                f"the token (from {access.token_source or 'token='}) cannot read it: "
                "request access to the repo or use another token"
                if access.token
                else "no token was sent: pass token=, set HF_TOKEN or log in with "
                "`hf auth login`, with a token that can read the repo"
            )
            message = f"{file.path}: HTTP {status} from {where}{note}: {fix}"
        elif status in (401, 403) and url == file.url and self.fetcher._token:
            hub = "://".join(self.fetcher._hub_origin[:2])
            message = (
                f"{file.path}: HTTP {status} from {where}{note}: the token is sent only to "
                f"the Hub endpoint {hub}; pass endpoint= if this file's Hub is another one"
            )
        else:
            message = f"{file.path}: HTTP {status} from {where}{note}"
        return FetchError(message, url=file.url, status=status, attempts=self.failures + 1)

    async def _drop(self, response: httpx2.Response | None) -> None:
        """Close a response that is not used and give back the slot (shielded)."""
        with anyio.CancelScope(shield=True):
            try:
                if response is not None:
                    with contextlib.suppress(httpx2.HTTPError):
                        await response.aclose()
            finally:
                self._release()

    def _release(self) -> None:
        if self.slot_host is not None:
            host, self.slot_host = self.slot_host, None
            self.fetcher._release_slot(host, self)

    async def aclose(self) -> None:
        """Close the open response, if any, and give back its slot (shielded)."""
        chunks, response = self.chunks, self.response
        self.chunks = self.response = None
        self.fetcher._open_transfers.discard(self)
        with anyio.CancelScope(shield=True):
            try:
                with contextlib.suppress(httpx2.HTTPError, httpx2.StreamError):
                    if chunks is not None:
                        await chunks.aclose()
                    if response is not None:
                        await response.aclose()
            finally:
                self._release()


class _LocalTransfer:
    """Blocks of a local file, each read with os.pread in a worker thread."""

    def __init__(
        self,
        fetcher: RangeFetcher,
        file: FileRef,
        path: str,
        start: int,
        end: int | None,
        block: int,
    ) -> None:
        self.fetcher = fetcher
        self.file = file
        self.path = path
        self.pos = start
        self.end = end
        self.block = block

    async def next_chunk(self) -> bytes | None:
        f = self.fetcher
        f._check_open()
        if self.end is not None and self.pos >= self.end:
            return None
        f._requests["local"] += 1
        stop = None if self.end is None else min(self.end, self.pos + self.block)
        data, size, seen = await anyio.to_thread.run_sync(
            _pread_block, self.file, self.path, self.pos, stop, self.block, limiter=f._limiter
        )
        f._check_local_version(self.file, seen)
        if self.end is None:
            self.end = size
        if not data:
            return None
        f._bytes_received += len(data)
        self.pos += len(data)
        return data

    async def aclose(self) -> None:
        self.end = self.pos


# -- local files (run in worker threads) ----------------------------------------------------


def _local_path(url: str) -> str | None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "file":
        return None
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"{url}: file:// URLs on another host are not supported")
    return urllib.request.url2pathname(parts.path)


def _open_local(file: FileRef, path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise FetchError(
            f"{file.path}: not found: no file at {path} ({file.url})", url=file.url
        ) from exc
    except OSError as exc:
        raise FetchError(f"{file.path}: cannot open {path}: {exc.strerror}", url=file.url) from exc
    return fd


_LocalVersion = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


def _local_size(file: FileRef, fd: int) -> tuple[int, _LocalVersion]:
    st = os.fstat(fd)
    size = st.st_size
    if file.size is not None and size != file.size:
        raise FileChangedError(
            f"{file.path}: the file changed: it has {size} bytes, "
            f"expected {file.size} ({file.url})",
            url=file.url,
        )
    return size, (st.st_dev, st.st_ino, size, st.st_mtime_ns)


def _describe_local(pinned: _LocalVersion, seen: _LocalVersion) -> str:
    if pinned[:2] != seen[:2]:
        return "another file is at its path now"
    if pinned[2] != seen[2]:
        return f"its size went from {pinned[2]} to {seen[2]} bytes"
    return "its modification time changed"


def _pread_exact(file: FileRef, fd: int, start: int, end: int) -> bytes:
    parts: list[bytes] = []
    pos = start
    while pos < end:
        chunk = os.pread(fd, end - pos, pos)
        if not chunk:
            raise FileChangedError(
                f"{file.path}: the file ended at byte {pos}, before {end} ({file.url})",
                url=file.url,
            )
        parts.append(chunk)
        pos += len(chunk)
    return b"".join(parts)


def _pread_ranges(
    file: FileRef, path: str, spans: list[tuple[int, int]]
) -> tuple[list[bytes], _LocalVersion]:
    fd = _open_local(file, path)
    try:
        size, version = _local_size(file, fd)
        for s, e in spans:
            if e > size:
                raise FetchError(
                    f"{file.path}: bytes {s}-{e - 1} asked, the file has {size} ({file.url})",
                    url=file.url,
                )
        return [_pread_exact(file, fd, s, e) for s, e in spans], version
    finally:
        os.close(fd)


def _pread_tail(file: FileRef, path: str, n: int) -> tuple[bytes, int, _LocalVersion]:
    fd = _open_local(file, path)
    try:
        size, version = _local_size(file, fd)
        return _pread_exact(file, fd, max(0, size - n), size), size, version
    finally:
        os.close(fd)


def _pread_block(
    file: FileRef, path: str, start: int, stop: int | None, block: int
) -> tuple[bytes, int, _LocalVersion]:
    fd = _open_local(file, path)
    try:
        size, version = _local_size(file, fd)
        end = min(size, start + block) if stop is None else stop
        if end > size:
            raise FileChangedError(
                f"{file.path}: the file has {size} bytes, fewer than the {end} wanted ({file.url})",
                url=file.url,
            )
        return _pread_exact(file, fd, start, end), size, version
    finally:
        os.close(fd)


# -- small pure helpers ---------------------------------------------------------------------


def _check_range(file: FileRef, start: int, end: int) -> tuple[int, int]:
    if start < 0 or end < start:
        raise ValueError(f"range ({start}, {end}) of {file.url}: need 0 <= start <= end")
    if file.size is not None and end > file.size:
        raise ValueError(
            f"range ({start}, {end}) of {file.url}: past the end of the file ({file.size} bytes)"
        )
    return start, end


def _assemble(
    spans: list[tuple[int, int]],
    parts: list[tuple[int, int]],
    data: Sequence[bytes | bytearray | memoryview],
) -> list[bytes | bytearray | memoryview]:
    """Cut each asked range out of the fetched parts (sorted, disjoint): slices of
    ``data`` (views of memoryviews), joined where a range spans two parts."""
    import bisect

    starts = [p[0] for p in parts]
    out: list[bytes | bytearray | memoryview] = []
    for s, e in spans:
        if s == e:
            out.append(b"")
            continue
        j = max(0, bisect.bisect_right(starts, s) - 1)
        pieces: list[bytes | bytearray | memoryview] = []
        pos = s
        while pos < e:
            ps, pe = parts[j]
            if not ps <= pos < pe:  # parts cover every asked byte; this is the contract
                raise AssertionError(f"byte {pos} is in no part of {parts}")
            stop = min(e, pe)
            pieces.append(data[j][pos - ps : stop - ps])
            pos = stop
            j += 1
        out.append(pieces[0] if len(pieces) == 1 else b"".join(pieces))
    return out


def _failure(retry: _Retry) -> str:
    """What went wrong, for a retry's log line."""
    if retry.status is not None:
        return f"HTTP {retry.status}"
    if retry.error is not None:
        return (
            f"{type(retry.error).__name__}: {retry.error}"
            if str(retry.error)
            else (type(retry.error).__name__)
        )
    return "the body ended early"


def _copy_error(exc: FetchError) -> FetchError:
    """The same error for another waiting reader (an exception is raised in one task only)."""
    return type(exc)(str(exc), url=exc.url, status=exc.status, attempts=exc.attempts)


def _host_key(url: str, file: FileRef) -> str:
    try:
        scheme, host, port = origin(url)
    except httpx2.InvalidURL as exc:
        raise FetchError(f"{file.url}: invalid URL {url!r}: {exc}", url=file.url) from exc
    if scheme not in ("http", "https"):
        raise FetchError(f"{file.url}: cannot read {scheme}:// URLs", url=file.url)
    return f"{host}:{port}"


def _display(url: str) -> str:
    """A URL for messages: without its query (signed CDN URLs carry credentials there)."""
    parts = urllib.parse.urlsplit(url)
    return parts._replace(query="", fragment="").geturl() if parts.query else url


def _content_length(headers: httpx2.Headers) -> int | None:
    value = headers.get("Content-Length")
    return int(value) if value is not None and value.strip().isdigit() else None


def _answer_size(status: int, headers: httpx2.Headers) -> int | None:
    """The whole file's size as a 200 or 206 answer gives it, if it does."""
    if status == 200:
        return _content_length(headers)
    m = _CONTENT_RANGE.match(headers.get("Content-Range", ""))
    return int(m.group(3)) if m is not None and m.group(3) != "*" else None


def _expiry(url: str) -> float | None:
    """The wall-clock expiry in ``expires=`` / ``Expires=`` of a signed URL, if any."""
    query = urllib.parse.urlsplit(url).query
    for key, value in urllib.parse.parse_qsl(query):
        if key.lower() == "expires":
            try:
                return float(value)
            except ValueError:
                return None
    return None


def _reuse_until(url: str) -> float | None:
    """When to stop using a signed URL: a little before its expiry, if it says one.

    The margin is at most half the lifetime left, so that short-lived URLs
    are still used before they are resolved again.
    """
    expires = _expiry(url)
    if expires is None:
        return None
    left = max(0.0, expires - time.time())
    return expires - min(_EXPIRY_MARGIN_S, left / 2)
