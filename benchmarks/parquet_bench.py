"""Parquet streaming: aiostream-hf against its peers and the local-disk limit.

    .venv/bin/python benchmarks/parquet_bench.py            # full run (10-20 min)
    .venv/bin/python benchmarks/parquet_bench.py --quick    # smoke test (< 2 min)

What it measures (issue 3, "Done when"), with the local Hub server in its own
process and ``--latency-ms`` (default 20) added to every request:

* text Parquet, RecordBatch mode: ``aiostream-arrow`` rows/s over the fastest
  local read of the same files in the round (``pyarrow-local``:
  ``pq.ParquetFile(path).iter_batches()``; ``pyarrow-read-table``: whole files on
  Arrow's threads; ``pyarrow-dataset``: a dataset scan; target >= 0.8), and over
  ``pyarrow-local`` alone; ``hffs-pyarrow`` (HfFileSystem + pyarrow) for
  reference; ``raw-gets`` (the same bytes by plain parallel range GETs, no
  decode: the network's ceiling) and ``raw-gets-decode`` (those GETs file by
  file, each file decoded by ``pq.read_table`` while the next downloads);
* text Parquet, dict-rows mode: ``aiostream-rows`` over ``datasets-default``
  and ``datasets-tuned`` (``load_dataset(..., streaming=True)``, the latter with
  the blog's ``fragment_scan_options``; target >= 2); every side touches every
  row (``len(row["text"])``);
* image Parquet (real JPEG bytes), dict-rows mode: the same three, bytes only
  on both sides (``datasets`` gets ``cast_column("image", Image(decode=False))``,
  every side touches ``len(row["image"]["bytes"])``);
* peak RSS of one process streaming a ~3 GB text repo with
  ``StreamOptions(prefetch_bytes=256 MiB)``, against the budget + 300 MiB.

Every contender runs in a fresh subprocess (this script with ``--worker``), so
imports, RSS and the GIL are its own. Time runs from after the imports to the
last row (resolution included; aiostream gets a fresh cache_dir each run). The
imports include those a contender's libraries make on first use (asyncio's anyio
backend, a lazily loaded submodule): each contender's warm-up run lists what it
imported, and its measured runs import that before the clock starts
(``_harness.preimport``; ``preimported`` in each run's result), on every side;
with ``--warmup 0`` nothing is imported ahead.
One warm-up round, then ``--rounds`` rounds in a rotating order (in pairs, the
second reversed). Request
counts and bytes come from the server's stats, reset before each run. Prints a
table and writes ``benchmarks/results/parquet.json`` (``parquet-quick.json``
with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

TEXT_CONTENDERS = [
    "aiostream-arrow",
    "aiostream-arrow-sync",  # the sync bridge (`for batch in stream`)
    "pyarrow-local",
    "pyarrow-read-table",
    "pyarrow-dataset",
    "raw-gets",
    "raw-gets-decode",
    "hffs-pyarrow",
    "aiostream-rows",
    "datasets-default",
    "datasets-tuned",
    "aiostream-rows-sync",  # the sync bridge (`for row in stream`)
]
IMAGE_CONTENDERS = ["aiostream-rows", "datasets-default", "datasets-tuned"]
# The local-disk limit is the fastest of these, per round: the ways a user reads
# the same files from local disk with pyarrow (file by file streaming, whole files
# with Arrow's threads, and a dataset scan).
LOCAL_CONTENDERS = ("pyarrow-local", "pyarrow-read-table", "pyarrow-dataset")
FASTEST_LOCAL = "fastest-local"
RATIOS = [  # (workload, numerator, denominator, target)
    ("text", "aiostream-arrow", FASTEST_LOCAL, 0.8),
    ("text", "aiostream-arrow", "pyarrow-local", 0.8),
    ("text", "aiostream-rows", "datasets-default", 2.0),
    ("text", "aiostream-rows", "datasets-tuned", 2.0),
    ("text", "aiostream-rows-sync", "aiostream-rows", 0.9),
    ("text", "aiostream-arrow-sync", "aiostream-arrow", 0.9),
    ("image", "aiostream-rows", "datasets-default", 2.0),
    ("image", "aiostream-rows", "datasets-tuned", 2.0),
]
# --pin (issue 33, line 4): the Hub server on a core of its own, every contender (local
# reads too) on the other; Arrow via the Hub against the fastest local read on that core.
PINNED_CONTENDERS = [
    "aiostream-arrow",
    "pyarrow-local",
    "pyarrow-read-table",
    "pyarrow-dataset",
    "aiostream-arrow-local",  # the same engine on the same files on local disk
]
PINNED_RATIOS = [
    ("text", "aiostream-arrow", FASTEST_LOCAL, 0.9),
    ("text", "aiostream-arrow-local", FASTEST_LOCAL, 0.9),
]
SERVER_CPU, CONTENDER_CPU = 0, 1
#: raw-gets: the same bytes fetched with plain parallel range GETs (httpx2, this many in
#: flight, ranges of RAW_GET_RANGE bytes), decoded by nobody: the network's ceiling.
RAW_GETS_IN_FLIGHT = 8
RAW_GET_RANGE = 8 * MiB
BUCKETS = ("api", "resolvers", "pages", "cdn")
RSS_CONTENDERS = ["aiostream-rows", "aiostream-arrow"]
RSS_PREFETCH_BYTES = 256 * MiB
RSS_ALLOWANCE = 300 * MiB

# Workload sizes. Text rows are 1-10 KB of pseudo-words (the makers' default),
# ~2.7 KB per row on disk with snappy; row groups are sized by bytes (~16 MB
# decoded, ~8 MB on disk), since 100k rows of such text would be ~550 MB.
PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "full": {
        "text": {"files": 8, "rows": 15_000, "row_group_size": 3_000},
        "image": {"files": 8, "rows": 2_000, "row_group_size": 100, "width": 256, "height": 256},
        "rss": {"files": 24, "rows": 48_000, "row_group_size": 3_000},
    },
    "quick": {
        "text": {"files": 4, "rows": 2_000, "row_group_size": 500},
        "image": {"files": 2, "rows": 300, "row_group_size": 100, "width": 128, "height": 128},
        "rss": {"files": 4, "rows": 12_000, "row_group_size": 3_000},
    },
}
REPOS = {"text": "bench/text", "image": "bench/images", "rss": "bench/text-rss"}
GENERATOR_VERSION = 1  # bump when the way files are generated changes


# =============================================================================
# Worker: one contender, one pass over one repo, in a fresh process.
# Only the imports a contender needs happen here, after the clock's reference.
# =============================================================================


def _touch_text(row: dict[str, Any]) -> int:
    return len(row["text"])


def _touch_image(row: dict[str, Any]) -> int:
    return len(row["image"]["bytes"])


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("cpus"):  # --pin: before any thread starts, so that every one inherits it
        os.sched_setaffinity(0, spec["cpus"])
    before = set(sys.modules)
    preimported = _harness.preimport(spec.get("preimport", []))
    contender = spec["contender"]
    touch = _touch_image if spec["workload"] == "image" else _touch_text
    out: dict[str, Any] = {"contender": contender}
    rows = 0
    touched = 0
    first: float | None = None

    if contender.startswith("aiostream-"):
        import asyncio

        import aiostream_hf as ash

        arrow = contender in ("aiostream-arrow", "aiostream-arrow-sync", "aiostream-arrow-local")
        options = ash.StreamOptions(cache_dir=Path(spec["cache_dir"]), **spec.get("options", {}))
        # aiostream-arrow-local: the same engine on the same files on local disk
        source: Any = f"hf://datasets/{spec['repo']}"
        where: dict[str, Any] = {"split": "train", "endpoint": spec["endpoint"]}
        if contender == "aiostream-arrow-local":
            source, where = list(spec["local_files"]), {}
        t0 = time.perf_counter()

        def sync_run() -> tuple[int, int, float | None, Any]:
            n = t = 0
            ttf: float | None = None
            s = ash.stream(source, output="arrow" if arrow else "python", options=options, **where)
            with s:
                for item in s:
                    if ttf is None:
                        ttf = time.perf_counter() - t0
                    if arrow:
                        n += item.num_rows
                    else:
                        n += 1
                        t += touch(item)
                return n, t, ttf, s.statistics()

        async def run() -> tuple[int, int, float | None, Any]:
            n = t = 0
            ttf: float | None = None
            s = ash.stream(source, output="arrow" if arrow else "python", options=options, **where)
            async with s:
                if arrow:
                    async for batch in s:
                        if ttf is None:
                            ttf = time.perf_counter() - t0
                        n += batch.num_rows
                else:
                    async for row in s:
                        if ttf is None:
                            ttf = time.perf_counter() - t0
                        n += 1
                        t += touch(row)
                return n, t, ttf, s.statistics()

        if contender.endswith("-sync"):
            rows, touched, first, st = sync_run()
        else:
            rows, touched, first, st = asyncio.run(run())
        elapsed = time.perf_counter() - t0
        out["aiostream_statistics"] = {
            "fetcher": dict(st.fetcher),
            "resolver": dict(st.resolver),
            "units": st.units,
            "files": st.files,
            "max_prefetched": st.max_prefetched,
            "max_prefetched_bytes": st.max_prefetched_bytes,
        }

    elif contender == "pyarrow-local":
        import pyarrow.parquet as pq

        t0 = time.perf_counter()
        for path in spec["local_files"]:
            for batch in pq.ParquetFile(path).iter_batches():
                if first is None:
                    first = time.perf_counter() - t0
                rows += batch.num_rows
        elapsed = time.perf_counter() - t0

    elif contender == "pyarrow-read-table":
        import pyarrow.parquet as pq

        t0 = time.perf_counter()
        for path in spec["local_files"]:
            table = pq.read_table(path)  # whole file, decoded on Arrow's threads
            if first is None:
                first = time.perf_counter() - t0
            rows += table.num_rows
            del table
        elapsed = time.perf_counter() - t0

    elif contender == "pyarrow-dataset":
        import pyarrow.dataset as pads

        t0 = time.perf_counter()
        for batch in pads.dataset(spec["local_files"], format="parquet").to_batches():
            if first is None:
                first = time.perf_counter() - t0
            rows += batch.num_rows
        elapsed = time.perf_counter() - t0

    elif contender in ("raw-gets", "raw-gets-decode"):
        import asyncio

        import httpx2

        decode = contender == "raw-gets-decode"
        if decode:
            import pyarrow as pa
            import pyarrow.parquet as pq

        # The network ceiling: the repo's bytes over the same server and latency, by
        # plain parallel range GETs (the CDN URL of each file learned once), no decode.
        # raw-gets-decode: the same GETs file by file into one buffer, each file then
        # read by pq.read_table on Arrow's threads while the next one downloads: the
        # simple way to pipeline the network and the fastest local decode.
        async def fetch_all() -> tuple[int, int, float | None]:
            got = decoded = 0
            ttf: float | None = None
            limits = httpx2.Limits(max_connections=RAW_GETS_IN_FLIGHT)
            async with httpx2.AsyncClient(limits=limits, timeout=60) as client:
                base = f"{spec['endpoint']}/datasets/{spec['repo']}/resolve/main/"
                heads = await asyncio.gather(
                    *(client.head(base + p, follow_redirects=True) for p in spec["paths"])
                )
                urls = [str(h.url) for h in heads]
                sizes = [int(h.headers["content-length"]) for h in heads]
                gate = asyncio.Semaphore(RAW_GETS_IN_FLIGHT)

                async def one(url: str, start: int, end: int, into: bytearray | None) -> None:
                    nonlocal got, ttf
                    async with gate:
                        headers = {"Range": f"bytes={start}-{end - 1}"}
                        r = await client.get(url, headers=headers)
                        r.raise_for_status()
                        n = len(r.content)
                    if n != end - start:
                        raise SystemExit(f"{url}: {n} bytes for a range of {end - start}")
                    if into is not None:
                        into[start:end] = r.content
                    elif ttf is None:
                        ttf = time.perf_counter() - t0
                    got += n

                async def file(i: int, into: bytearray | None) -> None:
                    url, size = urls[i], sizes[i]
                    await asyncio.gather(
                        *(
                            one(url, start, min(size, start + RAW_GET_RANGE), into)
                            for start in range(0, size, RAW_GET_RANGE)
                        )
                    )

                if not decode:
                    await asyncio.gather(*(file(i, None) for i in range(len(urls))))
                else:
                    buffers = [bytearray(sizes[0])]
                    ahead = asyncio.create_task(file(0, buffers[0]))
                    for i in range(len(urls)):
                        await ahead
                        data = buffers.pop()
                        if i + 1 < len(urls):
                            buffers.append(bytearray(sizes[i + 1]))
                            ahead = asyncio.create_task(file(i + 1, buffers[0]))
                        reader = pa.BufferReader(pa.py_buffer(data))
                        table = await asyncio.to_thread(pq.read_table, reader)
                        if ttf is None:
                            ttf = time.perf_counter() - t0
                        decoded += table.num_rows
                        del table, reader, data
                if got != sum(sizes):
                    raise SystemExit(f"{contender} received {got} bytes of {sum(sizes)}")
            return got, decoded, ttf

        t0 = time.perf_counter()
        _, decoded, first = asyncio.run(fetch_all())
        elapsed = time.perf_counter() - t0
        # raw-gets decodes nothing: rows/s is the rows those bytes hold, per second
        rows = decoded if decode else spec["rows"]

    elif contender == "hffs-pyarrow":
        import pyarrow.parquet as pq
        from huggingface_hub import HfFileSystem

        t0 = time.perf_counter()
        fs = HfFileSystem(endpoint=spec["endpoint"], skip_instance_cache=True)
        files = sorted(fs.glob(f"datasets/{spec['repo']}/data/*.parquet"))
        for path in files:
            with fs.open(path, "rb") as f:
                for batch in pq.ParquetFile(f).iter_batches():
                    if first is None:
                        first = time.perf_counter() - t0
                    rows += batch.num_rows
        elapsed = time.perf_counter() - t0

    elif contender in ("datasets-default", "datasets-tuned"):
        import datasets
        import pyarrow as pa
        import pyarrow.dataset as pads

        datasets.disable_progress_bars()
        kwargs: dict[str, Any] = {}
        if contender == "datasets-tuned":
            kwargs["fragment_scan_options"] = pads.ParquetFragmentScanOptions(
                cache_options=pa.CacheOptions(prefetch_limit=1, range_size_limit=128 << 20)
            )
        t0 = time.perf_counter()
        d = datasets.load_dataset(spec["repo"], split="train", streaming=True, **kwargs)
        if spec["workload"] == "image":
            d = d.cast_column("image", datasets.Image(decode=False))
        for row in d:
            if first is None:
                first = time.perf_counter() - t0
            rows += 1
            touched += touch(row)
        elapsed = time.perf_counter() - t0

    else:
        raise SystemExit(f"unknown contender {contender!r}")

    out.update(
        rows=rows,
        touched=touched,
        import_seconds=t0 - _MODULE_START,
        preimported=preimported,
        first_use_imports=_harness.first_use_imports(before),
        seconds=elapsed,
        time_to_first_row=first,
        **_harness.process_usage(),
    )
    return out


# =============================================================================
# Data: generated once under --data-dir, regenerated only when parameters change.
# =============================================================================


def _ensure_repo(root: Path, kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """Make the repo of ``kind`` (text, image, rss) unless it exists with these parameters."""
    from aiostream_hf.testing import make_image_parquet, make_repo, make_text_parquet

    repo_id = REPOS[kind]
    repo_dir = root / "hub" / "datasets" / repo_id
    stamp_path = root / "params" / f"{repo_id.replace('/', '__')}.json"
    wanted = {"generator_version": GENERATOR_VERSION, "kind": kind, **params}
    if stamp_path.exists() and repo_dir.exists():
        stamp = json.loads(stamp_path.read_text())
        if stamp.get("params") == wanted and all(
            (repo_dir / f["path"]).is_file() and (repo_dir / f["path"]).stat().st_size == f["size"]
            for f in stamp["files"]
        ):
            return stamp
    print(f"generating {repo_id} {params} under {repo_dir} ...", flush=True)
    started = time.perf_counter()
    shutil.rmtree(repo_dir, ignore_errors=True)
    stamp_path.unlink(missing_ok=True)
    make_repo(root / "hub", repo_id, {"README.md": f"# {repo_id}\n\nbenchmark data ({kind})\n"})
    n = params["files"]
    files = []
    for i in range(n):
        rel = f"data/train-{i:05d}-of-{n:05d}.parquet"
        if kind == "image":
            make_image_parquet(
                repo_dir / rel,
                rows=params["rows"],
                width=params["width"],
                height=params["height"],
                row_group_size=params["row_group_size"],
                seed=1000 + i,
            )
        else:
            make_text_parquet(
                repo_dir / rel,
                rows=params["rows"],
                row_group_size=params["row_group_size"],
                seed=1000 + i,
                start_id=i * params["rows"],
            )
        files.append({"path": rel, "size": (repo_dir / rel).stat().st_size})
    stamp = {
        "params": wanted,
        "repo": repo_id,
        "files": files,
        "rows": n * params["rows"],
        "bytes": sum(f["size"] for f in files),
    }
    stamp_path.parent.mkdir(parents=True, exist_ok=True)
    stamp_path.write_text(json.dumps(stamp, indent=1))
    print(
        f"  {n} files, {stamp['bytes'] / MB:.0f} MB in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    return stamp


# =============================================================================
# Driver
# =============================================================================


PACKAGES = (
    "aiostream-hf",
    "pyarrow",
    "datasets",
    "huggingface_hub",
    "fsspec",
    "httpx2",
    "anyio",
    "numpy",
    "uvicorn",
    "psutil",
)


def _environment() -> dict[str, Any]:
    return _harness.environment(PACKAGES)


def _run_contender(
    hub: Any,
    contender: str,
    workload: str,
    stamp: dict[str, Any],
    repo_root: Path,
    log_dir: Path,
    tag: str,
    options: dict[str, Any] | None = None,
    timeout: float = 1800.0,
    idle: tuple[float, float] | None = None,
    preimport: list[str] | None = None,
    cpus: list[int] | None = None,
) -> dict[str, Any]:
    """One pass of one contender in a fresh process; RSS polled, server stats read.
    ``cpus``: the CPUs the contender runs on (``--pin``), else any.

    ``idle`` = (max busy CPUs, max wait s): first wait until the rest of the
    machine is that quiet (shared machines), for at most that long. ``preimport``: the
    modules the worker imports before its clock starts (``_harness.preimport``).
    """

    waited, busy_at_start = _harness.wait_for_idle(*idle) if idle else (0.0, float("nan"))

    tmp = Path(tempfile.mkdtemp(prefix="aiostream-bench-"))
    try:
        spec = {
            "contender": contender,
            "workload": workload,
            "repo": stamp["repo"],
            "endpoint": hub.endpoint,
            "cache_dir": str(tmp / "aiostream-cache"),
            "local_files": [str(repo_root / f["path"]) for f in stamp["files"]],
            "paths": [f["path"] for f in stamp["files"]],
            "rows": stamp["rows"],
            "options": options or {},
            "preimport": preimport or [],
            "cpus": cpus,
            "result_path": str(tmp / "result.json"),
        }
        hub.reset_stats()
        server = _harness.server_process(hub)
        server_cpu = _harness.cpu_seconds(server)
        load_before = os.getloadavg()
        machine_busy = _harness.machine_busy_seconds()
        log_path = log_dir / f"{tag}-{contender}.log"
        returncode, wall, peak_tree = _harness.run_worker(
            Path(__file__).resolve(),
            spec,
            _harness.worker_env(hub.endpoint, tmp),
            log_path,
            timeout=timeout,
        )
        server_cpu = _harness.cpu_seconds(server) - server_cpu
        load_after = os.getloadavg()
        machine_busy = _harness.machine_busy_seconds() - machine_busy
        stats = hub.stats().to_json()
        if returncode != 0:
            tail = log_path.read_text()[-3000:]
            raise RuntimeError(f"{contender} exited with {returncode}; log tail:\n{tail}")
        result = json.loads(Path(spec["result_path"]).read_text())
        if result["rows"] != stamp["rows"]:
            raise RuntimeError(
                f"{contender} read {result['rows']} rows of {workload}, expected {stamp['rows']}"
            )
        by_status = stats.get("by_status", {})
        result.update(
            workload=workload,
            process_wall_seconds=wall,
            server_cpu_seconds=server_cpu,
            loadavg_1min=[load_before[0], load_after[0]],
            idle_wait_seconds=waited,
            busy_cpus_before=busy_at_start,
            # CPU time the rest of the machine used meanwhile (not this contender,
            # not the Hub server): how noisy this run was.
            other_cpu_seconds=machine_busy
            - result["cpu_user"]
            - result["cpu_system"]
            - (server_cpu if server_cpu == server_cpu else 0.0),
            peak_rss_polled=peak_tree,
            peak_rss=max(peak_tree, result["vm_hwm"] or 0),
            rows_per_s=result["rows"] / result["seconds"],
            mb_per_s=stamp["bytes"] / MB / result["seconds"],
            server=stats,
            requests={b: stats["by_bucket"].get(b, 0) for b in BUCKETS},
            status_429=int(by_status.get("429", 0)),
            bytes_served=stats["bytes_served"],
            read_amplification=stats["bytes_served"] / stamp["bytes"],
        )
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _noise(r: dict[str, Any]) -> float:
    """CPUs the rest of the machine kept busy, on average, during a run."""
    return float(r["other_cpu_seconds"]) / max(float(r["process_wall_seconds"]), 1e-9)


def _run_quiet(args: argparse.Namespace, *pos: Any, **kw: Any) -> dict[str, Any]:
    """``_run_contender``, repeated (up to ``--retries`` times) while the rest of the
    machine was busier than ``--max-noise`` CPUs during it. The same rule for every
    contender; discarded attempts are kept in the result, and the last attempt is
    kept whatever its noise."""
    discarded = []
    for attempt in range(args.retries + 1):
        r = _run_contender(*pos, **kw)
        if _noise(r) <= args.max_noise or attempt == args.retries:
            break
        discarded.append(
            {
                k: r[k]
                for k in ("rows_per_s", "seconds", "other_cpu_seconds", "process_wall_seconds")
            }
        )
        print(
            f"    (run of {r['contender']} discarded: the rest of the machine used "
            f"{_noise(r):.2f} CPUs meanwhile; again)",
            flush=True,
        )
    r["noise_cpus"] = _noise(r)
    r["attempts"] = len(discarded) + 1
    r["discarded_attempts"] = discarded
    return r


def _summarize(
    rounds: list[dict[str, dict[str, Any]]], contenders: list[str]
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for c in contenders:
        runs = [r[c] for r in rounds if c in r]
        if not runs:
            continue

        def col(key: str, runs: list[dict[str, Any]] = runs) -> list[float]:
            return [float(x[key]) for x in runs if x.get(key) is not None]

        rps = col("rows_per_s")
        out[c] = {
            "runs": len(runs),
            "rows": runs[0]["rows"],
            "rows_per_s_median": _harness.median(rps),
            "rows_per_s_min": min(rps),
            "rows_per_s_max": max(rps),
            "mb_per_s_median": _harness.median(col("mb_per_s")),
            "seconds_median": _harness.median(col("seconds")),
            "time_to_first_row_median": _harness.median(col("time_to_first_row")),
            "peak_rss_median": _harness.median(col("peak_rss")),
            "peak_rss_max": max(col("peak_rss")),
            "cpu_seconds_median": _harness.median([x["cpu_user"] + x["cpu_system"] for x in runs]),
            "cpu_user_median": _harness.median(col("cpu_user")),
            "cpu_system_median": _harness.median(col("cpu_system")),
            "minor_faults_median": _harness.median(col("minor_faults")),
            "server_cpu_seconds_median": _harness.median(col("server_cpu_seconds")),
            "other_cpu_seconds_median": _harness.median(col("other_cpu_seconds")),
            "noise_cpus_median": _harness.median(col("noise_cpus")),
            "discarded_attempts": sum(len(x.get("discarded_attempts", [])) for x in runs),
            "import_seconds_median": _harness.median(col("import_seconds")),
            "requests_median": {
                b: _harness.median([float(x["requests"][b]) for x in runs])
                for b in ("api", "resolvers", "pages", "cdn")
            },
            "status_429_total": sum(x["status_429"] for x in runs),
            "retries_total": sum(
                x.get("aiostream_statistics", {}).get("fetcher", {}).get("retries", 0) for x in runs
            ),
            "bytes_served_median": _harness.median(col("bytes_served")),
            "read_amplification_median": _harness.median(col("read_amplification")),
        }
    return out


def _locals(round_: dict[str, dict[str, Any]]) -> list[float]:
    return [round_[c]["rows_per_s"] for c in LOCAL_CONTENDERS if c in round_]


def _denominator(round_: dict[str, dict[str, Any]], den: str) -> float:
    """rows/s of ``den`` in this round; for FASTEST_LOCAL, the fastest local way's."""
    if den == FASTEST_LOCAL:
        return max(_locals(round_))
    return float(round_[den]["rows_per_s"])


