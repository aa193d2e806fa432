"""LeRobot metadata that is too big, too deep or of the wrong type: a library error
naming the file, the field and the value, never a MemoryError, RecursionError or a
bare TypeError/ValueError/OverflowError from inside.

Every metadata file is read whole, so its size is checked before its body is read
(``_lerobot_meta._MAX_META_BYTES``); JSON texts nest at most
``_lerobot_meta._MAX_JSON_DEPTH`` deep, checked before ``json.loads``.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aiostream_hf import StreamOptions, _lerobot_meta, lerobot
from aiostream_hf._exceptions import DecodeError, SourceError
from aiostream_hf.testing import HubServer, LeRobotLayout, make_lerobot_dataset

pytestmark = pytest.mark.anyio

_MiB = 1024 * 1024
_EPISODES_V3 = "meta/episodes/chunk-000/file-000.parquet"
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hub")


@pytest.fixture(scope="module")
def datasets(hub_root: Path) -> dict[str, LeRobotLayout]:
    common: dict[str, Any] = {"codec": "h264", "episodes": (10, 12), "width": 64, "height": 48}
    return {
        "v3": make_lerobot_dataset(hub_root, "org/v3", **common),
        "v21": make_lerobot_dataset(hub_root, "org/v21", version="v2.1", **common),
    }


@pytest.fixture(scope="module")
def hub(hub_root: Path, datasets: dict[str, LeRobotLayout]) -> Iterator[HubServer]:
    with HubServer(hub_root) as server:
        yield server


@pytest.fixture
def options(tmp_path: Path) -> StreamOptions:
    return StreamOptions(cache_dir=tmp_path / "cache")


def copy(layout: LeRobotLayout, target: Path) -> Path:
    shutil.copytree(layout.path, target)
    return target


async def collect(s: lerobot.LeRobotStream) -> list[dict[str, Any]]:
    async with s:
        return [item async for item in s]


def rewrite_jsonl(path: Path, change: Any) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    change(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def set_column(path: Path, name: str, values: pa.Array) -> None:
    table = pq.read_table(path)
    pq.write_table(table.set_column(table.column_names.index(name), name, values), path)


# -- sizes ----------------------------------------------------------------------------------


async def test_an_info_json_over_the_limit_over_the_hub_is_refused_after_its_tail(
    datasets: dict[str, LeRobotLayout],
    hub_root: Path,
    hub: HubServer,
    options: StreamOptions,
    monkeypatch: pytest.MonkeyPatch,
    anyio_backend: str,
) -> None:
    """info.json padded with 8 MiB of spaces (valid JSON) over the local Hub, the limit
    lowered to 1 MiB: refused from the size the tail read tells, its head never read."""
    name = f"padded-info-{anyio_backend}"  # one repo per backend: the Hub is the module's
    repo = copy(datasets["v3"], hub_root / "datasets" / "org" / name)
    info = repo / "meta" / "info.json"
    info.write_bytes(info.read_bytes() + b" " * (8 * _MiB))
    size = info.stat().st_size
    monkeypatch.setattr(_lerobot_meta, "_MAX_META_BYTES", 1 * _MiB)
    hub.reset_stats()
    s = lerobot.stream(f"hf://datasets/org/{name}", endpoint=hub.endpoint, options=options)
    over = rf"meta/info\.json is {size:,} bytes, over the 1,048,576"
    with pytest.raises(DecodeError, match=over):
        await collect(s)
    assert hub.stats().bytes_served <= _lerobot_meta._WHOLE_READ + 64 * 1024


async def test_a_local_episodes_jsonl_of_2_5_gib_is_refused_by_its_size(
    datasets: dict[str, LeRobotLayout], tmp_path: Path, options: StreamOptions
) -> None:
    """A v2.1 episodes.jsonl of 2.5 GiB (a sparse file): refused by its size on disk
    with the default limit, before any of it is read."""
    folder = copy(datasets["v21"], tmp_path / "dataset")
    with (folder / "meta" / "episodes.jsonl").open("r+b") as f:
        f.truncate(5 * 512 * _MiB)
    s = lerobot.stream(folder, options=options)
    with pytest.raises(
        DecodeError, match=r"meta/episodes\.jsonl is 2,684,354,560 bytes, over the 268,435,456"
    ):
        await collect(s)


async def test_a_metadata_parquet_file_over_the_limit_is_refused(
    datasets: dict[str, LeRobotLayout],
    tmp_path: Path,
    options: StreamOptions,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The episodes Parquet file is read whole too: over the limit (lowered here to
    what info.json and tasks.parquet take) it is refused naming the file."""
    folder = copy(datasets["v3"], tmp_path / "dataset")
    info = folder / "meta" / "info.json"
    info.write_text(json.dumps(json.loads(info.read_text())))
    limit = max(info.stat().st_size, (folder / "meta" / "tasks.parquet").stat().st_size)
    assert (folder / _EPISODES_V3).stat().st_size > limit
    monkeypatch.setattr(_lerobot_meta, "_MAX_META_BYTES", limit)
    s = lerobot.stream(folder, options=options)
    with pytest.raises(DecodeError, match=rf"{_EPISODES_V3} is [\d,]+ bytes, over the {limit:,}"):
        await collect(s)


# -- depth ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dataset", "path"),
    [("v3", "meta/info.json"), ("v21", "meta/episodes.jsonl"), ("v21", "meta/tasks.jsonl")],
)
async def test_json_nested_100k_deep_is_refused_before_parsing(
    datasets: dict[str, LeRobotLayout],
    tmp_path: Path,
    options: StreamOptions,
    dataset: str,
    path: str,
) -> None:
    folder = copy(datasets[dataset], tmp_path / "dataset")
    target = folder / path
    if path.endswith(".jsonl"):  # one more row, valid JSON but for its depth
        target.write_text(target.read_text() + '{"task_index": 9, "deep": ' + DEEP + "}\n")
    else:
        target.write_text(DEEP)
    s = lerobot.stream(folder, options=options)
    with pytest.raises(DecodeError, match=rf"{path} nests arrays and objects more than 64 deep"):
        await collect(s)


