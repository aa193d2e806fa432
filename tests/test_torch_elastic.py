"""Elastic resume with real torch DataLoaders (issue 32, line 2): the states of a
StatefulDataLoader's workers merge into a job state that a job of another size loads, in
new processes (ranks from RANK/WORLD_SIZE, any number of workers)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from elastic_helpers import make_parquet_repo

import aiostream_hf as ash
from aiostream_hf.testing import HubServer, make_repo

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

HERE = Path(__file__).parent
SLICE = 100_000
ROWS = 330
OPTIONS = {"elastic": True, "slice_bytes": SLICE}
KWARGS = {"columns": ["id"], "shuffle": 16, "seed": 3}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    make_parquet_repo(root)
    return root


def _rest_in_new_processes(
    hub: HubServer,
    tmp_path: Path,
    job: dict[str, Any],
    *,
    ranks: int,
    workers: int,
    kind: str = "stream",
    source: str | list[str] = "hf://datasets/org/elastic",
    kwargs: dict[str, Any] | None = None,
    key: str | list[str] = "id",
    extra: dict[str, Any] | None = None,
) -> list[Any]:
    """Every rank of a job of ``ranks`` x ``workers`` reads the rest of the epoch from
    ``job``, each in a process of its own (torch_resume_script.py, RANK/WORLD_SIZE set).
    The job state is saved as JSON, or pickled when it holds bytes (TAR samples)."""
    try:
        state = tmp_path / "job.json"
        state.write_text(json.dumps(job))
    except TypeError:
        state = tmp_path / "job.pkl"
        state.write_bytes(pickle.dumps(job))
    got: list[Any] = []
    for rank in range(ranks):
        out = tmp_path / f"rank-{rank}.json"
        config = {
            "kind": kind,
            "source": source,
            "endpoint": hub.endpoint,
            "cache": str(tmp_path / "cache"),
            "options": OPTIONS,
            "kwargs": KWARGS if kwargs is None else kwargs,
            "state": str(state),
            "job": True,
            "workers": workers,
            "key": key,
            "out": str(out),
            **(extra or {}),
        }
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(ranks)}
        done = subprocess.run(
            [sys.executable, str(HERE / "torch_resume_script.py"), json.dumps(config)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        got += json.loads(out.read_text())
    return got


def test_a_dataloader_job_of_2_workers_resumes_as_2_ranks_of_3_workers(
    root: Path, tmp_path: Path
) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from aiostream_hf.torch import StreamDataset, dataset_states, job_state

    with HubServer(root) as hub:
        options = ash.StreamOptions(cache_dir=tmp_path / "cache", pin_ttl=3600, **OPTIONS)
        ds = StreamDataset(
            "hf://datasets/org/elastic", endpoint=hub.endpoint, options=options, **KWARGS
        )
        loader = StatefulDataLoader(ds, batch_size=4, num_workers=2)
        before: list[int] = []
        for i, batch in enumerate(loader):
            before += [int(x) for x in batch["id"]]
            if i == 12:
                break
        state = json.loads(json.dumps(loader.state_dict()))
        del loader
        workers = dataset_states(state)
        assert [(s["rank"], s["world_size"]) for s in workers] == [(0, 2), (1, 2)]
        job = job_state([state])
        assert job["elastic"]["base"]["buffer"]  # the workers' shuffle buffers, carried over
        hub.reset_stats()
        after = _rest_in_new_processes(hub, tmp_path, job, ranks=2, workers=3)
        assert hub.wait_idle().by_bucket.get("api", 0) == 0  # the pin came from the cache
    assert len(before) + len(after) == ROWS  # nothing twice...
    assert sorted(before + after) == list(range(ROWS))  # ...nothing lost


def test_a_loader_state_behind_its_workers_snapshot_is_refused() -> None:
    from aiostream_hf.torch import dataset_states

    with pytest.raises(ash.SourceError, match="snapshot_every_n_steps=1"):
        dataset_states({"_snapshot": {"_worker_snapshots": {}}, "_steps_since_snapshot": 2})


def test_a_lerobot_dataloader_job_of_3_workers_resumes_as_3_ranks_of_1_worker(
    tmp_path: Path,
) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from aiostream_hf.testing import make_lerobot_dataset
    from aiostream_hf.torch import LeRobotStreamDataset, job_state

    lengths = (12, 9, 15, 11, 7)
    layout = make_lerobot_dataset(
        tmp_path / "robot",
        "org/robot",
        codec="h264",
        width=32,
        height=32,
        episodes=lengths,
        episodes_per_video_file=3,
        episodes_per_data_file=2,
    )
    kwargs = {"shuffle": 8, "seed": 1, "batch_items": 3}
    with HubServer(tmp_path / "robot") as hub:
        options = ash.StreamOptions(cache_dir=tmp_path / "cache", pin_ttl=3600, **OPTIONS)
        ds = LeRobotStreamDataset(layout.uri, endpoint=hub.endpoint, options=options, **kwargs)
        loader = StatefulDataLoader(ds, batch_size=2, num_workers=3)
        before: list[int] = []
        for i, batch in enumerate(loader):
            before += [int(x) for x in batch["index"]]
            if i == 6:
                break
        job = job_state([json.loads(json.dumps(loader.state_dict()))])
        del loader
        after = _rest_in_new_processes(
            hub,
            tmp_path,
            job,
            ranks=3,
            workers=1,
            kind="lerobot",
            source=layout.uri,
            kwargs=kwargs,
            key="index",
        )
    assert len(before) + len(after) == sum(lengths)
    assert sorted(before + after) == list(range(sum(lengths)))


def test_a_mixture_of_parquet_and_tar_dataloader_job_resumes_as_3_ranks_of_1_worker(
    root: Path, tmp_path: Path
) -> None:
    """A MixDataset (Parquet rows and TAR shards, all_exhausted) in a StatefulDataLoader of
    2 workers: its job state resumes in 3 new processes of 1 worker, every sample once."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from aiostream_hf.testing import make_webdataset_shards
    from aiostream_hf.torch import MixDataset, StreamDataset, job_state

    repo = make_repo(root, "org/mixshards", {})
    make_webdataset_shards(repo / "data", shards=5, samples_per_shard=10, seed=4)
    with HubServer(root) as hub:
        options = ash.StreamOptions(cache_dir=tmp_path / "cache", pin_ttl=3600, **OPTIONS)
        shards = hub.url("org/mixshards", "data/train-{000000..000004}.tar")
        sources = ["hf://datasets/org/elastic", shards.replace("%7B", "{").replace("%7D", "}")]
        kwargs = {"shuffle": 8, "seed": 3}
        members = [
            StreamDataset(s, endpoint=hub.endpoint, options=options, **kwargs) for s in sources
        ]
        ds = MixDataset(members, [0.6, 0.4], seed=5, stop="all_exhausted")
        loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
        before: list[str] = []
        for item in loader:
            before.append(str(item["id"]) if "id" in item else str(item["__key__"]))
            if len(before) == 70:
                break
        job = job_state([pickle.loads(pickle.dumps(loader.state_dict()))])
        del loader
        assert job["of"] == "mix"
        assert all(m["elastic"]["base"]["partial"] for m in job["members"])
        after = _rest_in_new_processes(
            hub,
            tmp_path,
            job,
            ranks=3,
            workers=1,
            kind="mix",
            source=sources,
            kwargs=kwargs,
            key=["id", "__key__"],
            extra={"weights": [0.6, 0.4], "seed": 5},
        )
    assert len(before) + len(after) == ROWS + 50  # nothing twice...
    assert len(set(before + after)) == ROWS + 50  # ...nothing lost


