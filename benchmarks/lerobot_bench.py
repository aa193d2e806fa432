"""LeRobot items: aiostream-hf against LeRobot's own ``LeRobotDataset`` reading the same
files from local disk with its torchcodec backend (issue 33, line 5).

    .venv/bin/python benchmarks/lerobot_bench.py            # full run (+ the peer's venv once)
    .venv/bin/python benchmarks/lerobot_bench.py --quick    # smoke test

The data is ``video_bench.py``'s LeRobot v3.0 dataset (``_ensure_lerobot``: 480x640,
30 fps, AV1 via libsvtav1 g=2 crf=30, two cameras, several episodes per MP4), generated
once under ``--data-dir``; the items are ``video_bench.DELTAS`` windows (two frames of
the top camera, the wrist camera's current frame, two states, 16 actions) over the
profile's episodes, which start mid-file, in order (``sequential``) and shuffled
(``shuffled``). Every side gives the items as ``LeRobotDataset[i]`` does: frames float32
3 x H x W in [0, 1].

Contenders, each in a fresh process, timed from after its imports to its last item (the
setup, metadata and data rows, counts):

- ``lerobot-torchcodec``: ``LeRobotDataset(repo_id, root=<the local folder>,
  episodes=..., delta_timestamps=..., video_backend="torchcodec")`` of lerobot 0.4.4,
  ``dataset[i]`` for each item (a random permutation of them when shuffled), in a venv
  of its own (``benchmarks/.data/lerobot-venv``, made here from
  ``benchmarks/requirements-lerobot.txt``; see that file for why lerobot is installed
  with ``--no-deps`` on torch 2.13.0). torchcodec needs FFmpeg's shared libraries: on
  Debian/Ubuntu, run as root, this script installs them with apt-get when missing.
- ``aiostream-local``: ``lerobot.stream(<the same local folder>, ...)``;
- ``aiostream-hub``: ``lerobot.stream("hf://datasets/...")`` over the local Hub server
  in its own process with ``--latency-ms`` (default 20) per request.

Both sides hash every item (frames, state, action, pads) by index; the digests must
agree. The time spent hashing (both sides, ``hash_seconds``) is not counted: float32
frames take a sha256 about as long as a decode, the same on both sides, and would
squeeze every ratio towards 1. Ratios: items/s of each aiostream side over
``lerobot-torchcodec``, target >= 1.5. One warm-up round, then ``--rounds`` rounds in
rotating order; the machine-noise rules of ``video_bench.py`` (``--idle-cpus``,
``--max-noise``, ``--retries``). Writes ``benchmarks/results/lerobot.json``
(``lerobot-quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _harness  # benchmarks/_harness.py: this script's folder is on sys.path
import video_bench as vb  # its data, its runner and its noise rules

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MB = 1e6
MiB = 1 << 20

PEER = "lerobot-torchcodec"
CONTENDERS = ["aiostream-local", "aiostream-hub", PEER]
ORDERS = ["sequential", "shuffled"]
TARGET = 1.5
LEROBOT_VERSION = "0.4.4"
REQUIREMENTS = HERE / "requirements-lerobot.txt"
PEER_SCRIPT = HERE / "_lerobot_peer.py"
HASH_KEYS = [
    vb.TOP,
    vb.WRIST,
    "observation.state",
    "action",
    f"{vb.TOP}_is_pad",
    "observation.state_is_pad",
    "action_is_pad",
]
#: Debian's packages of the FFmpeg shared libraries torchcodec loads (bookworm: FFmpeg 5).
FFMPEG_APT = ["libavcodec59", "libavformat59", "libavutil57", "libavdevice59",
              "libavfilter8", "libswscale6", "libswresample4"]  # fmt: skip


# =============================================================================
# The project's worker (the peer's is _lerobot_peer.py, in its own venv)
# =============================================================================


def _hash_item(h: Any, item: dict[str, Any]) -> None:
    import numpy as np

    for key in HASH_KEYS:
        value = np.ascontiguousarray(item[key])
        h.update(key.encode() + str(value.dtype).encode() + str(value.shape).encode())
        h.update(value.tobytes())


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    import anyio

    from aiostream_hf import StreamOptions, lerobot

    _harness.preimport(vb.LAZY_IMPORTS["aiostream"])
    _harness.preimport(spec.get("preimport", []))
    before = set(sys.modules)
    shuffled = spec["order"] == "shuffled"
    hub = spec["contender"] == "aiostream-hub"
    hashes: dict[int, str] = {}
    first: list[float] = []
    t0 = time.perf_counter()

    async def run() -> Any:
        s = lerobot.stream(
            f"hf://datasets/{spec['repo']}" if hub else spec["local_root"],
            delta_timestamps=vb.DELTAS,
            episodes=spec["episodes"],
            image_format="float32",
            shuffle=True if shuffled else None,
            seed=spec["seed"],
            options=StreamOptions(cache_dir=Path(spec["cache_dir"])),
            endpoint=spec["endpoint"] if hub else None,
        )
        async with s:
            async for item in s:
                got = time.perf_counter()
                if not first:
                    first.append(got - t0)
                h = hashlib.sha256()
                _hash_item(h, item)
                hashes[int(item["index"])] = h.hexdigest()
                hashing[0] += time.perf_counter() - got
        return s.statistics()

    hashing = [0.0]
    stats = anyio.run(run)
    # The digests are the check, not the work: their time is not counted (on either side).
    elapsed = time.perf_counter() - t0 - hashing[0]
    from dataclasses import asdict

    st = asdict(stats)
    total = hashlib.sha256()
    for idx in sorted(hashes):
        total.update(f"{idx}:{hashes[idx]};".encode())
    usage = _harness.process_usage()
    return {
        "seconds": elapsed,
        "time_to_first_item": first[0] if first else None,
        "items": len(hashes),
        "items_per_s": len(hashes) / elapsed,
        "hash_seconds": hashing[0],
        "digest": total.hexdigest(),
        "first_use_imports": _harness.first_use_imports(before),
        "aiostream_statistics": {
            k: st[k] for k in ("video", "fetcher", "videos_opened", "max_prefetched")
        },
        "vm_hwm": usage["vm_hwm"],
        "cpu_seconds": usage["cpu_user"] + usage["cpu_system"],
    }


# =============================================================================
# The peer's venv
# =============================================================================


def _stamp_of_requirements() -> str:
    return hashlib.sha256(
        REQUIREMENTS.read_bytes() + f"lerobot=={LEROBOT_VERSION}".encode()
    ).hexdigest()


def _peer_check(python: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), str(PEER_SCRIPT), "--check"], capture_output=True, text=True
    )


def ensure_peer(venv: Path) -> Path:
    """The peer venv's interpreter: the venv made (once per requirements file) with
    ``requirements-lerobot.txt``, then lerobot with ``--no-deps``; FFmpeg's shared
    libraries installed with apt-get (as root) when torchcodec cannot load them."""
    python = venv / "bin" / "python"
    stamp = venv / "aiostream-bench-stamp"
    wanted = _stamp_of_requirements()
    if not python.exists() or not stamp.exists() or stamp.read_text() != wanted:
        print(f"making the peer's venv {venv} (lerobot {LEROBOT_VERSION}, torchcodec) ...")
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True)
        # lerobot 0.4.4 declares torch<2.11: its own pins would pull a CUDA torch.
        subprocess.run([*pip, "--no-deps", f"lerobot=={LEROBOT_VERSION}"], check=True)
        stamp.write_text(wanted)
    check = _peer_check(python)
    if check.returncode != 0 and "FFmpeg" in check.stderr and _can_apt():
        print(f"torchcodec cannot load FFmpeg: apt-get install {' '.join(FFMPEG_APT)}")
        subprocess.run(["apt-get", "update", "-q"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                        *FFMPEG_APT], check=False)  # fmt: skip
        check = _peer_check(python)
    if check.returncode != 0:
        raise SystemExit(
            f"the peer's venv {venv} cannot import LeRobotDataset with torchcodec:\n"
            f"{check.stderr[-2000:]}\ntorchcodec needs FFmpeg 4-8's shared libraries (Debian: "
            f"apt-get install {' '.join(FFMPEG_APT)}); remove {venv} to make it again"
        )
    return python


def _can_apt() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


# =============================================================================
# Driver
# =============================================================================


def _print(results: dict[str, Any]) -> None:
    params, env = results["parameters"], results["environment"]
    print(
        f"\n== lerobot_bench ({params['profile']}), latency {params['latency_ms']:g} ms per "
        f"request (aiostream-hub), {env['cpu_count']} CPUs, {env['date']}"
    )
    for name, w in results["workloads"].items():
        print(
            f"\n-- {name}: {w['items']} items (episodes {w['params']['episodes']}), "
            f"{len(w['rounds'])} rounds"
        )
        header = (
            f"{'contender':<20} {'items/s median':>14} {'(min-max)':>17} {'first s':>8} "
            f"{'cdn':>5} {'MB served':>10} {'peak RSS':>9} {'CPU s':>6} {'noise':>6}"
        )
        print(header)
        print("-" * len(header))
        for c, s in w["summary"].items():
            span = f"({s['items_per_s_min']:.1f}-{s['items_per_s_max']:.1f})"
            firsts = [r[c]["time_to_first_item"] for r in w["rounds"] if c in r]
            print(
                f"{c:<20} {s['items_per_s_median']:>14.1f} {span:>17} "
                f"{_harness.median(firsts):>8.2f} {s['requests_median']['cdn']:>5.0f} "
                f"{s['bytes_served_median'] / MB:>10.1f} {s['peak_rss_median'] / MiB:>5.0f} MiB "
                f"{s['cpu_seconds_median']:>6.1f} {s['noise_cpus_median']:>6.2f}"
            )
    print("\n== ratios, measured side by side (median of per-round ratios, min-max)")
    for r in results["ratios"]:
        verdict = "met" if r["met"] else "MISSED"
        print(
            f"{r['ratio']:<76} {r['median']:>6.2f} ({r['min']:.2f}-{r['max']:.2f})  "
            f"target {r['target']:<6} {verdict}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small data, 1 round: a smoke test")
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 5; 1 quick)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up rounds, not reported")
    p.add_argument("--orders", default=",".join(ORDERS), help="comma-separated")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated")
    p.add_argument("--data-dir", type=Path, default=HERE / ".data")
    p.add_argument("--peer-venv", type=Path, default=HERE / ".data" / "lerobot-venv")
    p.add_argument("--out", type=Path, default=None, help="results JSON path")
    _harness.add_quiet_options(p)
    p.add_argument("--prepare", action="store_true", help="make the data and the venv, stop")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        spec = json.loads(args.worker)
        Path(spec["result_path"]).write_text(json.dumps(_worker(spec)))
        return 0

    from aiostream_hf.testing import Faults, HubServer

    quiet = _harness.quiet_parameters(args)
    vb.QUIET.update(
        idle_cpus=args.idle_cpus,
        idle_wait=args.idle_wait,
        max_noise=args.max_noise,
        retries=args.retries,
    )
    profile_name = "quick" if args.quick else "full"
    n_rounds = args.rounds if args.rounds is not None else (1 if args.quick else 5)
    orders = [o.strip() for o in args.orders.split(",") if o.strip()]
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = [x for x in orders if x not in ORDERS] + [
        c for c in contenders if c not in CONTENDERS
    ]
    if unknown:
        raise SystemExit(f"unknown order or contender {unknown}: choose from {ORDERS + CONTENDERS}")
    out_path = args.out or HERE / "results" / (
        "lerobot-quick.json" if args.quick else "lerobot.json"
    )
    data_dir = args.data_dir.resolve() / profile_name
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    stamp = vb._ensure_lerobot(data_dir, vb.PROFILES[profile_name]["lerobot"])
    peer_python = ensure_peer(args.peer_venv.resolve()) if PEER in contenders else None
    if args.prepare:
        return 0

    hub_root = data_dir / "hub"
    local_root = hub_root / "datasets" / stamp["repo"]
    env = _harness.environment(
        ("aiostream-hf", "av", "numpy", "pyarrow", "anyio"),
        peer_python=str(peer_python) if peer_python else None,
    )
    results: dict[str, Any] = {
        "benchmark": "lerobot",
        "environment": env,
        "parameters": {
            "profile": profile_name,
            "latency_ms": args.latency_ms,
            "rounds": n_rounds,
            "warmup_rounds": args.warmup,
            "delta_timestamps": vb.DELTAS,
            "image_format": "float32 3 x H x W (LeRobotDataset's)",
            "data": stamp["params"],
            "peer": f"lerobot {LEROBOT_VERSION} LeRobotDataset, video_backend='torchcodec', "
            "local files (requirements-lerobot.txt, lerobot --no-deps)",
            "timing": "fresh process per run; from after the imports (those made on first "
            "use included, as listed by the contender's first run) to the last item (dataset "
            "setup included), less the time spent hashing items",
            **quiet,
        },
        "workloads": {},
        "ratios": [],
    }
    print(
        f"lerobot_bench: {profile_name}, latency {args.latency_ms:g} ms, {args.warmup} "
        f"warm-up, {n_rounds} rounds; {stamp['items']} items; {env['cpu_count']} CPUs",
        flush=True,
    )
    started = time.perf_counter()
    with HubServer(hub_root, subprocess=True, faults=Faults(latency_ms=args.latency_ms)) as hub:
        import httpx2

        httpx2.get(  # the server hashes a repo's files on first sight
            f"{hub.endpoint}/api/datasets/{stamp['repo']}/tree/main",
            params={"recursive": "true"},
            timeout=1200,
        ).raise_for_status()
        # What each contender's libraries imported on first use in its first run (pandas,
        # which pyarrow imports on its first pa.array; torchcodec's decoders ...): imported
        # before the clock in the runs after it, as every benchmark here does.
        first_use: dict[str, list[str]] = {}
        for order in orders:
            base = {
                "workload": "lerobot",
                "order": order,
                "repo": stamp["repo"],
                "repo_id": stamp["repo"],
                "root": str(local_root),
                "local_root": str(local_root),
                "episodes": stamp["params"]["episodes"],
                "delta_timestamps": vb.DELTAS,
                "hash_keys": HASH_KEYS,
            }
            warmups: list[dict[str, Any]] = []
            rounds: list[dict[str, Any]] = []
            plan = [contenders] * args.warmup + _harness.rotations(contenders, n_rounds)
            for i, names in enumerate(plan):
                warm = i < args.warmup
                tag = f"{order}-warmup{i}" if warm else f"{order}-round{i - args.warmup}"
                this: dict[str, Any] = {}
                for c in names:
                    spec = {**base, "contender": c, "seed": i}
                    spec["command"] = [sys.executable, str(Path(__file__).resolve())]
                    spec["preimport"] = first_use.get(c, [])
                    if c == PEER:
                        assert peer_python is not None
                        spec["command"] = [str(peer_python), str(PEER_SCRIPT)]
                    r = vb._run(hub, spec, log_dir / f"lerobot-bench-{tag}-{c}.log")
                    imported = r.pop("first_use_imports", [])
                    r["preimported"] = len(spec["preimport"])
                    first_use.setdefault(c, imported)
                    r["order_in_round"] = names.index(c)
                    this[c] = r
                    print(
                        f"  [{time.perf_counter() - started:6.0f}s] {tag:<18} {c:<19} "
                        f"{r['items_per_s']:7.1f} items/s ({r['items']} in {r['seconds']:.2f} s, "
                        f"first {r['time_to_first_item']:.2f} s) cdn {r['requests']['cdn']:>4} "
                        f"{r['bytes_served'] / MB:6.1f} MB served",
                        flush=True,
                    )
                if len({x["digest"] for x in this.values()}) != 1:
                    raise RuntimeError(f"lerobot {tag}: the contenders' items differ")
                if any(x["items"] != stamp["items"] for x in this.values()):
                    raise RuntimeError(f"lerobot {tag}: expected {stamp['items']} items")
                (warmups if warm else rounds).append(this)
            name = f"lerobot-vs-torchcodec-{order}"
            results["workloads"][name] = {
                "repo": stamp["repo"],
                "items": stamp["items"],
                "bytes": stamp["bytes"],
                "params": stamp["params"],
                "summary": vb._summary(rounds, "items_per_s"),
                "rounds": rounds,
                "warmup_rounds": warmups,
            }
            if PEER in contenders:
                for ours in (c for c in contenders if c != PEER):
                    results["ratios"].append(
                        vb._ratio(rounds, ours, PEER, "items_per_s", TARGET,
                                  higher_is_better=True,
                                  label=f"lerobot {order}: items/s {ours} / {PEER}")
                    )  # fmt: skip

    results["elapsed_seconds"] = time.perf_counter() - started
    results["environment"]["loadavg_at_end"] = os.getloadavg()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=1, default=str))
    _print(results)
    print(f"\nwrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
