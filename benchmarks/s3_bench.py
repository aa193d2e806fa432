"""TAR shards from an S3 server: aiostream-hf against webdataset's ``pipe:`` URLs.

    .venv/bin/python benchmarks/s3_bench.py            # full run (~5 min after data)
    .venv/bin/python benchmarks/s3_bench.py --quick    # smoke test (~1 min)

What it measures (issue 15, "Done when": a benchmark row), with moto's S3 server in
its own process (``aiostream_hf.testing._moto.MotoS3``) and 20 ms added before every
answer (moto has no latency knob: the server's front adds it, as ``HubServer``'s
``Faults(latency_ms=20)`` does), the same shards in one bucket:

* ``aiostream``: ``aiostream_hf.webdataset.stream("s3://bench/train-{000000..N}.tar")``,
  async, bytes only: one listing, one signed GET per shard, the next shards open
  while one is read;
* ``webdataset-pipe-boto3``: ``webdataset.WebDataset`` over
  ``pipe:python benchmarks/_s3_cat.py s3://bench/train-000000.tar`` URLs, a small
  boto3 script streaming each object to stdout: what users without the AWS CLI do;
* ``webdataset-pipe-aws``: the same over ``pipe:aws s3 cp s3://bench/... -`` (the
  AWS CLI's own transfer: a HEAD, then ranged GETs of 8 MiB), when ``aws`` is on
  ``PATH``;
* ``webdataset-local``: ``webdataset.WebDataset`` over the same shards on local disk,
  the limit.

Every side touches every sample (``len(sample["jpg"])``), nothing is decoded. All
sides read the endpoint and credentials from the same ``AWS_*`` variables. Each
contender runs in a fresh subprocess (this script with ``--worker``), timed from
after its imports to its last sample; one warm-up round, then ``--rounds`` rounds
in a rotating order. Requests are counted at the server, by kind (``list``,
``get``, ``head``). Prints a table and writes ``benchmarks/results/s3.json``
(``s3-quick.json`` with --quick). The shards are webdataset_bench.py's (8 of ~64 MB,
3,000 samples of a 512x384 JPEG each), generated once under ``benchmarks/.data/``
(git-ignored) and uploaded at each run.
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
import webdataset_bench  # the same shards (its data profiles and generator)

_MODULE_START = time.perf_counter()
HERE = Path(__file__).resolve().parent
MiB = 1 << 20
MB = 1e6
BUCKET = "bench"
LATENCY_MS = 20.0
KINDS = ("list", "get", "head")

CONTENDERS = ["aiostream", "webdataset-pipe-boto3", "webdataset-pipe-aws", "webdataset-local"]
RATIOS = [  # (numerator, denominator, target)
    ("aiostream", "webdataset-pipe-boto3", ">= 1.0"),
    ("aiostream", "webdataset-pipe-aws", ">= 1.0"),
    ("aiostream", "webdataset-local", ">= 0.8"),
]


# =============================================================================
# Worker: one contender, in its own process.
# =============================================================================


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    contender = spec["contender"]
    out: dict[str, Any] = {"contender": contender}
    samples = touched = 0
    first: float | None = None
    if contender == "aiostream":
        import asyncio

        import aiostream_hf as ash
        import aiostream_hf.webdataset as ashwds

        options = ash.StreamOptions(cache_dir=Path(spec["cache_dir"]))
        t0 = time.perf_counter()

        async def run() -> tuple[int, int, float | None, Any]:
            n = t = 0
            ttf = None
            async with ashwds.stream(spec["source"], options=options) as s:
                async for sample in s:
                    if ttf is None:
                        ttf = time.perf_counter() - t0
                    n += 1
                    t += len(sample["jpg"])
                return n, t, ttf, s.statistics()

        samples, touched, first, st = asyncio.run(run())
        elapsed = time.perf_counter() - t0
        out["aiostream_statistics"] = {"fetcher": dict(st.fetcher), "shards": st.files}
    else:
        import webdataset as wds

        urls = spec["local_files"] if contender == "webdataset-local" else spec["pipes"]
        t0 = time.perf_counter()
        for sample in wds.WebDataset(urls, shardshuffle=False):
            if first is None:
                first = time.perf_counter() - t0
            samples += 1
            touched += len(sample["jpg"])
        elapsed = time.perf_counter() - t0
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
# Data: webdataset_bench.py's shards (generated once under --data-dir), uploaded at
# each run.
# =============================================================================


def _aws_env(endpoint: str, tmp: Path) -> dict[str, str]:
    """What every contender reads the store with: the same AWS variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_REGION="us-east-1",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(tmp / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-credentials"),
        PYTHONUNBUFFERED="1",
    )
    return env


