"""A/B of two checkouts on the remote Parquet path: rows/s and client CPU seconds.

    .venv/bin/python benchmarks/parquet_ab.py OLD_CHECKOUT NEW_CHECKOUT [--rounds 5]
    .venv/bin/python benchmarks/parquet_ab.py OLD NEW --repo bench/images --output python \
        --out benchmarks/results/ab/small-units.json

Each round runs both checkouts, in alternating order, each in a fresh process
(``PYTHONPATH`` set to its checkout) reading one of parquet_bench's repos (by default
its text repo, 8 files, 321 MB, with ``output="arrow"``; ``--output python`` iterates
dict rows) through one Hub server in its own process, 20 ms added to every request.
The server and data are parquet_bench's (run it once first). Prints and writes
benchmarks/results/ab/transport.json (``--out``); the A/Bs recorded under
benchmarks/results/ab/ (transport, engine, ramp, small units, received, order) were made with
it, the earlier ones under its first name, transport_ab.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = r"""
import asyncio, os, sys, tempfile, time
from pathlib import Path
import aiostream_hf as ash
async def run():
    n = 0
    opts = ash.StreamOptions(cache_dir=Path(tempfile.mkdtemp()))
    async with ash.stream(f"hf://datasets/{sys.argv[2]}", split="train", output=sys.argv[3],
                          options=opts, endpoint=sys.argv[1]) as s:
        async for b in s:
            n += b.num_rows if sys.argv[3] == "arrow" else 1
    return n
c0 = os.times(); t0 = time.perf_counter()
rows = asyncio.run(run())
dt = time.perf_counter() - t0; c1 = os.times()
print(rows, dt, c1.user - c0.user + c1.system - c0.system, ash.__file__)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repo", default="bench/text", help="a parquet_bench repo")
    p.add_argument("--output", choices=["arrow", "python"], default="arrow")
    p.add_argument("--data-dir", type=Path, default=HERE / ".data" / "full" / "hub")
    p.add_argument("--out", type=Path, default=HERE / "results" / "ab" / "transport.json")
    args = p.parse_args()
    from aiostream_hf.testing import Faults, HubServer

    sides = {"old": args.old.resolve(), "new": args.new.resolve()}
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
    with HubServer(args.data_dir, subprocess=True, faults=Faults(latency_ms=20)) as hub:
        import httpx2

        httpx2.get(
            f"{hub.endpoint}/api/datasets/{args.repo}/tree/main",
            params={"recursive": "true"},
            timeout=600,
        ).raise_for_status()
        for r in range(args.rounds + 1):  # the first round warms up
            order = list(sides) if r % 2 else list(reversed(sides))
            for side in order:
                env = {**os.environ, "PYTHONPATH": str(sides[side])}
                out = subprocess.run(
                    [sys.executable, "-c", WORKER, hub.endpoint, args.repo, args.output],
                    env=env,
                    cwd=sides[side],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                rows, seconds, cpu = int(out[0]), float(out[1]), float(out[2])
                assert out[3].startswith(str(sides[side])), out[3]
                if r:
                    runs[side].append({"rows_per_s": rows / seconds, "cpu_seconds": cpu})
                print(f"round {r} {side}: {rows / seconds:9,.0f} rows/s  client CPU {cpu:.2f} s")
    summary = {
        side: {
            "rows_per_s_median": statistics.median(x["rows_per_s"] for x in rs),
            "rows_per_s_min": min(x["rows_per_s"] for x in rs),
            "rows_per_s_max": max(x["rows_per_s"] for x in rs),
            "cpu_seconds_median": statistics.median(x["cpu_seconds"] for x in rs),
        }
        for side, rs in runs.items()
    }
    for side, s in summary.items():
        print(
            f"{side}: {s['rows_per_s_median']:,.0f} rows/s ({s['rows_per_s_min']:,.0f}-"
            f"{s['rows_per_s_max']:,.0f}), client CPU {s['cpu_seconds_median']:.2f} s"
        )
    result = {
        "benchmark": "parquet-ab",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "repo": args.repo,
        "output": args.output,
        "sides": {k: str(v) for k, v in sides.items()},
        "commits": {
            k: subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=v, capture_output=True, text=True
            ).stdout.strip()
            for k, v in sides.items()
        },
        "runs": runs,
        "summary": summary,
    }
    out_path = args.out
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
