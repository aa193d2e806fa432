"""How long a script that ends with an iterator half-read takes to exit (issue 30).

    .venv/bin/python benchmarks/exit_times.py [--rounds 3] [--out results/checks/exit.json]

Runs each case of tests/exit_script.py (a stream, a mixture, a LeRobot stream, a
WebDataset stream, webdataset's gopen, a DataLoader, ``async for`` left on asyncio
and trio, and a producer blocked in a read of a server that stalls) in a fresh
interpreter against a local Hub server in its own process, and records the seconds
from the script's last line (``left``, with its ``time.monotonic()``) to the
process's end, seen by this driver on the same clock, and the bytes on stderr. The
tests (tests/test_exit.py) assert the silence; the times are measured here, as the
rules keep timing out of tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCRIPT = HERE.parent / "tests" / "exit_script.py"
CASES = [
    "parquet",
    "tar",
    "mix",
    "lerobot",
    "gopen",
    "torch",
    "async_asyncio",
    "async_trio",
    "async_asyncio_mix",
    "async_trio_mix",
]


def _run(case: str, endpoint: str, cache: Path) -> dict[str, Any]:
    import aiostream_hf

    package = str(Path(aiostream_hf.__file__).parents[1])
    path = os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), case, endpoint, str(cache)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        proc.wait(timeout=120)
        ended = time.monotonic()
        err.seek(0)
        stderr = err.read()
    if not line.startswith("left "):
        raise SystemExit(f"{case}: the script did not reach its last line: {stderr[-2000:]!r}")
    return {
        "exit_seconds": ended - float(line.split()[1]),
        "returncode": proc.returncode,
        "stderr_bytes": len(stderr),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=HERE / "results" / "checks" / "exit.json")
    args = p.parse_args()
    sys.path.insert(0, str(SCRIPT.parent))
    import _harness
    import exit_script

    from aiostream_hf.testing import Faults, HubServer

    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "hub"
        exit_script.make_repos(root)
        stall = Faults(
            trickle_rate=1.0,
            trickle_bytes=64 * 1024,
            trickle_interval_ms=600_000,
            targets=("cdn",),
        )
        with (
            HubServer(root, subprocess=True) as hub,
            HubServer(root, lfs_threshold=1, faults=stall, subprocess=True) as stalled,
        ):
            for r in range(args.rounds):
                for case in [*CASES, "stalled"]:
                    endpoint = stalled.endpoint if case == "stalled" else hub.endpoint
                    run = _run(case, endpoint, Path(tmp) / f"cache-{case}-{r}")
                    results.setdefault(case, []).append(run)
                    print(f"{case:18} {run['exit_seconds']:6.3f} s  stderr {run['stderr_bytes']} B")
    summary = {
        case: {
            "max_exit_seconds": max(x["exit_seconds"] for x in runs),
            "median_exit_seconds": _harness.median(x["exit_seconds"] for x in runs),
            "stderr_bytes": sum(x["stderr_bytes"] for x in runs),
            "returncodes": sorted({x["returncode"] for x in runs}),
        }
        for case, runs in results.items()
    }
    out = {
        "benchmark": "exit",
        "environment": _harness.environment(["aiostream-hf", "torch", "webdataset", "trio"]),
        "parameters": {"rounds": args.rounds, "script": "tests/exit_script.py"},
        "summary": summary,
        "runs": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    worst = max(s["max_exit_seconds"] for s in summary.values())
    noise = sum(s["stderr_bytes"] for s in summary.values())
    print(f"slowest exit {worst:.3f} s; stderr bytes in all {noise}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
