"""The fallback: the whole file, demuxed by FFmpeg.

Files without a usable index (fragmented MP4, Matroska/WebM, other containers,
MP4 codecs not mapped here) are read whole at open and decoded with ``av.open``
on the bytes in memory: correct, not minimal.
"""

from __future__ import annotations

import io
from typing import Any

import av
import numpy as np
import numpy.typing as npt

from ._exceptions import DecodeError
from ._mp4 import NoIndex
from ._video_decode import Array


class _Demuxed:
    """A file without a usable index, held in memory and decoded with ``av.open``."""

    def __init__(self, data: bytes, why: NoIndex, name: str) -> None:
        self.data = data
        self.reason = why.reason
        self.name = name
        try:
            with av.open(io.BytesIO(data), "r") as container:
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


def _has_decoder(context: Any) -> bool:
    try:
        av.Codec(context.name, "r")
    except (av.FFmpegError, ValueError):
        return False
    return True


def _decode_demuxed(index: _Demuxed, positions: list[int], name: str) -> dict[int, Array]:
    """Decode the frames at ``positions`` (presentation order) from the file in memory."""
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
        with av.open(io.BytesIO(index.data), "r") as container:
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
