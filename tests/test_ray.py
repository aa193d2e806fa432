"""aiostream_hf.ray on a real local Ray cluster, against the local Hub server.

The cluster (2 CPUs, no dashboard, no usage stats) starts once for the module; its
workers are separate processes that reach the Hub server over loopback. Every row is
compared with pyarrow (or tarfile) reading the same files from local disk, and every
request count comes from the server's own statistics.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

# Before Ray is imported: nothing of it may reach the internet (no usage stats report).
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import ray  # noqa: E402
import ray.data  # noqa: E402
import ray.exceptions  # noqa: E402

import aiostream_hf as ash  # noqa: E402
import aiostream_hf.ray as ash_ray  # noqa: E402
from aiostream_hf import lerobot  # noqa: E402
from aiostream_hf.testing import (  # noqa: E402
    Faults,
    HubServer,
    LeRobotLayout,
    make_lerobot_dataset,
    make_repo,
    make_text_parquet,
    make_webdataset_shards,
)

# Ray 2.60 warns of its own deprecated settings whenever a DataContext is made.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")

ROOT = Path(__file__).resolve().parents[1]
FILES, ROWS, GROUP = 6, 40, 10  # org/text: 6 files of 40 rows, row groups of 10
BIG_GROUPS = 8  # org/big: 2 files of 8 row groups each
SHARDS, PER_SHARD = 4, 5
LENGTHS = (6, 4, 7, 5)  # org/robot: 22 frames in 4 episodes


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        # The workers import aiostream_hf from this tree, as the driver does.
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    text = make_repo(root, "org/text", {})
    for i in range(FILES):
        make_text_parquet(
            text / "data" / f"train-{i:05d}-of-{FILES:05d}.parquet",
            rows=ROWS,
            row_group_size=GROUP,
            start_id=i * ROWS,
            seed=i,
            min_text=5,
            max_text=20,
        )
    big = make_repo(root, "org/big", {})
    for i in range(2):
        make_text_parquet(
            big / "data" / f"train-{i:05d}-of-00002.parquet",
            rows=BIG_GROUPS * GROUP,
            row_group_size=GROUP,
            start_id=i * BIG_GROUPS * GROUP,
            seed=10 + i,
            min_text=2000,
            max_text=4000,
        )
    shards = make_repo(root, "org/shards", {})
    make_webdataset_shards(shards / "data", shards=SHARDS, samples_per_shard=PER_SHARD, width=8)
    return root


@pytest.fixture(scope="module")
def robot(root: Path) -> LeRobotLayout:
    return make_lerobot_dataset(
        root,
        "org/robot",
        codec="h264",
        width=32,
        height=32,
        fps=10,
        episodes=LENGTHS,
        episodes_per_video_file=2,
        episodes_per_data_file=2,
    )


@pytest.fixture(scope="module")
def server(root: Path, robot: LeRobotLayout) -> Iterator[HubServer]:
    with HubServer(root) as hub:
        yield hub


@pytest.fixture
def hub(server: HubServer, cluster: None) -> Iterator[HubServer]:
    server.reset_stats()
    yield server
    server.set_faults(Faults())


def _options(tmp_path: Path, **kw: Any) -> ash.StreamOptions:
    return ash.StreamOptions(cache_dir=tmp_path / "cache", **kw)


def _local(root: Path, repo: str) -> pa.Table:
    files = sorted((root / "datasets" / repo / "data").glob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files])


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """The rows of a table as sorted tuples of its columns in name order."""
    names = sorted(table.column_names)
    return sorted(zip(*(table.column(n).to_pylist() for n in names), strict=True))


def _path(i: int) -> str:
    return f"data/train-{i:05d}-of-{FILES:05d}.parquet"


def _dataset_rows(ds: ray.data.Dataset) -> pa.Table:
    """Every block of the dataset; a task that yields no block (every row group of its
    files pruned by the filter) leaves Ray's empty, column-less placeholder."""
    tables = ray.get(ds.to_arrow_refs())
    return pa.concat_tables([t for t in tables if t.num_columns])


# -- shares: pure planning -----------------------------------------------------------------


