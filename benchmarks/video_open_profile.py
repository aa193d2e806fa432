"""Where a cold and a warm ``video.open`` spend their time, beyond the round trips.

    .venv/bin/python benchmarks/video_open_profile.py              # 3 rounds, 20 ms
    .venv/bin/python benchmarks/video_open_profile.py --rounds 5 --latency-ms 0

The local Hub server (its own process, ``--latency-ms`` per request) serves the video of
``video_bench.py --quick`` (generated there). Each round opens it three times, each in a
fresh process with the byte cache on: ``cold`` (empty cache folders), then ``warm``
twice (the same folders). Each prints its time to open (from ``video.open`` to the
reader ready: resolved, index read), the requests the server saw, and every call the
open ran in a worker thread (``anyio.to_thread.run_sync``): how many, their wall time
as the event loop waited for them, and their own time in the thread. Writes nothing.

What it found (issue 33, line 3): a warm open's largest cost was importing
huggingface_hub's ``get_token`` (80-100 ms) to read a token file that did not exist;
a warm open now takes 6-23 ms on a busy machine, with no request. A cold open waited
for the branch's pin and the folder's listing (two API round trips) before the file's
first read; it now resolves the file with one HEAD of its ``/resolve/`` URL.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data" / "quick" / "hub"
REPO = "bench/video"


def _open(endpoint: str, cache: str, url: str) -> dict[str, Any]:
    """In a fresh process: open ``url``, timing the worker-thread calls."""
    import anyio
    import anyio.to_thread

    import aiostream_hf as ash
    from aiostream_hf import video

    calls: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    run_sync = anyio.to_thread.run_sync

    async def timed(func: Any, *args: Any, **kw: Any) -> Any:
        name = getattr(func, "__qualname__", None) or getattr(
            getattr(func, "func", None), "__qualname__", repr(func)
        )
        work: list[float] = []

        def inner(*a: Any) -> Any:
            t = time.perf_counter()
            try:
                return func(*a)
            finally:
                work.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        try:
            return await run_sync(inner, *args, **kw)
        finally:
            c = calls[name]
            c[0] += 1
            c[1] += time.perf_counter() - t0
            c[2] += sum(work)

    anyio.to_thread.run_sync = timed  # type: ignore[assignment]

    async def main() -> tuple[float, bool]:
        options = ash.StreamOptions(cache_dir=cache, byte_cache_bytes=4 << 30, pin_ttl=600)
        t0 = time.perf_counter()
        async with video.open(url, options=options, endpoint=endpoint) as reader:
            return time.perf_counter() - t0, reader.statistics().index_cached

    seconds, cached = anyio.run(main)
    return {"open_ms": 1000 * seconds, "index_cached": cached, "threads": calls}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--open", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.open:
        print(json.dumps(_open(*args.open)))
        return 0
    from aiostream_hf.testing import Faults, HubServer

    videos = sorted((DATA / "datasets" / REPO).glob("*.mp4"))
    if not videos:
        raise SystemExit("no video: run `benchmarks/video_bench.py --quick --prepare` first")
    url = f"hf://datasets/{REPO}/{videos[0].name}"
    with HubServer(DATA, subprocess=True, faults=Faults(latency_ms=args.latency_ms)) as hub:
        for r in range(args.rounds):
            with tempfile.TemporaryDirectory() as cache:
                for kind in ("cold", "warm", "warm"):
                    hub.reset_stats()
                    out = subprocess.run(
                        [sys.executable, __file__, "--open", hub.endpoint, cache, url],
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    got = json.loads(out.stdout)
                    sent = dict(hub.wait_idle().by_endpoint)
                    print(
                        f"round {r} {kind}: open {got['open_ms']:.1f} ms, index cached "
                        f"{got['index_cached']}, requests {sent}"
                    )
                    for name, (n, wall, work) in sorted(
                        got["threads"].items(), key=lambda x: -x[1][1]
                    )[:6]:
                        print(
                            f"    {name:<40} x{n:<3} waited {1000 * wall:6.1f} ms, "
                            f"ran {1000 * work:6.1f} ms"
                        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
