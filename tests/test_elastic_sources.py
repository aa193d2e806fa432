"""Elastic epochs beyond the Hub (issue 32, lines 1-3 and 5): the same chains of five
layout changes as tests/test_elastic.py over local files and an S3 bucket (moto), for
Parquet, TAR shards, LeRobot and mix(); the one order with a shuffle for TAR shards,
LeRobot episodes and a mixture's members; small states for every kind; a LeRobot dataset
in one file shared by its episodes, and a mixture's one large Parquet file shared by row
group. On asyncio and trio."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from elastic_helpers import consumers, exactly_once, is_subsequence, run_chain, take

import aiostream_hf as ash
from aiostream_hf import lerobot
from aiostream_hf.testing import (
    HubServer,
    make_lerobot_dataset,
    make_repo,
    make_text_parquet,
    make_webdataset_shards,
)

pytestmark = pytest.mark.anyio

BUCKET = "elastic"
SLICE = 8_000  # bytes: each Parquet file is several units
ROWS = (60, 80, 40)  # per Parquet file: 180 rows, ids 0-179
SHARDS, PER_SHARD = 5, 8
EPISODES = (6, 9, 7, 5, 8)  # frames: 35
# (consumers of each job, samples each takes before the checkpoint): five changes of
# layout (4 -> 3 -> 1 -> 5 -> 2 -> 3), one consumer stopping before its first sample
CHAIN: list[tuple[int, list[int | None]]] = [
    (4, [7, 15, 2, 9]),
    (3, [4, 11, 6]),
    (1, [13]),
    (5, [3, 0, 8, 5, 2]),
    (2, [6, 9]),
    (3, [None, None, None]),
]


def _parquet(folder: Path, files: int = 3, rows: tuple[int, ...] = ROWS) -> None:
    start = 0
    for i in range(files):
        n = rows[i % len(rows)]
        make_text_parquet(
            folder / f"part-{i:04d}.parquet",
            rows=n,
            row_group_size=10,
            start_id=start,
            seed=i,
            min_text=200,
            max_text=600,
        )
        start += n


def _robot(root: Path, episodes: tuple[int, ...], per_file: int = 2) -> Path:
    layout = make_lerobot_dataset(
        root,
        "org/robot",
        episodes=episodes,
        fps=10,
        width=16,
        height=16,
        cameras=("observation.images.top",),
        codec="h264",
        episodes_per_video_file=per_file,
        episodes_per_data_file=per_file,
    )
    return layout.path


@pytest.fixture(scope="module")
def local(s3_store: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Parquet files, TAR shards and a LeRobot dataset on disk and in bucket ``elastic``
    under the same keys."""
    root = tmp_path_factory.mktemp("elastic-data")
    _parquet(root / "parquet")
    make_webdataset_shards(
        root / "shards", shards=SHARDS, samples_per_shard=PER_SHARD, width=16, height=16, seed=3
    )
    robot = _robot(tmp_path_factory.mktemp("elastic-robot"), EPISODES)
    s3_store.put_folder(BUCKET, root)
    s3_store.put_folder(BUCKET, robot, prefix="robot/")
    (root / "robot").symlink_to(robot)
    return root


