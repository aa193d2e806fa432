"""StreamOptions(shuffle_units=K) (issue 32, line 4): a shuffled stream draws its samples
from K units read side by side, not from one unit after another; resumes exactly in its
layout and, elastic, in a job of any size: every sample once."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import aiostream_hf as ash
from aiostream_hf.testing import HubServer, make_repo, make_text_parquet, make_webdataset_shards

pytestmark = pytest.mark.anyio

FILES, ROWS, GROUP = 4, 120, 30  # 16 row groups of 30 rows: ids // GROUP is the unit
SHARDS, PER_SHARD = 8, 15


@pytest.fixture(scope="module")
def parquet_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    folder = make_repo(root, "org/units", {}) / "data"
    for i in range(FILES):
        make_text_parquet(
            folder / f"train-{i}.parquet",
            rows=ROWS,
            row_group_size=GROUP,
            start_id=i * ROWS,
            seed=i,
            min_text=20,
            max_text=60,
        )
    return root


@pytest.fixture(scope="module")
def tar_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    folder = make_repo(root, "org/shards", {}) / "data"
    make_webdataset_shards(folder, shards=SHARDS, samples_per_shard=PER_SHARD, seed=1)
    return root


def _parquet(hub: HubServer, **options: Any) -> Callable[..., Any]:
    def make(rank: int = 0, world: int = 1, **kw: Any) -> Any:
        opts = ash.StreamOptions(prefetch_count=2, **options)
        return ash.stream(
            "hf://datasets/org/units",
            endpoint=hub.endpoint,
            options=opts,
            rank=rank,
            world_size=world,
            **kw,
        )

    return make


def _tar(hub: HubServer, **options: Any) -> Callable[..., Any]:
    url = hub.url("org/shards", f"data/train-{{000000..{SHARDS - 1:06d}}}.tar")
    url = url.replace("%7B", "{").replace("%7D", "}")

    def make(rank: int = 0, world: int = 1, **kw: Any) -> Any:
        opts = ash.StreamOptions(prefetch_count=2, **options)
        return ash.stream(url, options=opts, rank=rank, world_size=world, **kw)

    return make


def _id(sample: dict[str, Any]) -> Any:
    return sample["id"] if "id" in sample else sample["__key__"]


async def _take(s: Any, n: int | None) -> list[Any]:
    got: list[Any] = []
    if n == 0:
        return got
    async for sample in s:
        got.append(_id(sample))
        if n is not None and len(got) >= n:
            break
    return got


def _same_unit_share(ids: Sequence[int]) -> float:
    pairs = list(zip(ids, ids[1:], strict=False))
    return sum(a // GROUP == b // GROUP for a, b in pairs) / len(pairs)


def _roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    try:
        return dict(json.loads(json.dumps(state)))
    except TypeError:  # TAR samples' bytes in a buffer
        return dict(pickle.loads(pickle.dumps(state)))


async def test_the_buffer_draws_from_several_units_not_one_after_another(
    parquet_root: Path, tmp_path: Path
) -> None:
    """With a buffer of 8 rows and units of 30, one unit at a time gives mostly neighbours
    of one row group; four units side by side, mostly of different ones."""
    with HubServer(parquet_root) as hub:
        shares, api = {}, {}
        for units in (1, 4):
            hub.reset_stats()
            make = _parquet(hub, shuffle_units=units, cache_dir=tmp_path / str(units))
            async with make(shuffle=8, seed=5) as s:
                ids = await _take(s, None)
            api[units] = hub.wait_idle().by_bucket.get("api", 0)
            assert sorted(ids) == list(range(FILES * ROWS))  # each row once
            shares[units] = _same_unit_share(ids)
            if units > 1:
                stats = s.statistics()
                assert len(stats.members) == units  # the lanes
                assert all(m.samples > 0 for m in stats.members)  # each lane read units
    assert shares[1] > 0.7, shares
    assert shares[4] < 0.45, shares
    assert 0 < api[4] <= api[1], api  # the lanes share one resolution


async def test_each_consumer_of_a_job_takes_a_disjoint_share_of_units(
    parquet_root: Path,
) -> None:
    with HubServer(parquet_root) as hub:
        make = _parquet(hub, shuffle_units=3)
        delivered: list[int] = []
        for rank in range(2):
            async with make(rank, 2, shuffle=6, seed=1) as s:
                mine = await _take(s, None)
            # whole row groups per consumer: no unit is split between consumers
            assert len({i // GROUP for i in mine}) * GROUP == len(mine)
            delivered += mine
    assert sorted(delivered) == list(range(FILES * ROWS))


@pytest.mark.parametrize("kind", ["parquet", "tar"])
async def test_a_state_resumes_exactly_in_the_same_layout(
    parquet_root: Path, tar_root: Path, kind: str
) -> None:
    root = parquet_root if kind == "parquet" else tar_root
    with HubServer(root) as hub:
        make = (_parquet if kind == "parquet" else _tar)(hub, shuffle_units=3)
        async with make(1, 2, shuffle=10, seed=2) as s:
            whole = await _take(s, None)
        async with make(1, 2, shuffle=10, seed=2) as s:
            head = await _take(s, 23)
            state = _roundtrip(s.state_dict())
        assert state["kind"] == "interleaved"
        again = make(1, 2, shuffle=10, seed=2)
        again.load_state_dict(state)
        async with again:
            rest = await _take(again, None)
    assert head + rest == whole


#: (consumers of each job, samples each takes before the checkpoint; None: to the end)
CHAIN: list[tuple[int, list[int | None]]] = [
    (2, [17, 40]),
    (3, [5, 0, 33]),
    (1, [61]),
    (4, [None, None, None, None]),
]


@pytest.mark.parametrize("kind", ["parquet", "tar"])
async def test_elastic_states_merge_and_resume_in_other_layouts_every_sample_once(
    parquet_root: Path, tar_root: Path, kind: str
) -> None:
    root = parquet_root if kind == "parquet" else tar_root
    with HubServer(root) as hub:
        make = (_parquet if kind == "parquet" else _tar)(
            hub, shuffle_units=3, elastic=True, slice_bytes=10_000
        )
        delivered: list[Any] = []
        job: dict[str, Any] | None = None
        for world, takes in CHAIN:
            states = []
            for rank in range(world):
                s = make(rank, world, shuffle=9, seed=4)
                if job is not None:
                    s.load_state_dict(job)
                async with s:
                    delivered += await _take(s, takes[rank])
                    states.append(_roundtrip(s.state_dict()))
            job = _roundtrip(ash.merge_states(states))
            assert job["of"] == "interleaved"
            assert len(json.dumps(job, default=repr)) < 200_000  # small: no per-sample lists
        async with make(shuffle=None) as whole:
            expected = await _take(whole, None)
    assert len(delivered) == len(set(delivered)), "a sample was delivered twice"
    assert set(delivered) == set(expected), "a sample was lost"


async def test_bad_uses_are_refused_naming_the_way_out(parquet_root: Path) -> None:
    with HubServer(parquet_root) as hub:
        make = _parquet(hub, shuffle_units=2, elastic=True)
        with pytest.raises(ash.SourceError, match=r"shuffle_units=2.*batch_size=4"):
            make(shuffle=8, batch_size=4)
        with pytest.raises(ash.SourceError, match="shuffle_units=2"):
            make(shuffle=8, output="arrow")
        s = make(0, 1, shuffle=8)
        async with s:
            await _take(s, 5)
            state = _roundtrip(s.state_dict())
        job = ash.merge_states([state])
        other = _parquet(hub, shuffle_units=3, elastic=True)(shuffle=8)
        with pytest.raises(ash.SourceError, match="shuffle_units=2"):
            other.load_state_dict(job)
        plain = _parquet(hub, elastic=True)(shuffle=8)
        with pytest.raises(ash.SourceError, match="interleaved"):
            plain.load_state_dict(job)
        with pytest.raises(ash.SourceError, match="rank"):
            make(1, 2, shuffle=8).load_state_dict(state)
    # without shuffle, units are read one after another: a plain stream
    assert isinstance(_parquet(hub, shuffle_units=2)(), ash.Stream)


def test_a_lerobot_stream_refuses_shuffle_units_naming_it() -> None:
    from aiostream_hf import lerobot

    with pytest.raises(ash.SourceError, match=r"shuffle_units=4.*stream\(\)"):
        lerobot.stream("hf://datasets/org/robot", options=ash.StreamOptions(shuffle_units=4))


_TORCH_SCRIPT = """
import sys, warnings
from pathlib import Path
import aiostream_hf as ash
from aiostream_hf.testing import HubServer, make_repo, make_text_parquet
from aiostream_hf.torch import StreamDataset, job_state
from torchdata.stateful_dataloader import StatefulDataLoader

