"""Would torchcodec decode LeRobot's AV1 frames with less CPU than PyAV? (issue 33, line 5:
"torchcodec as an optional backend if it helps, measured").

    benchmarks/.data/lerobot-venv/bin/python benchmarks/torchcodec_check.py [VIDEO] [N]

Run by the peer's venv of ``lerobot_bench.py`` (``--prepare`` makes it), which has both
torchcodec and PyAV. Default VIDEO: the top camera of ``lerobot_bench.py``'s full data.
On the same file, CPU time of the process (every thread) per frame delivered as RGB:

- ``pyav-seq`` / ``torchcodec-seq``: the first N frames in order (PyAV: demux, decode,
  ``to_ndarray("rgb24")``; torchcodec: ``get_frames_in_range``), with one decoder
  thread (``-t1``) and with FFmpeg's choice (``-t0``);
- ``*-rand100``: 100 random frames of the first N, each from its keyframe (PyAV: seek,
  decode to it; torchcodec: ``get_frames_at``, ``seek_mode="approximate"`` as
  LeRobot).

CPU seconds, not wall time: the machines are shared. Prints a table; writes nothing.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT = (
    HERE / ".data/full/hub/datasets/bench/lerobot-av1/videos/observation.images.top"
    "/chunk-000/file-000.mp4"
)


def main() -> int:
    import _lerobot_peer  # this folder is on sys.path

    _lerobot_peer._import_torchvision()
    import av
    import torch
    import torchcodec
    from torchcodec.decoders import VideoDecoder

    torch.set_num_threads(1)
    path = sys.argv[1] if len(sys.argv) > 1 else str(DEFAULT)
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300

    def pyav_seq(threads: int) -> int:
        with av.open(path) as c:
            s = c.streams.video[0]
            s.codec_context.thread_count = threads
            got = 0
            for frame in c.decode(s):
                if got >= n:
                    break
                frame.to_ndarray(format="rgb24")
                got += 1
        return got

    def tc_seq(threads: int) -> int:
        d = VideoDecoder(path, seek_mode="approximate", num_ffmpeg_threads=threads)
        return int(d.get_frames_in_range(0, n).data.shape[0])

    def pyav_random(threads: int, indices: list[int]) -> int:
        with av.open(path) as c:
            s = c.streams.video[0]
            s.codec_context.thread_count = threads
            fps = float(s.average_rate)
            got = 0
            for i in indices:
                t = i / fps
                c.seek(int(t / s.time_base), stream=s, backward=True)
                for frame in c.decode(s):
                    if frame.time is not None and frame.time >= t - 1e-4:
                        frame.to_ndarray(format="rgb24")
                        got += 1
                        break
        return got

    def tc_random(threads: int, indices: list[int]) -> int:
        d = VideoDecoder(path, seek_mode="approximate", num_ffmpeg_threads=threads)
        for i in indices:
            d.get_frames_at(indices=[i])
        return len(indices)

    indices = random.Random(0).sample(range(n), 100)
    cases: list[tuple[str, Any]] = [
        ("pyav-seq-t1", lambda: pyav_seq(1)),
        ("torchcodec-seq-t1", lambda: tc_seq(1)),
        ("pyav-seq-t0", lambda: pyav_seq(0)),
        ("torchcodec-seq-t0", lambda: tc_seq(0)),
        ("pyav-rand100-t1", lambda: pyav_random(1, indices)),
        ("torchcodec-rand100-t1", lambda: tc_random(1, indices)),
    ]
    print(
        f"{path}\nav {av.__version__} (libavcodec {av.library_versions['libavcodec']}), "
        f"torchcodec {torchcodec.__version__}; CPU ms per frame, best of 3"
    )
    for name, run in cases:
        best = float("inf")
        for _ in range(3):
            c0 = time.process_time()
            got = run()
            best = min(best, (time.process_time() - c0) / got * 1000)
        print(f"  {name:<24} {best:6.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
