"""A video without an MP4 index is held whole only up to ``max_whole_video_bytes``;
a larger one is read by range, in bounded blocks.

WebM (padded with an EBML Void element) and fragmented MP4 (padded with a ``free``
box) have no index that ``video.open`` reads by range, so FFmpeg demuxes them. Up to
the option the file is read whole and held; over it FFmpeg reads it by range through
blocks of ``_video_demux.BLOCK`` (at most ``KEPT_BLOCKS`` held), so memory does not
grow with the file. What FFmpeg seeks over (the fMP4's ``free`` box) is never fetched;
what it scans (the Matroska demuxer reads trailing junk looking for a cluster) counts
against the option, and a pass over it is a DecodeError naming the file and option.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from aiostream_hf import StreamOptions, _video_demux, video
from aiostream_hf._exceptions import DecodeError
from aiostream_hf._models import FileRef
from aiostream_hf.testing import HubServer, make_repo, make_video

pytestmark = pytest.mark.anyio

_MiB = 1024 * 1024
KINDS = ["webm", "fmp4"]


def _clip(tmp_path: Path, kind: str) -> bytes:
    """A 30-frame clip without an index read by range."""
    if kind == "webm":
        path = make_video(
            tmp_path / "clip.webm",
            frames=30,
            width=64,
            height=48,
            encoder="libvpx-vp9",
            options={"deadline": "realtime", "cpu-used": "8"},
        )
    else:
        path = make_video(
            tmp_path / "clip.mp4",
            frames=30,
            width=64,
            height=48,
            container_options={"movflags": "frag_keyframe+empty_moov"},
        )
    return path.read_bytes()


def _padding_header(kind: str, total: int) -> bytes:
    """The header of a padding element of ``total`` bytes in all (header included)."""
    if kind == "webm":  # a Void element (ID 0xEC), its size an 8-byte EBML number
        return b"\xec\x01" + (total - 9).to_bytes(7, "big")
    return struct.pack(">I4sQ", 1, b"free", total)  # a free box with a 64-bit size


def _padded(tmp_path: Path, kind: str, pad: int) -> Path:
    """The clip followed by ``pad`` bytes of padding, written sparse (never touched)."""
    clip = _clip(tmp_path, kind)
    path = tmp_path / f"padded.{'webm' if kind == 'webm' else 'mp4'}"
    with path.open("wb") as f:
        f.write(clip + _padding_header(kind, pad))
        f.truncate(len(clip) + pad)
    return path


async def test_a_file_over_the_option_is_read_by_range_not_whole(tmp_path: Path) -> None:
    """Over the local Hub: an fMP4 clip padded by 24 MiB, with the option at 1 MiB, is
    read by range: its frames equal those of the same file read whole, and the server
    sends a few blocks, not the padding (a whole read sends all of it)."""
    path = _padded(tmp_path, "fmp4", 24 * _MiB)
    size = path.stat().st_size
    root = tmp_path / "hub"
    make_repo(root, "org/clips", {path.name: path})
    with HubServer(root, lfs_threshold=1024) as hub:
        file = FileRef(hub.url("org/clips", path.name), path.name, size=size)
        hub.reset_stats()
        small = StreamOptions(max_whole_video_bytes=1 * _MiB)
        async with video.open(file, options=small) as reader:
            assert reader.frame_count == 30
            assert not reader.statistics().indexed
            streamed = await reader.frames_at([0.1, 0.5, 0.9])
            stats = reader.statistics()
        served = hub.stats().bytes_served
        hub.reset_stats()
        async with video.open(file, options=StreamOptions(max_whole_video_bytes=size)) as reader:
            whole = await reader.frames_at([0.1, 0.5, 0.9])
            assert reader.statistics().frame_requests == 0  # held: no request for frames
        assert hub.stats().bytes_served >= size
    assert np.array_equal(streamed.data, whole.data)
    assert np.array_equal(streamed.pts, whole.pts)
    assert stats.frame_requests >= 1
    assert served < 8 * _MiB, served  # the head, the tail and a few blocks: no padding


async def test_a_scan_past_the_option_is_refused_naming_it(tmp_path: Path) -> None:
    """Over the local Hub: a WebM clip followed by 24 MiB of junk, option 4 MiB. FFmpeg
    scans the junk for a cluster; the scan stops at the option with a DecodeError
    naming the file and the option, having fetched no more than the option allows
    (plus the head and tail of open); with the option above the size it plays."""
    path = _padded(tmp_path, "webm", 24 * _MiB)
    size = path.stat().st_size
    root = tmp_path / "hub"
    make_repo(root, "org/clips", {path.name: path})
    with HubServer(root, lfs_threshold=1024) as hub:
        file = FileRef(hub.url("org/clips", path.name), path.name, size=size)
        hub.reset_stats()
        with pytest.raises(DecodeError) as caught:
            async with video.open(file, options=StreamOptions(max_whole_video_bytes=4 * _MiB)):
                pass
        served = hub.stats().bytes_served
        async with video.open(file, options=StreamOptions(max_whole_video_bytes=size)) as reader:
            assert reader.frame_count == 30
    message = str(caught.value)
    assert path.name in message
    assert f"max_whole_video_bytes={4 * _MiB:,}" in message
    assert served < 8 * _MiB, served


@pytest.mark.parametrize("kind", KINDS)
async def test_a_file_of_2_5_gib_is_never_held(tmp_path: Path, kind: str) -> None:
    """A local clip padded to 2.5 GiB (a sparse file), the default option (1 GiB): it is
    read by range, never held. The fMP4 plays from a few blocks (FFmpeg seeks over the
    free box); the WebM's junk scan stops at the option with a DecodeError."""
    path = _padded(tmp_path, kind, 5 * 512 * _MiB)
    assert StreamOptions().max_whole_video_bytes == 1024 * _MiB
    if kind == "webm":
        with pytest.raises(DecodeError, match="max_whole_video_bytes=1,073,741,824"):
            async with video.open(path):
                pass
        return
    async with video.open(path) as reader:
        assert reader.frame_count == 30
        frames = await reader.frames_at([0.1, 0.9])
        stats = reader.statistics()
    assert frames.data.shape == (2, 48, 64, 3)
    assert not stats.indexed
    assert stats.frame_bytes <= 16 * _video_demux.BLOCK


