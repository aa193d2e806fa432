"""How a CLI command runs: Ctrl-C as a cancellation that wakes the event loop at once
(exit code 130, one line, within a second even with requests blocked in worker threads),
library errors as one line (and, for a network failure, a second with the way out),
the library's WARNINGs on stderr one line each, anything else one line unless
``AIOSTREAM_HF_TRACEBACK`` asks for the traceback; the option types that refuse NaN,
infinity and bad ports, and the check of an output path before any work. ``cli.py``
holds the commands."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import anyio
import click
import httpx2

from ._exceptions import AiostreamError

if TYPE_CHECKING:
    from ._describe import Names

__all__ = [
    "EXIT_INTERRUPTED",
    "PORT",
    "FiniteFloat",
    "Group",
    "check_writable",
    "explained",
    "one_line",
    "report_absent",
    "run",
    "write_or_fail",
]

T = TypeVar("T")
#: The exit code of a command ended by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130
#: The exit code of a command whose stdout was closed by its reader (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141


class Group(click.Group):
    """Turns library errors into a one-line message and exit code 1, and Ctrl-C into a
    one-line message and exit code 130 (click's own answer would be 1); sends the
    library's warnings to stderr, one line each, while a command runs."""

    def invoke(self, ctx: click.Context) -> object:
        if ctx.parent is not None:  # a subgroup (hub): the top group does all of it
            return super().invoke(ctx)
        try:
            with _library_warnings():
                return super().invoke(ctx)
        except AiostreamError as exc:
            raise click.ClickException(one_line(exc)) from exc
        except KeyboardInterrupt:
            # _run cancels the command at the first SIGINT, lets its cleanup run, then
            # raises KeyboardInterrupt here.
            click.echo("Interrupted (Ctrl-C).", err=True)
            _exit_now(EXIT_INTERRUPTED)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:
            # The reader of stdout went away (`aiostream-hf ls ... | head -1`): stop
            # quietly, as the shell's tools do; stdout is pointed at /dev/null so that
            # the interpreter's last flush finds no broken pipe either.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            _exit_now(EXIT_BROKEN_PIPE)
        except Exception as exc:
            # Not how any expected failure ends (network failures are library errors):
            # a bug. One line, unless AIOSTREAM_HF_TRACEBACK asks for the traceback.
            if os.environ.get("AIOSTREAM_HF_TRACEBACK"):
                raise
            raise click.ClickException(
                f"unexpected {type(exc).__name__}: {' '.join(str(exc).split())} "
                "(a bug in aiostream-hf: please report it, with the traceback that "
                "AIOSTREAM_HF_TRACEBACK=1 shows)"
            ) from exc


#: After Ctrl-C, how long the worker threads a cancelled request left behind get to end
#: before the process exits without them.
_THREAD_GRACE_S = 0.3


def _exit_now(code: int) -> NoReturn:
    """Exit with ``code`` within ``_THREAD_GRACE_S``. A request cancelled in a worker
    thread has its socket shut down and ends at once, but a thread blocked where no
    socket can be shut (a DNS lookup, a connect or TLS handshake under way) would hold
    the interpreter's exit for up to the request's timeout: past the grace, the process
    leaves without it (stdout and stderr flushed first)."""
    deadline = time.monotonic() + _THREAD_GRACE_S
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    if any(t is not me and not t.daemon and t.is_alive() for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    raise click.exceptions.Exit(code)


def run(func: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``anyio.run(func, *args)`` with Ctrl-C as a cancellation of the command that wakes
    its event loop at once; KeyboardInterrupt once the command has cleaned up.

    asyncio's runner takes SIGINT with a plain signal handler, which runs only when the
    main thread next runs Python code: a SIGINT that lands just before the loop blocks
    in its selector (the main thread idle, every request in a worker thread) waits for
    the loop's next event, a request's timeout (10.6 s at the default --timeout). The
    loop's own signal handling writes the signal to its wakeup file descriptor, which
    ends that wait.
    """
    return anyio.run(_interruptible, func, args)


async def _interruptible(func: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> T:
    import asyncio

    loop = asyncio.get_running_loop()
    interrupted = False
    with anyio.CancelScope() as scope:

        def on_sigint() -> None:
            nonlocal interrupted
            interrupted = True
            scope.cancel()
            # A second Ctrl-C, during the cleanup, raises KeyboardInterrupt at once.
            loop.remove_signal_handler(signal.SIGINT)

        # Not the main thread, or Windows: asyncio's runner takes SIGINT as before.
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            result = await func(*args)
        except BaseException:
            if interrupted:
                raise KeyboardInterrupt from None  # however the cleanup ended
            raise
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGINT)
    if interrupted or scope.cancelled_caught:
        raise KeyboardInterrupt
    return result


def one_line(exc: AiostreamError) -> str:
    return " ".join(str(exc).split())


class _WarningLines(logging.Handler):
    """The library's warnings on stderr, one line each: ``aiostream-hf: WARNING: ...``
    (the stderr of the moment, as click's own output)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = " ".join(record.getMessage().split())
            click.echo(f"aiostream-hf: {record.levelname}: {message}", err=True)
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def _library_warnings() -> Iterator[None]:
    """While a command runs, WARNINGs (and worse) of the ``aiostream_hf`` loggers reach
    stderr as one line each, with no traceback; nothing of lower levels, and no other
    logger is touched (httpx2's INFO lines stay off)."""
    library = logging.getLogger("aiostream_hf")
    handler = _WarningLines(logging.WARNING)
    saved = library.level, library.propagate
    library.addHandler(handler)
    library.setLevel(logging.WARNING)
    library.propagate = False
    try:
        yield
    finally:
        library.removeHandler(handler)
        library.setLevel(saved[0])
        library.propagate = saved[1]


#: The library's hints name Python arguments; on the command line, the flags that set them.
_FLAGS = (
    ("pass endpoint=", "pass --endpoint"),
    ("pass format=", "pass --format"),
    ("unknown format ", "unknown --format "),
    ("StreamOptions(s3_anonymous=True)", "--no-sign-request"),
    ("StreamOptions.s3_anonymous=True", "--no-sign-request"),
)


def explained(exc: AiostreamError, params: Mapping[str, Any]) -> str:
    """The one-line message of ``exc`` and, for a network failure or a failing server, a
    second line: the way out (the endpoint or URL to check, more patience, later)."""
    from ._exceptions import ResolutionError, RetriesExhaustedError, UnreachableError

    message = one_line(exc)
    for api, flag in _FLAGS:
        message = message.replace(api, flag)
    chain = list(_causes(exc))
    network = any(isinstance(e, httpx2.TransportError | ConnectionError) for e in chain)
    gave_up = isinstance(exc, RetriesExhaustedError) or (
        type(exc) is ResolutionError and re.search(r"after \d+ attempts", message) is not None
    )
    if isinstance(exc, UnreachableError) or not (network or gave_up):
        return message  # not a network failure, or one whose message says it all
    retries = f"--retries (now {params.get('retries')})"
    status = getattr(exc, "status", None)
    answered = re.search(r"\bHTTP (5\d\d)\b", message)
    code = status if isinstance(status, int) and status >= 500 else None
    if code is None and answered is not None:
        code = int(answered.group(1))
    if not network and code is not None:
        return (
            f"{message}\nThe server is failing (HTTP {code}), not the request: try again "
            f"later, or give it longer with {retries}."
        )
    from ._resolver import DEFAULT_ENDPOINT

    endpoint = params.get("endpoint") or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    host = urllib.parse.urlsplit(endpoint).netloc
    if host and host in message:
        hint = f"Is the endpoint right ({endpoint})? Set HF_ENDPOINT or pass --endpoint."
    else:
        hint = "Is the URL right, and its server up?"
    timed_out = any(isinstance(e, httpx2.TimeoutException | TimeoutError) for e in chain)
    if timed_out or re.search(r"\bwithin\b|timed out", message):
        hint += (
            f" If it is only slow: --timeout (now {params.get('timeout'):g} s) and {retries} "
            "give it longer."
        )
    return f"{message}\n{hint}"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from (or during), without looping."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


# -- checked values: numbers and output paths ----------------------------------------


class FiniteFloat(click.FloatRange):
    """A number in a range, and finite: ``nan``, ``inf`` and ``-inf`` are refused (they
    pass click's own range checks, comparing false to every bound)."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


#: A TCP port: 0 (a free one) to 65535.
PORT = click.IntRange(0, 65535)


def check_writable(path: Path, what: str, *, folder: bool = False) -> None:
    """Fail now, before any work, with one line naming ``path``, when ``what`` (a file,
    or a folder with ``folder``) cannot be made there: its parent folder missing, not a
    folder, or not writable; the path itself of the other kind or not writable."""
    if path.exists():
        if path.is_dir() != folder:
            kind = "a folder" if path.is_dir() else "not a folder"
            raise click.ClickException(f"cannot write {what} to {str(path)!r}: it is {kind}")
        if not os.access(path, os.W_OK):
            raise click.ClickException(f"cannot write {what} to {str(path)!r}: not writable")
        return
    parent = path.absolute().parent
    if folder:  # a folder is made with its parents: the nearest existing one decides
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
    if not parent.exists():
        raise click.ClickException(
            f"cannot write {what} to {str(path)!r}: its folder {str(parent)!r} does not exist"
        )
    if not parent.is_dir():
        raise click.ClickException(
            f"cannot write {what} to {str(path)!r}: {str(parent)!r} is not a folder"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise click.ClickException(
            f"cannot write {what} to {str(path)!r}: its folder {str(parent)!r} is not writable"
        )


def write_or_fail(path: Path, what: str, write: Callable[[], object]) -> None:
    """``write()``, an OSError (a file that takes no writes, like /proc/version; a full
    disk) as one line naming ``path``."""
    try:
        write()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise click.ClickException(f"cannot write {what} to {str(path)!r}: {reason}") from exc


def plural(n: int, noun: str) -> str:
    """``1 frame``, ``2 frames``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def repos_under(root: Path) -> list[str]:
    """The dataset repos a local Hub server serves from ``root`` (``ORG/NAME`` for each
    folder ``root/datasets/ORG/NAME/``), sorted."""
    folder = root / "datasets"
    if not folder.is_dir():
        return []
    return sorted(f"{p.parent.name}/{p.name}" for p in folder.glob("*/*") if p.is_dir())


def served_repos(root: Path) -> str:
    """A line for stderr: the repos ``hub serve`` finds under ``root``, or a warning
    naming the layout it expects when there is none."""
    folder = root / "datasets"
    repos = repos_under(root)
    if not repos:
        return (
            f"aiostream-hf: WARNING: no dataset repo under {root}: each folder "
            f"{folder}/ORG/NAME/ is served as the repo ORG/NAME (`aiostream-hf demo` writes "
            "such folders); until one exists every repo is answered 'not found'."
        )
    shown = ", ".join(repos[:5]) + (f" and {len(repos) - 5} more" if len(repos) > 5 else "")
    return f"serving {plural(len(repos), 'dataset repo')}: {shown}"


# A LeRobot dataset's data Parquet (v2.1: episode_000000.parquet; v3: file-000.parquet).
_LEROBOT_DATA = re.compile(r"(?:^|/)data/chunk-\d+/(?:episode|file)[-_]\d+\.parquet$")


def lerobot_note(manifest: Any, command: str) -> str | None:
    """A line for stderr when every file ``command`` read is a LeRobot dataset's data
    Parquet: what it read (rows, no camera frames) and where the frames are."""
    files = getattr(manifest, "files", None) or []
    if not files or not all(_LEROBOT_DATA.search(f.path) for f in files):
        return None
    return (
        f"note: these are a LeRobot dataset's data files: {command} read their rows, not the "
        "camera frames; `aiostream-hf ls` names the cameras, `aiostream-hf frames` decodes a "
        "video, and aiostream_hf.lerobot.stream() gives items with their frames"
    )


def report_absent(source: str, names: Names | None) -> None:
    """When some files ``source`` names are not there (``names``: ``_describe.Names``, or
    None when they were not checked), a line for each on stdout (``missing (HTTP 404)
    URL``), then exit code 1 with one line naming them, by reason, and the way out."""
    if names is None or not names.absent:
        return
    absent = names.absent
    width = max(len(a.reason) for a in absent)
    click.echo()
    click.echo(f"not there: {len(absent)} of the {plural(names.count, 'file')} named")
    for a in absent:
        click.echo(f"{a.reason.ljust(width)}  {a.name}")
    if names.count == 1:
        raise click.ClickException(f"{source!r} is not there: {absent[0].reason}. Check the URL.")
    shorts = [a.short for a in absent]
    unique = len(set(shorts)) == len(shorts)  # else the full names tell them apart
    by_reason: dict[str, list[str]] = {}
    for a, short in zip(absent, shorts, strict=True):
        by_reason.setdefault(a.reason, []).append(short if unique else a.name)
    listed = "; ".join(
        f"{reason}: {', '.join(found[:5])}" + (f" and {len(found) - 5} more" if found[5:] else "")
        for reason, found in by_reason.items()
    )
    present = len(names.present)
    if present:
        verb = "is" if len(absent) == 1 else "are"
        head = f"{len(absent)} of the {names.count} files that {source!r} names {verb} not there"
        verb = "is" if present == 1 else "are"
        way = (
            f"The {present} that {verb} there {verb} listed above: narrow the braces to them, "
            "or fix the pattern."
        )
    else:
        head = f"none of the {names.count} files that {source!r} names is there"
        way = "Check the pattern: its host, path and brace ranges."
    if any(a.reason.startswith("refused") for a in absent):
        way += " A refusal means no access, or, where a bucket may not be listed, no such file."
    raise click.ClickException(f"{head}; {listed}. {way}")
