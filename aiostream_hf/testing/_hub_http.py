"""The HTTP plumbing of the local Hub server's ASGI app.

ASGI types, the response record (a body in memory or a slice of a file's content),
JSON and error answers in the Hub's shape, the body's pieces on the way out, and
what is read from a request: its body, its bearer token, its client, a disconnect.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from ._hub_content import _Content

__all__: list[str] = []

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass
class _Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    content: _Content | None = None  # body from a file: content[start:start+length]
    start: int = 0
    length: int = 0

    @property
    def body_length(self) -> int:
        return self.length if self.content is not None else len(self.body)


def _json(status: int, data: Any, headers: Mapping[str, str] | None = None) -> _Response:
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    return _Response(status, h, json.dumps(data).encode())


def _error(status: int, code: str | None, message: str, **headers: str) -> _Response:
    h = {"X-Error-Message": message, **headers}
    if code:
        h["X-Error-Code"] = code
    return _json(status, {"error": message}, h)


def _split(chunk: bytes, piece: int) -> Iterator[bytes]:
    if not piece:
        yield chunk
        return
    for i in range(0, len(chunk), piece):
        yield chunk[i : i + piece]


async def _client_gone(receive: Receive, seconds: float) -> bool:
    """Wait ``seconds``; True as soon as the client disconnects meanwhile."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        try:
            message = await asyncio.wait_for(receive(), left)
        except asyncio.TimeoutError:
            return False
        if message["type"] == "http.disconnect":
            return True
    return False


def _chunks(response: _Response, limit: int, step: int) -> Iterator[bytes]:
    if response.content is None:
        if limit > 0:
            yield response.body[:limit]
        return
    yield from response.content.chunks(response.start, limit, step)


def _bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization", "")
    if value.lower().startswith("bearer "):
        return value[7:].strip() or None
    return None


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "anonymous"


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > 16 * 1024 * 1024:
            raise ValueError("request body over 16 MiB")  # bounded: no API body is this large
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
