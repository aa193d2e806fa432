"""HubClient: the one HTTP client of an event loop, and the rules every request follows.

    async with ash.HubClient() as client:          # one connection pool for the service
        async with ash.stream(src_a, client=client) as a, ash.stream(src_b, client=client) as b:
            ...

Every request of the library goes through a ``HubClient``: the resolver's API and
``/resolve/`` calls, the fetcher's range reads and streams, the video reader's. It owns
what requests must share to behave well together:

- the connection pool (one ``httpx2.AsyncClient``, TLS set up on the first https
  request) and a limiter on the requests in flight across every user, so that a
  request waits for a connection here, never in the pool (where it would time out);
- the host gates: a 429 pauses the whole host for every user, the resolver and the
  fetcher alike; when the pause ends one request goes first;
- the rate-limit quotas (``_quota.SharedQuota``): each request of a bucket ("api",
  "resolvers") takes one from a count the processes of the machine share, kept by the
  servers' ``RateLimit`` headers, and waits for the window's reset when it is spent, so
  that many workers together stay within one quota instead of running into 429s;
- the CDN URL cache: where each file's bytes are served (its ``/resolve/`` redirect),
  kept until the signed URL expires, with one resolution in flight per file;
- the one retry policy (jittered exponential backoff, the server's ``Retry-After``
  capped at the Hub's 5-minute rate-limit window) and the one token rule (a token
  goes to its Hub's own origin only, never to a CDN or another host);
- request signing: a request sent with a ``RequestSigner`` (an S3 store's SigV4) is
  signed here, as it leaves, after every wait for the host and a slot, so that each
  attempt (a retry, a resume with its new ``Range``) carries a fresh signature.

Callers keep what is theirs: their options (retries, timeouts, range sizes), their
token and endpoint, their statistics.

Without an explicit client, the streams of one event loop share a default one
(``use_client``): made by the first, closed when the last one ends, so a finished
program leaves no socket open. Pass a client of your own to keep one pool (and its
warm connections) for a service's life.
"""

from __future__ import annotations

import contextlib
import functools
import http.cookiejar
import logging
import random
import re
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol

import anyio
import httpx2
from anyio.lowlevel import RunVar

from .__version__ import __version__
from ._access import Access, auth_headers, origin
from ._answers import Answer, BodyCap, Failure, read_capped, redirect_target, url_of
from ._exceptions import (
    AiostreamError,
    ClosedResourceError,
    RateLimitedError,
    ResolutionError,
    SourceError,
    UnreachableError,
    display_url,
)
from ._options import StreamOptions
from ._quota import GO, PROBE, Pacing, SharedQuota, bucket_of
from ._retry import MAX_HEADER_DELAY_S, backoff_delay, clamp_delay, retry_after, retryable_status
from ._transport import ThreadedTransport, tls_context

__all__ = [
    "MAX_SERVER_DELAY_S",
    "ClientStatistics",
    "HubClient",
    "Pacing",
    "Pending",
    "RequestSigner",
    "Route",
    "auth_headers",
    "host_key",
    "origin",
    "ratelimit",
    "use_client",
]

#: The longest wait a server may ask for; the Hub's rate-limit windows are 5 minutes.
MAX_SERVER_DELAY_S = 300.0
#: The most redirects one request follows.
MAX_REDIRECTS = 10
#: A request's whole answer may take StreamOptions.timeout and this: a connect that times
#: out (after the timeout) is then reported as one, and fails fast for a host never seen.
WHOLE_ANSWER_MARGIN_S = 1.0
#: A host pause at least this long is logged (WARNING).
LOG_PAUSE_S = 5.0
#: Retries of requests to one host are logged (WARNING) at most once per this many seconds.
LOG_RETRY_EVERY_S = 5.0
#: A host that never answered and refuses connections (or has no DNS name) gets one
#: more try after this many seconds, then ``UnreachableError``.
UNREACHABLE_RETRY_S = 0.2
logger = logging.getLogger("aiostream_hf")
_DEFAULT_MAX_CONNECTIONS = 64
_RATELIMIT_REMAINING = re.compile(r"(?:^|[;,\s])(?:r|remaining)=(\d+)")
_RATELIMIT_RESET = re.compile(r"(?:^|[;,\s])(?:t|reset)=(\d+(?:\.\d+)?)")
_RATELIMIT_BUCKET = re.compile(r'^\s*"([^"]*)"')


