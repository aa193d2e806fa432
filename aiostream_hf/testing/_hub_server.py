"""HubServer: the local Hub-compatible server, in a thread or a subprocess.

    with HubServer(root, faults=Faults(latency_ms=20)) as hub:
        os.environ["HF_ENDPOINT"] = hub.endpoint
        ...
        hub.stats().by_bucket["resolvers"]

The Hub answers on ``http://localhost:P`` and its CDN on ``http://127.0.0.1:Q``
(a different hostname, as on the real Hub). Sockets are bound before the
server starts, so ``endpoint`` is usable as soon as the context is entered.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import select
import socket
import struct
import subprocess as sp
import sys
import termios
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import httpx2

from .._exceptions import ClosedResourceError, HubServerError
from ._faults import Faults, RateLimits
from ._hub_app import STARTED, AccessRules, DeliberateCut, HubApp, HubStats
from ._repos import RepoStore

if TYPE_CHECKING:
    import uvicorn

__all__ = ["HubServer"]

_SERVER_EXTRA = "pip install 'aiostream-hf[server]'"


def _require_uvicorn() -> None:
    """uvicorn runs the server; it is an extra (``server``), imported when a server starts."""
    try:
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise HubServerError(
            f"the local Hub server (HubServer) needs uvicorn, which is not installed: "
            f"{_SERVER_EXTRA}"
        ) from exc


class _DropDeliberateCuts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, DeliberateCut)


_uvicorn_error_log = logging.getLogger("uvicorn.error")
if not any(isinstance(f, _DropDeliberateCuts) for f in _uvicorn_error_log.filters):
    _uvicorn_error_log.addFilter(_DropDeliberateCuts())


def _bind(host: str, port: int, what: str) -> socket.socket:
    # IPPROTO_TCP, so that asyncio sets TCP_NODELAY on accepted connections (no 40 ms stalls).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise HubServerError(
            f"cannot listen for the {what} on {host}:{port} ({exc.strerror}): "
            "choose another port, or 0 for a free one"
        ) from exc
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


class HubServer:
    """A Hub-compatible HTTP server over the repos in ``root``.

    ``private`` and ``gated`` map repo ids to the tokens that may read them.
    ``faults`` and ``rate_limits`` are off by default and can be replaced
    while the server runs. With ``subprocess=True`` the server runs in its
    own process (for benchmarks that must not share the GIL with the client).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        cdn_port: int = 0,
        faults: Faults | None = None,
        rate_limits: RateLimits | None = None,
        private: Mapping[str, Sequence[str]] | None = None,
        gated: Mapping[str, Sequence[str]] | None = None,
        tree_page_size: int = 1000,
        tree_page_size_expand: int = 50,
        cdn_url_ttl_s: float = 3600.0,
        lfs_threshold: int = 10 * 1024 * 1024,
        subprocess: bool = False,
    ) -> None:
        self.root = Path(root)
        self._store = RepoStore(self.root, lfs_threshold=lfs_threshold)
        self._store.validate()
        for name, number in (("port", port), ("cdn_port", cdn_port)):
            if not 0 <= number <= 65535:
                raise HubServerError(f"{name}={number!r}: a port is 0 (a free one) to 65535")
        if tree_page_size < 1 or tree_page_size_expand < 1:
            raise HubServerError("tree_page_size and tree_page_size_expand must be >= 1")
        if cdn_url_ttl_s <= 0:
            raise HubServerError(f"cdn_url_ttl_s={cdn_url_ttl_s!r}: must be > 0")
        self.host = host
        self._ports = (port, cdn_port)
        self._faults = faults or Faults()
        self._rate_limits = rate_limits or RateLimits()
        self._access = AccessRules(dict(private or {}), dict(gated or {}))
        self._tree_pages = (tree_page_size, tree_page_size_expand)
        self._cdn_url_ttl_s = cdn_url_ttl_s
        self._lfs_threshold = lfs_threshold
        self._use_subprocess = subprocess
        self._app: HubApp | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._process: sp.Popen[str] | None = None
        self._state = "new"
        self.endpoint = ""
        self.cdn_endpoint = ""

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        if self._state != "new":
            raise ClosedResourceError(
                f"HubServer is {self._state}: create a new one to serve again"
            )
        _require_uvicorn()  # here too for a subprocess: one clear line, not the child's traceback
        if self._use_subprocess:
            self._start_subprocess()
        else:
            self._start_thread()
        self._state = "running"

    def _start_thread(self) -> None:
        import uvicorn

        hub_sock = _bind(self.host, self._ports[0], "Hub")
        try:
            cdn_sock = _bind(self.host, self._ports[1], "CDN")
        except BaseException:
            hub_sock.close()
            raise
        hub_port, cdn_port = hub_sock.getsockname()[1], cdn_sock.getsockname()[1]
        # The Hub is reached as "localhost", the CDN as the IP: two hostnames, as in real life.
        self.endpoint = f"http://localhost:{hub_port}"
        self.cdn_endpoint = f"http://{self.host}:{cdn_port}"
        self._app = HubApp(
            self._store,
            hub_url=self.endpoint,
            cdn_url=self.cdn_endpoint,
            cdn_port=cdn_port,
            faults=self._faults,
            rate_limits=self._rate_limits,
            access=self._access,
            tree_page_size=self._tree_pages[0],
            tree_page_size_expand=self._tree_pages[1],
            cdn_url_ttl_s=self._cdn_url_ttl_s,
        )
        config = uvicorn.Config(
            self._app,
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
            http="h11",
            timeout_graceful_shutdown=1,
            timeout_keep_alive=30,
        )
        self._server = server = uvicorn.Server(config)
        sockets = [hub_sock, cdn_sock]
        self._app.waiting = lambda: _not_begun(server, sockets)

        def run() -> None:
            try:
                server.run(sockets=sockets)
            finally:
                for s in sockets:
                    s.close()

        self._thread = threading.Thread(target=run, name="aiostream-hf-hub", daemon=True)
        self._thread.start()

    def _start_subprocess(self) -> None:
        config = {
            "root": str(self.root),
            "host": self.host,
            "port": self._ports[0],
            "cdn_port": self._ports[1],
            "faults": self._faults.to_json(),
            "rate_limits": vars(self._rate_limits),
            "private": {k: list(v) for k, v in self._access.private.items()},
            "gated": {k: list(v) for k, v in self._access.gated.items()},
            "tree_page_size": self._tree_pages[0],
            "tree_page_size_expand": self._tree_pages[1],
            "cdn_url_ttl_s": self._cdn_url_ttl_s,
            "lfs_threshold": self._lfs_threshold,
            "exit_with_parent": True,
        }
        self._process = proc = sp.Popen(
            [sys.executable, "-m", "aiostream_hf.testing._hub_main", json.dumps(config)],
            stdout=sp.PIPE,
            stdin=sp.PIPE,  # the child exits when this closes: when this process is gone
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            code = proc.wait()
            raise HubServerError(f"the Hub server subprocess exited with code {code} at start")
        ready = json.loads(line)
        self.endpoint, self.cdn_endpoint = ready["endpoint"], ready["cdn_endpoint"]

    def close(self) -> None:
        if self._state != "running":
            self._state = "closed"
            return
        self._state = "closed"
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        if self._process is not None:
            stop_process(self._process)

    def __enter__(self) -> HubServer:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> HubServer:
        await anyio.to_thread.run_sync(self.start)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.close)

    # -- observation and control ---------------------------------------------

    def _require_running(self) -> None:
        if self._state != "running":
            raise ClosedResourceError(f"HubServer is {self._state}: enter its context first")

    def _control(self, method: str, path: str, body: Any = None) -> Any:
        response = httpx2.request(method, f"{self.endpoint}/_emulator/{path}", json=body)
        if response.status_code != 200:
            raise HubServerError(response.headers.get("X-Error-Message", response.text))
        return response.json()

    def stats(self) -> HubStats:
        """Requests by bucket, endpoint and status, bytes served, peak concurrency, faults."""
        self._require_running()
        if self._app is not None:
            return self._app.stats()
        return HubStats.from_json(self._control("GET", "stats"))

    def wait_idle(self, timeout: float = 10.0) -> HubStats:
        """The stats once no request is under way.

        The server counts a response's bytes as it sends them, so a client can finish
        reading one before its last bytes are counted: read the counts here, not with
        ``stats()``, when a test compares them right after a stream ends."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats()
            if stats.in_flight == 0:
                return stats
            if time.monotonic() > deadline:
                raise HubServerError(
                    f"{stats.in_flight} requests still under way after {timeout} s: "
                    "close every stream and response before waiting for the server"
                )
            time.sleep(0.005)

    def reset_stats(self) -> None:
        self._require_running()
        if self._app is not None:
            with self._app.counters.lock:
                self._app.counters.reset()
        else:
            self._control("POST", "reset")

    @property
    def faults(self) -> Faults:
        return self._faults

    def set_faults(self, faults: Faults | None = None, **changes: Any) -> Faults:
        """Replace the faults (whole, or some fields of the current ones)."""
        self._require_running()
        new = replace(faults or self._faults, **changes)
        if self._app is not None:
            self._app.injector.replace(new)
        else:
            self._control("POST", "faults", new.to_json())
        self._faults = new
        return new

    def set_rate_limits(self, rate_limits: RateLimits) -> None:
        self._require_running()
        if self._app is not None:
            self._app.limiter.replace(rate_limits)
        else:
            self._control("POST", "rate-limits", vars(rate_limits))
        self._rate_limits = rate_limits

    def url(self, repo_id: str, path: str, revision: str = "main") -> str:
        """The /resolve/ URL of a file, as huggingface_hub builds it."""
        from urllib.parse import quote

        return (
            f"{self.endpoint}/datasets/{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"
        )


def stop_process(process: sp.Popen[str]) -> None:
    """End a server subprocess: SIGTERM, then SIGKILL after 10 s; close its pipes."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except sp.TimeoutExpired:
        process.kill()
        process.wait()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            pipe.close()


