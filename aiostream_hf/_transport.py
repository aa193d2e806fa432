"""The client's HTTP transport: every request over urllib3, in worker threads.

Each request is sent, and each body read in large pieces (``read1``, up to ``_PIECE``
bytes), on a worker thread, which holds no GIL while it waits on the socket: the event
loop receives no bytes itself, and each byte is copied once from the kernel instead of
through asyncio's buffer, anyio's 64 KiB slices and h11's buffer. One transport for
API calls, redirects and range reads alike: a process imports one HTTP stack, and its
first request waits for no second one (httpx2's own pool, with httpcore2, h11 and an
SSL context, cost ~50 ms before the first request of a fresh process).

Everything above the transport is unchanged: the HubClient's gates, retries, deadlines,
validators and statistics see an ``httpx2.Response`` as from any transport; urllib3's
errors become the httpx2 errors the fetcher retries (``ReadTimeout``, ``ConnectError``,
``RemoteProtocolError``...). urllib3 follows no redirect and retries nothing itself.
Cancellation is never held up by a blocked read: the thread is abandoned and the
socket shut down under it, for a send (its connection tells ``_Handoff`` which socket
it is, from the moment it is connected: a TLS handshake that never ends included) as
for a body; an answer that comes all the same is closed, so no connection is
left for the garbage collector. Every worker-thread call ends within ``_call_limit``
(the read timeout bounds each socket read, not a head, 1xx run or trailer that never
ends): past it, its socket is shut down and it is a ``ReadTimeout``.

A TLS context that verifies certificates reads the CA bundle when it is made (~20 ms):
a process that reads over plain HTTP (a local server, a plain-HTTP object store) never
makes it, and one that does makes it once (``tls_context``), however many clients it
opens.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import httpx2
import urllib3
import urllib3.connection
import urllib3.exceptions

__all__ = ["READINTO", "ThreadedTransport", "tls_context"]

#: The response extension under which a body can be read in place instead:
#: ``await response.extensions[READINTO](view) -> int`` (0 at its end).
READINTO = "aiostream.readinto"

#: How long one read of a body in place gathers socket reads before it returns.
_GATHER_S = 0.02

#: The most bytes one read of a body returns (what arrived by then, at least one byte).
_PIECE = 1 << 20

#: A redirect's body up to this size is read with its head, in the same worker-thread
#: call, if it comes within ``_REDIRECT_DRAIN_S``: its connection then goes back to the
#: pool (the next file's resolve reuses it, with no new TCP and TLS handshake) instead
#: of being shut down unread. One that does not come by then is left unread, as before.
_REDIRECT_BODY = 64 * 1024
_REDIRECT_DRAIN_S = 0.05

#: Every worker-thread call of a request (its send up to the whole head; one read of its
#: body) ends within ``_CALL_READS`` read timeouts, plus its connect timeout and
#: ``_CALL_SLACK_S``: the read timeout bounds each socket read, not a server that sends
#: a byte of its head (or of a chunked body's trailer, or an endless run of 1xx answers)
#: every few seconds. Past it, the call's socket is shut down and it is a ``ReadTimeout``.
_CALL_READS = 2
_CALL_SLACK_S = 1.0

T = TypeVar("T")


@functools.lru_cache(maxsize=1)
def tls_context() -> ssl.SSLContext:
    """httpx2's default verifying TLS context, made once per process."""
    return httpx2.create_ssl_context()


