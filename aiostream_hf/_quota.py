"""Rate-limit quotas shared by the processes of a machine: one count per server bucket.

The Hub counts requests per client (an IP address, or a token) in fixed windows, in
buckets ("api", "resolvers"), and says in every answer how many are left
(``RateLimit: "resolvers";r=<remaining>;t=<seconds to reset>``). Sixty-four DataLoader
workers are sixty-four processes spending ONE quota, yet each sees only the headers of
its own answers: a count kept per process is always stale (every other process spent
some since), so paced per process they overshoot together, and kept safe by a large
reserve they leave most of the quota unused and all wait for the window's reset.

So the count lives in one small file per (host, bucket, token) in the cache folder,
read and written under an exclusive ``flock`` (microseconds):

- every request takes one from ``remaining`` before it is sent; with ``remaining`` at
  or below the caller's ``reserve`` it waits until the window ends instead;
- every answer lowers ``remaining`` to the server's ``r`` if that is lower (never
  raises it: answers arrive out of order and ``r`` does not know the requests still on
  their way), so the count never promises more than the server has left;
- when the window has ended (or nothing is known yet), one request at a time, on the
  whole machine, goes first; its answer opens the new window's count. The others wait
  for it (they look again every ``PROBE_POLL_S``; a probe that went away without
  teaching anything frees the others at once, one that hangs after ``PROBE_TIMEOUT_S``);
- an answer to a request sent before the current window's count began belongs to an
  earlier window and is ignored; an answer without ``RateLimit`` to the first request
  marks the bucket unlimited (until an answer says otherwise).

Within a window the processes then spend exactly the quota and never more: at most
``reserve`` stays unused. Where the folder cannot hold the file (read-only, or no
``fcntl``), the count is kept in this process only; so it is, from the last count in
the file on, when another process holds the file's lock past ``LOCK_TIMEOUT_S`` (a
process stopped, or hung, in the microseconds it holds it), with a warning: the
wait is bounded, and a server's 429s are still waited out.

No call waits for the lock (they run on the event loop): while another process holds
it, ``take`` answers "poll" (look again in ``LOCK_POLL_S``), and what an answer
taught (``learn``, ``unlimited``, ``probe_ended``) is applied the next time this
process holds it, before anything else (at most one per request in flight).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: per-process counts
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "GO",
    "LOCK_POLL_S",
    "LOCK_TIMEOUT_S",
    "PROBE",
    "PROBE_POLL_S",
    "PROBE_TIMEOUT_S",
    "Pacing",
    "SharedQuota",
    "bucket_of",
]

logger = logging.getLogger("aiostream_hf")

#: How often a request waiting for another process's probe looks again, seconds.
PROBE_POLL_S = 0.02
#: A probe not answered within this many seconds no longer holds the others back.
PROBE_TIMEOUT_S = 10.0
#: The longest a process waits for another's lock on a count file, seconds (a lock is
#: held for microseconds): then it counts on its own.
LOCK_TIMEOUT_S = 1.0
#: How often a request whose count file another process holds locked looks again, seconds.
LOCK_POLL_S = 0.001
GO = "go"
PROBE = "probe"
_UNKNOWN = -1
_UNLIMITED = -2
# window_end (wall clock), remaining, probe_until (wall clock), valid_from (wall clock:
# answers to requests sent earlier are ignored), blind (requests sent while unknown)
_STATE = struct.Struct("<dqddq")


@dataclass(frozen=True)
class Pacing:
    """How a caller's requests spend a server's rate-limit quota.

    folder: where the processes of the machine keep their common counts (the cache
        folder); None: this process only.
    reserve: requests of each window left unused (for other programs spending the same
        quota, e.g. ``huggingface_hub`` downloads in the same job).
    """

    folder: Path | None
    reserve: int = 0


def bucket_of(path: str) -> str:
    """The Hub's rate-limit bucket of a URL path: "api", "resolvers", else ""."""
    if path.startswith("/api/"):
        return "api"
    if "/resolve/" in path:
        return "resolvers"
    return ""


class _State:
    __slots__ = ("blind", "probe_until", "remaining", "valid_from", "window_end")

    def __init__(self, raw: bytes) -> None:
        fresh = (0.0, _UNKNOWN, 0.0, 0.0, 0)
        values = _STATE.unpack(raw) if len(raw) == _STATE.size else fresh
        self.window_end, self.remaining, self.probe_until, self.valid_from, self.blind = values

    def pack(self) -> bytes:
        return _STATE.pack(
            self.window_end, self.remaining, self.probe_until, self.valid_from, self.blind
        )


