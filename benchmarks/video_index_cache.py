"""What a warm video open costs on the CPU, with the index kept two ways (issue 33, line 3).

    .venv/bin/python benchmarks/video_index_cache.py                # 10-minute video
    .venv/bin/python benchmarks/video_index_cache.py --minutes 1 --runs 5

A warm open (the index seen on this machine before) makes no request either way; what
is left is CPU and disk. The two designs the byte cache's store allows:

* ``blocks``: keep the index's bytes, as the byte cache keeps any bytes (the 1 MiB
  blocks holding the head and the tail read of ``open``), and parse them again:
  read the blocks (their CRC checked: the first read in a process), then
  ``parse_moov`` and the reader's tables (``_Indexed``);
* ``entry``: keep the parsed sample table (``_video_index_cache``, what the library
  does): read the entry (its CRC checked), ``decode`` it, then ``_Indexed``.

Each run is a fresh process (no CRC already checked, no module warmed by the other).
The video is generated once under ``benchmarks/.data/index/``: 30 fps, GOP 250, 64x48
(the index's size depends on the number of frames, not on their pixels). Prints each
design's median milliseconds and bytes kept; writes nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _kept(folder: str) -> int:
    """Bytes the store holds: its blocks and entries, headers included."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*.[be][ln][kt]"))


def _measure(design: str, video: str, folder: str) -> dict[str, Any]:
    """In a fresh process: keep the index ``design``'s way (untimed), then time a warm
    open's CPU work from the store, with a new ByteCache (as another process has)."""
    import anyio
    import numpy as np  # noqa: F401  (imported before the clock, as the library has it)

    from aiostream_hf import _video_index_cache as vic
    from aiostream_hf._byte_cache import ByteCache
    from aiostream_hf._models import FileRef
    from aiostream_hf._mp4 import HEAD_READ_SIZE, parse_moov, read_box_header
    from aiostream_hf._video_decode import _Indexed
    from aiostream_hf._video_index import _tail_size

    path = Path(video)
    data = path.read_bytes()
    size = len(data)
    file = FileRef("u", path.name, size=size, etag="e" * 64)
    head_end, tail_start = min(size, HEAD_READ_SIZE), max(0, size - _tail_size(size))

    def moov_of(read: Any) -> Any:
        pos = 0
        while True:
            box = read_box_header(read(pos, pos + 16), pos, size, path.name)
            if box.type == "moov":
                return read(box.start, box.end)
            pos = box.end

    # What open reads: the head, the tail, and the moov box (in the tail, or hopped to).
    found: list[tuple[int, int]] = []
    moov_of(lambda s, e: found.append((s, e)) or data[s:e])
    moov = found[-1]
    spans = [(0, head_end), (min(tail_start, moov[0]), size)]

    async def fetch(ranges: list[tuple[int, int]]) -> list[bytes]:
        return [data[s:e] for s, e in ranges]

    async def run() -> dict[str, Any]:
        ByteCache(Path(folder), 1 << 34)  # the folder
        writer = ByteCache(Path(folder), 1 << 34)
        table = parse_moov(moov_of(lambda s, e: data[s:e]), path.name, size)
        if design == "blocks":
            await writer.read(file, "", spans, fetch, max_request=1 << 30)
        else:
            await writer.write_entry(file, "", "video-index/v1", vic.encode(table))
        kept = await anyio.to_thread.run_sync(_kept, folder)
        reader = ByteCache(Path(folder), 1 << 34)
        from aiostream_hf import _byte_cache

        _byte_cache._verified = _byte_cache._Verified(1 << 16)  # as in another process

        async def no_fetch(ranges: list[tuple[int, int]]) -> list[bytes]:
            raise AssertionError("warm: nothing is fetched")

        t0 = time.perf_counter()
        if design == "blocks":
            head, tail = await reader.read(file, "", spans, no_fetch, max_request=1 << 30)
            held = {0: bytes(head), spans[1][0]: bytes(tail)}

            def read(s: int, e: int) -> bytes:
                for at, buf in held.items():
                    if at <= s and e <= at + len(buf):
                        return buf[s - at : e - at]
                raise AssertionError(f"bytes {s}-{e} not in the blocks read")

            warm = parse_moov(moov_of(read), path.name, size)
        else:
            payload = await reader.read_entry(file, "", "video-index/v1")
            assert payload is not None
            warm = vic.decode(payload, path.name, size)
        _Indexed(warm)
        ms = 1000 * (time.perf_counter() - t0)
        return {"ms": ms, "kept_bytes": kept, "samples": warm.sample_count}

    return anyio.run(run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(_measure(*args.measure)))
        return 0
    from aiostream_hf.testing import make_video

    frames = int(args.minutes * 60 * 30)
    video = HERE / ".data" / "index" / f"index-{frames}-frames.mp4"
    if not video.exists():
        print(f"generating {video.name} ({frames} frames, 64x48) ...", flush=True)
        make_video(video, frames=frames, width=64, height=48, options={"g": "250"})
    results: dict[str, list[dict[str, Any]]] = {"blocks": [], "entry": []}
    for _ in range(args.runs):
        for design in results:  # alternating
            with tempfile.TemporaryDirectory() as folder:
                out = subprocess.run(
                    [sys.executable, __file__, "--measure", design, str(video), folder],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results[design].append(json.loads(out.stdout))
    samples = results["entry"][0]["samples"]
    print(f"{video.name}: {samples} samples, {args.runs} runs each, a fresh process per run")
    for design, runs in results.items():
        ms = [r["ms"] for r in runs]
        print(
            f"  {design:<6} warm open's CPU {statistics.median(ms):6.2f} ms "
            f"(min {min(ms):.2f}, max {max(ms):.2f}), {runs[0]['kept_bytes'] / 1e3:8.1f} kB kept"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