def _ratios(
    rounds_by_workload: dict[str, list[dict[str, dict[str, Any]]]],
    ratios: list[tuple[str, str, str, float]],
) -> list[dict[str, Any]]:
    out = []
    for workload, num, den, target in ratios:
        rounds = rounds_by_workload.get(workload, [])
        per_round = [
            r[num]["rows_per_s"] / _denominator(r, den)
            for r in rounds
            if num in r and (den in r or (den == FASTEST_LOCAL and _locals(r)))
        ]
        if per_round:
            out.append(_harness.ratio_entry(workload, num, den, target, per_round))
    return out


def _fmt_bytes(n: float) -> str:
    return f"{n / MiB:,.0f} MiB"


def _print_workload(workload: str, stamp: dict[str, Any], summary: dict[str, Any]) -> None:
    print()
    print(
        f"== {workload}: {stamp['repo']}, {len(stamp['files'])} files, "
        f"{stamp['rows']:,} rows, {stamp['bytes'] / MB:,.0f} MB, "
        f"row groups of {stamp['params']['row_group_size']:,} rows"
    )
    if workload == "image":
        print(
            "   bytes only on both sides: datasets gets cast_column('image', "
            "Image(decode=False)); every side reads len(row['image']['bytes'])"
        )
    header = (
        f"{'contender':<19} {'rows/s median':>13} {'(min-max)':>19} {'MB/s':>6} "
        f"{'1st row':>7} {'peak RSS':>9} {'CPU usr+sys':>11} {'srv s':>5} {'oth s':>5} {'api':>3} "
        f"{'res':>4} "
        f"{'cdn':>4} {'429':>3} {'fetched':>7}"
    )
    print(header)
    print("-" * len(header))
    for c, s in summary.items():
        span = f"({s['rows_per_s_min']:,.0f}-{s['rows_per_s_max']:,.0f})"
        req = s["requests_median"]
        print(
            f"{c:<19} {s['rows_per_s_median']:>13,.0f} {span:>19} {s['mb_per_s_median']:>6.1f} "
            f"{s['time_to_first_row_median']:>6.2f}s {s['peak_rss_median'] / MiB:>5.0f} MiB "
            f"{s['cpu_user_median']:>5.1f} + {s['cpu_system_median']:>3.1f} "
            f"{s['server_cpu_seconds_median']:>5.1f} "
            f"{s['other_cpu_seconds_median']:>5.1f} "
            f"{req['api']:>3.0f} {req['resolvers']:>4.0f} {req['cdn']:>4.0f} "
            f"{s['status_429_total']:>3} {s['read_amplification_median']:>6.3f}x"
        )