# (ranks, DataLoader workers, batches each rank takes before the checkpoint; None: to the
# end): five changes of layout, num_workers=0 among them
TORCH_CHAIN: list[tuple[int, int, list[int | None]]] = [
    (1, 2, [5]),
    (2, 1, [3, 6]),
    (1, 3, [4]),
    (3, 0, [2, 5, 1]),
    (2, 2, [3, 2]),
    (1, 3, [None]),
]


def test_dataloader_jobs_resume_across_five_layouts_every_row_once_nothing_read_again(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain of DataLoader jobs (ranks from RANK/WORLD_SIZE, workers forked by the
    loader): each job loads the one before's job state into its datasets, reads some
    batches and saves a job state (``job_state`` of its ranks' loader states). Every row
    once over the chain, and each job is served no more than what its job state left."""
    from elastic_helpers import parquet_bound
    from torchdata.stateful_dataloader import StatefulDataLoader

    from aiostream_hf.torch import StreamDataset, job_state

    files = sorted((root / "datasets/org/elastic/data").glob("*.parquet"))
    bound = parquet_bound(files, SLICE, seed=KWARGS["seed"], shuffle=True)
    delivered: list[int] = []
    job: dict[str, Any] | None = None
    with HubServer(root) as hub:
        # coalesce_gap=0: exact reads. By default nearby ranges of a file are one request,
        # holes included, which can fetch a partial unit's delivered row groups again,
        # depending on which reads a worker makes together.
        options = ash.StreamOptions(
            cache_dir=tmp_path / "cache", pin_ttl=3600, coalesce_gap=0, **OPTIONS
        )

        def dataset() -> StreamDataset:
            return StreamDataset(
                "hf://datasets/org/elastic", endpoint=hub.endpoint, options=options, **KWARGS
            )

        dataset()  # resolved once: the jobs' datasets find it in the cache (no API request)
        for ranks, workers, takes in TORCH_CHAIN:
            hub.wait_idle()
            hub.reset_stats()
            states = []
            for rank in range(ranks):
                monkeypatch.setenv("RANK", str(rank))
                monkeypatch.setenv("WORLD_SIZE", str(ranks))
                ds = dataset()
                if job is not None:
                    ds.load_state_dict(json.loads(json.dumps(job)))
                loader = StatefulDataLoader(ds, batch_size=4, num_workers=workers)
                for i, batch in enumerate(loader):
                    delivered += [int(x) for x in batch["id"]]
                    if i + 1 == takes[rank]:
                        break
                states.append(json.loads(json.dumps(loader.state_dict())))
                del loader
            served = hub.wait_idle()
            assert served.by_bucket.get("api", 0) == 0
            assert served.bytes_served <= bound(job), (ranks, workers)
            job = job_state(states)
    assert len(delivered) == ROWS  # nothing twice...
    assert sorted(delivered) == list(range(ROWS))  # ...nothing lost
