"""Many workers under the Hub's real quotas: 64 spawned DataLoader workers, aiostream-hf
beside ``datasets``, against a local Hub server that counts requests per client in
fixed windows as the Hub does for anonymous users (API 500, resolvers 3,000).

    .venv/bin/python benchmarks/quota_bench.py                 # full: 10,000 files, 64
                                                               #   workers, 5-minute windows
    .venv/bin/python benchmarks/quota_bench.py --scaled        # the same quotas, 30 s windows
    .venv/bin/python benchmarks/quota_bench.py --quick         # 600 files, 8 workers, quotas
                                                               #   and window scaled down

Wrap it in ``flock /work/bench.lock`` on a shared machine.

The repo: ``--files`` tiny Parquet files (``data/train-XXXXX-of-NNNNN.parquet``, 10 rows
each, ids 0..rows-1). The server: its own process, 20 ms added to every request, and
``RateLimits(api=500, resolvers=3000, window_s=300)`` (``hub_anonymous()``); the quota
is reset (a fresh window) before each contender. Requests are counted per client
address, so the parent and all its workers spend one quota, as on the Hub; each process
sees only the ``RateLimit`` headers of its own answers.

* ``aiostream``: ``DataLoader(StreamDataset("hf://datasets/bench/quota", columns=["id"],
  options=StreamOptions(cache_dir=<fresh tmp>)), batch_size=64, num_workers=W,
  multiprocessing_context="spawn")``. The parent resolves the repo (API); each worker
  resolves its files (``/resolve/``, the resolvers bucket) and reads them from the CDN.
  The workers share one rate-limit count in the cache folder (docs/reliability.md).
* ``datasets``: ``DataLoader(load_dataset("bench/quota", split="train",
  streaming=True).select_columns(["id"]), ...)`` with the same loader arguments,
  ``HF_ENDPOINT`` set to the server and fresh ``HF_HOME``/``HF_DATASETS_CACHE``: what
  ``datasets`` does under the same quotas (its retries of 429s) is recorded as it is.

Recorded per contender (server stats, not the client's): 429s; requests by bucket at
construction (the parent's resolution), at the first batch and at the end; API requests
made after construction (by the workers: the parent's DataLoader loop makes none);
worker errors (the exception that ended the epoch, if any); rows delivered, distinct
ids, and whether every row arrived exactly once; time to first batch and epoch time
(from before the dataset is constructed, after the imports); the peak of the summed
RSS of the process tree, sampled every second (shared pages counted in each process).

Scaling, stated in the JSON (``parameters.scaled``): the full profile keeps the Hub's
5-minute windows, so 10,000 resolutions need 4 windows (at least 15 minutes per
contender, more for a contender needing more requests per file). ``--scaled`` keeps the
quotas and shortens the window to 30 s (``--window-s`` to choose); ``--quick`` also
scales the quotas down (resolvers 200, API 100, 10 s windows) for a smoke test.

Ratios, per round, side by side: ``datasets`` time to first batch and epoch time over
``aiostream``'s; and aiostream's own counts against their targets (0 429s, 0 worker
errors, 0 API requests in workers, every row once). Writes
``benchmarks/results/quota.json`` (``quota-scaled.json`` with --scaled,
``quota-quick.json`` with --quick).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import _harness  # benchmarks/_harness.py: this script's folder is on sys.path

_MODULE_START = time.perf_counter()
HERE = Path(__file__).resolve().parent
REPO = "bench/quota"
BUCKETS = ("api", "resolvers", "pages", "cdn")
CONTENDERS = ("aiostream", "datasets")
PROFILES: dict[str, dict[str, Any]] = {
    "full": {
        "files": 10_000,
        "rows_per_file": 10,
        "workers": 64,
        "batch_size": 64,
        "api_quota": 500,
        "resolvers_quota": 3000,
        "window_s": 300.0,
    },
    "scaled": {
        "files": 10_000,
        "rows_per_file": 10,
        "workers": 64,
        "batch_size": 64,
        "api_quota": 500,
        "resolvers_quota": 3000,
        "window_s": 30.0,
    },
    "quick": {
        "files": 600,
        "rows_per_file": 10,
        "workers": 8,
        "batch_size": 64,
        "api_quota": 100,
        "resolvers_quota": 200,
        "window_s": 10.0,
    },
}
CONTENDER_TIMEOUT_S = 3 * 3600


# =============================================================================
# Worker: one contender, in its own process (its DataLoader workers below it).
# =============================================================================


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch.utils.data

    ds, t0 = _harness.loader_dataset(spec["contender"], REPO, spec, id_only=True)
    imported = t0
    constructed = time.perf_counter() - t0
    pause = _harness.signal_driver("CONSTRUCTED")
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=spec["batch_size"],
        num_workers=spec["workers"],
        multiprocessing_context="spawn",
    )
    first = None
    batches = rows = 0
    ids: set[int] = set()
    error = None
    try:
        for batch in loader:
            batches += 1
            rows += len(batch["id"])
            ids.update(int(i) for i in batch["id"])
            if first is None:
                first = time.perf_counter() - t0 - pause
                pause += _harness.signal_driver("FIRST_BATCH")
    except Exception as exc:  # a worker's error ends the epoch: record it
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]
    elapsed = time.perf_counter() - t0 - pause
    del loader  # shut the workers down before measuring CPU
    usage = _harness.process_usage()
    return {
        "contender": spec["contender"],
        "import_seconds": imported - _MODULE_START,
        "construct_seconds": constructed,
        "time_to_first_batch": first,
        "seconds": elapsed,
        "ack_pause_seconds": pause,
        "batches": batches,
        "rows": rows,
        "distinct_ids": len(ids),
        "id_range_ok": bool(ids) and min(ids) == 0 and max(ids) == len(ids) - 1,
        "worker_errors": [] if error is None else [error],
        "cpu_seconds": usage["cpu_user"] + usage["cpu_system"],
    }


# =============================================================================
# Data: generated once under --data-dir.
# =============================================================================


def _ensure_repo(data_dir: Path, params: dict[str, Any]) -> Path:
    from aiostream_hf.testing import make_text_parquet

    data_dir.mkdir(parents=True, exist_ok=True)
    ignore = data_dir / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# generated benchmark data\n*\n")
    files, rows = params["files"], params["rows_per_file"]
    hub_root = data_dir / f"quota-{files}" / "hub"
    data = hub_root / "datasets" / REPO / "data"
    paths = [data / f"train-{i:05d}-of-{files:05d}.parquet" for i in range(files)]
    if data.is_dir() and len(list(data.iterdir())) == files and all(p.is_file() for p in paths):
        return hub_root
    print(f"generating {files} Parquet files under {data} ...", flush=True)
    started = time.perf_counter()
    shutil.rmtree(hub_root, ignore_errors=True)
    for i, p in enumerate(paths):
        make_text_parquet(p, rows=rows, min_text=5, max_text=20, seed=i, start_id=i * rows)
    print(f"  done in {time.perf_counter() - started:.0f} s", flush=True)
    return hub_root


# =============================================================================
# Driver
# =============================================================================

PACKAGES = ("aiostream-hf", "datasets", "huggingface-hub", "torch", "pyarrow", "httpx2")


def _buckets(stats: Any) -> dict[str, int]:
    return {b: int(stats.by_bucket.get(b, 0)) for b in BUCKETS}


def _tree_rss(proc: Any) -> int:
    import psutil

    total = 0
    with contextlib.suppress(psutil.NoSuchProcess):
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += p.memory_info().rss
    return total


def _run_contender(
    hub: Any,
    contender: str,
    params: dict[str, Any],
    limits: Any,
    log_dir: Path,
    tag: str,
    min_available: float,
) -> dict[str, Any]:
    import psutil

    tmp = Path(tempfile.mkdtemp(prefix="aiostream-quota-bench-"))
    try:
        spec = {
            "contender": contender,
            "endpoint": hub.endpoint,
            "cache_dir": str(tmp / "cache"),
            "workers": params["workers"],
            "batch_size": params["batch_size"],
            "result_path": str(tmp / "result.json"),
        }
        log_path = log_dir / f"{tag}-{contender}.log"
        hub.set_rate_limits(limits)  # a fresh window for each contender
        hub.reset_stats()
        seen: dict[str, dict[str, Any]] = {}
        peak_rss = 0
        least_available = psutil.virtual_memory().available
        ps: Any = None

        def on_signal(what: str) -> None:
            stats = hub.stats()
            seen[what] = {"by_bucket": _buckets(stats), "throttled": stats.throttled}
            print(f"    {contender} {what.lower()}: {seen[what]}", flush=True)

        def poll(pid: int) -> None:
            nonlocal peak_rss, least_available, ps
            ps = ps or psutil.Process(pid)
            peak_rss = max(peak_rss, _tree_rss(ps))
            least_available = min(least_available, psutil.virtual_memory().available)
            if least_available < min_available:
                raise RuntimeError(
                    f"{contender}: the machine has {least_available / 2**30:.1f} GiB "
                    "of memory left (--min-available-gb): stopped, with "
                    f"{params['workers']} workers; use fewer (--workers)"
                )

        returncode, wall = _harness.run_signalling_worker(
            Path(__file__).resolve(),
            spec,
            _harness.worker_env(hub.endpoint, tmp),
            log_path,
            on_signal=on_signal,
            poll=poll,
            timeout=CONTENDER_TIMEOUT_S,
        )
        stats = hub.stats()
        if returncode != 0:
            raise RuntimeError(
                f"{contender} exited with {returncode}:\n{log_path.read_text()[-3000:]}"
            )
        result: dict[str, Any] = json.loads(Path(spec["result_path"]).read_text())
        expected = params["files"] * params["rows_per_file"]
        at_exit = _buckets(stats)
        constructed = seen.get("CONSTRUCTED", {}).get("by_bucket", dict.fromkeys(BUCKETS, 0))
        first = seen.get("FIRST_BATCH", {}).get("by_bucket")
        result.update(
            process_wall_seconds=wall,
            expected_rows=expected,
            every_row_once=(
                result["rows"] == expected
                and result["distinct_ids"] == expected
                and result["id_range_ok"]
            ),
            duplicate_rows=result["rows"] - result["distinct_ids"],
            missing_rows=expected - result["distinct_ids"],
            http_429=int(stats.throttled),
            requests_at_construction=constructed,
            requests_at_first_batch=first,
            requests_at_exit=at_exit,
            api_requests=at_exit["api"],
            api_requests_after_construction=at_exit["api"] - constructed["api"],
            throttled_at_first_batch=seen.get("FIRST_BATCH", {}).get("throttled"),
            peak_tree_rss=peak_rss,
            least_available_memory=least_available,
            server_at_exit=stats.to_json(),
        )
        if result["time_to_first_batch"] is not None and result["seconds"] > 0:
            result["rows_per_s"] = result["rows"] / result["seconds"]
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _stat(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _summarize(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for contender in CONTENDERS:
        runs = [r[contender] for r in rounds]
        firsts = [r["time_to_first_batch"] for r in runs if r["time_to_first_batch"] is not None]
        summary[contender] = {
            "epoch_seconds": _stat([r["seconds"] for r in runs]),
            "time_to_first_batch": _stat(firsts) if firsts else None,
            "http_429_median": statistics.median(r["http_429"] for r in runs),
            "worker_errors": sum(len(r["worker_errors"]) for r in runs),
            "every_row_once": all(r["every_row_once"] for r in runs),
            "rows_median": statistics.median(r["rows"] for r in runs),
            "api_requests_median": statistics.median(r["api_requests"] for r in runs),
            "api_requests_after_construction_median": statistics.median(
                r["api_requests_after_construction"] for r in runs
            ),
            "requests_at_exit_median": {
                b: statistics.median(r["requests_at_exit"][b] for r in runs) for b in BUCKETS
            },
            "peak_tree_rss_median": statistics.median(r["peak_tree_rss"] for r in runs),
        }
    return summary


def _ratios(rounds: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    ratios = []
    for workload, key in (("time_to_first_batch", "time_to_first_batch"), ("epoch", "seconds")):
        per_round = [
            r["datasets"][key] / r["aiostream"][key]
            for r in rounds
            if r["datasets"][key] and r["aiostream"][key]
        ]
        if per_round:
            ratios.append(_harness.ratio_entry(workload, "datasets", "aiostream", 1.0, per_round))

    def count(workload: str, what: str, values: list[float], target: str, ok: bool) -> None:
        ratios.append(
            {
                "workload": workload,
                "ratio": what,
                "target": target,
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
                "per_round": values,
                "met": ok,
            }
        )

    ours = [r["aiostream"] for r in rounds]
    count(
        "429s",
        "aiostream HTTP 429s (server stats)",
        [float(r["http_429"]) for r in ours],
        "<= 0",
        all(r["http_429"] == 0 for r in ours),
    )
    count(
        "worker errors",
        "aiostream worker errors",
        [float(len(r["worker_errors"])) for r in ours],
        "<= 0",
        all(not r["worker_errors"] for r in ours),
    )
    count(
        "API in workers",
        "aiostream API requests after construction",
        [float(r["api_requests_after_construction"]) for r in ours],
        "<= 0",
        all(r["api_requests_after_construction"] == 0 for r in ours),
    )
    count(
        "rows",
        "aiostream distinct rows / expected (each once)",
        [r["distinct_ids"] / r["expected_rows"] for r in ours],
        ">= 1",
        all(r["every_row_once"] for r in ours),
    )
    return ratios


def _print(summary: dict[str, Any]) -> None:
    print(
        f"\n{'contender':<10} {'TTFB s':>8} {'epoch s':>8} {'429s':>6} {'errors':>6} "
        f"{'rows once':>9} {'api':>5} {'api@wk':>6} {'resolv':>7} {'cdn':>7} {'RSS GB':>7}"
    )
    for contender, s in summary.items():
        t = s["time_to_first_batch"]
        x = s["requests_at_exit_median"]
        print(
            f"{contender:<10} {t['median'] if t else float('nan'):>8.1f} "
            f"{s['epoch_seconds']['median']:>8.1f} {s['http_429_median']:>6.0f} "
            f"{s['worker_errors']:>6} {'yes' if s['every_row_once'] else 'NO':>9} "
            f"{s['api_requests_median']:>5.0f} {s['api_requests_after_construction_median']:>6.0f} "
            f"{x['resolvers']:>7.0f} {x['cdn']:>7.0f} {s['peak_tree_rss_median'] / 1e9:>7.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="600 files, 8 workers, scaled quotas")
    group.add_argument("--scaled", action="store_true", help="the full run with 30 s windows")
    parser.add_argument("--rounds", type=int, default=1, help="measured rounds (default 1)")
    parser.add_argument("--workers", type=int, default=None, help="DataLoader workers")
    parser.add_argument("--files", type=int, default=None)
    parser.add_argument("--window-s", type=float, default=None, help="rate-limit window, s")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument(
        "--min-available-gb",
        type=float,
        default=2.0,
        help="stop a contender when the machine's available memory falls below this",
    )
    parser.add_argument("--data-dir", type=Path, default=HERE / ".data")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)

    if args.worker:
        spec = json.loads(args.worker)
        result = _worker(spec)
        Path(spec["result_path"]).write_text(json.dumps(result))
        return 0

    import httpx2

    from aiostream_hf.testing import Faults, HubServer, RateLimits

    profile = "quick" if args.quick else "scaled" if args.scaled else "full"
    params = dict(PROFILES[profile])
    for name in ("workers", "files", "window_s"):
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    contenders = [c for c in args.contenders.split(",") if c]
    limits = RateLimits(
        api=params["api_quota"],
        resolvers=params["resolvers_quota"],
        window_s=params["window_s"],
    )
    hub_quotas = RateLimits.hub_anonymous()
    scaled = {
        "window": params["window_s"] != hub_quotas.window_s,
        "quotas": (params["api_quota"], params["resolvers_quota"])
        != (hub_quotas.api, hub_quotas.resolvers),
    }
    started = time.perf_counter()
    environment = _harness.environment(PACKAGES)
    hub_root = _ensure_repo(args.data_dir, params)
    log_dir = Path(tempfile.mkdtemp(prefix="aiostream-quota-bench-logs-"))
    results: dict[str, Any] = {
        "benchmark": "quota",
        "environment": environment,
        "parameters": {
            "profile": profile,
            "data": params,
            "repo": REPO,
            "latency_ms": args.latency_ms,
            "rounds": args.rounds,
            "warmup_rounds": 0,
            "contenders": contenders,
            "rate_limits": {
                "api": limits.api,
                "resolvers": limits.resolvers,
                "window_s": limits.window_s,
                "per": "client address (the parent and all its workers spend one quota)",
            },
            "scaled": scaled,
            "scaling": (
                "none: the Hub's anonymous quotas and 5-minute windows"
                if not any(scaled.values())
                else f"window {params['window_s']:g} s instead of 300 s"
                + (
                    f"; quotas api {params['api_quota']}, resolvers "
                    f"{params['resolvers_quota']} instead of 500, 3,000"
                    if scaled["quotas"]
                    else " (the Hub's quotas kept)"
                )
            ),
            "loader": f"DataLoader(batch_size={params['batch_size']}, "
            f"num_workers={params['workers']}, multiprocessing_context='spawn')",
            "aiostream": "StreamDataset(hf://datasets/bench/quota, endpoint=, columns=['id'], "
            "options=StreamOptions(cache_dir=<fresh tmp>))",
            "datasets": "load_dataset('bench/quota', split='train', streaming=True)"
            ".select_columns(['id']), HF_ENDPOINT/HF_HOME/HF_DATASETS_CACHE fresh per run",
            "timing": "from before the dataset is constructed (after imports) to the first "
            "batch / to the last batch; the driver's acks (reading server stats) excluded",
            "peak_tree_rss": "sum of the RSS of the contender's process tree, sampled every "
            "second (shared pages counted in each process)",
        },
        "modes": {},
    }
    print(
        f"quota bench ({profile}): {params['files']} files, {params['workers']} spawned "
        f"workers, {results['parameters']['scaling']}",
        flush=True,
    )
    measured: list[dict[str, dict[str, Any]]] = []
    with HubServer(
        hub_root,
        subprocess=True,
        faults=Faults(latency_ms=args.latency_ms),
        rate_limits=limits,
    ) as hub:
        # The server hashes the repo's files on first sight: do it outside any timed run.
        httpx2.get(
            f"{hub.endpoint}/api/datasets/{REPO}/tree/main",
            params={"recursive": "true"},
            timeout=1800,
        ).raise_for_status()
        for i in range(args.rounds):
            order = contenders if i % 2 == 0 else contenders[::-1]
            got = {}
            for contender in order:
                r = _run_contender(
                    hub,
                    contender,
                    params,
                    limits,
                    log_dir,
                    f"r{i}",
                    args.min_available_gb * 2**30,
                )
                got[contender] = r
                print(
                    f"  r{i} {contender:<10} TTFB {r['time_to_first_batch'] or float('nan'):7.1f} s"
                    f"  epoch {r['seconds']:7.1f} s  429s {r['http_429']}  errors "
                    f"{len(r['worker_errors'])}  rows {r['rows']}/{r['expected_rows']} "
                    f"(distinct {r['distinct_ids']})  api {r['api_requests']} "
                    f"(after construction {r['api_requests_after_construction']})  "
                    f"exit {r['requests_at_exit']}  RSS {r['peak_tree_rss'] / 1e9:.2f} GB",
                    flush=True,
                )
                for e in r["worker_errors"]:
                    print(f"     error: {e[:500]}", flush=True)
            measured.append(got)
    if set(contenders) == set(CONTENDERS):
        summary = _summarize(measured)
        results["modes"]["epoch"] = {"summary": summary, "rounds": measured}
        _print(summary)
        results["ratios"] = _ratios(measured)
        print("\n== ratios and counts (median [min-max])")
        for r in results["ratios"]:
            print(
                f"{r['workload']:<20} {r['ratio']}: {r['median']:.2f} [{r['min']:.2f}-"
                f"{r['max']:.2f}]  target {r['target']}  {'met' if r['met'] else 'MISSED'}"
            )
    else:
        results["modes"]["epoch"] = {"rounds": measured}
    results["duration_seconds"] = time.perf_counter() - started
    name = {"full": "quota", "scaled": "quota-scaled", "quick": "quota-quick"}[profile]
    out = args.output or HERE / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out} (logs in {log_dir}); {results['duration_seconds']:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
