"""Remote video frame sampling that fetches only the bytes of the frames it needs.

::

    async with video.open("https://.../episode_000.mp4") as reader:
        frames = await reader.frames_at([0.0, 0.5, 1.0])   # Frames(data T x H x W x 3, pts)

Opening reads the MP4 index (``moov``) in one round trip when it lies at either
end of a file of known size: the head and the tail are read at once. Without a
known size, the tail is read first, alone (a suffix read, which tells the size); a
``moov`` that ends the file is found in it without the head (``moov_in_tail``), and
the head is read only when the tail holds no such box. When ``moov`` is in neither, the box
sizes lead straight to it (``_mp4``). A file no larger than those first reads is
read whole and kept: no byte is fetched twice, and its frames need no more requests.
``frames_at`` then maps every timestamp to the frame on screen at that time (or, with
``tolerance_s``, to the nearest frame), each frame to the keyframe it is decoded from,
and fetches the bytes of those samples in ONE round trip: every group of nearby GOPs at once,
streamed in order (``iter_bytes``) from a source that can, else one
``read_ranges`` call. Each run of samples from a keyframe decodes with PyAV in a
worker thread (one thread per core for the process; the runs split between them
so that they end together), and the thread feeds each sample to its decoder as
soon as the sample is in: decoding starts with the first bytes, not the last.
There is no demuxer: ``av.CodecContext`` is fed the samples as packets, with the
codec configuration box of the sample description as extradata.

Timestamps are FFmpeg's: ``Frames.pts`` equals the ``frame.time`` PyAV gives when
it decodes the file (edit lists included), and the pixels are the same.

Decoder state is kept between calls: a call whose frames come after the last one
decoded, and whose keyframe was already fed, continues from there instead of
decoding the group of pictures again. Calls on one reader run one at a time.

Files without a usable index (fragmented MP4, Matroska/WebM, other containers,
MP4 codecs not mapped here) are read whole at open and decoded with ``av.open``
on the bytes in memory: correct, not minimal.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import io
import os
import threading
import urllib.parse
import urllib.request
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import anyio
import anyio.abc
import anyio.to_thread
import av
import numpy as np
import numpy.typing as npt
from anyio.lowlevel import RunVar
from av.video.codeccontext import VideoCodecContext
from av.video.frame import VideoFrame

from ._arrivals import Arrivals, Span, Unfinished, merge_spans
from ._exceptions import (
    ClosedResourceError,
    DecodeError,
    FrameTimestampError,
    SourceError,
)
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
from ._sources import BucketSource, HubSource, has_glob, is_bucket_uri, parse_sources
from .formats import ByteSource, StreamSource
from .formats._split import next_job, split, usable_cpus

if TYPE_CHECKING:
    from ._options import StreamOptions
    from ._resolver import Resolver

_VIDEO_COALESCE_GAP = 64 * 1024
_HOP_REACH = 16 * 1024 * 1024  # a read towards moov goes on to the tail read when this near
# Index reads through a RangeFetcher come in concurrent parts of at most this many bytes,
# each over its own connection: the index is on the critical path of every open, and a
# server (or the network) that caps each connection's speed serves the parts side by side.
_INDEX_PART = 256 * 1024

__all__ = ["Frames", "VideoReader", "VideoSource", "VideoStatistics", "open"]

VideoSource: TypeAlias = "str | os.PathLike[str] | FileRef"
"""What ``open`` reads: an http(s), ``s3://`` or file:// URL, a local path, or a FileRef."""

#: FFmpeg codec name -> the decoders to use, best first (the one ``av.open`` would pick).
_DECODERS: dict[str, tuple[str, ...]] = {
    "h264": ("h264",),
    "hevc": ("hevc",),
    "av1": ("libdav1d", "libaom-av1", "av1"),
    "vp9": ("vp9", "libvpx-vp9"),
    "vp8": ("vp8", "libvpx"),
}
#: Decoder options that change latency only, never pixels.
_DECODER_OPTIONS: dict[str, dict[str, str]] = {"libdav1d": {"max_frame_delay": "1"}}
_SCAN = 64  # samples scanned around a frame for reordering (far more than any B-pyramid)
# Samples fed past the last one needed, to keep the decoder alive for the next call, may
# cost up to this fraction of the bytes from the keyframe: a restart would cost all of them.
_MARGIN_BUDGET = 0.5
_RECENT = 8  # decoded frames kept for the next call

