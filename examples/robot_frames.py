"""Robot learning on a LeRobot dataset: items with windows of camera frames, from remote MP4s.

    python examples/robot_frames.py                       # a local Hub server, synthetic v3.0 data
    python examples/robot_frames.py hf://datasets/lerobot/pusht --items 64

Each item is what ``LeRobotDataset[i]`` gives: the row of the data Parquet
(state, action, timestamp, indices), its ``task`` text, and, for a camera named in
``delta_timestamps``, a window of frames (T x H x W x 3 uint8) with a
``{camera}_is_pad`` mask where the window runs past the episode. Frames are
decoded from the episode's MP4 after fetching only the bytes of their samples
(from the keyframe each needs), never the whole video.

Then the lower-level API: ``ash.video.open(url)`` and ``frames_at([...])`` on one
video file, with the bytes it fetched.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import anyio

import aiostream_hf as ash
from aiostream_hf import lerobot

CAMERA = "observation.images.top"


@contextlib.contextmanager
def local_hub() -> Iterator[str]:
    """A local Hub server with org/robot, a LeRobot v3.0 dataset; yields its endpoint."""
    from aiostream_hf.testing import Faults, HubServer, make_lerobot_dataset

    with tempfile.TemporaryDirectory() as root:
        make_lerobot_dataset(
            root, "org/robot", episodes=(40, 50, 45), cameras=(CAMERA,), codec="h264"
        )
        with HubServer(root, faults=Faults(latency_ms=20)) as hub:
            yield hub.endpoint


async def items(repo: str, endpoint: str | None, args: argparse.Namespace) -> None:
    # The metadata says the frame rate and the cameras; deltas must be multiples of 1 / fps.
    meta = await lerobot.stream(repo, endpoint=endpoint).load_metadata()
    camera = args.camera or meta.video_keys[0]
    window = [-k / meta.fps for k in range(args.window - 1, -1, -1)]
    print(
        f"{repo}: LeRobot {meta.version}, {len(meta.episodes)} episodes, "
        f"{meta.total_frames} frames at {meta.fps:g} fps, cameras {list(meta.video_keys)}"
    )
    started = time.perf_counter()
    s = lerobot.stream(
        repo, delta_timestamps={camera: window}, shuffle=True, seed=0, endpoint=endpoint
    )
    first: dict[str, Any] | None = None
    n = 0
    async with s:
        async for item in s:
            first = first or item
            n += 1
            if n == args.items:
                break
        stats = s.statistics()
    seconds = time.perf_counter() - started
    assert first is not None, "the dataset has no items"
    frames = first[camera]
    print(
        f"{n} shuffled items in {seconds:.2f} s ({n / seconds:,.0f} items/s); each has "
        f"{camera}: {frames.dtype} {tuple(frames.shape)} at t{[round(d, 3) for d in window]} s"
    )
    keys = sorted(k for k in first if k != camera)
    print(f"item keys besides the frames: {keys}")
    print(f"first item: episode {int(first['episode_index'])}, task {first['task']!r}")
    video = stats.video
    fetched = video.get("index_bytes", 0) + video.get("frame_bytes", 0)
    reads = video.get("index_requests", 0) + video.get("frame_requests", 0)
    files = stats.videos_opened
    print(
        f"video bytes fetched: {fetched:,} in {_n(reads, 'read')} ({_n(files, 'video file')}; "
        "a small file's first read holds all of it, and its frames need no more), "
        f"{_n(video.get('packets_decoded', 0), 'packet')} decoded"
    )
    # The lower-level API: frames of one file by timestamp.
    episode = meta.episodes[0]
    span = episode.videos[camera]
    async with ash.video.open(span.file) as reader:
        times = [span.from_timestamp + k / meta.fps for k in (0, 5, 10)]
        got = await reader.frames_at(times, tolerance_s=0.5 / meta.fps)
        what = f"{reader.codec} {reader.width}x{reader.height}, {reader.frame_count} frames"
        vs = reader.statistics()
    print(
        f"video.open({span.file.path}): {what}; frames_at({[round(t, 3) for t in times]}) "
        f"-> {tuple(got.data.shape)}, {vs.index_bytes + vs.frame_bytes:,} bytes in "
        f"{_n(vs.index_requests + vs.frame_requests, 'read')}"
    )


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("repo", nargs="?", help="hf://datasets/ORG/NAME of a LeRobot dataset")
    parser.add_argument("--camera", help="a video key (default: the first camera)")
    parser.add_argument("--window", type=int, default=2, help="frames per item, ending at t")
    parser.add_argument("--items", type=int, default=48)
    args = parser.parse_args()
    if args.repo:
        anyio.run(items, args.repo, None, args)
        return
    with local_hub() as endpoint:
        print(f"local Hub server at {endpoint} (+20 ms per request)")
        anyio.run(items, "hf://datasets/org/robot", endpoint, args)


if __name__ == "__main__":
    main()
