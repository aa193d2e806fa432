"""Remote frame sampling: ``video.open(...).frames_at`` against PyAV decoding the whole file.

Test videos are encoded here with PyAV (moving gradients and a binary frame-number
stripe, so every frame differs). The oracle is ``av.open(path)``: every frame
decoded in order, the one at the requested pts taken with
``to_ndarray(format="rgb24")``. Every frame the reader returns must be
bit-identical, with the same pts.

A local ``ByteSource`` serves the file and records every range asked for, and which
reads had to wait for others (round trips), so the tests also check the bytes: one
round trip per ``frames_at`` call, and at most 1.5x the bytes of the packets from
each frame's keyframe to the last packet needed to output it (taken from PyAV's
demuxer, not from the code under test).

The test videos are small: ``open`` reads each one whole and serves its frames from
those bytes. Tests of the frame reads themselves use the ``refetch`` fixture, which
makes the reader fetch frames by range as it does for a larger file.

``frames_at`` gives the frame on screen at each time by default (the one with the
largest pts <= t: ``played``), and the nearest frame within ``tolerance_s`` when one
is passed (LeRobot's rule: ``nearest``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
import struct
from collections.abc import AsyncIterator, Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import av
import numpy as np
import pytest

from aiostream_hf import _mp4, _video_decode, _video_index, video
from aiostream_hf._exceptions import (
    ClosedResourceError,
    DecodeError,
    FrameTimestampError,
    RangeMismatchError,
    SourceError,
)
from aiostream_hf._models import FileRef
from aiostream_hf.testing import HubServer, make_repo, make_video

pytestmark = pytest.mark.anyio

W, H = 160, 120


# -- test videos ------------------------------------------------------------------------


def frame_image(i: int, w: int = W, h: int = H) -> np.ndarray[Any, Any]:
    """Frame ``i``: moving gradients and the frame number as a binary stripe."""
    y, x = np.mgrid[0:h, 0:w]
    image = np.stack(
        [(x * 4 + i * 3) % 256, (y * 4 + i * 5) % 256, ((x + y) * 2 + i * 7) % 256], axis=-1
    ).astype(np.uint8)
    for bit in range(8):
        image[0:6, bit * 6 : bit * 6 + 6] = 255 if (i >> bit) & 1 else 0
    return image


@dataclasses.dataclass(frozen=True)
class Spec:
    encoder: str
    frames: int = 120
    options: dict[str, str] = dataclasses.field(default_factory=dict)
    container: dict[str, str] = dataclasses.field(default_factory=dict)
    suffix: str = ".mp4"
    start: int = 0  # pts of the first frame, in frames: >0 makes an empty edit (a delay)
    audio: bool = False
    indexed: bool = True


SPECS: dict[str, Spec] = {
    "h264-gop25-moov-end": Spec("libx264", options={"bf": "2", "g": "25"}),
    "h264-gop25-faststart": Spec(
        "libx264", options={"bf": "2", "g": "25"}, container={"movflags": "faststart"}
    ),
    "h264-gop2": Spec("libx264", options={"bf": "2", "g": "2"}),
    "h264-gop250": Spec("libx264", frames=300, options={"bf": "3", "g": "250"}),
    "h264-delay-audio": Spec(
        "libx264", frames=60, options={"bf": "2", "g": "12"}, start=10, audio=True
    ),
    "h264-negative-cts": Spec(
        "libx264", options={"bf": "2", "g": "25"}, container={"movflags": "negative_cts_offsets"}
    ),
    "h264-no-edit-list": Spec(
        "libx264", frames=60, options={"bf": "2", "g": "25"}, container={"use_editlist": "0"}
    ),
    "hevc-open-gop": Spec("libx265", options={"x265-params": "log-level=error:keyint=25"}),
    "av1": Spec("libsvtav1", frames=90, options={"preset": "12", "svtav1-params": "keyint=30"}),
    "vp9-mp4": Spec("libvpx-vp9", frames=90, options={"deadline": "realtime", "cpu-used": "8"}),
    "vp9-webm": Spec(
        "libvpx-vp9",
        frames=90,
        options={"deadline": "realtime", "cpu-used": "8", "g": "30"},
        suffix=".webm",
        indexed=False,
    ),
    "h264-fragmented": Spec(
        "libx264",
        frames=90,
        options={"bf": "2", "g": "25"},
        container={"movflags": "frag_keyframe+empty_moov"},
        indexed=False,
    ),
}


# Other encoders of the same codec, tried when a spec's encoder is not in this PyAV build.
ALTERNATIVES: dict[str, list[tuple[str, dict[str, str]]]] = {
    "libsvtav1": [
        ("libaom-av1", {"cpu-used": "8", "g": "30", "usage": "realtime"}),
        ("librav1e", {"speed": "10", "g": "30"}),
    ],
}


def has_encoder(name: str) -> bool:
    try:
        av.Codec(name, "w")
    except (av.FFmpegError, ValueError):
        return False
    return True


def encode(path: Path, spec: Spec) -> None:
    if not has_encoder(spec.encoder):
        choices = [(e, o) for e, o in ALTERNATIVES.get(spec.encoder, []) if has_encoder(e)]
        if not choices:
            others = "".join(f", {e}" for e, _ in ALTERNATIVES.get(spec.encoder, []))
            pytest.skip(f"this PyAV build has no {spec.encoder}{others} encoder")
        encoder, options = choices[0]
        spec = dataclasses.replace(spec, encoder=encoder, options=options)
    with av.open(str(path), "w", options=spec.container) as container:
        stream = container.add_stream(spec.encoder, rate=30, options=spec.options)
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        audio = container.add_stream("aac", rate=16000) if spec.audio else None
        samples = 0
        for i in range(spec.frames):
            frame = av.VideoFrame.from_ndarray(frame_image(i), format="rgb24")
            frame.pts, frame.time_base = i + spec.start, Fraction(1, 30)
            container.mux(stream.encode(frame))
            while audio is not None and samples < (i + spec.start + 1) * 16000 // 30:
                tone = np.sin(np.arange(samples, samples + 1024) / 9.0).astype(np.float32)
                chunk = av.AudioFrame.from_ndarray(tone[None, :], format="fltp", layout="mono")
                chunk.sample_rate, chunk.pts, chunk.time_base = 16000, samples, Fraction(1, 16000)
                container.mux(audio.encode(chunk))
                samples += 1024
        container.mux(stream.encode(None))
        if audio is not None:
            container.mux(audio.encode(None))


@dataclasses.dataclass
class Oracle:
    """What PyAV says about a file: its frames by pts, and its packets in decode order."""

    path: Path
    times: list[float]  # frame times in seconds, ascending
    images: dict[float, np.ndarray[Any, Any]]
    packets: list[tuple[int, int, int, bool]]  # pts, pos, size, keyframe (decode order)
    time_base: Fraction
    codec: str
    keyframes: int

    def reference_bytes(self, times: Sequence[float]) -> int:
        """Bytes of the packets from each frame's keyframe to the last one needed to output
        it: the keyframe at or before it in decode order and not shown after it, up to the
        last packet of its GOP shown before it."""
        by_time = {float(p[0] * self.time_base): i for i, p in enumerate(self.packets)}
        needed: set[int] = set()
        for t in times:
            j = by_time[t]
            pts = self.packets[j][0]
            k = max(
                (i for i in range(j + 1) if self.packets[i][3] and self.packets[i][0] <= pts),
                default=0,
            )
            nxt = next((i for i in range(j + 1, len(self.packets)) if self.packets[i][3]), None)
            end = max([j, *(i for i in range(j + 1, nxt or len(self.packets))
                            if self.packets[i][0] < pts)])  # fmt: skip
            needed.update(range(k, end + 1))
        return sum(self.packets[i][2] for i in needed)


def decode_oracle(path: Path) -> Oracle:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.time_base is not None
        time_base = stream.time_base
        codec = stream.codec_context.name
        images = {
            float(f.time): f.to_ndarray(format="rgb24")
            for f in container.decode(stream)
            if f.time is not None
        }
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [
            (p.pts, p.pos, p.size, p.is_keyframe)
            for p in container.demux(stream)
            if p.size and p.pts is not None and p.pos is not None
        ]
    return Oracle(
        path=path,
        times=sorted(images),
        images=images,
        packets=packets,
        time_base=time_base,
        codec=codec,
        keyframes=sum(p[3] for p in packets),
    )


class Videos:
    """The test videos of SPECS, each encoded (and decoded by the oracle) when first used."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.oracles: dict[str, Oracle] = {}

    def __getitem__(self, name: str) -> Oracle:
        if name not in self.oracles:
            path = self.root / f"{name}{SPECS[name].suffix}"
            encode(path, SPECS[name])
            self.oracles[name] = decode_oracle(path)
        return self.oracles[name]


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> Videos:
    return Videos(tmp_path_factory.mktemp("videos"))


