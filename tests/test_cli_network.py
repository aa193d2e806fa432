"""The ``aiostream-hf`` command line against endpoints that fail: refused, silent (accepts
and never answers), closing, failing (503), TLS to a plain server, no DNS name.

Every command ends with exit code 1, no traceback, an ``Error:`` line naming the URL and
a way out; Ctrl-C ends it with exit code 130 and one line, however its requests are
blocked. Commands run in subprocesses (a traceback and an exit are what a user sees).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import httpx2
import pytest
from click.testing import CliRunner

import aiostream_hf.cli as cli
from aiostream_hf import _cli_run
from aiostream_hf._transport import ThreadedTransport
from aiostream_hf.testing import HubServer, make_repo, make_repo_split_naming

#: A subprocess that has not ended by then hangs (the commands here fail within seconds).
HANG_S = 60.0
#: Ctrl-C must end a command well within this (the target is under a second).
INTERRUPT_S = 15.0
#: Short patience: every failure here comes within a few seconds.
QUICK = ("--timeout", "0.5", "--retries", "1")


# -- servers ----------------------------------------------------------------------------


class _Server:
    """A loopback TCP server: ``answer(request_head)`` gives the bytes to send back and
    the connection is closed; without ``answer`` it reads and never answers (silent).
    ``accepted`` is set at its first connection, ``ended`` when a client closes one."""

    def __init__(self, answer: Callable[[bytes], bytes | None] | None = None) -> None:
        self._answer = answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.accepted = threading.Event()
        self.ended = threading.Event()
        self._stop = threading.Event()
        self._connections: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._connections.append(conn)
            self.accepted.set()
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(HANG_S)
        head = b""
        with contextlib.suppress(OSError):
            while True:
                data = conn.recv(65536)
                if not data:
                    self.ended.set()
                    return
                head += data
                if self._answer is not None and b"\r\n\r\n" in head:
                    reply = self._answer(head)
                    if reply:
                        conn.sendall(reply)
                    conn.close()
                    return

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for conn in self._connections:
            conn.close()
        for thread in self._threads:
            thread.join(5)


@contextlib.contextmanager
def _server(answer: Callable[[bytes], bytes | None] | None = None) -> Iterator[_Server]:
    server = _Server(answer)
    try:
        yield server
    finally:
        server.close()


def _closed_port() -> int:
    """A loopback port nothing listens on: connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reply(status: str, headers: str = "", body: bytes = b"") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n{headers}\r\n"
    ).encode() + body


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    root = tmp_path_factory.mktemp("hub")
    make_repo_split_naming(root)  # org/split-naming
    robot = make_repo(root, "org/robot", {"README.md": "# robot\n"})
    (robot / "videos").mkdir()
    (robot / "videos/v.mp4").write_bytes(b"not a video, but bytes to read")
    with HubServer(root) as server:
        yield server


# -- running the CLI --------------------------------------------------------------------


def _command(*args: str, prelude: str = "") -> list[str]:
    """The CLI in a new interpreter; SIGINT raises KeyboardInterrupt, as in a shell (a
    test runner started in the background may pass SIGINT on as ignored)."""
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"{prelude}\nfrom aiostream_hf.cli import main; main()"
    )
    return [sys.executable, "-c", code, *args]


def _run(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _command(*args, prelude=prelude),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def _commands(tmp_path: Path, repo: str = "org/x") -> dict[str, list[str]]:
    """Every command that reads data, on a dataset or a video of ``repo``."""
    return {
        "ls": ["ls", f"hf://datasets/{repo}"],
        "head": ["head", f"hf://datasets/{repo}"],
        "bench": ["bench", f"hf://datasets/{repo}", "--no-progress"],
        "frames": ["frames", f"hf://datasets/{repo}/videos/v.mp4", "--at", "1"]
        + ["--out", str(tmp_path / "sheet.png")],
    }


COMMANDS = ["ls", "head", "bench", "frames"]


def _failed(proc: subprocess.CompletedProcess[str], url: str, *hints: str) -> str:
    """Exit code 1, no traceback, one ``Error:`` line naming ``url``; its explanation
    (the rest of stderr, library warnings aside) holds ``hints``."""
    stderr = proc.stderr
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if not line.startswith("aiostream-hf: ")]
    assert lines, stderr
    assert lines[0].startswith("Error: "), stderr
    assert sum(line.startswith("Error: ") for line in lines) == 1, stderr
    assert len(lines) <= 2, stderr  # the error, and at most one line of the way out
    assert url in lines[0], stderr
    for hint in hints:
        assert hint in stderr, stderr
    assert proc.stdout == "", proc.stdout
    return stderr


# -- failures -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", COMMANDS)
def test_a_refused_endpoint_is_an_error_naming_it(tmp_path: Path, name: str) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    proc = _run(*_commands(tmp_path)[name], "--endpoint", endpoint, *QUICK)
    stderr = _failed(proc, endpoint, "Set HF_ENDPOINT or pass --endpoint")
    # A refused connection is said to be one, not a timeout (urllib3's NewConnectionError
    # derives from its ConnectTimeoutError).
    assert "ConnectError" in stderr
    assert "ConnectTimeout" not in stderr