@pytest.fixture
def store(s3_store: Any, local: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The bucket, with the reader's credentials in the AWS variables."""
    s3_store.env(monkeypatch, tmp_path, s3_store.reader)
    return s3_store


Make = Callable[[int, int], Any]
OPTIONS = ash.StreamOptions(elastic=True, slice_bytes=SLICE, prefetch_count=2)


def _makers(where: str, local: Path, **kw: Any) -> dict[str, Make]:
    """One stream maker per kind over ``where`` ("local" files or the "s3" bucket)."""
    base = str(local) if where == "local" else f"s3://{BUCKET}"
    parquet = f"{base}/parquet/*.parquet"
    shards = f"{base}/shards/train-{{000000..{SHARDS - 1:06d}}}.tar"
    robot = f"{base}/robot"

    def rows(rank: int, world: int) -> ash.Stream:
        return ash.stream(parquet, options=OPTIONS, rank=rank, world_size=world, **kw)

    def tar(rank: int, world: int) -> ash.Stream:
        return ash.stream(shards, options=OPTIONS, rank=rank, world_size=world, **kw)

    def robots(rank: int, world: int) -> Any:
        return lerobot.stream(
            robot, options=OPTIONS, rank=rank, world_size=world, batch_items=3, **kw
        )

    def mixed(rank: int, world: int) -> ash.Mix:
        members = [rows(rank, world), tar(rank, world)]
        return ash.mix(members, [0.6, 0.4], seed=5, stop="all_exhausted")

    return {"parquet": rows, "tar": tar, "lerobot": robots, "mix": mixed}


def _tar_keys(local: Path) -> set[Any]:
    return {s["__key__"] for s in ash.stream(str(local / "shards/*.tar"))}


def _expected(kind: str, local: Path) -> set[Any]:
    rows = set(range(sum(ROWS)))
    return {
        "parquet": rows,
        "tar": _tar_keys(local),
        "lerobot": set(range(sum(EPISODES))),
        "mix": rows | _tar_keys(local),
    }[kind]


# -- line 2: five layout changes from local files and from an S3 bucket -------------------


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("kind", ["parquet", "tar", "lerobot", "mix"])
@pytest.mark.parametrize("shuffle", [False, 7])
async def test_every_kind_resumes_across_five_layouts_from_files_and_a_bucket(
    store: Any, local: Path, where: str, kind: str, shuffle: int | bool
) -> None:
    make = _makers(where, local, shuffle=shuffle, seed=2)[kind]
    delivered, jobs = await run_chain(make, CHAIN)
    exactly_once(delivered, _expected(kind, local))
    bases = (
        [m["elastic"]["base"] for j in jobs[:-1] for m in j["members"]]
        if kind == "mix"
        else [j["elastic"]["base"] for j in jobs[:-1]]
    )
    assert any(b["partial"] for b in bases)  # some job stopped mid-unit
    if shuffle:
        assert any(b["buffer"] for b in bases)  # and carried its buffers over


# -- line 1: with a shuffle, the order is the seed's and epoch's, not the layout's ---------


async def _whole(make: Make, epoch: int = 0) -> list[Any]:
    s = make(0, 1)
    s.set_epoch(epoch)
    async with s:
        return await take(s, None)


@pytest.mark.parametrize("kind", ["tar", "lerobot"])
async def test_a_shuffled_order_is_the_seeds_and_the_epochs_whatever_the_layout(
    local: Path, kind: str
) -> None:
    # shuffle=1: units permuted by (seed, epoch), a buffer of one sample (no reordering)
    make = _makers("local", local, shuffle=1, seed=4)[kind]
    whole = await _whole(make)
    assert whole == await _whole(make)  # the same run again: the same order
    assert sorted(whole) != whole or kind == "tar"  # permuted (TAR keys sort by shard)
    for world in (2, 3, 5):
        shares = await consumers(make, world)
        assert sorted(sum(shares, []), key=str) == sorted(whole, key=str), world
        assert all(is_subsequence(share, whole) for share in shares), world
        # A buffer reorders within each consumer's share only: the same samples.
        buffered = await consumers(_makers("local", local, shuffle=9, seed=4)[kind], world)
        assert [set(b) for b in buffered] == [set(s) for s in shares], world
    other_seed = await _whole(_makers("local", local, shuffle=1, seed=5)[kind])
    other_epoch = await _whole(make, epoch=1)
    for other in (other_seed, other_epoch):
        assert sorted(other, key=str) == sorted(whole, key=str)
        assert other != whole


async def test_a_mixtures_members_each_come_in_their_one_order(local: Path) -> None:
    """A consumer's draws depend on its number, but each member's samples in it are a
    share of that member's one order, whatever the layout."""
    makers = _makers("local", local, shuffle=1, seed=4)
    orders = [await _whole(makers["parquet"]), await _whole(makers["tar"])]
    for world in (1, 2, 3):
        shares = await consumers(makers["mix"], world)
        for member, order in enumerate(orders):
            mine = set(order)
            got = [[x for x in share if x in mine] for share in shares]
            assert sorted(sum(got, []), key=str) == sorted(order, key=str), (world, member)
            assert all(is_subsequence(g, order) for g in got), (world, member)


# -- line 3: small states for TAR, LeRobot and mixtures ----------------------------------


def _size(state: dict[str, Any]) -> int:
    return len(json.dumps(state))


@pytest.mark.parametrize("kind", ["tar", "lerobot", "mix"])
async def test_a_state_is_as_small_for_a_dataset_ten_times_larger(
    tmp_path: Path, kind: str
) -> None:
    sizes = []
    opts = ash.StreamOptions(elastic=True, slice_bytes=SLICE)
    for scale in (1, 10):
        root = tmp_path / f"x{scale}"
        _parquet(root / "parquet", files=3 * scale)
        make_webdataset_shards(
            root / "shards", shards=4 * scale, samples_per_shard=4, width=8, height=8
        )
        if kind == "lerobot":
            _robot(root / "hub", (4,) * 5 * scale, per_file=5 * scale)
        base = str(root)
        shards = f"{base}/shards/train-{{000000..{4 * scale - 1:06d}}}.tar"

        def make(rank: int, world: int, base: str = base, shards: str = shards) -> Any:
            kw = {"options": opts, "rank": rank, "world_size": world}
            if kind == "lerobot":
                return lerobot.stream(f"{base}/hub/datasets/org/robot", batch_items=1, **kw)
            tar = ash.stream(shards, **kw)
            if kind == "tar":
                return tar
            rows = ash.stream(f"{base}/parquet/*.parquet", **kw)
            return ash.mix([rows, tar], [0.5, 0.5], seed=1, stop="all_exhausted")

        states = []
        for rank, n in enumerate([3, 1, 2]):  # uneven progress, mid-unit
            async with make(rank, 3) as s:
                assert len(await take(s, n)) >= n
                states.append(pickle.loads(pickle.dumps(s.state_dict())))
        job = ash.merge_states(states)
        assert _size(job) < 2500  # no list of samples, units or files
        sizes.append((max(_size(s) for s in states), _size(job)))
    (small_state, small_job), (large_state, large_job) = sizes
    # The same positions: only numbers grow (a digit or two), not lists.
    assert large_state <= small_state + 60, sizes
    assert large_job <= small_job + 60, sizes


# -- line 5: one file shared by the consumers --------------------------------------------


async def test_a_lerobot_dataset_in_one_file_is_shared_by_episode(tmp_path: Path) -> None:
    """Five episodes in one data file and one video file, four consumers: each delivers
    frames, and each is served less than the files (only its episodes' rows and GOPs)."""
    lengths = (12, 9, 15, 11, 10)
    folder = _robot(tmp_path / "hub", lengths, per_file=5)
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix in (".parquet", ".mp4")]
    data = [p for p in files if "data/" in p.as_posix()]
    videos = [p for p in files if p.suffix == ".mp4"]
    assert len(data) == 1  # one data file
    assert len(videos) == 1  # one video file
    total = sum(p.stat().st_size for p in files)
    got = []
    with HubServer(tmp_path / "hub") as hub:
        async with lerobot.stream("hf://datasets/org/robot", endpoint=hub.endpoint) as probe:
            meta = await probe.load_metadata()  # read once: the consumers read data only
        for rank in range(4):
            hub.wait_idle()
            hub.reset_stats()
            s = lerobot.stream(
                meta, options=ash.StreamOptions(elastic=True), rank=rank, world_size=4
            )
            async with s:
                mine = await take(s, None)
            assert mine, f"consumer {rank} of 4 idled"
            assert hub.wait_idle().bytes_served < total, rank
            got.append(mine)
    assert sorted(sum(got, [])) == list(range(sum(lengths)))


