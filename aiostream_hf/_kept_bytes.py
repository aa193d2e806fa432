"""KeptBytes: a stream's fetched bytes kept in memory, by file, up to a byte limit, so
that a later read of them is not fetched again.

    kept = KeptBytes(fetcher, limit=64 << 20)
    await kept.read_ranges(file, [(0, 100)])         # fetched, and kept
    await kept.read_ranges(file, [(10, 50)])         # cut from what is kept: no request
    async with kept.iter_bytes(file, 0, 200) as blocks:  # the kept bytes, then 100-200
        ...

What it is for: a LeRobot stream's video readers. A batch of items reads the GOPs of
its frames; reads of nearby GOPs are joined into one request (``coalesce_gap``: bytes
cost less than a round trip), so a read brings bytes that no item of the batch uses.
Shuffled, the next batches want exactly those: items are drawn from a buffer that
spans a few episodes, whose frames lie in the same stretch of each camera's file.
Without the kept bytes a shuffled epoch of 4 episodes fetched 12.8x its files' size;
with 64 MiB kept, each byte once. They must hold more than the buffer's episodes: a
buffer's random draws leave items of episodes long past, and 8 MiB of a 14.6 MB video
still fetched 3.45x (``benchmarks/lerobot_shuffled_bytes.py``).

Only the parts of a read not kept are fetched: a read of bytes 0-200 with 50-100 kept
fetches 0-50 and 100-200 (one ``read_ranges`` call, or one streamed read each). Bytes
come as the source gave them (a pinned version of each file: the keys are the file's
URL, size and ETag); a part larger than the limit is read but not kept.

Bounds: at most ``limit`` bytes are kept, the least recently used parts dropped first;
a streamed part is kept once whole, so it is held at most twice while it is copied
into its own buffer. Parts never overlap: one fetched twice at once (two calls on the
same bytes) is kept once.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any

from ._models import FileRef
from .formats import ByteSource

__all__ = ["KeptBytes"]

_Key = tuple[str, int | None, str | None]  # the file's URL, size and ETag


def _key(file: FileRef) -> _Key:
    return (file.url, file.size, file.etag)


class _Part:
    __slots__ = ("data", "end", "start")

    def __init__(self, start: int, data: bytes | bytearray | memoryview) -> None:
        self.start = start
        self.end = start + len(data)
        self.data = memoryview(data).toreadonly()


#: a piece of a read: kept bytes (a view), or a stretch to fetch (start, end)
_Piece = memoryview | tuple[int, int]


class KeptBytes:
    """A ``ByteSource`` over ``source`` that keeps what it fetched, up to ``limit`` bytes
    (the least recently used dropped first), and cuts later reads from it."""

    def __init__(self, source: ByteSource, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"KeptBytes(limit={limit!r}): give a number of bytes >= 0")
        self._source = source
        self._limit = limit
        self._parts: dict[_Key, list[_Part]] = {}  # by file, sorted by start
        self._used: OrderedDict[tuple[_Key, int], _Part] = OrderedDict()  # oldest first
        self._held = 0
        self.reused = 0  # bytes served from what was kept
        self.fetched = 0  # bytes fetched through here
        self.dropped = 0  # bytes dropped to stay within the limit

    @property
    def options(self) -> Any:
        """The source's options (a RangeFetcher's): readers read its ``coalesce_gap``."""
        return getattr(self._source, "options", None)

    def held_bytes(self) -> int:
        return self._held

    def counts(self) -> dict[str, int]:
        return {"bytes_reused": self.reused, "bytes_kept": self._held}

    # -- what is kept --------------------------------------------------------------------

    def _pieces(self, file: FileRef, start: int, end: int) -> list[_Piece]:
        """``[start, end)`` as kept views and stretches to fetch, in order."""
        key = _key(file)
        parts = self._parts.get(key, [])
        i = max(0, bisect.bisect_right([p.start for p in parts], start) - 1)
        pieces: list[_Piece] = []
        at = start
        for part in parts[i:]:
            if part.start >= end:
                break
            if part.end <= at:
                continue
            if part.start > at:
                pieces.append((at, part.start))
                at = part.start
            stop = min(end, part.end)
            pieces.append(part.data[at - part.start : stop - part.start])
            self._used.move_to_end((key, part.start))
            self.reused += stop - at
            at = stop
        if at < end:
            pieces.append((at, end))
        return pieces

    def _keep(self, file: FileRef, start: int, data: bytes | bytearray | memoryview) -> None:
        if not data or len(data) > self._limit:
            return
        key = _key(file)
        part = _Part(start, data)
        parts = self._parts.setdefault(key, [])
        i = bisect.bisect_right([p.start for p in parts], start)
        before = parts[i - 1] if i > 0 else None
        after = parts[i] if i < len(parts) else None
        if (before is not None and before.end > start) or (
            after is not None and after.start < part.end
        ):
            return  # fetched twice at once: the first kept is enough
        parts.insert(i, part)
        self._used[(key, start)] = part
        self._held += part.end - part.start
        while self._held > self._limit:
            (old_key, old_start), old = self._used.popitem(last=False)
            siblings = self._parts[old_key]
            siblings.remove(old)
            if not siblings:
                del self._parts[old_key]
            self._held -= old.end - old.start
            self.dropped += old.end - old.start

    # -- ByteSource ----------------------------------------------------------------------

    async def read_tail(self, file: FileRef, n: int) -> tuple[bytes, int]:
        return await self._source.read_tail(file, n)

    async def read_pieces(
        self, file: FileRef, ranges: Sequence[tuple[int, int]]
    ) -> list[list[tuple[int, memoryview]]]:
        """Each range as pieces in order: kept views, and the rest fetched (one call)."""
        cut = [self._pieces(file, s, e) for s, e in ranges]
        wanted = [p for pieces in cut for p in pieces if isinstance(p, tuple)]
        got = await self._source.read_buffers(file, wanted) if wanted else []
        fetched = iter(got)
        out: list[list[tuple[int, memoryview]]] = []
        for (start, _), pieces in zip(ranges, cut, strict=True):
            at, these = start, []
            for piece in pieces:
                view = piece if isinstance(piece, memoryview) else next(fetched)
                if isinstance(piece, tuple):
                    self.fetched += len(view)
                    self._keep(file, piece[0], view)
                these.append((at, view))
                at += len(view)
            out.append(these)
        return out

    async def read_buffers(
        self, file: FileRef, ranges: Sequence[tuple[int, int]]
    ) -> list[memoryview]:
        return [
            pieces[0][1] if len(pieces) == 1 else memoryview(b"".join(v for _, v in pieces))
            for pieces in await self.read_pieces(file, ranges)
        ]

    async def read_ranges(self, file: FileRef, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [bytes(view) for view in await self.read_buffers(file, ranges)]

    def iter_bytes(
        self,
        file: FileRef,
        start: int = 0,
        end: int | None = None,
        *,
        block_size: int | None = None,
    ) -> _KeptBlocks:
        """``[start, end)`` in order: kept views, and the rest streamed from the source
        (its ``iter_bytes``, else ``read_buffers``) and kept once whole."""
        if end is None:
            if file.size is None:
                raise ValueError(f"iter_bytes of {file.url}: give end, the size is unknown")
            end = file.size
        return _KeptBlocks(self, file, start, end, block_size)

    async def _blocks(
        self, file: FileRef, start: int, end: int, block_size: int | None
    ) -> AsyncIterator[memoryview | bytes]:
        streams = getattr(self._source, "iter_bytes", None)
        for piece in self._pieces(file, start, end):
            if isinstance(piece, memoryview):
                yield piece
                continue
            lo, hi = piece
            if not callable(streams):
                (view,) = await self._source.read_buffers(file, [piece])
                self.fetched += len(view)
                self._keep(file, lo, view)
                yield view
                continue
            whole = bytearray() if hi - lo <= self._limit else None
            async with streams(file, lo, hi, block_size=block_size) as blocks:
                async for block in blocks:
                    self.fetched += len(block)
                    if whole is not None:
                        whole += block
                    yield block
            if whole is not None and len(whole) == hi - lo:
                self._keep(file, lo, whole)


class _KeptBlocks:
    """``KeptBytes.iter_bytes``: a ``ByteBlocks``; close it (``async with``) to end the
    source's read if you stop early."""

    def __init__(
        self, kept: KeptBytes, file: FileRef, start: int, end: int, block_size: int | None
    ) -> None:
        self._blocks = kept._blocks(file, start, end, block_size)

    def __aiter__(self) -> AsyncIterator[memoryview | bytes]:
        return self._blocks

    async def aclose(self) -> None:
        await self._blocks.aclose()  # type: ignore[attr-defined]

    async def __aenter__(self) -> _KeptBlocks:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
