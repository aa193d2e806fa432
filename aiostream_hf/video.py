"""Remote video frame sampling that fetches only the bytes of the frames it needs.

::

    async with video.open("https://.../episode_000.mp4") as reader:
        frames = await reader.frames_at([0.0, 0.5, 1.0])   # Frames(data T x H x W x 3, pts)

This module is the public face: ``open``, ``VideoReader`` (its lifecycle, its
metadata, which frame a time means) and ``Frames``. The work is done in private
modules, one concept each:

- ``_video_sources``: what ``open`` accepts (http(s), ``hf://``, ``s3://`` and
  file:// URLs, local paths, a ``FileRef``), as a ``FileRef``.
- ``_video_index``: opening: finding and reading the MP4 index (``moov``) through
  the byte source, in as few round trips as its place in the file allows.
- ``_video_decode``: the frames of a call: runs of samples from their keyframes,
  fetched in one round trip and decoded in threads as they arrive, decoder state
  kept between calls.
- ``_video_demux``: files without a usable index, read whole and decoded with
  ``av.open``.

``frames_at`` maps every timestamp to the frame on screen at that time (or, with
``tolerance_s``, to the nearest frame); calls on one reader run one at a time.

Timestamps are FFmpeg's: ``Frames.pts`` equals the ``frame.time`` PyAV gives when
it decodes the file (edit lists included), and the pixels are the same.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import numpy as np
import numpy.typing as npt

from ._exceptions import ClosedResourceError, DecodeError, FrameTimestampError, SourceError
from ._models import FileRef
from ._mp4 import HEAD_READ_SIZE as HEAD_READ_SIZE
from ._mp4 import TAIL_READ_SIZE as TAIL_READ_SIZE
from ._sources import is_bucket_uri
from ._stalls import run_decode
from ._video_decode import _DECODERS as _DECODERS
from ._video_decode import _VIDEO_COALESCE_GAP as _VIDEO_COALESCE_GAP
from ._video_decode import Array, _decode_indexed, _Indexed
from ._video_demux import _decode_demuxed, _Demuxed
from ._video_index import _load as _load
from ._video_index import _Reads as _Reads
from ._video_index import _tail_size as _tail_size
from ._video_index_cache import IndexCache
from ._video_sources import VideoSource as VideoSource
from ._video_sources import _file_ref, _listed
from ._video_sources import check_source as check_source
from .formats import ByteSource

if TYPE_CHECKING:
    from ._options import StreamOptions
    from ._resolver import Resolver

__all__ = ["Frames", "VideoReader", "VideoSource", "VideoStatistics", "open"]


@dataclass(frozen=True, eq=False)
class Frames:
    """Decoded frames: ``data`` is uint8 T x H x W x 3 (RGB), ``pts`` their times in seconds."""

    data: npt.NDArray[np.uint8]
    pts: npt.NDArray[np.float64]

    def __len__(self) -> int:
        return len(self.pts)


@dataclass(frozen=True, slots=True)
class VideoStatistics:
    """What a VideoReader did since it was opened.

    indexed: True when frames are fetched from the MP4 index; False when the file
        had no usable index and was read whole (``fallback_reason`` says why).
    index_cached: True when ``open`` found the parsed index in the byte cache's store
        (``StreamOptions(byte_cache_bytes=)``), kept there by a process of this machine
        that read it before: no index request (``index_requests`` 0).
    index_requests / index_bytes: ranges (and their bytes) read by ``open`` to find and
        read the index, or the whole file without one.
    frame_requests / frame_bytes: reads (and bytes) of frame samples, all sent at once:
        one per group of nearby GOPs of a call (a streamed group: one per stretch of
        its bytes with no gap of ``coalesce_gap`` or more, cut where the next GOP
        starts ``coalesce_gap`` or more into the read; a ``read_ranges`` call).
        0 for a file that ``open`` read whole: its frames come from those bytes.
    packets_decoded: samples fed to the decoder.
    decoder_starts: decodes started afresh at a keyframe.
    decoder_reuses: decodes that continued the decoder state of the call before.
    decoders_created: decoders made; a decode thread flushes the one it is done with
        and starts its next run with it (the last run's is kept for the next call).
    flushes: decodes that had to drain the decoder (its state is then dropped).
    frames_returned: frames handed out, repeats included.
    """

    indexed: bool
    fallback_reason: str | None = None
    index_cached: bool = False
    index_requests: int = 0
    index_bytes: int = 0
    frame_requests: int = 0
    frame_bytes: int = 0
    packets_decoded: int = 0
    decoder_starts: int = 0
    decoder_reuses: int = 0
    decoders_created: int = 0
    flushes: int = 0
    frames_returned: int = 0


def open(
    source: VideoSource,
    *,
    fetcher: ByteSource | None = None,
    options: StreamOptions | None = None,
    token: str | bool | None = None,
    endpoint: str | None = None,
) -> VideoReader:
    """A reader of one video file: use it as ``async with video.open(source) as reader``.

    ``source`` is an ``hf://datasets/ORG/NAME[@REV]/PATH`` file of a Hub repo, an http(s)
    URL, an ``s3://BUCKET/KEY`` object (its size and ETag come from one listing request,
    reached with ``options``' ``s3_*`` settings), a ``file://`` URL, a local path or a
    ``FileRef``. ``fetcher`` is any ``ByteSource`` (a ``RangeFetcher``, shared by many
    readers); without one the reader opens its own readers (``open_readers``: the token
    and endpoint from ``token=``/``endpoint=``, else the environment when it opens) over
    the event loop's shared ``HubClient`` (one connection pool with every stream of the
    loop) and closes them with itself. Opening reads the file's index; a file that is not
    a video, or whose codec PyAV cannot decode, raises ``DecodeError``.
    """
    return VideoReader(
        _file_ref(source), fetcher=fetcher, options=options, token=token, endpoint=endpoint
    )


class VideoReader:
    """Frames of one video file by timestamp. Create with ``video.open``."""

    def __init__(
        self,
        file: FileRef,
        *,
        fetcher: ByteSource | None = None,
        options: StreamOptions | None = None,
        token: str | bool | None = None,
        endpoint: str | None = None,
    ) -> None:
        self.file = file
        self._source = fetcher
        self._owned: contextlib.AsyncExitStack | None = None  # what this reader opened
        self._options = options
        self._token = token
        self._endpoint = endpoint
        self._index: _Indexed | _Demuxed | None = None
        self._closed = False
        self._lock = anyio.Lock()
        self._stats: dict[str, Any] = {}
        self._index_cache: IndexCache | None = None  # where the machine keeps its index

    # -- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> VideoReader:
        await self.aopen()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aopen(self) -> None:
        """Read the file's index (``async with`` does this)."""
        if self._closed:
            raise ClosedResourceError(f"this VideoReader of {self.file.path} is closed")
        if self._index is not None:
            return
        try:
            from ._options import StreamOptions

            max_whole = (self._options or StreamOptions()).max_whole_video_bytes
            url = self.file.url
            listed = url.startswith("hf://") or is_bucket_uri(url)
            resolver: Resolver | None = None  # of a listed file: its listing names it
            if self._source is None or listed:
                from ._engine import open_readers

                # Frames of one call lie in a few GOPs: merging gaps of up to 1 MiB (the
                # stream default) would fetch the video between them.
                options = self._options or StreamOptions(coalesce_gap=_VIDEO_COALESCE_GAP)
                self._owned = contextlib.AsyncExitStack()
                readers = await self._owned.enter_async_context(
                    open_readers(
                        options,
                        token=self._token,
                        endpoint=self._endpoint,
                        access=getattr(self._source, "access", None),
                    )
                )
                if self._source is None:
                    self._source = readers.fetcher
                if listed:
                    resolver = readers.resolver
            source = self._source

            async def index() -> _Indexed | _Demuxed:
                if resolver is not None:
                    self.file = await _listed(url, resolver, source)
                self._index_cache = IndexCache.of(source, self.file)
                return await _load(self.file, source, self._stats, max_whole, self._index_cache)

            # Listed: once more, with a fresh pin, if the Hub refuses the commit of a pin
            # shared through the resolution cache (a restarted server, a rewritten branch).
            self._index = await (index() if resolver is None else resolver.with_fresh_pin(index))
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Drop the decoder and close the fetcher this reader created (not one passed in)."""
        if self._closed:
            return
        self._closed = True
        if isinstance(self._index, _Indexed):
            self._index.state = None
            self._index.recent.clear()
            self._index.data = None
        owned, self._owned = self._owned, None
        if owned is not None:
            with anyio.CancelScope(shield=True):
                await owned.aclose()  # the fetcher, then this reader's use of the client

    @property
    def closed(self) -> bool:
        return self._closed

    def _opened(self) -> _Indexed | _Demuxed:
        if self._closed:
            raise ClosedResourceError(f"this VideoReader of {self.file.path} is closed")
        if self._index is None:
            raise RuntimeError(
                f"the VideoReader of {self.file.path} is not open: "
                "use `async with video.open(...) as reader`"
            )
        return self._index

    # -- metadata --------------------------------------------------------------------

    @property
    def fps(self) -> float:
        """Average frames per second."""
        return self._opened().fps

    @property
    def duration(self) -> float:
        """Seconds from 0 to the end of the last frame (its pts plus its duration)."""
        return self._opened().duration

    @property
    def codec(self) -> str:
        """FFmpeg's codec name: h264, hevc, av1, vp9, ..."""
        return self._opened().codec

    @property
    def width(self) -> int:
        return self._opened().width

    @property
    def height(self) -> int:
        return self._opened().height

    @property
    def frame_count(self) -> int:
        """Frames presented (frames an edit list hides are not counted)."""
        return len(self._opened().shown_ticks)

    @property
    def keyframe_count(self) -> int:
        return self._opened().keyframe_count

    @property
    def pts(self) -> npt.NDArray[np.float64]:
        """The presentation time of every frame, in seconds, ascending (a copy)."""
        return np.array(self._opened().shown_s, dtype=np.float64)

    def statistics(self) -> VideoStatistics:
        index = self._index
        indexed = isinstance(index, _Indexed)
        reason = index.reason if isinstance(index, _Demuxed) else None
        return VideoStatistics(indexed=indexed, fallback_reason=reason, **self._stats)

    # -- frames ----------------------------------------------------------------------

    async def frames_at(
        self, timestamps: Sequence[float] | Array, *, tolerance_s: float | None = None
    ) -> Frames:
        """The frames at the given times (seconds), in the order given, repeats included.

        By default, the frame on screen at each time ``t``, as a player shows it and as
        torchcodec's ``get_frames_played_at`` gives it: the frame whose interval
        ``[pts, next frame's pts)`` holds ``t`` (the last frame's ends at ``duration``),
        that is the frame with the largest pts <= ``t``. Times before the first frame's
        pts, or at or after ``duration``, raise ``FrameTimestampError`` naming the file,
        the time and the valid range.

        ``tolerance_s=x`` selects the strict rule of LeRobot items (what
        ``aiostream_hf.lerobot`` uses) instead: the frame whose pts is nearest ``t``,
        which must lie within ``x`` seconds of it (else ``FrameTimestampError`` naming the
        file, the time and the nearest frame's pts); times outside ``[0, duration]``
        raise too.

        Fetches the needed samples in one round trip (none for a file read whole at
        open) and decodes the GOPs they lie in in parallel.
        """
        index = self._opened()
        wanted = np.asarray(timestamps, dtype=np.float64)
        if wanted.ndim != 1:
            raise SourceError(
                f"frames_at of {self.file.path}: timestamps must be one-dimensional, "
                f"got shape {wanted.shape}"
            )
        if tolerance_s is None:
            positions = _played_at(index, wanted, self.file.path)
        elif isinstance(tolerance_s, bool) or not tolerance_s >= 0:
            raise SourceError(
                f"frames_at of {self.file.path}: tolerance_s={tolerance_s!r}: give seconds "
                ">= 0 (the nearest frame within them), or leave it out (the frame on screen)"
            )
        else:
            positions = _nearest(index, wanted, float(tolerance_s), self.file.path)
        return await self._frames(index, positions)

    async def frames_in_range(self, start: float, end: float) -> Frames:
        """Every frame whose presentation time lies in ``[start, end)`` seconds."""
        index = self._opened()
        for value in (start, end):
            _check_in_range(index, float(value), self.file.path)
        if end < start:
            raise SourceError(
                f"frames_in_range of {self.file.path}: end {end} < start {start}: give the "
                "start of the range first (seconds, start <= end)"
            )
        lo = int(np.searchsorted(index.shown_s, start - 1e-9, side="left"))
        hi = int(np.searchsorted(index.shown_s, end - 1e-9, side="left"))
        return await self._frames(index, np.arange(lo, hi, dtype=np.int64))

    async def _frames(self, index: _Indexed | _Demuxed, positions: Array) -> Frames:
        if len(positions) == 0:
            empty = np.empty((0, index.height, index.width, 3), dtype=np.uint8)
            return Frames(empty, np.empty(0, dtype=np.float64))
        unique = sorted({int(p) for p in positions})
        if isinstance(index, _Indexed):
            async with self._lock:
                images = await _decode_indexed(index, unique, self._source, self.file, self._count)
                if self._index_cache is not None:  # the CDN URL the reads went to, if new
                    await self._index_cache.store_route()
        else:
            images = await run_decode(_decode_demuxed, index, unique, self.file.path)
        try:
            data = np.stack([images[int(p)] for p in positions])
        except ValueError as exc:
            raise DecodeError(f"{self.file.path}: frames of different sizes: {exc}") from exc
        self._count("frames_returned", len(positions))
        return Frames(data, index.shown_s[positions])

    def _count(self, name: str, n: int) -> None:
        self._stats[name] = self._stats.get(name, 0) + n


