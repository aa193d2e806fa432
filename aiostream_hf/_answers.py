"""What one request of the client brings back, and the checks on the way: a body read
within its cap, a redirect's target, the URL an httpx error is about.

``HubClient.request`` uses these; they hold no state."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import httpx2

from ._exceptions import AiostreamError

__all__ = ["Answer", "BodyCap", "Failure", "read_capped", "redirect_target", "short", "url_of"]


@dataclass(frozen=True, slots=True)
class BodyCap:
    """The most bytes a body may have, and the constant's name (for the message)."""

    limit: int
    name: str


@dataclass(frozen=True, slots=True)
class Answer:
    """A final answer: the response (closed; its status, headers and links stay
    readable), its body (empty when none was read) and the attempts it took."""

    response: httpx2.Response
    body: bytes
    attempts: int = 1


@dataclass(frozen=True, slots=True)
class Failure:
    """An attempt that may succeed if tried again: a network error or a timeout."""

    reason: str
    error: Exception | None
    delay: float = 0.0  # > 0: retry after this (a quick retry); else the usual backoff


def short(value: object, limit: int = 200) -> str:
    """``repr(value)``, cut for a message (a server chooses what it sends)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


async def read_capped(
    response: httpx2.Response, cap: BodyCap, method: str, error: type[AiostreamError]
) -> bytes:
    """The body of ``response``, refused past ``cap`` before it is all read (and before a
    byte is read when ``Content-Length`` announces more)."""
    url = str(response.url)
    declared = response.headers.get("content-length", "").strip()
    if declared.isascii() and declared.isdigit() and int(declared) > cap.limit:
        raise error(
            f"{method} {url} announces a body of {int(declared)} bytes, over the {cap.limit} "
            f"bytes ({cap.name}) read of it: refusing it"
        )
    chunks: list[bytes] = []
    total = 0
    # aclosing: a generator left mid-way is closed here, not by the garbage collector.
    async with contextlib.aclosing(response.aiter_bytes()) as pieces:
        async for chunk in pieces:
            total += len(chunk)
            if total > cap.limit:
                raise error(
                    f"{method} {url} sends a body over the {cap.limit} bytes ({cap.name}) "
                    "read of it: refusing the rest"
                )
            chunks.append(chunk)
    return b"".join(chunks)


def redirect_target(
    response: httpx2.Response, method: str, url: str, error: type[AiostreamError]
) -> str:
    """Where a redirect points: an absolute http(s) URL, or ``error``."""
    location = response.headers["location"]
    try:
        target = response.url.join(location).copy_with(fragment=None)
    except httpx2.InvalidURL as exc:
        raise error(
            f"{method} {url} redirects to {short(location)}, not a valid URL: {exc}"
        ) from exc
    if target.scheme not in ("http", "https") or not target.host:
        raise error(
            f"{method} {url} redirects to {short(location)}, not an http(s) URL: refusing it"
        )
    return str(target)


def url_of(exc: httpx2.HTTPError, fallback: str) -> str:
    """The URL of the request an httpx error is about (a redirect's, maybe)."""
    try:
        return str(exc.request.url)
    except RuntimeError:  # the error was raised before a request was made
        return fallback
