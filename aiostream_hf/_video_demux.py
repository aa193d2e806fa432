"""The fallback: files without a usable index, demuxed by FFmpeg.

Files without a usable index (fragmented MP4, Matroska/WebM, other containers,
MP4 codecs not mapped here) are demuxed and decoded with ``av.open``: correct, not
minimal. One of at most ``StreamOptions.max_whole_video_bytes`` is read whole at open
and its frames come from memory; a larger one is read by range (``_RangeFile``): FFmpeg
asks for the bytes it wants, in blocks of ``BLOCK`` fetched through the event loop, of
which at most ``KEPT_BLOCKS`` are held, so memory stays bounded whatever the size. What
FFmpeg seeks over (an MP4 ``free`` box) is never fetched; a pass (the scan at open, a
call's decode) that would fetch more than the option is a DecodeError naming it.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import av
import numpy as np
import numpy.typing as npt

from ._exceptions import DecodeError
from ._mp4 import NoIndex
from ._video_decode import Array

#: A file read by range comes in blocks of this many bytes (one request each) ...
BLOCK = 1024 * 1024
#: ... and at most this many are held (least recently read dropped first).
KEPT_BLOCKS = 8


class _RangeFile(io.RawIOBase):
    """A file of ``size`` bytes, read (from a worker thread) by ``fetch(start, end)``
    block by block: at most ``KEPT_BLOCKS`` blocks of ``BLOCK`` bytes held, and at most
    ``limit`` bytes fetched in all (FFmpeg scans a Matroska file's trailing junk byte
    by byte for a cluster: a padded file must not be read to its end)."""

    def __init__(
        self, fetch: Callable[[int, int], bytes], size: int, name: str, limit: int
    ) -> None:
        super().__init__()
        self._fetch = fetch
        self._size = size
        self._name = name
        self._limit = limit
        self.fetched = 0
        self._pos = 0
        self._blocks: OrderedDict[int, bytes] = OrderedDict()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(f"{self._name}: a seek to {base + offset} is before the start")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._pos >= self._size or not len(view):
            return 0
        k, offset = divmod(self._pos, BLOCK)
        block = self._block(k)
        n = min(len(view), len(block) - offset)
        view[:n] = block[offset : offset + n]
        self._pos += n
        return n

    def _block(self, k: int) -> bytes:
        block = self._blocks.get(k)
        if block is not None:
            self._blocks.move_to_end(k)
            return block
        start = k * BLOCK
        end = min(self._size, start + BLOCK)
        if self.fetched + end - start > self._limit:
            raise DecodeError(
                f"{self._name}: it has no index read by range, and FFmpeg has read "
                f"{self.fetched:,} bytes of its {self._size:,} without being done, over "
                f"StreamOptions.max_whole_video_bytes={self._limit:,}: raise that option, "
                "or re-mux it as an MP4 with its index "
                "(ffmpeg -i IN -c copy -movflags faststart OUT.mp4)"
            )
        self.fetched += end - start
        block = self._fetch(start, end)
        if len(block) != end - start:
            raise DecodeError(
                f"{self._name}: bytes {start}-{end - 1} came back as {len(block)} bytes"
            )
        self._blocks[k] = block
        while len(self._blocks) > KEPT_BLOCKS:
            self._blocks.popitem(last=False)
        return block


class _Demuxed:
    """A file without a usable index, decoded with ``av.open``: from ``data`` when it
    was read whole, else read by range through ``fetch(start, end)`` (a worker
    thread's way to the event loop) in bounded blocks, every time it is opened."""

    def __init__(
        self,
        data: bytes | None,
        why: NoIndex,
        name: str,
        *,
        fetch: Callable[[int, int], bytes] | None = None,
        size: int = 0,
        limit: int = 0,
    ) -> None:
        if data is None and fetch is None:
            raise ValueError("_Demuxed needs the file's bytes or a way to fetch them")
        self.data = data
        self.fetch = fetch
        self.size = len(data) if data is not None else size
        self.limit = limit  # the bytes one pass by range may fetch
        self.reason = why.reason
        self.name = name
        try:
            with av.open(self.reader(), "r") as container:
                if not container.streams.video:
                    raise DecodeError(f"{name} has no video stream")
                stream = container.streams.video[0]
                self.stream_index = stream.index
                context = stream.codec_context
                self.codec = context.name if context is not None else "none"
                if context is None or not _has_decoder(context):
                    codec = why.codec or (context.codec_tag if context is not None else None)
                    raise DecodeError(
                        f"{name}: cannot decode its video codec {codec or self.codec!r}: "
                        "this PyAV build has no decoder for it"
                    )
                self.width = int(context.width)
                self.height = int(context.height)
                time_base = stream.time_base
                if time_base is None:
                    raise DecodeError(f"{name}: its video stream has no time base")
                self.time_base = time_base
                pts: list[int] = []
                ends: list[int] = []
                keys: list[int] = []
                for packet in container.demux(stream):
                    if packet.size == 0 or packet.pts is None or packet.is_discard:
                        continue
                    pts.append(packet.pts)
                    ends.append(packet.pts + (packet.duration or 0))
                    if packet.is_keyframe:
                        keys.append(packet.pts)
        except av.FFmpegError as exc:
            raise DecodeError(f"{name} is not a video PyAV can read: {exc}") from exc
        if not pts:
            raise DecodeError(f"{name}: its video stream has no frames")
        self.shown_ticks = np.array(sorted(pts), dtype=np.int64)
        # exactly float(pts * time_base), as PyAV's frame.time computes it
        self.shown_s: npt.NDArray[np.float64] = np.true_divide(
            self.shown_ticks * time_base.numerator, time_base.denominator
        )
        self.keys = np.array(sorted(keys), dtype=np.int64)
        self.keyframe_count = len(keys)
        last = int(np.argmax(pts))
        end = max(ends[last], pts[last])
        if end == pts[last] and len(pts) > 1:  # no packet duration: one frame interval
            end += int(self.shown_ticks[-1] - self.shown_ticks[-2])
        self.duration = float(end * time_base)
        span = (end - int(self.shown_ticks[0])) * float(time_base)
        self.fps = len(pts) / span if span > 0 else 0.0

    def reader(self) -> io.RawIOBase | io.BytesIO:
        """The file for ``av.open``: in memory, or read by range."""
        if self.data is not None:
            return io.BytesIO(self.data)
        assert self.fetch is not None
        return _RangeFile(self.fetch, self.size, self.name, self.limit)


def _has_decoder(context: Any) -> bool:
    try:
        av.Codec(context.name, "r")
    except (av.FFmpegError, ValueError):
        return False
    return True


def _decode_demuxed(index: _Demuxed, positions: list[int], name: str) -> dict[int, Array]:
    """Decode the frames at ``positions`` (presentation order): from the file in memory,
    or from ranges of it (a worker thread's call)."""
    wanted = {int(index.shown_ticks[p]): p for p in positions}
    first = min(wanted)
    keys_before = index.keys[index.keys <= first]
    seek_to = int(keys_before[-1]) if len(keys_before) else None
    images = _demux_decode(index, wanted, seek_to, name)
    if len(images) < len(wanted) and seek_to is not None:  # the seek landed late: from the start
        images = _demux_decode(index, wanted, None, name)
    missing = [t for t, p in wanted.items() if p not in images]
    if missing:
        raise DecodeError(
            f"{name}: decoding gave no frame at pts "
            + ", ".join(f"{float(t * index.time_base):.6f}s" for t in missing)
        )
    return images


def _demux_decode(
    index: _Demuxed, wanted: dict[int, int], seek_to: int | None, name: str
) -> dict[int, Array]:
    images: dict[int, Array] = {}
    last = max(wanted)
    try:
        with av.open(index.reader(), "r") as container:
            stream = container.streams[index.stream_index]
            if seek_to is not None and seek_to > int(index.shown_ticks[0]):
                container.seek(seek_to, stream=stream, backward=True)
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                position = wanted.get(int(frame.pts))
                if position is not None:
                    images[position] = frame.to_ndarray(format="rgb24")
                if len(images) == len(wanted) or frame.pts > last:
                    break
    except av.FFmpegError as exc:
        raise DecodeError(f"{name}: cannot decode its {index.codec} video: {exc}") from exc
    return images
