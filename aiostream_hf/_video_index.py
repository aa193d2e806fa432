"""Opening a video: finding and reading its MP4 index through the byte source.

Opening reads the MP4 index (``moov``) in one round trip when it lies at either
end of a file of known size: the head and the tail are read at once. Without a
known size, the tail is read first, alone (a suffix read, which tells the size); a
``moov`` that ends the file is found in it without the head (``moov_in_tail``), and
the head is read only when the tail holds no such box. When ``moov`` is in neither, the box
sizes lead straight to it (``_mp4``). A file no larger than those first reads is
read whole and kept: no byte is fetched twice, and its frames need no more requests.

``_load`` gives the file's ``_Indexed`` (``_video_decode``) or, without a usable index,
its ``_Demuxed`` (``_video_demux``).
"""

from __future__ import annotations

import bisect
import functools
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread

from ._exceptions import DecodeError
from ._models import FileRef
from ._mp4 import (
    BOX_HEADER_MAX,
    HEAD_READ_SIZE,
    MAX_TOP_LEVEL_BOXES,
    TAIL_READ_SIZE,
    NoIndex,
    SampleTable,
    container_kind,
    moov_in_tail,
    parse_moov,
    read_box_header,
)
from ._stalls import bytes_wait, run_decode
from ._video_decode import _VIDEO_COALESCE_GAP, _check_length, _Indexed
from ._video_demux import _Demuxed
from ._video_index_cache import IndexCache
from .formats import ByteSource

_HOP_REACH = 16 * 1024 * 1024  # a read towards moov goes on to the tail read when this near
# Index reads through a RangeFetcher come in concurrent parts of at most this many bytes,
# each over its own connection: the index is on the critical path of every open, and a
# server (or the network) that caps each connection's speed serves the parts side by side.
_INDEX_PART = 256 * 1024


