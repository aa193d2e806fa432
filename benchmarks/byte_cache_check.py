"""A second epoch through the byte cache against reading the same files from local disk.

    .venv/bin/python benchmarks/byte_cache_check.py [--rounds 5] [--quick]
        [--out results/byte-cache.json]

run_all's ``byte-cache``: its ratios are rows of docs/benchmarks.md.

A Parquet dataset (text rows), WebDataset shards and a LeRobot dataset (two cameras,
h264) on a local Hub server in its own process. Epoch 1 streams each through the byte
cache (``byte_cache_bytes``); then, in rounds, each contender reads it all again:

- cache: ``stream("hf://...")`` with the warm cache (the server counts what it serves:
  an epoch that fetched anything is reported);
- local: ``stream(paths)`` of the same files on local disk (the same engine; LeRobot:
  ``lerobot.stream(folder)`` of the dataset's folder);
- read_table (Parquet only): ``pyarrow.parquet.read_table`` of each file, the fastest
  local way to Arrow.

Parquet is read as Arrow batches (``output="arrow"``), TAR as samples, LeRobot as
items with their frames (``lerobot.stream``, in order). Each contender runs in a fresh
process (this script with ``--worker``) that reads one epoch unmeasured and then the
measured one (a training process's second epoch), in an order that changes with the
round (``_harness.rotations``): one process reading everything carried what one
contender left (the allocator's heap, the threads) into the next, and the TAR ratio
swung between 0.86 and 1.04 with the order alone. The ratios are the medians of the
per-round ratios, with their min-max (issue 33, line 2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _harness  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import aiostream_hf as ash  # noqa: E402
from aiostream_hf.testing import (  # noqa: E402
    HubServer,
    make_lerobot_dataset,
    make_repo,
    make_text_parquet,
    make_webdataset_shards,
)

#: Parquet files, rows per file (row groups of 1,000), TAR shards, samples per shard,
#: LeRobot episodes (of 60 frames)
SIZES = {"full": (8, 20_000, 16, 1_000, 8), "quick": (2, 4_000, 4, 200, 2)}
ROBOT = "bench/robot"
TARGET = 0.9  # issue 33, line 2: epoch 2 through the cache >= 0.9x local disk


def _data(root: Path, files: int, rows: int, shards: int, samples: int, episodes: int) -> None:
    text = make_repo(root, "bench/text", {})
    for i in range(files):
        make_text_parquet(
            text / "data" / f"train-{i:05d}.parquet",
            rows=rows,
            row_group_size=1_000,
            seed=i,
            start_id=i * rows,
        )
    folder = make_repo(root, "bench/shards", {})
    make_webdataset_shards(folder, shards=shards, samples_per_shard=samples, width=256, height=192)
    make_lerobot_dataset(
        root, ROBOT, episodes=[60] * episodes, width=320, height=240, codec="h264", gop=10
    )


def _stream(source: Any, robot: bool = False, **kw: Any) -> tuple[int, float, dict[str, Any]]:
    s = ash.lerobot.stream(source, **kw) if robot else ash.stream(source, **kw)
    t = time.perf_counter()
    n = 0
    with s:
        for item in s:
            n += getattr(item, "num_rows", 1)
    return n, time.perf_counter() - t, dict(s.statistics().fetcher.get("byte_cache", {}))


def _read_table(paths: list[str]) -> tuple[int, float]:
    t = time.perf_counter()
    n = sum(pq.read_table(p).num_rows for p in paths)
    return n, time.perf_counter() - t


#: How each dataset is read (``robot``: through ``lerobot.stream``)
KW: dict[str, dict[str, Any]] = {
    "parquet": {"output": "arrow"},
    "webdataset": {"split": "train"},
    "lerobot": {"robot": True},
}


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Epochs of one contender in this fresh process: ``warmup`` unmeasured ones, then the
    one measured, as a training process reads its second epoch after its first."""
    kw = KW[spec["name"]]
    for _ in range(spec.get("warmup", 0) + 1):
        cache: dict[str, Any] = {}
        if spec["contender"] == "cache":
            options = ash.StreamOptions(
                cache_dir=Path(spec["cache_dir"]), byte_cache_bytes=spec["byte_cache_bytes"]
            )
            src, endpoint = spec["source"], spec["endpoint"]
            n, sec, cache = _stream(src, endpoint=endpoint, options=options, **kw)
        elif spec["contender"] == "local":
            options = ash.StreamOptions(cache_dir=Path(spec["plain_dir"]))
            local = Path(spec["folder"]) if spec["name"] == "lerobot" else spec["paths"]
            n, sec, _ = _stream(local, options=options, **kw)
        else:
            n, sec = _read_table(spec["paths"])
    return {"samples": n, "seconds": sec, "byte_cache": cache}