def test_the_range_file_keeps_at_most_its_blocks() -> None:
    """``_RangeFile`` reads blocks on demand and drops the least recently read one past
    ``KEPT_BLOCKS``; a short answer is a DecodeError naming the file."""
    size = (_video_demux.KEPT_BLOCKS + 3) * _video_demux.BLOCK + 5
    data = bytes(range(256)) * (size // 256 + 1)
    fetched: list[tuple[int, int]] = []

    def fetch(start: int, end: int) -> bytes:
        fetched.append((start, end))
        return data[start:end]

    f = _video_demux._RangeFile(fetch, size, "big.webm", limit=10 * size)
    assert f.read() == data[:size]
    assert len(f._blocks) == _video_demux.KEPT_BLOCKS
    assert len(fetched) == _video_demux.KEPT_BLOCKS + 4
    f.seek(-10, 2)
    assert f.read(100) == data[size - 10 : size - 5]  # a raw read stops at a block's end
    assert f.read(100) == data[size - 5 : size]
    assert f.read(100) == b""
    assert len(fetched) == _video_demux.KEPT_BLOCKS + 4  # the last block is still held
    f.seek(0)
    assert f.read(3) == data[:3]
    assert fetched[-1] == (0, _video_demux.BLOCK)  # dropped, so fetched again

    short = _video_demux._RangeFile(lambda start, end: b"x", size, "big.webm", limit=size)
    with pytest.raises(DecodeError, match="big.webm"):
        short.read(10)
    capped = _video_demux._RangeFile(fetch, size, "big.webm", limit=2 * _video_demux.BLOCK)
    assert len(capped.read(_video_demux.BLOCK)) == _video_demux.BLOCK
    assert len(capped.read(_video_demux.BLOCK)) == _video_demux.BLOCK
    with pytest.raises(DecodeError, match="max_whole_video_bytes=2,097,152"):
        capped.read(1)


def test_the_option_must_be_positive() -> None:
    from aiostream_hf import SourceError

    with pytest.raises(SourceError, match="max_whole_video_bytes"):
        StreamOptions(max_whole_video_bytes=0)