def _print_ratios(ratios: list[dict[str, Any]]) -> None:
    print()
    print("== ratios of rows/s, measured side by side (median of per-round ratios, min-max)")
    for r in ratios:
        verdict = "met" if r["met"] else "MISSED"
        print(
            f"{r['workload']:<6} {r['ratio']:<36} {r['median']:>6.2f}x "
            f"({r['min']:.2f}-{r['max']:.2f})  target >= {r['target']:.1f}x  {verdict}"
        )


def _rss_entries(
    stamp: dict[str, Any], runs: list[dict[str, Any]], limit: int
) -> list[dict[str, Any]]:
    """One entry per RSS run, with its limit and verdict (``met``), as report.py reads them."""
    workload = f"{stamp['bytes'] / 1e9:.1f} GB text stream"
    return [
        {
            **r,
            "workload": workload,
            "repo": stamp["repo"],
            "files": len(stamp["files"]),
            "bytes": stamp["bytes"],
            "params": stamp["params"],
            "prefetch_bytes": RSS_PREFETCH_BYTES,
            "limit": limit,
            "met": r["peak_rss"] <= limit,
        }
        for r in runs
    ]


def _print_rss(rss: list[dict[str, Any]], stamp: dict[str, Any]) -> None:
    print()
    print(
        f"== peak RSS streaming {stamp['repo']} ({stamp['bytes'] / MB:,.0f} MB, "
        f"{stamp['rows']:,} rows), prefetch_bytes = {_fmt_bytes(RSS_PREFETCH_BYTES)}"
    )
    for r in rss:
        verdict = "within" if r["within_limit"] else "OVER"
        print(
            f"{r['contender']:<18} peak RSS {_fmt_bytes(r['peak_rss']):>10} "
            f"(limit {_fmt_bytes(r['limit'])}: {verdict}); "
            f"{r['rows_per_s']:,.0f} rows/s, {r['mb_per_s']:.1f} MB/s; "
            f"max prefetched {_fmt_bytes(r['aiostream_statistics']['max_prefetched_bytes'])} "
            f"in {r['aiostream_statistics']['max_prefetched']} units"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small data, 1 round: a smoke test")
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=None, help="measured rounds (default 7; 1 quick)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up rounds, not reported")
    p.add_argument("--workloads", default="text,image", help="comma-separated: text,image")
    p.add_argument("--contenders", default=None, help="comma-separated subset (default: all)")
    p.add_argument("--skip-rss", action="store_true", help="skip the ~3 GB peak-RSS check")
    p.add_argument(
        "--pin",
        action="store_true",
        help=f"the Hub server on CPU {SERVER_CPU}, every contender on CPU {CONTENDER_CPU}: "
        "text Arrow contenders only, to results/parquet-pinned.json",
    )
    _harness.add_quiet_options(p)
    p.add_argument("--data-dir", type=Path, default=HERE / ".data")
    p.add_argument("--out", type=Path, default=None, help="results JSON path")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        spec = json.loads(args.worker)
        result = _worker(spec)
        Path(spec["result_path"]).write_text(json.dumps(result))
        return 0

    import signal

    from aiostream_hf.testing import Faults, HubServer

    # SIGTERM (and SIGINT, which background jobs ignore) unwind normally, so the
    # Hub server subprocess and the current worker are stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)

    quiet = _harness.quiet_parameters(args)

    profile_name = "quick" if args.quick else "full"
    profile = PROFILES[profile_name]
    n_rounds = args.rounds if args.rounds is not None else (1 if args.quick else 7)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    only = set(args.contenders.split(",")) if args.contenders else None
    name = "parquet-pinned" if args.pin else "parquet"
    out_path = args.out or HERE / "results" / (
        f"{name}-quick.json" if args.quick else f"{name}.json"
    )
    if args.pin:
        if len(os.sched_getaffinity(0)) < 2:
            raise SystemExit("parquet_bench --pin: needs 2 CPUs (one for the server)")
        workloads, args.skip_rss = ["text"], True
    data_dir = args.data_dir.resolve() / profile_name
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)

    stamps = {w: _ensure_repo(data_dir, w, profile[w]) for w in workloads}
    if not args.skip_rss:
        stamps["rss"] = _ensure_repo(data_dir, "rss", profile["rss"])

    env = _environment()
    params = {
        "profile": profile_name,
        "latency_ms": args.latency_ms,
        "rounds": n_rounds,
        "warmup_rounds": args.warmup,
        "workloads": {w: stamps[w]["params"] for w in stamps},
        "aiostream_options": "StreamOptions() defaults, fresh cache_dir per run, endpoint= given",
        "datasets_tuned": "fragment_scan_options=ParquetFragmentScanOptions(cache_options="
        "CacheOptions(prefetch_limit=1, range_size_limit=128 << 20))",
        "image_mode": "bytes only: datasets cast_column('image', Image(decode=False)); "
        "all sides touch len(row['image']['bytes'])",
        "text_touch": "dict-rows sides touch len(row['text']); arrow sides count batch.num_rows",
        "imports": "every side's clock starts after its imports, those its libraries make on "
        "first use included: the modules a contender imported in its warm-up run are "
        "imported before the clock in its measured runs (preimported, per run)",
        **quiet,
        "pinned": {"server": SERVER_CPU, "contenders": CONTENDER_CPU} if args.pin else None,
        "rss_prefetch_bytes": RSS_PREFETCH_BYTES,
        "rss_limit": RSS_PREFETCH_BYTES + RSS_ALLOWANCE,
    }
    print(
        f"parquet_bench: {profile_name}, latency {args.latency_ms:g} ms, {args.warmup} warm-up + "
        f"{n_rounds} rounds; python {env['python']}, {env['cpu_count']} CPUs, "
        f"pyarrow {env['packages']['pyarrow']}, datasets {env['packages']['datasets']}",
        flush=True,
    )

    results: dict[str, Any] = {
        "benchmark": "parquet",
        "environment": env,
        "parameters": params,
        "workloads": {},
        "ratios": [],
        "rss": [],
    }
    rounds_by_workload: dict[str, list[dict[str, dict[str, Any]]]] = {}
    idle = (args.idle_cpus, args.idle_wait) if args.idle_cpus > 0 else None
    started = time.perf_counter()
    hub_root = data_dir / "hub"
    with HubServer(hub_root, subprocess=True, faults=Faults(latency_ms=args.latency_ms)) as hub:
        if args.pin:
            server = _harness.server_process(hub)
            for proc in [server, *server.children(recursive=True)]:
                proc.cpu_affinity([SERVER_CPU])
        # The server hashes a repo's files on first sight (for its commit sha and
        # etags); do it now, not inside somebody's timed run.
        import httpx2

        for stamp in stamps.values():
            httpx2.get(
                f"{hub.endpoint}/api/datasets/{stamp['repo']}/tree/main",
                params={"recursive": "true"},
                timeout=600,
            ).raise_for_status()

        for workload in workloads:
            stamp = stamps[workload]
            repo_root = hub_root / "datasets" / stamp["repo"]
            contenders = TEXT_CONTENDERS if workload == "text" else IMAGE_CONTENDERS
            if args.pin:
                contenders = PINNED_CONTENDERS
            if only:
                contenders = [c for c in contenders if c in only]
            warmups: list[dict[str, dict[str, Any]]] = []
            rounds: list[dict[str, dict[str, Any]]] = []
            # What each contender imported in its warm-up run, on first use included, is
            # imported before the clock in its measured runs (_harness.preimport).
            preimports: dict[str, list[str]] = {}
            order = [contenders] * args.warmup + _harness.rotations(contenders, n_rounds)
            for i, names in enumerate(order):
                warm = i < args.warmup
                tag = f"{workload}-warmup{i}" if warm else f"{workload}-round{i - args.warmup}"
                this: dict[str, dict[str, Any]] = {}
                for c in names:
                    r = _run_quiet(
                        args,
                        hub,
                        c,
                        workload,
                        stamp,
                        repo_root,
                        log_dir,
                        tag,
                        idle=idle,
                        preimport=preimports.get(c),
                        cpus=[CONTENDER_CPU] if args.pin else None,
                    )
                    seen = r.pop("first_use_imports")
                    if warm:
                        preimports[c] = list(dict.fromkeys([*preimports.get(c, []), *seen]))
                    r["order"] = names.index(c)
                    this[c] = r
                    print(
                        f"  [{time.perf_counter() - started:6.0f}s] {tag:<14} {c:<18} "
                        f"{r['rows_per_s']:>10,.0f} rows/s {r['mb_per_s']:7.1f} MB/s "
                        f"first {r['time_to_first_row'] or 0:5.2f}s "
                        f"RSS {r['peak_rss'] / MiB:5.0f} MiB "
                        f"req {r['requests']['api']}/{r['requests']['resolvers']}/"
                        f"{r['requests']['cdn']} CPU {r['cpu_user']:.1f}+{r['cpu_system']:.1f}s "
                        f"faults {r['minor_faults'] / 1e3:.0f}k "
                        f"other-CPU {r['other_cpu_seconds']:4.1f}s",
                        flush=True,
                    )
                (warmups if warm else rounds).append(this)
            rounds_by_workload[workload] = rounds
            # Same work: every dict-row contender saw the same bytes in every row.
            touched = {
                r["touched"] for rnd in warmups + rounds for r in rnd.values() if r["touched"]
            }
            if len(touched) > 1:
                print(f"WARNING: dict-row contenders disagree on {workload} rows: {touched}")
            summary = _summarize(rounds, contenders)
            results["workloads"][workload] = {
                "repo": stamp["repo"],
                "files": len(stamp["files"]),
                "rows": stamp["rows"],
                "bytes": stamp["bytes"],
                "params": stamp["params"],
                "contenders": contenders,
                # The local-disk limits (report.py draws them as limits, not as peers).
                "limits": [c for c in contenders if c in LOCAL_CONTENDERS],
                "summary": summary,
                "same_rows_checked": len(touched) == 1,
                "rounds": rounds,
                "warmup_rounds": warmups,
                "preimported_modules": {c: len(names) for c, names in preimports.items()},
            }

        if not args.skip_rss:
            stamp = stamps["rss"]
            repo_root = hub_root / "datasets" / stamp["repo"]
            limit = RSS_PREFETCH_BYTES + RSS_ALLOWANCE
            rss_runs = []
            for c in RSS_CONTENDERS:
                if only and c not in only:
                    continue
                r = _run_quiet(
                    args,
                    hub,
                    c,
                    "rss",
                    stamp,
                    repo_root,
                    log_dir,
                    "rss",
                    options={"prefetch_bytes": RSS_PREFETCH_BYTES},
                    idle=idle,
                )
                r.pop("first_use_imports")
                r.update(limit=limit, within_limit=r["peak_rss"] <= limit)
                rss_runs.append(r)
                print(
                    f"  [{time.perf_counter() - started:6.0f}s] rss            {c:<18} "
                    f"{r['rows_per_s']:>10,.0f} rows/s {r['mb_per_s']:7.1f} MB/s "
                    f"RSS {r['peak_rss'] / MiB:5.0f} MiB (limit {limit / MiB:.0f})",
                    flush=True,
                )
            results["rss"] = _rss_entries(stamp, rss_runs, limit)

    results["ratios"] = _ratios(rounds_by_workload, PINNED_RATIOS if args.pin else RATIOS)
    results["duration_seconds"] = time.perf_counter() - started

    print()
    print(
        f"parquet_bench ({profile_name}): {env['date']}, {env['platform']}, "
        f"{env['cpu_count']} CPUs, python {env['python']}, latency {args.latency_ms:g} ms per "
        f"request, {n_rounds} rounds after {args.warmup} warm-up"
    )
    for workload in workloads:
        w = results["workloads"][workload]
        _print_workload(workload, stamps[workload], w["summary"])
    print(
        "\n   rows/s over time = after imports to the last row (resolution included); "
        "MB/s = file bytes / time;\n   1st row = time to the first row; peak RSS = the "
        "contender's process tree (psutil polling and VmHWM);\n   CPU usr+sys = the "
        "contender's CPU time (user + kernel), srv s = the Hub server's, oth s = the rest of "
        "the machine's (noise);\n   "
        "api/res/cdn = server requests by bucket; "
        "fetched = bytes served / bytes of the files (pyarrow-local reads local disk: 0)"
    )
    _print_ratios(results["ratios"])
    if results["rss"]:
        _print_rss(results["rss"], stamps["rss"])

    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"\nwrote {out_path} ({results['duration_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