@pytest.mark.parametrize("name", COMMANDS)
def test_a_silent_endpoint_is_an_error_after_the_timeout(tmp_path: Path, name: str) -> None:
    with _server() as server:
        proc = _run(*_commands(tmp_path)[name], "--endpoint", server.url, *QUICK)
    _failed(proc, server.url, "pass --endpoint", "--timeout (now 0.5 s)", "--retries (now 1)")


@pytest.mark.parametrize("name", ["ls", "frames"])
def test_an_endpoint_that_closes_connections(tmp_path: Path, name: str) -> None:
    with _server(lambda head: None) as server:  # reads the request, closes
        proc = _run(*_commands(tmp_path)[name], "--endpoint", server.url, *QUICK)
    _failed(proc, server.url, "Is the endpoint right", "pass --endpoint")


@pytest.mark.parametrize("name", ["ls", "frames"])
def test_a_failing_server_is_said_to_be(tmp_path: Path, name: str) -> None:
    with _server(lambda head: _reply("503 Service Unavailable", body=b"busy")) as server:
        proc = _run(*_commands(tmp_path)[name], "--endpoint", server.url, *QUICK)
    _failed(proc, server.url, "failing (HTTP 503)", "--retries (now 1)")


@pytest.mark.parametrize("name", ["ls", "frames"])
def test_tls_to_a_plain_http_server(tmp_path: Path, hub: HubServer, name: str) -> None:
    endpoint = hub.endpoint.replace("http://", "https://")
    proc = _run(*_commands(tmp_path, "org/robot")[name], "--endpoint", endpoint, *QUICK)
    _failed(proc, endpoint, "pass --endpoint")


_NO_DNS = """
import socket
_real = socket.getaddrinfo
def _getaddrinfo(host, *args, **kwargs):
    if host == "hub.invalid":
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return _real(host, *args, **kwargs)
socket.getaddrinfo = _getaddrinfo
"""


@pytest.mark.parametrize("name", ["ls", "frames"])
def test_an_endpoint_without_a_dns_name(tmp_path: Path, name: str) -> None:
    endpoint = "http://hub.invalid:8000"
    proc = _run(*_commands(tmp_path)[name], "--endpoint", endpoint, *QUICK, prelude=_NO_DNS)
    _failed(proc, endpoint, "Name or service not known", "pass --endpoint")


def test_the_local_hub_works_with_the_same_options(tmp_path: Path, hub: HubServer) -> None:
    """The baseline: the same commands and options against a server that answers."""
    proc = _run("ls", "hf://datasets/org/split-naming", "--endpoint", hub.endpoint, *QUICK)
    assert proc.returncode == 0, proc.stderr
    assert "org/split-naming" in proc.stdout
    assert proc.stderr == ""
    proc = _run(*_commands(tmp_path, "org/robot")["frames"], "--endpoint", hub.endpoint, *QUICK)
    # Reached and read: the bytes are not a video, which is the one error.
    _failed(proc, "videos/v.mp4", "not a video file")


# -- Ctrl-C ------------------------------------------------------------------------------