async def _round_trip() -> None:
    """The network, for a fake source: a few passes of the scheduler, so that the reads
    a caller starts together all begin before the first one ends, on asyncio (which runs
    tasks in the order they were started) and on trio (which may not)."""
    for _ in range(4):
        await anyio.lowlevel.checkpoint()


class LocalSource:
    """A ByteSource over one local file that records every read asked of it.

    Each read is one round trip: a read that starts after another one ended (it may
    have waited for it) is a round trip later. A read past the end of the file fails
    as an HTTP server's answer would (a shorter range than asked).
    """

    def __init__(self, path: Path) -> None:
        self.data = path.read_bytes()
        self.calls: list[tuple[str, list[tuple[int, int]]]] = []
        self.trips: list[int] = []  # per call: the round trip it is in, from 1
        self._ended: list[int] = []  # indices of the calls that have returned

    async def read_ranges(self, file: FileRef, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        ranges = list(ranges)
        for start, end in ranges:
            assert 0 <= start < end, (start, end)
        assert ranges == sorted(ranges)
        call = self._begin("ranges", ranges)
        await _round_trip()
        self._ended.append(call)
        if ranges[-1][1] > len(self.data):
            raise RangeMismatchError(
                f"{file.url}: asked for bytes up to {ranges[-1][1] - 1}, got up to "
                f"{len(self.data) - 1}",
                url=file.url,
            )
        return [self.data[start:end] for start, end in ranges]

    async def read_tail(self, file: FileRef, n: int) -> tuple[bytes, int]:
        start = max(0, len(self.data) - n)
        call = self._begin("tail", [(start, len(self.data))])
        await _round_trip()
        self._ended.append(call)
        return self.data[start:], len(self.data)

    def _begin(self, kind: str, ranges: list[tuple[int, int]]) -> int:
        self.calls.append((kind, ranges))
        self.trips.append(1 + max((self.trips[i] for i in self._ended), default=0))
        return len(self.calls) - 1

    def since(self, mark: int) -> tuple[int, int]:
        """(round trips, bytes) of the read_ranges calls since ``mark`` calls."""
        calls = self.calls[mark:]
        assert all(kind == "ranges" for kind, _ in calls)
        return self.round_trips(mark), sum(e - s for _, ranges in calls for s, e in ranges)

    def round_trips(self, mark: int = 0) -> int:
        """Round trips of the calls since ``mark`` calls, one after the other."""
        before = max(self.trips[:mark], default=0)
        return max(self.trips[mark:], default=before) - before


def nearest(times: Sequence[float], value: float) -> float:
    return min(times, key=lambda t: abs(t - value))


def played(times: Sequence[float], value: float) -> float:
    """The time of the frame on screen at ``value``: the largest frame time <= it."""
    return max(t for t in times if t <= value)


@pytest.fixture
def refetch() -> Iterator[None]:
    """Frames read by range even from a file that ``open`` read whole (the test files
    are that small): the reads these tests are about. Its own MonkeyPatch, so that a
    test's ``monkeypatch.undo()`` leaves it in place."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(video._Reads, "whole", lambda self: None)
        yield


def assert_frames(oracle: Oracle, frames: video.Frames, times: Sequence[float]) -> None:
    assert frames.data.dtype == np.uint8
    assert frames.data.shape == (len(times), H, W, 3)
    assert frames.pts.tolist() == list(times)
    for got, t in zip(frames.data, times, strict=True):
        assert np.array_equal(got, oracle.images[t]), f"frame at {t}s differs from PyAV's"


# -- frames match PyAV, with bounded bytes -------------------------------------------------


@pytest.mark.usefixtures("refetch")
@pytest.mark.parametrize("name", list(SPECS))
async def test_frames_at_matches_pyav(videos: Videos, name: str) -> None:
    oracle = videos[name]
    t = oracle.times
    n = len(t)
    calls = [
        [t[0]],  # start
        [t[n // 2]],  # middle
        [t[-1]],  # end
        [t[n // 2 + 5], t[3], t[n - 4], t[3], t[n // 3]],  # out of order, repeated, GOPs apart
        [t[30], t[31], t[32]],  # forward within a GOP
        [t[33]],  # forward again: continues the decoder of the call before
        [t[33], t[34]],  # a repeat and the next one
        [t[12] + 3e-5, t[40] - 3e-5],  # between frames: the frame on screen, 12 and 39
        [t[25], t[24], t[26]],  # around a keyframe
        [],
    ]
    source = LocalSource(oracle.path)
    async with video.open(oracle.path, fetcher=source) as reader:
        stats = reader.statistics()
        assert stats.indexed is SPECS[name].indexed
        for times in calls:
            mark = len(source.calls)
            frames = await reader.frames_at(times)
            expected = [played(t, v) for v in times]
            assert_frames(oracle, frames, expected)
            trips, nbytes = source.since(mark)
            if not SPECS[name].indexed:
                assert len(source.calls) == mark  # the whole file was read at open
                continue
            assert trips <= 1, "one round trip per frames_at call"
            if expected:
                reference = oracle.reference_bytes(expected)
                assert nbytes <= 1.5 * reference, (times, nbytes, reference)
        everything = await reader.frames_in_range(0.0, reader.duration)
        assert_frames(oracle, everything, t)
        strict = [t[12] + 3e-5, t[40] - 3e-5]  # LeRobot's rule: the nearest, 12 and 40
        frames = await reader.frames_at(strict, tolerance_s=1e-4)
        assert_frames(oracle, frames, [t[12], t[40]])


@pytest.mark.parametrize("name", ["h264-gop25-moov-end", "hevc-open-gop"])
async def test_a_decoder_is_flushed_and_used_again_for_a_later_run(
    videos: Videos, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Two decode threads, four or five runs (an open GOP's leading frames join two):
    each thread flushes its decoder after a run and starts its next run with it, and
    the frames are still PyAV's. (LeRobot's AV1 items are checked the same way.)"""
    monkeypatch.setattr(_video_decode, "usable_cpus", lambda: 2)
    oracle = videos[name]
    keys = [i for i, (_, _, _, is_key) in enumerate(oracle.packets) if is_key]
    assert len(keys) >= 5
    by_decode = sorted(oracle.times)  # few B-frames: a keyframe's next frames are near it
    times = [by_decode[min(k + 2, len(by_decode) - 1)] for k in keys[:5]]
    async with video.open(oracle.path, fetcher=LocalSource(oracle.path)) as reader:
        assert_frames(oracle, await reader.frames_at(times), times)
        stats = reader.statistics()
        assert stats.decoder_starts >= 4
        assert stats.decoders_created <= 3  # one per thread, and the kept last run's
        assert_frames(oracle, await reader.frames_at(times[::-1]), times[::-1])


@pytest.mark.parametrize("name", list(SPECS))
async def test_metadata(videos: Videos, name: str) -> None:
    oracle = videos[name]
    source = LocalSource(oracle.path)
    async with video.open(oracle.path, fetcher=source) as reader:
        assert reader.frame_count == len(oracle.times)
        assert reader.keyframe_count == oracle.keyframes
        assert (reader.width, reader.height) == (W, H)
        assert reader.pts.tolist() == oracle.times
        assert reader.fps == pytest.approx(30, rel=0.01)
        assert reader.duration == pytest.approx(oracle.times[-1] + 1 / 30, abs=2e-3)
        assert reader.codec == {"libdav1d": "av1"}.get(oracle.codec, oracle.codec)
        stats = reader.statistics()
        assert source.round_trips() == 1  # head and tail at once: here, the whole file
        assert source.calls == [("ranges", [(0, len(source.data))])]
        if stats.indexed:
            assert stats.index_requests == 1
        else:
            assert stats.fallback_reason
            assert stats.index_bytes == len(source.data)


async def test_fetches_only_the_index_then_the_frames(
    videos: Videos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Open reads the head and the tail in one round trip; a frame is then one more."""
    monkeypatch.setattr(_video_index, "HEAD_READ_SIZE", 4096)  # the test files are small
    oracle = videos["h264-gop250"]
    size = oracle.path.stat().st_size
    # and not read whole at open, as a file no longer than the tail read would be
    monkeypatch.setattr(_video_index, "TAIL_READ_SIZE", size - 1)
    tail = video._tail_size(size)
    assert size > 4096 + tail + video._VIDEO_COALESCE_GAP  # so that head and tail are apart
    source = LocalSource(oracle.path)
    async with video.open(oracle.path, fetcher=source) as reader:
        stats = reader.statistics()
        assert source.calls == [("ranges", [(0, 4096), (size - tail, size)])]
        assert source.round_trips() == 1
        assert stats.index_requests == 2  # the head (ftyp, mdat header) and the tail (moov)
        assert stats.index_bytes == 4096 + tail
        mark = len(source.calls)
        frames = await reader.frames_at([oracle.times[100]])
        assert_frames(oracle, frames, [oracle.times[100]])
        assert source.since(mark)[0] == 1
        assert reader.statistics().frame_bytes <= 1.5 * oracle.reference_bytes([oracle.times[100]])

    monkeypatch.setattr(_video_index, "_VIDEO_COALESCE_GAP", 0)  # head and tail apart here too
    path = videos["h264-gop25-faststart"].path
    monkeypatch.setattr(_video_index, "TAIL_READ_SIZE", path.stat().st_size - 1)
    source = LocalSource(path)
    async with video.open(path, fetcher=source) as reader:
        assert source.round_trips() == 1  # moov comes first: the head holds it
        assert reader.statistics().index_requests == 2


async def test_a_moov_larger_than_the_tail(videos: Videos, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_video_index, "HEAD_READ_SIZE", 1024)
    monkeypatch.setattr(_video_index, "TAIL_READ_SIZE", 1024)
    oracle = videos["h264-gop250"]
    source = LocalSource(oracle.path)
    async with video.open(oracle.path, fetcher=source) as reader:
        assert source.round_trips() == 2  # head and tail, then the rest of moov
        assert reader.statistics().index_bytes < len(source.data) / 4
        assert_frames(oracle, await reader.frames_at(oracle.times[::50]), oracle.times[::50])


@pytest.mark.usefixtures("refetch")
async def test_sequential_calls_continue_the_decoder(videos: Videos) -> None:
    """One call per frame through a 250-frame GOP costs about the GOP once, not per frame."""
    oracle = videos["h264-gop250"]
    source = LocalSource(oracle.path)
    async with video.open(oracle.path, fetcher=source) as reader:
        for t in oracle.times[:270]:
            assert_frames(oracle, await reader.frames_at([t]), [t])
        stats = reader.statistics()
    assert stats.decoder_reuses >= 260
    assert stats.decoder_starts <= 3
    all_packets = sum(p[2] for p in oracle.packets[:280])
    assert stats.frame_bytes <= 1.2 * all_packets
    assert stats.frames_returned == 270


@pytest.mark.parametrize("head", [256, 1024])
async def test_small_head_reads(videos: Videos, monkeypatch: pytest.MonkeyPatch, head: int) -> None:
    """A moov larger than the first read, at the end or at the start, is read in pieces."""
    monkeypatch.setattr(_video_index, "HEAD_READ_SIZE", head)
    monkeypatch.setattr(_video_index, "TAIL_READ_SIZE", head)
    monkeypatch.setattr(_video_index, "_VIDEO_COALESCE_GAP", 0)  # head and tail apart
    monkeypatch.setattr(_video_decode, "_VIDEO_COALESCE_GAP", 0)  # and the frames' GOPs
    for name in ["h264-gop25-moov-end", "h264-gop25-faststart"]:
        oracle = videos[name]
        source = LocalSource(oracle.path)
        async with video.open(oracle.path, fetcher=source) as reader:
            assert source.round_trips() == 2  # head and tail; the rest of moov
            assert reader.statistics().index_bytes < len(source.data) / 2
            frames = await reader.frames_at([oracle.times[7], oracle.times[70]])
            assert_frames(oracle, frames, [oracle.times[7], oracle.times[70]])


async def test_unknown_size_moov_at_the_end_is_read_from_the_tail_alone(
    videos: Videos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tail's answer tells the size, and it holds a ``moov`` that ends the file: the
    index needs no head read, one round trip in all (not a byte of the head fetched)."""
    monkeypatch.setattr(_video_index, "TAIL_READ_SIZE", 16 * 1024)
    oracle = videos["h264-gop250"]  # larger than the tail read, which holds moov
    source = LocalSource(oracle.path)
    assert len(source.data) > 4 * 16 * 1024
    file = FileRef(url="https://example.test/clip.mp4", path="clip.mp4")
    async with video.open(file, fetcher=source) as reader:
        assert [kind for kind, _ in source.calls] == ["tail"]
        assert source.round_trips() == 1
        stats = reader.statistics()
        assert (stats.index_requests, stats.index_bytes) == (1, 16 * 1024)
        assert reader.frame_count == len(oracle.times)
        frames = await reader.frames_at(oracle.times[::17])
        assert_frames(oracle, frames, oracle.times[::17])


async def test_unknown_size_moov_elsewhere_reads_the_head_next(
    videos: Videos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A faststart file (``moov`` first) longer than the tail read: the tail holds no
    ``moov`` that ends the file, so the head is read in a second round trip (both at
    once would fetch a small file twice)."""
    monkeypatch.setattr(_video_index, "TAIL_READ_SIZE", 4 * 1024)
    monkeypatch.setattr(_video_index, "HEAD_READ_SIZE", 4 * 1024)
    oracle = videos["h264-gop25-faststart"]
    source = LocalSource(oracle.path)
    assert len(source.data) > 4 * 4 * 1024
    file = FileRef(url="https://example.test/clip.mp4", path="clip.mp4")
    async with video.open(file, fetcher=source) as reader:
        assert [kind for kind, _ in source.calls] == ["tail", "ranges"]
        assert source.calls[1][1] == [(0, 4 * 1024)]  # the head, which holds moov
        assert source.round_trips() == 2
        assert reader.statistics().index_requests == 2
        frames = await reader.frames_at(oracle.times[::17])
        assert_frames(oracle, frames, oracle.times[::17])


def test_moov_in_tail() -> None:
    """``moov`` found from the end: a box whose end, or that of the boxes after it, is the
    end of the file; bytes that only look like a ``moov`` header are passed over."""

    def box(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", 8 + len(payload)) + kind + payload

    moov = box(b"moov", box(b"mvhd", bytes(100)))
    fake = struct.pack(">I", 4096) + b"moov"  # in mdat: its size ends nowhere in particular
    mdat = box(b"mdat", bytes(5000) + fake + bytes(3000))
    for after in [b"", box(b"free", bytes(20)), box(b"free", b"") + box(b"skip", bytes(9))]:
        data = box(b"ftyp", bytes(24)) + mdat + moov + after
        for cut in (0, 100, len(data) - len(moov) - len(after)):
            found = _mp4.moov_in_tail(data[cut:], cut, len(data))
            assert found is not None
            assert (found.type, found.start, found.end) == (
                "moov",
                len(data) - len(moov) - len(after),
                len(data) - len(after),
            )
        tail = len(data) - len(moov) - len(after) + 1  # moov's header not whole in the tail
        assert _mp4.moov_in_tail(data[tail:], tail, len(data)) is None
    data = box(b"ftyp", bytes(24)) + mdat + moov + b"junk!"  # moov does not end the file
    assert _mp4.moov_in_tail(data, 0, len(data)) is None
    with pytest.raises(ValueError, match="do not end"):
        _mp4.moov_in_tail(data[:10], 0, len(data))


async def test_a_tail_that_only_looks_like_moov_falls_back_to_the_head(
    videos: Videos, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A ``free`` box before ``moov`` holds bytes that read as a ``moov`` header ending the
    file: it does not parse, so the box walk from the head finds the real one."""
    oracle = videos["h264-gop250"]
    data = oracle.path.read_bytes()
    top = _boxes(data, 0, len(data))
    assert [k for k, _ in top][-1] == "moov"
    moov_at = len(data) - len(top[-1][1]) - 8
    decoy_rest = b"moov" + b"\xff" * 8  # a child box larger than its parent: corrupt
    free_size = 8 + 8 + 4 + len(decoy_rest)
    decoy_size = free_size - 16 + len(data) - moov_at  # from the decoy to the end of the file
    free = struct.pack(">I", free_size) + b"free" + bytes(8)
    free += struct.pack(">I", decoy_size) + decoy_rest
    path = tmp_path / "decoy.mp4"
    path.write_bytes(data[:moov_at] + free + data[moov_at:])
    monkeypatch.setattr(_video_index, "TAIL_READ_SIZE", len(data) - moov_at + 4096)
    source = LocalSource(path)
    file = FileRef(url="https://example.test/decoy.mp4", path="decoy.mp4")
    found = _mp4.moov_in_tail(source.data[1000:], 1000, len(source.data))
    assert found is not None
    assert found.start == moov_at + 16  # the decoy
    async with video.open(file, fetcher=source) as reader:
        assert [kind for kind, _ in source.calls][:2] == ["tail", "ranges"]
        assert reader.frame_count == len(oracle.times)
        frames = await reader.frames_at(oracle.times[::23])
        assert_frames(oracle, frames, oracle.times[::23])


@pytest.mark.parametrize("head", [64 * 1024, 512 * 1024])
async def test_unknown_size_of_a_file_shorter_than_the_tail_read_is_fetched_once(
    videos: Videos, monkeypatch: pytest.MonkeyPatch, head: int
) -> None:
    """The tail read holds the whole file: no head read, no byte fetched twice, and the
    frames need no request (whether or not the file is shorter than the head read)."""
    monkeypatch.setattr(_video_index, "HEAD_READ_SIZE", head)
    oracle = videos["h264-gop25-moov-end"]
    source = LocalSource(oracle.path)
    assert len(source.data) < video.TAIL_READ_SIZE
    file = FileRef(url="https://example.test/clip.mp4", path="clip.mp4")
    async with video.open(file, fetcher=source) as reader:
        assert [kind for kind, _ in source.calls] == ["tail"]
        assert reader.statistics().index_bytes == len(source.data)
        calls = len(source.calls)
        assert_frames(oracle, await reader.frames_at(oracle.times[::9]), oracle.times[::9])
        assert len(source.calls) == calls


@pytest.mark.usefixtures("refetch")
async def test_runs_decode_as_their_bytes_arrive(
    videos: Videos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GOPs of one call decode in parallel, each as soon as its bytes are in: the last
    GOP's bytes arrive only after the first GOP has decoded."""
    monkeypatch.setattr(_video_decode, "_VIDEO_COALESCE_GAP", 0)  # one read per GOP
    monkeypatch.setattr(_video_decode, "usable_cpus", lambda: 2)  # one thread waits, one decodes
    oracle = videos["h264-gop25-moov-end"]
    decoded = anyio.Event()
    decode_run = video._Indexed.decode_run

    def traced(self: Any, run: Any, *args: Any, **kwargs: Any) -> Any:
        result = decode_run(self, run, *args, **kwargs)
        if run.key == 0:
            anyio.from_thread.run_sync(decoded.set)
        return result

    monkeypatch.setattr(video._Indexed, "decode_run", traced)

    class Late(LocalSource):
        async def read_ranges(
            self, file: FileRef, ranges: Sequence[tuple[int, int]]
        ) -> list[bytes]:
            if ranges[0][0] >= last_gop:
                await decoded.wait()
            return await super().read_ranges(file, ranges)

    last_gop = oracle.packets[100][1]  # where the keyframe of the last GOP lies
    assert oracle.packets[100][3]
    source = Late(oracle.path)
    times = [oracle.times[3], oracle.times[60], oracle.times[110]]
    async with video.open(oracle.path, fetcher=source) as reader:
        mark = len(source.calls)
        with anyio.fail_after(30):
            frames = await reader.frames_at(times)
        assert_frames(oracle, frames, times)
        assert reader.statistics().frame_requests == 3
        assert reader.statistics().decoder_starts == 3
        assert source.since(mark)[0] == 2  # the last read waited: a round trip later

    monkeypatch.undo()  # nearby GOPs are read together
    async with video.open(oracle.path, fetcher=LocalSource(oracle.path)) as reader:
        assert_frames(oracle, await reader.frames_at(times), times)
        assert reader.statistics().frame_requests == 1
        assert reader.statistics().decoder_starts == 3


class StreamingSource(LocalSource):
    """A LocalSource that also streams ranges (``iter_bytes``), in blocks, like the
    fetcher. ``hold(at)`` is awaited before the block at byte ``at`` of the streamed range."""

    block = 4096

    async def hold(self, at: int) -> None:
        await anyio.lowlevel.checkpoint()

    @contextlib.asynccontextmanager
    async def _blocks(self, start: int, end: int) -> AsyncIterator[AsyncIterator[bytes]]:
        call = self._begin("stream", [(start, end)])

        async def blocks() -> AsyncIterator[bytes]:
            for at in range(start, end, self.block):
                await self.hold(at - start)
                yield self.data[at : min(end, at + self.block)]

        try:
            yield blocks()
        finally:
            self._ended.append(call)

    def iter_bytes(
        self,
        file: FileRef,
        start: int = 0,
        end: int | None = None,
        *,
        block_size: int | None = None,
    ) -> Any:
        return self._blocks(start, len(self.data) if end is None else end)


def trace_decode_starts(monkeypatch: pytest.MonkeyPatch) -> anyio.Event:
    """An event set when a decode thread starts a run."""
    started = anyio.Event()
    decode_run = video._Indexed.decode_run

    def traced(self: Any, run: Any, *args: Any, **kwargs: Any) -> Any:
        anyio.from_thread.run_sync(started.set)
        return decode_run(self, run, *args, **kwargs)

    monkeypatch.setattr(video._Indexed, "decode_run", traced)
    return started


@pytest.mark.usefixtures("refetch")
async def test_a_streamed_run_decodes_while_its_bytes_arrive(
    videos: Videos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a source that streams, a run starts decoding once its first sample is in:
    the rest of its bytes come only after its decoder has started."""
    oracle = videos["h264-gop250"]
    started = trace_decode_starts(monkeypatch)

    class Gated(StreamingSource):
        async def hold(self, at: int) -> None:
            if at > oracle.packets[0][2]:  # the keyframe is in: wait for its decoder
                await started.wait()

    source = Gated(oracle.path)
    times = [oracle.times[200]]
    async with video.open(oracle.path, fetcher=source) as reader:
        mark = len(source.calls)
        with anyio.fail_after(30):
            frames = await reader.frames_at(times)
        assert_frames(oracle, frames, times)
        assert [kind for kind, _ in source.calls[mark:]] == ["stream"]
        rounds, fetched = source.round_trips(mark), source.calls[mark][1][0]
        assert rounds == 1
        assert fetched[1] - fetched[0] <= 1.5 * oracle.reference_bytes(times)
        assert reader.statistics().frame_bytes == fetched[1] - fetched[0]


@pytest.mark.usefixtures("refetch")
async def test_the_longest_run_is_requested_first(
    videos: Videos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests go out longest run first: a server answers roughly in order, and the
    decode threads start with the longest runs."""
    monkeypatch.setattr(_video_decode, "_VIDEO_COALESCE_GAP", 0)  # one read per GOP
    oracle = videos["h264-gop25-moov-end"]
    times = [oracle.times[2], oracle.times[60], oracle.times[110]]  # runs of 3, 11, 11
    source = StreamingSource(oracle.path)
    async with video.open(oracle.path, fetcher=source) as reader:
        mark = len(source.calls)
        assert_frames(oracle, await reader.frames_at(times), times)
    starts = [ranges[0][0] for _, ranges in source.calls[mark:]]
    first_gop = oracle.packets[0][1]
    assert len(starts) == 3
    assert starts[-1] == first_gop  # the short run's read goes last


@pytest.mark.usefixtures("refetch")
async def test_nearby_runs_share_a_streamed_read_only_while_it_is_short(
    videos: Videos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nearby GOPs stream through one read while the next starts less than coalesce_gap
    into it (small runs: a request each would cost more); past it, the next run comes
    over a read of its own, side by side, instead of waiting for its neighbour's bytes."""
    oracle = videos["h264-gop25-moov-end"]
    times = [oracle.times[3], oracle.times[60], oracle.times[110]]

    async def streamed() -> tuple[list[tuple[int, int]], Any]:
        source = StreamingSource(oracle.path)
        async with video.open(oracle.path, fetcher=source) as reader:
            mark = len(source.calls)
            assert_frames(oracle, await reader.frames_at(times), times)
            stats = reader.statistics()
        reads = sorted(ranges[0] for kind, ranges in source.calls[mark:] if kind == "stream")
        assert len(reads) == stats.frame_requests
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(reads))  # no byte twice
        assert stats.frame_bytes == sum(end - start for start, end in reads)
        assert stats.decoder_starts == 3
        return reads, stats

    reads, _ = await streamed()
    span = reads[-1][1] - reads[0][0]
    monkeypatch.setattr(_video_decode, "_VIDEO_COALESCE_GAP", span + 1)
    reads, _ = await streamed()
    assert len(reads) == 1  # every run starts within the gap: one read
    monkeypatch.setattr(_video_decode, "_VIDEO_COALESCE_GAP", span // 2)  # the last run is past it
    reads, _ = await streamed()
    assert 2 <= len(reads) <= 3
    assert reads[-1][0] - reads[0][0] >= span // 2


@pytest.mark.usefixtures("refetch")
async def test_streamed_reads_give_the_frames_of_read_ranges(videos: Videos) -> None:
    """Streamed and whole reads decode to the same frames, one request per group of GOPs."""
    for name in ("h264-gop25-moov-end", "h264-delay-audio", "h264-gop2"):
        oracle = videos[name]
        times = oracle.times[::7]
        async with video.open(oracle.path, fetcher=StreamingSource(oracle.path)) as reader:
            assert_frames(oracle, await reader.frames_at(times), times)
            assert_frames(oracle, await reader.frames_at(times[::-1]), times[::-1])


@pytest.mark.usefixtures("refetch")
async def test_a_stream_that_breaks_or_stops_short(
    videos: Videos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that fails mid-way, once its run's decoder has started, is raised as it was;
    one that ends short is a DecodeError naming the bytes. The decode thread waiting for
    the rest gives up: nothing hangs, and the reader goes on."""
    oracle = videos["h264-gop250"]
    times = [oracle.times[290]]  # from the second keyframe
    key = next(size for _, _, size, is_key in oracle.packets[1:] if is_key)

    class Broken(StreamingSource):
        mode = "raise"

        async def hold(self, at: int) -> None:
            if self.mode and at > key:  # the keyframe is in: its run is decoding
                await started.wait()
                if self.mode == "raise":
                    raise RangeMismatchError("https://x.test/clip.mp4: the body broke")
                raise _Short

    class _Short(Exception):
        pass

    source = Broken(oracle.path)
    original = source._blocks

    @contextlib.asynccontextmanager
    async def short(start: int, end: int) -> AsyncIterator[AsyncIterator[bytes]]:
        async with original(start, end) as blocks:

            async def until_cut() -> AsyncIterator[bytes]:
                try:
                    async for block in blocks:
                        yield block
                except _Short:
                    return

            yield until_cut()

    source._blocks = short  # type: ignore[method-assign]
    async with video.open(oracle.path, fetcher=source) as reader:
        started = trace_decode_starts(monkeypatch)
        with anyio.fail_after(30), pytest.raises(RangeMismatchError, match="the body broke"):
            await reader.frames_at(times)
        source.mode = "short"
        started = trace_decode_starts(monkeypatch)
        with anyio.fail_after(30), pytest.raises(DecodeError, match=r"asked for bytes \d+-\d+"):
            await reader.frames_at(times)
        source.mode = ""
        assert_frames(oracle, await reader.frames_at(times), times)


@pytest.mark.usefixtures("refetch")
async def test_cancelled_while_a_thread_waits_for_bytes(
    videos: Videos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling a call whose decode thread waits for bytes that are not coming ends it
    at once, and the reader still works."""
    oracle = videos["h264-gop250"]
    times = [oracle.times[290]]
    key = next(size for _, _, size, is_key in oracle.packets[1:] if is_key)
    started = trace_decode_starts(monkeypatch)

    class Stalled(StreamingSource):
        stall = True

        async def hold(self, at: int) -> None:
            if self.stall and at > key:
                await anyio.sleep_forever()

    source = Stalled(oracle.path)
    async with video.open(oracle.path, fetcher=source) as reader:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader.frames_at, times)
                await started.wait()
                await anyio.sleep(0.05)  # the decode thread is waiting for the bytes now
                tg.cancel_scope.cancel()
        source.stall = False
        assert_frames(oracle, await reader.frames_at(times), times)


@pytest.mark.usefixtures("refetch")
async def test_read_errors_come_through_as_raised(videos: Videos) -> None:
    """A failed read is raised as it is, not inside an exception group, and the reader
    goes on after it."""
    oracle = videos["h264-gop25-moov-end"]

    class Broken(LocalSource):
        broken = True

        async def read_tail(self, file: FileRef, n: int) -> tuple[bytes, int]:
            if self.broken:
                raise RangeMismatchError(f"{file.url}: tail broke", url=file.url)
            return await super().read_tail(file, n)

        async def read_ranges(
            self, file: FileRef, ranges: Sequence[tuple[int, int]]
        ) -> list[bytes]:
            if self.broken and self.calls:
                raise RangeMismatchError(f"{file.url}: ranges broke", url=file.url)
            return await super().read_ranges(file, ranges)

    file = FileRef(url="https://example.test/clip.mp4", path="clip.mp4")
    with pytest.raises(RangeMismatchError, match="tail broke"):
        async with video.open(file, fetcher=Broken(oracle.path)):
            pass
    source = Broken(oracle.path)
    times = [oracle.times[3], oracle.times[60], oracle.times[110]]
    async with video.open(oracle.path, fetcher=source) as reader:
        with pytest.raises(RangeMismatchError, match="ranges broke"):
            await reader.frames_at(times)
        source.broken = False
        assert_frames(oracle, await reader.frames_at(times), times)


@pytest.mark.usefixtures("refetch")
async def test_concurrent_calls_on_one_reader(videos: Videos) -> None:
    oracle = videos["h264-gop25-moov-end"]
    results: dict[int, video.Frames] = {}
    asks = {i: oracle.times[i * 9 : i * 9 + 4] for i in range(8)}
    async with video.open(oracle.path, fetcher=LocalSource(oracle.path)) as reader:

        async def ask(i: int) -> None:
            results[i] = await reader.frames_at(asks[i])

        async with anyio.create_task_group() as tg:
            for i in asks:
                tg.start_soon(ask, i)
    for i, times in asks.items():
        assert_frames(oracle, results[i], times)


async def test_frames_in_range(videos: Videos) -> None:
    oracle = videos["hevc-open-gop"]
    t = oracle.times
    async with video.open(oracle.path, fetcher=LocalSource(oracle.path)) as reader:
        assert_frames(oracle, await reader.frames_in_range(t[20], t[40]), t[20:40])
        assert_frames(oracle, await reader.frames_in_range(t[5] - 0.001, t[6]), [t[5]])
        empty = await reader.frames_in_range(t[5] + 0.001, t[5] + 0.002)
        assert empty.data.shape == (0, H, W, 3)
        assert len(empty) == 0


# -- the MP4 parser on rewritten index boxes ---------------------------------------------


def _boxes(data: bytes, start: int, end: int) -> list[tuple[str, bytes]]:
    out = []
    while start < end:
        size, kind = struct.unpack_from(">I4s", data, start)
        out.append((kind.decode("latin-1"), data[start + 8 : start + size]))
        start += size
    return out


_NESTED = {"moov", "trak", "mdia", "minf", "stbl", "edts"}


def _rewrite(kind: str, payload: bytes) -> bytes:
    """One box, with stco turned into co64 and stsz into 16-bit stz2, inside containers."""
    if kind in _NESTED:
        inner = b"".join(_rewrite(k, p) for k, p in _boxes(payload, 0, len(payload)))
        return struct.pack(">I4s", 8 + len(inner), kind.encode()) + inner
    if kind == "stco":
        (count,) = struct.unpack_from(">I", payload, 4)
        offsets = struct.unpack_from(f">{count}I", payload, 8)
        kind, payload = "co64", payload[:8] + struct.pack(f">{count}Q", *offsets)
    elif kind == "stsz":
        uniform, count = struct.unpack_from(">II", payload, 4)
        sizes = struct.unpack_from(f">{count}I", payload, 12)
        assert uniform == 0
        assert max(sizes) < 65536
        kind = "stz2"
        payload = payload[:4] + struct.pack(">I", 16) + struct.pack(f">I{count}H", count, *sizes)
    return struct.pack(">I4s", 8 + len(payload), kind.encode()) + payload


async def test_co64_and_stz2(videos: Videos, tmp_path: Path) -> None:
    oracle = videos["h264-delay-audio"]  # moov at the end, two tracks
    data = oracle.path.read_bytes()
    top = _boxes(data, 0, len(data))
    assert [k for k, _ in top][-1] == "moov"
    rewritten = data[: len(data) - len(top[-1][1]) - 8] + _rewrite("moov", top[-1][1])
    assert b"co64" in rewritten
    assert b"stz2" in rewritten
    path = tmp_path / "co64.mp4"
    path.write_bytes(rewritten)
    before = _mp4.parse_moov(data[len(data) - len(top[-1][1]) - 8 :], "a")
    after = _mp4.parse_moov(rewritten[len(data) - len(top[-1][1]) - 8 :], "b")
    assert isinstance(before, _mp4.SampleTable)
    assert isinstance(after, _mp4.SampleTable)
    for column in ("offset", "size", "dts", "pts", "is_key", "shown"):
        assert np.array_equal(getattr(before, column), getattr(after, column)), column
    async with video.open(path, fetcher=LocalSource(path)) as reader:
        frames = await reader.frames_at(oracle.times[::5])
        assert_frames(oracle, frames, oracle.times[::5])


@pytest.mark.parametrize("skip", [5 * 512, 5 * 512 + 100])
async def test_edit_list_that_hides_frames(videos: Videos, tmp_path: Path, skip: int) -> None:
    """An edit starting mid-GOP (as ``ffmpeg -ss ... -c copy`` writes): the frames before
    it are decoded, never shown, and the first shown frame is at 0."""
    data = bytearray(videos["h264-gop25-moov-end"].path.read_bytes())
    elst = data.index(b"elst")
    version, count, duration, media_time = struct.unpack_from(">B3xIIi", data, elst + 4)
    assert (version, count) == (0, 1)
    struct.pack_into(">i", data, elst + 16, media_time + skip)  # 512 ticks per frame
    path = tmp_path / f"trimmed-{skip}.mp4"
    path.write_bytes(bytes(data))
    oracle = decode_oracle(path)
    assert len(oracle.times) < SPECS["h264-gop25-moov-end"].frames
    assert oracle.times[0] == 0.0
    async with video.open(path, fetcher=LocalSource(path)) as reader:
        assert reader.frame_count == len(oracle.times)
        assert_frames(oracle, await reader.frames_in_range(0.0, reader.duration), oracle.times)
    async with video.open(path, fetcher=LocalSource(path)) as reader:
        times = [oracle.times[i] for i in (0, 1, 20, 2, 60)]
        assert_frames(oracle, await reader.frames_at(times), times)


def test_parser_matches_pyav_demuxer(videos: Videos) -> None:
    for name, spec in SPECS.items():
        if not spec.indexed:
            continue
        oracle = videos[name]
        data = oracle.path.read_bytes()
        pos = 0
        while True:
            box = _mp4.read_box_header(data[pos : pos + 16], pos, len(data), name)
            if box.type == "moov":
                break
            pos = box.end
        table = _mp4.parse_moov(data[box.start : box.end], name)
        assert isinstance(table, _mp4.SampleTable)
        assert table.offset.tolist() == [p[1] for p in oracle.packets], name
        assert table.size.tolist() == [p[2] for p in oracle.packets], name
        assert table.pts.tolist() == [p[0] for p in oracle.packets], name
        assert table.is_key.tolist() == [p[3] for p in oracle.packets], name
        with av.open(str(oracle.path)) as container:
            assert table.extradata == container.streams.video[0].codec_context.extradata


# -- fallback, errors -----------------------------------------------------------------


async def test_not_a_video(tmp_path: Path) -> None:
    for name, content in [("notes.mp4", b"hello, this is text, not a video\n" * 100),
                          ("empty.mp4", b"")]:  # fmt: skip
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(DecodeError, match=name):
            async with video.open(path, fetcher=LocalSource(path)):
                pass


async def test_truncated_mp4(videos: Videos, tmp_path: Path) -> None:
    data = videos["h264-gop25-moov-end"].path.read_bytes()
    path = tmp_path / "cut.mp4"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DecodeError, match=r"cut\.mp4.*(truncated|moov)"):
        async with video.open(path, fetcher=LocalSource(path)):
            pass


def _replaced(kind: str, payload: bytes, new: dict[str, bytes]) -> bytes:
    """One box, with the payloads of the boxes named in ``new`` replaced, inside containers."""
    if kind in _NESTED:
        inner = b"".join(_replaced(k, p, new) for k, p in _boxes(payload, 0, len(payload)))
        return struct.pack(">I4s", 8 + len(inner), kind.encode()) + inner
    payload = new.get(kind, payload)
    return struct.pack(">I4s", 8 + len(payload), kind.encode()) + payload


def _same_sample_offsets(data: bytes, *, empty_after_first: bool) -> bytes:
    """A moov-at-end file with one sample per chunk, every chunk at the first sample's
    offset, and every sample after the first made empty when ``empty_after_first``."""
    top = _boxes(data, 0, len(data))
    assert top[-1][0] == "moov"
    moov_at = len(data) - len(top[-1][1]) - 8
    table = _mp4.parse_moov(data[moov_at:], "original")
    assert isinstance(table, _mp4.SampleTable)
    n = table.sample_count
    full = bytes(4)  # version and flags
    sizes = [int(table.size[0])] + [0 if empty_after_first else int(s) for s in table.size[1:]]
    new = {
        "stsc": full + struct.pack(">IIII", 1, 1, 1, 1),
        "stco": full + struct.pack(f">I{n}I", n, *[int(table.offset[0])] * n),
        "stsz": full + struct.pack(f">II{n}I", 0, n, *sizes),
    }
    return data[:moov_at] + _replaced("moov", top[-1][1], new)


async def test_samples_that_overlap_are_refused(videos: Videos, tmp_path: Path) -> None:
    """Chunks that all point at the same bytes: a small file whose frames would feed the
    decoder the same bytes again and again. Refused at open, naming the samples."""
    data = videos["h264-gop25-moov-end"].path.read_bytes()
    path = tmp_path / "overlap.mp4"
    path.write_bytes(_same_sample_offsets(data, empty_after_first=False))
    with pytest.raises(DecodeError) as caught:
        async with video.open(path, fetcher=LocalSource(path)):
            pass
    message = str(caught.value)
    assert "overlap.mp4: corrupt MP4: samples 0 and " in message
    assert "of the video track overlap" in message
    assert "re-encode" in message


def test_empty_samples_may_share_an_offset(videos: Videos) -> None:
    """Empty samples hold no bytes: where they point (inside another sample) is allowed."""
    data = videos["h264-gop25-moov-end"].path.read_bytes()
    data = _same_sample_offsets(data, empty_after_first=True)
    top = _boxes(data, 0, len(data))
    assert top[-1][0] == "moov"
    table = _mp4.parse_moov(data[len(data) - len(top[-1][1]) - 8 :], "empty", len(data))
    assert isinstance(table, _mp4.SampleTable)
    assert np.count_nonzero(table.size) == 1
    assert table.frame_count == 1
    assert np.count_nonzero(table.offset == table.offset[0]) > 1  # inside sample 0


@pytest.mark.parametrize("extra", [0, 1])
async def test_the_walk_to_moov_stops_after_max_top_level_boxes(
    videos: Videos, tmp_path: Path, extra: int
) -> None:
    """8-byte ``free`` boxes before ``moov``: with ``moov`` the MAX_TOP_LEVEL_BOXES-th
    top-level box, the file is read; one box more and it is refused, naming the limit."""
    oracle = videos["h264-gop25-moov-end"]
    data = oracle.path.read_bytes()
    top = _boxes(data, 0, len(data))
    assert top[-1][0] == "moov"
    moov_at = len(data) - len(top[-1][1]) - 8
    frees = _mp4.MAX_TOP_LEVEL_BOXES - len(top) + extra  # moov is box MAX + extra
    path = tmp_path / "frees.mp4"
    path.write_bytes(data[:moov_at] + struct.pack(">I4s", 8, b"free") * frees + data[moov_at:])
    if extra:
        with pytest.raises(DecodeError) as caught:
            async with video.open(path, fetcher=LocalSource(path)):
                pass
        message = str(caught.value)
        assert "frees.mp4: corrupt or unusual MP4: no moov box among its first 10000" in message
        assert "MAX_TOP_LEVEL_BOXES" in message
        assert "-movflags faststart" in message
        return
    async with video.open(path, fetcher=LocalSource(path)) as reader:
        times = [oracle.times[i] for i in (0, 40, 119)]
        assert_frames(oracle, await reader.frames_at(times), times)
        assert reader.statistics().index_requests == 1  # read whole: every hop in memory


async def test_index_reads_join_and_fill_holes_between_many_buffers(tmp_path: Path) -> None:
    """The reads kept at open, in any order: bytes across them are joined, and only the
    holes between them are read."""
    path = tmp_path / "bytes.bin"
    blob = bytes(range(256)) * 64
    path.write_bytes(blob)
    source = LocalSource(path)
    file = FileRef(url="https://example.test/bytes.bin", path="bytes.bin", size=len(blob))
    reads = video._Reads(file, source, len(blob), {})
    for start in (3000, 100, 2000, 1000):  # 100 bytes each, out of order
        reads.add(start, blob[start : start + 100])
    assert reads.starts == [100, 1000, 2000, 3000]
    assert reads.holes(150, 2050) == [(200, 1000), (1100, 2000)]
    assert await reads.get(1010, 1090) == blob[1010:1090]
    assert source.calls == []
    assert await reads.get(150, 2050) == blob[150:2050]
    assert source.calls == [("ranges", [(200, 1000), (1100, 2000)])]
    assert reads.holes(100, 2100) == []
    assert await reads.get(4000, 4016, hop=True) == blob[4000:4016]
    assert source.calls[-1] == ("ranges", [(4000, len(blob))])  # up to HEAD_READ_SIZE


async def test_codec_pyav_cannot_decode(videos: Videos, tmp_path: Path) -> None:
    data = videos["h264-gop25-faststart"].path.read_bytes()
    path = tmp_path / "zzzz.mp4"
    path.write_bytes(data.replace(b"avc1", b"zzzz"))
    with pytest.raises(DecodeError, match=r"zzzz\.mp4: cannot decode its video codec 'zzzz'"):
        async with video.open(path, fetcher=LocalSource(path)):
            pass


async def test_missing_decoder(videos: Videos, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(video._DECODERS, "h264", ("no-such-decoder",))
    path = videos["h264-gop2"].path
    with pytest.raises(DecodeError, match=r"h264-gop2\.mp4.*h264"):
        async with video.open(path, fetcher=LocalSource(path)):
            pass


async def test_played_at_is_the_frame_on_screen(videos: Videos) -> None:
    """The default rule: the frame whose [pts, next pts) holds the time (the last frame's
    interval ends at ``duration``), with no tolerance to pass."""
    oracle = videos["h264-gop25-moov-end"]
    t = oracle.times
    async with video.open(oracle.path, fetcher=LocalSource(oracle.path)) as reader:
        end = reader.duration
        assert end == pytest.approx(t[-1] + 1 / 30, abs=2e-3)
        cases = [
            ((t[10] + t[11]) / 2, t[10]),  # between two frames
            (t[11], t[11]),  # exactly on a frame
            (float(np.nextafter(t[11], 0.0)), t[10]),  # just before it
            (t[0], t[0]),  # the first frame, from its pts
            (t[-1], t[-1]),  # the last frame's interval, from its pts ...
            ((t[-1] + end) / 2, t[-1]),
            (float(np.nextafter(end, 0.0)), t[-1]),  # ... to just before the end
            (t[11] + 1e-6, t[11]),  # repeats and any order
            (t[3], t[3]),
        ]
        frames = await reader.frames_at([at for at, _ in cases])
        assert_frames(oracle, frames, [want for _, want in cases])
        valid = f"[{t[0]!r}, {end!r})"
        for bad, where in [
            (float(np.nextafter(t[0], -1.0)), "before the first frame"),
            (-0.5, "before the first frame"),
            (end, "at or after the end of the last frame"),
            (end + 0.25, "at or after the end of the last frame"),
            (float("nan"), "not a number"),
        ]:
            with pytest.raises(FrameTimestampError) as caught:
                await reader.frames_at([t[5], bad])
            message = str(caught.value)
            assert oracle.path.name in message
            assert repr(bad) in message
            assert where in message
            assert valid in message, message

    delayed = videos["h264-delay-audio"]  # an empty edit: the first frame is shown late
    first = delayed.times[0]
    assert first > 0
    async with video.open(delayed.path, fetcher=LocalSource(delayed.path)) as reader:
        assert_frames(delayed, await reader.frames_at([first]), [first])
        with pytest.raises(FrameTimestampError, match="before the first frame"):
            await reader.frames_at([first / 2])


def frame_played_by_pyav(path: Path, at: float) -> tuple[float, np.ndarray[Any, Any]]:
    """PyAV's decode of ``path``: the time and pixels of the frame with the largest pts
    <= ``at``."""
    best: tuple[float, np.ndarray[Any, Any]] | None = None
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            if (
                frame.time is not None
                and frame.time <= at
                and (best is None or frame.time > best[0])
            ):
                best = (float(frame.time), frame.to_ndarray(format="rgb24"))
    assert best is not None
    return best


@pytest.mark.parametrize(
    ("suffix", "encoder", "options"),
    [
        (".mp4", "libx264", {"g": "15", "bf": "2"}),
        (".webm", "libvpx-vp9", {"deadline": "realtime", "cpu-used": "8", "g": "15"}),
    ],
)
async def test_frames_at_a_time_between_frames(
    tmp_path: Path, suffix: str, encoder: str, options: dict[str, str]
) -> None:
    """1.23 s lies between frames (30 fps; a WebM's pts are whole milliseconds): with no
    options, the frame on screen then, bit-identical to PyAV's; the strict rule raises."""
    if not has_encoder(encoder):
        pytest.skip(f"this PyAV build has no {encoder} encoder")
    path = make_video(
        tmp_path / f"clip{suffix}", frames=60, width=W, height=H, encoder=encoder, options=options
    )
    when, pixels = frame_played_by_pyav(path, 1.23)
    assert when == pytest.approx(1.2, abs=1e-3)
    async with video.open(path) as reader:
        frames = await reader.frames_at([1.23])
        assert frames.pts.tolist() == [when]
        assert np.array_equal(frames.data[0], pixels)
        assert reader.statistics().indexed is (suffix == ".mp4")
        with pytest.raises(FrameTimestampError, match=r"tolerance_s=0\.0001 of timestamp 1\.23s"):
            await reader.frames_at([1.23], tolerance_s=1e-4)


async def test_strict_rule_timestamp_errors(videos: Videos) -> None:
    """``tolerance_s`` selects LeRobot's rule: the nearest frame, which must lie within it."""
    oracle = videos["h264-gop25-moov-end"]
    t = oracle.times
    async with video.open(oracle.path, fetcher=LocalSource(oracle.path)) as reader:
        for bad in (-0.5, reader.duration + 0.25, float("nan")):
            with pytest.raises(FrameTimestampError, match=rf"{oracle.path.name}.*{bad!r}"):
                await reader.frames_at([t[0], bad], tolerance_s=1e-4)
        between = (t[10] + t[11]) / 2
        with pytest.raises(FrameTimestampError) as caught:
            await reader.frames_at([t[3], between], tolerance_s=1e-4)
        message = str(caught.value)
        assert oracle.path.name in message
        assert repr(between) in message
        assert repr(t[10]) in message
        frames = await reader.frames_at([between], tolerance_s=0.02)
        assert_frames(oracle, frames, [t[10]])
        frames = await reader.frames_at([t[11] - 0.01], tolerance_s=0.02)  # nearest: after
        assert_frames(oracle, frames, [t[11]])
        for wrong in (-1.0, float("nan"), True):
            with pytest.raises(SourceError, match="tolerance_s"):
                await reader.frames_at([t[0]], tolerance_s=wrong)
        with pytest.raises(FrameTimestampError, match="outside"):
            await reader.frames_in_range(0.0, reader.duration + 1)
        with pytest.raises(SourceError, match="one-dimensional"):
            await reader.frames_at([[0.0]])  # type: ignore[list-item]
        for odd, said in ((float("nan"), "nan (not a number)"), (float("inf"), "inf (infinite)")):
            with pytest.raises(FrameTimestampError, match=re.escape(f"timestamp {said} is")):
                await reader.frames_at([odd])
            with pytest.raises(FrameTimestampError, match=re.escape(f"timestamp {said} is")):
                await reader.frames_at([odd], tolerance_s=0.1)
        # The library's error (a ValueError too), with the way out.
        with pytest.raises(SourceError, match=r"end 0.1 < start 0.2: give the start"):
            await reader.frames_in_range(0.2, 0.1)


async def test_reader_lifecycle(videos: Videos) -> None:
    path = videos["h264-gop2"].path
    reader = video.open(path, fetcher=LocalSource(path))
    with pytest.raises(RuntimeError, match="not open"):
        _ = reader.fps
    async with reader:
        assert reader.frame_count == SPECS["h264-gop2"].frames
    assert reader.closed
    with pytest.raises(ClosedResourceError):
        await reader.frames_at([0.0])
    with pytest.raises(ClosedResourceError):
        await reader.aopen()


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no video file"):
        video.open(tmp_path / "missing.mp4")
    with pytest.raises(SourceError, match=r"give an http\(s\) or s3:// URL"):
        video.open("gs://bucket/clip.mp4")
    with pytest.raises(SourceError, match="name one object"):
        video.open("s3://bucket/videos/")
    (tmp_path / "x.mp4").write_bytes(b"1234")
    for source in ((tmp_path / "x.mp4").as_uri(), str(tmp_path / "x.mp4"), tmp_path / "x.mp4"):
        reader = video.open(source)
        assert reader.file.size == 4
        assert reader.file.url == (tmp_path / "x.mp4").resolve().as_uri()


# -- with the real RangeFetcher ------------------------------------------------------------


async def test_with_range_fetcher(videos: Videos) -> None:
    fetcher_module = pytest.importorskip("aiostream_hf._fetcher")
    httpx2 = pytest.importorskip("httpx2")
    oracle = videos["h264-gop250"]
    times = [oracle.times[i] for i in (0, 50, 7, 99, 100, 260)]

    # A local path: the reader creates its own fetcher and closes it.
    async with video.open(oracle.path) as reader:
        assert_frames(oracle, await reader.frames_at(times), times)

    # Over HTTP, size unknown: a suffix read, then the head if needed, then the frames.
    data = oracle.path.read_bytes()
    seen: list[str] = []

    def serve(request: Any) -> Any:
        spec = request.headers["Range"].removeprefix("bytes=")
        seen.append(spec)
        first, _, last = spec.partition("-")
        if first == "":
            start, end = max(0, len(data) - int(last)), len(data)
        else:
            start, end = int(first), int(last) + 1
        headers = {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}", "ETag": '"e"'}
        return httpx2.Response(206, headers=headers, content=data[start:end])

    transport = httpx2.MockTransport(serve)
    async with fetcher_module.RangeFetcher(
        transport=transport, endpoint="https://hub.test"
    ) as fetcher:
        file = FileRef(url="https://cdn.test/clip.mp4", path="clip.mp4")
        async with video.open(file, fetcher=fetcher) as reader:
            # The tail first: its answer tells the size; the head after, if not in it.
            opened = ["-1048576"] if len(data) <= 1048576 else ["-1048576", "0-65535"]
            assert seen == opened
            assert_frames(oracle, await reader.frames_at(times), times)
            assert len(seen) == len(opened) + reader.statistics().frame_requests
            assert reader.statistics().frame_requests <= 2  # one per GOP at most


# -- a small file: read whole at open, once ---------------------------------------------


@pytest.mark.parametrize("name", ["h264-gop25-moov-end", "hevc-open-gop", "h264-delay-audio"])
async def test_a_file_read_whole_at_open_serves_its_frames(videos: Videos, name: str) -> None:
    """A file the first read of ``open`` holds whole: no read after it, PyAV's frames."""
    oracle = videos[name]
    t = oracle.times
    source = LocalSource(oracle.path)
    async with video.open(oracle.path, fetcher=source) as reader:
        assert source.calls == [("ranges", [(0, len(source.data))])]
        for times in ([t[40], t[3], t[41]], [t[42]], t[::7], [t[-1]]):
            assert_frames(oracle, await reader.frames_at(times), times)
        stats = reader.statistics()
    assert len(source.calls) == 1
    assert (stats.index_requests, stats.index_bytes) == (1, len(source.data))
    assert (stats.frame_requests, stats.frame_bytes) == (0, 0)


async def test_a_small_file_is_fetched_once_from_the_hub(tmp_path: Path) -> None:
    """Open and frames_at on a video smaller than the first reads: the local Hub's CDN
    serves the file once, in one request, and not a byte more."""
    clip = make_video(tmp_path / "clip.mp4", frames=60, width=W, height=H, options={"g": "10"})
    size = clip.stat().st_size
    # What open reads first, head and tail, covers the whole file.
    assert size - video._tail_size(size) - video.HEAD_READ_SIZE < video._VIDEO_COALESCE_GAP
    oracle = decode_oracle(clip)
    times = [oracle.times[i] for i in (5, 31, 7, 59)]
    root = tmp_path / "hub"
    make_repo(root, "org/clips", {"videos/clip.mp4": clip})
    with HubServer(root, lfs_threshold=1024) as hub:  # the video is an LFS file: on the CDN
        file = FileRef(hub.url("org/clips", "videos/clip.mp4"), "videos/clip.mp4", size=size)
        hub.reset_stats()
        async with video.open(file) as reader:
            frames = await reader.frames_at(times)
            more = await reader.frames_at([1.23])
            stats = reader.statistics()
        served = hub.stats()
    assert served.by_bucket.get("cdn") == 1
    assert served.by_status.get(206) == 1
    assert served.bytes_served == size
    assert (stats.frame_requests, stats.frame_bytes, stats.index_bytes) == (0, 0, size)
    assert_frames(oracle, frames, times)
    assert_frames(oracle, more, [played(oracle.times, 1.23)])


async def test_unknown_size_over_the_hub_reads_the_index_in_one_round_of_parts(
    videos: Videos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resolve URL without a size (what ``video.open(url)`` gets): the local Hub counts
    one resolver request, whose redirect tells the size, then the tail of a moov-at-end
    file in concurrent parts of ``_INDEX_PART`` (no head read, no byte twice), then the
    frames' requests; PyAV's pixels."""
    monkeypatch.setattr(_video_index, "TAIL_READ_SIZE", 16 * 1024)
    monkeypatch.setattr(_video_index, "_INDEX_PART", 4 * 1024)
    oracle = videos["h264-gop250"]
    size = oracle.path.stat().st_size
    assert size > 4 * 16 * 1024
    times = [oracle.times[i] for i in (3, 120, 251)]
    root = tmp_path / "hub"
    make_repo(root, "org/clips", {"clip.mp4": oracle.path})
    with HubServer(root, lfs_threshold=1024) as hub:
        file = FileRef(hub.url("org/clips", "clip.mp4"), "clip.mp4")
        assert file.size is None
        hub.reset_stats()
        async with video.open(file) as reader:
            opened = hub.stats()
            frames = await reader.frames_at(times)
            stats = reader.statistics()
        served = hub.stats()
    assert (opened.by_bucket.get("resolvers"), opened.by_bucket.get("cdn")) == (1, 4)
    assert opened.by_status.get(206) == 4
    assert opened.bytes_served == 16 * 1024
    assert (stats.index_requests, stats.index_bytes) == (1, 16 * 1024)
    assert served.by_bucket.get("cdn") == 4 + stats.frame_requests
    assert_frames(oracle, frames, times)