class _Reads:
    """Index reads through a ByteSource, keeping what was read for the next hops.

    The buffers never overlap (only holes are read) and are kept sorted by offset, with
    their offsets in ``starts``: finding the buffer that holds a position is a bisection,
    so a hop costs O(log n) in the number of buffers, not a scan of them all.
    """

    def __init__(self, file: FileRef, source: ByteSource, size: int, stats: dict[str, Any]) -> None:
        self.file = file
        self.source = source
        self.size = size
        self.stats = stats
        self.buffers: list[tuple[int, bytes]] = []  # sorted by offset, disjoint
        self.starts: list[int] = []  # the buffers' offsets, for bisection

    def add(self, start: int, data: bytes) -> None:
        at = bisect.bisect_left(self.starts, start)
        self.starts.insert(at, start)
        self.buffers.insert(at, (start, data))

    async def get(self, start: int, end: int, *, hop: bool = False) -> bytes:
        """Bytes ``[start, end)``, reading (in one round trip) what is not held yet.

        ``hop``: the bytes are a box header on the way to ``moov``; a missing piece is then
        read up to the next bytes held when they are near (a ``moov`` that begins before
        the tail read reaches into it), else ``HEAD_READ_SIZE`` bytes (the next hop may
        need them).
        """
        end = min(end, self.size)
        at = bisect.bisect_right(self.starts, start) - 1
        if at >= 0:  # one buffer holds them all (each hop within a read): no scan
            offset, data = self.buffers[at]
            if end <= offset + len(data):
                return data[start - offset : end - offset]
        wanted: list[tuple[int, int]] = []
        for lo, hi in self.holes(start, end):
            if hop:
                after = bisect.bisect_left(self.starts, hi)
                following = self.starts[after] if after < len(self.starts) else self.size
                if after < len(self.starts) and following - lo <= _HOP_REACH:
                    hi = following
                else:
                    hi = min(following, max(hi, lo + HEAD_READ_SIZE))
            wanted.append((lo, hi))
        if wanted:
            buffers = await _read_index(self.source, self.file, wanted)
            for (lo, hi), data in zip(wanted, buffers, strict=True):
                _count_index_read(self.stats, data)
                _check_length(self.file, lo, hi, len(data))
                self.add(lo, data)
        return self._join(start, end)

    def whole(self) -> bytes | None:
        """The whole file when the reads so far hold all of it (a small file: the first
        reads covered it), else None."""
        return None if self.holes(0, self.size) else self._join(0, self.size)

    def _first(self, pos: int) -> int:
        """The index of the first buffer that ends after ``pos``."""
        at = bisect.bisect_right(self.starts, pos) - 1
        if at < 0:
            return 0
        offset, data = self.buffers[at]
        return at if offset + len(data) > pos else at + 1

    def _join(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` from the buffers (they hold them all)."""
        pieces: list[bytes] = []
        pos = start
        for at in range(self._first(start), len(self.buffers)):
            if pos >= end:
                break
            offset, data = self.buffers[at]
            if offset <= pos < offset + len(data):
                pieces.append(data[pos - offset : end - offset])
                pos = min(end, offset + len(data))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def holes(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``[start, end)`` that no buffer holds."""
        holes: list[tuple[int, int]] = []
        pos = start
        for at in range(self._first(start), len(self.buffers)):
            if pos >= end:
                break
            offset, data = self.buffers[at]
            if offset > pos:
                holes.append((pos, min(offset, end)))
            pos = max(pos, offset + len(data))
        if pos < end:
            holes.append((pos, end))
        return holes


async def _read_index(
    source: ByteSource, file: FileRef, ranges: list[tuple[int, int]]
) -> list[bytes]:
    """Index bytes: a RangeFetcher's come in concurrent parts of ``_INDEX_PART`` bytes,
    past its byte cache when the parsed index is kept instead (``_video_index_cache``),
    unless they are the whole file (its frames are then read from its blocks)."""
    from ._fetcher import RangeFetcher

    if isinstance(source, RangeFetcher):
        whole = ranges == [(0, file.size)]
        return await source.read_ranges(file, ranges, part_size=_INDEX_PART, keep=whole)
    return await source.read_ranges(file, ranges)


async def _read_index_tail(source: ByteSource, file: FileRef, n: int) -> tuple[bytes, int]:
    """The tail read of ``open``: a RangeFetcher's comes in concurrent parts of
    ``_INDEX_PART`` bytes, once a redirect told the size (``RangeFetcher.read_tail``)."""
    from ._fetcher import RangeFetcher

    if isinstance(source, RangeFetcher):
        return await source.read_tail(file, n, part_size=_INDEX_PART)
    return await source.read_tail(file, n)


def _count_index_read(stats: dict[str, Any], data: bytes) -> None:
    stats["index_requests"] = stats.get("index_requests", 0) + 1
    stats["index_bytes"] = stats.get("index_bytes", 0) + len(data)


def _tail_size(size: int | None) -> int:
    """Bytes read from the end of a file at open: ``moov`` is there in most files, and its
    size grows with the file's duration, as the file's size does."""
    if size is None:
        return TAIL_READ_SIZE
    return min(TAIL_READ_SIZE, max(HEAD_READ_SIZE, size // 16))


async def _read_ends(file: FileRef, source: ByteSource, stats: dict[str, Any]) -> _Reads:
    """The head and the tail of the file: one round trip when its size is known (the
    whole file when it is no longer than ``TAIL_READ_SIZE``).

    Without the size, the tail is read first, alone: a suffix read, whose answer tells
    the size. A file no longer than that read is then held whole, fetched once; only a
    longer one needs its head, in a second round trip. (Sending both at once saves that
    round trip but fetches a small file twice.)
    """
    size = file.size
    if size is not None:
        if size == 0:
            raise DecodeError(f"{file.path} is not a video file: it is empty")
        head_end = min(size, HEAD_READ_SIZE)
        tail_start = max(0, size - _tail_size(size))
        # A file no longer than the tail read an unknown size gets is read whole, as
        # that read would: its frames then need no request.
        if size <= TAIL_READ_SIZE or tail_start - head_end < _VIDEO_COALESCE_GAP:
            ranges = [(0, size)]
        else:
            ranges = [(0, head_end), (tail_start, size)]
        buffers = await _read_index(source, file, ranges)
        reads = _Reads(file, source, size, stats)
        for (start, end), data in zip(ranges, buffers, strict=True):
            _count_index_read(stats, data)
            _check_length(file, start, end, len(data))
            reads.add(start, data)
        return reads

    data, size = await _read_index_tail(source, file, TAIL_READ_SIZE)
    _count_index_read(stats, data)
    if size == 0:
        raise DecodeError(f"{file.path} is not a video file: it is empty")
    reads = _Reads(file, source, size, stats)
    reads.add(size - len(data), data)
    return reads


async def _load(
    file: FileRef,
    source: ByteSource,
    stats: dict[str, Any],
    max_whole: int,
    cache: IndexCache | None = None,
) -> _Indexed | _Demuxed:
    """The file's index, or, without one, the whole file when it is at most ``max_whole``
    bytes (``StreamOptions.max_whole_video_bytes``), else a way to read it by range in
    bounded blocks, at most ``max_whole`` bytes per pass (``_video_demux``).

    ``cache``: where this machine keeps the file's parsed index (``IndexCache.of``): read
    from there when it is, kept there after a parse when it is not."""
    name = file.path
    if cache is not None:
        table = await cache.load()
        if table is not None:  # parsed by a process of this machine before: no request
            stats["index_cached"] = True
            return await run_decode(_Indexed, table, None)
    reads = await _read_ends(file, source, stats)
    table = await _moov_at_end(reads, name)
    if table is not None:  # the tail read held the index: the head is not needed
        return await run_decode(_Indexed, table, None)
    head = await reads.get(0, HEAD_READ_SIZE)
    kind = container_kind(head[:256])
    if kind is None:
        raise DecodeError(
            f"{name} is not a video file (MP4, Matroska/WebM, AVI, MPEG-TS, ...): "
            f"it starts with {head[:16]!r}"
        )
    found: SampleTable | NoIndex
    if kind == "mp4":
        found = await _find_moov(reads, name)
    else:
        found = NoIndex(f"a {kind} file (only MP4 has an index read by range)")
    if isinstance(found, SampleTable):
        # A file the first reads hold whole is kept: its frames need no request.
        whole = reads.whole()
        if cache is not None and whole is None:  # (one held whole: in the byte cache)
            await cache.store(found)
        return await run_decode(_Indexed, found, whole)
    if reads.size <= max_whole:  # held whole: its frames need no more requests
        data = await reads.get(0, reads.size)
        return await run_decode(_Demuxed, data, found, name)
    # Over the option: FFmpeg reads it by range, in bounded blocks, from its thread.

    async def read_block(start: int, end: int) -> bytes:
        (block,) = await source.read_ranges(file, [(start, end)])
        stats["frame_requests"] = stats.get("frame_requests", 0) + 1
        stats["frame_bytes"] = stats.get("frame_bytes", 0) + len(block)
        return block

    def fetch(start: int, end: int) -> bytes:  # in a worker thread
        with bytes_wait():
            return anyio.from_thread.run(read_block, start, end)

    return await run_decode(
        functools.partial(
            _Demuxed, None, found, name, fetch=fetch, size=reads.size, limit=max_whole
        )
    )


async def _moov_at_end(reads: _Reads, name: str) -> SampleTable | None:
    """The index of a moov-at-end file from the tail read alone (``moov_in_tail``), when
    the head is not held (the size was unknown): no round trip for the head. None when
    the tail holds no such ``moov``, or it does not parse to a sample table: the box walk
    from the head then decides (and names what is wrong)."""
    if not reads.buffers or not reads.holes(0, min(HEAD_READ_SIZE, reads.size)):
        return None  # the head is in (or nothing is): the walk costs no request
    start, tail = reads.buffers[-1]
    if start + len(tail) != reads.size:
        return None
    box = moov_in_tail(tail, start, reads.size)
    if box is None:
        return None
    moov = memoryview(tail)[box.start - start : box.end - start]
    try:
        found = await run_decode(parse_moov, moov, name, reads.size)
    except DecodeError:
        return None
    return found if isinstance(found, SampleTable) else None


async def _find_moov(reads: _Reads, name: str) -> SampleTable | NoIndex:
    """Walk the top-level boxes from the start of the file to ``moov`` (at most
    ``MAX_TOP_LEVEL_BOXES`` of them) and parse it."""
    pos = 0
    walked = 0
    while pos < reads.size:
        if walked == MAX_TOP_LEVEL_BOXES:
            raise DecodeError(
                f"{name}: corrupt or unusual MP4: no moov box among its first "
                f"{MAX_TOP_LEVEL_BOXES} top-level boxes (MAX_TOP_LEVEL_BOXES; the last one "
                f"walked ends at byte {pos} of {reads.size}): re-mux it with moov near the "
                "start (ffmpeg -i in.mp4 -c copy -movflags faststart out.mp4)"
            )
        walked += 1
        header = await reads.get(pos, pos + BOX_HEADER_MAX, hop=True)
        box = read_box_header(header, pos, reads.size, name)
        if box.type == "moov":
            moov = await reads.get(box.start, box.end)
            return await run_decode(parse_moov, moov, name, reads.size)
        if box.type == "moof":
            return NoIndex("fragmented MP4 (moof before moov)")
        pos = box.end
    raise DecodeError(f"{name}: an MP4 file without a moov box (truncated, or still being written)")
