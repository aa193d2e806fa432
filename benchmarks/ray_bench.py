"""Ray Data: aiostream_hf.ray.read beside ray.data.read_parquet over HfFileSystem.

    .venv/bin/python benchmarks/ray_bench.py            # 1 warm-up + 3 rounds (~3 min)
    .venv/bin/python benchmarks/ray_bench.py --quick    # smoke test (< 1 min)

The same text Parquet repo (parquet_bench's generator) is read into a Ray Dataset by
a local Ray cluster of ``--cpus`` CPUs, with the local Hub server in its own process
and ``--latency-ms`` (default 20) added to every request:

* ``aiostream-ray``: ``aiostream_hf.ray.read("hf://datasets/...", split="train")``:
  the driver resolves once, the read tasks stream their files with the engine;
* ``ray-hffs``: ``ray.data.read_parquet(paths, filesystem=HfFileSystem(endpoint=...))``
  (the paths from ``HfFileSystem.glob``, as a user would list them): Ray's own Parquet
  reader, each task reading through fsspec;
* ``ray-local``: ``ray.data.read_parquet`` of the same files on local disk: the limit.

Both readers run with Ray's defaults (no ``override_num_blocks``). Every contender
runs in a fresh process that starts its own cluster (``ray.init``, not timed); the time
runs from the read call to the last row taken at the driver
(``ds.iter_batches(batch_size=None, batch_format="pyarrow")``), so resolution,
planning, scheduling and the tasks' reads all count. Request counts (api, resolvers,
cdn) come from the server's stats, reset before each run. One warm-up round, then
``--rounds`` rounds in a rotating order. Prints a table and writes
``benchmarks/results/ray.json`` (``ray-quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _harness  # benchmarks/_harness.py: this script's folder is on sys.path

HERE = Path(__file__).resolve().parent
MB = 1e6
CONTENDERS = ["aiostream-ray", "ray-hffs", "ray-local"]
RATIOS = [  # (workload, numerator, denominator, target)
    ("text", "aiostream-ray", "ray-hffs", 1.0),
]
BUCKETS = ("api", "resolvers", "cdn")
PROFILES = {
    "full": {"files": 8, "rows": 6_000, "row_group_size": 1_500},
    "quick": {"files": 4, "rows": 1_000, "row_group_size": 250},
}
PACKAGES = ("aiostream-hf", "ray", "pyarrow", "huggingface_hub", "fsspec", "httpx2", "uvicorn")


# =============================================================================
# Worker: one contender, one read of the repo into a Ray Dataset, in a fresh process.
# =============================================================================


def _no_fsspec_http() -> None:
    """Ray 2.60's path resolution imports fsspec's HTTPFileSystem from a thread pool (in
    the driver and in its ListFiles tasks). Without aiohttp (not installed here) the
    first import fails in one thread while another sees the half-made module and raises
    an ImportError that Ray does not catch. Ray takes a missing module to mean "no HTTP
    filesystem": make that answer immediate, in every process, for every contender."""
    sys.modules.setdefault("fsspec.implementations.http", None)  # type: ignore[arg-type]


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    import ray
    import ray.data

    contender = spec["contender"]
    _no_fsspec_http()
    ray.init(
        num_cpus=spec["cpus"],
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        runtime_env={"worker_process_setup_hook": _no_fsspec_http},
    )
    ray.data.DataContext.get_current().enable_progress_bars = False

    @ray.remote
    def started() -> int:
        time.sleep(0.5)  # held, so that each CPU's worker process starts
        return os.getpid()

    # The workers start before the clock, as in a cluster that is already up.
    ray.get([started.remote() for _ in range(spec["cpus"])])
    try:
        t0 = time.perf_counter()
        if contender == "aiostream-ray":
            import aiostream_hf as ash
            import aiostream_hf.ray

            ds = aiostream_hf.ray.read(
                f"hf://datasets/{spec['repo']}",
                split="train",
                endpoint=spec["endpoint"],
                options=ash.StreamOptions(cache_dir=Path(spec["cache_dir"])),
            )
        elif contender == "ray-hffs":
            from huggingface_hub import HfFileSystem

            fs = HfFileSystem(endpoint=spec["endpoint"], skip_instance_cache=True)
            paths = sorted(fs.glob(f"datasets/{spec['repo']}/data/*.parquet"))
            ds = ray.data.read_parquet(paths, filesystem=fs)
        elif contender == "ray-local":
            ds = ray.data.read_parquet(spec["local_files"])
        else:
            raise SystemExit(f"unknown contender {contender!r}")
        rows = 0
        first: float | None = None
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            if first is None:
                first = time.perf_counter() - t0
            rows += batch.num_rows
        elapsed = time.perf_counter() - t0
    finally:
        ray.shutdown()
    return {
        "contender": contender,
        "rows": rows,
        "seconds": elapsed,
        "time_to_first_row": first,
        **_harness.process_usage(),
    }


