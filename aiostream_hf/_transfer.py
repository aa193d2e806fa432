"""One contiguous span of one file, read over as many answers as it takes (``_Transfer``).

The ``RangeFetcher`` (``_fetcher``) makes one per span and holds the state they share
(the route cache's keys, the concurrency slots, the pinned versions, the statistics);
a transfer sends the requests, follows redirects, judges each answer and resumes:

- Resolution. The first read of a Hub file sends its range GET to the file's
  ``/resolve/`` URL without following redirects. A 302 names a signed CDN URL:
  it is cached (keyed by the file URL, until the ``expires=`` of its query) and
  the range is sent there; a 200/206 means the Hub serves the file itself, and
  that is cached too. Concurrent first reads of one file wait for the one
  resolver request in flight (a dict of URL -> pending event, updated in plain
  synchronous code). A CDN answer of 401/403/410 drops the cached URL and the
  read re-resolves once.
- Retries. 408, 429, 5xx and network errors (refused connections, timeouts,
  bodies cut mid-way) are retried with jittered exponential backoff, up to
  ``max_retries`` failures in a row without progress (an answer that brings fewer
  than ``MIN_PROGRESS_BYTES`` before it breaks is no progress), waiting as the
  client's one policy says (``HubClient.retry_wait``). ``Retry-After`` and
  ``RateLimit: "<bucket>";r=<remaining>;t=<seconds>`` are honoured. A 429 (or
  ``r=0``) pauses the whole host; when the pause ends one request goes first
  and its ``RateLimit`` header says how many may follow. A body cut mid-way
  resumes from the last byte received, with ``If-Range``; from a server that names
  no version (no ETag, no Last-Modified) it is not resumed (nothing would prove the
  rest is of the same file): the read fails, saying so.
- Redirects: the client's rule (``redirect_target``: an absolute http(s) URL) and its
  bound (``MAX_REDIRECTS``); each hop is sent by this loop, which caches the route.
- Integrity. Every 206 must be the range asked for (``Content-Range`` and
  length). A 200 to a range request is used (sliced) only when the whole file
  is at most twice the bytes asked for.
- Stalls. A body that arrives slower than ``min_throughput`` bytes/s, measured over
  each ``timeout`` seconds spent waiting for it, is dropped and resumed like a cut
  one; so is one with no bytes for ``timeout`` seconds.
- Unreachable hosts. A host that never answered and refuses the connection (or has
  no DNS name) is tried once more, then ``UnreachableError`` names it.
- Objects of a bucket store's listing (``stores``) are read from their own URL from the
  first request (no resolution: ``If-Match`` carries the listing's ETag at once), each
  attempt signed by the client as it is sent, with the store's context; the store says
  what an error answer means.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
import urllib.parse
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import httpx2
import pyarrow as pa

from . import stores
from ._access import origin
from ._answers import redirect_target
from ._client import MAX_REDIRECTS, Route
from ._exceptions import FetchError, FileChangedError, RangeMismatchError, RetriesExhaustedError
from ._exceptions import display_url as _display
from ._models import FileRef
from ._retry import retry_after, retryable_status
from ._transport import READINTO
from ._versions import Version, normalize_etag

if TYPE_CHECKING:
    from ._fetcher import RangeFetcher

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CDN_DENIED = frozenset({401, 403, 410})
# An answer must bring this many bytes (or the rest of the span) to count as progress:
# a server that cuts every body after a byte or two runs out of retries like one that
# fails outright, instead of resuming forever (each resume a request).
MIN_PROGRESS_BYTES = 64 * 1024
# Re-resolve a cached CDN URL this many seconds before its ``expires=``.
_EXPIRY_MARGIN_S = 1.0
_RETRYABLE_ERRORS = (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)
_CONNECT_ERRORS = (httpx2.ConnectError, httpx2.ConnectTimeout)
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)
_UNSATISFIED_RANGE = re.compile(r"^\s*bytes\s+\*/(\d+)\s*$", re.IGNORECASE)


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
        self.failures = 0  # in a row, without progress (MIN_PROGRESS_BYTES per answer)
        self.answer_bytes = 0  # the bytes the open answer brought so far
        self.received = False  # a byte of the span came (a cut must resume, not restart)
        self.direct = True  # the bytes come from the file's own URL (not a redirect's)
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
            self.received = True
            self.answer_bytes += len(chunk)
            if self.answer_bytes >= MIN_PROGRESS_BYTES:
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
        if self.received and not self.fetcher._resumable(self):
            raise FetchError(
                f"{self.file.url}: the answer from {_display(self.last_url)} was cut at byte "
                f"{self.pos}, and the server names no version of the file (no ETag, no "
                "Last-Modified): the rest cannot be proved to come from the same file, so "
                "it is not resumed. Serve the file with an ETag or Last-Modified",
                url=self.file.url,
                status=self.last_status,
                attempts=self.failures + 1,
            ) from exc
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
        delay = self.fetcher.client.retry_wait(
            self.last_url,
            _failure(retry),
            self.failures,
            self.fetcher.options,
            server_delay=retry.delay,
            status=retry.status,
            paused=not retry.sleep,
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
                        hint = getattr(signer, "unreachable_hint", None)
                        quick = f._hub.connect_failed(
                            host, _display(url), exc, self.failures + 1, hint=hint
                        )
                    outcome = _Retry(None, quick or None, exc)
                except httpx2.HTTPError as exc:
                    raise FetchError(
                        f"{self.file.url}: cannot request {_display(url)}: {exc}",
                        url=self.file.url,
                    ) from exc
                else:
                    f._note_response(host, self, response)
                    store = stores.for_file(self.file) if signer is not None else None
                    if store is not None and response.status_code in (400, 401, 403):
                        self.error_body = await store.error_body(response)
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
                self.answer_bytes = 0
                f._open_transfers.add(self)
                return None
            await self._drop(response)
            if isinstance(outcome, _Retry):
                await self._failed(outcome)
            elif outcome is _FOLLOW:
                hops += 1
                if hops > MAX_REDIRECTS:
                    raise FetchError(
                        f"{self.file.url}: more than {MAX_REDIRECTS} redirects (MAX_REDIRECTS), "
                        f"the last to {_display(self.last_url)}: a redirect loop?",
                        url=self.file.url,
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
            try:
                target = redirect_target(response, "GET", _display(url), FetchError)
            except FetchError as exc:
                raise FetchError(f"{file.url}: {exc}", url=file.url, status=status) from None
            f._set_route(self, Route(target, direct=False, reuse_until=_reuse_until(target)))
            return _FOLLOW
        if status in (200, 206):
            direct = self.direct = route is None or route.direct
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
        """A refused read: the file was removed (a 404 from its own URL once pinned), or
        what its store says the refusal means (``stores.reader_of``)."""
        file = self.file
        refusal = stores.Refusal(
            file,
            status,
            url,
            headers,
            self.error_body,
            self.failures + 1,
            self.fetcher.access,
            None,
        )
        if status == 404 and route is not None and route.direct:
            return self._changed(
                f"{refusal.where} answered 404{refusal.note}: it was removed", status=404
            )
        bucket = stores.for_file(file)
        if bucket is not None:
            refusal = dataclasses.replace(
                refusal, context=self.fetcher._store_contexts.get(bucket.scheme)
            )
        return stores.reader_of(file, self.fetcher.access).read_error(refusal)

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


# -- small pure helpers ---------------------------------------------------------------------


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


def _host_key(url: str, file: FileRef) -> str:
    try:
        scheme, host, port = origin(url)
    except httpx2.InvalidURL as exc:
        raise FetchError(f"{file.url}: invalid URL {url!r}: {exc}", url=file.url) from exc
    if scheme not in ("http", "https"):
        raise FetchError(f"{file.url}: cannot read {scheme}:// URLs", url=file.url)
    return f"{host}:{port}"


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
