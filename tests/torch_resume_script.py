"""Second half of a StatefulDataLoader checkpoint test, run in a fresh process."""

from __future__ import annotations

import json
import sys

from torchdata.stateful_dataloader import StatefulDataLoader

import aiostream_hf as ash
from aiostream_hf.torch import StreamDataset


def main(endpoint: str, cache: str, state_path: str, out: str, workers: str) -> None:
    ds = StreamDataset(
        "hf://datasets/org/many",
        endpoint=endpoint,
        columns=["id"],
        options=ash.StreamOptions(cache_dir=cache),
    )
    loader = StatefulDataLoader(ds, batch_size=8, num_workers=int(workers))
    with open(state_path) as f:
        loader.load_state_dict(json.load(f))
    ids = [int(i) for batch in loader for i in batch["id"]]
    with open(out, "w") as f:
        json.dump(ids, f)


if __name__ == "__main__":
    main(*sys.argv[1:6])