# -- timestamps --------------------------------------------------------------------------


def seconds(t: float) -> str:
    """A timestamp for a message: ``1.5s``, but ``nan`` and ``inf`` said as such (not
    "nans", "infs")."""
    if math.isnan(t):
        return "nan (not a number)"
    if math.isinf(t):
        return f"{t!r} (infinite)"
    return f"{t!r}s"


def _check_in_range(index: _Indexed | _Demuxed, t: float, name: str) -> None:
    if not 0.0 <= t <= index.duration + 1e-9:
        raise FrameTimestampError(
            f"{name}: timestamp {seconds(t)} is outside the video, which spans "
            f"[0, {index.duration:.6f}]s"
        )


def _played_at(index: _Indexed | _Demuxed, wanted: Array, name: str) -> Array:
    """The position (in presentation order) of the frame on screen at each time: the last
    frame whose pts is at or before it. The frames play from the first pts to the end of
    the last frame (``duration``); a time outside ``[first pts, duration)`` has none."""
    shown = index.shown_s
    if not len(shown):
        raise FrameTimestampError(f"{name}: the video shows no frame")
    first, end = float(shown[0]), index.duration
    outside = np.flatnonzero(~((wanted >= first) & (wanted < end)))  # NaN is outside too
    if len(outside):
        t = float(wanted[outside[0]])
        where = (
            "not a number"
            if t != t
            else "before the first frame"
            if t < first
            else "at or after the end of the last frame"
        )
        raise FrameTimestampError(
            f"{name}: timestamp {seconds(t)} is outside the video ({where}): its frames play in "
            f"[{first!r}, {end!r})s; give a time in that range"
        )
    positions: Array = np.searchsorted(shown, wanted, side="right") - 1
    return positions


def _nearest(index: _Indexed | _Demuxed, wanted: Array, tolerance_s: float, name: str) -> Array:
    """The position (in presentation order) of the frame nearest to each timestamp."""
    shown = index.shown_s
    for t in wanted:
        _check_in_range(index, float(t), name)
    right = np.clip(np.searchsorted(shown, wanted, side="left"), 0, len(shown) - 1)
    left = np.clip(right - 1, 0, len(shown) - 1)
    pick_left = np.abs(wanted - shown[left]) <= np.abs(shown[right] - wanted)  # ties: earlier
    positions: Array = np.where(pick_left, left, right)
    gaps = np.abs(shown[positions] - wanted)
    bad = np.flatnonzero(gaps > tolerance_s)
    if len(bad):
        i = int(bad[0])
        raise FrameTimestampError(
            f"{name}: no frame within tolerance_s={tolerance_s} of timestamp "
            f"{float(wanted[i])!r}s: the nearest frame is at pts {float(shown[positions[i]])!r}s "
            f"({float(gaps[i]):.6f}s away; the video has {index.fps:.3f} fps)"
        )
    return positions