@pytest.mark.parametrize("parallelism", [1, 2, 3, 4, 6, 7, 50])
def test_shares_are_disjoint_and_cover_every_file_once(parallelism: int) -> None:
    files = [ash.FileRef(url=f"u{i}", path=f"f{i}", size=100 * (i + 1)) for i in range(6)]
    for splittable in (False, True):
        shares = ash_ray._shares(files, parallelism, splittable, share_bytes=100)
        assert len(shares) >= min(parallelism, len(files))
        covered = [(f.path, r, s.world_size) for s in shares for f in s.files for r in [s.rank]]
        by_file: dict[str, set[int]] = {}
        for path, rank, world in covered:
            assert 0 <= rank < world
            by_file.setdefault(path, set()).add(rank)
            assert len(by_file[path]) <= world
        # Every file's ranks 0..world-1, each once.
        for path, ranks in by_file.items():
            worlds = {w for p, _, w in covered if p == path}
            assert len(worlds) == 1
            assert ranks == set(range(worlds.pop())), path
        assert sorted(by_file) == sorted(f.path for f in files)
        assert len(covered) == sum(len(s.files) for s in shares)
        if not splittable or parallelism <= len(files):
            assert all(s.world_size == 1 for s in shares)
            assert len(shares) == min(parallelism, len(files))
            # Consecutive files, in order.
            assert [f.path for s in shares for f in s.files] == [f.path for f in files]


def test_large_files_split_into_shares_of_at_least_share_bytes() -> None:
    files = [ash.FileRef(url="a", path="a", size=1000), ash.FileRef(url="b", path="b", size=250)]
    shares = ash_ray._shares(files, 20, True, share_bytes=100)
    assert [(s.files[0].path, s.rank, s.world_size) for s in shares] == [
        *(("a", r, 10) for r in range(10)),
        *(("b", r, 2) for r in range(2)),
    ]
    assert ash_ray._shares(files, 4, True, share_bytes=100) == [
        ash_ray._Share((files[0],), 0, 2),
        ash_ray._Share((files[0],), 1, 2),
        ash_ray._Share((files[1],), 0, 2),
        ash_ray._Share((files[1],), 1, 2),
    ]
    assert ash_ray._shares([], 4, True, share_bytes=100) == []
    assert ash_ray._shares(files, 4, True, share_bytes=None) == [
        ash_ray._Share((files[0],)),
        ash_ray._Share((files[1],)),
    ]


# -- Parquet -------------------------------------------------------------------------------


def test_every_row_once_and_api_requests_only_at_the_driver(
    hub: HubServer, root: Path, tmp_path: Path
) -> None:
    source = ash_ray.StreamDatasource(
        "hf://datasets/org/text", endpoint=hub.endpoint, options=_options(tmp_path)
    )
    at_driver = hub.stats()
    assert at_driver.by_bucket == {"api": 2}  # the driver's one resolution: pin + tree
    tasks = source.get_read_tasks(3)
    assert [t.metadata.input_files for t in tasks] == [
        (_path(0), _path(1)),
        (_path(2), _path(3)),
        (_path(4), _path(5)),
    ]
    ds = ray.data.read_datasource(source, override_num_blocks=3)
    table = _dataset_rows(ds)
    stats = hub.stats()
    assert _rows(table) == _rows(_local(root, "org/text"))  # every row once
    assert stats.by_bucket["api"] == at_driver.by_bucket["api"]  # none from the tasks
    assert stats.by_bucket["resolvers"] == FILES  # one /resolve/ request per file


def test_columns_and_filter_are_pushed_down_to_the_engine(
    hub: HubServer, root: Path, tmp_path: Path
) -> None:
    ds = ash_ray.read(
        "hf://datasets/org/text",
        endpoint=hub.endpoint,
        columns=["id", "score"],
        filter=pc.field("id") < 55,
        options=_options(tmp_path),
    )
    table = _dataset_rows(ds)
    stats = hub.stats()
    expected = _local(root, "org/text").select(["id", "score"]).filter(pc.field("id") < 55)
    assert table.column_names == ["id", "score"]
    assert _rows(table) == _rows(expected)
    # The footers of the 6 files, then only the row groups whose statistics admit
    # id < 55: 4 in the first file, 2 in the second (ids 40-59); all would be 6 + 24.
    assert stats.by_bucket["cdn"] <= FILES + 4 + 2