class SharedQuota:
    """The rate-limit counts of one process's client (plain synchronous code).

    ``take`` before a request, ``learn`` (or ``unlimited``) at its answer, ``probe_ended``
    when a probe went away without one. Keys are (folder, host, bucket, token). No call
    waits for another process's lock (see the module's text).
    """

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}
        self._memory: dict[Path, bytes] = {}
        self._limited: set[Path] = set()  # keys this process saw a RateLimit header for
        # Answers' updates not yet applied: their count file was locked by another process.
        self._deferred: dict[Path, list[Callable[[_State], object]]] = {}
        # (since, last): when a key's lock was first and last seen held by another
        # process, in this stretch of looking (monotonic time).
        self._busy: dict[Path, tuple[float, float]] = {}

    def close(self) -> None:
        for key in list(self._deferred):
            self._update(key, _nothing)  # a last try; else they are lost (counts only lower)
        self._deferred.clear()
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    @staticmethod
    @functools.lru_cache(maxsize=64)  # asked before every request, of a few keys
    def key(pacing: Pacing, host: str, bucket: str, token: str | None) -> Path:
        who = hashlib.sha256(token.encode()).hexdigest()[:16] if token else "anonymous"
        name = hashlib.sha256(f"{host}\0{bucket}\0{who}".encode()).hexdigest()[:32]
        folder = pacing.folder if pacing.folder is not None else Path("<memory>")
        return folder / "ratelimits" / f"{name}.bin"

    def known_limited(self, key: Path) -> bool:
        return key in self._limited

    def _update(self, key: Path, change: Callable[[_State], _T]) -> _T | _Busy:
        """``change`` applied to the key's count under its lock, after the updates
        deferred while it was locked; ``BUSY``: another process holds the lock (for
        less than ``LOCK_TIMEOUT_S`` so far)."""
        fd = self._fd(key)
        if fd is None:
            state = _State(self._memory.get(key, b""))
            for deferred in self._deferred.pop(key, ()):
                deferred(state)
            result = change(state)
            self._memory[key] = state.pack()
            return result
        assert fcntl is not None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            now = time.monotonic()
            since, last = self._busy.get(key, (now, now))
            if now - last > LOCK_TIMEOUT_S:
                since = now  # not looked for a while: a new stretch
            self._busy[key] = (since, now)
            if now - since < LOCK_TIMEOUT_S:
                return BUSY
            # Its holder is stopped or hung: count in this process from the file's last
            # state on (read without the lock, which may never come back).
            logger.warning(
                "the rate-limit count %s has been locked by another process for %.1f s: "
                "this process paces its own requests from now on",
                key,
                LOCK_TIMEOUT_S,
            )
            self._memory[key] = os.pread(fd, _STATE.size, 0)
            del self._fds[key]
            del self._busy[key]
            os.close(fd)
            return self._update(key, change)
        self._busy.pop(key, None)
        try:
            state = _State(os.pread(fd, _STATE.size, 0))
            before = state.pack()
            for deferred in self._deferred.pop(key, ()):
                deferred(state)
            result = change(state)
            after = state.pack()
            if after != before:
                os.pwrite(fd, after, 0)
            return result
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _apply(self, key: Path, change: Callable[[_State], object]) -> None:
        """Apply an answer's update now, or once this process next holds the lock."""
        if self._update(key, change) is BUSY:
            self._deferred.setdefault(key, []).append(change)

    def _fd(self, key: Path) -> int | None:
        """The open count file of ``key``; None: it is counted in this process only."""
        fd = self._fds.get(key)
        if fd is not None or fcntl is None or key.parts[0] == "<memory>" or key in self._memory:
            return fd
        try:
            key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            self._memory[key] = b""  # this process only, from now on
            return None
        self._fds[key] = fd
        return fd

    def take(self, key: Path, reserve: int, now: float) -> tuple[str, float]:
        """(GO, now): send it. (PROBE, now): send it; its answer opens the window's
        count. ("wait", t): the quota is spent until wall-clock time t. ("poll", t): another
        request is probing, or another process holds the count: look again at t."""
        taken = self._update(key, functools.partial(_take, reserve=reserve, now=now))
        if isinstance(taken, _Busy):
            return "poll", now + LOCK_POLL_S
        return taken

    def learn(self, key: Path, remaining: int, reset: float, sent_at: float, now: float) -> None:
        """An answer to a request sent at ``sent_at`` said ``r=remaining;t=reset``."""
        self._limited.add(key)
        change = functools.partial(
            _learn, remaining=remaining, reset=reset, sent_at=sent_at, now=now
        )
        self._apply(key, change)

    def unlimited(self, key: Path, sent_at: float) -> None:
        """An answer without ``RateLimit``: if nothing is known, the bucket is unlimited."""
        self._apply(key, functools.partial(_unlimited, sent_at=sent_at))

    def probe_ended(self, key: Path) -> None:
        """A probe went away without an answer: the next request probes."""
        self._apply(key, _probe_ended)


class _Busy:
    """Another process holds the count file's lock."""


BUSY = _Busy()
_T = TypeVar("_T")


def _nothing(s: _State) -> None:
    return None


def _take(s: _State, *, reserve: int, now: float) -> tuple[str, float]:
    if s.remaining == _UNLIMITED:
        return GO, now
    if s.remaining >= 0 and now < s.window_end:
        if s.remaining > reserve:
            s.remaining -= 1
            return GO, now
        return "wait", s.window_end
    if s.remaining >= 0:  # the window ended: its answers are stale from now on
        s.valid_from = max(s.valid_from, s.window_end)
        s.remaining = _UNKNOWN
        s.blind = 0
    if s.probe_until > now:
        return "poll", min(s.probe_until, now + PROBE_POLL_S)
    s.probe_until = now + PROBE_TIMEOUT_S
    s.blind += 1
    return PROBE, now


def _learn(s: _State, *, remaining: int, reset: float, sent_at: float, now: float) -> None:
    if sent_at < s.valid_from:
        return  # an answer from an earlier window
    if s.remaining < 0 or now >= s.window_end:
        # The window's first answer: the requests sent blind meanwhile (other than this
        # one) may not be counted in it yet.
        s.remaining = max(0, remaining - max(0, s.blind - 1))
        s.window_end = now + reset
        s.valid_from = sent_at
        s.probe_until = 0.0
        s.blind = 0
    else:
        s.remaining = min(s.remaining, remaining)


def _unlimited(s: _State, *, sent_at: float) -> None:
    if s.remaining == _UNKNOWN and sent_at >= s.valid_from:
        s.remaining = _UNLIMITED
        s.probe_until = 0.0


def _probe_ended(s: _State) -> None:
    if s.remaining == _UNKNOWN:
        s.probe_until = 0.0
