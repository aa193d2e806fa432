"""The shared client keeps no cookie: a server that sets them on every answer never gets
one back, nor does any other host or port (the Hub needs none; a jar that kept them
would grow every request's ``Cookie`` header until servers refuse it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import aiostream_hf as ash
from aiostream_hf._client import HubClient

pytestmark = pytest.mark.anyio


class _Setter:
    """A loopback server answering every GET with 30 cookies of 3 KB; records the
    ``Cookie`` header of each request (None: none sent)."""

    def __init__(self) -> None:
        self.cookies: list[str | None] = []
        setter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                setter.cookies.append(self.headers.get("Cookie"))
                self.send_response(200)
                for i in range(30):
                    self.send_header("Set-Cookie", f"c{i}={'x' * 3000}; Path=/")
                self.send_header("Set-Cookie", "wide=1; Path=/; Domain=127.0.0.1")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Setter:
        self.thread.start()
        return self

    def __exit__(self, *args: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def setters() -> Iterator[tuple[_Setter, _Setter]]:
    with _Setter() as one, _Setter() as two:
        yield one, two


async def test_no_cookie_is_kept_or_sent_to_any_host(setters: tuple[_Setter, _Setter]) -> None:
    options = ash.StreamOptions(max_retries=0)
    async with HubClient() as client:
        for i in range(10):
            for server in setters:
                answer = await client.request("GET", f"{server.url}/f{i}", options=options)
                assert answer.response.status_code == 200
    for server in setters:
        assert server.cookies == [None] * 10