def test_only_the_chunks_of_the_columns_asked_for_are_fetched(
    hub: HubServer, root: Path, tmp_path: Path
) -> None:
    files = sorted((root / "datasets/org/big/data").iterdir())
    ds = ash_ray.read(
        "hf://datasets/org/big",
        endpoint=hub.endpoint,
        columns=["id"],
        options=_options(tmp_path),
        override_num_blocks=2,
    )
    ids = sorted(row["id"] for row in ds.take_all())
    assert ids == list(range(2 * BIG_GROUPS * GROUP))
    # The text column (most of each file) is never fetched: a footer read and the id
    # chunks of each file.
    assert hub.stats().bytes_served < sum(f.stat().st_size for f in files) / 2


def test_few_large_files_split_into_row_group_shares(
    hub: HubServer, root: Path, tmp_path: Path
) -> None:
    files = sorted((root / "datasets/org/big/data").iterdir())
    context = ray.data.DataContext.get_current()
    saved = context.target_max_block_size
    # Shares of a quarter of a file: 4 per file, 8 read tasks for 2 files.
    context.target_max_block_size = files[0].stat().st_size // 4
    try:
        source = ash_ray.StreamDatasource(
            "hf://datasets/org/big",
            endpoint=hub.endpoint,
            columns=["id"],
            options=_options(tmp_path),
        )
        tasks = source.get_read_tasks(8)
        table = _dataset_rows(ray.data.read_datasource(source, override_num_blocks=8))
    finally:
        context.target_max_block_size = saved
    stats = hub.stats()
    assert len(tasks) == 8
    assert sorted(table.column("id").to_pylist()) == list(range(2 * BIG_GROUPS * GROUP))
    assert stats.by_bucket["api"] == 2
    assert stats.by_bucket["resolvers"] == 8  # one per share: each resolves its file once


def test_limit_closes_the_read_task_early(hub: HubServer, tmp_path: Path) -> None:
    ds = ash_ray.read(
        "hf://datasets/org/text",
        endpoint=hub.endpoint,
        columns=["id"],
        options=_options(tmp_path),
        override_num_blocks=1,
    )
    rows = ds.limit(5).take_all()  # Ray stops iterating the task: its stream closes
    assert len(rows) == 5
    assert {row["id"] for row in rows} <= set(range(FILES * ROWS))


# -- WebDataset TAR ------------------------------------------------------------------------


def test_webdataset_shards_every_sample_once(hub: HubServer, root: Path, tmp_path: Path) -> None:
    ds = ash_ray.read(
        "hf://datasets/org/shards",
        endpoint=hub.endpoint,
        options=_options(tmp_path),
        override_num_blocks=SHARDS,
    )
    at_driver = hub.stats()
    table = _dataset_rows(ds)
    stats = hub.stats()
    expected: dict[tuple[str, str], bytes] = {}
    for shard in sorted((root / "datasets/org/shards/data").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                key, ext = member.name.split(".", 1)
                data = tar.extractfile(member)
                assert data is not None
                expected[(key, ext)] = data.read()
    got: dict[tuple[str, str], bytes] = {}
    for row in table.to_pylist():
        for ext, value in row.items():
            if not ext.startswith("__"):
                assert (row["__key__"], ext) not in got  # each sample once
                got[(row["__key__"], ext)] = value
    assert table.num_rows == SHARDS * PER_SHARD
    assert got == expected
    assert at_driver.by_bucket == {"api": 2}
    assert stats.by_bucket["api"] == 2
    assert stats.by_bucket["resolvers"] == SHARDS  # one long read per shard


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("faults", "error"),
    [
        # The file changed after the driver resolved it: its etag no longer matches.
        (Faults(replace_after=0, replace_path=_path(3)), ash.FileChangedError),
        # A CDN that serves other bytes under the old etag: the footer is not Parquet.
        (
            Faults(replace_after=0, replace_path=_path(3), replace_keeps_etag=True),
            ash.DecodeError,
        ),
    ],
    ids=["changed", "corrupt"],
)
def test_an_error_in_a_task_surfaces_as_our_error_naming_the_file(
    hub: HubServer, tmp_path: Path, faults: Faults, error: type[Exception]
) -> None:
    ds = ash_ray.read(
        "hf://datasets/org/text",
        endpoint=hub.endpoint,
        options=_options(tmp_path, max_retries=1, backoff_base=0.001, backoff_max=0.01),
        override_num_blocks=FILES,
    )
    hub.set_faults(faults)  # after the driver's resolution: the task meets it
    with pytest.raises(error) as caught:
        ds.take_all()
    assert isinstance(caught.value, ray.exceptions.RayTaskError)
    cause = caught.value.cause
    assert type(cause) is error
    assert _path(3) in str(cause)
    assert _path(3) in str(caught.value)


