"""Second half of a StatefulDataLoader checkpoint test, run in a fresh process.

    python torch_resume_script.py CONFIG_JSON

CONFIG_JSON: ``kind`` ("stream" for StreamDataset, "lerobot" for LeRobotStreamDataset),
``source``, ``endpoint``, ``cache``, ``options`` (more StreamOptions), ``kwargs`` (the
dataset's other arguments), ``state`` (a file holding the loader's state), ``workers``,
``key`` (the field to report) and ``out``; ``job``: the state is a job state
(``aiostream_hf.torch.job_state``), loaded into the dataset (any number of workers, any
RANK/WORLD_SIZE in the environment) instead of the loader. Builds the dataset as the test did, loads
the state, reads the rest of the epoch and writes the ``key`` values it got.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader

import aiostream_hf as ash
from aiostream_hf.torch import LeRobotStreamDataset, StreamDataset


def main(config: dict[str, Any]) -> None:
    # pin_ttl: the pin saved by the first process still holds, so no API request is made
    options = ash.StreamOptions(cache_dir=config["cache"], pin_ttl=3600, **config["options"])
    kind = LeRobotStreamDataset if config["kind"] == "lerobot" else StreamDataset
    ds = kind(config["source"], endpoint=config["endpoint"], options=options, **config["kwargs"])
    loader = StatefulDataLoader(ds, batch_size=8, num_workers=config["workers"])
    with open(config["state"]) as f:
        state = json.load(f)
    if config.get("job"):  # a job state (merge_states): the dataset's, for any layout
        ds.load_state_dict(state)
    else:
        loader.load_state_dict(state)
    key = config["key"]
    got = [v if isinstance(v, str) else int(v) for batch in loader for v in batch[key]]
    with open(config["out"], "w") as f:
        json.dump(got, f)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
