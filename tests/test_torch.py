"""StreamDataset with torch DataLoaders: request economy, splitting, resume, torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aiostream_hf as ash
from aiostream_hf.testing import HubServer, make_repo, make_text_parquet

pytestmark = [
    pytest.mark.torch,
    # The issue asks for 4 and 16 workers on a 2-core machine: torch warns, rightly.
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    # torchdata 0.11 calls a torch API that torch 2.13 deprecates.
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

HERE = Path(__file__).parent
FILES = 64
ROWS = 20  # per file, in row groups of 5


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    folder = make_repo(root, "org/many", {})
    for i in range(FILES):
        make_text_parquet(
            folder / "data" / f"train-{i:05d}-of-{FILES:05d}.parquet",
            rows=ROWS,
            row_group_size=5,
            start_id=i * ROWS,
            seed=i,
            min_text=5,
            max_text=10,
        )
    return root


@pytest.fixture
def hub(many: Path) -> Iterator[HubServer]:
    with HubServer(many) as server:
        yield server


def _dataset(hub: HubServer, cache: Path, **kw: Any) -> Any:
    from aiostream_hf.torch import StreamDataset

    return StreamDataset(
        "hf://datasets/org/many",
        endpoint=hub.endpoint,
        columns=["id"],
        options=ash.StreamOptions(cache_dir=cache),
        **kw,
    )


def _ids(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch["id"]]


@pytest.mark.parametrize(("workers", "context"), [(4, "fork"), (16, "spawn")])
def test_dataloader_workers_read_every_row_once_and_resolve_nothing(
    hub: HubServer, tmp_path: Path, workers: int, context: str
) -> None:
    from torch.utils.data import DataLoader

    ds = _dataset(hub, tmp_path / "cache")
    after_parent = hub.stats()
    loader = DataLoader(ds, batch_size=8, num_workers=workers, multiprocessing_context=context)
    ids = _ids(loader)
    stats = hub.stats()
    assert sorted(ids) == list(range(FILES * ROWS))
    assert after_parent.by_bucket == {"api": 2}  # the parent's single resolution: pin + tree
    assert stats.by_bucket["api"] == 2  # ...and nothing from the workers
    assert stats.by_bucket["resolvers"] == FILES  # one resolver request per file


def test_fewer_files_than_workers_split_row_groups(hub: HubServer, tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from aiostream_hf.torch import StreamDataset

    ds = StreamDataset(
        "hf://datasets/org/many/data/train-0000[0-1]-of-00064.parquet",
        endpoint=hub.endpoint,
        columns=["id"],
        options=ash.StreamOptions(cache_dir=tmp_path / "c"),
    )
    ids = _ids(DataLoader(ds, batch_size=4, num_workers=4))
    assert sorted(ids) == list(range(2 * ROWS))


def test_set_epoch_reaches_persistent_workers(hub: HubServer, tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    ds = _dataset(hub, tmp_path / "cache", shuffle=10, seed=3)
    loader = DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        epochs.append(_ids(loader))
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(FILES * ROWS))
    assert epochs[0] != epochs[1]


def test_stateful_dataloader_resumes_in_a_new_process(hub: HubServer, tmp_path: Path) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    workers = 2
    ds = _dataset(hub, tmp_path / "cache")
    loader = StatefulDataLoader(ds, batch_size=8, num_workers=workers)
    before: list[int] = []
    for i, batch in enumerate(loader):
        before += [int(x) for x in batch["id"]]
        if i == 10:
            break
    state = loader.state_dict()
    del loader
    state_path, out = tmp_path / "state.json", tmp_path / "after.json"
    state_path.write_text(json.dumps(state))
    hub.reset_stats()
    done = subprocess.run(
        [
            sys.executable,
            str(HERE / "torch_resume_script.py"),
            hub.endpoint,
            str(tmp_path / "cache"),
            str(state_path),
            str(out),
            str(workers),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    after = json.loads(out.read_text())
    stats = hub.stats()
    assert len(before) + len(after) == FILES * ROWS  # no duplicates...
    assert sorted(before + after) == list(range(FILES * ROWS))  # ...and nothing lost
    # Bytes re-fetched: each worker re-reads at most the row group it stopped in.
    file_bytes = sum(f.stat().st_size for f in (hub.root / "datasets/org/many/data").iterdir())
    rows_left = FILES * ROWS - len(before)
    assert stats.bytes_served <= file_bytes * (rows_left + workers * 5) / (FILES * ROWS) * 2


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo on loopback")
def test_torchrun_two_ranks_are_disjoint_and_complete(hub: HubServer, tmp_path: Path) -> None:
    out = tmp_path / "ranks.json"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(HERE / "torch_rank_script.py"),
            hub.endpoint,
            str(tmp_path / "cache"),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = json.loads(out.read_text())
    assert len(ranks) == 2
    assert all(ranks)
    assert not set(ranks[0]) & set(ranks[1])
    assert sorted(ranks[0] + ranks[1]) == list(range(FILES * ROWS))