def _upload(endpoint: str, paths: list[Path], tmp: Path) -> None:
    import boto3

    saved = dict(os.environ)
    os.environ.update(_aws_env(endpoint, tmp))
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        for path in paths:
            client.upload_file(str(path), BUCKET, path.name)
    finally:
        os.environ.clear()
        os.environ.update(saved)


# =============================================================================
# Driver
# =============================================================================


PACKAGES = ("aiostream-hf", "webdataset", "httpx2", "anyio", "botocore", "boto3", "moto")


def _aws_cli_version() -> str | None:
    aws = shutil.which("aws")
    if aws is None:
        return None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        proc = subprocess.run([aws, "--version"], capture_output=True, text=True, check=False)
        return (proc.stdout or proc.stderr).strip() or None
    return None


def _run_contender(
    server: Any, contender: str, stamp: dict[str, Any], spec: dict[str, Any], log: Path, idle: Any
) -> dict[str, Any]:
    """One pass of one contender in a fresh process; RSS polled, server stats read."""
    import psutil

    waited, busy_before = _harness.wait_for_idle(*idle)
    machine_busy = _harness.machine_busy_seconds()
    tmp = Path(tempfile.mkdtemp(prefix="aiostream-s3-bench-"))
    try:
        spec = {
            **spec,
            "contender": contender,
            "cache_dir": str(tmp / "cache"),
            "result_path": str(tmp / "result.json"),
        }
        server.reset_stats()
        server_proc = psutil.Process(server.pid)
        server_cpu = _harness.cpu_seconds(server_proc)
        returncode, wall, peak_tree = _harness.run_worker(
            Path(__file__).resolve(), spec, _aws_env(server.endpoint, tmp), log
        )
        server_cpu = _harness.cpu_seconds(server_proc) - server_cpu
        machine_busy = _harness.machine_busy_seconds() - machine_busy
        requests = server.stats()
        if returncode != 0:
            raise RuntimeError(f"{contender} exited with {returncode}:\n{log.read_text()[-3000:]}")
        result: dict[str, Any] = json.loads(Path(spec["result_path"]).read_text())
        if result["samples"] != stamp["samples"]:
            raise RuntimeError(
                f"{contender} read {result['samples']} samples, expected {stamp['samples']}"
            )
        result.update(
            process_wall_seconds=wall,
            server_cpu_seconds=server_cpu,
            idle_wait_seconds=waited,
            busy_cpus_before=busy_before,
            other_cpu_seconds=machine_busy - result["cpu_user"] - result["cpu_system"] - server_cpu,
            peak_rss=max(peak_tree, result["vm_hwm"] or 0),
            samples_per_s=result["samples"] / result["seconds"],
            mb_per_s=stamp["bytes"] / MB / result["seconds"],
            requests=requests,
        )
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _ratios(workload: str, rounds: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for num, den, target in RATIOS:
        if den not in rounds[0]:
            continue
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
                "met": median >= float(target.split()[-1]),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="small shards, 2 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (default 3)")
    parser.add_argument("--data-dir", type=Path, default=HERE / ".data")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--idle",
        default="0.5,60",
        help="before each run wait until other load <= CPUS for at most SECONDS (CPUS,SECONDS)",
    )
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        Path(spec["result_path"]).write_text(json.dumps(_worker(spec)))
        return 0

    from aiostream_hf.testing._moto import MotoS3

    profile = "quick" if args.quick else "full"
    busy, wait = (float(x) for x in args.idle.split(","))
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 3)
    contenders = [c for c in CONTENDERS if c != "webdataset-pipe-aws" or shutil.which("aws")]
    started = time.perf_counter()
    environment = _harness.environment(PACKAGES, aws_cli=_aws_cli_version())
    data = webdataset_bench.PROFILES[profile]
    stamp = webdataset_bench._ensure_shards(args.data_dir, data)
    repo_dir = Path(stamp["root"]) / "hub" / "datasets" / webdataset_bench.REPO
    paths = [repo_dir / f["path"] for f in stamp["files"]]
    names = [p.name for p in paths]
    cat = HERE / "_s3_cat.py"
    spec = {
        "source": f"s3://{BUCKET}/train-{{000000..{len(names) - 1:06d}}}.tar",
        "pipes": [f"pipe:{sys.executable} {cat} s3://{BUCKET}/{n}" for n in names],
        "local_files": [str(p) for p in paths],
    }
    if "webdataset-pipe-aws" in contenders:
        # As a user with the AWS CLI writes them; it reads the same AWS variables.
        spec["pipes_aws"] = [f"pipe:aws s3 cp s3://{BUCKET}/{n} -" for n in names]
    log_dir = Path(tempfile.mkdtemp(prefix="aiostream-s3-bench-logs-"))
    workload = f"latency{LATENCY_MS:g}ms"
    results: dict[str, Any] = {
        "benchmark": "s3",
        "environment": environment,
        "parameters": {
            "profile": profile,
            "data": data,
            "shards_bytes": stamp["bytes"],
            "samples": stamp["samples"],
            "rounds": rounds,
            "warmup_rounds": 1,
            "latency_ms": LATENCY_MS,
            "server": "moto (its standalone S3 app under werkzeug), in its own process",
            "idle": {"max_busy_cpus": busy, "max_wait_seconds": wait},
            "contenders": contenders,
            "workloads": {workload: {"faults": {"latency_ms": LATENCY_MS}}},
        },
        "workloads": {},
    }
    measured: list[dict[str, dict[str, Any]]] = []
    with MotoS3(subprocess=True, latency_ms=LATENCY_MS) as server:
        _upload(server.endpoint, paths, log_dir)
        for i, order in enumerate(_harness.rotations(contenders, rounds + 1)):
            got = {}
            for contender in order:
                run_spec = dict(spec)
                if contender == "webdataset-pipe-aws":
                    run_spec["pipes"] = spec["pipes_aws"]
                log = log_dir / f"r{i}-{contender}.log"
                got[contender] = _run_contender(
                    server, contender, stamp, run_spec, log, (busy, wait)
                )
                run = got[contender]
                print(
                    f"  r{i} {contender:<22} {run['samples_per_s']:>9.0f} samples/s "
                    f"{run['mb_per_s']:>7.1f} MB/s  requests {run['requests']}",
                    flush=True,
                )
            if i > 0:  # round 0 is the warm-up
                measured.append({c: got[c] for c in contenders})
    summary = webdataset_bench._summarize(measured, KINDS)
    results["workloads"][workload] = {"summary": summary, "rounds": measured}
    results["ratios"] = ratios = _ratios(workload, measured)
    print(f"\n== {workload}")
    for contender, s in summary.items():
        r = s["samples_per_s"]
        print(
            f"{contender:<22} {r['median']:>9.0f} [{r['min']:>7.0f}-{r['max']:>7.0f}] samples/s "
            f"{s['mb_per_s_median']:>7.1f} MB/s  requests {s['requests_median']}  "
            f"peak RSS {s['peak_rss_max'] / MiB:.0f} MiB"
        )
    print("\n== ratios (per round, side by side; median [min-max])")
    for r in ratios:
        print(
            f"{r['numerator']} / {r['denominator']}: {r['median']:.2f} "
            f"[{r['min']:.2f}-{r['max']:.2f}]  target {r['target']}  "
            f"{'met' if r['met'] else 'MISSED'}"
        )
    results["duration_seconds"] = time.perf_counter() - started
    out = args.output or HERE / "results" / ("s3-quick.json" if args.quick else "s3.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out} (logs in {log_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