@dataclass(frozen=True)
class ClientStatistics:
    """What a client has done since it was made.

    requests: HTTP requests sent through it, by every user.
    in_flight / max_in_flight: requests holding a connection slot now / at the peak.
    throttled: 429 answers received.
    paused_hosts: hosts paused now (a 429, or a rate-limit budget used up).
    pauses / paused_seconds: host pauses begun (or lengthened by 5 s or more), and the
        seconds of pause in all.
    rate_limit_failures: requests failed with ``RateLimitedError`` (asked to wait longer
        than ``max_rate_limit_wait``).
    unreachable_hosts: hosts that refused connections (or had no DNS name) before ever
        answering.
    paced / paced_seconds: requests that waited because a rate-limit quota shared by
        the processes of the machine was spent (``RateLimit`` said so: no 429 needed),
        and the seconds they waited in all.
    routes: files whose serving URL (CDN redirect) is cached.
    users / max_users: streams and readers using it now / at the peak.
    max_connections: the bound on requests in flight (and on pooled connections).
    """

    requests: int
    in_flight: int
    max_in_flight: int
    throttled: int
    paused_hosts: int
    pauses: int
    paused_seconds: float
    rate_limit_failures: int
    unreachable_hosts: int
    paced: int
    paced_seconds: float
    routes: int
    users: int
    max_users: int
    max_connections: int


@functools.lru_cache(maxsize=64)
def _url_path(url: str) -> str:
    return httpx2.URL(url).path


def host_key(url: str) -> str:
    """The key of ``url``'s host gate: "name:port"."""
    _, host, port = origin(url)
    return f"{host}:{port}"


def ratelimit(value: str | None) -> tuple[int, float] | None:
    """(remaining, seconds to reset) from ``RateLimit: "<bucket>";r=<n>;t=<s>``."""
    if not value:
        return None
    remaining = _RATELIMIT_REMAINING.search(value)
    reset = _RATELIMIT_RESET.search(value)
    if remaining is None or reset is None:
        return None
    seconds = clamp_delay(float(reset.group(1)))  # digits only: never NaN
    return int(remaining.group(1)), MAX_HEADER_DELAY_S if seconds is None else seconds


class RequestSigner(Protocol):
    """Adds a request's credentials (headers) just before it is sent; leaves a request
    to a host it has no credentials for as it is.

    A signer may also have ``unreachable_hint``: the way out an ``UnreachableError`` of
    its endpoint gives (the S3 store names AWS_ENDPOINT_URL); without one, the error
    names HF_ENDPOINT. And ``identity``: a hash of whose credentials it signs with,
    which keys the byte cache's blocks of the store's objects.
    """

    async def sign(self, request: httpx2.Request) -> None: ...


@dataclass(frozen=True)
class Route:
    """Where a file's bytes are read: its own URL (direct) or the URL it redirected to."""

    url: str
    direct: bool
    reuse_until: float | None = None  # wall-clock seconds

    def expired(self, now: float) -> bool:
        return self.reuse_until is not None and now >= self.reuse_until


