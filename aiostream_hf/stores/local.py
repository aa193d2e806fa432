"""The local store: files on this machine's disk (``LocalSource``, ``file://`` URLs).

- Listing (``LocalStore.resolve``): each path's size by ``stat``, its URL ``file://``;
  globs were expanded when the source was parsed (``_sources``).
- Reads, for the ``RangeFetcher`` (``_fetcher``): ``os.pread`` in worker threads (a
  decoder's spans into buffers of Arrow's memory pool, as the fetcher's HTTP reads). Each
  read also returns the file's ``_LocalVersion`` (device, inode, size, mtime), which the
  fetcher pins at its first read: a file replaced or rewritten in place since is
  ``FileChangedError``.
- Errors: a missing or unreadable file is a ``FetchError`` naming the path.
"""

from __future__ import annotations

import os
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import pyarrow as pa

from .._exceptions import FetchError, FileChangedError
from .._models import FileRef
from .._sources import LocalSource

if TYPE_CHECKING:
    from .._fetcher import RangeFetcher


class LocalStore:
    """Files on this machine's disk."""

    name = "local"

    async def resolve(self, sources: Sequence[Any], lister: Any) -> tuple[FileRef, ...]:
        """Each path as a ``file://`` file, with its size (``stat``, in a worker thread)."""
        paths = [src.path for src in sources if isinstance(src, LocalSource)]
        sizes = await anyio.to_thread.run_sync(lambda: [p.stat().st_size for p in paths])
        return tuple(
            FileRef(p.as_uri(), str(p), size, None, "train")
            for p, size in zip(paths, sizes, strict=True)
        )


STORE = LocalStore()


class _LocalTransfer:
    """Blocks of a local file, each read with os.pread in a worker thread."""

    def __init__(
        self,
        fetcher: RangeFetcher,
        file: FileRef,
        path: str,
        start: int,
        end: int | None,
        block: int,
    ) -> None:
        self.fetcher = fetcher
        self.file = file
        self.path = path
        self.pos = start
        self.end = end
        self.block = block

    async def next_chunk(self) -> bytes | None:
        f = self.fetcher
        f._check_open()
        if self.end is not None and self.pos >= self.end:
            return None
        f._requests["local"] += 1
        stop = None if self.end is None else min(self.end, self.pos + self.block)
        data, size, seen = await anyio.to_thread.run_sync(
            _pread_block, self.file, self.path, self.pos, stop, self.block, limiter=f._limiter
        )
        f._check_local_version(self.file, seen)
        if self.end is None:
            self.end = size
        if not data:
            return None
        f._bytes_received += len(data)
        self.pos += len(data)
        return data

    async def aclose(self) -> None:
        self.end = self.pos


# -- local files (run in worker threads) ----------------------------------------------------


def _local_path(url: str) -> str | None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "file":
        return None
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"{url}: file:// URLs on another host are not supported")
    return urllib.request.url2pathname(parts.path)


def _open_local(file: FileRef, path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise FetchError(
            f"{file.path}: not found: no file at {path} ({file.url})", url=file.url
        ) from exc
    except OSError as exc:
        raise FetchError(f"{file.path}: cannot open {path}: {exc.strerror}", url=file.url) from exc
    return fd


_LocalVersion = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


def _local_size(file: FileRef, fd: int) -> tuple[int, _LocalVersion]:
    st = os.fstat(fd)
    size = st.st_size
    if file.size is not None and size != file.size:
        raise FileChangedError(
            f"{file.path}: the file changed: it has {size} bytes, "
            f"expected {file.size} ({file.url})",
            url=file.url,
        )
    return size, (st.st_dev, st.st_ino, size, st.st_mtime_ns)


def _describe_local(pinned: _LocalVersion, seen: _LocalVersion) -> str:
    if pinned[:2] != seen[:2]:
        return "another file is at its path now"
    if pinned[2] != seen[2]:
        return f"its size went from {pinned[2]} to {seen[2]} bytes"
    return "its modification time changed"


def _pread_exact(file: FileRef, fd: int, start: int, end: int) -> bytes:
    parts: list[bytes] = []
    pos = start
    while pos < end:
        chunk = os.pread(fd, end - pos, pos)
        if not chunk:
            raise FileChangedError(
                f"{file.path}: the file ended at byte {pos}, before {end} ({file.url})",
                url=file.url,
            )
        parts.append(chunk)
        pos += len(chunk)
    return b"".join(parts)


def _pread_into(file: FileRef, fd: int, start: int, end: int) -> pa.Buffer:
    """Bytes ``start`` to ``end`` (checked against the file's size) read into a buffer of
    Arrow's memory pool: reused from span to span, where a fresh ``bytes`` of a few MiB
    is fresh pages to fault in, span after span."""
    buf = pa.allocate_buffer(end - start)
    view = memoryview(buf)
    pos = start
    while pos < end:
        n = os.preadv(fd, [view[pos - start :]], pos)
        if not n:
            raise FileChangedError(
                f"{file.path}: the file ended at byte {pos}, before {end} ({file.url})",
                url=file.url,
            )
        pos += n
    return buf


def _pread_ranges(
    file: FileRef, path: str, spans: list[tuple[int, int]], in_place: bool = False
) -> tuple[list[bytes] | list[pa.Buffer], _LocalVersion]:
    """Each span's bytes (in Arrow buffers when ``in_place``: for decoders that take
    any buffer), and the file's version."""
    fd = _open_local(file, path)
    try:
        size, version = _local_size(file, fd)
        for s, e in spans:
            if e > size:
                raise FetchError(
                    f"{file.path}: bytes {s}-{e - 1} asked, the file has {size} ({file.url})",
                    url=file.url,
                )
        if in_place:
            return [_pread_into(file, fd, s, e) for s, e in spans], version
        return [_pread_exact(file, fd, s, e) for s, e in spans], version
    finally:
        os.close(fd)


def _pread_tail(file: FileRef, path: str, n: int) -> tuple[bytes, int, _LocalVersion]:
    fd = _open_local(file, path)
    try:
        size, version = _local_size(file, fd)
        return _pread_exact(file, fd, max(0, size - n), size), size, version
    finally:
        os.close(fd)


def _pread_block(
    file: FileRef, path: str, start: int, stop: int | None, block: int
) -> tuple[bytes, int, _LocalVersion]:
    fd = _open_local(file, path)
    try:
        size, version = _local_size(file, fd)
        end = min(size, start + block) if stop is None else stop
        if end > size:
            raise FileChangedError(
                f"{file.path}: the file has {size} bytes, fewer than the {end} wanted ({file.url})",
                url=file.url,
            )
        return _pread_exact(file, fd, start, end), size, version
    finally:
        os.close(fd)