async def test_a_deep_pandas_metadata_in_tasks_parquet_is_refused(
    datasets: dict[str, LeRobotLayout], tmp_path: Path, options: StreamOptions
) -> None:
    folder = copy(datasets["v3"], tmp_path / "dataset")
    tasks = folder / "meta" / "tasks.parquet"
    table = pq.read_table(tasks)
    pq.write_table(table.replace_schema_metadata({b"pandas": DEEP.encode()}), tasks)
    s = lerobot.stream(folder, options=options)
    with pytest.raises(DecodeError, match=r"tasks\.parquet: its pandas metadata nests"):
        await collect(s)


def test_strings_do_not_count_towards_the_depth() -> None:
    text = json.dumps({"a": "[" * 1000, "b": '\\"[[[', "c": [[[1]]]}).encode()
    _lerobot_meta._check_depth(text, "x")  # 4 deep: no error
    with pytest.raises(DecodeError, match="x nests"):
        _lerobot_meta._check_depth(b'["]", ' + b"[" * 65 + b"]" * 66, "x")


# -- values of the wrong type ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "shown"),
    [
        (pa.array([None, 1], pa.int64()), " has no 'task_index'"),
        (pa.array(["abc", "1"]), ": task_index='abc' is not a whole number"),
        (pa.array([float("nan"), 1.0]), ": task_index=nan is not a whole number"),
    ],
    ids=["null", "abc", "nan"],
)
async def test_a_task_index_that_is_not_a_whole_number(
    datasets: dict[str, LeRobotLayout],
    tmp_path: Path,
    options: StreamOptions,
    values: pa.Array,
    shown: str,
) -> None:
    folder = copy(datasets["v3"], tmp_path / "dataset")
    set_column(folder / "meta" / "tasks.parquet", "task_index", values)
    s = lerobot.stream(folder, options=options)
    with pytest.raises(DecodeError, match=rf"tasks\.parquet \(row 0\){shown}"):
        await collect(s)


@pytest.mark.parametrize(
    ("column", "values", "message"),
    [
        ("from_timestamp", pa.array(["abc", "1"]), r"from_timestamp='abc' is not a number"),
        ("to_timestamp", pa.array([[1.0], [2.0]]), r"to_timestamp=\[1\.0\] is not a number"),
        ("tasks", pa.array([2, 3]), r"tasks=2 is not a list of task texts"),
    ],
)
async def test_a_v3_episode_field_of_the_wrong_type(
    datasets: dict[str, LeRobotLayout],
    tmp_path: Path,
    options: StreamOptions,
    column: str,
    values: pa.Array,
    message: str,
) -> None:
    folder = copy(datasets["v3"], tmp_path / "dataset")
    key = datasets["v3"].video_keys[0]
    name = column if column == "tasks" else f"videos/{key}/{column}"
    set_column(folder / _EPISODES_V3, name, values)
    s = lerobot.stream(folder, options=options)
    with pytest.raises(DecodeError, match=rf"{_EPISODES_V3} \(episode 0\): .*{message}"):
        await collect(s)


async def test_v21_tasks_that_are_not_a_list(
    datasets: dict[str, LeRobotLayout], tmp_path: Path, options: StreamOptions
) -> None:
    folder = copy(datasets["v21"], tmp_path / "dataset")

    def change(rows: list[dict[str, Any]]) -> None:
        rows[1]["tasks"] = 7

    rewrite_jsonl(folder / "meta" / "episodes.jsonl", change)
    s = lerobot.stream(folder, options=options)
    with pytest.raises(DecodeError, match=r"episodes\.jsonl \(episode 1\): tasks=7 is not a list"):
        await collect(s)


async def test_a_camera_shape_of_infinity(
    datasets: dict[str, LeRobotLayout], tmp_path: Path, options: StreamOptions
) -> None:
    """``[1e400, 64, 3]`` in info.json: JSON gives infinity, which int() could not take."""
    folder = copy(datasets["v3"], tmp_path / "dataset")
    key = datasets["v3"].video_keys[0]
    info = folder / "meta" / "info.json"
    data = json.loads(info.read_text())
    data["features"][key]["shape"] = "SHAPE"
    info.write_text(json.dumps(data).replace('"SHAPE"', "[1e400, 64, 3]"))
    s = lerobot.stream(folder, options=options)
    with pytest.raises(
        DecodeError, match=rf"features\['{key}'\]\.shape=\[inf, 64, 3\] is not a frame shape"
    ):
        await collect(s)


@pytest.mark.parametrize(
    ("delta", "shown"),
    [(1e308, "1e+308"), (-(10**400), "an integer of 1,329 bits"), (10**9 + 1, "1000000001")],
)
def test_a_delta_timestamp_too_far_is_a_source_error(
    datasets: dict[str, LeRobotLayout], options: StreamOptions, delta: float, shown: str
) -> None:
    refused = rf"delta_timestamps\['action'\] holds {re.escape(shown)}: more"
    with pytest.raises(SourceError, match=refused):
        lerobot.stream(
            datasets["v3"].path, delta_timestamps={"action": [0.0, delta]}, options=options
        )


async def test_sane_metadata_still_streams(
    datasets: dict[str, LeRobotLayout], options: StreamOptions
) -> None:
    """The checks let the test datasets through: every item of both layouts."""
    for layout in datasets.values():
        items = await collect(lerobot.stream(layout.path, options=options))
        assert len(items) == 22