def _epoch(hub: Any, spec: dict[str, Any], tmp: Path) -> tuple[dict[str, Any], Any, Any]:
    """Run one epoch in a fresh process: (its result, the server's counts before, after)."""
    before = hub.wait_idle()
    spec = {**spec, "endpoint": hub.endpoint, "result_path": str(tmp / "result.json")}
    log = tmp / f"{spec['name']}-{spec['contender']}.log"
    env = _harness.worker_env(hub.endpoint, tmp)
    code, _, _ = _harness.run_worker(Path(__file__).resolve(), spec, env, log, timeout=900)
    if code != 0:
        raise RuntimeError(
            f"{spec['name']} {spec['contender']} exited {code}:\n{log.read_text()[-3000:]}"
        )
    after = hub.wait_idle()
    return json.loads(Path(spec["result_path"]).read_text()), before, after


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=None, help="default 5 (1 with --quick)")
    p.add_argument("--quick", action="store_true", help="small data, 1 round: a smoke test")
    p.add_argument("--out", type=Path, default=None, help="default results/byte-cache.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        Path(spec["result_path"]).write_text(json.dumps(_worker(spec)))
        return 0
    profile = "quick" if args.quick else "full"
    files, rows, shards, samples, episodes = SIZES[profile]
    rounds_wanted = args.rounds or (1 if args.quick else 5)
    out = args.out or HERE / "results" / f"byte-cache{'-quick' if args.quick else ''}.json"
    rounds: list[dict[str, Any]] = [{"round": r} for r in range(rounds_wanted)]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        root = tmp / "hub"
        _data(root, files, rows, shards, samples, episodes)
        parquet = sorted((root / "datasets/bench/text/data").glob("*.parquet"))
        tars = sorted((root / "datasets/bench/shards").glob("*.tar"))
        robot = root / "datasets" / ROBOT
        local = {
            "parquet": parquet,
            "webdataset": tars,
            "lerobot": sorted(f for f in robot.rglob("*") if f.is_file()),
        }
        sizes = {name: sum(f.stat().st_size for f in files) for name, files in local.items()}
        with HubServer(root, subprocess=True, lfs_threshold=0) as hub:
            sources = {
                "parquet": "hf://datasets/bench/text",
                "webdataset": "hf://datasets/bench/shards",
                "lerobot": f"hf://datasets/{ROBOT}",
            }
            base = {
                "cache_dir": str(tmp / "cache"),
                "plain_dir": str(tmp / "plain"),
                "byte_cache_bytes": 8 << 30,
                "folder": str(robot),
            }
            cold: dict[str, Any] = {}
            for name, src in sources.items():
                spec = {**base, "name": name, "contender": "cache", "source": src}
                done, before, after = _epoch(hub, spec, tmp)
                cold[name] = {
                    "samples": done["samples"],
                    "seconds": done["seconds"],
                    "bytes_served": after.bytes_served - before.bytes_served,
                    "files_bytes": sizes[name],
                    "byte_cache": done["byte_cache"],
                }
                print(f"epoch 1 {name}: {done['samples']:,} in {done['seconds']:.2f} s", flush=True)
            for name, src in sources.items():
                contenders = ["cache", "local"] + (["read_table"] if name == "parquet" else [])
                orders = _harness.rotations(contenders, rounds_wanted)
                for result, order in zip(rounds, orders, strict=True):
                    for who in order:
                        spec = {
                            **base,
                            "name": name,
                            "contender": who,
                            "source": src,
                            "paths": [str(f) for f in local[name]],
                            "warmup": 1,
                        }
                        done, before, after = _epoch(hub, spec, tmp)
                        if done["samples"] != cold[name]["samples"]:
                            raise RuntimeError(
                                f"{name} {who} read {done['samples']:,} samples, epoch 1 "
                                f"{cold[name]['samples']:,}"
                            )
                        if who == "cache":
                            result[f"{name}-cdn-requests"] = after.by_bucket.get(
                                "cdn", 0
                            ) - before.by_bucket.get("cdn", 0)
                            result[f"{name}-bytes-served"] = (
                                after.bytes_served - before.bytes_served
                            )
                            result[f"{name}-misses"] = done["byte_cache"].get("misses", 0)
                        result[f"{name}-{who}"] = done["samples"] / done["seconds"]
                    print(
                        f"round {result['round']} {name}: "
                        + ", ".join(
                            f"{k} {v:,.0f}" for k, v in result.items() if k.startswith(name)
                        ),
                        flush=True,
                    )

    def ratio(name: str, a: str, b: str) -> dict[str, float]:
        values = [x[f"{name}-{a}"] / x[f"{name}-{b}"] for x in rounds]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    summary = {
        "parquet cache/local": ratio("parquet", "cache", "local"),
        "parquet cache/read_table": ratio("parquet", "cache", "read_table"),
        "webdataset cache/local": ratio("webdataset", "cache", "local"),
        "lerobot cache/local": ratio("lerobot", "cache", "local"),
        "epoch 2 cdn requests": sum(x[f"{n}-cdn-requests"] for x in rounds for n in sources),
        "epoch 2 misses": sum(x[f"{n}-misses"] for x in rounds for n in sources),
    }

    def entry(name: str, a: str, b: str) -> dict[str, Any]:
        per_round = [x[f"{name}-{a}"] / x[f"{name}-{b}"] for x in rounds]
        return _harness.ratio_entry(f"{name} epoch 2", a, b, TARGET, per_round)

    def served_entry() -> dict[str, Any]:
        """Bytes the server served in the cached epochs 2, over the files' bytes: 0."""
        total = sum(sizes.values())
        per_round = [sum(x[f"{n}-bytes-served"] for n in sources) / total for x in rounds]
        med = statistics.median(per_round)
        return {
            "workload": "epoch 2",
            "ratio": "bytes served by the server / files' bytes",
            "target": "<= 0.001",  # the API's answers (a revalidated pin), no file bytes
            "median": med,
            "min": min(per_round),
            "max": max(per_round),
            "per_round": per_round,
            "met": med <= 0.001,
        }

    record = {
        "benchmark": "byte-cache",
        "environment": _harness.environment(["aiostream-hf", "pyarrow"]),
        "parameters": {
            "profile": profile,
            "parquet_files": files,
            "rows_per_file": rows,
            "shards": shards,
            "samples_per_shard": samples,
            "lerobot_episodes": episodes,
            "lerobot": "60 frames each, 320x240, two cameras, h264 (GOP 10), items in order "
            "with their frames",
            "rounds": rounds_wanted,
            "contenders": "cache: stream('hf://...') with the warm byte cache (server in its own "
            "process, 0 latency: nothing is fetched); local: stream(paths) of the same files; "
            "read_table: pyarrow.parquet.read_table of each file",
            "processes": "each contender's epochs in a fresh process: one unmeasured, then the "
            "measured one; orders rotated by round (_harness.rotations)",
        },
        "ratios": [
            served_entry(),
            entry("parquet", "cache", "local"),
            entry("parquet", "cache", "read_table"),
            entry("webdataset", "cache", "local"),
            entry("lerobot", "cache", "local"),
        ],
        "epoch_1": cold,
        "summary": summary,
        "rounds": rounds,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    for k, v in summary.items():
        print(k, v)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