Array: TypeAlias = npt.NDArray[Any]
_SampleBytes: TypeAlias = "Callable[[int], bytes | memoryview]"  # sample -> its bytes
_STREAM_BLOCK = 64 * 1024  # a streamed read hands its bytes on in blocks of this size


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
            listed = self.file.url.startswith("hf://") or is_bucket_uri(self.file.url)
            if self._source is None or listed:
                from ._engine import open_readers
                from ._options import StreamOptions

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
                    self.file = await _listed(self.file.url, readers.resolver)
            self._index = await _load(self.file, self._source, self._stats)
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
            raise ValueError(
                f"frames_at of {self.file.path}: timestamps must be one-dimensional, "
                f"got shape {wanted.shape}"
            )
        if tolerance_s is None:
            positions = _played_at(index, wanted, self.file.path)
        elif isinstance(tolerance_s, bool) or not tolerance_s >= 0:
            raise ValueError(
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
            raise ValueError(f"frames_in_range of {self.file.path}: end {end} < start {start}")
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
                images = await self._decode_indexed(index, unique)
        else:
            images = await anyio.to_thread.run_sync(_decode_demuxed, index, unique, self.file.path)
        try:
            data = np.stack([images[int(p)] for p in positions])
        except ValueError as exc:
            raise DecodeError(f"{self.file.path}: frames of different sizes: {exc}") from exc
        self._count("frames_returned", len(positions))
        return Frames(data, index.shown_s[positions])

    async def _decode_indexed(self, index: _Indexed, positions: list[int]) -> dict[int, Array]:
        """Fetch and decode the runs that output ``positions``.

        Every group of nearby runs is fetched at once (one round trip): over a source
        that streams (``iter_bytes``, a RangeFetcher) one read per stretch of its bytes
        without a gap of ``coalesce_gap``, cut before a run that would wait for long
        (``_stream_spans``), else one ``read_ranges`` call. Meanwhile the
        decode threads (at most one per core for the whole process) take the runs,
        longest first, each feeding its decoder every sample as soon as it is in.
        """
        table = index.table
        samples = [int(index.shown_samples[p]) for p in positions]
        recent = index.recent
        hits = {s: recent[int(table.cts[s])] for s in samples if int(table.cts[s]) in recent}
        runs = index.plan([s for s in samples if s not in hits])
        state, index.state = index.state, None  # dropped if anything below fails
        results: list[_RunResult | None] = [None] * len(runs)
        images: dict[int, Array] = {}
        failures: list[Exception] = []
        limiter = _decode_limiter()
        source = self._source
        assert source is not None
        streams = _streaming(source)
        gap = _coalesce_gap(source)
        # Where each run's samples arrive, set up before anything is read.
        costs = [_run_cost(run) for run in runs]
        reads: list[tuple[Arrivals, list[Span]]] = []
        arrivals_of: list[Arrivals | None] = [None] * len(runs)  # None: feeds nothing
        if index.data is not None:  # the file was read whole at open: every byte is in
            held = Arrivals([(0, len(index.data))])
            held.add(0, index.data)
            held.close()
            for i, run in enumerate(runs):
                if _byte_ranges(table, [run]):
                    arrivals_of[i] = held
        else:
            # Requests go out longest run first: the threads start with those, and a
            # server answers (more or less) in order.
            groups = _fetch_groups(table, runs, gap)
            for group in sorted(groups, key=lambda g: -max(costs[i] for i in g)):
                group_runs = [runs[i] for i in group]
                ranges = _byte_ranges(table, group_runs)
                if ranges:
                    spans = ranges if streams is None else _stream_spans(table, group_runs, gap)
                    arrivals = Arrivals(spans)
                    reads.append((arrivals, ranges))
                    for i in group:
                        arrivals_of[i] = arrivals
        workers = min(usable_cpus(), len(runs))
        queues = split(costs, workers)
        stop = threading.Event()  # the decode threads stop at their next sample
        arrived = anyio.Event()  # the first bytes are in (or there are none to read)
        if not reads:
            arrived.set()
        threads = 1 if len(runs) > 1 else 0  # parallel runs: one thread per decoder

        def halt() -> None:
            stop.set()
            for arrivals, _ in reads:
                arrivals.close()

        def decode_runs(w: int) -> None:  # worker thread: runs until none is left
            spare: VideoCodecContext | None = None  # this thread's decoder, free again
            while not stop.is_set():
                i = next_job(queues, w)
                if i is None:
                    return
                run, arrivals = runs[i], arrivals_of[i]
                sample: _SampleBytes = (
                    _no_samples
                    if arrivals is None
                    else functools.partial(_take_sample, table, arrivals, stop)
                )
                # The last run's decoder (and its last frames) are kept for the next call.
                last = i == len(runs) - 1
                result = index.decode_run(
                    run,
                    state if run.reuse else None,
                    sample,
                    threads,
                    spare=None if run.reuse else spare,
                    recent=_RECENT if last else 0,
                )
                results[i] = result
                spare = None if last else result.decoder

        async def convert() -> None:
            images.update(await anyio.to_thread.run_sync(_to_rgb, hits, limiter=limiter))

        async def read(arrivals: Arrivals, ranges: list[Span]) -> None:
            try:
                buffers = await source.read_ranges(self.file, ranges)
                for k, ((start, end), buf) in enumerate(zip(ranges, buffers, strict=True)):
                    _check_length(self.file, start, end, len(buf))
                    arrivals.add(k, buf)
                    arrived.set()
            finally:
                arrivals.close()  # a thread still waiting for bytes gives up
                self._count("frame_bytes", arrivals.received())

        async def stream(streams: StreamSource, arrivals: Arrivals, k: int) -> None:
            start, end = arrivals.spans[k]
            try:
                async with streams.iter_bytes(
                    self.file, start, end, block_size=_STREAM_BLOCK
                ) as blocks:
                    async for block in blocks:
                        arrivals.add(k, block)
                        arrived.set()
            finally:
                arrivals.close(k)
                self._count("frame_bytes", arrivals.received(k))
            _check_length(self.file, start, end, arrivals.received(k))

        async def guarded(
            work: Callable[..., Awaitable[None]],
            *args: Any,
            task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
        ) -> None:
            task_status.started()  # the next read starts once this one has been asked for
            try:
                await work(*args)
            except Unfinished:
                return  # the bytes stopped coming, or the call is ending: not the cause
            except Exception as exc:  # re-raised below, as it was raised
                failures.append(exc)
                halt()
                tg.cancel_scope.cancel()  # the other runs are no use now

        watching = anyio.CancelScope()

        async def watch() -> None:
            """Stop the threads when the call ends, however it ends (they cannot be
            cancelled, and may be waiting for bytes)."""
            with watching:
                try:
                    await anyio.sleep_forever()
                finally:
                    halt()

        async def decode_thread(w: int) -> None:
            # Decode threads are shared by every reader: hold one only once bytes come.
            await arrived.wait()
            await anyio.to_thread.run_sync(decode_runs, w, limiter=limiter)

        async def decode() -> None:
            async with anyio.create_task_group() as decoders:
                for w in range(workers):
                    decoders.start_soon(guarded, decode_thread, w)
            watching.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            if hits:
                tg.start_soon(guarded, convert)
            # Started one after the other (``start`` returns once a read has been asked
            # for), so the requests go out in this order on every backend: longest first.
            for arrivals, ranges in reads:
                if streams is None:
                    self._count("frame_requests", 1)
                    await tg.start(guarded, read, arrivals, ranges)
                    continue
                self._count("frame_requests", len(arrivals.spans))
                for k in range(len(arrivals.spans)):
                    await tg.start(guarded, stream, streams, arrivals, k)
            tg.start_soon(decode)
        if failures:
            raise failures[0]
        done = [r for r in results if r is not None]
        if len(done) != len(runs):  # cannot be: a thread gave up with nothing raised
            raise DecodeError(f"{self.file.path}: {len(runs) - len(done)} runs were not decoded")
        if runs:
            index.merge(done)
        else:
            index.state = state
        for result in done:
            images.update(result.images)
            for name, value in result.counts.items():
                self._count(name, value)
        return {p: images[s] for p, s in zip(positions, samples, strict=True)}

    def _count(self, name: str, n: int) -> None:
        self._stats[name] = self._stats.get(name, 0) + n


# -- sources ---------------------------------------------------------------------------


def check_source(source: str) -> None:
    """Raise ``SourceError`` now for an hf:// or s3:// URL that ``open`` would refuse
    (one that does not name one file); reads nothing."""
    if source.startswith("hf://") or is_bucket_uri(source):
        _file_ref(source)


def _file_ref(source: VideoSource) -> FileRef:
    if isinstance(source, FileRef):
        return source
    if isinstance(source, str):
        scheme = urllib.parse.urlsplit(source).scheme.lower()
        if scheme in ("http", "https"):
            return FileRef(source, source)
        if scheme == "hf":
            found = parse_sources(source)
            one = found[0] if len(found) == 1 else None
            if not isinstance(one, HubSource) or not one.path or has_glob(one.path):
                raise SourceError(
                    f"cannot open {source!r} as a video: name one file of a repo, "
                    "hf://datasets/ORG/NAME[@REVISION]/PATH/TO/VIDEO.mp4"
                )
            return FileRef(source, source)  # its URL, size and ETag: at aopen()
        if is_bucket_uri(source):
            found = parse_sources(source)
            src = found[0] if len(found) == 1 else None
            if not isinstance(src, BucketSource) or has_glob(src.key) or src.key.endswith("/"):
                raise SourceError(
                    f"cannot open {source!r} as a video: name one object, {scheme}://BUCKET/KEY"
                )
            return FileRef(src.uri, src.uri)  # its URL, size and ETag: at aopen()
        if scheme == "file":
            return _local_ref(Path(urllib.request.url2pathname(urllib.parse.urlsplit(source).path)))
        if len(scheme) > 1:
            raise SourceError(
                f"cannot open {source!r} as a video: give an http(s) or s3:// URL, "
                "a file:// URL, a local path or a FileRef"
            )
    elif not isinstance(source, os.PathLike):
        raise SourceError(
            f"cannot open {source!r} as a video: give an http(s) or s3:// URL, "
            "a file:// URL, a local path or a FileRef"
        )
    return _local_ref(Path(os.fspath(source)).expanduser())


async def _listed(uri: str, resolver: Resolver) -> FileRef:
    """The ``FileRef`` of one S3 object or Hub file (URL, size, ETag), from its listing."""
    manifest = await resolver.resolve(uri)
    (src,) = parse_sources(uri)
    want = src.path if isinstance(src, HubSource) else uri
    if len(manifest.files) != 1 or manifest.files[0].path != want:
        raise SourceError(f"cannot open {uri!r} as a video: name one file, not a folder")
    return manifest.files[0]


def _local_ref(path: Path) -> FileRef:
    if not path.is_file():
        raise SourceError(f"no video file at {str(path)!r}: check the path")
    path = path.resolve()
    return FileRef(path.as_uri(), str(path), size=path.stat().st_size)


# -- opening: find and read the index ----------------------------------------------------


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
    """Index bytes: a RangeFetcher's come in concurrent parts of ``_INDEX_PART`` bytes."""
    from ._fetcher import RangeFetcher

    if isinstance(source, RangeFetcher):
        return await source.read_ranges(file, ranges, part_size=_INDEX_PART)
    return await source.read_ranges(file, ranges)


async def _read_index_tail(source: ByteSource, file: FileRef, n: int) -> tuple[bytes, int]:
    """The tail read of ``open``: a RangeFetcher's comes in concurrent parts of
    ``_INDEX_PART`` bytes, once a redirect told the size (``RangeFetcher.read_tail``)."""
    from ._fetcher import RangeFetcher

    if isinstance(source, RangeFetcher):
        return await source.read_tail(file, n, part_size=_INDEX_PART)
    return await source.read_tail(file, n)


def _check_length(file: FileRef, start: int, end: int, got: int) -> None:
    """A read of bytes ``[start, end)`` that brought ``got`` bytes: the right number, or
    a DecodeError naming them."""
    if got != end - start:
        raise DecodeError(f"{file.path}: asked for bytes {start}-{end - 1}, got {got} bytes")


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
    """The head and the tail of the file: one round trip when its size is known.

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
        if tail_start - head_end < _VIDEO_COALESCE_GAP:
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


async def _load(file: FileRef, source: ByteSource, stats: dict[str, Any]) -> _Indexed | _Demuxed:
    name = file.path
    reads = await _read_ends(file, source, stats)
    table = await _moov_at_end(reads, name)
    if table is not None:  # the tail read held the index: the head is not needed
        return await anyio.to_thread.run_sync(_Indexed, table, None)
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
        return await anyio.to_thread.run_sync(_Indexed, found, reads.whole())
    data = await reads.get(0, reads.size)
    return await anyio.to_thread.run_sync(_Demuxed, data, found, name)


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
        found = await anyio.to_thread.run_sync(parse_moov, moov, name, reads.size)
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
            return await anyio.to_thread.run_sync(parse_moov, moov, name, reads.size)
        if box.type == "moof":
            return NoIndex("fragmented MP4 (moof before moov)")
        pos = box.end
    raise DecodeError(f"{name}: an MP4 file without a moov box (truncated, or still being written)")


# -- timestamps --------------------------------------------------------------------------


def _check_in_range(index: _Indexed | _Demuxed, t: float, name: str) -> None:
    if not 0.0 <= t <= index.duration + 1e-9:
        raise FrameTimestampError(
            f"{name}: timestamp {t!r}s is outside the video, which spans [0, {index.duration:.6f}]s"
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
            f"{name}: timestamp {t!r}s is outside the video ({where}): its frames play in "
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


# -- the indexed path: plan, fetch, decode ------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Run:
    """Samples ``[start, end]`` (decode order) fed to one decoder to output ``targets``."""

    key: int  # the keyframe the decoder starts from (or started from, when reused)
    start: int  # the first sample to feed
    end: int  # the last sample to feed (inclusive); start > end feeds nothing
    targets: tuple[int, ...]
    reuse: bool = False


@dataclass
class _State:
    """A decoder fed samples ``[key, next)`` contiguously; its last output frame's cts."""

    context: VideoCodecContext
    key: int
    next: int
    last_cts: int | None


@dataclass
class _RunResult:
    """What decoding one run gave: the frames of its targets (by sample), the last frames
    the decoder output (cts, frame), counts, the decoder state to keep (None once drained)
    and the decoder's reorder depth."""

    images: dict[int, Array]
    recent: deque[tuple[int, VideoFrame]]
    counts: dict[str, int]
    state: _State | None
    depth: int
    decoder: VideoCodecContext  # the decoder it used (state, if kept, holds it too)


class _Indexed:
    """A file decoded from its MP4 index: the sample table and the decoder state, and the
    file's bytes when ``open`` read it whole (``data``: frames are then read from them)."""

    def __init__(self, table: SampleTable, data: bytes | None = None) -> None:
        self.table = table
        self.data = data
        self.decoder = _decoder_for(table.codec, table.fourcc, table.name)
        self.codec = table.codec
        self.width = table.width
        self.height = table.height
        self.keyframe_count = table.keyframe_count
        self.duration = table.duration_s
        self.fps = table.fps
        self.keys = np.flatnonzero(table.is_key)
        shown = np.flatnonzero(table.shown)
        self.shown_samples = shown[np.argsort(table.pts[shown], kind="stable")]
        self.shown_ticks = table.pts[self.shown_samples]
        self.shown_s: npt.NDArray[np.float64] = self.shown_ticks / np.float64(table.timescale)
        self.time_base = Fraction(1, table.timescale)
        self.depth = table.reorder_depth()
        self.cumsize = np.concatenate([[0], np.cumsum(table.size)]).astype(np.int64)
        self.state: _State | None = None
        # The last frames the decoder output (undecoded to RGB): a frame held back until a
        # drain, or asked for again, needs no decoding from its keyframe.
        self.recent: OrderedDict[int, VideoFrame] = OrderedDict()

    # Planning is plain synchronous code on the event loop; decode runs in a thread.

    def keyframe_for(self, j: int) -> int:
        """The keyframe to decode sample ``j`` from: the last one at or before it in decode
        order that is not presented after it (a leading frame of an open GOP needs the
        GOP before)."""
        keys, cts = self.keys, self.table.cts
        pos = int(np.searchsorted(keys, j, side="right")) - 1
        while pos >= 0 and cts[keys[pos]] > cts[j]:
            pos -= 1
        if pos >= 0:
            return int(keys[pos])
        return int(keys[0]) if len(keys) and keys[0] <= j else 0

    def _gop_limit(self, j: int) -> int:
        """The last sample before the keyframe after ``j`` (or the last sample)."""
        n = self.table.sample_count
        nxt = int(np.searchsorted(self.keys, j, side="right"))
        return min(n, int(self.keys[nxt]) if nxt < len(self.keys) else n, j + _SCAN) - 1

    def needed_end(self, j: int) -> int:
        """The last sample needed to output ``j``: ``j``, or a later-decoded frame of its GOP
        that is presented before it (every earlier frame is output first)."""
        cts = self.table.cts
        later = cts[j + 1 : self._gop_limit(j) + 1]
        before = np.flatnonzero(later < cts[j])
        return j + 1 + int(before[-1]) if len(before) else j

    def output_end(self, j: int, need: int) -> int:
        """The last sample to feed so that a decoder holding back ``depth`` frames outputs
        ``j`` without being drained. It may reach into the next GOP: its keyframe makes the
        decoder output what it holds of this one, and decoding goes on from there."""
        cts = self.table.cts
        k = self.keyframe_for(j)
        limit = min(self.table.sample_count, j + _SCAN) - 1
        held = int(np.count_nonzero(cts[max(k, j - _SCAN) : need + 1] > cts[j]))
        end = need
        while held < self.depth and end < limit:
            end += 1
            held += int(cts[end] > cts[j])
        return end

    def plan(self, samples: list[int]) -> list[_Run]:
        """The decoder runs that output ``samples``: one per group of adjacent GOPs, in file
        order.

        Each run feeds the samples from its keyframe to the last one needed; runs are
        independent (each has its own decoder), so they decode in parallel. GOPs whose
        samples touch share a run: one decoder goes on through them at no extra cost, and
        tiny GOPs do not each pay for a decoder. The last run also feeds, when they cost
        at most ``_MARGIN_BUDGET`` of its bytes, the few samples after its last target that
        make the decoder output it without being drained, so that its state can serve the
        next call (the state of the other runs is dropped).
        """
        cts = self.table.cts
        wanted = sorted(set(samples), key=lambda s: (self.keyframe_for(s), int(cts[s])))
        groups: list[tuple[int, int, int, list[int]]] = []  # key, need, margin end, targets
        for j in wanted:
            k, need = self.keyframe_for(j), self.needed_end(j)
            margin = self.output_end(j, need)
            if groups and k <= groups[-1][1] + 1:
                key, last_need, last_margin, targets = groups[-1]
                groups[-1] = (key, max(last_need, need), max(last_margin, margin), [*targets, j])
            else:
                groups.append((k, need, margin, [j]))
        runs: list[_Run] = []
        state = self.state
        for i, (key, need, margin, targets) in enumerate(groups):
            start, run_key, reuse = key, key, False
            if (
                not runs
                and state is not None
                and state.key <= key <= state.next
                and (state.last_cts is None or min(int(cts[t]) for t in targets) > state.last_cts)
            ):  # the decoder of the last call has fed everything up to here: go on
                start, run_key, reuse = state.next, state.key, True
            end = need
            if i == len(groups) - 1:
                extra = self._bytes(max(need + 1, start), margin)
                if extra <= _MARGIN_BUDGET * self._bytes(key, need):
                    end = margin
            runs.append(_Run(run_key, start, end, tuple(targets), reuse))
        return runs

    def _bytes(self, first: int, last: int) -> int:
        """The bytes of samples ``first`` to ``last`` (inclusive)."""
        return int(self.cumsize[last + 1] - self.cumsize[first]) if last >= first else 0

    def decode_run(
        self,
        run: _Run,
        state: _State | None,
        sample: _SampleBytes,
        threads: int = 0,
        *,
        spare: VideoCodecContext | None = None,
        recent: int = _RECENT,
    ) -> _RunResult:
        """Feed ``run``'s samples to a decoder (``state``'s when it continues it); the frames
        of its targets (worker thread). Touches nothing shared: runs decode in parallel.

        ``sample(n)`` gives sample ``n``'s bytes (it may wait for them to arrive).
        ``threads``: the threads of a new decoder (0: FFmpeg's choice); 1 when runs
        decode in parallel, which then keep the cores busy without oversubscribing them.
        ``spare``: a decoder done with, flushed and used instead of a new one (its frame
        buffers are already allocated). ``recent``: output frames kept for the next call.
        """
        table = self.table
        counts: dict[str, int] = {}
        if run.reuse and state is not None:
            counts["decoder_reuses"] = 1
        else:
            if spare is not None:
                spare.flush_buffers()  # as new: the run starts at a keyframe
                context = spare
            else:
                context = self._new_context(threads)
                counts["decoders_created"] = 1
            state = _State(context, run.key, run.start, None)
            counts["decoder_starts"] = 1
        result = _RunResult({}, deque(maxlen=recent), counts, state, 0, state.context)
        pending = {int(table.cts[t]): t for t in run.targets}
        context = state.context
        time_base = self.time_base
        # Plain Python numbers, looked up once: the loop runs once per sample.
        lo, hi = run.start, run.end + 1
        sizes = table.size[lo:hi].tolist()
        cts = table.cts[lo:hi].tolist()
        dts = (table.cts[lo:hi] - table.pts[lo:hi] + table.dts[lo:hi]).tolist()
        keys = table.is_key[lo:hi].tolist()
        n = lo
        fed = 0
        try:
            while pending and n < hi:
                i = n - lo
                n += 1
                if not sizes[i]:  # an empty packet would drain the decoder
                    continue
                packet = av.Packet(sample(n - 1))  # type: ignore[arg-type]  # any buffer
                packet.pts = cts[i]  # unique: tells the output frames apart
                packet.dts = dts[i]
                packet.time_base = time_base
                packet.is_keyframe = keys[i]
                fed += 1
                self._keep(context.decode(packet), pending, result)
            counts["packets_decoded"] = fed
            state.next = n
            result.depth = int(context.reorder_depth)
            if pending:  # the decoder holds them back: drain it
                counts["flushes"] = 1
                self._keep(context.decode(None), pending, result)
                result.state = None
        except av.FFmpegError as exc:
            raise DecodeError(
                f"{table.name}: cannot decode {table.codec} sample {n - 1} "
                f"(bytes {table.offset[n - 1]}-{table.offset[n - 1] + table.size[n - 1] - 1}) "
                f"with {self.decoder}: {exc}"
            ) from exc
        if pending:
            missing = ", ".join(f"{c / table.timescale:.6f}s" for c in sorted(pending))
            raise DecodeError(
                f"{table.name}: the {table.codec} decoder gave no frame for cts {missing}"
            )
        return result

    def merge(self, results: Sequence[_RunResult]) -> None:
        """Keep what the runs of one call leave for the next (event loop, after they ended):
        the state of the last run, the last frames output and the reorder depth seen."""
        for result in results:
            self.depth = max(self.depth, result.depth)
            for cts, frame in result.recent:
                self.recent[cts] = frame
                self.recent.move_to_end(cts)
        while len(self.recent) > _RECENT:
            self.recent.popitem(last=False)
        if results:
            self.state = results[-1].state

    def _keep(self, frames: list[VideoFrame], pending: dict[int, int], result: _RunResult) -> None:
        for frame in frames:
            cts = frame.pts
            if cts is None:
                raise DecodeError(f"{self.table.name}: the {self.decoder} decoder lost timestamps")
            assert result.state is not None
            result.state.last_cts = int(cts)
            result.recent.append((int(cts), frame))
            sample = pending.pop(int(cts), None)
            if sample is not None:
                result.images[sample] = frame.to_ndarray(format="rgb24")

    def _new_context(self, threads: int = 0) -> VideoCodecContext:
        try:
            context = cast(VideoCodecContext, av.CodecContext.create(self.decoder, "r"))
            context.thread_count = threads  # slice threads at most: frames come out in order
            if self.table.extradata:
                context.extradata = self.table.extradata
            context.options = dict(_DECODER_OPTIONS.get(self.decoder, {}))
            context.open()
        except av.FFmpegError as exc:
            raise DecodeError(
                f"{self.table.name}: cannot open the {self.decoder} decoder for its "
                f"{self.table.codec} ({self.table.fourcc}) track: {exc}"
            ) from exc
        return context


def _decoder_for(codec: str, fourcc: str, name: str) -> str:
    candidates = _DECODERS.get(codec, (codec,))
    for decoder in candidates:
        if decoder in av.codecs_available:
            try:
                av.Codec(decoder, "r")
            except (av.FFmpegError, ValueError):
                continue
            return decoder
    raise DecodeError(
        f"{name}: cannot decode its {codec} ({fourcc}) video: this PyAV build has no "
        f"decoder for it (looked for {', '.join(candidates)})"
    )


_decode_limiter_var: RunVar[anyio.CapacityLimiter] = RunVar("aiostream_hf.video.decode_limiter")


def _decode_limiter() -> anyio.CapacityLimiter:
    """The decode threads of this event loop, shared by every reader: one per core."""
    try:
        return _decode_limiter_var.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(usable_cpus())
        _decode_limiter_var.set(limiter)
        return limiter


def _to_rgb(frames: dict[int, VideoFrame]) -> dict[int, Array]:
    return {s: frame.to_ndarray(format="rgb24") for s, frame in frames.items()}


def _streaming(source: ByteSource) -> StreamSource | None:
    """``source`` when it can stream a range in order (``iter_bytes``), else None."""
    return cast(StreamSource, source) if callable(getattr(source, "iter_bytes", None)) else None


def _coalesce_gap(source: ByteSource) -> int:
    """The gap under which ``source`` merges the ranges of one call into one request (a
    RangeFetcher's ``options.coalesce_gap``); ``_VIDEO_COALESCE_GAP`` for other sources."""
    gap = getattr(getattr(source, "options", None), "coalesce_gap", None)
    return gap if isinstance(gap, int) else _VIDEO_COALESCE_GAP


def _fetch_groups(table: SampleTable, runs: list[_Run], gap: int) -> list[list[int]]:
    """The runs (by position) fetched together: those whose bytes lie closer than
    ``gap``, which one request serves anyway; the others apart, each in its own
    requests. A run that feeds nothing has no bytes."""
    spans: list[tuple[int, int, int]] = []  # first byte, end, run
    empty: list[list[int]] = []
    for i, run in enumerate(runs):
        if run.start > run.end:
            empty.append([i])
            continue
        offsets = table.offset[run.start : run.end + 1]
        ends = offsets + table.size[run.start : run.end + 1]
        spans.append((int(offsets.min()), int(ends.max()), i))
    groups: list[list[int]] = []
    last_end = 0
    for start, end, i in sorted(spans):
        if groups and start - last_end < gap:
            groups[-1].append(i)
            last_end = max(last_end, end)
        else:
            groups.append([i])
            last_end = end
    return [*groups, *empty]


def _stream_spans(table: SampleTable, runs: list[_Run], gap: int) -> list[Span]:
    """The streamed reads of a group of runs: one read goes on through the next range
    while that range starts less than ``gap`` bytes after the read's first byte (bytes
    cheaper than a round trip: the fetcher's ``coalesce_gap``), else the range gets a
    read of its own. Runs decode side by side: one behind a long neighbour in the same
    read waits for all its bytes (at 50 MB/s per connection a thread waited 42 ms on
    2 MB), while small runs each in a read of their own cost a request each (LeRobot's
    two-frame GOPs, shuffled: 125 -> 87.5 items/s). Overlapping spans merge."""
    spans = sorted(span for run in runs for span in merge_spans(_byte_ranges(table, [run]), gap))
    reads: list[Span] = []
    for start, end in spans:
        if reads and (start < reads[-1][1] or start - reads[-1][0] < gap):
            reads[-1] = (reads[-1][0], max(reads[-1][1], end))
        else:
            reads.append((start, end))
    return reads


def _byte_ranges(table: SampleTable, runs: list[_Run]) -> list[tuple[int, int]]:
    """The file ranges of the runs' samples, sorted; touching or overlapping ones merged
    (a sample in two runs gives one range)."""
    samples = np.concatenate(
        [np.arange(r.start, r.end + 1, dtype=np.int64) for r in runs]
        + [np.zeros(0, dtype=np.int64)]
    )
    samples = samples[table.size[samples] > 0]
    if len(samples) == 0:
        return []
    starts = table.offset[samples]
    ends = starts + table.size[samples]
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    ranges: list[tuple[int, int]] = []
    lo, hi = int(starts[0]), int(ends[0])
    for s, e in zip(starts[1:].tolist(), ends[1:].tolist(), strict=True):
        if s <= hi:
            hi = max(hi, e)
        else:
            ranges.append((lo, hi))
            lo, hi = s, e
    ranges.append((lo, hi))
    return ranges


_RUN_START_COST = 3  # a decoder's start and a keyframe, in samples' worth of decoding


def _run_cost(run: _Run) -> int:
    """About how long a run takes to decode, in samples."""
    return max(0, run.end - run.start + 1) + (0 if run.reuse else _RUN_START_COST)


def _no_samples(n: int) -> bytes:
    raise AssertionError(f"sample {n} was not fetched")  # a run fed nothing asks for nothing


def _take_sample(
    table: SampleTable, arrivals: Arrivals, stop: threading.Event, n: int
) -> memoryview:
    if stop.is_set():
        raise Unfinished("the call is ending")
    offset = int(table.offset[n])
    return arrivals.take(offset, offset + int(table.size[n]))


# -- the fallback: the whole file, demuxed by FFmpeg -------------------------------------


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
