"""ByteCache: the bytes of files, kept on disk in blocks, shared by the processes of a
machine (a DataLoader's workers, the ranks of a job, the next epoch).

    cache = ByteCache(folder, limit=50 << 30)
    parts = await cache.read(file, scope, [(0, 100), (5000, 9000)], fetch)

Opt-in: ``StreamOptions(byte_cache_bytes=...)`` (the folder: ``byte_cache_dir``, else
``{cache_dir}/bytes``). A file is cached when its version is known before it is read
(its size and its ETag: a Hub file's sha256 or git oid, an S3 object's ETag), so a
block is keyed by what it holds: the file's path, size and ETag, the block's index,
and whose credentials read it (``scope``: a hash of the token; blocks read with one
token are never served to a reader with another, or with none).

Each block (``BLOCK`` bytes, the last one shorter) is one file
``blocks/KK/KEY.blk``: a header (magic, length, CRC-32 of the payload) and the
payload. Written to a temporary name (0600, in folders 0700) and renamed into place,
so a process killed mid-write leaves nothing visible but a temporary file, removed by
the next eviction pass; a block whose header or CRC does not match (a corrupted disk,
a truncated copy) is deleted and fetched again. A process checks a block's CRC once:
at its first read of it (or as it writes it); read again unchanged (same inode, size
and modification time), it is read in the part asked for only, unchecked, so damage
that leaves a file's size and time as they were is found by the next process that
reads it, not by one that checked it before. A write that fails (the disk full)
is logged once and the bytes are served all the same.

Each block is fetched once per machine: a process about to fetch a run of missing
blocks takes their file locks (``locks/KK/KEY.lock``, in ascending order, so that
two processes never wait on each other), looks again, and fetches only what is still
missing; another process waiting on those locks then finds the blocks on disk. A lock
not had within the options' ``timeout`` is given up: the bytes are fetched without
the cache. Tasks of one process wanting the same block wait for the one fetching it.

A cache also holds the last ``_RECENT_BLOCKS`` blocks it read in memory (8 MiB): a
file's next read often begins in the block the last one ended in.

The blocks held are kept under ``limit`` bytes: a process that wrote more than a
sixteenth of the limit since its last look counts the folder, and evicts the blocks
least recently used (a hit sets a block's modification time, at most once a minute)
down to seven eighths of the limit, one process at a time (``evict.lock``).

Entries. Besides blocks, the store keeps small entries that other parts of the library
derive from a file's bytes (a video's parsed index, ``_video_index_cache``): one file
``entries/KK/KEY.ent`` each, keyed like a block (the file's path, size and ETag, the
scope, and what the entry is), written and checked the same way (a header with magic,
length and CRC, a temporary name renamed into place, 0600), and counted under the same
limit and evicted with the blocks, least recently used first (``read_entry`` /
``write_entry``). An entry longer than ``MAX_ENTRY`` bytes is neither written nor read.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import secrets
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import filelock
import pyarrow as pa

from ._models import FileRef

__all__ = ["BLOCK", "MAX_ENTRY", "VIDEO_BLOCK", "ByteCache", "ByteCacheStatistics"]

logger = logging.getLogger("aiostream_hf")

BLOCK = 1024 * 1024
#: The block of a video file (by its suffix, ``VIDEO_SUFFIXES``): its reads are a GOP
#: each, here and there in the file; whole 1 MiB blocks about doubled what a cold read of
#: a GOP of a 640x480 video (about 1.2 MB) fetched.
VIDEO_BLOCK = 256 * 1024
VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi")
_MAGIC = b"ASHBLK1\0"
_HEADER = struct.Struct("<8sQI4x")  # magic, payload length, CRC-32 of the payload
_ENTRY_MAGIC = b"ASHENT1\0"
#: The longest entry kept (a video index of ``MAX_SAMPLES`` samples is far shorter than
#: a file's worth; an entry's header is checked against this before a byte is allocated).
MAX_ENTRY = 256 * 1024 * 1024
#: The folders of the store whose files count under the limit (blocks, then entries).
_KINDS = ("blocks", "entries")
_FOLDER_MODE = 0o700
_FILE_MODE = 0o600
_TMP_SUFFIX = ".tmp"
_STALE_TMP_S = 600.0  # a temporary file this old is a killed writer's
#: A block read is marked used (its modification time set) once this many seconds have
#: passed since the last mark: the LRU order is kept to that precision, without a
#: metadata write per read.
_TOUCH_EVERY_S = 60.0
#: Blocks read last that a cache keeps in memory (a file's next read often needs one).
_RECENT_BLOCKS = 8

Fetch = Callable[[list[tuple[int, int]]], Awaitable[Sequence[Any]]]


@dataclass(frozen=True)
class ByteCacheStatistics:
    """What a process's byte cache did.

    hits / misses: blocks read from disk / fetched (by this process).
    bytes_read / bytes_written: payload bytes read from disk / written to it.
    waited: blocks this process found on disk after waiting for another process (or
        task) that was fetching them.
    corrupt: blocks found damaged on disk (deleted, fetched again).
    write_failures: blocks that could not be written (the disk full, a permission).
    evicted / evicted_bytes: blocks and entries (and their bytes) this process evicted.
    lock_timeouts: runs of blocks fetched without the cache, their locks not had in time.
    entry_hits / entry_misses / entries_written: entries (``read_entry``) found, not
        found (or damaged: counted in ``corrupt`` too), written.
    """

    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    waited: int = 0
    corrupt: int = 0
    write_failures: int = 0
    evicted: int = 0
    evicted_bytes: int = 0
    lock_timeouts: int = 0
    entry_hits: int = 0
    entry_misses: int = 0
    entries_written: int = 0


def _whole(blocks: list[tuple[int, str]]) -> list[tuple[int, str, tuple[int, int] | None]]:
    """Blocks to read whole (``None``: no part named)."""
    return [(i, key, None) for i, key in blocks]


class _Verified:
    """Block files whose CRC this process has checked (or which it wrote), by path and
    stat identity (inode, size, modification time): a block read again, unchanged, is
    not checked again. Bounded (least recently added go first); shared by threads."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: OrderedDict[tuple[Any, ...], None] = OrderedDict()
        self._lock = threading.Lock()

    def has(self, key: tuple[Any, ...]) -> bool:
        with self._lock:
            return key in self._seen

    def add(self, key: tuple[Any, ...]) -> None:
        with self._lock:
            self._seen[key] = None
            self._seen.move_to_end(key)
            while len(self._seen) > self._limit:
                self._seen.popitem(last=False)