def wait_for_eof(stop: threading.Event) -> None:
    """Set ``stop`` when stdin ends: the parent that holds its other end has gone
    (even killed, with no chance to terminate this child)."""
    # The raw descriptor, not sys.stdin: a daemon thread blocked in a buffered read
    # holds the buffer's lock, and the interpreter's exit would abort on it.
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    finally:
        stop.set()


def _not_begun(server: uvicorn.Server, listening: Sequence[socket.socket]) -> int:
    """Requests the server holds but has not begun: connections waiting to be accepted,
    request bytes unread on a connection, a request read whose handler has not started.

    A client that sends a request and closes at once (a stream closed with its readahead
    under way) has its request served after it is gone; ``wait_idle`` waits for these too,
    so that their bytes are not counted as the next test step's."""
    waiting = 0
    for sock in listening:
        if sock.fileno() >= 0 and select.select([sock], [], [], 0)[0]:
            waiting += 1  # a connection to accept (its request may already be sent)
    try:
        connections = list(server.server_state.connections)
    except RuntimeError:  # the set changed as it was copied: the loop is busy; try again
        return 1
    for protocol in connections:
        transport = getattr(protocol, "transport", None)
        conn: Any = transport.get_extra_info("socket") if transport is not None else None
        if conn is not None and conn.fileno() >= 0:
            try:
                unread = struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.FIONREAD, b"\0" * 4))
            except OSError:  # closed meanwhile: nothing waits on it
                unread = (0,)
            if unread[0] > 0:
                waiting += 1
                continue
        cycle = getattr(protocol, "cycle", None)
        if cycle is not None and not (cycle.response_complete or cycle.disconnected):
            waiting += STARTED not in cycle.scope  # read, but its handler has not run yet
    return waiting