def test_bad_options_fail_at_the_driver_before_any_request(hub: HubServer) -> None:
    source = "hf://datasets/org/text"
    with pytest.raises(ash.SourceError, match="takes no rank=: Ray splits"):
        ash_ray.read(source, endpoint=hub.endpoint, rank=0)
    with pytest.raises(ash.SourceError, match=r"ds\.random_shuffle\(\)"):
        ash_ray.read(source, endpoint=hub.endpoint, shuffle=True)
    with pytest.raises(ash.SourceError, match="unknown option colums=: it takes columns,"):
        ash_ray.read(source, endpoint=hub.endpoint, colums=["id"])
    with pytest.raises(ash.SourceError, match="delta_timestamps"):
        ash_ray.read_lerobot(source, endpoint=hub.endpoint, columns=["id"])
    assert hub.stats().requests == 0


def test_a_resolution_error_is_raised_by_read_itself(hub: HubServer, tmp_path: Path) -> None:
    with pytest.raises(ash.SplitNotFoundError, match="tain"):
        ash_ray.read(
            "hf://datasets/org/text",
            split="tain",
            endpoint=hub.endpoint,
            options=_options(tmp_path),
        )


# -- LeRobot -------------------------------------------------------------------------------


def test_lerobot_items_every_frame_once_with_episodes_per_task(
    hub: HubServer, robot: LeRobotLayout, tmp_path: Path
) -> None:
    options = _options(tmp_path)
    deltas = {"action": [0.0, 0.1]}
    source = ash_ray.LeRobotDatasource(
        robot.uri, endpoint=hub.endpoint, options=options, delta_timestamps=deltas
    )
    at_driver = hub.stats()
    tasks = source.get_read_tasks(2)
    assert [t.metadata.num_rows for t in tasks] == [sum(LENGTHS[:2]), sum(LENGTHS[2:])]
    rows = ray.data.read_datasource(source, override_num_blocks=2).take_all()
    stats = hub.stats()
    camera = robot.video_keys[0]
    with lerobot.stream(
        robot.uri, endpoint=hub.endpoint, options=options, delta_timestamps=deltas
    ) as s:
        expected = {int(item["index"]): item for item in s}
    assert sorted(int(r["index"]) for r in rows) == sorted(expected) == list(range(sum(LENGTHS)))
    for row in rows:
        item = expected[int(row["index"])]
        assert row[camera].shape == (32, 32, 3)
        np.testing.assert_array_equal(row[camera], item[camera])
        np.testing.assert_array_equal(row["action"], item["action"])
        np.testing.assert_array_equal(row["action_is_pad"], item["action_is_pad"])
        assert row["task"] == item["task"]
    assert stats.by_bucket["api"] == at_driver.by_bucket["api"]  # none from the tasks


def test_a_private_repo_reads_with_the_drivers_hf_token(
    root: Path, cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF_TOKEN and HF_ENDPOINT set in the driver after the cluster started (its workers
    never saw them): the access found when the datasource is made goes to the tasks."""
    token = "hf_ray_reader"
    with HubServer(root, private={"org/text": [token]}, lfs_threshold=0) as private:
        monkeypatch.delenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", private.endpoint)
        monkeypatch.setenv("HF_TOKEN", token)
        ds = ash_ray.read("hf://datasets/org/text", columns=["id"], options=_options(tmp_path))
        table = _dataset_rows(ds)
        stats = private.stats()
    assert sorted(table.column("id").to_pylist()) == list(range(FILES * ROWS))
    assert stats.by_bucket.get("cdn", 0) > 0
    assert stats.cdn_authorized == 0
