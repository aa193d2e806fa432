"""Leaves one iterator half-read and ends: the interpreter must exit at once, silently.

    python tests/exit_script.py CASE ENDPOINT CACHE_DIR

Run by tests/test_exit.py in a fresh process, against its local Hub server. The
script reads a few samples, prints ``left`` and its clock (``time.monotonic()``) and
ends with the iterator (and the bridge's thread, sockets and producers) still
alive: the common "train N steps, then exit" script. Its return code must be 0 and
its stderr empty; the driver measures the time from ``left`` to the exit.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiostream_hf as ash

PARQUET = "org/exit-parquet"
TAR = "org/exit-tar"
ROBOT = "org/exit-robot"
STEPS = 3


def make_repos(root: Path) -> None:
    """The repos the cases read, under ``root`` (a local Hub server's folder)."""
    from aiostream_hf.testing import (
        make_lerobot_dataset,
        make_repo,
        make_text_parquet,
        make_webdataset_shards,
    )

    with tempfile.TemporaryDirectory() as data:  # make_repo copies the files
        files: dict[str, Path] = {}
        for i in range(3):
            path = Path(data) / f"part-{i}.parquet"
            make_text_parquet(path, rows=2000, row_group_size=50, seed=i, start_id=i * 2000)
            files[f"data/train-{i:05d}-of-00003.parquet"] = path
        make_repo(root, PARQUET, files)
    tar = make_repo(root, TAR, {"README.md": "# shards\n"})
    make_webdataset_shards(tar / "data", shards=2, samples_per_shard=200, seed=1)
    make_lerobot_dataset(root, ROBOT, episodes=[8, 8], width=32, height=32)


def _options(cache: str) -> ash.StreamOptions:
    return ash.StreamOptions(cache_dir=cache, prefetch_count=2)


def _parquet(endpoint: str, cache: str) -> ash.Stream:
    return ash.stream(f"hf://datasets/{PARQUET}", endpoint=endpoint, options=_options(cache))


def _left() -> None:
    print("left", time.monotonic(), flush=True)


def sync_case(case: str, endpoint: str, cache: str) -> Any:
    """The half-read iterator (kept alive by the caller until the interpreter ends)."""
    if case == "parquet":
        it: Any = iter(_parquet(endpoint, cache))
    elif case in ("tar", "stalled"):
        import aiostream_hf.webdataset as ashwds

        # Stalled: the server sends each shard's first bytes, then nothing; blocks of
        # 16 KiB let the first samples through, and the producer waits in a read.
        options = ash.StreamOptions(cache_dir=cache, block_size=16 * 1024)
        it = iter(ashwds.stream(f"hf://datasets/{TAR}", endpoint=endpoint, options=options))
    elif case == "mix":
        it = iter(ash.mix([_parquet(endpoint, cache), _parquet(endpoint, cache)], [0.5, 0.5]))
    elif case == "lerobot":
        it = iter(
            ash.lerobot.stream(f"hf://datasets/{ROBOT}", endpoint=endpoint, options=_options(cache))
        )
    elif case == "gopen":
        import webdataset as wds

        import aiostream_hf.webdataset as ashwds

        # Blocks of 16 KiB: the shard's GET is still open, the producer one block ahead.
        options = ash.StreamOptions(cache_dir=cache, block_size=16 * 1024)
        ashwds.install_gopen(endpoint=endpoint, options=options)
        urls = f"hf://datasets/{TAR}/data/train-{{000000..000001}}.tar"
        it = iter(wds.WebDataset(urls, shardshuffle=False))
    elif case == "torch":
        import torch.utils.data

        import aiostream_hf.torch as ashtorch

        dataset = ashtorch.StreamDataset(
            f"hf://datasets/{PARQUET}", endpoint=endpoint, options=_options(cache)
        )
        it = iter(torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=0))
    else:
        raise SystemExit(f"unknown case {case!r}")
    steps = 1 if case == "stalled" else STEPS
    for _ in range(steps):
        next(it)
    return it


async def async_case(case: str, endpoint: str, cache: str) -> Any:
    """An ``async for`` left half-read: the stream's ``async with`` is left with its
    iteration still referenced, and a second iteration is kept past ``anyio.run``."""
    kept: list[Any] = []
    if case.endswith("mix"):
        s: Any = ash.mix([_parquet(endpoint, cache), _parquet(endpoint, cache)], [0.5, 0.5])
    else:
        s = _parquet(endpoint, cache)
    async with s:
        n = 0
        async for _ in s:
            n += 1
            if n == STEPS:
                break
        it = aiter(s)
        await anext(it)
        kept.append(it)
    return kept


if __name__ == "__main__":
    case, endpoint, cache = sys.argv[1:4]
    if case.startswith("async_"):
        import anyio

        backend = case.split("_")[1]
        kept = anyio.run(async_case, case, endpoint, cache, backend=backend)
    else:
        kept = sync_case(case, endpoint, cache)
    _left()
