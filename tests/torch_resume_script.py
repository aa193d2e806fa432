"""Second half of a StatefulDataLoader checkpoint test, run in a fresh process.

    python torch_resume_script.py CONFIG_JSON

CONFIG_JSON: ``kind`` ("stream" for StreamDataset, "lerobot" for LeRobotStreamDataset,
"mix" for a MixDataset of a StreamDataset per source, with ``weights`` and ``seed``, read
one sample at a time, ``key`` a list of fields: the first a sample has), ``source``,
``endpoint``, ``cache``, ``options`` (more StreamOptions), ``kwargs`` (the dataset's other
arguments), ``state`` (a file holding the loader's state: JSON, or pickled if it ends in
``.pkl``), ``workers``, ``key`` (the field to report) and ``out``; ``job``: the state is a
job state (``aiostream_hf.torch.job_state``), loaded into the dataset (any number of
workers, any RANK/WORLD_SIZE in the environment) instead of the loader. Builds the dataset
as the test did, loads the state, reads the rest of the epoch and writes the ``key`` values it got.
"""

from __future__ import annotations

import json
import pickle
import sys
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader

import aiostream_hf as ash
from aiostream_hf.torch import LeRobotStreamDataset, MixDataset, StreamDataset


def main(config: dict[str, Any]) -> None:
    # pin_ttl: the pin saved by the first process still holds, so no API request is made
    options = ash.StreamOptions(cache_dir=config["cache"], pin_ttl=3600, **config["options"])
    ds: Any
    if config["kind"] == "mix":  # a MixDataset of a StreamDataset per source, unbatched
        members = [
            StreamDataset(source, endpoint=config["endpoint"], options=options, **config["kwargs"])
            for source in config["source"]
        ]
        ds = MixDataset(members, config["weights"], seed=config["seed"], stop="all_exhausted")
        loader = StatefulDataLoader(ds, batch_size=None, num_workers=config["workers"])
    else:
        kind = LeRobotStreamDataset if config["kind"] == "lerobot" else StreamDataset
        ds = kind(
            config["source"], endpoint=config["endpoint"], options=options, **config["kwargs"]
        )
        loader = StatefulDataLoader(ds, batch_size=8, num_workers=config["workers"])
    if config["state"].endswith(".pkl"):  # a state holding bytes (TAR samples)
        with open(config["state"], "rb") as f:
            state = pickle.load(f)
    else:
        with open(config["state"]) as f:
            state = json.load(f)
    if config.get("job"):  # a job state (merge_states): the dataset's, for any layout
        ds.load_state_dict(state)
    else:
        loader.load_state_dict(state)
    key = config["key"]
    if config["kind"] == "mix":  # samples one by one: a row's key, or a TAR sample's
        got = [next(str(item[k]) for k in key if k in item) for item in loader]
    else:
        got = [v if isinstance(v, str) else int(v) for batch in loader for v in batch[key]]
    with open(config["out"], "w") as f:
        json.dump(got, f)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
