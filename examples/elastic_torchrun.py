"""Elastic resume under torchrun: a job checkpoints, a job of another size goes on.

    # a job of 2 ranks x 2 DataLoader workers trains 20 steps, saves ckpt.pt and stops
    torchrun --standalone --nproc_per_node 2 examples/elastic_torchrun.py SOURCE \\
        --workers 2 --stop-after 20 --checkpoint ckpt.pt
    # a job of 3 ranks x 1 worker loads it and trains on the rest of the epoch
    torchrun --standalone --nproc_per_node 3 examples/elastic_torchrun.py SOURCE \\
        --workers 1 --resume ckpt.pt

Every rank streams SOURCE (a Parquet dataset: ``hf://datasets/ORG/NAME``, a URL, a path)
through a ``StreamDataset`` with ``StreamOptions(elastic=True)`` and a torchdata
``StatefulDataLoader``, and trains a tiny model (a linear regression from a text
column's byte histogram to the log of its length) under ``DistributedDataParallel``
over gloo, on CPU. At the checkpoint, the ranks gather their loaders' states and rank 0
merges them into one job state (``aiostream_hf.torch.job_state``), saved with the model.
The next job, with any number of ranks and workers, gives that job state to its dataset:
each worker takes its share of what is left, so over both jobs every sample of the epoch
is trained on exactly once, and no row group already read is read again.

``--record DIR`` writes the ``--key`` values of the samples each rank trained on to
DIR; at the end of the epoch rank 0 reads every file there (the jobs before it too) and
says whether each sample came exactly once. ``--make-data ROOT`` (without torchrun)
writes a small dataset repo, ``demo/elastic-text``, under ROOT for
``aiostream-hf hub serve ROOT``: see docs/dataloader-training.md.

Needs torch and torchdata: ``pip install -e '.[torch]'``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel
from torchdata.stateful_dataloader import StatefulDataLoader

import aiostream_hf as ash
from aiostream_hf.torch import StreamDataset, job_state


def make_data(root: Path) -> None:
    """A dataset repo for the local Hub server: 8 Parquet files of 250 rows (ids 0-1999)."""
    from aiostream_hf.testing import make_repo, make_text_parquet

    repo = make_repo(root, "demo/elastic-text", {"README.md": "# elastic-text\n"})
    for i in range(8):
        make_text_parquet(
            repo / f"data/train-{i:05d}-of-00008.parquet",
            rows=250,
            row_group_size=25,
            seed=i,
            start_id=i * 250,
            min_text=100,
            max_text=1500,
        )
    print(f"wrote {repo} (2,000 rows); serve it with: aiostream-hf hub serve {root}")


class Collate:
    """Rows -> (byte histograms / 100, log1p(length), the rows' keys). Runs in the workers."""

    def __init__(self, column: str, key: str) -> None:
        self.column, self.key = column, key

    def __call__(self, rows: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor, list[Any]]:
        x = np.zeros((len(rows), 256), dtype=np.float32)
        y = np.zeros((len(rows), 1), dtype=np.float32)
        for i, row in enumerate(rows):
            data = np.frombuffer(str(row[self.column]).encode(), dtype=np.uint8)
            x[i] = np.bincount(data, minlength=256) / 100
            y[i] = np.log1p(len(data))
        return torch.from_numpy(x), torch.from_numpy(y), [row[self.key] for row in rows]


def make_loader(ds: StreamDataset, args: argparse.Namespace) -> StatefulDataLoader:
    with warnings.catch_warnings():
        # torchdata 0.11's StatefulDataLoader calls torch.set_vital, deprecated in torch
        # 2.13: that one warning of torchdata's own code is silenced, nothing else.
        warnings.filterwarnings(
            "ignore", "'set_vital' is deprecated", category=UserWarning, module=r"torchdata\."
        )
        return StatefulDataLoader(
            ds,
            batch_size=args.batch_size,
            num_workers=args.workers,
            collate_fn=Collate(args.column, args.key),
            # snapshot_every_n_steps=1 (the default): the loader's state is exact at every step
        )


def train(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, ...
    rank, world = dist.get_rank(), dist.get_world_size()
    # Built on every rank, like a collective: rank 0 resolves SOURCE and broadcasts the
    # list of files, so the job makes one resolution and every rank reads the same commit.
    ds = StreamDataset(
        args.source,
        config=args.config,
        split=args.split,
        columns=[args.column, args.key],
        shuffle=args.shuffle,  # units by (seed, epoch), then rows through a buffer
        seed=args.seed,
        options=ash.StreamOptions(
            elastic=True, slice_bytes=args.slice_bytes, coalesce_gap=args.coalesce_gap
        ),
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(256, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    step = 0
    if args.resume:
        checkpoint = torch.load(args.resume)
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        step = checkpoint["step"]
        # The job state goes to the dataset (not the loader, whose state is tied to its
        # number of workers), before the loader iterates: each worker takes its share.
        ds.load_state_dict(checkpoint["data"])
    started = step
    loader = make_loader(ds, args)
    seen: list[Any] = []
    losses: list[float] = []
    stopped = False
    # Ranks get unequal shares of what is left: Join lets a rank that ran out stand in
    # for the gradient all-reduce of the others until all are done.
    with Join([model]):
        for x, y, keys in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            seen += keys
            step += 1
            if step == args.stop_after:
                stopped = True
                break
    if stopped:
        save(args, loader, model, optimizer, step)
    print(
        f"rank {rank}/{world}: steps {started}-{step}, {len(seen)} samples with "
        f"{args.workers} worker{'s' * (args.workers != 1)}, "
        f"loss first {losses[0]:.3f} last {losses[-1]:.3f}"
        if losses
        else f"rank {rank}/{world}: nothing left to train on",
        flush=True,
    )
    if args.record:
        record = Path(args.record)
        record.mkdir(parents=True, exist_ok=True)
        (record / f"from-step-{started}-rank-{rank}.json").write_text(json.dumps(seen))
    dist.barrier()  # every rank's record written
    if args.record and not stopped and rank == 0:
        check(Path(args.record))
    # Stop the loader's workers now, not during the interpreter's exit.
    del loader
    gc.collect()
    dist.destroy_process_group()


def save(
    args: argparse.Namespace,
    loader: StatefulDataLoader,
    model: DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    step: int,
) -> None:
    """Every rank's loader state at this step, merged by rank 0 into one job state."""
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, loader.state_dict())
    if dist.get_rank() == 0:
        checkpoint = {
            "step": step,
            "model": model.module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "data": job_state(states),  # small: positions, not lists of samples
        }
        torch.save(checkpoint, args.checkpoint)
        print(f"saved the job's state at step {step} to {args.checkpoint}", flush=True)


def check(record: Path) -> None:
    """Whether the samples recorded by every rank of every job came exactly once."""
    keys = [k for path in sorted(record.glob("*.json")) for k in json.loads(path.read_text())]
    once = len(keys) == len(set(keys))
    print(f"every job recorded in {record}: {len(keys):,} samples, each once: {once}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", nargs="?", help="hf://datasets/ORG/NAME, a URL or a path")
    parser.add_argument("--make-data", metavar="ROOT", help="write a demo repo under ROOT")
    parser.add_argument("--config", help="the dataset's config (subset), if it has several")
    parser.add_argument("--split", default="train")
    parser.add_argument("--column", default="text", help="a text column")
    parser.add_argument("--key", default="id", help="a column naming each sample")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--shuffle", type=int, default=64, help="shuffle buffer, in rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--slice-bytes", type=int, default=64 << 20, help="a Parquet file's unit of work"
    )
    parser.add_argument(
        "--coalesce-gap",
        type=int,
        default=1 << 20,
        help="ranges of a file closer than this are one request (0: fetch exactly the rows left)",
    )
    parser.add_argument("--stop-after", type=int, help="save the job's state at this step, stop")
    parser.add_argument("--checkpoint", default="ckpt.pt", help="where --stop-after saves")
    parser.add_argument("--resume", metavar="CHECKPOINT", help="go on from a saved job state")
    parser.add_argument("--record", metavar="DIR", help="write the keys trained on to DIR")
    args = parser.parse_args()
    if args.make_data:
        make_data(Path(args.make_data))
        return
    if not args.source:
        parser.error("give a SOURCE (or --make-data ROOT)")
    if "RANK" not in os.environ:
        parser.error("run it with torchrun --nproc_per_node N (it needs a process group)")
    train(args)


if __name__ == "__main__":
    main()
