"""RangeFetcher: bounded-concurrency HTTP range reads with redirects, retries and checks.

Every decoder reads bytes through one ``RangeFetcher`` per event loop::

    async with RangeFetcher(options, token=token, endpoint=endpoint) as fetcher:
        footer, size = await fetcher.read_tail(file, 64 * 1024)
        chunks = await fetcher.read_ranges(file, [(0, 100), (4096, 8192)])
        async with fetcher.iter_bytes(file) as blocks:
            async for block in blocks:
                ...

How a read travels (each span is one ``_transfer._Transfer``: its resolution,
retries, resumes, stalls and checks of each answer are told there; ``file://``
URLs are read by ``stores.local``):

- Concurrency. An ``anyio.CapacityLimiter(max_concurrency)`` is held by every
  request from send to the end of its body. ``read_ranges`` merges ranges
  closer than ``coalesce_gap`` and splits requests over ``max_range_size``
  into parts fetched concurrently.
- One version per file. The first answer for a file pins its version (``_versions``:
  ETag, else Last-Modified, and size; for Hub files served directly, the manifest's
  etag). Every later answer for it, to any request of this fetcher, must show the
  same version, else ``FileChangedError``: never a silent mix of two versions, even
  from a server that ignores ``If-Match``. ``If-Match`` (the pinned strong ETag, else
  the manifest's) goes with every read from a resolved URL, and a resume asks
  ``If-Range`` with the pinned validator. A server that gives no validator at all is
  counted (``unvalidated_files``) and logged: its changes cannot be seen.
- Tokens go to the Hub's host only, never to the CDN.
- ``read_buffers`` receives each body in place (``_transport.READINTO``): one buffer
  of Arrow's memory pool per request, written by the socket reads themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, TypeAlias, cast

import anyio
import anyio.to_thread
import httpx2
import pyarrow as pa

from . import stores
from ._access import Access, auth_headers, check_token, default_endpoint, normalize_endpoint, origin
from ._byte_cache import ByteCache
from ._client import HubClient, Pending, RequestSigner, Route, use_client
from ._exceptions import (
    AiostreamError,
    ClosedResourceError,
    FetchError,
    FileChangedError,
    RangeMismatchError,
    SourceError,
)
from ._exceptions import display_url as _display
from ._models import FileRef
from ._options import StreamOptions
from ._stalls import network as stage_network
from ._transfer import _Transfer
from ._versions import Version, normalize_etag
from .stores.local import (
    _describe_local,
    _local_path,
    _LocalTransfer,
    _LocalVersion,
    _pread_ranges,
    _pread_tail,
)

__all__ = ["ByteStream", "FetcherStatistics", "RangeFetcher", "coalesce_ranges"]

#: A span's bytes: as joined from pieces (bytes), or received in place into a buffer
#: of Arrow's memory pool (reused from span to span: no fresh pages to fault in and
#: zero for each, as a new bytearray would take).
Buffer: TypeAlias = bytes | pa.Buffer

REQUEST_KINDS = ("resolve", "range", "stream", "local")
logger = logging.getLogger("aiostream_hf")


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
    byte_cache: the byte cache's statistics (``ByteCacheStatistics``: blocks hit,
        fetched, waited for, damaged, evicted), empty when it is off.
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
    byte_cache: Mapping[str, int] = dataclasses.field(default_factory=dict)

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
        # The client is shared (its pool, host gates and CDN URL cache): the one given,
        # else the event loop's (taken by ``async with``); a test's ``transport`` gets a
        # client of its own, closed with this fetcher.
        self._owns_client = transport is not None
        self._client: HubClient | None = (
            HubClient(max_connections=n, transport=transport) if transport is not None else client
        )
        self._shared: contextlib.AbstractAsyncContextManager[HubClient] | None = None
        self._timeout = httpx2.Timeout(self.options.timeout)
        self._pacing = self.options.pacing()
        # CDN URLs (and the byte cache's blocks and entries) are kept per token: a private
        # file's signed URL or bytes, had with a token, are never handed to a reader
        # without it. The access's token: ``token=`` is None when ``access=`` is given.
        self._route_scope = hashlib.sha256(
            (self._token or "").encode("utf-8", "surrogatepass")
        ).hexdigest()[:16]
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
        # The store contexts (where a bucket store is, who we are there: the signer of
        # its requests), by scheme, made at the first read of one of its objects.
        self._store_contexts: dict[str, RequestSigner] = {}
        o = self.options
        self._byte_cache = (
            ByteCache(o.resolved_byte_cache_dir(), o.byte_cache_bytes, lock_timeout=o.timeout)
            if o.byte_cache_bytes
            else None
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> RangeFetcher:
        if self._closed:
            self._check_open()
        if self._client is None:  # the event loop's shared client (``use_client``)
            self._shared = use_client()
            self._client = await self._shared.__aenter__()
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
                if self._owns_client and self._client is not None:
                    await self._client.aclose()
                shared, self._shared = self._shared, None
                if shared is not None:
                    await shared.__aexit__(None, None, None)

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

    @property
    def _hub(self) -> HubClient:
        if self._client is None:
            raise ClosedResourceError(
                "this RangeFetcher has no client: use it as `async with RangeFetcher(...) as "
                "fetcher` (it takes the event loop's shared client), or pass client="
            )
        return self._client

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
        keep: bool = True,
    ) -> list[bytes]:
        """One bytes per (start, end exclusive) range, in the order given.

        Ranges closer than ``options.coalesce_gap`` share a request; requests
        over ``options.max_range_size`` (``part_size``, when given) are split; all
        are fetched concurrently. ``keep=False``: not through the byte cache (bytes
        that something derived from them is kept for instead: a video's index).
        """
        data = await self._read_spans(file, ranges, part_size=part_size, in_place=False, keep=keep)
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
        keep: bool = True,
    ) -> list[bytes | bytearray | memoryview]:
        self._check_open()
        spans = [_check_range(file, s, e) for s, e in ranges]
        if not spans:
            return []
        path = _local_path(file.url)
        if path is not None:
            with stage_network():
                local = await self._read_local(file, path, spans, in_place=in_place)
            if in_place:  # read-only bytes for the decoder, as the HTTP reads below
                return [memoryview(b).toreadonly().cast("B") for b in local]
            return list(local)
        max_size = self.options.max_range_size if part_size is None else part_size
        if keep and self._caches(file):
            kept = await self._cached_read(file, spans, max_size)
            if in_place:  # views of the blocks, read-only for the decoder
                return [memoryview(b).toreadonly() for b in kept]
            return [b if isinstance(b, bytes) else bytes(b) for b in kept]
        parts = coalesce_ranges(spans, gap=self.options.coalesce_gap, max_size=max_size)
        with stage_network():
            data = await self._fetch_parts(file, parts, in_place=in_place)
        if in_place:  # views: cut without a copy, read-only bytes for the decoder
            return _assemble(spans, parts, [memoryview(b).toreadonly().cast("B") for b in data])
        return _assemble(spans, parts, data)

    def caches(self, file: FileRef) -> bool:
        """Whether ``file``'s bytes go through the byte cache (``ByteCache.holds``)."""
        return self._byte_cache is not None and self._byte_cache.holds(file)

    _caches = caches

    # -- entries of the byte cache's store, and routes (``_video_index_cache``) -------------

    async def read_entry(self, file: FileRef, what: str) -> bytes | None:
        """The byte cache's entry ``what`` of ``file`` for this fetcher's credentials
        (``ByteCache.read_entry``); None without one (or without a byte cache)."""
        if self._byte_cache is None or not self._byte_cache.holds(file):
            return None
        return await self._byte_cache.read_entry(file, await self._cache_scope(file), what)

    async def write_entry(self, file: FileRef, what: str, payload: bytes) -> bool:
        """Keep ``payload`` as the entry ``what`` of ``file`` (``ByteCache.write_entry``)."""
        if self._byte_cache is None or not self._byte_cache.holds(file):
            return False
        return await self._byte_cache.write_entry(
            file, await self._cache_scope(file), what, payload
        )

    async def drop_entry(self, file: FileRef, what: str, why: str) -> None:
        """Delete the entry ``what`` of ``file``: it did not decode (``why``)."""
        if self._byte_cache is not None and self._byte_cache.holds(file):
            await self._byte_cache.drop_entry(file, await self._cache_scope(file), what, why)

    def known_route(self, file: FileRef) -> tuple[str, float | None] | None:
        """Where ``file``'s bytes are read now, when a redirect sent them elsewhere (its
        CDN URL, and until when it is used), else None."""
        found = self._hub.route_of(self._route_key_of(file))
        if found is None or found.direct or found.expired(time.time()):
            return None
        return found.url, found.reuse_until

    def learn_route(self, file: FileRef, url: str, reuse_until: float | None) -> None:
        """Read ``file`` from ``url`` (its CDN URL, kept from an earlier process) until
        ``reuse_until``, unless a route is known already. A refused one is resolved again."""
        key = self._route_key_of(file)
        if self._hub.route_of(key) is None:
            route = Route(url, direct=False, reuse_until=reuse_until)
            self._hub.set_route(key, route, leader=False)

    async def _cached_read(
        self, file: FileRef, spans: Sequence[tuple[int, int]], max_size: int
    ) -> list[bytes | memoryview]:
        """``spans`` of ``file`` through the byte cache: its blocks on disk, the others
        fetched (whole blocks) and kept."""
        assert self._byte_cache is not None
        with stage_network():
            return await self._byte_cache.read(
                file,
                await self._cache_scope(file),
                spans,
                # Received in place (a socket read straight into the buffer, off the
                # event loop), not joined from pieces on it.
                functools.partial(self._fetch_parts, file, in_place=True),
                max_request=max_size,
            )

    async def _cache_scope(self, file: FileRef) -> str:
        """Whose credentials read ``file``, for the byte cache's keys: the Hub token's
        hash, and a store's signer's ``identity`` (an S3 access key's hash) for an object
        of a bucket store: bytes read with one identity are never served to another."""
        signer = await self._signer(file)
        identity = getattr(signer, "identity", None)
        return self._route_scope if identity is None else f"{self._route_scope}:{identity}"

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
            with stage_network():
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
        with stage_network():
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
        most one block (``block_size``, default ``options.block_size``) is held;
        through the byte cache, a span of up to ``_CACHED_SPAN_AT_ONCE`` (16 MiB)
        is read at once and held until its blocks are taken. Use ``async with``
        (or ``aclose()``) to release the request if you stop early.
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
        elif end is not None and self._caches(file):
            source = _CachedChunks(self, file, start, end, block)
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
            byte_cache=(
                dataclasses.asdict(self._byte_cache.statistics())
                if self._byte_cache is not None
                else {}
            ),
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
        self, file: FileRef, path: str, spans: list[tuple[int, int]], *, in_place: bool = False
    ) -> list[bytes] | list[pa.Buffer]:
        self._requests["local"] += 1
        data, seen = await anyio.to_thread.run_sync(
            _pread_ranges, file, path, spans, in_place, limiter=self._limiter
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
        return self._route_key_of(transfer.file)

    def _route_key_of(self, file: FileRef) -> str:
        return f"{self._route_scope}:{file.url}"

    def _route_nowait(self, transfer: _Transfer) -> Route | Pending | None:
        if transfer.leader:
            return None
        if stores.for_file(transfer.file) is not None:  # listed: its URL serves it
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

    # -- requests --------------------------------------------------------------------------

    async def _signer(self, file: FileRef) -> RequestSigner | None:
        """What signs the requests for ``file``: its store's context, for an object
        listed from a bucket store; else nothing."""
        store = stores.for_file(file)
        if store is None:
            return None
        ctx = self._store_contexts.get(store.scheme)
        if ctx is None:
            ctx = self._store_contexts[store.scheme] = await store.context(self.options, file.path)
        return ctx

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

    def _resumable(self, transfer: _Transfer) -> bool:
        """Whether a cut answer for ``transfer`` may be resumed: its pinned version has a
        validator, so a resume's bytes are proved to be of the same file."""
        pinned = self._versions.get((transfer.file.url, transfer.direct))
        return pinned is not None and pinned.validated

    def _is_hub(self, url: str) -> bool:
        return origin(url) == self._hub_origin


# -- byte streams ---------------------------------------------------------------------------


class _Chunks(Protocol):
    async def next_chunk(self) -> bytes | None: ...

    async def aclose(self) -> None: ...


#: A cached stream's span no longer than this is taken from the byte cache at once: its
#: missing blocks fetched together, one request per run of adjacent ones (a video's
#: GOPs: one round trip, where block after block took one each; and one request per
#: GOP, as without the cache: a request per block made three times the requests, and
#: with 16 in flight at 20 ms each the frames came 40-70 ms later).
_CACHED_SPAN_AT_ONCE = 16 * 1024 * 1024


class _CachedChunks:
    """A file's bytes from ``start`` to ``end`` through the byte cache, ``block_size``
    bytes a chunk (``ByteCache.read``), as a local file gives them: a chunk over blocks
    already checked is read from disk straight into one buffer, one copy, where a chunk
    per block made the parser take eight times the chunks, each a hand-off to a worker
    thread and on to the stream (a TAR epoch from the cache was 0.8x local disk). A span
    of at most ``_CACHED_SPAN_AT_ONCE`` bytes is taken at once, its missing blocks
    fetched together, one request per run of adjacent ones (up to ``max_range_size``)."""

    def __init__(self, fetcher: RangeFetcher, file: FileRef, start: int, end: int, block: int):
        self._fetcher = fetcher
        self._file = file
        self._pos = start
        self._end = end
        self._block = block
        self._ready: deque[bytes | memoryview] = deque()  # at most _CACHED_SPAN_AT_ONCE

    async def next_chunk(self) -> bytes | None:
        if not self._ready:
            if self._pos >= self._end:
                return None
            end = min(self._end, self._pos + self._block)
            if self._end - self._pos <= _CACHED_SPAN_AT_ONCE:
                end = self._end
            spans = [(s, min(end, s + self._block)) for s in range(self._pos, end, self._block)]
            max_request = self._fetcher.options.max_range_size
            self._ready.extend(await self._fetcher._cached_read(self._file, spans, max_request))
            self._pos = end
        return self._ready.popleft()  # type: ignore[return-value]  # bytes-like

    async def aclose(self) -> None:
        self._pos = self._end
        self._ready.clear()


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
        with stage_network():
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


def _copy_error(exc: FetchError) -> FetchError:
    """The same error for another waiting reader (an exception is raised in one task only)."""
    return type(exc)(str(exc), url=exc.url, status=exc.status, attempts=exc.attempts)