class Pending:
    """A resolution in flight: readers of the same file wait for ``done``."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: Exception | None = None


class _HostGate:
    """A host that rate-limited us: paused until a time, then probed, then budgeted.

    ``asked_until`` is when the server said it would serve again, before the pause was
    capped at ``MAX_SERVER_DELAY_S``: a request that may not wait that long fails at once.
    """

    __slots__ = (
        "asked_until",
        "paused_until",
        "probe_done",
        "probe_needed",
        "prober",
    )

    def __init__(self) -> None:
        self.paused_until = float("-inf")  # anyio.current_time() deadline
        self.asked_until = float("-inf")
        self.probe_needed = False
        self.prober: object | None = None
        self.probe_done: anyio.Event | None = None

    def pause(self, until: float, asked: float) -> float:
        """Pause until ``until`` (the server asked for ``asked``); the seconds it added."""
        added = max(0.0, until - max(self.paused_until, anyio.current_time()))
        self.paused_until = max(self.paused_until, until)
        self.asked_until = max(self.asked_until, asked)
        self.probe_needed = True
        return added


class HubClient:
    """The HTTP client of one event loop: pool, host gates, CDN URL cache, retry policy.

    ``max_connections`` bounds the requests in flight (and the pooled connections) of
    every user together. ``transport`` replaces the network (``httpx2.MockTransport``
    in unit tests). Close it (``async with`` or ``aclose()``); a closed client raises
    ``ClosedResourceError``. It belongs to the event loop it is first used in.
    """

    def __init__(
        self,
        *,
        max_connections: int = _DEFAULT_MAX_CONNECTIONS,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        if not isinstance(max_connections, int) or max_connections < 1:
            raise SourceError(f"HubClient(max_connections={max_connections!r}): must be >= 1")
        limits = httpx2.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self.http = httpx2.AsyncClient(
            transport=ThreadedTransport(max_connections) if transport is None else transport,
            # Only proxies from the environment (HTTPS_PROXY...) use the client's `verify`.
            verify=tls_context() if urllib.request.getproxies() else True,
            follow_redirects=False,
            # No cookie is kept (the Hub needs none): a jar would replay every Set-Cookie
            # to every port of the host and grow each request's Cookie header.
            cookies=http.cookiejar.CookieJar(
                http.cookiejar.DefaultCookiePolicy(allowed_domains=[])
            ),
            limits=limits,
            headers={"Accept-Encoding": "identity", "User-Agent": f"aiostream-hf/{__version__}"},
        )
        self.max_connections = max_connections
        self._slots = anyio.CapacityLimiter(max_connections)
        self._rng = random.Random()
        self._closed = False
        self._hosts: dict[str, _HostGate] = {}
        self._routes: dict[str, Route] = {}
        self._pending: dict[str, Pending] = {}
        self._requests = 0
        self._in_flight = 0
        self._max_in_flight = 0
        self._throttled = 0
        self._pauses = 0
        self._paused_seconds = 0.0
        self._rate_limit_failures = 0
        self._answered: set[str] = set()  # hosts that gave any HTTP answer
        self._unreachable: set[str] = set()
        self._users = 0
        self._max_users = 0
        self._quota = SharedQuota()
        self._tickets: dict[int, _Ticket] = {}  # id(owner) -> its request's quota ticket
        self._paced = 0
        self._paced_seconds = 0.0
        self._logged_windows: dict[Path, float] = {}
        self._logged_retries: dict[str, tuple[float, int]] = {}  # host -> (logged at, quiet)

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> HubClient:
        self.check_open()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (shielded from cancellation)."""
        if self._closed:
            return
        self._closed = True
        self._quota.close()
        with anyio.CancelScope(shield=True):
            await self.http.aclose()

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError("this HubClient is closed: create a new one")

    def statistics(self) -> ClientStatistics:
        now = anyio.current_time() if self._hosts else 0.0
        return ClientStatistics(
            requests=self._requests,
            in_flight=self._in_flight,
            max_in_flight=self._max_in_flight,
            throttled=self._throttled,
            paused_hosts=sum(1 for g in self._hosts.values() if g.paused_until > now),
            pauses=self._pauses,
            paused_seconds=self._paused_seconds,
            rate_limit_failures=self._rate_limit_failures,
            unreachable_hosts=len(self._unreachable),
            paced=self._paced,
            paced_seconds=self._paced_seconds,
            routes=len(self._routes),
            users=self._users,
            max_users=self._max_users,
            max_connections=self.max_connections,
        )

    # -- requests --------------------------------------------------------------------------

    async def send(
        self,
        request: httpx2.Request,
        *,
        stream: bool = False,
        follow_redirects: bool = False,
        signer: RequestSigner | None = None,
    ) -> httpx2.Response:
        """Send ``request`` on the pool (the caller holds a slot: ``acquire``), signed by
        ``signer`` first if one is given."""
        self.check_open()
        if signer is not None:
            await signer.sign(request)
        self._requests += 1
        return await self.http.send(request, stream=stream, follow_redirects=follow_redirects)

    # -- one request, end to end ------------------------------------------------------------

    async def request(
        self,
        method: str,
        url: str,
        *,
        options: StreamOptions,
        access: Access | None = None,
        params: httpx2.QueryParams | None = None,
        follow_redirects: bool = True,
        body: BodyCap | None = None,
        error_bodies: bool = False,
        signer: RequestSigner | None = None,
        error: type[AiostreamError] = ResolutionError,
        on_send: Callable[[], None] | None = None,
    ) -> Answer:
        """Send one request as every request of the library is sent, and give its final
        answer: 2xx, 3xx (when not followed), a status a retry cannot mend, or the last
        answer once ``options.max_retries`` retries are spent (``Answer.attempts``
        says how many it took; the caller judges the status).

        Here, for every attempt: the host's gate and the rate-limit quota (waits bounded
        by ``max_rate_limit_wait``, counted from this call), the token of ``access`` to
        its endpoint's origin only (never to a redirect's other host), the ``signer``'s
        signature as the request leaves, the one retry rule (``retryable_status``;
        network errors and timeouts too) with the one backoff, the redirects (at most
        ``MAX_REDIRECTS``, to http(s) only), each attempt's whole answer within
        ``timeout`` plus a second, and the body read within ``body`` (of error answers
        too with ``error_bodies``). A failure a retry cannot mend, or the last network
        failure, is ``error`` naming the URL. ``on_send`` is called for each attempt.
        """
        self.check_open()
        if access is not None:
            access.check_online(url)
        token = None if signer is not None or access is None else access.token
        endpoint = access.endpoint if access is not None else url
        host = host_key(url)
        owner = object()  # this call's place in the host's gate
        o = options
        deadline = anyio.current_time() + o.max_rate_limit_wait
        attempts = 0
        while True:
            attempts += 1
            if on_send is not None:
                on_send()
            await self.acquire(
                host,
                owner,
                deadline=deadline,
                url=url,
                pacing=o.pacing(),
                token=token if auth_headers(url, token, endpoint) else None,
            )
            try:
                outcome = await self._attempt(
                    owner,
                    method,
                    url,
                    params,
                    (token, endpoint),
                    follow_redirects,
                    body,
                    attempts,
                    o,
                    signer=signer,
                    error_bodies=error_bodies,
                    error=error,
                )
            finally:
                self.release(host, owner)
            if isinstance(outcome, Answer):
                status = outcome.response.status_code
                if not retryable_status(status) or attempts > o.max_retries:
                    return Answer(outcome.response, outcome.body, attempts)
                delay = self.retry_wait(
                    url,
                    f"HTTP {status}",
                    attempts,
                    o,
                    server_delay=retry_after(outcome.response.headers.get("retry-after")),
                    status=status,
                    paused=status == 429 and host_key(str(outcome.response.url)) == host,
                )
            else:
                if attempts > o.max_retries:
                    raise error(
                        f"{method} {url} failed after {attempts} attempts: {outcome.reason}"
                    ) from outcome.error
                delay = self.retry_wait(
                    url, outcome.reason, attempts, o, server_delay=outcome.delay or None
                )
            if delay > 0:
                await anyio.sleep(delay)

    async def _attempt(
        self,
        owner: object,
        method: str,
        url: str,
        params: httpx2.QueryParams | None,
        auth: tuple[str | None, str],
        follow_redirects: bool,
        body: BodyCap | None,
        attempts: int,
        o: StreamOptions,
        *,
        signer: RequestSigner | None,
        error_bodies: bool,
        error: type[AiostreamError],
    ) -> Answer | Failure:
        """One attempt: the request, its redirects and its body, within ``timeout``.

        An answer (any status) or a retryable failure; errors a retry cannot mend
        (a body over its cap, a redirect loop, an invalid URL) are raised."""
        token, endpoint = auth
        current = url
        try:
            with anyio.move_on_after(o.timeout + WHOLE_ANSWER_MARGIN_S):
                for hop in range(MAX_REDIRECTS + 1):
                    request = self.http.build_request(
                        method,
                        current,
                        params=params if hop == 0 else None,  # a Location carries its query
                        headers=auth_headers(current, token, endpoint),
                        timeout=o.timeout,
                    )
                    response = await self.send(request, stream=True, signer=signer)
                    try:
                        self.note_response(
                            host_key(current),
                            owner,
                            response.headers,
                            response.status_code,
                            failures=attempts - 1,
                            backoff_base=o.backoff_base,
                            backoff_max=o.backoff_max,
                        )
                        if follow_redirects and response.has_redirect_location:
                            current = redirect_target(response, method, url, error)
                            continue
                        content = b""
                        if body is not None and (response.status_code < 400 or error_bodies):
                            content = await read_capped(response, body, method, error)
                        return Answer(response, content)
                    finally:
                        with anyio.CancelScope(shield=True):
                            await response.aclose()
                raise error(
                    f"{method} {url} redirects more than {MAX_REDIRECTS} times "
                    f"(MAX_REDIRECTS), the last time to {current}: a redirect loop?"
                )
            return Failure(
                f"no whole answer within {o.timeout + WHOLE_ANSWER_MARGIN_S:g} s "
                "(StreamOptions.timeout, plus a second)",
                None,
            )
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
            failed = url_of(exc, current)
            # Raises UnreachableError for a host that never answered, on its second try.
            hint = getattr(signer, "unreachable_hint", None)  # a store's own endpoint
            delay = self.connect_failed(host_key(failed), failed, exc, attempts, hint=hint)
            return Failure(f"{type(exc).__name__}: {exc}", exc, delay)
        except httpx2.UnsupportedProtocol as exc:
            raise error(f"{method} {url_of(exc, current)}: {exc}") from exc
        except httpx2.TransportError as exc:
            return Failure(f"{type(exc).__name__}: {exc}", exc)
        except httpx2.HTTPError as exc:  # TooManyRedirects, DecodingError: a retry can't help
            raise error(
                f"{method} {url_of(exc, current)} failed: {type(exc).__name__}: {exc}"
            ) from exc
        except httpx2.InvalidURL as exc:
            raise error(f"{method} {current!r}: not a valid URL: {exc}") from exc

    # -- slots and host gates (plain synchronous state, awaited only to wait) ---------------

    async def acquire(
        self,
        host: str,
        owner: object,
        limiter: anyio.CapacityLimiter | None = None,
        *,
        deadline: float | None = None,
        url: str = "",
        pacing: Pacing | None = None,
        token: str | None = None,
    ) -> None:
        """Wait until ``host`` may be sent a request, then take a slot (the caller's
        ``limiter`` first, if any, then one of this client's).

        ``deadline`` (``anyio.current_time()``) bounds the wait for a rate-limited host:
        a pause the server wants to last past it raises ``RateLimitedError`` at once.
        With ``pacing``, the request (to ``url``, sent with ``token``) also takes one
        from its bucket's rate-limit quota, shared by the processes that use the same
        ``pacing.folder``, and waits for the window's reset when it is spent.
        """
        waited = False
        try:
            while True:
                wait = self._gate_nowait(host, owner)
                if isinstance(wait, float):
                    self._check_wait(host, deadline, url)
                    await anyio.sleep_until(wait)
                    continue
                if wait is not None:
                    await wait.wait()
                    continue
                if limiter is not None:
                    await limiter.acquire_on_behalf_of(owner)
                try:
                    await self._slots.acquire_on_behalf_of(owner)
                except BaseException:
                    if limiter is not None:
                        limiter.release_on_behalf_of(owner)
                    raise
                blocked = self._blocked(host, owner)  # paused while we waited for a slot
                quota_wait = None if blocked else self._take_quota(host, owner, url, pacing, token)
                if blocked or quota_wait is not None:
                    self._slots.release_on_behalf_of(owner)
                    if limiter is not None:
                        limiter.release_on_behalf_of(owner)
                if quota_wait is not None:
                    kind, until = quota_wait
                    left = until - time.time()
                    if kind == "wait":
                        self._check_quota_wait(host, deadline, url, left)
                        if not waited:
                            self._paced += 1
                            waited = True
                        self._paced_seconds += max(0.0, left)
                    await anyio.sleep(max(0.0, left))
                    continue
                if blocked:
                    continue
                break
        except BaseException:
            self.end_probe(host, owner, answered=False)
            raise
        self._in_flight += 1
        self._max_in_flight = max(self._max_in_flight, self._in_flight)

    def release(
        self, host: str, owner: object, limiter: anyio.CapacityLimiter | None = None
    ) -> None:
        """Give back the slot ``acquire`` took."""
        ticket = self._tickets.pop(id(owner), None)
        if ticket is not None and ticket.probe and not ticket.answered:
            self._quota.probe_ended(ticket.key)  # the next request (of any process) probes
        self._in_flight -= 1
        self._slots.release_on_behalf_of(owner)
        if limiter is not None:
            limiter.release_on_behalf_of(owner)
        self.end_probe(host, owner, answered=False)

    def _check_wait(self, host: str, deadline: float | None, url: str) -> None:
        gate = self._hosts[host]
        asked = max(gate.asked_until, gate.paused_until)
        if deadline is None or asked <= deadline:
            return
        self._rate_limit_failures += 1
        now = anyio.current_time()
        resume_at = time.time() + (asked - now)
        raise RateLimitedError(
            f"{url or host}: {host} rate-limited us until {_clock(resume_at)} "
            f"({asked - now:.0f} s from now), past the {deadline - now:.0f} s this request "
            "may still wait (StreamOptions.max_rate_limit_wait): retry after that time, "
            "raise max_rate_limit_wait, or use a token with a higher quota",
            url=url,
            status=429,
            resume_at=resume_at,
        )

    def _take_quota(
        self, host: str, owner: object, url: str, pacing: Pacing | None, token: str | None
    ) -> tuple[str, float] | None:
        """Take one from the request's rate-limit quota: None (go, and its answer will be
        noted), or ("wait" | "poll", wall-clock time to look again)."""
        if pacing is None or not url:
            return None
        try:
            path = _url_path(url)
        except httpx2.InvalidURL:
            return None
        bucket = bucket_of(path)
        key = SharedQuota.key(pacing, host, bucket, token)
        if not bucket and not self._quota.known_limited(key):
            return None  # not a Hub bucket, and never said it was limited
        now = time.time()
        kind, until = self._quota.take(key, pacing.reserve, now)
        if kind in (GO, PROBE):
            self._tickets[id(owner)] = _Ticket(key, host, now, kind == PROBE)
            return None
        if kind == "wait" and until - now >= LOG_PAUSE_S and self._logged_windows.get(key) != until:
            if len(self._logged_windows) > 64:
                self._logged_windows.clear()
            self._logged_windows[key] = until
            logger.warning(
                '%s: the rate-limit quota of bucket "%s" is spent (shared by the processes '
                "of this machine): requests to it wait %.0f s, until %s",
                host,
                bucket or "?",
                until - now,
                _clock(until),
            )
        return kind, until

    def _check_quota_wait(self, host: str, deadline: float | None, url: str, left: float) -> None:
        if deadline is None or anyio.current_time() + left <= deadline:
            return
        self._rate_limit_failures += 1
        resume_at = time.time() + left
        raise RateLimitedError(
            f"{url or host}: the rate-limit quota of {host} is spent until "
            f"{_clock(resume_at)} ({left:.0f} s from now), past the "
            f"{deadline - anyio.current_time():.0f} s this request may still wait "
            "(StreamOptions.max_rate_limit_wait): retry after that time, raise "
            "max_rate_limit_wait, or use a token with a higher quota",
            url=url,
            status=429,
            resume_at=resume_at,
        )

    def _gate_nowait(self, host: str, owner: object) -> float | anyio.Event | None:
        """None: go. A float: sleep until that time. An Event: wait for the probe's answer."""
        gate = self._hosts.get(host)
        if gate is None:
            return None
        now = anyio.current_time()
        if gate.paused_until > now:
            return gate.paused_until
        if gate.prober is not None:
            return None if gate.prober is owner else gate.probe_done
        if gate.probe_needed:
            # After a pause one request goes first; its RateLimit header says how many may follow.
            gate.probe_needed = False
            gate.prober = owner
            gate.probe_done = anyio.Event()
        return None

    def _blocked(self, host: str, owner: object) -> bool:
        gate = self._hosts.get(host)
        if gate is None:
            return False
        if gate.paused_until > anyio.current_time():
            return True
        return gate.prober is not None and gate.prober is not owner

    def end_probe(self, host: str, owner: object, *, answered: bool) -> None:
        gate = self._hosts.get(host)
        if gate is None or gate.prober is not owner:
            return
        gate.prober = None
        if not answered:
            gate.probe_needed = True  # nothing learned: the next request probes again
        if gate.probe_done is not None:
            gate.probe_done.set()
            gate.probe_done = None

    def note_response(
        self,
        host: str,
        owner: object,
        headers: Mapping[str, str],
        status: int,
        *,
        failures: int,
        backoff_base: float,
        backoff_max: float,
    ) -> None:
        """Learn the host's rate-limit state from an answer; pause the host on a 429."""
        self._answered.add(host)
        limit = ratelimit(headers.get("RateLimit"))
        ticket = self._tickets.get(id(owner))
        paced = ticket is not None and ticket.host == host
        if ticket is not None and paced and not ticket.answered:
            if limit is not None:
                ticket.answered = True
                # A window is counted at most MAX_SERVER_DELAY_S ahead, as a host pause is:
                # one answer must not block the machine's later processes for a year.
                reset = min(limit[1], MAX_SERVER_DELAY_S)
                self._quota.learn(ticket.key, limit[0], reset, ticket.sent_at, time.time())
            elif status < 500 and status != 429:
                ticket.answered = True
                self._quota.unlimited(ticket.key, ticket.sent_at)
        spent = limit is not None and limit[0] <= 0 and not paced
        if status != 429 and not spent and host not in self._hosts:
            return
        gate = self._hosts.setdefault(host, _HostGate())
        now = anyio.current_time()
        added = 0.0
        was_paused = gate.paused_until > now
        if spent and limit is not None:
            # Sent without pacing (no quota count): the host waits for the reset here.
            added = gate.pause(now + min(limit[1], MAX_SERVER_DELAY_S), now + limit[1])
        if status == 429:
            self._throttled += 1
            delay = retry_after(headers.get("Retry-After"))
            if delay is None and limit is not None:
                delay = limit[1]
            if delay is None:
                delay = self.backoff(failures + 1, backoff_base, backoff_max)
            capped = min(delay, max(MAX_SERVER_DELAY_S, backoff_max))
            added = max(added, gate.pause(now + capped, now + delay))
        self._paused_seconds += added
        # A new pause, or one lengthened by a lot, is counted (and logged if long); the
        # 429s of requests already in flight when the host paused only nudge it.
        if added > 0 and (not was_paused or added >= LOG_PAUSE_S):
            self._pauses += 1
            pause = gate.paused_until - now
            if pause >= LOG_PAUSE_S:
                match = _RATELIMIT_BUCKET.match(headers.get("RateLimit") or "")
                logger.warning(
                    "%s rate-limited us (HTTP %s%s): every request to it waits %.0f s, until %s",
                    host,
                    status,
                    f', bucket "{match.group(1)}"' if match else "",
                    pause,
                    _clock(time.time() + pause),
                )
        self.end_probe(host, owner, answered=True)

    # -- hosts that cannot be reached --------------------------------------------------------

    def connect_failed(
        self, host: str, url: str, exc: Exception, failures: int, *, hint: str | None = None
    ) -> float:
        """A connection to ``host`` failed (refused, no DNS name, connect timeout). For a
        host that answered before, 0.0: retry as usual. For one that never answered, the
        seconds to wait before its one quick retry; after that, ``UnreachableError``."""
        if host in self._answered:
            return 0.0
        if failures < 2:
            return UNREACHABLE_RETRY_S
        self._unreachable.add(host)
        raise UnreachableError(
            f"{url}: cannot connect to {host} ({type(exc).__name__}: {exc}); tried "
            f"{failures} times. Is the endpoint right? "
            f"{hint or 'Set HF_ENDPOINT or pass endpoint='} (a local server: is it running?)",
            url=url,
            attempts=failures,
        ) from exc

    # -- the retry policy --------------------------------------------------------------------

    def note_retry(self, url: str, why: str, attempt: int, most: int, delay: float) -> None:
        """A request to ``url`` failed (``why``) and is retried: one WARNING line, at most
        one per host every ``LOG_RETRY_EVERY_S`` (the others are counted in the next), so
        that a silent or failing endpoint is never silent. A 429's wait is the host's
        pause, logged apart (``note_response``)."""
        try:
            host = host_key(url)
        except httpx2.InvalidURL:
            host = "?"
        now = time.monotonic()
        logged_at, quiet = self._logged_retries.get(host, (float("-inf"), 0))
        if now - logged_at < LOG_RETRY_EVERY_S:
            self._logged_retries[host] = (logged_at, quiet + 1)
            return
        if len(self._logged_retries) > 64:
            self._logged_retries.clear()
        self._logged_retries[host] = (now, 0)
        more = f" ({quiet} more retries to {host} since the last line)" if quiet else ""
        logger.warning(
            "%s: %s; retry %d of %d in %.1f s%s",
            _short_url(url),
            why,
            attempt,
            most,
            delay,
            more,
        )

    def retry_wait(
        self,
        url: str,
        why: str,
        attempt: int,
        options: StreamOptions,
        *,
        server_delay: float | None = None,
        status: int | None = None,
        paused: bool = False,
    ) -> float:
        """The one retry policy's wait before retry number ``attempt`` of a request to
        ``url`` that failed (``why``), for the resolver's requests and the fetcher's reads
        alike: none when the host is ``paused`` (a 429: the host's gate is the wait),
        else the server's ``Retry-After`` (``server_delay``) within bounds, else the
        jittered backoff. Logged (``note_retry``), except a 429's: the host's pause is
        logged with it (``note_response``)."""
        if paused:
            return 0.0
        o = options
        delay = self.retry_delay(
            attempt,
            server_delay,
            base=o.backoff_base,
            cap=o.backoff_max,
            most=o.max_rate_limit_wait,
        )
        if status != 429:
            self.note_retry(url, why, attempt, o.max_retries, delay)
        return delay

    def backoff(self, failures: int, base: float, cap: float) -> float:
        """Jittered exponential backoff before retry number ``failures``."""
        return backoff_delay(failures, base, cap, self._rng)

    def retry_delay(
        self,
        failures: int,
        server_delay: float | None,
        *,
        base: float,
        cap: float,
        most: float = MAX_SERVER_DELAY_S,
    ) -> float:
        """How long to wait before a retry: the server's ``Retry-After`` when it gave one
        (at most the Hub's rate-limit window, or ``cap`` if longer, and never more than
        ``most``: ``StreamOptions.max_rate_limit_wait``), else the backoff."""
        if server_delay is None:
            return self.backoff(failures, base, cap)
        return min(server_delay, max(MAX_SERVER_DELAY_S, cap), most)

    # -- where files are served (plain synchronous state) -----------------------------------

    def route_of(self, key: str) -> Route | None:
        """The route cached for file ``key`` (expired or not), without taking the lead."""
        return self._routes.get(key)

    def route_nowait(self, key: str, own: Route | None) -> tuple[Route | Pending | None, bool]:
        """Where to read file ``key``: a cached route, a resolution to wait for, or None
        (this caller resolves it: it is the leader until ``set_route``/``resolution_ended``).
        The flag says a cached route had expired and was dropped."""
        route = self._routes.get(key)
        dropped = False
        if route is not None:
            # A route the caller just learned is used at least once, expired or not:
            # the server decides, and 401/403/410 re-resolves.
            if route is own or not route.expired(time.time()):
                return route, False
            del self._routes[key]
            dropped = True
        pending = self._pending.get(key)
        if pending is not None:
            return pending, dropped
        self._pending[key] = Pending()
        return None, dropped

    def set_route(self, key: str, route: Route, *, leader: bool) -> None:
        self._routes[key] = route
        if leader:
            pending = self._pending.pop(key, None)
            if pending is not None:
                pending.done.set()

    def invalidate(self, key: str, route: Route) -> bool:
        """Drop ``route`` unless a newer one was learned meanwhile; True if dropped."""
        if self._routes.get(key) is route:
            del self._routes[key]
            return True
        return False

    def resolution_ended(self, key: str, error: Exception | None) -> None:
        """The leader failed (error) or went away (None: a waiting reader takes over)."""
        pending = self._pending.pop(key, None)
        if pending is not None:
            pending.error = error
            pending.done.set()


