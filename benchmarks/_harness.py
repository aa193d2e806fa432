"""What every benchmark script measures the same way: the machine, the worker's
environment, memory, CPU time, idleness, and the order of the rounds.

The scripts run as ``python benchmarks/<name>_bench.py``, so this module is
imported as ``_harness`` from the folder the script lies in.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import resource
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "add_quiet_options",
    "cpu_seconds",
    "environment",
    "first_use_imports",
    "library_fingerprint",
    "machine_busy_seconds",
    "median",
    "preimport",
    "process_usage",
    "quiet_parameters",
    "ratio_entry",
    "rotations",
    "run_worker",
    "server_process",
    "vm_hwm",
    "wait_for_idle",
    "worker_env",
]


def environment(packages: Iterable[str], **extra: Any) -> dict[str, Any]:
    """The machine, Python, the versions of ``packages``, the aiostream_hf sources
    measured, and ``extra`` (e.g. the FFmpeg libraries PyAV links)."""
    import psutil

    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = None
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "memory_total": psutil.virtual_memory().total,
        "loadavg_at_start": os.getloadavg(),
        "packages": versions,
        "aiostream_hf_sources": library_fingerprint(),
        **extra,
    }


def library_fingerprint() -> dict[str, Any]:
    """A digest of the aiostream_hf sources measured (the tree changes between commits)."""
    import aiostream_hf

    root = Path(aiostream_hf.__file__).resolve().parent
    digest = hashlib.sha256()
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    newest = max(path.stat().st_mtime for path in files)
    return {
        "path": str(root),
        "sha256_of_py_sources": digest.hexdigest(),
        "files": len(files),
        "newest_mtime": datetime.fromtimestamp(newest, timezone.utc).isoformat(timespec="seconds"),
    }


def worker_env(endpoint: str, tmp: Path, **extra: str) -> dict[str, str]:
    """A contender's environment: the local Hub as its endpoint, fresh caches under
    ``tmp``, no token, no telemetry, no Xet; ``extra`` on top."""
    env = dict(os.environ)
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        env.pop(key, None)
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HOME=str(tmp / "hf-home"),
        HF_DATASETS_CACHE=str(tmp / "hf-datasets"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HUB_DISABLE_XET="1",
        AIOSTREAM_HF_CACHE=str(tmp / "aiostream-cache"),
        XDG_CACHE_HOME=str(tmp / "xdg-cache"),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def vm_hwm() -> int | None:
    """This process's peak RSS in bytes (VmHWM). Not ru_maxrss, which Linux
    carries over exec from the parent's memory (vfork/posix_spawn)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def process_usage() -> dict[str, Any]:
    """CPU time and page faults of this process and the children it waited for, and
    its peak RSS (``vm_hwm``): what a worker reports when it is done."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "vm_hwm": vm_hwm(),
        "cpu_user": own.ru_utime + children.ru_utime,
        "cpu_system": own.ru_stime + children.ru_stime,
        "minor_faults": own.ru_minflt + children.ru_minflt,
        "major_faults": own.ru_majflt + children.ru_majflt,
    }


def preimport(names: Iterable[str]) -> int:
    """Import ``names`` (what ``first_use_imports`` listed for the same contender in its
    warm-up run) before a worker starts its clock: a module a library imports on first
    use (asyncio's anyio backend, a lazily loaded submodule) is an import, whichever
    side it is, and its time is not the work measured. A name that does not import
    (a module made at run time) is skipped. Returns how many imported."""
    import importlib

    done = 0
    for name in names:
        if name in sys.modules:
            continue
        with contextlib.suppress(Exception):
            importlib.import_module(name)
            done += 1
    return done


def first_use_imports(before: Iterable[str]) -> list[str]:
    """The modules this process has imported since ``before`` (``set(sys.modules)`` at
    the worker's start): its contender's own imports and those its libraries made on
    first use, in the order they were imported (that of ``sys.modules``: some must
    come after others). The next runs of that contender ``preimport`` them."""
    seen = set(before)
    return [name for name in list(sys.modules) if name not in seen]


def add_quiet_options(p: argparse.ArgumentParser) -> None:
    """The options that keep runs on a quiet machine: ``--idle-cpus``, ``--idle-wait``
    (None: 60 s, 5 s with ``--quick``; see ``quiet_parameters``), ``--max-noise``,
    ``--retries``."""
    p.add_argument(
        "--idle-cpus",
        type=float,
        default=0.3,
        help="before each run, wait until the rest of the machine uses at most this many "
        "CPUs (0 to never wait)",
    )
    p.add_argument(
        "--idle-wait", type=float, default=None, help="longest such wait, s (60; 5 with --quick)"
    )
    p.add_argument(
        "--max-noise",
        type=float,
        default=0.25,
        help="repeat a run during which the rest of the machine kept more than this many "
        "CPUs busy on average",
    )
    p.add_argument("--retries", type=int, default=2, help="at most this many repeats of a run")


def quiet_parameters(args: argparse.Namespace) -> dict[str, float]:
    """The quiet-machine options as parsed (``--idle-wait`` settled), as the results
    record them; sets ``args.idle_wait`` too."""
    if args.idle_wait is None:
        args.idle_wait = 5.0 if getattr(args, "quick", False) else 60.0
    return {
        "idle_cpus": args.idle_cpus,
        "idle_wait": args.idle_wait,
        "max_noise_cpus": args.max_noise,
        "retries": args.retries,
    }


def server_process(hub: Any) -> Any:
    """The Hub server's process, a psutil.Process (its CPU time shows whether it is
    the bottleneck); None when the server runs in this process."""
    import psutil

    proc = getattr(hub, "_process", None)
    try:
        return psutil.Process(proc.pid) if proc is not None else None
    except psutil.NoSuchProcess:
        return None


def cpu_seconds(proc: Any) -> float:
    """User + system CPU seconds of a psutil.Process (nan for None)."""
    if proc is None:
        return float("nan")
    times = proc.cpu_times()
    return float(times.user + times.system)


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs of the machine spent busy since boot (from /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    # user nice system idle iowait irq softirq steal ...
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]
    return busy / os.sysconf("SC_CLK_TCK")


def wait_for_idle(max_busy_cpus: float, max_wait: float) -> tuple[float, float]:
    """Wait (at most ``max_wait`` s) until the machine's load is below ``max_busy_cpus``
    over one second; returns the seconds waited and the last load seen."""
    started = time.perf_counter()
    while True:
        before = machine_busy_seconds()
        time.sleep(1.0)
        busy = machine_busy_seconds() - before
        waited = time.perf_counter() - started
        if busy != busy or busy <= max_busy_cpus or waited >= max_wait:
            return waited, busy


def median(xs: Iterable[float]) -> float:
    return float(statistics.median(list(xs)))


def rotations(contenders: list[str], rounds: int) -> list[list[str]]:
    """The contenders' order in each round: rounds go in pairs, the second the first
    reversed, and each pair starts one further along (A B C, C B A, B C A, A C B, ...).
    Within each pair of rounds every two contenders run once in each order, so one that
    would always follow another (a rotation alone keeps neighbours in order: rows-sync
    came right after datasets-tuned and after rows in every round) does not carry an
    order effect into their ratio."""
    n = len(contenders)
    orders = []
    for r in range(rounds):
        k = (r // 2) % n
        order = contenders[k:] + contenders[:k]
        orders.append(order[::-1] if r % 2 else order)
    return orders


def run_worker(
    script: Path,
    spec: dict[str, Any],
    env: dict[str, str],
    log_path: Path,
    *,
    timeout: float = 1800.0,
) -> tuple[int, float, int]:
    """Run ``python script --worker SPEC`` (one contender), its output into ``log_path``,
    polling the RSS of its process tree every 50 ms; (exit status, wall seconds, peak RSS
    of the tree). A worker past ``timeout`` is killed (RuntimeError); an interrupted
    wait kills it too."""
    import psutil

    started = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(script), "--worker", json.dumps(spec)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        peak_tree = 0
        try:
            ps = psutil.Process(proc.pid)
            while proc.poll() is None:
                total = 0
                with contextlib.suppress(psutil.NoSuchProcess):
                    for p in [ps, *ps.children(recursive=True)]:
                        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                            total += p.memory_info().rss
                peak_tree = max(peak_tree, total)
                if time.perf_counter() - started > timeout:
                    proc.kill()
                    raise RuntimeError(f"{spec.get('contender')} timed out after {timeout:.0f} s")
                time.sleep(0.05)
        finally:
            if proc.poll() is None:  # interrupted: do not leave the worker running
                proc.kill()
            proc.wait()
    return proc.returncode, time.perf_counter() - started, peak_tree


def signal_driver(what: str) -> float:
    """In a worker run by ``run_signalling_worker``: tell the driver ``what`` happened and
    wait for its ack (it reads the server's counts meanwhile); the seconds waited."""
    waited = time.perf_counter()
    sys.stdout.write(f"{what}\n")
    sys.stdout.flush()
    sys.stdin.readline()
    return time.perf_counter() - waited


def run_signalling_worker(
    script: Path,
    spec: dict[str, Any],
    env: dict[str, str],
    log_path: Path,
    *,
    on_signal: Callable[[str], None],
    timeout: float,
    poll: Callable[[int], None] | None = None,
) -> tuple[int, float]:
    """Run ``python script --worker SPEC``, its stderr and other output into ``log_path``;
    each line of ``SIGNALS`` it prints (``signal_driver``) calls ``on_signal(line)``
    before the worker is let go on. ``poll(pid)`` runs about every second with the
    worker's process id (it may raise to stop the worker). (exit status, wall seconds);
    past ``timeout`` it is killed (RuntimeError)."""
    started = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(script), "--worker", json.dumps(spec)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdin is not None
        try:
            while True:
                ready, _, _ = select.select([proc.stdout], [], [], 1.0)
                if poll is not None:
                    poll(proc.pid)
                if time.perf_counter() - started > timeout:
                    raise RuntimeError(f"{spec.get('contender')} timed out after {timeout:.0f} s")
                if not ready:
                    if proc.poll() is not None:
                        break
                    continue
                line = proc.stdout.readline()
                if not line:
                    break
                what = line.strip()
                if what in SIGNALS:
                    on_signal(what)
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
                else:
                    log.write(line)
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc.returncode, time.perf_counter() - started


#: What a worker may tell its driver (``signal_driver``).
SIGNALS = ("CONSTRUCTED", "FIRST_BATCH")


def loader_dataset(
    contender: str, repo: str, spec: dict[str, Any], *, id_only: bool = False
) -> tuple[Any, float]:
    """The iterable dataset of one contender for a torch DataLoader, and the
    ``time.perf_counter()`` at which its construction began, after its imports:
    ``aiostream_hf.torch.StreamDataset`` reading column ``id``, or
    ``datasets.load_dataset(streaming=True)`` (only ``id`` with ``id_only``)."""
    if contender == "aiostream":
        import aiostream_hf as ash
        import aiostream_hf.torch as ashtorch

        t0 = time.perf_counter()
        options = ash.StreamOptions(cache_dir=Path(spec["cache_dir"]))
        ds: Any = ashtorch.StreamDataset(
            f"hf://datasets/{repo}", endpoint=spec["endpoint"], columns=["id"], options=options
        )
    elif contender == "datasets":
        import datasets

        datasets.disable_progress_bars()
        t0 = time.perf_counter()
        ds = datasets.load_dataset(repo, split="train", streaming=True)
        if id_only:
            ds = ds.select_columns(["id"])
    else:
        raise SystemExit(f"unknown contender {contender!r}")
    return ds, t0


def ratio_entry(
    workload: str, num: str, den: str, target: float, per_round: list[float]
) -> dict[str, Any]:
    """One ratio of a results JSON (num over den, a higher value the better one): its
    per-round values, median, min-max and whether the median meets ``target``."""
    med = median(per_round)
    return {
        "workload": workload,
        "ratio": f"{num} / {den}",
        "target": target,
        "median": med,
        "min": min(per_round),
        "max": max(per_round),
        "per_round": per_round,
        "met": med >= target,
    }
