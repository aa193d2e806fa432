"""Training with a PyTorch DataLoader: StreamDataset, worker processes, checkpoint and resume.

    python examples/dataloader_training.py                 # a local Hub server, synthetic data
    python examples/dataloader_training.py hf://datasets/ORG/NAME --column text --steps 50

``aiostream_hf.torch.StreamDataset`` is a torch ``IterableDataset``: it resolves the
source once, in this process, and hands the list of files to the DataLoader's
workers, which make no API request and read disjoint files (or row groups). With
torchdata's ``StatefulDataLoader`` a checkpoint holds each worker's exact position,
so a resumed run continues with the very next batch.

The model is deliberately tiny: a linear regression from the byte histogram of a
text column to the log of its length. Any text column of any dataset will do, and
the loss goes down.

Needs torch and torchdata: ``pip install -e '.[torch]'``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import aiostream_hf as ash
from aiostream_hf.torch import StreamDataset


def default_workers() -> int:
    """One DataLoader worker per core this process may run on, at most 4: more workers
    than cores only contend with each other and the training loop (torch warns)."""
    if hasattr(os, "sched_getaffinity"):  # the cores of this container or cgroup
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


@contextlib.contextmanager
def local_hub() -> Iterator[str]:
    """A local Hub server with org/web-text (4 Parquet files); yields its endpoint."""
    from aiostream_hf.testing import Faults, HubServer, make_repo, make_text_parquet

    with tempfile.TemporaryDirectory() as root:
        repo = make_repo(root, "org/web-text", {"README.md": "# web-text\n"})
        for i in range(4):
            make_text_parquet(
                repo / f"data/train-{i:05d}-of-00004.parquet",
                rows=500,
                seed=i,
                start_id=i * 500,
                min_text=100,
                max_text=3000,
            )
        with HubServer(root, faults=Faults(latency_ms=20)) as hub:
            yield hub.endpoint


def collate(rows: list[dict[str, Any]], column: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows -> (byte histograms / 100, log1p(length)). Runs in the DataLoader's workers."""
    x = np.zeros((len(rows), 256), dtype=np.float32)
    y = np.zeros((len(rows), 1), dtype=np.float32)
    for i, row in enumerate(rows):
        data = np.frombuffer(str(row[column]).encode(), dtype=np.uint8)
        x[i] = np.bincount(data, minlength=256) / 100
        y[i] = np.log1p(len(data))
    return torch.from_numpy(x), torch.from_numpy(y)


def make_loader(ds: StreamDataset, args: argparse.Namespace) -> StatefulDataLoader:
    with warnings.catch_warnings():
        # StatefulDataLoader is torchdata's current API (0.11, the latest release), but its
        # __init__ still calls torch.set_vital, which torch 2.13 deprecates. That one
        # warning, from torchdata's own code, is not ours to fix; every other one shows.
        warnings.filterwarnings(
            "ignore", "'set_vital' is deprecated", category=UserWarning, module=r"torchdata\."
        )
        return StatefulDataLoader(
            ds,
            batch_size=args.batch_size,
            num_workers=args.workers,
            collate_fn=functools.partial(collate, column=args.column),
        )


def train(source: str, endpoint: str | None, args: argparse.Namespace) -> None:
    started = time.perf_counter()
    ds = StreamDataset(
        source,
        split=args.split,
        columns=[args.column],
        shuffle=args.shuffle,  # file order, and rows through a buffer, by (seed, epoch)
        endpoint=endpoint,
        options=ash.StreamOptions(prefetch_bytes=64 << 20),
    )
    print(f"resolved {len(ds.manifest.files)} files in this process; workers make no API call")
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    loader = make_loader(ds, args)
    checkpoint_at = args.steps // 2
    checkpoint: dict[str, Any] | None = None
    expected: torch.Tensor | None = None
    losses = []
    seen = 0
    for step, (x, y) in enumerate(loader):
        if step == checkpoint_at:
            expected = x  # the first batch after the checkpoint
        if step == args.steps:
            break
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        seen += len(x)
        if step + 1 == checkpoint_at:
            checkpoint = loader.state_dict()  # {worker: exact stream position, ...}
    seconds = time.perf_counter() - started
    print(
        f"trained {len(losses)} steps on {seen:,} rows with {args.workers} workers "
        f"in {seconds:.1f} s ({seen / seconds:,.0f} rows/s)"
    )
    print(f"loss: first {losses[0]:.3f}, last {losses[-1]:.3f}")
    if checkpoint is None or expected is None:
        print("too few steps for a checkpoint: raise --steps")
        return
    resumed = make_loader(ds, args)
    resumed.load_state_dict(checkpoint)
    batches = iter(resumed)
    first, _ = next(batches)
    same = first.shape == expected.shape and bool(torch.equal(first, expected))
    print(f"resumed from the checkpoint at step {checkpoint_at}: next batch identical: {same}")
    # Stop the workers now, not during the interpreter's exit, where their teardown
    # races multiprocessing's removal of its temporary folder.
    del batches, resumed, loader
    gc.collect()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", nargs="?", help="hf://datasets/ORG/NAME, a URL or a path")
    parser.add_argument("--split", default="train")
    parser.add_argument("--column", default="text", help="a text column")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help="DataLoader worker processes (default: one per core, at most 4)",
    )
    parser.add_argument("--shuffle", type=int, default=256, help="shuffle buffer, in rows")
    args = parser.parse_args()
    if args.source:
        train(args.source, None, args)
        return
    with local_hub() as endpoint:
        print(f"local Hub server at {endpoint} (+20 ms per request)")
        train("hf://datasets/org/web-text", endpoint, args)


if __name__ == "__main__":
    main()