warnings.simplefilter("ignore")  # torchdata calls a deprecated torch API; 3 workers on 2 cores
root = Path(sys.argv[1])
folder = make_repo(root, "org/t", {}) / "data"
for i in range(4):
    make_text_parquet(folder / f"train-{i}.parquet", rows=120, row_group_size=30,
                      start_id=i * 120, seed=i, min_text=20, max_text=60)
with HubServer(root) as hub:
    def dataset():
        opts = ash.StreamOptions(elastic=True, shuffle_units=2, slice_bytes=5000)
        return StreamDataset("hf://datasets/org/t", endpoint=hub.endpoint, shuffle=16, seed=0,
                             options=opts)
    first = StatefulDataLoader(dataset(), batch_size=4, num_workers=2)
    got = []
    for step, batch in enumerate(first):
        got += batch["id"].tolist()
        if step == 5:
            break
    job = job_state([first.state_dict()])
    del first
    again = dataset()
    again.load_state_dict(job)
    for batch in StatefulDataLoader(again, batch_size=4, num_workers=3):
        got += batch["id"].tolist()
    print(len(got), len(set(got)), sorted(set(got)) == list(range(480)))
"""


@pytest.mark.torch
def test_a_dataloader_with_shuffle_units_resumes_with_other_workers_every_row_once(
    tmp_path: Path,
) -> None:
    """2 DataLoader workers with 2 lanes each checkpoint; 3 workers go on: all 480 rows once."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _TORCH_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-3:] == ["480", "480", "True"], proc.stdout
