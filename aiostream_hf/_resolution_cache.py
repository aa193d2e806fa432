"""The resolver's caches: in memory (an LRU bounded by weight, with expiry) and on disk
(one JSON entry per key under ``{cache_dir}/resolutions/``, written atomically, 0600, in
a folder of this user's, 0700), with the file locks that make one process of a machine
do the work while the others read its answer."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import stat
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import anyio
import filelock

from ._models import Manifest

logger = logging.getLogger("aiostream_hf.resolver")
T = TypeVar("T")
_FOLDER_MODE = 0o700
_FILE_MODE = 0o600


@dataclass(frozen=True, slots=True)
class _Codec(Generic[T]):
    """How one kind of value is cached: in memory always; on disk when it has a codec."""

    kind: str
    encode: Callable[[T], Any] | None = None
    decode: Callable[[Any], T] | None = None


class _Pending:
    """A resolution in flight: its waiters sleep on ``event``."""

    __slots__ = ("done", "error", "event", "value")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.done = False
        self.value: Any = None
        self.error: Exception | None = None


class _Lru:
    """An LRU of values with an optional expiry (monotonic seconds), bounded by weight."""

    def __init__(self, max_weight: int) -> None:
        self._max_weight = max_weight
        self._weight = 0
        self._items: OrderedDict[str, tuple[Any, float | None, int]] = OrderedDict()

    def get(self, key: str) -> tuple[bool, Any]:
        item = self._items.get(key)
        if item is None:
            return False, None
        value, expires, weight = item
        if expires is not None and time.monotonic() >= expires:
            del self._items[key]
            self._weight -= weight
            return False, None
        self._items.move_to_end(key)
        return True, value

    def discard(self, key: str) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self._weight -= item[2]

    def put(self, key: str, value: Any, ttl: float | None, weight: int) -> None:
        if ttl is not None and ttl <= 0:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self._weight -= old[2]
        self._items[key] = (value, None if ttl is None else time.monotonic() + ttl, weight)
        self._weight += weight
        while self._weight > self._max_weight and len(self._items) > 1:
            _, (_, _, dropped) = self._items.popitem(last=False)
            self._weight -= dropped


def _weight(value: object) -> int:
    if isinstance(value, Manifest):
        return max(1, len(value.files))
    if isinstance(value, tuple):  # a tree listing
        return max(1, len(value))
    return 1


def pin_key(who: str, endpoint: str, repo: str, revision: str) -> tuple[Any, ...]:
    """The key of a branch's (or tag's) pin to a commit, for a token identity."""
    return ("pin", who, endpoint, repo, revision)


def manifest_key(
    who: str,
    endpoint: str,
    repo: str,
    sha: str,
    path: str | None,
    config: str | None,
    split: str | None,
    data_files: dict[str, list[str]] | None,
) -> tuple[Any, ...]:
    """The key of a Hub source's manifest at a commit (immutable: kept forever)."""
    return ("manifest", who, endpoint, repo, sha, path, config, split, data_files)


def _key(parts: tuple[Any, ...]) -> str:
    """``KIND-HASH``: the name of a cache entry (and of its lock file)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return f"{parts[0]}-{hashlib.sha256(text.encode()).hexdigest()[:40]}"


async def _acquire(lock: filelock.FileLock) -> None:
    """Take a file lock without blocking the event loop.

    Another process holds it; nothing can wake us when it lets go, so poll (as filelock
    itself does), starting fast: the holder is usually a few requests away from done.
    """
    delay = 0.005
    while True:
        try:
            lock.acquire(timeout=0)
            return
        except filelock.Timeout:
            await anyio.sleep(delay)
            delay = min(delay * 2, 0.1)


def _read_entry(
    path: Path, key: Any, ttl: float | None, decode: Callable[[Any], T]
) -> tuple[T, float] | None:
    """(value, age) of a cache entry that exists, is this key's, and has not expired."""
    try:
        with path.open(encoding="utf-8") as f:
            entry = json.load(f)
        if entry["key"] != key:
            return None
        age = time.time() - float(entry["created"])
        if ttl is not None and not 0 <= age < ttl:
            return None
        return decode(entry["value"]), max(age, 0.0)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("ignoring unreadable resolution cache entry %s: %s", path, exc)
        return None


def _drop_entry(path: Path, key: Any, stale: Callable[[Any], bool]) -> bool:
    """Remove the cache entry at ``path`` if it is this key's and ``stale(value)``; an
    entry that another process has replaced since is kept. Whether one was removed."""
    try:
        with path.open(encoding="utf-8") as f:
            entry = json.load(f)
        if entry["key"] != key or not stale(entry["value"]):
            return False
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("cannot drop resolution cache entry %s: %s", path, exc)
        return False


def _prepare_folder(folder: Path) -> None:
    """Make ``folder`` (mode 0700), or make it 0700 if it exists with wider bits; an
    OSError when it belongs to another user (whose entries we would trust)."""
    folder.mkdir(mode=_FOLDER_MODE, parents=True, exist_ok=True)
    if not hasattr(os, "getuid"):  # Windows: the user's profile folder is private
        return
    st = folder.stat()
    if st.st_uid != os.getuid():
        raise PermissionError(
            f"it belongs to uid {st.st_uid}, not to this user (uid {os.getuid()}): "
            "set StreamOptions.cache_dir or AIOSTREAM_HF_CACHE to a folder of your own"
        )
    if stat.S_IMODE(st.st_mode) != _FOLDER_MODE:
        os.chmod(folder, _FOLDER_MODE)


def _write_entry(path: Path, entry: Any) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        with open(os.open(tmp, flags, _FILE_MODE), "w", encoding="utf-8") as f:
            json.dump(entry, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("cannot write resolution cache entry %s: %s", path, exc)
        tmp.unlink(missing_ok=True)
