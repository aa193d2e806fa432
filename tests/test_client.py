"""HubClient: one connection pool and one set of host gates per event loop.

Unit tests drive the client through an ``httpx2.MockTransport``; the integration test
runs eight streams of different formats against the local Hub server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

import aiostream_hf as ash
from aiostream_hf import lerobot, video
from aiostream_hf._client import HubClient, auth_headers, use_client
from aiostream_hf._fetcher import RangeFetcher
from aiostream_hf._models import FileRef
from aiostream_hf._resolver import Resolver
from aiostream_hf.testing import (
    HubServer,
    make_lerobot_dataset,
    make_repo,
    make_text_parquet,
    make_video,
    make_webdataset_shards,
)

pytestmark = pytest.mark.anyio

HUB = "http://hub.test"
FILE = FileRef(url=f"{HUB}/datasets/org/name/resolve/{'a' * 40}/data.bin", path="data.bin", size=4)


class _Recorder:
    """A fake Hub: the first request of ``refuse`` ("api" or "resolve") gets a 429 with
    Retry-After; every request's path is recorded."""

    def __init__(self, refuse: str) -> None:
        self.refuse = refuse
        self.paths: list[str] = []
        self.refused = anyio.Event()

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        self.paths.append(path)
        kind = "api" if path.startswith("/api/") else "resolve"
        if kind == self.refuse and not self.refused.is_set():
            self.refused.set()
            return httpx2.Response(429, headers={"Retry-After": "30"})
        if kind == "resolve":
            return httpx2.Response(206, content=b"data", headers={"Content-Range": "bytes 0-3/4"})
        return httpx2.Response(404, json={"error": "not in this fake"})


@pytest.mark.parametrize("refused", ["api", "resolve"])
async def test_a_429_pauses_the_host_for_the_resolver_and_the_fetcher_alike(
    tmp_path: Path, refused: str
) -> None:
    """Whichever of the two is refused first, the other sends nothing to that host until
    the pause ends (30 s here: the test looks for half a second, then leaves)."""
    hub = _Recorder(refused)
    options = ash.StreamOptions(cache_dir=tmp_path, backoff_base=0.001, backoff_max=0.01)
    async with (
        HubClient(transport=httpx2.MockTransport(hub)) as client,
        Resolver(options=options, client=client) as resolver,
        RangeFetcher(options, endpoint=HUB, client=client) as fetcher,
    ):

        async def resolve() -> None:
            await resolver.resolve("hf://datasets/org/name", endpoint=HUB)

        async def read() -> None:
            await fetcher.read(FILE, 0, 4)

        first, second = (resolve, read) if refused == "api" else (read, resolve)
        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await hub.refused.wait()
            assert client.statistics().paused_hosts == 1
            with anyio.move_on_after(0.5):
                await second()
            tg.cancel_scope.cancel()
    assert len(hub.paths) == 1  # the refused request; nothing went out after it
    assert client.statistics().throttled == 1


def test_a_token_goes_to_its_own_hub_only() -> None:
    assert auth_headers(f"{HUB}/api/x", "t", HUB) == {"Authorization": "Bearer t"}
    assert auth_headers("http://hub.test:8080/api/x", "t", HUB) == {}
    assert auth_headers("https://hub.test/api/x", "t", HUB) == {}
    assert auth_headers("http://cdn.test/x", "t", HUB) == {}
    assert auth_headers(f"{HUB}/api/x", None, HUB) == {}


async def test_the_loop_client_is_shared_then_closed_by_its_last_user() -> None:
    async with use_client() as a, use_client() as b:
        assert a is b
        assert a.statistics().users == 2
    assert a.closed
    async with use_client() as c:
        assert c is not a  # a user after the last one left gets a new one
    mine = HubClient()
    async with use_client(mine) as d:
        assert d is mine
    assert not mine.closed  # its owner closes it
    await mine.aclose()
    with pytest.raises(ash.ClosedResourceError):
        async with use_client(mine):
            pass


