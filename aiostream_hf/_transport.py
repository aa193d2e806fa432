"""The client's HTTP transport: range GETs on threads, TLS set up on first use.

Byte-range GETs (the fetcher's reads) go to ``ThreadedRangeTransport`` (urllib3 in
worker threads, ``_ranged``); every other request to httpx2's own pool, one per scheme.

A TLS context that verifies certificates reads the CA bundle when it is made
(~20 ms, in the event loop). A process that reads over plain HTTP (a local
server, a plain-HTTP object store) never needs it, and one that does makes it
once (``tls_context``), however many fetchers it opens.
"""

from __future__ import annotations

import functools
import ssl

import httpx2

from ._ranged import ThreadedRangeTransport

__all__ = ["SchemeTransport", "tls_context"]


@functools.lru_cache(maxsize=1)
def tls_context() -> ssl.SSLContext:
    """httpx2's default verifying TLS context, made once per process."""
    return httpx2.create_ssl_context()


class SchemeTransport(httpx2.AsyncBaseTransport):
    """Range GETs to the threaded transport; the rest to one pool per scheme, each made
    on its scheme's first request.

    ``limits`` applies to each pool; the fetcher's own limiter bounds the total.
    """

    def __init__(self, limits: httpx2.Limits) -> None:
        self._limits = limits
        self._pools: dict[str, httpx2.AsyncHTTPTransport] = {}
        self._ranges = ThreadedRangeTransport(limits.max_connections or 16, tls_context)
        self._closed = False

    def _pool(self, scheme: str) -> httpx2.AsyncHTTPTransport:
        pool = self._pools.get(scheme)
        if pool is None:
            if self._closed:
                raise RuntimeError("this transport is closed")
            # Plain HTTP never uses its context: an unverifying one costs no CA bundle.
            verify: ssl.SSLContext | bool = tls_context() if scheme == "https" else False
            pool = httpx2.AsyncHTTPTransport(verify=verify, limits=self._limits)
            self._pools[scheme] = pool
        return pool

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if self._ranges.handles(request):
            if self._closed:
                raise RuntimeError("this transport is closed")
            return await self._ranges.handle_async_request(request)
        return await self._pool(request.url.scheme).handle_async_request(request)

    async def aclose(self) -> None:
        self._closed = True
        pools, self._pools = list(self._pools.values()), {}
        try:
            for pool in pools:
                await pool.aclose()
        finally:
            await self._ranges.aclose()