def _interrupt(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    """SIGINT to ``proc``: its exit code and stderr (it must end within INTERRUPT_S)."""
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=INTERRUPT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert out == b""
    return proc.returncode, err.decode()


def _interrupted(code: int, stderr: str) -> None:
    assert code == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.splitlines()[-1] == "Interrupted (Ctrl-C).", stderr


def _popen(*args: str, prelude: str = "") -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        _command(*args, prelude=prelude),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_ctrl_c_while_a_request_waits_for_an_answer(tmp_path: Path, name: str, scheme: str) -> None:
    """The request waits on a server that accepted it (https: in the TLS handshake), with
    a timeout far longer than the test waits: only Ctrl-C can end it in time."""
    with _server() as server:
        endpoint = f"{scheme}://127.0.0.1:{server.port}"
        args = [*_commands(tmp_path)[name], "--endpoint", endpoint, "--timeout", "60"]
        proc = _popen(*args)
        try:
            assert server.accepted.wait(HANG_S), "the command never connected"
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
        _interrupted(*_interrupt(proc))


_SIGINT_ON_A_THREAD = """
import signal, sys, threading
def _relay():
    sys.stdin.readline()
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # lands on this thread
threading.Thread(target=_relay, daemon=True).start()
"""


@pytest.mark.parametrize("name", ["ls", "frames"])
def test_ctrl_c_that_lands_on_another_thread(tmp_path: Path, name: str) -> None:
    """A SIGINT taken by a thread other than the main one (POSIX lets any thread take a
    process's signal), as one that comes just before the event loop blocks: the main
    thread, blocked in the loop's selector, is not interrupted by it. The command still
    ends at once, not at its request's timeout (60 s here)."""
    with _server() as server:
        args = [*_commands(tmp_path)[name], "--endpoint", server.url, "--timeout", "60"]
        proc = subprocess.Popen(
            _command(*args, prelude=_SIGINT_ON_A_THREAD),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert server.accepted.wait(HANG_S), "the command never connected"
            out, err = proc.communicate(b"go\n", timeout=INTERRUPT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert out == b""
    _interrupted(proc.returncode, err.decode())


_DNS_HANGS = """
import socket, sys, threading
_real = socket.getaddrinfo
def _getaddrinfo(host, *args, **kwargs):
    if host == "hub.invalid":
        sys.stderr.write("resolving hub.invalid\\n")
        sys.stderr.flush()
        threading.Event().wait()  # a lookup that never ends: nothing can interrupt it
    return _real(host, *args, **kwargs)
socket.getaddrinfo = _getaddrinfo
"""


def _read_until(proc: subprocess.Popen[bytes], needle: bytes) -> bytes:
    """What ``proc`` wrote on stderr until ``needle`` appeared (or it ended, or HANG_S)."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    seen = b""
    while needle not in seen:
        ready, _, _ = select.select([fd], [], [], HANG_S)
        if not ready:
            break
        block = os.read(fd, 65536)
        if not block:
            break
        seen += block
    return seen


@pytest.mark.parametrize("name", ["ls", "frames"])
def test_ctrl_c_while_a_worker_thread_cannot_be_interrupted(tmp_path: Path, name: str) -> None:
    """A DNS lookup blocks its worker thread where no socket can be shut down: the
    command still ends at Ctrl-C, without waiting for it."""
    args = [*_commands(tmp_path)[name], "--endpoint", "http://hub.invalid:8000"]
    proc = _popen(*args, "--timeout", "60", prelude=_DNS_HANGS)
    started = _read_until(proc, b"resolving hub.invalid")
    assert b"resolving hub.invalid" in started, started.decode()
    code, stderr = _interrupt(proc)
    _interrupted(code, started.decode() + stderr)


@pytest.mark.anyio
async def test_a_cancelled_tls_handshake_is_not_waited_for() -> None:
    """A request cancelled while its TLS handshake waits on a server that never answers:
    its socket is shut down at once (the server sees it end), not left to the worker
    thread until the connect timeout."""
    with _server() as server:
        transport = ThreadedTransport(2)
        async with httpx2.AsyncClient(transport=transport, timeout=HANG_S) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.get, f"https://127.0.0.1:{server.port}/x")
                assert await anyio.to_thread.run_sync(server.accepted.wait, HANG_S)
                tg.cancel_scope.cancel()
            # Well before the handshake's own timeout (HANG_S) would end it.
            assert await anyio.to_thread.run_sync(server.ended.wait, INTERRUPT_S)


# -- logging and unexpected errors --------------------------------------------------------


def test_library_warnings_are_one_line_each_on_stderr(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("AIOSTREAM_HF_CACHE", str(blocked))  # the resolver warns, goes on
    result = CliRunner().invoke(
        cli.main, ["ls", "hf://datasets/org/split-naming", "--endpoint", hub.endpoint]
    )
    assert result.exit_code == 0, result.output
    warnings = result.stderr.splitlines()
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("aiostream-hf: WARNING: resolution cache "), warnings
    assert "not usable" in warnings[0]
    assert "org/split-naming" in result.stdout
    # The command's logging ends with it: the logger is as it was.
    library = logging.getLogger("aiostream_hf")
    assert library.propagate
    assert not any(isinstance(h, _cli_run._WarningLines) for h in library.handlers)


def test_a_rate_limit_pause_is_a_warning_line() -> None:
    """A 429 asking for 5 s (long enough to be logged), then the answer (a 404)."""
    answers = iter([_reply("429 Too Many Requests", "Retry-After: 5\r\n")])

    def answer(head: bytes) -> bytes:
        return next(answers, None) or _reply(
            "404 Not Found", "X-Error-Code: RepoNotFound\r\n", b'{"error": "not found"}'
        )

    with _server(answer) as server:
        proc = _run("ls", "hf://datasets/org/x", "--endpoint", server.url)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("aiostream-hf: WARNING: 127.0.0.1"), warnings
    assert "rate-limited us (HTTP 429)" in warnings[0]
    assert proc.stderr.splitlines()[-1].startswith("Error: "), proc.stderr


def test_an_unexpected_error_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug (not a library error) ends with one line, unless AIOSTREAM_HF_TRACEBACK."""

    async def broken(*args: object) -> None:
        raise RuntimeError("something\nbroke")

    monkeypatch.setattr(cli, "_ls", broken)
    result = CliRunner().invoke(cli.main, ["ls", "hf://datasets/org/x"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert result.stderr.splitlines() == [
        "Error: unexpected RuntimeError: something broke (a bug in aiostream-hf: please "
        "report it, with the traceback that AIOSTREAM_HF_TRACEBACK=1 shows)"
    ]
    monkeypatch.setenv("AIOSTREAM_HF_TRACEBACK", "1")
    result = CliRunner().invoke(cli.main, ["ls", "hf://datasets/org/x"])
    assert isinstance(result.exception, RuntimeError)
