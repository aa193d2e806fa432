"""The frames of a ``frames_at`` call from the MP4 index: runs of samples decoded in
threads, with decoder reuse.

Each frame is mapped to the keyframe it is decoded from, and the bytes of those samples
are fetched in ONE round trip: every group of nearby GOPs at once,
streamed in order (``iter_bytes``) from a source that can, else one
``read_ranges`` call. Each run of samples from a keyframe decodes with PyAV in a
worker thread (one thread per core for the process; the runs split between them
so that they end together), and the thread feeds each sample to its decoder as
soon as the sample is in: decoding starts with the first bytes, not the last.
There is no demuxer: ``av.CodecContext`` is fed the samples as packets, with the
codec configuration box of the sample description as extradata.

Decoder state is kept between calls: a call whose frames come after the last one
decoded, and whose keyframe was already fed, continues from there instead of
decoding the group of pictures again.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeAlias, cast

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
from ._exceptions import DecodeError
from ._models import FileRef
from ._mp4 import SampleTable
from ._stalls import run_decode
from .formats import ByteSource, StreamSource
from .formats._split import next_job, split, usable_cpus

# The coalesce_gap of video reads: a reader's own fetcher, sources without one, and
# the head and tail reads of open (closer than this, read as one range).
_VIDEO_COALESCE_GAP = 64 * 1024
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


def _check_length(file: FileRef, start: int, end: int, got: int) -> None:
    """A read of bytes ``[start, end)`` that brought ``got`` bytes: the right number, or
    a DecodeError naming them."""
    if got != end - start:
        raise DecodeError(f"{file.path}: asked for bytes {start}-{end - 1}, got {got} bytes")


# -- one call: fetch the runs' bytes, decode them in threads as they arrive ----------


async def _decode_indexed(
    index: _Indexed,
    positions: list[int],
    source: ByteSource | None,
    file: FileRef,
    count: Callable[[str, int], None],
) -> dict[int, Array]:
    """Fetch and decode the runs that output ``positions``.

    Every group of nearby runs is fetched at once (one round trip): over a source
    that streams (``iter_bytes``, a RangeFetcher) one read per stretch of its bytes
    without a gap of ``coalesce_gap``, cut before a run that would wait for long
    (``_stream_spans``), else one ``read_ranges`` call. Meanwhile the
    decode threads (at most one per core for the whole process) take the runs,
    longest first, each feeding its decoder every sample as soon as it is in.

    ``source`` and ``file``: the reader's; ``count(name, n)`` adds to its statistics.
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
        images.update(await run_decode(_to_rgb, hits, limiter=limiter))

    async def read(arrivals: Arrivals, ranges: list[Span]) -> None:
        try:
            buffers = await source.read_ranges(file, ranges)
            for k, ((start, end), buf) in enumerate(zip(ranges, buffers, strict=True)):
                _check_length(file, start, end, len(buf))
                arrivals.add(k, buf)
                arrived.set()
        finally:
            arrivals.close()  # a thread still waiting for bytes gives up
            count("frame_bytes", arrivals.received())

    async def stream(streams: StreamSource, arrivals: Arrivals, k: int) -> None:
        start, end = arrivals.spans[k]
        try:
            async with streams.iter_bytes(file, start, end, block_size=_STREAM_BLOCK) as blocks:
                async for block in blocks:
                    arrivals.add(k, block)
                    arrived.set()
        finally:
            arrivals.close(k)
            count("frame_bytes", arrivals.received(k))
        _check_length(file, start, end, arrivals.received(k))

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
        await run_decode(decode_runs, w, limiter=limiter)

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
                count("frame_requests", 1)
                await tg.start(guarded, read, arrivals, ranges)
                continue
            count("frame_requests", len(arrivals.spans))
            for k in range(len(arrivals.spans)):
                await tg.start(guarded, stream, streams, arrivals, k)
        tg.start_soon(decode)
    if failures:
        raise failures[0]
    done = [r for r in results if r is not None]
    if len(done) != len(runs):  # cannot be: a thread gave up with nothing raised
        raise DecodeError(f"{file.path}: {len(runs) - len(done)} runs were not decoded")
    if runs:
        index.merge(done)
    else:
        index.state = state
    for result in done:
        images.update(result.images)
        for name, value in result.counts.items():
            count(name, value)
    return {p: images[s] for p, s in zip(positions, samples, strict=True)}
