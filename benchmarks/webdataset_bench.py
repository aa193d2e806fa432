"""WebDataset TAR shards: aiostream-hf against webdataset over http and from local disk.

    .venv/bin/python benchmarks/webdataset_bench.py            # full run (~5 min after data)
    .venv/bin/python benchmarks/webdataset_bench.py --quick    # smoke test (< 1 min)

What it measures (issue 4, "Done when"), with the local Hub server in its own
process and 20 ms of latency added to every request:

* ``capped`` (and a 50 MB/s cap per connection): samples/s of ``aiostream``
  (``aiostream_hf.webdataset.stream(urls)``, async, bytes only) over
  ``webdataset-http`` (``webdataset.WebDataset(urls)``, which reads each shard
  through a ``curl`` pipe); target >= 2;
* ``uncapped`` (latency only): ``aiostream`` over ``webdataset-local``
  (``webdataset.WebDataset`` on the same shards on local disk, the physical
  limit); target >= 0.8;
* peak RSS of the ``aiostream`` runs with ``prefetch_bytes`` = 256 MiB,
  against that budget + 300 MiB.

``aiostream-sync`` (the same stream iterated by a plain ``for`` loop through
the sync bridge, as a DataLoader worker does) and ``webdataset-http`` without
caps are measured for reference. Both sides get the same brace-expanded
``http://`` shard URLs (the server's ``/resolve/main/`` URLs, redirected to
its CDN); every side touches every sample (``len(sample["jpg"])``), nothing is
decoded.

Every contender runs in a fresh subprocess (this script with ``--worker``);
time runs from after the imports to the last sample. One warm-up round, then
``--rounds`` rounds in a rotating order. Request counts and bytes served come
from the server's stats, reset before each run; peak RSS is the largest sum of
the RSS of the contender's process tree (curl included), polled every 50 ms,
or the process's own VmHWM if larger. Prints a table and writes
``benchmarks/results/webdataset.json`` (``webdataset-quick.json`` with --quick).
Shards are generated once under ``benchmarks/.data/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _harness  # benchmarks/_harness.py: this script's folder is on sys.path

_MODULE_START = time.perf_counter()
HERE = Path(__file__).resolve().parent
MiB = 1 << 20
MB = 1e6
REPO = "bench/wds"
GENERATOR_VERSION = 1
BUCKETS = ("api", "resolvers", "pages", "cdn")
PREFETCH_BYTES = 256 * MiB
RSS_ALLOWANCE = 300 * MiB

PROFILES: dict[str, dict[str, Any]] = {
    # 8 shards of ~64 MB: 3,000 samples of a 512x384 JPEG (~21 KB), a json and a cls each.
    "full": {"shards": 8, "samples_per_shard": 3000, "width": 512, "height": 384},
    "quick": {"shards": 4, "samples_per_shard": 400, "width": 256, "height": 192},
}
WORKLOADS: dict[str, dict[str, Any]] = {
    "capped": {
        "faults": {"latency_ms": 20.0, "bandwidth_per_connection": 50e6},
        "contenders": ["aiostream", "webdataset-http", "aiostream-sync"],
    },
    "uncapped": {
        "faults": {"latency_ms": 20.0},
        "contenders": ["aiostream", "webdataset-local", "aiostream-sync", "webdataset-http"],
    },
}
RATIOS = [  # (workload, numerator, denominator, target)
    ("capped", "aiostream", "webdataset-http", 2.0),
    ("uncapped", "aiostream", "webdataset-local", 0.8),
]


# =============================================================================
# Worker: one contender, in its own process.
# =============================================================================


def _worker(spec: dict[str, Any]) -> dict[str, Any]:

    contender = spec["contender"]
    out: dict[str, Any] = {"contender": contender}
    samples = touched = 0
    first: float | None = None

    if contender.startswith("aiostream"):
        import asyncio

        import aiostream_hf as ash
        import aiostream_hf.webdataset as ashwds

        options = ash.StreamOptions(
            cache_dir=Path(spec["cache_dir"]), prefetch_bytes=spec["prefetch_bytes"]
        )
        t0 = time.perf_counter()

        async def run() -> tuple[int, int, float | None, Any]:
            n = t = 0
            ttf = None
            async with ashwds.stream(spec["url"], options=options) as s:
                async for sample in s:
                    if ttf is None:
                        ttf = time.perf_counter() - t0
                    n += 1
                    t += len(sample["jpg"])
                return n, t, ttf, s.statistics()

        def run_sync() -> tuple[int, int, float | None, Any]:
            n = t = 0
            ttf = None
            with ashwds.stream(spec["url"], options=options) as s:
                for sample in s:
                    if ttf is None:
                        ttf = time.perf_counter() - t0
                    n += 1
                    t += len(sample["jpg"])
                return n, t, ttf, s.statistics()

        if contender == "aiostream-sync":
            samples, touched, first, st = run_sync()
        else:
            samples, touched, first, st = asyncio.run(run())
        elapsed = time.perf_counter() - t0
        out["aiostream_statistics"] = {
            "fetcher": dict(st.fetcher),
            "chunks": st.units,
            "shards": st.files,
            "max_prefetched": st.max_prefetched,
            "max_prefetched_bytes": st.max_prefetched_bytes,
        }
    elif contender.startswith("webdataset-"):
        import webdataset as wds

        source = spec["url"] if contender == "webdataset-http" else spec["local_files"]
        t0 = time.perf_counter()
        for sample in wds.WebDataset(source, shardshuffle=False):
            if first is None:
                first = time.perf_counter() - t0
            samples += 1
            touched += len(sample["jpg"])
        elapsed = time.perf_counter() - t0
    else:
        raise SystemExit(f"unknown contender {contender!r}")

    out.update(
        samples=samples,
        touched=touched,
        import_seconds=t0 - _MODULE_START,
        seconds=elapsed,
        time_to_first_sample=first,
        **_harness.process_usage(),
    )
    return out


# =============================================================================
# Data: generated once under --data-dir, regenerated only when parameters change.
# =============================================================================


def _ensure_shards(data_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
    from aiostream_hf.testing import make_repo, make_webdataset_shards

    data_dir.mkdir(parents=True, exist_ok=True)
    ignore = data_dir / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# generated benchmark data\n*\n")
    name = "-".join(f"{k}{v}" for k, v in sorted(params.items()))
    root = data_dir / f"wds-{name}"
    stamp_path = root / "stamp.json"
    wanted = {"generator_version": GENERATOR_VERSION, **params}
    repo_dir = root / "hub" / "datasets" / REPO
    if stamp_path.exists():
        stamp = json.loads(stamp_path.read_text())
        if stamp["params"] == wanted and all(
            (repo_dir / f["path"]).is_file() and (repo_dir / f["path"]).stat().st_size == f["size"]
            for f in stamp["files"]
        ):
            return {**stamp, "root": str(root)}  # where it is now (the folder may have moved)
    print(f"generating {params['shards']} shards {params} under {root} ...", flush=True)
    started = time.perf_counter()
    shutil.rmtree(root, ignore_errors=True)
    make_repo(root / "hub", REPO, {"README.md": f"# {REPO}\n\nbenchmark shards\n"})
    paths = make_webdataset_shards(
        repo_dir / "data",
        shards=params["shards"],
        samples_per_shard=params["samples_per_shard"],
        width=params["width"],
        height=params["height"],
        seed=7,
    )
    files = [
        {"path": str(p.relative_to(repo_dir)), "size": p.stat().st_size} for p in sorted(paths)
    ]
    stamp = {
        "params": wanted,
        "root": str(root),
        "files": files,
        "samples": params["shards"] * params["samples_per_shard"],
        "bytes": sum(f["size"] for f in files),
    }
    stamp_path.write_text(json.dumps(stamp, indent=1))
    print(
        f"  {len(files)} shards, {stamp['bytes'] / MB:.0f} MB "
        f"in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    return stamp


# =============================================================================
# Driver
# =============================================================================


PACKAGES = ("aiostream-hf", "webdataset", "httpx2", "anyio", "pyarrow", "uvicorn")


def _environment() -> dict[str, Any]:
    curl = shutil.which("curl")
    curl_version = None
    if curl:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            curl_version = subprocess.run(
                [curl, "--version"], capture_output=True, text=True, check=False
            ).stdout.split("\n")[0]
    return _harness.environment(PACKAGES, curl=curl_version)


def _run_contender(
    hub: Any,
    contender: str,
    workload: str,
    stamp: dict[str, Any],
    url: str,
    log_dir: Path,
    tag: str,
    idle: tuple[float, float],
) -> dict[str, Any]:
    """One pass of one contender in a fresh process; RSS polled, server stats read.

    First waits (a bounded time) until the rest of the shared machine is quiet.
    """

    waited, busy_before = _harness.wait_for_idle(*idle)
    machine_busy = _harness.machine_busy_seconds()
    tmp = Path(tempfile.mkdtemp(prefix="aiostream-wds-bench-"))
    repo_dir = Path(stamp["root"]) / "hub" / "datasets" / REPO
    try:
        spec = {
            "contender": contender,
            "url": url,
            "local_files": [str(repo_dir / f["path"]) for f in stamp["files"]],
            "cache_dir": str(tmp / "cache"),
            "prefetch_bytes": PREFETCH_BYTES,
            "result_path": str(tmp / "result.json"),
        }
        hub.reset_stats()
        server = _harness.server_process(hub)
        server_cpu = _harness.cpu_seconds(server)
        log_path = log_dir / f"{tag}-{contender}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_DISABLE_TELEMETRY="1")
        returncode, wall, peak_tree = _harness.run_worker(
            Path(__file__).resolve(), spec, env, log_path
        )
        server_cpu = _harness.cpu_seconds(server) - server_cpu
        machine_busy = _harness.machine_busy_seconds() - machine_busy
        stats = hub.stats().to_json()
        if returncode != 0:
            raise RuntimeError(
                f"{contender} exited with {returncode}:\n{log_path.read_text()[-3000:]}"
            )
        result: dict[str, Any] = json.loads(Path(spec["result_path"]).read_text())
        if result["samples"] != stamp["samples"]:
            raise RuntimeError(
                f"{contender} read {result['samples']} samples, expected {stamp['samples']}"
            )
        result.update(
            workload=workload,
            process_wall_seconds=wall,
            server_cpu_seconds=server_cpu,
            idle_wait_seconds=waited,
            busy_cpus_before=busy_before,
            # CPU the rest of the machine used meanwhile (not this contender, not the
            # server): how noisy this run was.
            other_cpu_seconds=machine_busy
            - result["cpu_user"]
            - result["cpu_system"]
            - (server_cpu if server_cpu == server_cpu else 0.0),
            peak_rss_polled=peak_tree,
            peak_rss=max(peak_tree, result["vm_hwm"] or 0),
            samples_per_s=result["samples"] / result["seconds"],
            mb_per_s=stamp["bytes"] / MB / result["seconds"],
            requests={b: stats["by_bucket"].get(b, 0) for b in BUCKETS},
            bytes_served=stats["bytes_served"],
            read_amplification=stats["bytes_served"] / stamp["bytes"],
            server=stats,
        )
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _summarize(
    rounds: list[dict[str, dict[str, Any]]], kinds: tuple[str, ...] = BUCKETS
) -> dict[str, Any]:
    """Per contender: medians and ranges over the rounds; request counts by ``kinds``
    (the Hub server's buckets here; s3_bench passes its server's request kinds)."""
    summary: dict[str, Any] = {}
    for contender in rounds[0]:
        runs = [r[contender] for r in rounds]
        rates = [r["samples_per_s"] for r in runs]
        ttfs = [r["time_to_first_sample"] for r in runs if r["time_to_first_sample"] is not None]
        summary[contender] = {
            "samples_per_s": {
                "median": statistics.median(rates),
                "min": min(rates),
                "max": max(rates),
            },
            "mb_per_s_median": statistics.median(r["mb_per_s"] for r in runs),
            "time_to_first_sample_median": statistics.median(ttfs) if ttfs else None,
            "requests_median": {
                k: statistics.median(r["requests"].get(k, 0) for r in runs) for k in kinds
            },
            "peak_rss_max": max(r["peak_rss"] for r in runs),
            "cpu_seconds_median": statistics.median(r["cpu_user"] + r["cpu_system"] for r in runs),
            "server_cpu_seconds_median": statistics.median(r["server_cpu_seconds"] for r in runs),
            "other_cpu_seconds_median": statistics.median(r["other_cpu_seconds"] for r in runs),
        }
        if all("read_amplification" in r for r in runs):  # the Hub server counts bytes
            summary[contender]["read_amplification_median"] = statistics.median(
                r["read_amplification"] for r in runs
            )
    return summary


def _ratios(rounds_by_workload: dict[str, list[dict[str, dict[str, Any]]]]) -> list[dict[str, Any]]:
    out = []
    for workload, num, den, target in RATIOS:
        rounds = rounds_by_workload.get(workload)
        if not rounds:
            continue
        # Per round (side by side in time), then median and range over the rounds.
        per_round = [r[num]["samples_per_s"] / r[den]["samples_per_s"] for r in rounds]
        median = statistics.median(per_round)
        out.append(
            {
                "workload": workload,
                "numerator": num,
                "denominator": den,
                "target": target,
                "median": median,
                "min": min(per_round),
                "max": max(per_round),
                "per_round": per_round,
                "met": median >= target,
            }
        )
    return out


def _print_workload(workload: str, faults: dict[str, Any], summary: dict[str, Any]) -> None:
    print(f"\n== {workload}: {faults}")
    print(
        f"{'contender':<18} {'samples/s (median [min-max])':>32} {'MB/s':>7} {'TTFS s':>7} "
        f"{'CDN req':>7} {'bytes/used':>10} {'peak RSS':>9} {'CPU s':>6} {'other CPU s':>11}"
    )
    for contender, s in summary.items():
        r = s["samples_per_s"]
        ttfs = s["time_to_first_sample_median"]
        print(
            f"{contender:<18} {r['median']:>12.0f} [{r['min']:>7.0f}-{r['max']:>7.0f}]    "
            f"{s['mb_per_s_median']:>7.1f} {ttfs if ttfs is not None else float('nan'):>7.2f} "
            f"{s['requests_median']['cdn']:>7.0f} {s['read_amplification_median']:>10.3f} "
            f"{s['peak_rss_max'] / MiB:>6.0f}MiB {s['cpu_seconds_median']:>6.1f} "
            f"{s['other_cpu_seconds_median']:>11.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="small shards, 2 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (default 3)")
    parser.add_argument("--data-dir", type=Path, default=HERE / ".data")
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated: capped,uncapped"
    )
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--idle",
        default="0.5,60",
        help="before each run wait until other load <= CPUS for at most SECONDS (CPUS,SECONDS)",
    )
    args = parser.parse_args(argv)

    if args.worker:
        spec = json.loads(args.worker)
        result = _worker(spec)
        Path(spec["result_path"]).write_text(json.dumps(result))
        return 0

    from aiostream_hf.testing import Faults, HubServer

    if shutil.which("curl") is None:
        raise SystemExit(
            "webdataset reads http URLs through `curl`, which is missing: "
            "apt-get install -y curl (see benchmarks/README.md)"
        )
    profile = "quick" if args.quick else "full"
    busy, wait = (float(x) for x in args.idle.split(","))
    idle = (busy, wait)
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 3)
    started = time.perf_counter()
    environment = _environment()
    stamp = _ensure_shards(args.data_dir, PROFILES[profile])
    hub_root = Path(stamp["root"]) / "hub"
    log_dir = Path(tempfile.mkdtemp(prefix="aiostream-wds-bench-logs-"))
    results: dict[str, Any] = {
        "benchmark": "webdataset",
        "environment": environment,
        "parameters": {
            "profile": profile,
            "data": PROFILES[profile],
            "shards_bytes": stamp["bytes"],
            "samples": stamp["samples"],
            "rounds": rounds,
            "warmup_rounds": 1,
            "prefetch_bytes": PREFETCH_BYTES,
            "rss_allowance": RSS_ALLOWANCE,
            "idle": {"max_busy_cpus": busy, "max_wait_seconds": wait},
            "workloads": {w: WORKLOADS[w] for w in args.workloads.split(",")},
        },
        "workloads": {},
    }
    rounds_by_workload: dict[str, list[dict[str, dict[str, Any]]]] = {}
    for workload in args.workloads.split(","):
        spec = WORKLOADS[workload]
        faults = Faults(**spec["faults"])
        with HubServer(hub_root, subprocess=True, faults=faults) as hub:
            n = len(stamp["files"])
            url = hub.url(REPO, f"data/train-{{000000..{n - 1:06d}}}.tar")
            url = url.replace("%7B", "{").replace("%7D", "}")
            measured: list[dict[str, dict[str, Any]]] = []
            for i, order in enumerate(_harness.rotations(spec["contenders"], rounds + 1)):
                tag = f"{workload}-r{i}"
                got = {}
                for contender in order:
                    got[contender] = _run_contender(
                        hub, contender, workload, stamp, url, log_dir, tag, idle
                    )
                    print(
                        f"  {tag} {contender:<18} {got[contender]['samples_per_s']:>9.0f} "
                        f"samples/s {got[contender]['mb_per_s']:>7.1f} MB/s",
                        flush=True,
                    )
                if i > 0:  # round 0 is the warm-up
                    measured.append({c: got[c] for c in spec["contenders"]})
        rounds_by_workload[workload] = measured
        summary = _summarize(measured)
        results["workloads"][workload] = {"summary": summary, "rounds": measured}
        _print_workload(workload, spec["faults"], summary)

    ratios = _ratios(rounds_by_workload)
    results["ratios"] = ratios
    print("\n== ratios (per round, side by side; median [min-max])")
    for r in ratios:
        print(
            f"{r['workload']:<9} {r['numerator']} / {r['denominator']}: {r['median']:.2f} "
            f"[{r['min']:.2f}-{r['max']:.2f}]  target >= {r['target']}  "
            f"{'met' if r['met'] else 'MISSED'}"
        )
    rss = []
    for workload, w in results["workloads"].items():
        for contender in ("aiostream", "aiostream-sync"):
            if contender in w["summary"]:
                peak = w["summary"][contender]["peak_rss_max"]
                limit = PREFETCH_BYTES + RSS_ALLOWANCE
                rss.append(
                    {
                        "workload": workload,
                        "contender": contender,
                        "peak_rss": peak,
                        "limit": limit,
                        "met": peak <= limit,
                    }
                )
    results["rss"] = rss
    print(f"\n== peak RSS (prefetch budget {PREFETCH_BYTES / MiB:.0f} MiB + 300 MiB)")
    for r in rss:
        print(
            f"{r['workload']:<9} {r['contender']:<15} {r['peak_rss'] / MiB:>6.0f} MiB "
            f"<= {r['limit'] / MiB:.0f} MiB  {'met' if r['met'] else 'MISSED'}"
        )
    results["duration_seconds"] = time.perf_counter() - started
    out = args.output or HERE / "results" / (
        "webdataset-quick.json" if args.quick else "webdataset.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out} (logs in {log_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
