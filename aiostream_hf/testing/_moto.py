"""MotoS3: moto's standalone S3 server on loopback, counting the requests it serves.

    with MotoS3() as s3:                       # in a thread (subprocess=True: its own process)
        os.environ["AWS_ENDPOINT_URL"] = s3.endpoint
        ...
        s3.stats()                             # {"list": 1, "get": 12, ...}

The server is moto's own WSGI app (``DomainDispatcherApplication(create_backend_app)``,
what ``moto.server.ThreadedMotoServer`` serves) under werkzeug's threaded server, with
one middleware in front that counts every request by kind (``list``: a ListObjectsV2
page; ``get``, ``head``, ``put``; ``other``), counts the unsigned ones, and can add a
fixed latency before each answer (``latency_ms``, for benchmarks). Counting at the
server sees every process: a DataLoader's workers included. ``require_signatures``
turns moto's IAM checks on (every request must then be signed by an access key moto
issued, and its policies decide) or off (moto serves anyone, as a public bucket does).

Needs moto (``moto[server]``, in the ``test`` extra); private to the test suite and the
benchmarks.
"""

from __future__ import annotations

import json
import subprocess as sp
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import httpx2

from ._hub_server import stop_process, wait_for_eof

__all__ = ["MotoS3"]

_STATS_PATH = "/_aiostream/stats"
_WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Counting:
    """WSGI middleware: counts requests by kind, adds latency, serves the stats."""

    def __init__(self, app: _WSGIApp, latency_s: float) -> None:
        self.app = app
        self.latency_s = latency_s
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        if path == _STATS_PATH:
            if environ.get("REQUEST_METHOD") == "POST":
                with self.lock:
                    self.counts.clear()
            with self.lock:
                body = json.dumps(dict(self.counts)).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        if not path.startswith("/moto-api"):
            method = environ.get("REQUEST_METHOD", "GET")
            if "list-type=2" in environ.get("QUERY_STRING", ""):
                kind = "list"
            else:
                kind = {"GET": "get", "HEAD": "head", "PUT": "put"}.get(method, "other")
            with self.lock:
                self.counts[kind] += 1
                if "HTTP_AUTHORIZATION" not in environ:
                    self.counts["unsigned"] += 1
            if self.latency_s:
                time.sleep(self.latency_s)
        return self.app(environ, start_response)


def _make_server(host: str, port: int, latency_s: float) -> Any:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = _Counting(DomainDispatcherApplication(create_backend_app), latency_s)
    return make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)


class MotoS3:
    """moto's S3 on ``http://127.0.0.1:PORT`` (port 0: a free one), counting requests."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency_ms: float = 0.0,
        subprocess: bool = False,
    ) -> None:
        self.host = host
        self._port = port
        self._latency_s = latency_ms / 1000
        self._subprocess = subprocess
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._process: sp.Popen[str] | None = None
        self.endpoint = ""

    def start(self) -> None:
        if self._subprocess:
            config = {"host": self.host, "port": self._port, "latency_s": self._latency_s}
            self._process = proc = sp.Popen(
                [sys.executable, "-m", "aiostream_hf.testing._moto", json.dumps(config)],
                stdout=sp.PIPE,
                stdin=sp.PIPE,  # the child exits when this closes
                text=True,
            )
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the moto server exited with code {proc.wait()} at start")
            self.endpoint = json.loads(line)["endpoint"]
            return
        self._server = _make_server(self.host, self._port, self._latency_s)
        self.endpoint = f"http://{self.host}:{self._server.server_port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="aiostream-hf-moto", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._process is not None:
            stop_process(self._process)
            self._process = None

    def __enter__(self) -> MotoS3:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The server's process id when it runs in its own process."""
        return self._process.pid if self._process is not None else None

    def stats(self) -> dict[str, int]:
        """Requests served since the last reset, by kind, and ``unsigned``."""
        return dict(httpx2.get(self.endpoint + _STATS_PATH).json())

    def reset_stats(self) -> None:
        httpx2.post(self.endpoint + _STATS_PATH)

    def require_signatures(self, on: bool) -> None:
        """moto's IAM checks on (every request signed by a key moto issued) or off."""
        response = httpx2.post(
            f"{self.endpoint}/moto-api/reset-auth", content=b"0" if on else b"inf"
        )
        response.raise_for_status()


if __name__ == "__main__":
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    cfg = json.loads(sys.argv[1])
    server = _make_server(cfg["host"], cfg["port"], cfg["latency_s"])
    print(json.dumps({"endpoint": f"http://{cfg['host']}:{server.server_port}"}), flush=True)
    stop = threading.Event()
    threading.Thread(target=wait_for_eof, args=(stop,), daemon=True).start()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    import signal

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
