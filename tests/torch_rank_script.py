"""Run under torchrun: each rank streams its share through a DataLoader with 2 workers."""

from __future__ import annotations

import json
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader

import aiostream_hf as ash
from aiostream_hf.torch import StreamDataset


def main(endpoint: str, cache: str, out: str) -> None:
    dist.init_process_group("gloo")
    ds = StreamDataset(
        "hf://datasets/org/many",
        endpoint=endpoint,
        columns=["id"],
        options=ash.StreamOptions(cache_dir=cache),
    )
    ids = [int(i) for batch in DataLoader(ds, batch_size=8, num_workers=2) for i in batch["id"]]
    gathered: list[list[int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, ids)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
