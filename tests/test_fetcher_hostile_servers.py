"""Reads from hostile HTTP servers over loopback (issue 31): a server that cuts every
body after a byte, one with no validator whose file changes between a cut and its
resume, and one that redirects to a URL that cannot be parsed."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from aiostream_hf import FetchError, RetriesExhaustedError, StreamOptions
from aiostream_hf._fetcher import RangeFetcher
from aiostream_hf._models import FileRef
from aiostream_hf._transfer import MIN_PROGRESS_BYTES

pytestmark = pytest.mark.anyio

Answer = Callable[[BaseHTTPRequestHandler, int], None]


class _Server:
    """A loopback HTTP server whose GETs are answered by ``answer(handler, n)``
    (``n`` counts the requests, from 1)."""

    def __init__(self, answer: Answer) -> None:
        self.requests: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                server.requests.append({k.lower(): v for k, v in self.headers.items()})
                answer(self, len(server.requests))

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Answer], _Server]]:
    servers: list[_Server] = []

    def start(answer: Answer) -> _Server:
        server = _Server(answer).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)


def _range(handler: BaseHTTPRequestHandler, size: int) -> tuple[int, int]:
    first, _, last = handler.headers["Range"].removeprefix("bytes=").partition("-")
    return int(first), min(size, int(last) + 1 if last else size)


def _cut_answer(
    handler: BaseHTTPRequestHandler, data: bytes, send: int, headers: dict[str, str]
) -> None:
    """A 206 for the range asked that promises all of it, sends ``send`` bytes and closes."""
    start, end = _range(handler, len(data))
    handler.send_response(206)
    handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
    handler.send_header("Content-Length", str(end - start))
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(data[start : start + send])
    handler.wfile.flush()
    handler.close_connection = True


def _options(**more: object) -> StreamOptions:
    base: dict[str, object] = {"backoff_base": 0.001, "backoff_max": 0.002, "max_retries": 3}
    base.update(more)
    return StreamOptions(**base)  # type: ignore[arg-type]


async def test_a_server_that_cuts_every_body_after_a_byte_runs_out_of_retries(
    serve: Callable[[Answer], _Server],
) -> None:
    """Each answer brings a byte: before, each byte counted as progress and the read
    resumed once per byte (thousands of requests); now it fails after max_retries."""
    data = os.urandom(MIN_PROGRESS_BYTES)
    server = serve(lambda h, n: _cut_answer(h, data, 1, {"ETag": '"v1"'}))
    ref = FileRef(url=f"{server.url}/data.bin", path="data.bin", size=len(data))
    async with RangeFetcher(_options(), endpoint=server.url) as fetcher:
        with pytest.raises(RetriesExhaustedError, match="data.bin") as info:
            await fetcher.read(ref, 0, len(data))
    assert info.value.attempts == 4  # max_retries=3: the first answer and three resumes
    assert len(server.requests) == 4


async def test_a_body_cut_after_real_progress_still_resumes(
    serve: Callable[[Answer], _Server],
) -> None:
    """Answers that each bring MIN_PROGRESS_BYTES are progress: more cuts than
    max_retries still read the whole span."""
    data = os.urandom(5 * MIN_PROGRESS_BYTES)
    server = serve(lambda h, n: _cut_answer(h, data, MIN_PROGRESS_BYTES, {"ETag": '"v1"'}))
    ref = FileRef(url=f"{server.url}/data.bin", path="data.bin", size=len(data))
    async with RangeFetcher(_options(max_retries=1), endpoint=server.url) as fetcher:
        assert await fetcher.read(ref, 0, len(data)) == data
    assert len(server.requests) == 5
    assert [r["if-range"] for r in server.requests[1:]] == ['"v1"'] * 4


async def test_a_cut_body_without_validator_is_not_resumed_onto_other_bytes(
    serve: Callable[[Answer], _Server],
) -> None:
    """No ETag, no Last-Modified, and the file changes after the cut: the resume
    would splice two files together, so the read fails and says why."""
    old, new = os.urandom(4096), os.urandom(4096)

    def answer(handler: BaseHTTPRequestHandler, n: int) -> None:
        if n == 1:
            _cut_answer(handler, old, 1000, {})
            return
        start, end = _range(handler, len(new))
        handler.send_response(206)
        handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(new)}")
        handler.send_header("Content-Length", str(end - start))
        handler.end_headers()
        handler.wfile.write(new[start:end])

    server = serve(answer)
    ref = FileRef(url=f"{server.url}/data.bin", path="data.bin", size=len(old))
    async with RangeFetcher(_options(), endpoint=server.url) as fetcher:
        with pytest.raises(FetchError, match="no ETag, no Last-Modified") as info:
            await fetcher.read(ref, 0, len(old))
    assert "data.bin" in str(info.value)
    assert len(server.requests) == 1  # no resume was sent


async def test_a_redirect_to_an_unparsable_url_is_a_fetch_error(
    serve: Callable[[Answer], _Server],
) -> None:
    def answer(handler: BaseHTTPRequestHandler, n: int) -> None:
        handler.send_response(302)
        handler.send_header("Location", "http://[::1")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    server = serve(answer)
    ref = FileRef(url=f"{server.url}/data.bin", path="data.bin", size=100)
    async with RangeFetcher(_options(), endpoint=server.url) as fetcher:
        with pytest.raises(FetchError, match=r"not a valid URL") as info:
            await fetcher.read(ref, 0, 100)
    assert "data.bin" in str(info.value)