def test_bad_max_connections() -> None:
    with pytest.raises(ash.SourceError, match="max_connections"):
        HubClient(max_connections=0)


# -- eight streams of four kinds, one pool -------------------------------------------------


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    data = tmp_path_factory.mktemp("data")
    parquet = data / "p.parquet"
    make_text_parquet(parquet, rows=200, row_group_size=50)
    make_repo(root, "org/text", {"data/train-00000-of-00001.parquet": parquet})
    shards = make_webdataset_shards(data / "shards", shards=2, samples_per_shard=20)
    make_repo(root, "org/tars", {f"train/{p.name}": p for p in shards})
    clip = data / "clip.mp4"
    make_video(clip, frames=30, width=64, height=48)
    make_repo(root, "org/clips", {"clip.mp4": clip})
    make_lerobot_dataset(root, "org/robot", episodes=[10, 10], width=64, height=48)
    return root


async def test_eight_streams_of_four_kinds_share_one_client(hub_root: Path, tmp_path: Path) -> None:
    options = ash.StreamOptions(cache_dir=tmp_path / "cache", max_concurrency=2)
    counts: dict[str, int] = {}
    with HubServer(hub_root) as server:
        ep = server.endpoint

        async def rows(name: str, source: str, **kw: Any) -> None:
            async with ash.stream(source, endpoint=ep, options=options, **kw) as s:
                counts[name] = sum([1 async for _ in s])

        async def frames(name: str) -> None:
            url = f"{ep}/datasets/org/clips/resolve/main/clip.mp4"
            async with video.open(url) as reader:
                counts[name] = len((await reader.frames_at([0.0, 0.5])).pts)

        async def items(name: str) -> None:
            s = lerobot.stream("hf://datasets/org/robot", endpoint=ep, options=options)
            async with s:
                counts[name] = sum([1 async for _ in s])

        async with use_client() as client:  # the loop's client, as every stream gets it
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(rows, f"parquet{i}", "hf://datasets/org/text")
                for i in range(3):
                    tg.start_soon(rows, f"tar{i}", "hf://datasets/org/tars")
                tg.start_soon(frames, "video")
                tg.start_soon(items, "lerobot")
            stats = client.statistics()
        served = server.stats()
    assert counts == {
        **{f"parquet{i}": 200 for i in range(3)},
        **{f"tar{i}": 40 for i in range(3)},
        "video": 2,
        "lerobot": 20,
    }
    assert stats.max_users == 9  # this test's own use, and the eight
    assert stats.requests == served.requests  # every request went through the one client
    assert served.connections <= stats.max_connections  # and one pool bounds them all
    assert client.closed  # closed by its last user


async def test_the_429s_of_requests_in_flight_make_one_pause_and_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = HubClient(transport=httpx2.MockTransport(lambda r: httpx2.Response(200)))
    headers = {"Retry-After": "30", "RateLimit": '"api";r=0;t=30'}
    with caplog.at_level("WARNING", logger="aiostream_hf"):
        async with client:
            for _ in range(5):  # five requests in flight when the host said stop
                client.note_response(
                    "hub.test:80",
                    object(),
                    headers,
                    429,
                    failures=0,
                    backoff_base=0.1,
                    backoff_max=1.0,
                )
                await anyio.sleep(0.01)
            stats = client.statistics()
    assert (stats.pauses, stats.throttled, stats.paused_hosts) == (1, 5, 1)
    assert 29.0 < stats.paused_seconds < 31.0
    warned = [r for r in caplog.records if "rate-limited us" in r.getMessage()]
    assert len(warned) == 1
    assert 'bucket "api"' in warned[0].getMessage()


# -- one HTTP stack: every request over the threaded urllib3 transport -----------------------