def serve_forever(
    config: Mapping[str, Any], *, ready: Any = None, started: Callable[[], None] | None = None
) -> None:
    """Run a server from a JSON-able config until interrupted; print a ready line, then
    call ``started`` (the CLI names the repos it serves)."""
    server = HubServer(
        config["root"],
        host=config.get("host", "127.0.0.1"),
        port=config.get("port", 0),
        cdn_port=config.get("cdn_port", 0),
        faults=Faults.from_json(config.get("faults", {})),
        rate_limits=RateLimits(**config.get("rate_limits", {})),
        private=config.get("private"),
        gated=config.get("gated"),
        tree_page_size=config.get("tree_page_size", 1000),
        tree_page_size_expand=config.get("tree_page_size_expand", 50),
        cdn_url_ttl_s=config.get("cdn_url_ttl_s", 3600.0),
        lfs_threshold=config.get("lfs_threshold", 10 * 1024 * 1024),
    )
    with server:
        line = {"endpoint": server.endpoint, "cdn_endpoint": server.cdn_endpoint}
        print(json.dumps(line), flush=True, file=ready or sys.stdout)
        if started is not None:
            started()
        stop = threading.Event()
        try:
            import signal

            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            if config.get("exit_with_parent"):
                threading.Thread(target=wait_for_eof, args=(stop,), daemon=True).start()
            stop.wait()
        except KeyboardInterrupt:
            pass