async def test_a_mixtures_one_large_parquet_file_is_shared_by_row_group(tmp_path: Path) -> None:
    """A mixture of one Parquet file (several slices) and two TAR shards, over four
    consumers: every consumer delivers rows of the one file."""
    repo = make_repo(tmp_path / "hub", "org/one", {})
    make_text_parquet(
        repo / "one.parquet", rows=120, row_group_size=10, seed=1, min_text=300, max_text=600
    )
    make_webdataset_shards(repo / "shards", shards=2, samples_per_shard=6, width=8, height=8)
    with HubServer(tmp_path / "hub") as hub:
        opts = ash.StreamOptions(elastic=True, slice_bytes=SLICE)
        got = []
        for rank in range(4):
            # Listed on the Hub, so the file's size is known and it is cut into slices (a
            # plain URL's size is not: it is one unit, read by one consumer).
            kw = {"options": opts, "rank": rank, "world_size": 4, "endpoint": hub.endpoint}
            members = [
                ash.stream("hf://datasets/org/one/one.parquet", **kw),
                ash.stream("hf://datasets/org/one/shards/*.tar", **kw),
            ]
            async with ash.mix(members, [0.8, 0.2], seed=2, stop="all_exhausted") as m:
                mine = await take(m, None)
            assert any(isinstance(x, int) for x in mine), f"consumer {rank} read no row"
            got.append(mine)
    ids = [x for share in got for x in share if isinstance(x, int)]
    assert sorted(ids) == list(range(120))