async def test_the_transport_sends_bodies_and_heads(hub_root: Path) -> None:
    """API calls go over the same transport as range reads: a POST's form body reaches
    the server (paths-info answers the paths that exist), a HEAD answers without a body."""
    from aiostream_hf._transport import ThreadedTransport

    name = "data/train-00000-of-00001.parquet"
    with HubServer(hub_root) as server:
        ep = server.endpoint
        async with httpx2.AsyncClient(transport=ThreadedTransport(2)) as http:
            info = await http.post(
                f"{ep}/api/datasets/org/text/paths-info/main",
                data={"paths": [name, "data/missing.parquet"]},
            )
            head = await http.head(f"{ep}/datasets/org/text/resolve/main/{name}")
    assert info.status_code == 200
    assert [entry["path"] for entry in info.json()] == [name]
    assert head.status_code == 302  # an LFS-like file: the Hub redirects to its CDN
    assert head.headers["X-Linked-Size"] == str(
        (hub_root / "datasets/org/text" / name).stat().st_size
    )
    assert head.content == b""


async def test_a_body_read_to_its_end_takes_no_read_to_find_its_end(
    hub_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body of known length read in pieces ends with its last byte: no worker-thread
    hand-off to read nothing (http.client's read1 leaves that to a read of b""), and the
    connection goes back to the pool: the next requests reuse it."""
    from aiostream_hf import _transport
    from aiostream_hf._transport import ThreadedTransport

    reads: list[int] = []
    read = _transport._Body._read

    def counted(self: Any) -> bytes:
        data = read(self)
        reads.append(len(data))
        return data

    monkeypatch.setattr(_transport._Body, "_read", counted)
    name = "data/train-00000-of-00001.parquet"
    whole = (hub_root / "datasets/org/text" / name).read_bytes()
    with HubServer(hub_root) as server:
        url = f"{server.endpoint}/datasets/org/text/resolve/main/{name}"
        async with httpx2.AsyncClient(transport=ThreadedTransport(2)) as http:
            cdn = (await http.get(url)).headers["Location"]  # a redirect: an empty body
            server.reset_stats()
            reads.clear()
            for start in (0, 1000, 2000):
                headers = {"Range": f"bytes={start}-{start + 99}"}
                async with http.stream("GET", cdn, headers=headers) as answer:
                    got = b"".join([piece async for piece in answer.aiter_raw()])
                assert got == whole[start : start + 100]
        stats = server.stats()
    assert reads == [100, 100, 100]  # one read each, of its 100 bytes
    assert stats.connections == 1


async def test_a_body_read_to_its_end_keeps_its_connection_until_it_is_closed(
    hub_root: Path,
) -> None:
    """A body read in pieces on worker threads gives its connection back to the pool only
    when the caller closes it, not from the worker thread that read its last byte (urllib3
    did that there): a caller cancelled at that moment shut the connection down or
    closed it under the next request that took it from the pool (ResponseNotReady, and a
    retry printed, in a script that left a stream half-read at exit)."""
    from aiostream_hf._transport import ThreadedTransport

    name = "data/train-00000-of-00001.parquet"
    whole = (hub_root / "datasets/org/text" / name).read_bytes()
    with HubServer(hub_root) as server:
        url = f"{server.endpoint}/datasets/org/text/resolve/main/{name}"
        transport = ThreadedTransport(2)
        async with httpx2.AsyncClient(transport=transport) as http:
            cdn = (await http.get(url)).headers["Location"]
            pool = transport._pool("http").connection_from_url(cdn)
            headers = {"Range": "bytes=0-99999"}
            async with http.stream("GET", cdn, headers=headers) as answer:
                # The transport's stream itself: aiter_raw closes the answer at its end.
                got = b"".join([piece async for piece in answer.stream])  # type: ignore[attr-defined]
                idle_before_close = pool.pool.qsize() if pool.pool is not None else -1
            idle_after_close = pool.pool.qsize() if pool.pool is not None else -1
    assert got == whole[:100_000]
    # The pool's queue holds its free slots (None) and idle connections; the one this
    # body used comes back only with the close.
    assert idle_after_close == idle_before_close + 1


async def test_an_answer_without_a_body_closes_its_response_when_read(hub_root: Path) -> None:
    """A HEAD's answer (no body to read) read through the transport's stream closes its
    http.client response before the connection goes back to the pool: left open, it kept
    the socket's file open after the pool closed the connection (an "unclosed socket"
    ResourceWarning in a later test, when it was collected)."""
    from aiostream_hf._transport import ThreadedTransport

    name = "data/train-00000-of-00001.parquet"
    with HubServer(hub_root) as server:
        url = f"{server.endpoint}/datasets/org/text/resolve/main/{name}"
        async with httpx2.AsyncClient(transport=ThreadedTransport(2)) as http:
            cdn = (await http.get(url)).headers["Location"]  # a HEAD there: 200, no body
            async with http.stream("HEAD", cdn) as answer:
                assert answer.status_code == 200
                received = answer.stream._stream  # type: ignore[attr-defined]  # the transport's
                got = [piece async for piece in received]
                body = received._answer._fp
            assert got == []
            assert body.isclosed()


async def test_a_redirect_leaves_its_connection_to_the_next_request(hub_root: Path) -> None:
    """A redirect's (small) body is read with its head, so its connection goes back to
    the pool: three resolves one after the other open one connection, not one per
    redirect (for a real Hub, a new TCP and TLS handshake for every file)."""
    from aiostream_hf._transport import ThreadedTransport

    name = "data/train-00000-of-00001.parquet"
    with HubServer(hub_root) as server:
        async with httpx2.AsyncClient(transport=ThreadedTransport(2)) as http:
            for _ in range(3):
                url = f"{server.endpoint}/datasets/org/text/resolve/main/{name}"
                async with http.stream("GET", url) as answer:  # closed unread, as the
                    assert answer.status_code == 302  # fetcher drops a redirect
        stats = server.stats()
    assert stats.requests == 3
    assert stats.connections == 1


class _RawServer:
    """A raw HTTP server on loopback at ``url``: each connection it accepts is answered
    by ``_answer`` on a thread of its own; it counts its connections."""

    path = "/x"

    def __init__(self) -> None:
        import socket
        import threading

        self.connections = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}{self.path}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import threading

        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()


class _RedirectServer(_RawServer):
    """Answers every request with a 302 whose body of ``size`` bytes comes at once
    (``trickle`` None) or a byte every ``trickle`` seconds; it records the body bytes it
    had sent when each request came in."""

    path = "/resolve"

    def __init__(self, size: int, trickle: float | None) -> None:
        self.size, self.trickle = size, trickle
        self.sent_before_request: list[int] = []
        self._sent = 0
        super().__init__()

    def _answer(self, conn: Any) -> None:
        with conn:
            conn.settimeout(0.2)
            while not self._stop.is_set():
                try:
                    request = conn.recv(65536)
                except OSError:
                    continue
                if not request:
                    return
                self.sent_before_request.append(self._sent)
                head = "HTTP/1.1 302 Found\r\nLocation: http://example.invalid/x\r\n"
                head = f"{head}Content-Length: {self.size}\r\n\r\n"
                try:
                    if self.trickle is None:  # the body in the head's write, as a Hub sends it
                        conn.sendall(head.encode() + b"f" * self.size)
                        self._sent += self.size
                        continue
                    conn.sendall(head.encode())
                    for _ in range(self.size):
                        if self._stop.wait(self.trickle):
                            return
                        conn.sendall(b"f")
                        self._sent += 1
                except OSError:
                    return


async def test_a_redirect_with_a_body_leaves_its_connection_too() -> None:
    """A redirect with a small body (the real Hub's: "Found. Redirecting to ..."), which
    comes with its head: read with it, the connection is reused."""
    from aiostream_hf._transport import ThreadedTransport

    server = _RedirectServer(size=60, trickle=None)
    try:
        async with httpx2.AsyncClient(transport=ThreadedTransport(2)) as http:
            for _ in range(3):
                async with http.stream("GET", server.url) as answer:
                    assert answer.status_code == 302
    finally:
        server.close()
    assert server.connections == 1


async def test_a_trickled_redirect_body_is_not_waited_for() -> None:
    """A redirect whose body trickles (a byte per 0.5 s, 100 promised) is answered
    without its body: the drain gives up at once (``_REDIRECT_DRAIN_S``), the answer is
    dropped unread and its connection shut down, never held for the ~50 s it takes."""
    from aiostream_hf._transport import ThreadedTransport

    server = _RedirectServer(size=100, trickle=0.5)
    try:
        async with httpx2.AsyncClient(transport=ThreadedTransport(2)) as http:
            for _ in range(2):
                async with http.stream("GET", server.url) as answer:
                    assert answer.status_code == 302
        sent = list(server.sent_before_request)
    finally:
        server.close()
    assert server.connections == 2  # the first one was not reused: its body never came
    assert sent[1] < 10  # the second request came long before the first body was sent


async def test_a_send_cancelled_before_its_answer_closes_the_answer(hub_root: Path) -> None:
    """A request cancelled while its worker thread waits for the answer: the thread is
    abandoned, and the answer it gets afterwards is closed (its socket with it), not
    left for the garbage collector (an "unclosed socket" ResourceWarning, once a flake)."""
    import threading

    import urllib3

    from aiostream_hf._transport import ThreadedTransport

    entered, release, closed = threading.Event(), threading.Event(), threading.Event()
    answers: list[Any] = []

    class Held(urllib3.PoolManager):
        def urlopen(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            entered.set()
            release.wait(30)
            answer = super().urlopen(*args, **kwargs)
            close = answer.close

            def closing() -> None:
                close()
                closed.set()

            answer.close = closing
            answers.append(answer)
            return answer

    with HubServer(hub_root) as server:
        transport = ThreadedTransport(2)
        transport._pools["http"] = Held(maxsize=2)
        async with httpx2.AsyncClient(transport=transport) as http:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    # Not a redirect: its body would be read with its head, and its
                    # connection go back to the pool.
                    url = f"{server.endpoint}/api/datasets/org/text/revision/main"
                    tg.start_soon(http.get, url)
                    await anyio.to_thread.run_sync(entered.wait, 30)
                    scope.cancel()
            assert scope.cancelled_caught
            release.set()  # the abandoned thread gets its answer now
            assert await anyio.to_thread.run_sync(closed.wait, 30)
            assert answers[0].closed
            assert answers[0].status == 200
            assert answers[0]._connection.sock is None  # the socket itself is closed


def test_a_stream_imports_one_http_stack(hub_root: Path, tmp_path: Path) -> None:
    """A fresh process that streams over plain HTTP never imports httpx2's own pool
    (httpcore2, h11) nor makes a TLS context: its first request waits for neither."""
    import json
    import subprocess
    import sys

    script = """
import json, sys
import aiostream_hf as ash
from aiostream_hf import _transport
s = ash.stream("hf://datasets/org/text", endpoint=sys.argv[1],
               options=ash.StreamOptions(cache_dir=sys.argv[2]))
rows = sum(1 for _ in s)
print(json.dumps({"rows": rows, "tls": _transport.tls_context.cache_info().currsize,
                  "stacks": sorted(m for m in ("httpcore2", "h11") if m in sys.modules)}))
"""
    with HubServer(hub_root) as server:
        done = subprocess.run(
            [sys.executable, "-c", script, server.endpoint, str(tmp_path / "cache")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"rows": 200, "tls": 0, "stacks": []}


# -- answers that never end: every worker-thread call of a request is bounded -------------


class _EndlessServer(_RawServer):
    """Reads a request, sends ``start``, then ``step`` every ``every`` seconds until the
    client closes its end (``closed`` is then set)."""

    def __init__(self, start: bytes, step: bytes, every: float = 0.05) -> None:
        import threading

        self.start, self.step, self.every = start, step, every
        self.closed = threading.Event()
        super().__init__()

    def _answer(self, conn: Any) -> None:
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(65536)
                conn.sendall(self.start)
                while not self._stop.wait(self.every):
                    conn.sendall(self.step)
            except OSError:  # the client shut its socket down
                self.closed.set()


_ENDLESS = {
    # a head whose header lines keep coming: each socket read is quick
    "head": (b"HTTP/1.1 200 OK\r\n", b"X-More: yes\r\n"),
    # interim answers, one after another, never the final one
    "1xx": (b"", b"HTTP/1.1 100 Continue\r\n\r\n"),
}


@pytest.mark.parametrize("kind", sorted(_ENDLESS))
async def test_an_answer_whose_head_never_ends_is_a_read_timeout(kind: str) -> None:
    """A head that never ends (a header line every 50 ms; or 100-Continue answers, ever)
    keeps every socket read within the read timeout: the send is bounded all the same
    (``_CALL_READS`` read timeouts), its socket shut down, its thread freed. Before, it
    was read forever, and the process could not exit."""
    from aiostream_hf._transport import ThreadedTransport

    server = _EndlessServer(*_ENDLESS[kind])
    try:
        async with httpx2.AsyncClient(
            transport=ThreadedTransport(2), timeout=httpx2.Timeout(0.2)
        ) as http:
            with anyio.fail_after(10), pytest.raises(httpx2.ReadTimeout, match="head"):
                await http.get(server.url)
        assert await anyio.to_thread.run_sync(server.closed.wait, 5)
    finally:
        server.close()


async def test_a_body_whose_trailer_never_ends_is_a_read_timeout() -> None:
    """A chunked body whose trailer never ends (a line every 50 ms) fails its read
    within the bound, its socket shut down."""
    from aiostream_hf._transport import ThreadedTransport

    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n"
    server = _EndlessServer(head, b"X-Trailer: more\r\n")
    try:
        async with httpx2.AsyncClient(
            transport=ThreadedTransport(2), timeout=httpx2.Timeout(0.2)
        ) as http:
            with anyio.fail_after(10), pytest.raises(httpx2.ReadTimeout, match="body"):
                async with http.stream("GET", server.url) as answer:
                    async for _ in answer.aiter_bytes():
                        pass
        assert await anyio.to_thread.run_sync(server.closed.wait, 5)
    finally:
        server.close()


async def test_a_cancelled_send_shuts_its_socket_down() -> None:
    """A send cancelled while 100-Continue answers keep coming (no timeout at all) has
    its socket shut down under its worker thread: the thread ends, the server sees the
    close. Before, the thread went on reading them (http.client skips any number of
    them), and the process hung at exit."""
    from aiostream_hf._transport import ThreadedTransport

    server = _EndlessServer(*_ENDLESS["1xx"])
    try:
        async with httpx2.AsyncClient(
            transport=ThreadedTransport(2), timeout=httpx2.Timeout(None)
        ) as http:
            with anyio.move_on_after(0.3) as scope:
                await http.get(server.url)
            assert scope.cancelled_caught
        assert await anyio.to_thread.run_sync(server.closed.wait, 5)
    finally:
        server.close()


async def test_interim_answers_before_the_final_one_are_skipped() -> None:
    """A 103 Early Hints (and a 102) before the final answer is skipped, as RFC 9110
    asks; before, http.client took the 103 for the answer and the read failed."""
    from aiostream_hf._transport import ThreadedTransport

    interim = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
    interim += b"HTTP/1.1 102 Processing\r\n\r\n"
    final = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    server = _EndlessServer(interim + final, b"", every=3600)
    try:
        async with httpx2.AsyncClient(
            transport=ThreadedTransport(2), timeout=httpx2.Timeout(5)
        ) as http:
            answer = await http.get(server.url)
        assert (answer.status_code, answer.content) == (200, b"hello")
    finally:
        server.close()