class ThreadedTransport(httpx2.AsyncBaseTransport):
    """Requests over urllib3 pools (one per scheme, made on its first request), sent and
    read in worker threads.

    At most ``max_connections`` connections per host are kept, and as many threads
    run at once; ``tls`` gives the verifying context for https, made on first use.
    """

    def __init__(
        self, max_connections: int, tls: Callable[[], ssl.SSLContext] = tls_context
    ) -> None:
        self._max_connections = max_connections
        self._tls = tls
        self._pools: dict[str, urllib3.PoolManager] = {}
        self._threads = anyio.CapacityLimiter(max_connections)
        self._closed = False

    def _pool(self, scheme: str) -> urllib3.PoolManager:
        pool = self._pools.get(scheme)
        if pool is None:
            if self._closed:
                raise RuntimeError("this transport is closed")
            extra: dict[str, Any] = {"ssl_context": self._tls()} if scheme == "https" else {}
            pool = urllib3.PoolManager(
                num_pools=64, maxsize=self._max_connections, block=False, **extra
            )
            pool.pool_classes_by_scheme = _TRACKED_POOLS
            self._pools[scheme] = pool
        return pool

    async def _run(self, request: httpx2.Request, fn: Callable[[], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(
                _mapped, request, fn, abandon_on_cancel=True, limiter=self._threads
            )
        except _Mapped as mapped:
            raise mapped.error from mapped.__cause__

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timeout = request.extensions.get("timeout", {})
        pool = self._pool(request.url.scheme)
        url = str(request.url)
        headers = dict(request.headers)
        body = await request.aread() or None
        method = request.method

        handoff = _Handoff()

        def send() -> tuple[urllib3.BaseHTTPResponse, bytes | None]:
            _sending.handoff = handoff  # the connection used tells it (_Tracked)
            try:
                answer = pool.urlopen(
                    method,
                    url,
                    body=body,
                    headers=headers,
                    redirect=False,
                    retries=False,
                    preload_content=False,
                    decode_content=False,
                    timeout=urllib3.Timeout(
                        connect=timeout.get("connect"), read=timeout.get("read")
                    ),
                )
            finally:
                _sending.handoff = None
                handoff.done()
            whole = _read_redirect(answer)  # before deliver: a caller gone meanwhile closes it
            return handoff.deliver(answer), whole

        limit = _call_limit(timeout, head=True)
        try:
            with anyio.fail_after(limit):
                try:
                    answer, whole = await self._run(request, send)
                except anyio.get_cancelled_exc_class():
                    # Its socket is shut down now (a head that never ends ends there), or
                    # the answer, when it comes, is closed: not left to the GC.
                    handoff.abandon()
                    raise
        except TimeoutError:
            if limit is None:  # not this bound's (none was set): as it came
                raise
            raise httpx2.ReadTimeout(
                f"no whole response head within {limit:.0f} s", request=request
            ) from None
        extensions: dict[str, Any] = {
            "http_version": b"HTTP/1.1",
            "reason_phrase": (answer.reason or "").encode(),
        }
        if whole is not None:  # read with its head; its connection is back in the pool
            return httpx2.Response(
                answer.status,
                headers=list(answer.headers.items()),
                content=whole,
                extensions=extensions,
            )
        received = _Body(self, request, answer)
        # The body, received in place (not with aiter_*)
        extensions[READINTO] = received.readinto
        return httpx2.Response(
            answer.status,
            headers=list(answer.headers.items()),
            stream=received,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        self._closed = True
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.clear()


class _Handoff:
    """Hands the answer of a send from its worker thread to the caller, or closes it
    when the caller was cancelled meanwhile: an abandoned send still ends (its answer
    arrives, or its timeout passes), and its connection is closed then, not left open
    for the garbage collector."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = False
        self._answer: urllib3.BaseHTTPResponse | None = None
        self._connection: urllib3.connection.HTTPConnection | None = None
        # A duplicate of a new connection's socket, for as long as the send runs: its TLS
        # handshake (urllib3's connect, before ``sending``) holds the socket inside the
        # SSL socket being made, where ``abandon`` could not reach it otherwise.
        self._twin: socket.socket | None = None

    def sending(self, connection: urllib3.connection.HTTPConnection) -> None:
        """On the worker thread: the request goes out on ``connection``; if the caller
        has left already, its socket is shut down (the send fails at once)."""
        with self._lock:
            if not self._abandoned:
                self._connection = connection
                return
        _shut_socket(connection)

    def connected(self, sock: socket.socket) -> None:
        """On the worker thread: a new connection's socket is connected (its TLS
        handshake, if any, comes next, before ``sending``). A duplicate of it is kept
        until ``done``, for ``abandon`` to shut it down (a shutdown acts on the socket,
        not on one descriptor): a handshake that never ends is not waited for. If the
        caller has left already, it is shut down now (the handshake fails at once)."""
        try:
            twin = sock.dup()
        except OSError:
            return
        with self._lock:
            if not self._abandoned:
                self._twin = twin
                return
        _shut_raw(twin)
        twin.close()

    def done(self) -> None:
        """On the worker thread, when the send has returned or raised: the duplicate of
        its socket, if any, is closed (the socket itself stays with its connection)."""
        with self._lock:
            twin, self._twin = self._twin, None
        if twin is not None:
            twin.close()

    def deliver(self, answer: urllib3.BaseHTTPResponse) -> urllib3.BaseHTTPResponse:
        """On the worker thread: ``answer``, kept for the caller, or closed if it left."""
        with self._lock:
            self._connection = None
            if not self._abandoned:
                self._answer = answer
                return answer
        answer.close()
        return answer

    def abandon(self) -> None:
        """On the caller's cancellation: close the answer now if it came in the meantime;
        else shut the socket of the send down under its worker thread (a head that never
        ends, an endless run of 1xx answers), and have the thread close the answer if one
        comes all the same."""
        with self._lock:
            self._abandoned = True
            answer, self._answer = self._answer, None
            connection, self._connection = self._connection, None
            twin, self._twin = self._twin, None
        if twin is not None:  # the socket of a new connection, TLS handshake or not
            _shut_raw(twin)
            twin.close()
        if answer is not None:
            answer.close()
        elif connection is not None:
            _shut_socket(connection)


class _Body(httpx2.AsyncByteStream):
    """A response body, read on a worker thread a piece at a time."""

    def __init__(self, transport: ThreadedTransport, request: httpx2.Request, answer: Any) -> None:
        self._transport = transport
        self._request = request
        self._answer = answer
        self._done = False

    async def _call(self, fn: Callable[[], T]) -> T:
        """``fn`` on a worker thread, its socket shut down under it if it is cancelled or
        takes longer than ``_call_limit`` (a chunked body's endless trailer)."""
        limit = _call_limit(self._request.extensions.get("timeout", {}), head=False)
        try:
            with anyio.fail_after(limit):
                try:
                    return await self._transport._run(self._request, fn)
                except anyio.get_cancelled_exc_class():
                    _shut_down(self._answer)  # unblocks the abandoned read
                    raise
        except TimeoutError:
            if limit is None:  # not this bound's (none was set): as it came
                raise
            raise httpx2.ReadTimeout(
                f"one read of the body took over {limit:.0f} s", request=self._request
            ) from None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while not self._done:
            piece = await self._call(self._read)
            if not piece:
                self._done = True
                return
            yield piece

    def _read(self) -> bytes:
        # A plain body is read from its http.client response, as ``_readinto`` does:
        # urllib3's read1 puts the connection back in the pool from this worker thread
        # when the body ends, and a caller cancelled meanwhile then shut down or closed
        # it under the next request to take it (ResponseNotReady, a retry). It goes back
        # in ``aclose``, on the caller's side, once this read is over. Any other body (of
        # no length or none left: a HEAD's, a 304's; chunked) is read through urllib3, as
        # ``_readinto`` does: its read of nothing closes the http.client response, which
        # would otherwise keep the socket's file open in the pool after the connection is
        # closed (an "unclosed socket" warning when it is collected).
        raw: Any = getattr(self._answer, "_fp", None)
        length = getattr(raw, "length", None)
        plain = _in_place(raw) and isinstance(length, int) and length > 0
        reader = raw if plain else self._answer
        data = bytes(reader.read1(_PIECE))
        # A plain body read to its end is closed here, as ``_readinto`` does: the body then
        # ends without one more thread hand-off to read nothing (http.client's read1
        # leaves that read to find the end), and its connection is reused.
        if data and plain and raw.length == 0:
            raw._close_conn()
        if _ended(raw):
            self._done = True
        return data

    async def readinto(self, view: memoryview) -> int:
        """Read the next bytes of the body into ``view`` (what arrived, at least one byte;
        0 at its end): the socket read writes them there, without the GIL or a copy."""
        if self._done:
            return 0
        return await self._call(functools.partial(self._readinto, view))

    def _readinto(self, view: memoryview) -> int:
        # What one socket read gives (as read1 does), so that a slow body shows its pace
        # to the fetcher's stall checks. urllib3's readinto would read into a new bytes
        # and copy; its http.client response's buffered socket file reads into the view.
        # Only a plain body of known length is read so (http.client's read1 does the
        # same bookkeeping); a chunked one is read with read1 and copied, and so is any
        # body whose response lacks one of the private parts used (another urllib3 or
        # Python: ``_in_place``).
        raw: Any = getattr(self._answer, "_fp", None)
        if _ended(raw):
            self._done = True
            return 0
        length = getattr(raw, "length", None)
        if not _in_place(raw) or not isinstance(length, int) or length <= 0:
            data = self._answer.read1(len(view))
            if not data:
                self._done = True
                return 0
            view.cast("B")[: len(data)] = data  # a buffer's view may be of signed bytes
            n = len(data)
        else:
            n = _fill(raw.fp, view[:length])
            if not n:
                raise http.client.IncompleteRead(b"", length)
            raw.length = length - n
            if not raw.length:
                raw._close_conn()
        if _ended(raw):
            self._done = True  # read to its end: the connection is reused
        return int(n)

    async def aclose(self) -> None:
        if self._done:
            self._answer.release_conn()  # read to its end: the connection is reused
        else:
            _shut_down(self._answer)  # cut short: the connection is not reusable
            self._answer.close()
        self._done = True


def _read_redirect(answer: urllib3.BaseHTTPResponse) -> bytes | None:
    """On the worker thread, once its head is in: the body of a redirect of a known
    length up to ``_REDIRECT_BODY`` that comes within ``_REDIRECT_DRAIN_S`` (each socket
    read waits at most what is left of that), read whole and its connection released to
    the pool. None for any other answer, and for a body that does not come in time (a
    server trickling it): left unread, that answer is shut down when it is dropped."""
    length = answer.length_remaining
    if not 300 <= answer.status < 400 or length is None or length > _REDIRECT_BODY:
        return None
    sock = getattr(answer.connection, "sock", None)
    if sock is None:
        return None
    waits = sock.gettimeout()
    deadline = time.monotonic() + _REDIRECT_DRAIN_S
    pieces: list[bytes] = []
    try:
        while answer.length_remaining:
            left = deadline - time.monotonic()
            if left <= 0:
                return None  # the rest, if read, waits as any body's read does
            sock.settimeout(left)
            piece = answer.read1(answer.length_remaining, decode_content=False)
            if not piece:
                return None  # the body ended short: the connection is not reused
            pieces.append(piece)
        answer.read(decode_content=False)  # b"": the response ends, its connection is free
    except (OSError, urllib3.exceptions.HTTPError):
        return None
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(waits)
    answer.release_conn()
    return b"".join(pieces)


def _ended(raw: Any) -> bool:
    """True when the http.client response ``raw`` says its body was read to its end."""
    isclosed = getattr(raw, "isclosed", None)
    return callable(isclosed) and bool(isclosed())


def _in_place(raw: Any) -> bool:
    """True when ``raw`` (the http.client response under urllib3's) is a plain body whose
    socket file reads into a buffer: what ``_Body.readinto`` needs to read in place."""
    return (
        raw is not None
        and getattr(raw, "chunked", True) is False
        and callable(getattr(getattr(raw, "fp", None), "readinto1", None))
        and callable(getattr(raw, "_close_conn", None))
    )


def _fill(fp: Any, view: memoryview) -> int:
    """Socket reads into ``view`` until it holds ``_PIECE`` bytes (or is full), or
    ``_GATHER_S`` has passed: few thread hand-offs for a fast body, and a slow one
    still returns what came within a fraction of a second. 0 only at EOF."""
    want = min(len(view), _PIECE)
    n = fp.readinto1(view)
    started = time.monotonic()
    while n and n < want and time.monotonic() - started < _GATHER_S:
        got = fp.readinto1(view[n:])
        if not got:
            break
        n += got
    return int(n)


def _shut_down(answer: Any) -> None:
    """Shut the socket of ``answer`` down (a read blocked on it returns), unless urllib3
    has already let go of its connection (at the end of the body, or on an error)."""
    if answer.connection is None:
        return
    with contextlib.suppress(RuntimeError, OSError):  # released meanwhile, or closed
        answer.shutdown()


class _Mapped(Exception):
    """Carries the httpx2 error of a urllib3 one out of the worker thread."""

    def __init__(self, error: httpx2.TransportError) -> None:
        super().__init__(str(error))
        self.error = error


def _mapped(request: httpx2.Request, fn: Callable[[], T]) -> T:
    """``fn()``, with urllib3's and the socket's errors made httpx2's."""
    try:
        return fn()
    except urllib3.exceptions.MaxRetryError as exc:  # retries=False wraps none, but be sure
        raise _Mapped(_error(exc.reason or exc, request)) from exc
    except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
        raise _Mapped(_error(exc, request)) from exc


def _error(exc: BaseException, request: httpx2.Request) -> httpx2.TransportError:
    message = f"{type(exc).__name__}: {exc}"
    errors = urllib3.exceptions
    kind: type[httpx2.TransportError]
    # NewConnectionError (refused, no DNS name...) derives from ConnectTimeoutError in
    # urllib3 2: tested first, it is the ConnectError it is, not a timeout.
    if isinstance(exc, errors.NewConnectionError | errors.SSLError | ssl.SSLError):
        kind = httpx2.ConnectError
    elif isinstance(exc, errors.ConnectTimeoutError):
        kind = httpx2.ConnectTimeout
    elif isinstance(exc, errors.ReadTimeoutError | TimeoutError):
        kind = httpx2.ReadTimeout
    elif isinstance(exc, errors.ProtocolError | errors.DecodeError | http.client.HTTPException):
        kind = httpx2.RemoteProtocolError
    else:
        kind = httpx2.ReadError
    return kind(message, request=request)


def _call_limit(timeout: Any, *, head: bool) -> float | None:
    """The longest one worker-thread call of a request may take (see ``_CALL_READS``);
    None when the request has no read timeout."""
    read = timeout.get("read") if isinstance(timeout, dict) else None
    if read is None:
        return None
    connect = (timeout.get("connect") or 0.0) if head else 0.0
    return float(connect) + _CALL_READS * float(read) + _CALL_SLACK_S


def _shut_socket(connection: urllib3.connection.HTTPConnection) -> None:
    """Shut the socket of ``connection`` down: a read blocked on it returns at once."""
    sock = getattr(connection, "sock", None)
    if sock is not None:
        _shut_raw(sock)


def _shut_raw(sock: socket.socket) -> None:
    """Shut ``sock`` down (closed or detached meanwhile: nothing to do)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


#: The send of the worker thread's current request (``_Tracked`` tells it its connection).
_sending = threading.local()


class _Tracked:
    """A urllib3 connection that tells the send it carries (``_sending``) that it is the
    one, and its socket as soon as it is connected (before a TLS handshake, which
    urllib3 runs before the request): the send's caller can then shut it down if it
    leaves."""

    def _new_conn(self) -> socket.socket:
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        handoff: _Handoff | None = getattr(_sending, "handoff", None)
        if handoff is not None:
            handoff.connected(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> Any:
        handoff: _Handoff | None = getattr(_sending, "handoff", None)
        if handoff is not None:
            handoff.sending(self)  # type: ignore[arg-type]
        return super().request(*args, **kwargs)  # type: ignore[misc]


class _FinalResponse(http.client.HTTPResponse):
    """http.client's response, skipping every interim (1xx) answer before the final one,
    as RFC 9110 (15.2) asks: http.client skips 100-Continue only, and took a 103 Early
    Hints for the answer. 101 (a protocol switch) is final. How many come is bounded by
    the send's time (``_call_limit``), not by a count."""

    def _read_status(self) -> tuple[str, int, str]:
        while True:
            version, status, reason = super()._read_status()  # type: ignore[misc]
            if not 101 < status < 200:  # 100 is skipped by begin() itself
                return version, status, reason
            http.client._read_headers(self.fp)  # type: ignore[attr-defined]


class _TrackedHTTPConnection(_Tracked, urllib3.connection.HTTPConnection):
    response_class = _FinalResponse


class _TrackedHTTPSConnection(_Tracked, urllib3.connection.HTTPSConnection):
    response_class = _FinalResponse


class _TrackedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _TrackedHTTPConnection


class _TrackedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _TrackedHTTPSConnection


_TRACKED_POOLS = {"http": _TrackedHTTPPool, "https": _TrackedHTTPSPool}
