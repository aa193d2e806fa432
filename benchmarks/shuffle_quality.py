"""How well a streamed shuffle mixes, against a true permutation and the peers' buffers.

    .venv/bin/python benchmarks/shuffle_quality.py            # full run (a few minutes)
    .venv/bin/python benchmarks/shuffle_quality.py --quick    # smoke test

run_all's ``shuffle-quality`` (issue 32, line 4). Quality is not timing: a busy machine
gives the same figures. Two datasets made with ``aiostream_hf.testing`` and served by a
local Hub server (its own process, loopback):

- Parquet: text rows in files of equal row groups; a row's unit is its **row group**
  (also reported: its file);
- WebDataset: TAR shards of jpg + json + cls samples; a sample's unit is its **shard**.

Every sample's original position is its place in the dataset read in order (a row's
``id``, a sample's ``__key__`` number). The contenders, each reading the whole dataset
once per seed, one consumer, each in its own process:

- ``true permutation``: ``random.shuffle`` of all the positions (the ideal);
- ``no shuffle``: ``aiostream_hf.stream`` in order;
- ``aiostream``: ``stream(shuffle=N, seed=s)``, its units (row groups or elastic slices
  of about one row group, shards) permuted by (seed, epoch), then a buffer of N samples,
  with ``StreamOptions(shuffle_units=K)`` reading K units side by side (K = 1: one unit
  after another, the default), with and without ``elastic=True``;
- ``datasets`` (Parquet): ``load_dataset(repo, streaming=True)`` against the same server
  (``HF_ENDPOINT``), ``.shuffle(buffer_size=N, seed=s)``: its shards (files) permuted,
  then a buffer of N rows;
- ``webdataset`` (TAR): ``WebDataset(urls, shardshuffle=<shards>, seed=s).shuffle(N,
  seed=s)`` over http from the same server (curl): shards permuted, then its buffer.

Metrics of each run's output order: the share of adjacent pairs from the same unit
(the true permutation's is about 1 / units), the Spearman rank correlation of output
position against original position (|rho|: 0 for a true permutation), the mean
displacement |output - original| / n (1/3 for a true permutation), and that every sample
came exactly once. Memory: the peak RSS (VmHWM) of the contender's process, and that
minus the same reader's median peak without shuffling over three runs (aiostream: with
the same ``elastic``; the peers: a buffer of 1): what the shuffle costs, its buffer and,
with ``shuffle_units``, the units read side by side. The library reports no buffer
bytes, so the RSS difference is the measured figure; beside it, computed, not measured:
the buffer's payload, ``min(N, samples)`` times a sample's mean bytes (a Parquet row's
decoded Arrow bytes, a TAR sample's bytes in its shard). Min-max over the seeds.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _harness  # noqa: E402

PACKAGES = ["aiostream-hf", "datasets", "webdataset", "pyarrow", "numpy"]

#: (Parquet files, rows per file, rows per row group, TAR shards, samples per shard,
#: Parquet buffers, TAR buffers, seeds)
SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "files": 8,
        "rows": 16_000,
        "group": 2_000,
        "shards": 16,
        "per_shard": 1_000,
        "parquet_buffers": [100, 1_000, 10_000],
        "tar_buffers": [100, 1_000],
        "units": [1, 8],
        "seeds": [0, 1, 2],
    },
    "quick": {
        "files": 2,
        "rows": 4_000,
        "group": 1_000,
        "shards": 4,
        "per_shard": 200,
        "parquet_buffers": [100],
        "tar_buffers": [100],
        "units": [1, 4],
        "seeds": [0],
    },
}
RATIO_BUFFER = {"full": 1_000, "quick": 100}  # the buffer the ratios compare at
PARQUET_REPO, TAR_REPO = "bench/shuffle-text", "bench/shuffle-shards"


# -- data --------------------------------------------------------------------------------


def _data(root: Path, size: dict[str, Any]) -> None:
    from aiostream_hf.testing import make_repo, make_text_parquet, make_webdataset_shards

    if (root / "done").exists():
        return
    text = make_repo(root, PARQUET_REPO, {}) / "data"
    for i in range(size["files"]):
        make_text_parquet(
            text / f"train-{i:05d}-of-{size['files']:05d}.parquet",
            rows=size["rows"],
            row_group_size=size["group"],
            seed=i,
            start_id=i * size["rows"],
            min_text=200,
            max_text=800,
        )
    shards = make_repo(root, TAR_REPO, {}) / "data"
    make_webdataset_shards(shards, shards=size["shards"], samples_per_shard=size["per_shard"])
    (root / "done").write_text("")


# -- one contender's run (a worker process) ----------------------------------------------


def _aiostream_positions(spec: dict[str, Any]) -> list[int]:
    import aiostream_hf as ash

    options = ash.StreamOptions(
        shuffle_units=spec.get("units", 1),
        elastic=spec.get("elastic", False),
        slice_bytes=spec.get("slice_bytes") or 64 * 2**20,
    )
    buffer = spec.get("buffer")
    out: list[int] = []
    if spec["format"] == "parquet":
        s = ash.stream(
            f"hf://datasets/{PARQUET_REPO}",
            split="train",
            shuffle=buffer,
            seed=spec["seed"],
            options=options,
        )
        with s:
            for row in s:
                out.append(row["id"])
    else:
        s = ash.stream(spec["url"], shuffle=buffer, seed=spec["seed"], options=options)
        with s:
            for sample in s:
                out.append(int(sample["__key__"][len("sample") :]))
    return out


def _datasets_positions(spec: dict[str, Any]) -> list[int]:
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.load_dataset(PARQUET_REPO, split="train", streaming=True)
    ds = ds.shuffle(buffer_size=spec["buffer"], seed=spec["seed"])
    return [row["id"] for row in ds]


def _webdataset_positions(spec: dict[str, Any]) -> list[int]:
    import webdataset as wds

    urls = spec["urls"]
    ds = wds.WebDataset(urls, shardshuffle=len(urls), seed=spec["seed"]).shuffle(
        spec["buffer"], seed=spec["seed"]
    )
    return [int(sample["__key__"][len("sample") :]) for sample in ds]


def worker(spec: dict[str, Any]) -> None:
    """Read the dataset once as ``spec`` says; write the positions and peak RSS."""
    contender = spec["contender"]
    if contender == "aiostream":
        positions = _aiostream_positions(spec)
    elif contender == "datasets":
        positions = _datasets_positions(spec)
    elif contender == "webdataset":
        positions = _webdataset_positions(spec)
    else:
        raise SystemExit(f"unknown contender {contender!r}")
    Path(spec["out"]).write_text(json.dumps({"positions": positions, "vm_hwm": _harness.vm_hwm()}))


# -- metrics -----------------------------------------------------------------------------


def metrics(positions: list[int], per_unit: int, per_file: int | None) -> dict[str, Any]:
    """Quality of an output order of original positions 0..n-1 (see the module docstring)."""
    import numpy as np

    n = len(positions)
    pos = np.asarray(positions, dtype=np.int64)
    complete = bool(n > 1 and np.array_equal(np.sort(pos), np.arange(n)))
    units = pos // per_unit
    out: dict[str, Any] = {
        "samples": n,
        "complete": complete,
        "same_unit": float(np.mean(units[1:] == units[:-1])),
    }
    if per_file is not None:
        files = pos // per_file
        out["same_file"] = float(np.mean(files[1:] == files[:-1]))
    d = (pos - np.arange(n)).astype(np.float64)
    out["abs_rho"] = abs(1.0 - 6.0 * float(np.sum(d * d)) / (n * (n * n - 1.0)))
    out["displacement"] = float(np.mean(np.abs(d))) / n
    return out


def _summary(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [float(r[key]) for r in runs if r.get(key) is not None]
    if not values:
        return {}
    return {"median": _harness.median(values), "min": min(values), "max": max(values)}


# -- driver ------------------------------------------------------------------------------


def _run(spec: dict[str, Any], env: dict[str, str], tmp: Path) -> dict[str, Any]:
    out = tmp / "result.json"
    out.unlink(missing_ok=True)
    log = tmp / "worker.log"
    full = {**spec, "out": str(out)}
    with log.open("w") as f:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(full)],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=1800,
            check=False,
        )
    if proc.returncode != 0:
        raise SystemExit(f"worker {spec} failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    return dict(json.loads(out.read_text()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small data, one seed")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if shutil.which("curl") is None:
        raise SystemExit("webdataset reads http URLs through `curl`: apt-get install -y curl")
    profile = "quick" if args.quick else "full"
    size = SIZES[profile]
    out_path = (
        args.out or HERE / "results" / f"shuffle-quality{'-quick' if args.quick else ''}.json"
    )
    data_root = HERE / ".data" / f"shuffle-quality-{profile}"
    _data(data_root, size)

    from aiostream_hf.testing import HubServer

    n_rows = size["files"] * size["rows"]
    n_tar = size["shards"] * size["per_shard"]
    first = next((data_root / "datasets" / PARQUET_REPO / "data").glob("*.parquet"))
    # elastic units: slices of about one row group
    slice_bytes = max(1, first.stat().st_size // (size["rows"] // size["group"]))
    census = _slice_census(data_root, slice_bytes)
    sample_bytes = _sample_bytes(data_root, n_rows, n_tar)
    baselines: dict[str, dict[str, int]] = {}
    started = time.time()
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory() as tmp_name,
        HubServer(data_root, subprocess=True, lfs_threshold=0) as hub,
    ):
        tmp = Path(tmp_name)
        env = _harness.worker_env(hub.endpoint, tmp)
        names = [f"data/train-{i:06d}.tar" for i in range(size["shards"])]
        urls = [hub.url(TAR_REPO, name) for name in names]
        brace = hub.url(TAR_REPO, f"data/train-{{000000..{size['shards'] - 1:06d}}}.tar")
        brace = brace.replace("%7B", "{").replace("%7D", "}")
        fmt = {
            "parquet": (n_rows, size["group"], size["rows"], size["parquet_buffers"]),
            "tar": (n_tar, size["per_shard"], None, size["tar_buffers"]),
        }
        for kind, (n, per_unit, per_file, buffers) in fmt.items():
            base = {"format": kind, "url": brace, "urls": urls, "slice_bytes": slice_bytes}
            configs: list[tuple[str, dict[str, Any]]] = [
                ("no shuffle", {"buffer": None}),
                ("no shuffle elastic", {"buffer": None, "elastic": True}),
            ]
            for buffer in buffers:
                for elastic in (False, True):
                    for units in size["units"]:
                        name = f"aiostream{' elastic' if elastic else ''} shuffle_units={units}"
                        configs.append(
                            (name, {"buffer": buffer, "units": units, "elastic": elastic})
                        )
                peer = "datasets" if kind == "parquet" else "webdataset"
                configs.append((peer, {"buffer": buffer, "contender": peer}))
            baseline: dict[str, int] = {}
            for label, config in configs:
                seeds = size["seeds"]  # without a buffer: the same order, RSS thrice
                runs = []
                for seed in seeds:
                    spec = {"contender": "aiostream", **base, **config, "seed": seed}
                    got = _run(spec, env, tmp)
                    m = metrics(got["positions"], per_unit, per_file)
                    runs.append({"seed": seed, "vm_hwm": got["vm_hwm"], **m})
                    print(
                        f"{kind:8} {label:38} buffer={config['buffer']} seed={seed}: "
                        f"same-unit {m['same_unit']:.3f} |rho| {m['abs_rho']:.3f} "
                        f"displacement {m['displacement']:.3f} complete={m['complete']} "
                        f"peak RSS {got['vm_hwm'] / 2**20:.0f} MiB",
                        flush=True,
                    )
                contender = config.get("contender", "aiostream")
                if contender == "aiostream" and config.get("elastic"):
                    contender = "aiostream elastic"
                if config["buffer"] is None:
                    baseline[contender] = int(_harness.median([r["vm_hwm"] for r in runs]))
                rows.append(
                    {
                        "format": kind,
                        "unit": "row group" if kind == "parquet" else "shard",
                        "contender": label,
                        "buffer": config["buffer"],
                        "shuffle_units": config.get("units"),
                        "elastic": config.get("elastic"),
                        "buffer_items": config["buffer"],
                        "buffer_payload_bytes": None
                        if config["buffer"] is None
                        else min(config["buffer"], n) * sample_bytes[kind],
                        "runs": runs,
                        "_reader": contender,
                    }
                )
            # the peers' own peak with a buffer of 1, for their RSS difference (median of 3)
            for peer in {r["_reader"] for r in rows if r["format"] == kind} - set(baseline):
                spec = {"contender": peer, **base, "buffer": 1, "seed": 0}
                peaks = [_run(spec, env, tmp)["vm_hwm"] for _ in range(3)]
                baseline[peer] = int(_harness.median(peaks))
            baselines[kind] = baseline
            for row in rows:
                if row["format"] != kind:
                    continue
                reader = row.pop("_reader")
                for r in row["runs"]:
                    r["rss_over_unshuffled"] = r["vm_hwm"] - baseline[reader]
            # the ideal
            ideal = []
            for seed in size["seeds"]:
                order = list(range(n))
                random.Random(seed).shuffle(order)
                ideal.append({"seed": seed, **metrics(order, per_unit, per_file)})
            rows.append(
                {
                    "format": kind,
                    "unit": "row group" if kind == "parquet" else "shard",
                    "contender": "true permutation",
                    "buffer": None,
                    "shuffle_units": None,
                    "elastic": None,
                    "buffer_items": n,
                    "runs": ideal,
                }
            )
    for row in rows:
        row["summary"] = {
            key: _summary(row["runs"], key)
            for key in (
                "same_unit",
                "same_file",
                "abs_rho",
                "displacement",
                "vm_hwm",
                "rss_over_unshuffled",
            )
            if _summary(row["runs"], key)
        }
        row["complete"] = all(r["complete"] for r in row["runs"])
    ratios = _ratios(rows, RATIO_BUFFER[profile], max(size["units"]), size["seeds"])
    result = {
        "benchmark": "shuffle-quality",
        "environment": _harness.environment(PACKAGES),
        "parameters": {
            **{k: v for k, v in size.items()},
            "profile": profile,
            "parquet_rows": n_rows,
            "tar_samples": n_tar,
            "elastic_slice_bytes": slice_bytes,
            "elastic_units": census,
            "sample_bytes": sample_bytes,
            "unshuffled_peak_rss": baselines,
            "ratio_buffer": RATIO_BUFFER[profile],
            "memory": "peak RSS (VmHWM) of the contender's process; rss_over_unshuffled: "
            "that minus the same reader's peak without shuffling",
            "seconds": round(time.time() - started, 1),
        },
        "quality": rows,
        "ratios": ratios,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out_path}")
    return 0 if all(row["complete"] for row in rows) else 1


def _sample_bytes(data_root: Path, n_rows: int, n_tar: int) -> dict[str, int]:
    """A sample's mean payload: a Parquet row's decoded Arrow bytes, a TAR sample's
    bytes in its shards (headers included): what a buffer slot holds, roughly."""
    import pyarrow.parquet as pq

    folder = data_root / "datasets"
    arrow = sum(pq.read_table(p).nbytes for p in (folder / PARQUET_REPO).rglob("*.parquet"))
    tar = sum(p.stat().st_size for p in (folder / TAR_REPO).rglob("*.tar"))
    return {"parquet": arrow // n_rows, "tar": tar // n_tar}


def _slice_census(data_root: Path, slice_bytes: int) -> dict[str, Any]:
    """The elastic units of the Parquet files: how many slices hold 0, 1, 2... row groups
    (a row group belongs to the slice its first byte lies in, as the library assigns it)."""
    import pyarrow.parquet as pq

    holding: dict[int, int] = {}
    for path in sorted((data_root / "datasets" / PARQUET_REPO / "data").glob("*.parquet")):
        meta = pq.ParquetFile(path).metadata
        n = -(-path.stat().st_size // slice_bytes)
        counts = [0] * n
        for r in range(meta.num_row_groups):
            group = meta.row_group(r)
            start = min(
                c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
                for c in (group.column(i) for i in range(group.num_columns))
            )
            counts[min(start // slice_bytes, n - 1)] += 1
        for c in counts:
            holding[c] = holding.get(c, 0) + 1
    return {
        "slices": sum(holding.values()),
        "slices_holding_row_groups": {str(k): v for k, v in sorted(holding.items())},
    }


def _ratios(
    rows: list[dict[str, Any]], buffer: int, units: int, seeds: list[int]
) -> list[dict[str, Any]]:
    """Same-unit neighbour share of aiostream with ``units`` side by side over the peer's,
    at one buffer size, per seed (lower is better: target <= 1)."""
    out = []
    for kind, peer in (("parquet", "datasets"), ("tar", "webdataset")):
        ours_label = f"aiostream shuffle_units={units}"
        ours = _row(rows, kind, ours_label, buffer)
        theirs = _row(rows, kind, peer, buffer)
        per_seed = [
            a["same_unit"] / b["same_unit"] if b["same_unit"] else float("inf")
            for a, b in zip(ours["runs"], theirs["runs"], strict=True)
        ]
        med = _harness.median(per_seed)
        out.append(
            {
                "workload": f"{kind} buffer {buffer}",
                "ratio": f"same-unit neighbours: {ours_label} / {peer}",
                "target": "<= 1.0",
                "median": med,
                "min": min(per_seed),
                "max": max(per_seed),
                "per_round": per_seed,
                "seeds": seeds,
                "met": med <= 1.0,
            }
        )
    return out


def _row(rows: list[dict[str, Any]], kind: str, label: str, buffer: int) -> dict[str, Any]:
    return next(
        r for r in rows if r["format"] == kind and r["contender"] == label and r["buffer"] == buffer
    )


if __name__ == "__main__":
    sys.exit(main())
