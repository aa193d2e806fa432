"""A video without an MP4 index is read whole: at most ``max_whole_video_bytes``.

WebM (padded with an EBML Void element) and fragmented MP4 (padded with a ``free``
box) have no index that ``video.open`` reads by range, so FFmpeg demuxes them from
memory. A file over the option is refused by its size, before its body is read.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from aiostream_hf import StreamOptions, video
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


@pytest.mark.parametrize("kind", KINDS)
async def test_a_file_over_the_option_is_refused_before_its_body_is_read(
    tmp_path: Path, kind: str
) -> None:
    """Over the local Hub: a clip padded by 4 MiB, with the option at 1 MiB, is refused
    naming the file and the option, after only the first reads (head and tail); with
    the option above its size it plays."""
    path = _padded(tmp_path, kind, 4 * _MiB)
    size = path.stat().st_size
    root = tmp_path / "hub"
    make_repo(root, "org/clips", {path.name: path})
    with HubServer(root, lfs_threshold=1024) as hub:
        file = FileRef(hub.url("org/clips", path.name), path.name, size=size)
        hub.reset_stats()
        small = StreamOptions(max_whole_video_bytes=1 * _MiB)
        with pytest.raises(DecodeError) as caught:
            async with video.open(file, options=small):
                pass
        served = hub.stats().bytes_served
        async with video.open(file, options=StreamOptions(max_whole_video_bytes=size)) as reader:
            assert reader.frame_count == 30
            assert not reader.statistics().indexed
    message = str(caught.value)
    assert path.name in message
    assert f"max_whole_video_bytes={1 * _MiB:,}" in message
    assert f"{size:,} bytes" in message
    assert served < 2 * _MiB  # the head and the tail, not the padding


@pytest.mark.parametrize("kind", KINDS)
async def test_the_default_refuses_a_file_of_2_5_gib_by_its_size(tmp_path: Path, kind: str) -> None:
    """A local clip padded to 2.5 GiB (a sparse file): the default option (1 GiB)
    refuses it by its size, before any of its body is allocated."""
    path = _padded(tmp_path, kind, 5 * 512 * _MiB)
    assert StreamOptions().max_whole_video_bytes == 1024 * _MiB
    with pytest.raises(DecodeError, match="max_whole_video_bytes=1,073,741,824"):
        async with video.open(path):
            pass


def test_the_option_must_be_positive() -> None:
    from aiostream_hf import SourceError

    with pytest.raises(SourceError, match="max_whole_video_bytes"):
        StreamOptions(max_whole_video_bytes=0)
