"""One resolution per job (issue 32, line 6): a simulated job of 4 nodes x 4 ranks x 4
consumers on this machine resolves its dataset once, and every row is delivered once.

Nodes are simulated by cache folders: the 4 ranks of a node share one (as processes of a
machine do), and no two nodes share one (as separate machines would not). Every rank is
a process of its own (tests/job_rank_script.py):

- torch.distributed (gloo over a FileStore): rank 0 resolves and broadcasts; half the
  nodes read through DataLoaders of the StreamDataset (4 workers, manifest pickled), the
  other half through DataLoaders whose 4 workers stream the source by name, from the
  node's cache that the broadcast seeded;
- torch.distributed, a MixDataset of the Parquet repo and a repo of TAR shards (2 nodes x
  2 ranks x 2 workers, elastic): rank 0 resolves each dataset once for the job;
- no torch: every process streams with ``StreamOptions(manifest_dir=...)``, a folder
  the 16 processes share, with 4 consumers each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiostream_hf import SourceError
from aiostream_hf.testing import (
    HubServer,
    HubStats,
    LeRobotLayout,
    make_lerobot_dataset,
    make_repo,
    make_text_parquet,
    make_webdataset_shards,
)

HERE = Path(__file__).parent
REPO = "org/job"
SOURCE = f"hf://datasets/{REPO}"
FILES = 4
ROWS = 32  # per file, in row groups of 2: 64 units, one per consumer
NODES, RANKS, WORKERS = 4, 4, 4
SHARDS_REPO = "org/jobshards"  # 8 TAR shards of 4 samples


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    folder = make_repo(root, REPO, {})
    for i in range(FILES):
        make_text_parquet(
            folder / "data" / f"train-{i:05d}-of-{FILES:05d}.parquet",
            rows=ROWS,
            row_group_size=2,
            start_id=i * ROWS,
            seed=i,
            min_text=5,
            max_text=20,
        )
    make_text_parquet(
        folder / "data" / "test-00000-of-00001.parquet", rows=4, start_id=1000, min_text=5
    )
    shards = make_repo(root, SHARDS_REPO, {})
    make_webdataset_shards(shards / "data", shards=8, samples_per_shard=4, width=8, height=8)
    return root


@pytest.fixture
def hub(root: Path) -> Iterator[HubServer]:
    with HubServer(root) as server:
        yield server


def _run_job(
    mode: str,
    hub: HubServer,
    tmp_path: Path,
    *,
    ranks: int = NODES * RANKS,
    per_node: int = RANKS,
    splits: list[str] | None = None,
    source: str = SOURCE,
    extra: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run every rank of a job at once (forked by one launcher); each one's result: the
    ids it read, or its error."""
    config = {
        "mode": mode,
        "endpoint": hub.endpoint,
        "source": source,
        "splits": splits or ["train"] * ranks,
        "ranks": ranks,
        "per_node": per_node,
        "tmp": str(tmp_path),
        **(extra or {}),
    }
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    launcher = subprocess.Popen(
        [sys.executable, str(HERE / "job_rank_script.py"), json.dumps(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its ranks and their workers: one group to end
    )
    try:
        output, _ = launcher.communicate(timeout=110)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.communicate()
        raise
    assert launcher.returncode == 0, output[-3000:]
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(ranks)]


def _check_every_row_once(results: list[dict[str, Any]], stats: HubStats) -> None:
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors
    ids = [i for r in results for i in r["ids"]]
    assert all(r["ids"] for r in results)  # every rank read its share
    assert len(ids) == FILES * ROWS  # nothing twice...
    assert sorted(ids) == list(range(FILES * ROWS))  # ...nothing lost
    assert stats.by_bucket.get("api", 0) <= 3, stats.by_bucket


@pytest.mark.torch
@pytest.mark.skipif(sys.platform != "linux", reason="gloo on loopback, DataLoader with fork")
def test_a_distributed_job_of_4_nodes_x_4_ranks_x_4_workers_resolves_once(
    hub: HubServer, tmp_path: Path
) -> None:
    results = _run_job("distributed", hub, tmp_path)
    stats = hub.wait_idle()
    _check_every_row_once(results, stats)
    print("API requests of the job:", stats.by_bucket)  # the count, for the record
    # One resolution: the pin and the tree listing, made by rank 0, whatever the
    # workers did (half of them resolved by name, from the caches the broadcast seeded).
    assert stats.by_bucket.get("api", 0) == 2


def test_a_job_sharing_a_folder_of_4_nodes_x_4_ranks_x_4_consumers_resolves_once(
    hub: HubServer, tmp_path: Path
) -> None:
    results = _run_job("shared", hub, tmp_path)
    stats = hub.wait_idle()
    _check_every_row_once(results, stats)
    print("API requests of the job:", stats.by_bucket)
    assert stats.by_bucket.get("api", 0) == 2
    assert len(list((tmp_path / "job").glob("job-*.json"))) == 1


@pytest.mark.torch
@pytest.mark.skipif(sys.platform != "linux", reason="gloo on loopback")
def test_a_rank_that_asks_for_another_split_is_told_so(hub: HubServer, tmp_path: Path) -> None:
    results = _run_job(
        "distributed",
        hub,
        tmp_path,
        ranks=2,
        per_node=1,
        splits=["train", "test"],
    )
    assert "ids" in results[0]  # rank 0 read its share
    error = str(results[1].get("error"))
    assert error.startswith("SourceError: job manifest broadcast by rank 0 is for"), error
    assert "split='train'" in error
    assert "build the same dataset" in error
    assert hub.wait_idle().by_bucket.get("api", 0) == 2  # rank 1 resolved nothing


@pytest.mark.torch
@pytest.mark.skipif(sys.platform != "linux", reason="gloo on loopback")
def test_when_rank_0_cannot_resolve_every_rank_says_why(hub: HubServer, tmp_path: Path) -> None:
    results = _run_job(
        "distributed",
        hub,
        tmp_path,
        ranks=2,
        per_node=1,
        source="hf://datasets/org/missing",
    )
    assert str(results[0].get("error")).startswith("RepoNotFoundError:"), results[0]
    error = str(results[1].get("error"))
    assert error.startswith("ResolutionError: rank 0 could not resolve"), error
    assert "RepoNotFoundError" in error


@pytest.mark.torch
@pytest.mark.parametrize("value", ["yes", 1, None])
def test_share_resolution_is_a_flag(value: object) -> None:
    from aiostream_hf.torch import StreamDataset

    with pytest.raises(SourceError, match=r"share_resolution=.*: give True or False"):
        StreamDataset(SOURCE, share_resolution=value)  # type: ignore[arg-type]


LENGTHS = (6, 5, 7, 4)  # frames of 4 episodes: 22


@pytest.fixture(scope="module")
def robot(tmp_path_factory: pytest.TempPathFactory) -> LeRobotLayout:
    return make_lerobot_dataset(
        tmp_path_factory.mktemp("robot"),
        "org/robot",
        codec="h264",
        width=16,
        height=16,
        episodes=LENGTHS,
        episodes_per_video_file=2,
        episodes_per_data_file=2,
    )


@pytest.mark.torch
@pytest.mark.skipif(sys.platform != "linux", reason="gloo on loopback")
def test_a_distributed_lerobot_job_reads_its_metadata_once(
    robot: LeRobotLayout, tmp_path: Path
) -> None:
    with HubServer(robot.path.parents[2]) as hub:
        # 2 nodes x 2 ranks
        results = _run_job("lerobot", hub, tmp_path, ranks=4, per_node=2, source=robot.uri)
        stats = hub.wait_idle()
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors
    indices = [i for r in results for i in r["ids"]]
    assert sorted(indices) == list(range(sum(LENGTHS)))  # every frame once
    print("API requests of the job:", stats.by_bucket)
    # rank 0's reading of meta/ (a pin and the folder's listing), and no other rank's
    assert stats.by_bucket.get("api", 0) <= 2


@pytest.mark.torch
@pytest.mark.skipif(sys.platform != "linux", reason="gloo on loopback, DataLoader with fork")
def test_a_distributed_job_mixing_parquet_and_tar_resolves_each_dataset_once(
    hub: HubServer, tmp_path: Path
) -> None:
    """2 nodes x 2 ranks x 2 workers of a MixDataset (Parquet rows, TAR shards; elastic):
    rank 0 resolves each dataset and broadcasts it; every row and sample once."""
    shards = f"hf://datasets/{SHARDS_REPO}"
    results = _run_job("mix", hub, tmp_path, ranks=4, per_node=2, extra={"shards": shards})
    stats = hub.wait_idle()
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors
    keys = [k for r in results for k in r["ids"]]
    assert all(r["ids"] for r in results)  # every rank read its share
    assert len(keys) == FILES * ROWS + 8 * 4  # nothing twice...
    assert len(set(keys)) == FILES * ROWS + 8 * 4  # ...nothing lost
    print("API requests of the job:", stats.by_bucket)
    assert stats.by_bucket.get("api", 0) <= 4  # a pin and a listing per dataset, by rank 0
