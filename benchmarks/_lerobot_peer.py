"""The peer of ``lerobot_bench.py``: LeRobot 0.4.4's ``LeRobotDataset`` reading a local
LeRobot v3.0 folder with its torchcodec backend, one item after the other.

Run by the interpreter of the peer's own venv (``benchmarks/.data/lerobot-venv``, made by
``lerobot_bench.py`` from ``benchmarks/requirements-lerobot.txt``), never the project's:

    benchmarks/.data/lerobot-venv/bin/python benchmarks/_lerobot_peer.py --worker SPEC
    benchmarks/.data/lerobot-venv/bin/python benchmarks/_lerobot_peer.py --check

It imports neither aiostream_hf nor anything of the project but ``_harness`` (standard
library only at import). It prints nothing on stdout but what the driver reads: the
result JSON goes to ``spec["result_path"]``.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import _harness  # benchmarks/_harness.py: this script's folder is on sys.path


def _hash_item(h: Any, item: dict[str, Any], keys: list[str]) -> None:
    """The same bytes as ``lerobot_bench._hash_item`` hashes for the project's items:
    per key its name, numpy dtype, shape and C-ordered bytes."""
    import numpy as np

    for key in keys:
        value = item[key]
        if hasattr(value, "numpy"):  # a torch tensor
            value = value.numpy()
        value = np.ascontiguousarray(value)
        h.update(key.encode() + str(value.dtype).encode() + str(value.shape).encode())
        h.update(value.tobytes())


def _import_torchvision() -> None:
    """Import torchvision, which ``lerobot.datasets`` imports (it uses none of its ops to
    read). The torchvision built for torch 2.13.0 on PyPI is a CUDA build: its ``_C``
    needs libtorch_cuda, which the CPU torch has not, so it loads no op, and
    ``torchvision._meta_registrations`` then fails on the two ops it registers without
    checking (``nms``, ``qnms``): their schemas are defined first, and nothing else."""
    import torch

    try:
        import torchvision  # noqa: F401
    except RuntimeError as exc:
        if "torchvision::nms does not exist" not in str(exc):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        global _TORCHVISION_SCHEMAS
        _TORCHVISION_SCHEMAS = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            _TORCHVISION_SCHEMAS.define(
                f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
            )
        import torchvision  # noqa: F401


_TORCHVISION_SCHEMAS: Any = None


def run(spec: dict[str, Any]) -> dict[str, Any]:
    # The imports LeRobotDataset makes, and those it makes on first use (torchcodec's
    # decoder, datasets' parquet builder), before the clock.
    import numpy  # noqa: F401
    import torch

    _import_torchvision()
    import torchcodec.decoders  # noqa: F401
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    _harness.preimport(spec.get("preimport", []))
    before = set(sys.modules)
    torch.set_num_threads(int(spec.get("torch_threads", 1)))
    deltas = {k: list(v) for k, v in spec["delta_timestamps"].items()}
    t0 = time.perf_counter()
    dataset = LeRobotDataset(
        spec["repo_id"],
        root=spec["root"],
        episodes=spec["episodes"],
        delta_timestamps=deltas,
        video_backend="torchcodec",
    )
    setup = time.perf_counter() - t0
    order = list(range(len(dataset)))
    if spec["order"] == "shuffled":
        random.Random(spec["seed"]).shuffle(order)
    hashes: dict[int, str] = {}
    first = None
    hashing = 0.0
    for i in order:
        item = dataset[i]
        got = time.perf_counter()
        if first is None:
            first = got - t0
        h = hashlib.sha256()
        _hash_item(h, item, spec["hash_keys"])
        hashes[int(item["index"])] = h.hexdigest()
        hashing += time.perf_counter() - got
    elapsed = time.perf_counter() - t0 - hashing  # the digests are the check, not the work
    total = hashlib.sha256()
    for idx in sorted(hashes):
        total.update(f"{idx}:{hashes[idx]};".encode())
    import lerobot
    import torchcodec

    usage = _harness.process_usage()
    return {
        "seconds": elapsed,
        "setup_seconds": setup,
        "time_to_first_item": first,
        "items": len(hashes),
        "items_per_s": len(hashes) / elapsed,
        "hash_seconds": hashing,
        "digest": total.hexdigest(),
        "first_use_imports": _harness.first_use_imports(before),
        "versions": {
            "lerobot": getattr(lerobot, "__version__", None),
            "torch": torch.__version__,
            "torchcodec": getattr(torchcodec, "__version__", None),
        },
        "vm_hwm": usage["vm_hwm"],
        "cpu_seconds": usage["cpu_user"] + usage["cpu_system"],
    }


def check() -> None:
    """What ``run`` imports, and no more: torchcodec (with FFmpeg) and LeRobotDataset."""
    _import_torchvision()
    import torchcodec.decoders  # noqa: F401
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: F401


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        check()
        return 0
    if len(sys.argv) != 3 or sys.argv[1] != "--worker":
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(sys.argv[2])
    Path(spec["result_path"]).write_text(json.dumps(run(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