_verified = _Verified(1 << 16)


class ByteCache:
    """See the module's docstring."""

    def __init__(
        self,
        folder: Path,
        limit: int,
        *,
        block: int = BLOCK,
        video_block: int = VIDEO_BLOCK,
        lock_timeout: float = 60.0,
    ) -> None:
        if limit < 1 or block < 1 or video_block < 1:
            raise ValueError(
                f"ByteCache(limit={limit}, block={block}, video_block={video_block}): "
                "each must be >= 1"
            )
        self.folder = Path(folder)
        self.limit = limit
        self.block = block
        self.video_block = video_block
        self._lock_timeout = lock_timeout
        self._counts: dict[str, int] = dict.fromkeys(ByteCacheStatistics.__dataclass_fields__, 0)
        self._written_since_look = 0
        self._prepared = False
        self._warned_write = False
        # blocks being fetched by a task of this process: others wait on its event
        self._fetching: dict[str, anyio.Event] = {}
        # the blocks read last (on the event loop only): (buffer, the part it holds)
        self._recent: OrderedDict[str, tuple[Any, int, int]] = OrderedDict()

    def statistics(self) -> ByteCacheStatistics:
        return ByteCacheStatistics(**self._counts)

    @staticmethod
    def holds(file: FileRef) -> bool:
        """Whether ``file`` is cached: its size and version (ETag) known before a read."""
        return file.size is not None and bool(file.etag)

    def block_of(self, file: FileRef) -> int:
        """The block size ``file`` is kept in: ``video_block`` for a video file (by its
        suffix: every process of a machine picks the same, so they share its blocks),
        else ``block``."""
        return self.video_block if file.path.lower().endswith(VIDEO_SUFFIXES) else self.block

    # -- reads ----------------------------------------------------------------------------

    async def read(
        self,
        file: FileRef,
        scope: str,
        spans: Sequence[tuple[int, int]],
        fetch: Fetch,
        *,
        max_request: int,
    ) -> list[bytes | memoryview]:
        """The bytes of each (start, end exclusive) span of ``file``: from the blocks on
        disk, the missing ones fetched (``fetch(ranges)``: one buffer per range, ranges
        of whole blocks, each at most ``max_request`` bytes) and kept. A span over blocks
        this process has checked is read into a buffer of its own; one over blocks
        fetched, checked now or held in memory is a view of its block (no copy), or
        joined from its blocks."""
        assert file.size is not None
        if not self._prepared:
            await anyio.to_thread.run_sync(self._prepare)
        # Spans over blocks already checked are read straight into one buffer each (one
        # copy, as a local read, and only the bytes asked for); the others (and any
        # within a block held in memory: no thread hop for it) go through the blocks.
        b = self.block_of(file)
        ask = [
            i for i, (s, e) in enumerate(spans) if e > s and not self._held(file, scope, b, s, e)
        ]
        direct: list[pa.Buffer | None] = [None] * len(spans)
        if ask:
            read = await anyio.to_thread.run_sync(
                self._read_direct, file, scope, [spans[i] for i in ask]
            )
            for i, got in zip(ask, read, strict=True):
                direct[i] = got
        rest = [(s, e) for (s, e), got in zip(spans, direct, strict=True) if got is None]
        needs = _needs(b, [(s, e) for s, e in rest if e > s])
        blocks = await self._blocks(file, scope, needs, fetch, max_request) if needs else {}
        out: list[bytes | memoryview] = []
        for (s, e), got in zip(spans, direct, strict=True):
            if got is not None:
                out.append(memoryview(got).cast("B"))  # bytes, as the blocks' views
                continue
            if e <= s:
                out.append(b"")
                continue
            pieces = _cut(b, blocks, s, e)
            out.append(pieces[0] if len(pieces) == 1 else b"".join(pieces))
        return out

    def _held(self, file: FileRef, scope: str, b: int, s: int, e: int) -> bool:
        """Whether the span lies in one block held in memory (``_recent``)."""
        i = s // b
        if (e - 1) // b != i:
            return False
        held = self._recent.get(self._key(file, scope, i))
        return held is not None and held[1] <= s - i * b and e - i * b <= held[2]

    def _read_direct(
        self, file: FileRef, scope: str, spans: Sequence[tuple[int, int]]
    ) -> list[pa.Buffer | None]:
        """Each span read into a buffer of its own from blocks on disk whose CRC this
        process has checked (``_verified``); None for one with a block not there or not
        checked (read through ``_blocks``, which checks it). The buffers are of Arrow's
        memory pool, reused from span to span, as the fetcher's (not fresh pages)."""
        out: list[pa.Buffer | None] = []
        b = self.block_of(file)
        for s, e in spans:
            blocks = _blocks_of(b, s, e)
            buf = pa.allocate_buffer(e - s)  # spans are checked against the file's size
            view = memoryview(buf)
            for i in blocks:
                at = i * b
                lo, hi = max(s, at) - at, min(e, at + b) - at
                bs, be = self._span(file, i)
                into = view[at + lo - s : at + hi - s]
                if not self._read_checked(self._path(self._key(file, scope, i)), be - bs, lo, into):
                    out.append(None)
                    break
            else:
                out.append(buf)
        return out

    def _read_checked(self, path: Path, length: int, lo: int, into: memoryview) -> bool:
        """Bytes ``lo`` on of a checked block's payload of ``length``, into ``into``;
        False (nothing counted) if the block is not there or not checked."""
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                seen = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
                if st.st_size != _HEADER.size + length or not _verified.has(seen):
                    return False
                f.seek(_HEADER.size + lo)
                if f.readinto(into) != len(into):
                    return False
        except OSError:
            return False
        self._touch(path, st)
        self._counts["hits"] += 1
        self._counts["bytes_read"] += len(into)
        return True

    @staticmethod
    def _touch(path: Path, st: os.stat_result) -> None:
        """Mark a block used (evicted last), at most once a minute: each mark changes its
        time, so it stays checked under its new stat identity."""
        if time.time() - st.st_mtime > _TOUCH_EVERY_S:
            with contextlib.suppress(OSError):
                os.utime(path)
                now = os.stat(path)
                _verified.add((str(path), now.st_ino, now.st_size, now.st_mtime_ns))

    def _span(self, file: FileRef, i: int) -> tuple[int, int]:
        assert file.size is not None
        b = self.block_of(file)
        return i * b, min(file.size, (i + 1) * b)

    def _key(self, file: FileRef, scope: str, i: int) -> str:
        b = self.block_of(file)
        ident = f"{scope}\0{file.path}\0{file.size}\0{file.etag}\0{b}\0{i}"
        return hashlib.sha256(ident.encode()).hexdigest()

    def _path(self, key: str, kind: str = "blocks", suffix: str = ".blk") -> Path:
        return self.folder / kind / key[:2] / f"{key}{suffix}"

    async def _blocks(
        self,
        file: FileRef,
        scope: str,
        needs: dict[int, tuple[int, int]],
        fetch: Fetch,
        max_request: int,
    ) -> dict[int, bytes]:
        """The blocks ``needs`` names, each holding (at least) the part it needs: a
        block read from disk whose CRC this process has checked is read in that part
        only (``_load``); one fetched is whole."""
        wanted = list(needs)
        keys = {i: self._key(file, scope, i) for i in wanted}
        got: dict[int, bytes] = {}
        while True:
            # Blocks another task of this process is fetching: wait for it, then read.
            for i in wanted:
                event = self._fetching.get(keys[i])
                if event is not None and i not in got:
                    await event.wait()
                    self._counts["waited"] += 1
            todo: list[tuple[int, str, tuple[int, int] | None]] = []
            for i in wanted:
                if i not in got:
                    held = self._recent_block(keys[i], needs[i])
                    if held is None:
                        todo.append((i, keys[i], needs[i]))
                    else:
                        got[i] = held
            loaded = await anyio.to_thread.run_sync(self._load_many, file, todo)
            for i, data in loaded.items():
                self._keep_recent(keys[i], data, needs[i])
            got.update(loaded)
            missing = [i for i in wanted if i not in got]
            if not missing:
                return got
            if any(keys[i] in self._fetching for i in missing):
                continue  # another task began fetching some meanwhile: wait for it
            # No await between the look above and this: the task fetching a block is one.
            events = {keys[i]: anyio.Event() for i in missing}
            self._fetching.update(events)
            try:
                fetched = await self._fetch_missing(file, keys, missing, fetch, max_request)
                for i, data in fetched.items():
                    self._keep_recent(keys[i], data, (0, len(data)))
                got.update(fetched)
            finally:
                for key, event in events.items():
                    del self._fetching[key]
                    event.set()
            return got

    def _recent_block(self, key: str, need: tuple[int, int]) -> Any:
        """A block this cache read lately that holds ``need`` (the next row group of a
        file often begins in the block the last one ended in), else None."""
        held = self._recent.get(key)
        if held is None or not (held[1] <= need[0] and need[1] <= held[2]):
            return None
        self._recent.move_to_end(key)
        self._counts["hits"] += 1
        return held[0]

    def _keep_recent(self, key: str, data: Any, part: tuple[int, int]) -> None:
        self._recent[key] = (data, *part)
        self._recent.move_to_end(key)
        while len(self._recent) > _RECENT_BLOCKS:
            self._recent.popitem(last=False)

    async def _fetch_missing(
        self,
        file: FileRef,
        keys: dict[int, str],
        missing: list[int],
        fetch: Fetch,
        max_request: int,
    ) -> dict[int, bytes]:
        """Fetch the ``missing`` blocks under their locks (what another process wrote
        meanwhile is read instead), and keep them."""
        # Taken in one worker thread, released in another: not thread-local (a thread-local
        # lock released from another thread stays held until it is garbage collected).
        locks = [
            filelock.FileLock(self._path(keys[i], "locks", ".lock"), thread_local=False)
            for i in missing
        ]
        try:
            held = await anyio.to_thread.run_sync(self._lock_all, locks)
        except BaseException:
            # Cancelled while the thread took them: the thread ends first, and its
            # answer is lost; the locks it took are released here, not left held.
            self._unlock_all(locks)
            raise
        try:
            if held:
                found = await anyio.to_thread.run_sync(
                    self._load_many, file, _whole([(i, keys[i]) for i in missing])
                )
                self._counts["waited"] += len(found)
            else:
                self._counts["lock_timeouts"] += 1
                found = {}
            todo = [i for i in missing if i not in found]
            fetched: dict[int, bytes] = {}
            if todo:
                ranges = self._runs(file, todo, max_request)
                buffers = await fetch(ranges)
                for (s, e), buf in zip(ranges, buffers, strict=True):
                    data = memoryview(buf).cast("B")
                    for i in _blocks_of(self.block_of(file), s, e):
                        bs, be = self._span(file, i)
                        fetched[i] = bytes(data[bs - s : be - s])  # one copy, of a block
                self._counts["misses"] += len(fetched)
                if held:
                    await anyio.to_thread.run_sync(
                        self._store_many, [(keys[i], fetched[i]) for i in todo]
                    )
            return {**found, **fetched}
        finally:
            if held:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self._unlock_all, locks)

    def _runs(self, file: FileRef, blocks: list[int], max_request: int) -> list[tuple[int, int]]:
        """Ranges covering ``blocks`` (sorted): adjacent blocks joined, at most
        ``max_request`` bytes (at least one block) each."""
        runs: list[tuple[int, int]] = []
        for i in blocks:
            s, e = self._span(file, i)
            at_most = max(max_request, self.block_of(file))
            if runs and runs[-1][1] == s and e - runs[-1][0] <= at_most:
                runs[-1] = (runs[-1][0], e)
            else:
                runs.append((s, e))
        return runs

    # -- entries --------------------------------------------------------------------------

    def _entry_key(self, file: FileRef, scope: str, what: str) -> str:
        ident = f"entry\0{what}\0{scope}\0{file.path}\0{file.size}\0{file.etag}"
        return hashlib.sha256(ident.encode()).hexdigest()

    async def read_entry(self, file: FileRef, scope: str, what: str) -> bytes | None:
        """The payload of ``file``'s entry ``what`` (for ``scope``), checked (its length,
        its CRC); None when there is none, or it is damaged (then deleted)."""
        if not self._prepared:
            await anyio.to_thread.run_sync(self._prepare)
        path = self._path(self._entry_key(file, scope, what), "entries", ".ent")
        return await anyio.to_thread.run_sync(self._read_entry, path)

    async def write_entry(self, file: FileRef, scope: str, what: str, payload: bytes) -> bool:
        """Keep ``payload`` as ``file``'s entry ``what`` (for ``scope``): written atomically,
        0600, counted under the limit. False when it was not kept (too long, a write that
        failed: logged once)."""
        if len(payload) > MAX_ENTRY:
            return False
        if not self._prepared:
            await anyio.to_thread.run_sync(self._prepare)
        path = self._path(self._entry_key(file, scope, what), "entries", ".ent")
        return await anyio.to_thread.run_sync(self._write_entry, path, payload)

    async def drop_entry(self, file: FileRef, scope: str, what: str, why: str) -> None:
        """Delete ``file``'s entry ``what``: its payload was found damaged (``why``)."""
        path = self._path(self._entry_key(file, scope, what), "entries", ".ent")
        self._counts["corrupt"] += 1
        self._counts["entry_hits"] -= 1  # found, but of no use
        self._counts["entry_misses"] += 1
        logger.warning("aiostream-hf: the cached entry %s is damaged (%s): read again", path, why)
        with contextlib.suppress(OSError):
            await anyio.to_thread.run_sync(path.unlink)

    def _read_entry(self, path: Path) -> bytes | None:
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                header = f.read(_HEADER.size)
                ok = len(header) == _HEADER.size
                if ok:
                    magic, length, crc = _HEADER.unpack(header)
                    # Checked before a byte is allocated: the header must agree with the
                    # file's size, and be no longer than an entry may be.
                    ok = (
                        magic == _ENTRY_MAGIC
                        and length <= MAX_ENTRY
                        and st.st_size == _HEADER.size + length
                    )
                if ok:
                    payload = bytearray(length)
                    got = f.readinto(payload) or 0
                    ok = got == length and zlib.crc32(payload) == crc
        except FileNotFoundError:
            self._counts["entry_misses"] += 1
            return None
        except OSError as exc:
            logger.warning("aiostream-hf: cannot read the cached entry %s (%s)", path, exc)
            self._counts["entry_misses"] += 1
            return None
        if not ok:
            self._counts["corrupt"] += 1
            self._counts["entry_misses"] += 1
            logger.warning("aiostream-hf: the cached entry %s is damaged: read again", path)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        if time.time() - st.st_mtime > _TOUCH_EVERY_S:  # recently used: evicted last
            with contextlib.suppress(OSError):
                os.utime(path)
        self._counts["entry_hits"] += 1
        self._counts["bytes_read"] += length
        return bytes(payload)

    def _write_entry(self, path: Path, payload: bytes) -> bool:
        header = _HEADER.pack(_ENTRY_MAGIC, len(payload), zlib.crc32(payload))
        if not self._store(path, payload, header):
            return False
        self._counts["entries_written"] += 1
        self._counts["bytes_written"] += len(payload)
        self._written_since_look += len(payload) + _HEADER.size
        if self._written_since_look > self.limit // 16:
            self._written_since_look = 0
            self.evict()
        return True

    # -- on disk (worker threads) ---------------------------------------------------------

    def _prepare(self) -> None:
        for kind in (*_KINDS, "locks"):
            (self.folder / kind).mkdir(mode=_FOLDER_MODE, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(self.folder, _FOLDER_MODE)
        self._prepared = True

    def _lock_all(self, locks: list[filelock.FileLock]) -> bool:
        """Take every lock, in order, within the timeout; False (none held) if not."""
        deadline = time.monotonic() + self._lock_timeout
        taken: list[filelock.FileLock] = []
        try:
            for lock in locks:
                Path(lock.lock_file).parent.mkdir(mode=_FOLDER_MODE, exist_ok=True)
                lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
                taken.append(lock)
        except filelock.Timeout:
            self._unlock_all(taken)
            return False
        return True

    @staticmethod
    def _unlock_all(locks: list[filelock.FileLock]) -> None:
        for lock in reversed(locks):
            if lock.is_locked:
                lock.release()

    def _load_many(
        self, file: FileRef, blocks: list[tuple[int, str, tuple[int, int] | None]]
    ) -> dict[int, Any]:
        found = {}
        for i, key, need in blocks:
            s, e = self._span(file, i)
            data = self._load(self._path(key), e - s, need)
            if data is not None:
                found[i] = data
        return found

    def _load(
        self, path: Path, length: int, need: tuple[int, int] | None = None
    ) -> bytearray | None:
        """The block's payload, read straight into a buffer of its length. A block whose
        CRC this process has checked (or which it wrote), unchanged since (``_verified``:
        same inode, size and time), is read in the part ``need`` only; any other is read
        whole and its CRC checked. None: not there, or damaged (then deleted)."""
        payload = bytearray(length)
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                seen = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
                header = f.read(_HEADER.size)
                checked = need is not None and _verified.has(seen)
                if checked:
                    assert need is not None
                    lo, hi = need
                    f.seek(_HEADER.size + lo)
                    got = f.readinto(memoryview(payload)[lo:hi]) or 0
                    ok = got == hi - lo and st.st_size == _HEADER.size + length
                else:
                    got = f.readinto(payload) or 0
                    ok = got == length and not f.read(1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            logger.warning("aiostream-hf: cannot read the cached block %s (%s)", path, exc)
            return None
        if ok and len(header) == _HEADER.size:
            magic, size, crc = _HEADER.unpack(header)
            ok = magic == _MAGIC and size == length
            if ok and not checked:
                ok = zlib.crc32(payload) == crc
                if ok:
                    _verified.add(seen)
        else:
            ok = False
        if not ok:
            # Counted (and told) by the reader that removes it: two reads of one block at
            # once both find it damaged.
            with contextlib.suppress(OSError):
                path.unlink()
                self._counts["corrupt"] += 1
                logger.warning("aiostream-hf: the cached block %s is damaged: fetched again", path)
            return None
        self._touch(path, st)
        self._counts["hits"] += 1
        self._counts["bytes_read"] += length if need is None or not checked else need[1] - need[0]
        return payload

    def _store_many(self, blocks: list[tuple[str, bytes]]) -> None:
        for key, data in blocks:
            if self._store(self._path(key), data):
                self._counts["bytes_written"] += len(data)
                self._written_since_look += len(data) + _HEADER.size
        if self._written_since_look > self.limit // 16:
            self._written_since_look = 0
            self.evict()

    def _store(self, path: Path, data: bytes, header: bytes | None = None) -> bool:
        if header is None:
            header = _HEADER.pack(_MAGIC, len(data), zlib.crc32(data))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_SUFFIX}")
        try:
            path.parent.mkdir(mode=_FOLDER_MODE, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
            try:
                with os.fdopen(fd, "wb") as f:
                    self._write(f, header + data)
                    f.flush()
                    st = os.fstat(f.fileno())
                os.replace(tmp, path)
                # Written by this process from the bytes it holds: checked as it was written.
                _verified.add((str(path), st.st_ino, st.st_size, st.st_mtime_ns))
            except BaseException:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise
        except OSError as exc:
            self._counts["write_failures"] += 1
            if not self._warned_write:
                self._warned_write = True
                why = "the disk is full" if exc.errno == errno.ENOSPC else str(exc)
                logger.warning(
                    "aiostream-hf: cannot write to the byte cache %s (%s): reading on "
                    "without keeping the bytes",
                    self.folder,
                    why,
                )
            return False
        return True

    @staticmethod
    def _write(f: Any, data: bytes) -> None:
        """Write a block's header and payload to its temporary file (a seam for tests:
        a full disk, a writer killed half-way)."""
        f.write(data)

    def evict(self) -> None:
        """Keep the blocks and entries under the limit: the least recently used go first,
        down to seven eighths of it. One process at a time; a pass another runs is enough."""
        lock = filelock.FileLock(self.folder / "evict.lock", thread_local=False)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            return
        try:
            blocks: list[tuple[float, int, Path]] = []
            total = 0
            now = time.time()
            subs = []
            for kind in _KINDS:
                with contextlib.suppress(FileNotFoundError):
                    subs += list((self.folder / kind).iterdir())
            for sub in subs:
                # Closed as it is left; a file gone between the listing and its stat (a
                # writer's temporary file renamed, another eviction) is skipped, not the
                # rest of its folder (and the iterator was left open for the collector).
                with contextlib.suppress(OSError), os.scandir(sub) as entries:
                    for entry in entries:
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        if entry.name.endswith(_TMP_SUFFIX):
                            if now - st.st_mtime > _STALE_TMP_S:
                                with contextlib.suppress(OSError):
                                    os.unlink(entry.path)
                            continue
                        blocks.append((st.st_mtime, st.st_size, Path(entry.path)))
                        total += st.st_size
            if total <= self.limit:
                return
            blocks.sort()
            goal = self.limit * 7 // 8
            for _, size, path in blocks:
                if total <= goal:
                    break
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    total -= size
                    self._counts["evicted"] += 1
                    self._counts["evicted_bytes"] += size - _HEADER.size
        finally:
            lock.release()


def _blocks_of(block: int, start: int, end: int) -> range:
    return range(start // block, (end - 1) // block + 1)


def _cut(block: int, blocks: dict[int, Any], s: int, e: int) -> list[memoryview]:
    """Views of the blocks (of ``block`` bytes) covering ``[s, e)``, each cut to it."""
    pieces = []
    for i in _blocks_of(block, s, e):
        at = i * block
        pieces.append(memoryview(blocks[i])[max(s, at) - at : min(e, at + block) - at])
    return pieces


def _needs(block: int, spans: list[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """The blocks ``spans`` touch, each with the part of it they need (from the first
    byte of the first to the last of the last, relative to the block)."""
    needs: dict[int, tuple[int, int]] = {}
    for s, e in spans:
        for i in _blocks_of(block, s, e):
            at = i * block
            lo, hi = max(s, at) - at, min(e, at + block) - at
            had = needs.get(i)
            needs[i] = (lo, hi) if had is None else (min(had[0], lo), max(had[1], hi))
    return dict(sorted(needs.items()))
