"""256 consumers of one job on one machine, against the local Hub server with the Hub's
real anonymous quotas (issue 32, line 7): 0 429s, every row once, memory per consumer.

    .venv/bin/python benchmarks/scale_bench.py            # 16 processes x 16 consumers
    .venv/bin/python benchmarks/scale_bench.py --quick    # 4 processes x 8 consumers

Wrap it in ``flock /work/bench.lock`` on a shared machine.

What a **consumer** is here: one ``aiostream_hf.stream(..., rank=r, world_size=256)``
with its own place ``r`` in the job, iterated to its end. 256 Python processes that
import torch do not fit in 24 GiB on 2 cores (a spawned DataLoader worker is ~0.35 GB,
``quota_bench.py``), so the job is ``--processes`` P processes (simulated ranks, each
launched as a subprocess of its own, importing aiostream_hf but not torch) x
``--consumers`` W streams per process, side by side in the process's event loop, as a
DataLoader worker's stream would run in a process of its own. Consumer ``k`` of process
``p`` is job rank ``p * W + k`` of ``P * W``. The processes are grouped into simulated
nodes of ``--per-node`` processes: a node's processes share a cache folder (as the
processes of a machine do), no two nodes share one, and every process of the job sees
one ``StreamOptions(manifest_dir=...)`` folder (one resolution per job, line 6).

The server: ``HubServer(subprocess=True)`` (its own process), 20 ms added to every
request, ``RateLimits.hub_anonymous()`` (api 500, resolvers 3,000, pages 100 per
5-minute window), reset to a fresh window before each mode. It counts per client
address and every consumer is on 127.0.0.1: the whole job spends ONE anonymous quota,
which is the hard case (on the Hub, each node would have an address and a quota).

Modes, each one job run on the same repo (the profile's ``files`` Parquet files of ``rows``
rows, ids 0..N-1, row groups of ``row_group`` rows, so that files < consumers and
every consumer has row groups to read):

- ``row-groups``: the default plan: every consumer plans every file and reads every
  n-th row group of the job;
- ``row-groups-cached``: the same with ``StreamOptions(byte_cache_bytes=2 GiB)``: the
  bytes read are kept on disk in the node's cache folder for every process of the node,
  so that a footer every consumer plans is fetched once per node, not once per consumer;
- ``elastic``: ``StreamOptions(elastic=True, slice_bytes=...)``: the epoch's units are
  slices of each file, consumer j of n takes every n-th unit. A slice holds the row
  groups that START in it, so a slice of footer bytes only is an empty unit (units are
  listed from the file sizes, before any footer is read): ``slice_bytes`` is chosen so
  that every consumer has several units;
- ``tar``: a second repo of ``tar_shards`` WebDataset shards (jpg + json + cls
  samples, ``make_webdataset_shards``), at least two per consumer: a shard is the unit,
  and every sample's bytes are delivered (the id is the number in its ``__key__``).

Recorded, from the server's stats: requests by bucket (api, resolvers, cdn) and 429s
(``throttled`` and ``by_status``); from the consumers: every id each one delivered,
compared with the dataset's (every row exactly once: no duplicate, none missing, every
consumer with rows), and each stream's own ``statistics()`` (throttled answers seen);
memory: each process's peak RSS (``VmHWM`` of /proc/self/status, read by the process
when its consumers are done) and its RSS after its imports, before any stream
(``VmRSS``), so per consumer: the process's peak over W, and the growth over the
baseline over W (what one more consumer costs); and the peak of the sum of the RSS of
all consumer processes at once, sampled by the driver every 0.5 s with psutil (shared
library pages counted in each process). Wall time is informational only.

Then, beside the jobs, what a real DataLoader worker costs (``--probe-workers``, 16;
4 with --quick; 0 skips it): one process importing torch reads the Parquet repo through
``DataLoader(StreamDataset(...), num_workers=16, multiprocessing_context="fork")``
while a thread samples the PSS of it and its workers; per worker: the growth of the
tree's PSS over the process's own before the loader, over the workers. It says why the
jobs above run streams in processes rather than 256 DataLoader workers on this machine.

Writes ``benchmarks/results/scale.json`` (``scale-quick.json`` with --quick).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _harness  # benchmarks/_harness.py: this script's folder is on sys.path

HERE = Path(__file__).resolve().parent
REPO = "bench/scale"
SOURCE = f"hf://datasets/{REPO}"
BUCKETS = ("api", "resolvers", "pages", "cdn")
TAR_REPO = "bench/scale-tar"
MODES = ("row-groups", "row-groups-cached", "elastic", "tar")
BYTE_CACHE_BYTES = 2 * 2**30  # per node, row-groups-cached: more than the dataset
PROFILES: dict[str, dict[str, Any]] = {
    "full": {
        "processes": 16,
        "per_node": 4,
        "consumers": 16,
        "files": 8,
        "rows": 12_800,  # per file: 102,400 rows
        "row_group": 50,  # 256 row groups per file, 2,048 in all: 8 per consumer
        "slice_bytes": 32 * 1024,  # ~150 slices per 5 MB file, ~1,200 units: ~5 per consumer
        "tar_shards": 512,  # 2 per consumer
        "tar_samples": 16,  # per shard: 8,192 samples
    },
    "quick": {
        "processes": 4,
        "per_node": 2,
        "consumers": 8,
        "files": 4,
        "rows": 1_600,
        "row_group": 50,
        "slice_bytes": 16 * 1024,
        "tar_shards": 64,
        "tar_samples": 8,
    },
}
PREFETCH_BYTES = 16 * 2**20  # per consumer: 256 x 16 MiB = 4 GiB at most
PREFETCH_COUNT = 2
PROCESS_TIMEOUT_S = 1800


# of the process's client (one per event loop, shared by its consumers)
CLIENT_KEYS = ("requests", "throttled", "pauses", "paced", "paced_seconds", "max_in_flight")
PACKAGES = ("aiostream-hf", "pyarrow", "httpx2", "anyio", "psutil")


# =============================================================================
# A process of the job: W consumers side by side in one event loop.
# =============================================================================


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return 0


def _process(spec: dict[str, Any]) -> dict[str, Any]:
    import anyio

    import aiostream_hf as ash

    baseline_rss = _vm("VmRSS")  # after the imports, before any stream
    w, p = spec["consumers"], spec["process"]
    world = spec["processes"] * w
    options = ash.StreamOptions(
        cache_dir=Path(spec["cache_dir"]),
        manifest_dir=Path(spec["manifest_dir"]),
        pin_ttl=600,
        prefetch_bytes=PREFETCH_BYTES,
        prefetch_count=PREFETCH_COUNT,
        elastic=spec["mode"] == "elastic",  # TAR: shards are the units either way
        byte_cache_bytes=BYTE_CACHE_BYTES if spec["mode"] == "row-groups-cached" else 0,
        slice_bytes=spec["slice_bytes"],
    )
    consumers: list[dict[str, Any]] = [{} for _ in range(w)]
    tar = spec["mode"] == "tar"

    async def consume(k: int) -> None:
        rank = p * w + k
        ids: list[int] = []
        s = ash.stream(
            spec["source"],
            split="train",
            endpoint=spec["endpoint"],
            options=options,
            rank=rank,
            world_size=world,
        )
        async with s:
            async for row in s:
                # every column decoded (Parquet), every sample's bytes (TAR); the id kept
                ids.append(int(row["__key__"][6:]) if tar else int(row["id"]))
            st = s.statistics()
        consumers[k] = {
            "rank": rank,
            "ids": ids,
            "samples": st.samples,
            "files": st.files,
            "units": st.units,
            "requests": dict(st.requests),
            "client": {k: st.client.get(k) for k in CLIENT_KEYS},
        }

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for k in range(w):
                tg.start_soon(consume, k)

    started = time.perf_counter()
    anyio.run(main)
    return {
        "process": p,
        "node": p // spec["per_node"],
        "seconds": time.perf_counter() - started,
        "baseline_rss": baseline_rss,
        "peak_rss": _vm("VmHWM"),
        "consumers": consumers,
        **{k: v for k, v in _harness.process_usage().items() if k.startswith("cpu")},
    }


def _dataloader_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """What one real DataLoader worker costs: a process importing torch reads the Parquet
    repo through ``DataLoader(StreamDataset(...), num_workers=W, fork)`` (world size 1:
    the W workers are the consumers), while a thread samples the RSS, PSS and USS
    (psutil ``memory_full_info``, /proc/PID/smaps_rollup) of it and its workers."""
    import threading

    import psutil
    import torch.utils.data

    import aiostream_hf as ash
    from aiostream_hf.torch import StreamDataset

    me = psutil.Process()
    before = me.memory_full_info()  # torch and aiostream_hf imported, no stream yet
    peak = {"rss": 0, "pss": 0, "uss": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            total = dict.fromkeys(peak, 0)
            for p in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    m = p.memory_full_info()
                    for k in total:
                        total[k] += getattr(m, k)
            for k in peak:
                peak[k] = max(peak[k], total[k])
            stop.wait(0.5)

    ds = StreamDataset(
        spec["source"],
        split="train",
        endpoint=spec["endpoint"],  # no RANK/WORLD_SIZE: world size 1
        options=ash.StreamOptions(
            cache_dir=Path(spec["cache_dir"]),
            prefetch_bytes=PREFETCH_BYTES,
            prefetch_count=PREFETCH_COUNT,
        ),
    )
    loader = torch.utils.data.DataLoader(
        ds, batch_size=64, num_workers=spec["workers"], multiprocessing_context="fork"
    )
    thread = threading.Thread(target=sample)
    thread.start()
    ids: list[int] = []
    try:
        for batch in loader:
            ids.extend(int(i) for i in batch["id"])
    finally:
        stop.set()
        thread.join()
    return {
        "workers": spec["workers"],
        "rows": len(ids),
        "distinct_rows": len(set(ids)),
        "parent_before": {"rss": before.rss, "pss": before.pss, "uss": before.uss},
        "tree_peak": peak,
    }


# =============================================================================
# Data: generated once under --data-dir.
# =============================================================================


def _ensure_repo(data_dir: Path, params: dict[str, Any]) -> Path:
    from aiostream_hf.testing import make_text_parquet, make_webdataset_shards

    files, rows, group = params["files"], params["rows"], params["row_group"]
    shards, samples = params["tar_shards"], params["tar_samples"]
    hub_root = data_dir / f"scale-{files}x{rows}-rg{group}-tar{shards}x{samples}" / "hub"
    data = hub_root / "datasets" / REPO / "data"
    paths = [data / f"train-{i:05d}-of-{files:05d}.parquet" for i in range(files)]
    tars = hub_root / "datasets" / TAR_REPO
    last = tars / f"train-{shards - 1:06d}.tar"
    if all(p.is_file() for p in paths) and last.is_file():
        return hub_root
    data_dir.mkdir(parents=True, exist_ok=True)
    ignore = data_dir / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# generated benchmark data\n*\n")
    shutil.rmtree(hub_root, ignore_errors=True)
    print(f"generating {files} Parquet files under {data} ...", flush=True)
    for i, p in enumerate(paths):
        make_text_parquet(
            p,
            rows=rows,
            row_group_size=group,
            seed=i,
            start_id=i * rows,
            min_text=100,
            max_text=1000,
        )
    print(f"generating {shards} TAR shards under {tars} ...", flush=True)
    make_webdataset_shards(tars, shards=shards, samples_per_shard=samples, seed=0)
    return hub_root


# =============================================================================
# Driver
# =============================================================================


def _buckets(stats: Any) -> dict[str, int]:
    return {b: int(stats.by_bucket.get(b, 0)) for b in BUCKETS}


def _dataset_bytes(hub_root: Path, mode: str) -> int:
    folder = hub_root / "datasets" / (TAR_REPO if mode == "tar" else REPO)
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _run_mode(
    hub: Any, mode: str, params: dict[str, Any], limits: Any, min_available: float
) -> dict[str, Any]:
    import psutil

    tmp = Path(tempfile.mkdtemp(prefix="aiostream-scale-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        hub.set_rate_limits(limits)  # a fresh window
        hub.reset_stats()
        env = _harness.worker_env(hub.endpoint, tmp, OMP_NUM_THREADS="1")
        started = time.perf_counter()
        for p in range(params["processes"]):
            spec = {
                "mode": mode,
                "process": p,
                "processes": params["processes"],
                "per_node": params["per_node"],
                "consumers": params["consumers"],
                "slice_bytes": params["slice_bytes"],
                "source": f"hf://datasets/{TAR_REPO}" if mode == "tar" else SOURCE,
                "endpoint": hub.endpoint,
                "cache_dir": str(tmp / f"node-{p // params['per_node']}"),
                "manifest_dir": str(tmp / "job"),
                "result_path": str(tmp / f"process-{p}.json"),
            }
            log = open(tmp / f"process-{p}.log", "wb")  # noqa: SIM115 (closed with the process)
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--process", json.dumps(spec)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            log.close()
        peak_sum = 0
        least_available = psutil.virtual_memory().available
        handles = []
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                handles.append(psutil.Process(proc.pid))
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        while any(proc.poll() is None for proc in procs):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: the job ran past {PROCESS_TIMEOUT_S} s")
            total = 0
            for h in handles:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    total += h.memory_info().rss
            peak_sum = max(peak_sum, total)
            least_available = min(least_available, psutil.virtual_memory().available)
            if least_available < min_available:
                raise RuntimeError(
                    f"{mode}: the machine has {least_available / 2**30:.1f} GiB of memory "
                    f"left (--min-available-gb): stopped, with {len(procs)} processes of "
                    f"{params['consumers']} consumers; use fewer (--processes, --consumers)"
                )
            time.sleep(0.5)
        wall = time.perf_counter() - started
        stats = hub.wait_idle(timeout=60)
        failed = [(p, proc.returncode) for p, proc in enumerate(procs) if proc.returncode]
        if failed:
            p = failed[0][0]
            raise RuntimeError(
                f"{mode}: process {p} exited with {failed[0][1]}:\n"
                + (tmp / f"process-{p}.log").read_text()[-3000:]
            )
        processes = [json.loads((tmp / f"process-{p}.json").read_text()) for p in range(len(procs))]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    if mode == "tar":
        expected = params["tar_shards"] * params["tar_samples"]
    else:
        expected = params["files"] * params["rows"]
    consumers = [c for p in processes for c in p["consumers"]]
    ids = [i for c in consumers for i in c["ids"]]
    distinct = set(ids)
    missing = expected - len(distinct & set(range(expected)))
    w = params["consumers"]
    peaks = [p["peak_rss"] for p in processes]
    growth = [(p["peak_rss"] - p["baseline_rss"]) / w for p in processes]
    rows_per_consumer = [len(c["ids"]) for c in consumers]
    result = {
        "mode": mode,
        "consumers": len(consumers),
        "wall_seconds": wall,
        "expected_rows": expected,
        "rows": len(ids),
        "distinct_rows": len(distinct),
        "duplicate_rows": len(ids) - len(distinct),
        "missing_rows": missing,
        "unexpected_ids": len(distinct - set(range(expected))),
        "idle_consumers": sum(1 for n in rows_per_consumer if n == 0),
        "rows_per_consumer": {"min": min(rows_per_consumer), "max": max(rows_per_consumer)},
        "every_row_once": len(ids) == expected and distinct == set(range(expected)),
        "http_429": int(stats.throttled),
        "by_status": {str(k): v for k, v in stats.by_status.items()},
        "requests_by_bucket": _buckets(stats),
        "requests_total": int(stats.requests),
        "bytes_served": int(stats.bytes_served),
        "dataset_bytes": _dataset_bytes(hub.root, mode),
        "bytes_served_over_dataset": stats.bytes_served / _dataset_bytes(hub.root, mode),
        "peak_concurrent_requests": int(stats.peak_concurrent),
        "requests_by_consumers": {
            b: sum(c["requests"].get(b, 0) for c in consumers) for b in ("api", "resolvers", "cdn")
        },
        # each process's client (the last statistics its consumers saw): 429s it received,
        # requests it held back to stay within the quota it shares with the machine
        "client_throttled": sum(
            max(c["client"]["throttled"] or 0 for c in p["consumers"]) for p in processes
        ),  # fmt: skip
        "client_paced": sum(
            max(c["client"]["paced"] or 0 for c in p["consumers"]) for p in processes
        ),  # fmt: skip
        "memory": {
            "process_peak_rss": {
                "min": min(peaks),
                "median": _harness.median(peaks),
                "max": max(peaks),
            },  # fmt: skip
            "process_baseline_rss_median": _harness.median([p["baseline_rss"] for p in processes]),
            "per_consumer_peak_rss_share": _harness.median(peaks) / w,
            "per_consumer_growth": {
                "min": min(growth),
                "median": _harness.median(growth),
                "max": max(growth),
            },  # fmt: skip
            "job_peak_rss_sum": peak_sum,
            "job_peak_rss_sum_per_consumer": peak_sum / len(consumers),
            "least_available_memory": least_available,
        },
        "processes": [{k: v for k, v in p.items() if k != "consumers"} for p in processes],
        "per_consumer": [
            {k: v for k, v in c.items() if k != "ids"} | {"rows": len(c["ids"])} for c in consumers
        ],
        "server_at_exit": {k: v for k, v in stats.to_json().items() if k != "paths"},
    }
    return result


def _run_probe(hub: Any, workers: int, params: dict[str, Any], limits: Any) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="aiostream-scale-probe-"))
    try:
        hub.set_rate_limits(limits)  # a fresh window
        hub.reset_stats()
        spec = {
            "source": SOURCE,
            "endpoint": hub.endpoint,
            "workers": workers,
            "cache_dir": str(tmp / "cache"),
            "result_path": str(tmp / "probe.json"),
        }
        env = _harness.worker_env(hub.endpoint, tmp, OMP_NUM_THREADS="1")
        done = subprocess.run(
            [sys.executable, __file__, "--probe", json.dumps(spec)],
            env=env,
            capture_output=True,
            text=True,
            timeout=PROCESS_TIMEOUT_S,
        )
        if done.returncode:
            raise RuntimeError(f"dataloader probe exited with {done.returncode}:\n"
                               + done.stdout[-2000:] + done.stderr[-2000:])  # fmt: skip
        r: dict[str, Any] = json.loads((tmp / "probe.json").read_text())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    stats = hub.wait_idle(timeout=60)
    expected = params["files"] * params["rows"]
    peak = r["tree_peak"]
    r.update(
        expected_rows=expected,
        every_row_once=r["rows"] == expected == r["distinct_rows"],
        http_429=int(stats.throttled),
        per_worker_pss=(peak["pss"] - r["parent_before"]["pss"]) / workers,
        what="one rank (a process importing torch) with DataLoader(StreamDataset(Parquet "
        f"repo, world_size=1), num_workers={workers}, multiprocessing_context='fork'); "
        "per worker: (peak of the tree's summed PSS, sampled every 0.5 s, - the rank's "
        "own PSS before the loader) / workers (USS is no measure here: after the fork "
        "the rank's pages are shared, and its own USS falls)",
    )
    return r


def _ratios(modes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    ratios = []

    def count(workload: str, what: str, value: float, target: str, ok: bool) -> None:
        ratios.append({"workload": workload, "ratio": what, "target": target, "median": value,
                       "min": value, "max": value, "per_round": [value], "met": ok})  # fmt: skip

    for mode, r in modes.items():
        n = r["consumers"]
        count(mode, f"HTTP 429s of {n} consumers (server stats)", float(r["http_429"]), "<= 0",
              r["http_429"] == 0)  # fmt: skip
        count(mode, "distinct rows / expected (each once)", r["distinct_rows"] / r["expected_rows"],
              ">= 1", r["every_row_once"])  # fmt: skip
        count(mode, "duplicate rows", float(r["duplicate_rows"]), "<= 0", r["duplicate_rows"] == 0)
        count(mode, "idle consumers", float(r["idle_consumers"]), "<= 0", r["idle_consumers"] == 0)
        count(mode, "API requests of the job", float(r["requests_by_bucket"]["api"]), "<= 3",
              r["requests_by_bucket"]["api"] <= 3)  # fmt: skip
    return ratios


def _print(modes: dict[str, dict[str, Any]]) -> None:
    print(
        f"\n{'mode':<18} {'cons':>5} {'429s':>5} {'rows once':>9} {'dup':>4} {'miss':>5} "
        f"{'idle':>4} {'api':>4} {'resolv':>6} {'cdn':>6} {'MiB/proc':>8} {'MiB/cons':>8} "
        f"{'+MiB/cons':>9} {'job GiB':>7} {'wall s':>6}"
    )
    for mode, r in modes.items():
        m, b = r["memory"], r["requests_by_bucket"]
        print(
            f"{mode:<18} {r['consumers']:>5} {r['http_429']:>5} "
            f"{'yes' if r['every_row_once'] else 'NO':>9} {r['duplicate_rows']:>4} "
            f"{r['missing_rows']:>5} {r['idle_consumers']:>4} {b['api']:>4} "
            f"{b['resolvers']:>6} {b['cdn']:>6} "
            f"{m['process_peak_rss']['median'] / 2**20:>8.0f} "
            f"{m['per_consumer_peak_rss_share'] / 2**20:>8.1f} "
            f"{m['per_consumer_growth']['median'] / 2**20:>9.1f} "
            f"{m['job_peak_rss_sum'] / 2**30:>7.2f} {r['wall_seconds']:>6.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--process", help=argparse.SUPPRESS)
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument(
        "--probe-workers",
        type=int,
        default=None,
        help="real DataLoader workers of the memory probe (0: none); default 16, quick 4",
    )
    parser.add_argument("--quick", action="store_true", help="4 processes x 8 consumers")
    parser.add_argument("--processes", type=int, default=None, help="processes (ranks)")
    parser.add_argument("--consumers", type=int, default=None, help="consumers per process")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument(
        "--min-available-gb",
        type=float,
        default=2.0,
        help="stop the job when the machine's available memory falls below this",
    )
    parser.add_argument("--data-dir", type=Path, default=HERE / ".data")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)

    if args.probe:
        spec = json.loads(args.probe)
        Path(spec["result_path"]).write_text(json.dumps(_dataloader_probe(spec)))
        return 0
    if args.process:
        spec = json.loads(args.process)
        Path(spec["result_path"]).write_text(json.dumps(_process(spec)))
        return 0

    import httpx2

    from aiostream_hf.testing import Faults, HubServer, RateLimits

    profile = "quick" if args.quick else "full"
    params = dict(PROFILES[profile])
    for name in ("processes", "consumers"):
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes {','.join(unknown)}: choose from {','.join(MODES)}")
    limits = RateLimits.hub_anonymous()  # the Hub's real quotas and 5-minute windows
    consumers = params["processes"] * params["consumers"]
    started = time.perf_counter()
    environment = _harness.environment(PACKAGES)
    hub_root = _ensure_repo(args.data_dir, params)
    results: dict[str, Any] = {
        "benchmark": "scale",
        "environment": environment,
        "parameters": {
            "profile": profile,
            "data": params,
            "repo": REPO,
            "latency_ms": args.latency_ms,
            "consumers": consumers,
            "layout": f"{params['processes']} processes (simulated ranks, "
            f"{params['processes'] // params['per_node']} simulated nodes of "
            f"{params['per_node']}) x {params['consumers']} consumers per process",
            "consumer": "one aiostream_hf.stream(hf://datasets/bench/scale[-tar], "
            f"split='train', rank=r, world_size={consumers}) iterated to its end, every "
            "column decoded (TAR: every sample's bytes); "
            f"{params['consumers']} of them side by side in one event loop per process "
            "(a subprocess importing aiostream_hf, not torch)",
            "options": f"StreamOptions(cache_dir=<one per node>, manifest_dir=<one per job>, "
            f"pin_ttl=600, prefetch_bytes={PREFETCH_BYTES}, prefetch_count={PREFETCH_COUNT}"
            f", elastic=<mode>, slice_bytes={params['slice_bytes']}, byte_cache_bytes="
            f"<{BYTE_CACHE_BYTES} in row-groups-cached, else 0>)",
            "rate_limits": {
                "api": limits.api,
                "resolvers": limits.resolvers,
                "pages": limits.pages,
                "window_s": limits.window_s,
                "per": "client address: every consumer is on 127.0.0.1, so the whole job "
                "spends one anonymous quota (the hard case: on the Hub each node has its "
                "own address)",
            },
            "memory": "process peak RSS: VmHWM of /proc/self/status read by each process at "
            "its end; baseline: VmRSS after its imports, before any stream; per consumer: "
            "peak / consumers per process, and (peak - baseline) / consumers per process; "
            "job: peak of the sum of the RSS of every consumer process, sampled every "
            "0.5 s with psutil (shared pages counted in each process); the server's "
            "process not included",
            "wall_seconds": "informational only: shared 2-core machine",
        },
        "jobs": {},
    }
    print(
        f"scale bench ({profile}): {results['parameters']['layout']} = {consumers} consumers, "
        f"{params['files']} files x {params['rows']} rows, row groups of "
        f"{params['row_group']}; RateLimits.hub_anonymous()",
        flush=True,
    )
    with HubServer(
        hub_root,
        subprocess=True,
        faults=Faults(latency_ms=args.latency_ms),
        rate_limits=limits,
    ) as hub:
        # The server hashes the repo's files on first sight: outside the measured runs.
        for repo in (REPO, TAR_REPO):
            httpx2.get(
                f"{hub.endpoint}/api/datasets/{repo}/tree/main",
                params={"recursive": "true"},
                timeout=600,
            ).raise_for_status()
        for mode in modes:
            r = _run_mode(hub, mode, params, limits, args.min_available_gb * 2**30)
            results["jobs"][mode] = r
            print(
                f"  {mode}: 429s {r['http_429']}  rows {r['rows']}/{r['expected_rows']} "
                f"(distinct {r['distinct_rows']}, idle consumers {r['idle_consumers']})  "
                f"requests {r['requests_by_bucket']}  wall {r['wall_seconds']:.1f} s",
                flush=True,
            )
        workers = (
            args.probe_workers if args.probe_workers is not None else (4 if args.quick else 16)
        )
        if workers:
            results["dataloader_probe"] = _run_probe(hub, workers, params, limits)
            print(f"  dataloader probe: {results['dataloader_probe']}", flush=True)
    _print(results["jobs"])
    results["ratios"] = _ratios(results["jobs"])
    results["duration_seconds"] = time.perf_counter() - started
    name = "scale-quick" if args.quick else "scale"
    out = args.output or HERE / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out}; {results['duration_seconds']:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
