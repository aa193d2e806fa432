"""Startup: 16 DataLoader workers on a 1,000-file repo, aiostream-hf against ``datasets``.

    .venv/bin/python benchmarks/startup_bench.py                # full run
    .venv/bin/python benchmarks/startup_bench.py --quick        # smoke test (100 files, 4 workers)
    .venv/bin/python benchmarks/startup_bench.py --rounds 1 --no-epoch

What it measures (issue 6), with the local Hub server in its own process and
20 ms of latency added to every request, on a repo of 1,000 tiny Parquet files
(``data/train-XXXXX-of-01000.parquet``, 10 rows each):

* ``aiostream``: ``DataLoader(aiostream_hf.torch.StreamDataset("hf://datasets/bench/startup",
  endpoint=..., columns=["id"], options=StreamOptions(cache_dir=<fresh tmp>)),
  batch_size=32, num_workers=16)``;
* ``datasets``: ``DataLoader(load_dataset("bench/startup", split="train", streaming=True),
  batch_size=32, num_workers=16)`` with ``HF_ENDPOINT`` set to the server and
  ``HF_HOME``/``HF_DATASETS_CACHE`` in a fresh temporary folder.

Two modes, each contender in a fresh subprocess (this script with ``--worker``):

* ``first``: time from before the dataset is constructed (after the imports)
  to the first batch, then ``break``. At the first batch the worker tells the
  driver, which reads the server's request counts (api, resolvers, cdn) before
  acknowledging; the counts at process exit are recorded too;
* ``epoch`` (unless ``--no-epoch``): the same, then the whole epoch; time to
  the last batch and the request counts at the end.

Physical limit: 1 revision call + the pages of one recursive tree listing of
the repo (pages of 1,000 entries; the 1,000 files and the data/ folder take 2)
= 3 API requests, no resolver request before data is read. (Listing data/ alone
would fit one page, but which folders hold data is known only from the root.)

One warm-up round, then ``--rounds`` rounds alternating the order (A B, B A,
...). Ratios per round, side by side: ``datasets`` time to first batch over
``aiostream``'s, and ``datasets`` api+resolver requests (at the first batch)
over ``aiostream``'s. Prints a table and writes ``benchmarks/results/startup.json``
(``startup-quick.json`` with --quick). The repo is generated once under
``benchmarks/.data/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _harness  # benchmarks/_harness.py: this script's folder is on sys.path

_MODULE_START = time.perf_counter()
HERE = Path(__file__).resolve().parent
REPO = "bench/startup"
BUCKETS = ("api", "resolvers", "pages", "cdn")
CONTENDERS = ("aiostream", "datasets")
TREE_PAGE = 1000  # entries per page of the Hub's recursive tree listing
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"files": 1000, "rows_per_file": 10, "workers": 16, "batch_size": 32},
    "quick": {"files": 100, "rows_per_file": 10, "workers": 4, "batch_size": 32},
}


# =============================================================================
# Worker: one contender, in its own process.
# =============================================================================


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch.utils.data

    ds, t0 = _harness.loader_dataset(spec["contender"], REPO, spec)
    imported = t0
    constructed = time.perf_counter() - t0
    loader = torch.utils.data.DataLoader(
        ds, batch_size=spec["batch_size"], num_workers=spec["workers"]
    )
    first = None
    pause = 0.0
    batches = rows = 0
    ids: set[int] = set()
    for batch in loader:
        batches += 1
        rows += len(batch["id"])
        ids.update(int(i) for i in batch["id"])
        if first is None:
            first = time.perf_counter() - t0
            pause = _harness.signal_driver("FIRST_BATCH")
            if spec["mode"] == "first":
                break
    elapsed = time.perf_counter() - t0 - pause
    del loader  # shut the workers down before measuring CPU
    usage = _harness.process_usage()
    return {
        "contender": spec["contender"],
        "mode": spec["mode"],
        "import_seconds": imported - _MODULE_START,
        "construct_seconds": constructed,
        "time_to_first_batch": first,
        "seconds": elapsed,
        "ack_pause_seconds": pause,
        "batches": batches,
        "rows": rows,
        "distinct_ids": len(ids),
        "cpu_seconds": usage["cpu_user"] + usage["cpu_system"],
    }


# =============================================================================
# Data: generated once under --data-dir.
# =============================================================================


def _ensure_repo(data_dir: Path, params: dict[str, Any], name: str) -> Path:
    from aiostream_hf.testing import make_text_parquet

    data_dir.mkdir(parents=True, exist_ok=True)
    ignore = data_dir / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# generated benchmark data\n*\n")
    hub_root = data_dir / name / "hub"
    files, rows = params["files"], params["rows_per_file"]
    data = hub_root / "datasets" / REPO / "data"
    paths = [data / f"train-{i:05d}-of-{files:05d}.parquet" for i in range(files)]
    if all(p.is_file() for p in paths) and len(list(data.iterdir())) == files:
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


PACKAGES = (
    "aiostream-hf",
    "datasets",
    "huggingface-hub",
    "torch",
    "fsspec",
    "pyarrow",
    "httpx2",
    "uvicorn",
)


def _environment() -> dict[str, Any]:
    return _harness.environment(PACKAGES)


def _buckets(stats: Any) -> dict[str, int]:
    return {b: int(stats.by_bucket.get(b, 0)) for b in BUCKETS}


def _run_contender(
    hub: Any, contender: str, mode: str, params: dict[str, Any], log_dir: Path, tag: str
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="aiostream-startup-bench-"))
    try:
        spec = {
            "contender": contender,
            "mode": mode,
            "endpoint": hub.endpoint,
            "cache_dir": str(tmp / "cache"),
            "workers": params["workers"],
            "batch_size": params["batch_size"],
            "result_path": str(tmp / "result.json"),
        }
        log_path = log_dir / f"{tag}-{mode}-{contender}.log"
        hub.reset_stats()
        at_first: dict[str, Any] | None = None

        def on_signal(what: str) -> None:
            nonlocal at_first
            stats = hub.stats()
            at_first = {"by_bucket": _buckets(stats), "server": stats.to_json()}

        returncode, wall = _harness.run_signalling_worker(
            Path(__file__).resolve(),
            spec,
            _harness.worker_env(hub.endpoint, tmp),
            log_path,
            on_signal=on_signal,
            timeout=1800,
        )
        stats = hub.stats()
        if returncode != 0:
            raise RuntimeError(
                f"{contender} exited with {returncode}:\n{log_path.read_text()[-3000:]}"
            )
        result: dict[str, Any] = json.loads(Path(spec["result_path"]).read_text())
        expected = params["files"] * params["rows_per_file"]
        if mode == "epoch" and (result["rows"] != expected or result["distinct_ids"] != expected):
            raise RuntimeError(
                f"{contender} read {result['rows']} rows ({result['distinct_ids']} distinct), "
                f"expected {expected}"
            )
        requests_first = at_first["by_bucket"] if at_first else None
        result.update(
            process_wall_seconds=wall,
            requests_at_first_batch=requests_first,
            api_resolver_at_first_batch=(
                requests_first["api"] + requests_first["resolvers"] if requests_first else None
            ),
            api_at_first_batch=requests_first["api"] if requests_first else None,
            requests_at_exit=_buckets(stats),
            server_at_first_batch=at_first["server"] if at_first else None,
            server_at_exit=stats.to_json(),
        )
        if mode == "epoch":
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
        s: dict[str, Any] = {
            "time_to_first_batch": _stat([r["time_to_first_batch"] for r in runs]),
            "construct_seconds_median": statistics.median(r["construct_seconds"] for r in runs),
            "requests_at_first_batch_median": {
                b: statistics.median(r["requests_at_first_batch"][b] for r in runs) for b in BUCKETS
            },
            "requests_at_exit_median": {
                b: statistics.median(r["requests_at_exit"][b] for r in runs) for b in BUCKETS
            },
            "cpu_seconds_median": statistics.median(r["cpu_seconds"] for r in runs),
        }
        if runs[0]["mode"] == "epoch":
            s["epoch_seconds"] = _stat([r["seconds"] for r in runs])
        summary[contender] = s
    return summary


def _ratio(
    rounds: list[dict[str, dict[str, Any]]], workload: str, key: str, target: float
) -> dict[str, Any]:
    per_round = [r["datasets"][key] / r["aiostream"][key] for r in rounds]
    median = statistics.median(per_round)
    return {
        "workload": workload,
        "numerator": "datasets",
        "denominator": "aiostream",
        "target": target,
        "median": median,
        "min": min(per_round),
        "max": max(per_round),
        "per_round": per_round,
        "met": median >= target,
    }


def _print_mode(mode: str, summary: dict[str, Any]) -> None:
    print(f"\n== {mode}")
    print(
        f"{'contender':<10} {'TTFB s (median [min-max])':>27} {'epoch s':>20} "
        f"{'api':>5} {'resolv':>6} {'cdn':>5} | {'api':>5} {'resolv':>6} {'cdn':>5} {'CPU s':>6}"
    )
    print(f"{'':<10} {'':>27} {'':>20} {'-- at first batch --':>18} | {'---- at exit ----':>18}")
    for contender, s in summary.items():
        t = s["time_to_first_batch"]
        e = s.get("epoch_seconds")
        epoch = f"{e['median']:.2f} [{e['min']:.2f}-{e['max']:.2f}]" if e else "-"
        f, x = s["requests_at_first_batch_median"], s["requests_at_exit_median"]
        print(
            f"{contender:<10} {t['median']:>9.2f} [{t['min']:>6.2f}-{t['max']:>6.2f}]    "
            f"{epoch:>20} {f['api']:>5.0f} {f['resolvers']:>6.0f} {f['cdn']:>5.0f} | "
            f"{x['api']:>5.0f} {x['resolvers']:>6.0f} {x['cdn']:>5.0f} "
            f"{s['cpu_seconds_median']:>6.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="100 files, 4 workers, 1 round")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (default 5)")
    parser.add_argument("--no-epoch", action="store_true", help="skip the whole-epoch mode")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--data-dir", type=Path, default=HERE / ".data")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)

    if args.worker:
        spec = json.loads(args.worker)
        result = _worker(spec)
        Path(spec["result_path"]).write_text(json.dumps(result))
        return 0

    import httpx2

    from aiostream_hf.testing import Faults, HubServer

    profile = "quick" if args.quick else "full"
    params = PROFILES[profile]
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 5)
    modes = ["first"] if args.no_epoch else ["first", "epoch"]
    started = time.perf_counter()
    environment = _environment()
    hub_root = _ensure_repo(
        args.data_dir, params, "startup" if profile == "full" else "startup-quick"
    )
    # Files and folders of the repo, as a recursive tree listing counts them.
    entries = sum(1 for _ in (hub_root / "datasets" / REPO).rglob("*"))
    limit = 1 + -(-entries // TREE_PAGE)
    log_dir = Path(tempfile.mkdtemp(prefix="aiostream-startup-bench-logs-"))
    results: dict[str, Any] = {
        "benchmark": "startup",
        "environment": environment,
        "parameters": {
            "profile": profile,
            "data": params,
            "repo": REPO,
            "latency_ms": args.latency_ms,
            "rounds": rounds,
            "warmup_rounds": 1,
            "modes": modes,
            "aiostream": "StreamDataset(hf://datasets/bench/startup, endpoint=, columns=['id'], "
            "options=StreamOptions(cache_dir=<fresh tmp>))",
            "datasets": "load_dataset('bench/startup', split='train', streaming=True), "
            "HF_ENDPOINT/HF_HOME/HF_DATASETS_CACHE fresh per run",
            "timing": "from before the dataset is constructed (after imports) to the first "
            "batch / to the last batch; the ack pause at the first batch is excluded",
        },
        "physical_limit": {
            "api_requests": limit,
            "resolver_requests_before_data": 0,
            "what": f"1 revision call + {limit - 1} tree page(s): a recursive listing of the "
            f"repo has {entries:,} entries (files and folders), {TREE_PAGE:,} per page",
        },
        "modes": {},
    }
    by_mode: dict[str, list[dict[str, dict[str, Any]]]] = {}
    with HubServer(hub_root, subprocess=True, faults=Faults(latency_ms=args.latency_ms)) as hub:
        # The server hashes the repo's files on first sight: do it outside any timed run.
        httpx2.get(
            f"{hub.endpoint}/api/datasets/{REPO}/tree/main",
            params={"recursive": "true"},
            timeout=600,
        ).raise_for_status()
        for mode in modes:
            measured: list[dict[str, dict[str, Any]]] = []
            for i in range(rounds + 1):
                order = CONTENDERS if i % 2 == 0 else CONTENDERS[::-1]
                tag = f"r{i}"
                got = {}
                for contender in order:
                    r = _run_contender(hub, contender, mode, params, log_dir, tag)
                    got[contender] = r
                    req = r["requests_at_first_batch"]
                    epoch = f"epoch {r['seconds']:6.2f} s  " if mode == "epoch" else ""
                    print(
                        f"  {mode:<5} {tag}{' (warm-up)' if i == 0 else ''} {contender:<10} "
                        f"TTFB {r['time_to_first_batch']:6.2f} s  "
                        f"{epoch}"
                        f"first-batch requests {req}  exit {r['requests_at_exit']}",
                        flush=True,
                    )
                if i > 0:
                    measured.append({c: got[c] for c in CONTENDERS})
            by_mode[mode] = measured
            summary = _summarize(measured)
            results["modes"][mode] = {"summary": summary, "rounds": measured}
            _print_mode(mode, summary)

    first_rounds = by_mode["first"]
    ratios = [
        _ratio(first_rounds, "time_to_first_batch", "time_to_first_batch", 1.0),
        _ratio(first_rounds, "api_resolver_requests", "api_resolver_at_first_batch", 1.0),
        _ratio(first_rounds, "api_requests", "api_at_first_batch", 1.0),
    ]
    if "epoch" in by_mode:
        ratios.append(_ratio(by_mode["epoch"], "epoch_seconds", "seconds", 1.0))
    api = [r["aiostream"]["requests_at_first_batch"]["api"] for r in first_rounds]
    per_round = [a / limit for a in api]
    ratios.append(
        {
            "workload": "api_requests_vs_limit",
            "numerator": "aiostream",
            "denominator": f"physical limit ({limit} API requests)",
            "target": 1.0,
            "median": statistics.median(per_round),
            "min": min(per_round),
            "max": max(per_round),
            "per_round": per_round,
            "met": statistics.median(per_round) <= 1.0,
        }
    )
    results["ratios"] = ratios
    print("\n== ratios (per round, side by side; median [min-max])")
    for r in ratios:
        op = "<=" if r["workload"] == "api_requests_vs_limit" else ">="
        print(
            f"{r['workload']:<22} {r['numerator']} / {r['denominator']}: {r['median']:.2f} "
            f"[{r['min']:.2f}-{r['max']:.2f}]  target {op} {r['target']}  "
            f"{'met' if r['met'] else 'MISSED'}"
        )
    print(
        f"physical limit: {limit} API requests (1 revision + {limit - 1} tree page(s)), "
        "0 resolver requests before data"
    )
    results["duration_seconds"] = time.perf_counter() - started
    out = args.output or HERE / "results" / ("startup-quick.json" if args.quick else "startup.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out} (logs in {log_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