# =============================================================================
# Driver
# =============================================================================


def _run_tree(cmd: list[str], env: dict[str, str], log: Path) -> tuple[int, float, int]:
    """Run ``cmd`` to its end; (exit status, CPU seconds and peak RSS of its process
    tree). A Ray driver's cluster (GCS, raylet, workers) is its tree: polled, since
    those processes are not all reaped by the driver, so its rusage misses them."""
    import psutil

    cpu: dict[int, float] = {}
    peak = 0
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        started = time.perf_counter()
        try:
            root = psutil.Process(proc.pid)
            while proc.poll() is None:
                rss = 0
                with contextlib.suppress(psutil.NoSuchProcess):
                    for p in [root, *root.children(recursive=True)]:
                        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                            t = p.cpu_times()
                            cpu[p.pid] = t.user + t.system
                            rss += p.memory_info().rss
                peak = max(peak, rss)
                if time.perf_counter() - started > 600:
                    raise RuntimeError(f"{cmd[-1][:80]}... timed out after 600 s")
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return proc.returncode, sum(cpu.values()), peak


def _run(
    args: argparse.Namespace, hub: Any, contender: str, stamp: dict[str, Any], repo_root: Path
) -> dict[str, Any]:
    """One run of one contender in a fresh process, on a quiet machine (repeated, up to
    ``--retries`` times, while the rest of the machine was busier than ``--max-noise``)."""
    discarded: list[dict[str, Any]] = []
    while True:
        waited, _ = _harness.wait_for_idle(args.idle_cpus, args.idle_wait)
        tmp = Path(tempfile.mkdtemp(prefix="aiostream-ray-bench-"))
        try:
            spec = {
                "contender": contender,
                "repo": stamp["repo"],
                "endpoint": hub.endpoint,
                "cpus": args.cpus,
                "cache_dir": str(tmp / "aiostream-cache"),
                "local_files": [str(repo_root / f["path"]) for f in stamp["files"]],
                "result_path": str(tmp / "result.json"),
            }
            hub.reset_stats()
            server = _harness.server_process(hub)
            server_cpu = _harness.cpu_seconds(server)
            busy = _harness.machine_busy_seconds()
            started = time.perf_counter()
            log = tmp / "worker.log"
            code, tree_cpu, peak_rss = _run_tree(
                [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                _harness.worker_env(hub.endpoint, tmp, RAY_USAGE_STATS_ENABLED="0"),
                log,
            )
            wall = time.perf_counter() - started
            busy = _harness.machine_busy_seconds() - busy
            server_cpu = _harness.cpu_seconds(server) - server_cpu
            stats = hub.stats().to_json()
            if code != 0:
                raise RuntimeError(f"{contender} exited with {code}:\n{log.read_text()[-3000:]}")
            r = json.loads(Path(spec["result_path"]).read_text())
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if r["rows"] != stamp["rows"]:
            raise RuntimeError(f"{contender} read {r['rows']} rows, expected {stamp['rows']}")
        # What the machine did beyond the contender's process tree (its Ray cluster
        # included) and the server is the rest of the machine's: this run's noise.
        other = busy - tree_cpu - (server_cpu if server_cpu == server_cpu else 0.0)
        r.update(
            tree_cpu_seconds=tree_cpu,
            peak_rss=peak_rss,
            rows_per_s=r["rows"] / r["seconds"],
            mb_per_s=stamp["bytes"] / MB / r["seconds"],
            process_wall_seconds=wall,
            server_cpu_seconds=server_cpu,
            other_cpu_seconds=other,
            noise_cpus=max(0.0, other) / wall,
            idle_wait_seconds=waited,
            requests={b: stats["by_bucket"].get(b, 0) for b in BUCKETS},
            status_429=int(stats.get("by_status", {}).get("429", 0)),
            bytes_served=stats["bytes_served"],
            read_amplification=stats["bytes_served"] / stamp["bytes"],
            server=stats,
        )
        if r["noise_cpus"] <= args.max_noise or len(discarded) >= args.retries:
            r["attempts"] = len(discarded) + 1
            r["discarded_attempts"] = discarded
            return r
        discarded.append({k: r[k] for k in ("rows_per_s", "seconds", "noise_cpus")})
        print(f"    (run of {contender} discarded: {r['noise_cpus']:.2f} other CPUs busy; again)")


def _summarize(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for c in CONTENDERS:
        runs = [r[c] for r in rounds if c in r]
        if not runs:
            continue
        rps = [x["rows_per_s"] for x in runs]
        out[c] = {
            "runs": len(runs),
            "rows": runs[0]["rows"],
            "rows_per_s_median": _harness.median(rps),
            "rows_per_s_min": min(rps),
            "rows_per_s_max": max(rps),
            "mb_per_s_median": _harness.median(x["mb_per_s"] for x in runs),
            "seconds_median": _harness.median(x["seconds"] for x in runs),
            "time_to_first_row_median": _harness.median(x["time_to_first_row"] for x in runs),
            "requests_median": {
                b: _harness.median(float(x["requests"][b]) for x in runs) for b in BUCKETS
            },
            "status_429_total": sum(x["status_429"] for x in runs),
            "read_amplification_median": _harness.median(x["read_amplification"] for x in runs),
            "tree_cpu_seconds_median": _harness.median(x["tree_cpu_seconds"] for x in runs),
            "peak_rss_median": _harness.median(x["peak_rss"] for x in runs),
            "server_cpu_seconds_median": _harness.median(x["server_cpu_seconds"] for x in runs),
            "noise_cpus_median": _harness.median(x["noise_cpus"] for x in runs),
            "discarded_attempts": sum(len(x["discarded_attempts"]) for x in runs),
        }
    return out


def _ratios(rounds: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [
        _harness.ratio_entry(
            workload,
            num,
            den,
            target,
            [r[num]["rows_per_s"] / r[den]["rows_per_s"] for r in rounds],
        )
        for workload, num, den, target in RATIOS
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small data, 1 round: a smoke test")
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=None, help="measured rounds (default 3; 1 quick)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up rounds, not reported")
    p.add_argument("--cpus", type=int, default=2, help="CPUs of each contender's Ray cluster")
    _harness.add_quiet_options(p)
    p.add_argument("--data-dir", type=Path, default=HERE / ".data")
    p.add_argument("--out", type=Path, default=None, help="results JSON path")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        spec = json.loads(args.worker)
        Path(spec["result_path"]).write_text(json.dumps(_worker(spec)))
        return 0

    import httpx2
    import parquet_bench  # the same text Parquet generator as the Parquet benchmark

    from aiostream_hf.testing import Faults, HubServer

    # SIGTERM (and SIGINT) unwind normally, so the Hub server subprocess is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    quiet = _harness.quiet_parameters(args)
    profile = "quick" if args.quick else "full"
    n_rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    out_path = args.out or HERE / "results" / ("ray-quick.json" if args.quick else "ray.json")
    data_dir = args.data_dir.resolve() / f"ray-{profile}"
    stamp = parquet_bench._ensure_repo(data_dir, "text", PROFILES[profile])
    env = _harness.environment(PACKAGES)
    params = {
        "profile": profile,
        "latency_ms": args.latency_ms,
        "rounds": n_rounds,
        "warmup_rounds": args.warmup,
        "ray_cpus": args.cpus,
        "workload": stamp["params"],
        "timed": "from the read call to the last row at the driver (ray.init not timed)",
        "consumption": "ds.iter_batches(batch_size=None, batch_format='pyarrow')",
        "ray_parallelism": "Ray's defaults (no override_num_blocks) for every contender",
        **quiet,
    }
    print(
        f"ray_bench: {profile}, latency {args.latency_ms:g} ms, {args.warmup} warm-up + "
        f"{n_rounds} rounds, Ray {env['packages']['ray']} with {args.cpus} CPUs; "
        f"{stamp['repo']}: {len(stamp['files'])} files, {stamp['rows']:,} rows, "
        f"{stamp['bytes'] / MB:,.0f} MB",
        flush=True,
    )
    started = time.perf_counter()
    hub_root = data_dir / "hub"
    repo_root = hub_root / "datasets" / stamp["repo"]
    warmups: list[dict[str, dict[str, Any]]] = []
    rounds: list[dict[str, dict[str, Any]]] = []
    with HubServer(hub_root, subprocess=True, faults=Faults(latency_ms=args.latency_ms)) as hub:
        # The server hashes a repo's files on first sight; not inside somebody's run.
        httpx2.get(
            f"{hub.endpoint}/api/datasets/{stamp['repo']}/tree/main",
            params={"recursive": "true"},
            timeout=600,
        ).raise_for_status()
        order = [CONTENDERS] * args.warmup + _harness.rotations(CONTENDERS, n_rounds)
        for i, names in enumerate(order):
            warm = i < args.warmup
            tag = f"warmup{i}" if warm else f"round{i - args.warmup}"
            this: dict[str, dict[str, Any]] = {}
            for c in names:
                r = _run(args, hub, c, stamp, repo_root)
                r["order"] = names.index(c)
                this[c] = r
                req = r["requests"]
                print(
                    f"  [{time.perf_counter() - started:5.0f}s] {tag:<8} {c:<14} "
                    f"{r['rows_per_s']:>9,.0f} rows/s {r['mb_per_s']:6.1f} MB/s "
                    f"first {r['time_to_first_row']:5.2f}s "
                    f"req api/res/cdn {req['api']}/{req['resolvers']}/{req['cdn']}",
                    flush=True,
                )
            (warmups if warm else rounds).append(this)

    summary = _summarize(rounds)
    results = {
        "benchmark": "ray",
        "environment": env,
        "parameters": params,
        "workloads": {
            "text": {
                "repo": stamp["repo"],
                "files": len(stamp["files"]),
                "rows": stamp["rows"],
                "bytes": stamp["bytes"],
                "params": stamp["params"],
                "contenders": CONTENDERS,
                "summary": summary,
                "rounds": rounds,
                "warmup_rounds": warmups,
            }
        },
        "ratios": _ratios(rounds),
        "duration_seconds": time.perf_counter() - started,
    }

    print()
    print(
        f"ray_bench ({profile}): {env['date']}, {env['platform']}, {env['cpu_count']} CPUs; "
        f"{stamp['repo']}, {len(stamp['files'])} files, {stamp['rows']:,} rows, "
        f"{stamp['bytes'] / MB:,.0f} MB"
    )
    header = (
        f"{'contender':<14} {'rows/s median':>13} {'(min-max)':>19} {'MB/s':>6} {'1st row':>7} "
        f"{'api':>4} {'res':>4} {'cdn':>5} {'fetched':>7} {'CPU s':>6} {'RSS MiB':>7}"
    )
    print(header)
    print("-" * len(header))
    for c, s in summary.items():
        span = f"({s['rows_per_s_min']:,.0f}-{s['rows_per_s_max']:,.0f})"
        req = s["requests_median"]
        print(
            f"{c:<14} {s['rows_per_s_median']:>13,.0f} {span:>19} {s['mb_per_s_median']:>6.1f} "
            f"{s['time_to_first_row_median']:>6.2f}s {req['api']:>4.0f} {req['resolvers']:>4.0f} "
            f"{req['cdn']:>5.0f} {s['read_amplification_median']:>6.2f}x "
            f"{s['tree_cpu_seconds_median']:>6.1f} {s['peak_rss_median'] / 2**20:>7.0f}"
        )
    print(
        "\n   time = read call to last row at the driver (ray.init excluded); api/res/cdn = "
        "server requests by bucket (medians);\n   fetched = bytes served / bytes of the files "
        "(ray-local reads local disk: 0); CPU s, RSS = the contender's process tree\n"
        "   (its Ray cluster included), for the whole run\n"
    )
    for r in results["ratios"]:
        verdict = "met" if r["met"] else "MISSED"
        print(
            f"{r['workload']}: {r['ratio']} = {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f}) "
            f"target >= {r['target']:.1f}x {verdict}"
        )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"\nwrote {out_path} ({results['duration_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