class _Ticket:
    """A request that took one from a shared rate-limit quota, until its slot is given back."""

    __slots__ = ("answered", "host", "key", "probe", "sent_at")

    def __init__(self, key: Path, host: str, sent_at: float, probe: bool) -> None:
        self.key = key
        self.host = host
        self.sent_at = sent_at  # wall clock
        self.probe = probe
        self.answered = False


def _short_url(url: str, limit: int = 200) -> str:
    """A URL for a log line: as ``display_url`` shows it, and short."""
    base = display_url(url)
    return base if len(base) <= limit else base[: limit - 3] + "..."


def _clock(epoch_seconds: float) -> str:
    """A wall-clock time for messages: 2026-12-03 16:40:05 UTC."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_seconds))
    except (OverflowError, OSError, ValueError):  # past what the platform's clock holds
        return "a time too far ahead to tell"


# -- one default client per event loop --------------------------------------------------------


class _LoopClient:
    __slots__ = ("client",)

    def __init__(self, client: HubClient) -> None:
        self.client = client


_LOOP_CLIENT: RunVar[_LoopClient | None] = RunVar("aiostream_hf_client", default=None)


@contextlib.asynccontextmanager
async def use_client(client: HubClient | None = None) -> AsyncIterator[HubClient]:
    """``client`` if given (its owner closes it), else this event loop's default client:
    made by its first user, closed when its last user leaves."""
    if client is not None:
        client.check_open()
        client._users += 1
        client._max_users = max(client._max_users, client._users)
        try:
            yield client
        finally:
            client._users -= 1
        return
    holder = _LOOP_CLIENT.get()
    if holder is None or holder.client.closed:
        holder = _LoopClient(HubClient())
        _LOOP_CLIENT.set(holder)
    shared = holder.client
    shared._users += 1
    shared._max_users = max(shared._max_users, shared._users)
    try:
        yield shared
    finally:
        shared._users -= 1
        if shared._users == 0:
            if _LOOP_CLIENT.get() is holder:
                _LOOP_CLIENT.set(None)  # a user arriving from now on makes a new one
            await shared.aclose()
