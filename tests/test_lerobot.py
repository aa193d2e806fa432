"""``lerobot.stream`` against LeRobot's rules, computed here from a local copy of the dataset.

The datasets come from ``aiostream_hf.testing.make_lerobot_dataset`` (tiny videos: 64x48,
a few episodes of 20-40 frames, several episodes per video and data file in v3.0, so
most episodes start in the middle of a file, and chunk-001 exists). They are served by
the real ``HubServer`` over loopback.

The oracle (``reference_items``) reads the files straight from disk with pyarrow,
pandas and PyAV, and applies ``LeRobotDataset.__getitem__`` as lerobot writes it
(``lerobot/datasets/lerobot_dataset.py`` and ``utils.py``), without any code of
the module under test:

- ``get_delta_indices``: ``round(d * fps)``;
- ``_get_query_indices``: ``max(ep_start, min(ep_end - 1, idx + delta))`` and
  ``is_pad = idx + delta < ep_start or idx + delta >= ep_end``;
- ``_get_query_timestamps``: the ``timestamp`` column at the query indices for a
  camera with deltas, else ``[current_ts]``;
- ``_query_videos``: ``from_timestamp + ts`` (v3.0; v2.1 files start at 0), decoded
  by PyAV from the whole file, nearest frame by ``|pts - ts|`` within tolerance,
  ``squeeze(0)`` without deltas; float32 frames are ``C x H x W`` and ``/ 255``;
- ``task``: ``meta.tasks.iloc[task_index].name`` (pandas, v3.0) or ``tasks[task_index]``
  (v2.1).

Every item must be equal, key for key, dtype for dtype, pixel for pixel.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import av
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aiostream_hf import FileRef, StreamOptions, _lerobot_meta, lerobot
from aiostream_hf import video as video_module
from aiostream_hf._exceptions import (
    ClosedResourceError,
    DecodeError,
    EntryNotFoundError,
    FrameTimestampError,
    SourceError,
    SplitNotFoundError,
)
from aiostream_hf.testing import HubServer, LeRobotLayout, make_lerobot_dataset

pytestmark = pytest.mark.anyio

W, H = 64, 48
LENGTHS = (20, 33, 27, 40, 25)
TOP, WRIST = "observation.images.top", "observation.images.wrist"
WINDOWS = {
    TOP: [-3 / 30, -1 / 30, 0.0],
    "observation.state": [-1 / 30, 0.0],
    "action": [0.0, 1 / 30, 2 / 30, 3 / 30],
}


# -- the oracle: LeRobot's rules over the files on disk -------------------------------------


@functools.cache
def decoded(path: Path) -> tuple[np.ndarray[Any, Any], list[np.ndarray[Any, Any]]]:
    """Every frame of a video (pts in seconds, RGB), decoded by PyAV in order."""
    times, images = [], []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            times.append(frame.time)
            images.append(frame.to_ndarray(format="rgb24"))
    return np.array(times, dtype=np.float64), images


def decode_frames(
    path: Path, timestamps: Sequence[float], tolerance_s: float
) -> np.ndarray[Any, Any]:
    """LeRobot's ``decode_video_frames``: the nearest frame to each timestamp (T x H x W x 3)."""
    times, images = decoded(path)
    picked = []
    for t in timestamps:
        distance = np.abs(times - t)
        j = int(np.argmin(distance))
        assert distance[j] < tolerance_s, f"oracle: no frame near {t} in {path}"
        picked.append(images[j])
    return np.stack(picked)


def reference_items(
    layout: LeRobotLayout,
    *,
    delta_timestamps: Mapping[str, Sequence[float]] | None = None,
    tolerance_s: float = 1e-4,
    image_format: str = "uint8",
    episodes: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    root = layout.path
    info = json.loads((root / "meta" / "info.json").read_text())
    fps, features = info["fps"], info["features"]
    video_keys = [k for k, f in features.items() if f["dtype"] == "video"]
    if info["codebase_version"] == "v3.0":
        episode_rows = pa.concat_tables(
            [pq.read_table(p) for p in sorted((root / "meta" / "episodes").glob("*/*.parquet"))]
        ).to_pylist()
        meta_episodes = {row["episode_index"]: row for row in episode_rows}
        tasks = pd.read_parquet(root / "meta" / "tasks.parquet")

        def task_of(i: int) -> str:
            return str(tasks.iloc[i].name)

        def video_of(ep: int, key: str) -> tuple[Path, float]:
            row = meta_episodes[ep]
            path = info["video_path"].format(
                video_key=key,
                chunk_index=row[f"videos/{key}/chunk_index"],
                file_index=row[f"videos/{key}/file_index"],
            )
            return root / path, row[f"videos/{key}/from_timestamp"]

        bounds = {
            e: (r["dataset_from_index"], r["dataset_to_index"]) for e, r in meta_episodes.items()
        }
    else:
        lines = (root / "meta" / "episodes.jsonl").read_text().splitlines()
        rows_v2 = sorted((json.loads(x) for x in lines), key=lambda r: r["episode_index"])
        task_lines = (root / "meta" / "tasks.jsonl").read_text().splitlines()
        task_map = {r["task_index"]: r["task"] for r in map(json.loads, task_lines)}

        def task_of(i: int) -> str:
            return str(task_map[i])

        def video_of(ep: int, key: str) -> tuple[Path, float]:
            path = info["video_path"].format(
                episode_chunk=ep // info["chunks_size"], video_key=key, episode_index=ep
            )
            return root / path, 0.0

        bounds, start = {}, 0
        for r in rows_v2:
            bounds[r["episode_index"]] = (start, start + r["length"])
            start += r["length"]

    data_files = sorted((root / "data").glob("*/*.parquet"))
    hf_dataset = pa.concat_tables([pq.read_table(p) for p in data_files]).to_pylist()
    hf_dataset.sort(key=lambda r: r["index"])
    assert [r["index"] for r in hf_dataset] == list(range(len(hf_dataset)))

    def as_array(key: str, value: Any) -> Any:
        return np.asarray(value, dtype=features[key]["dtype"])

    delta_indices = (
        {k: [round(d * fps) for d in v] for k, v in delta_timestamps.items()}
        if delta_timestamps
        else None
    )
    items = []
    for idx, row in enumerate(hf_dataset):
        ep = row["episode_index"]
        if episodes is not None and ep not in episodes:
            continue
        item: dict[str, Any] = {k: as_array(k, v) for k, v in row.items()}
        query_indices = None
        if delta_indices is not None:
            ep_start, ep_end = bounds[ep]
            query_indices = {
                k: [max(ep_start, min(ep_end - 1, idx + d)) for d in ds]
                for k, ds in delta_indices.items()
            }
            padding = {
                f"{k}_is_pad": np.array(
                    [(idx + d < ep_start) | (idx + d >= ep_end) for d in ds], dtype=bool
                )
                for k, ds in delta_indices.items()
            }
            item = {**item, **padding}
            for k, q in query_indices.items():
                if k not in video_keys:
                    item[k] = np.stack([as_array(k, hf_dataset[i][k]) for i in q])
        frames = {}
        current_ts = float(np.float32(row["timestamp"]))
        for key in video_keys:
            if query_indices is not None and key in query_indices:
                query_ts = [
                    float(np.float32(hf_dataset[i]["timestamp"])) for i in query_indices[key]
                ]
            else:
                query_ts = [current_ts]
            path, from_timestamp = video_of(ep, key)
            got = decode_frames(path, [from_timestamp + t for t in query_ts], tolerance_s)
            if image_format == "float32":
                got = got.transpose(0, 3, 1, 2).astype(np.float32) / np.float32(255)
            frames[key] = got[0] if len(query_ts) == 1 and key not in (delta_indices or {}) else got
        item = {**frames, **item}
        item["task"] = task_of(int(row["task_index"]))
        items.append(item)
    return items


def assert_items_equal(got: Sequence[Mapping[str, Any]], want: Sequence[Mapping[str, Any]]) -> None:
    assert len(got) == len(want)
    for n, (g, w) in enumerate(zip(got, want, strict=True)):
        assert set(g) == set(w), f"item {n}: keys {sorted(g)} != {sorted(w)}"
        for key, expected in w.items():
            value = g[key]
            if isinstance(expected, str):
                assert value == expected, f"item {n} {key}"
                continue
            actual = np.asarray(value)
            assert actual.dtype == expected.dtype, f"item {n} {key}: {actual.dtype}"
            assert actual.shape == expected.shape, f"item {n} {key}: {actual.shape}"
            assert np.array_equal(actual, expected), f"item {n} {key} differs"


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hub")


@pytest.fixture(scope="module")
def datasets(hub_root: Path) -> dict[str, LeRobotLayout]:
    common: dict[str, Any] = {"width": W, "height": H, "episodes": LENGTHS}
    v3: dict[str, Any] = {
        **common,
        "episodes_per_video_file": 3,
        "episodes_per_data_file": 2,
        "chunks_size": 2,
    }
    return {
        "v3-av1": make_lerobot_dataset(hub_root, "org/v3-av1", codec="av1", **v3),
        "v3-h264": make_lerobot_dataset(
            hub_root, "org/v3-h264", codec="h264", gop=12, seed=1, **v3
        ),
        "v21": make_lerobot_dataset(
            hub_root, "org/v21", version="v2.1", codec="h264", seed=2, chunks_size=3, **common
        ),
    }


@pytest.fixture(scope="module")
def hub(hub_root: Path, datasets: dict[str, LeRobotLayout]) -> Iterator[HubServer]:
    with HubServer(hub_root) as server:
        yield server


@pytest.fixture
def options(tmp_path: Path) -> StreamOptions:
    return StreamOptions(cache_dir=tmp_path / "cache", prefetch_count=4)


async def collect(s: lerobot.LeRobotStream) -> list[dict[str, Any]]:
    async with s:
        return [item async for item in s]


def remote(
    layout: LeRobotLayout, hub: HubServer, options: StreamOptions, **kwargs: Any
) -> lerobot.LeRobotStream:
    return lerobot.stream(layout.uri, endpoint=hub.endpoint, options=options, **kwargs)


# -- items equal LeRobot's ------------------------------------------------------------------


def test_the_datasets_cover_the_hard_cases(datasets: dict[str, LeRobotLayout]) -> None:
    """Episodes that start mid-file (video and data), and more than one chunk."""
    v3 = datasets["v3-av1"]
    starts = [e.videos[TOP].from_timestamp for e in v3.episodes]
    assert sum(s > 0 for s in starts) >= 2
    assert len({e.data_path for e in v3.episodes}) == 3
    assert any("chunk-001" in e.data_path for e in v3.episodes)
    assert (v3.path / "meta" / "episodes" / "chunk-000" / "file-000.parquet").is_file()
    v21 = datasets["v21"]
    assert v21.info["codebase_version"] == "v2.1"
    assert any("chunk-001" in e.data_path for e in v21.episodes)


@pytest.mark.parametrize("name", ["v3-av1", "v3-h264", "v21"])
@pytest.mark.parametrize("windows", [False, True], ids=["frames", "windows"])
async def test_items_match_lerobot(
    datasets: dict[str, LeRobotLayout],
    hub: HubServer,
    options: StreamOptions,
    name: str,
    windows: bool,
) -> None:
    layout = datasets[name]
    deltas = WINDOWS if windows else None
    got = await collect(remote(layout, hub, options, delta_timestamps=deltas))
    want = reference_items(layout, delta_timestamps=deltas)
    assert len(want) == layout.total_frames
    assert_items_equal(got, want)
    if windows:  # windows were clamped at both ends of episodes
        assert any(item[f"{TOP}_is_pad"][0] for item in got)
        assert any(item["action_is_pad"][-1] for item in got)


async def test_float32_chw(
    datasets: dict[str, LeRobotLayout], hub: HubServer, options: StreamOptions
) -> None:
    layout = datasets["v3-av1"]
    got = await collect(
        remote(layout, hub, options, delta_timestamps=WINDOWS, image_format="float32")
    )
    want = reference_items(layout, delta_timestamps=WINDOWS, image_format="float32")
    assert_items_equal(got, want)
    assert got[0][TOP].shape == (3, 3, H, W)
    assert got[0][WRIST].shape == (3, H, W)
    assert float(got[0][WRIST].min()) >= 0.0
    assert float(got[0][WRIST].max()) <= 1.0


async def test_episodes_subset(
    datasets: dict[str, LeRobotLayout], hub: HubServer, options: StreamOptions
) -> None:
    layout = datasets["v3-h264"]
    got = await collect(remote(layout, hub, options, delta_timestamps=WINDOWS, episodes=[3, 1]))
    want = reference_items(layout, delta_timestamps=WINDOWS, episodes=[1, 3])
    assert_items_equal(got, want)
    assert {int(i["episode_index"]) for i in got} == {1, 3}


async def test_local_folder(datasets: dict[str, LeRobotLayout], options: StreamOptions) -> None:
    layout = datasets["v21"]
    s = lerobot.stream(layout.path, delta_timestamps=WINDOWS, options=options)
    assert_items_equal(await collect(s), reference_items(layout, delta_timestamps=WINDOWS))
    stats = s.statistics()
    assert stats.fetcher["requests"]["local"] > 0
    assert stats.fetcher["requests"]["range"] == 0


SYNC_SCRIPT = """
import pickle, sys
from pathlib import Path
from aiostream_hf import StreamOptions
from aiostream_hf import lerobot

uri, endpoint, cache, out = sys.argv[1:]
options = StreamOptions(cache_dir=Path(cache))
with lerobot.stream(uri, endpoint=endpoint, options=options, episodes=[4]) as s:
    items = list(s)
with lerobot.stream(uri, endpoint=endpoint, options=options) as s:
    for n, _ in enumerate(s):  # leaving the loop early stops the producer
        if n == 3:
            break
Path(out).write_bytes(pickle.dumps(items))
"""


def test_sync_iteration(datasets: dict[str, LeRobotLayout], hub: HubServer, tmp_path: Path) -> None:
    # In a child process: the bridge thread's worker threads stay out of later tests.
    layout = datasets["v3-av1"]
    out = tmp_path / "items.pickle"
    done = subprocess.run(
        [sys.executable, "-c", SYNC_SCRIPT, layout.uri, hub.endpoint, str(tmp_path), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SVT_LOG": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = pickle.loads(out.read_bytes())
    assert_items_equal(got, reference_items(layout, episodes=[4]))


async def test_leaving_early_closes_everything(
    datasets: dict[str, LeRobotLayout], hub: HubServer, options: StreamOptions
) -> None:
    layout = datasets["v3-av1"]
    s = remote(layout, hub, options, delta_timestamps=WINDOWS)
    async with s:
        async for item in s:
            if int(item["index"]) == 2:
                break
    stats = s.statistics()
    assert stats.items == 3
    assert stats.videos_opened >= 1
    assert stats.fetcher["in_flight"] == 0
    meta = s.metadata
    assert meta is not None
    assert meta.version == "v3.0"
    assert [e.videos[TOP].from_timestamp for e in meta.episodes] == [
        e.videos[TOP].from_timestamp for e in layout.episodes
    ]
    with pytest.raises(ClosedResourceError):
        s.__aiter__()


# -- what it reads ----------------------------------------------------------------------------


async def test_reads_each_index_once_and_reuses_decoders(
    datasets: dict[str, LeRobotLayout], hub: HubServer, options: StreamOptions
) -> None:
    layout = datasets["v3-h264"]
    s = remote(layout, hub, options, batch_items=8)
    before = hub.stats()
    items = await collect(s)
    after = hub.stats()
    stats = s.statistics()
    video_files = {span.path for e in layout.episodes for span in e.videos.values()}
    assert stats.items == len(items) == layout.total_frames
    assert stats.videos_opened == len(video_files) == 4
    assert stats.video["index_requests"] <= 2 * len(video_files)
    assert stats.data_files == 3
    # one frame request per video file and batch, at most
    batches = -(-layout.total_frames // 8)
    # Decoders are reused: without reuse, every batch of every camera would start one.
    # (How many are reused depends on how the batches' decodes overlap in time.)
    assert stats.video["decoder_reuses"] > 0
    assert stats.video["decoder_starts"] < batches * len(layout.video_keys)
    assert stats.video["frame_requests"] <= batches * len(layout.video_keys) + len(video_files)
    cdn = after.by_bucket.get("cdn", 0) - before.by_bucket.get("cdn", 0)
    requests = stats.fetcher["requests"]
    assert cdn <= requests["range"] + requests["stream"]  # frames are streamed reads
    assert stats.time_to_first_item is not None


@pytest.mark.parametrize("name", ["v3-av1", "v3-h264", "v21"])
async def test_reading_a_whole_dataset_in_order_fetches_each_byte_once(
    datasets: dict[str, LeRobotLayout], hub: HubServer, options: StreamOptions, name: str
) -> None:
    """Every item, in order: the server serves at most 1.1x the repo's bytes (index reads,
    frames, tables and metadata together), however the videos' sizes fall against the
    first reads."""
    layout = datasets[name]
    repo_bytes = sum(p.stat().st_size for p in layout.path.rglob("*") if p.is_file())
    before = hub.stats().bytes_served
    items = await collect(remote(layout, hub, options))
    served = hub.stats().bytes_served - before
    assert len(items) == layout.total_frames
    videos = sum(p.stat().st_size for p in layout.path.rglob("*.mp4"))
    assert videos > 0.1 * repo_bytes  # so a second fetch of the videos would show
    assert served <= 1.1 * repo_bytes, (served, repo_bytes)


async def test_max_open_videos(
    datasets: dict[str, LeRobotLayout], hub: HubServer, options: StreamOptions
) -> None:
    layout = datasets["v21"]  # 10 video files
    s = remote(layout, hub, options, max_open_videos=1, batch_items=4)
    assert_items_equal(await collect(s), reference_items(layout))
    stats = s.statistics()
    assert stats.videos_evicted >= stats.videos_opened - 2 > 0


# -- order: shuffle and ranks -------------------------------------------------------------------


async def test_shuffle(
    datasets: dict[str, LeRobotLayout], hub: HubServer, options: StreamOptions
) -> None:
    layout = datasets["v3-av1"]
    want = {int(i["index"]): i for i in reference_items(layout, delta_timestamps=WINDOWS)}

    async def order(seed: int, epoch: int = 0) -> list[dict[str, Any]]:
        s = remote(layout, hub, options, delta_timestamps=WINDOWS, shuffle=50, seed=seed)
        s.set_epoch(epoch)
        return await collect(s)

    first = await order(1)
    indices = [int(i["index"]) for i in first]
    assert sorted(indices) == sorted(want)
    assert indices != sorted(indices)
    assert_items_equal(first, [want[i] for i in indices])  # shuffled, still LeRobot's items
    assert [int(i["index"]) for i in await order(1)] == indices
    assert [int(i["index"]) for i in await order(2)] != indices
    assert [int(i["index"]) for i in await order(1, epoch=1)] != indices


@pytest.mark.parametrize("world_size", [2, 7])
async def test_ranks_are_disjoint_and_complete(
    datasets: dict[str, LeRobotLayout], hub: HubServer, options: StreamOptions, world_size: int
) -> None:
    layout = datasets["v3-h264"]
    seen: list[int] = []
    for rank in range(world_size):
        s = remote(layout, hub, options, rank=rank, world_size=world_size, shuffle=10)
        seen += [int(i["index"]) for i in await collect(s)]
    assert sorted(seen) == list(range(layout.total_frames))


# -- resume -----------------------------------------------------------------------------------

RESUME_MODES: dict[str, dict[str, Any]] = {
    "in-order": {},
    "windows": {"delta_timestamps": WINDOWS},
    "shuffled": {"shuffle": 30, "seed": 4},
    "rank-1-of-2": {"rank": 1, "world_size": 2, "shuffle": 10},
    "items-of-7-ranks": {"rank": 3, "world_size": 7},  # fewer episodes than ranks
}


async def take(s: lerobot.LeRobotStream, k: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The first k items, and the state after them (through JSON, as a checkpoint)."""
    items = []
    async with s:
        async for item in s:
            items.append(item)
            if len(items) == k:
                break
        return items, json.loads(json.dumps(s.state_dict()))


def indices(items: Sequence[Mapping[str, Any]]) -> list[int]:
    return [int(item["index"]) for item in items]


@pytest.mark.parametrize("mode", list(RESUME_MODES))
async def test_resume_continues_with_the_next_item(
    datasets: dict[str, LeRobotLayout], hub: HubServer, options: StreamOptions, mode: str
) -> None:
    layout = datasets["v3-h264"]
    kw = {"batch_items": 8, **RESUME_MODES[mode]}
    full = await collect(remote(layout, hub, options, **kw))
    # in the first batch, mid-episode in a batch, at a batch's end, in the last batch
    # (for the shuffled modes: while the buffer drains)
    for k in sorted({1, 11, 16, len(full) - 3}):
        head, state = await take(remote(layout, hub, options, **kw), k)
        assert state["items"] == k
        # small: positions, the buffer's row numbers and its RNG state (625 words)
        limit = 9000 + 20 * kw["shuffle"] if "shuffle" in kw else 1000
        assert len(json.dumps(state)) < limit
        resumed = remote(layout, hub, options, **kw)
        resumed.load_state_dict(state)
        tail = await collect(resumed)
        assert indices(head) + indices(tail) == indices(full), (mode, k)
        assert_items_equal(tail, full[k:])  # frames and windows, pixel for pixel
        finished = remote(layout, hub, options, **kw)
        finished.load_state_dict(resumed.state_dict())
        assert await collect(finished) == []


async def test_resume_fetches_no_frame_of_a_delivered_item(
    datasets: dict[str, LeRobotLayout],
    hub: HubServer,
    options: StreamOptions,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stopped in the middle of episode 3 (frame 25 of 40): the resumed stream decodes the
    frames of the items left and nothing else, and reads fewer bytes than a stream of
    episodes 3 and 4 from their start."""
    # Frames read by range, as from larger files (open reads these small videos whole).
    monkeypatch.setattr(video_module._Reads, "whole", lambda self: None)
    # One batch at a time: the frame bytes compared below are then the same in every run.
    # Batches fetched side by side reach a file's reader in the order they happen to come
    # (a batch after the one the decoder is at starts again from its keyframe), which
    # once made the resumed stream read more than the fresh one under load.
    # Nothing kept: these small files' index reads hold every frame's bytes, which the
    # readers would cut the frames from (``kept_video_bytes``), fresh or resumed.
    options = dataclasses.replace(options, prefetch_count=1, kept_video_bytes=0)
    layout = datasets["v3-h264"]
    cameras = len(layout.video_keys)
    total = layout.total_frames
    k = sum(LENGTHS[:3]) + 25
    full = remote(layout, hub, options, batch_items=8)
    await collect(full)
    assert full.statistics().video["frames_returned"] == total * cameras
    head, state = await take(remote(layout, hub, options, batch_items=8), k)

    resumed = remote(layout, hub, options, batch_items=8)
    resumed.load_state_dict(state)
    served = hub.wait_idle().bytes_served
    tail = await collect(resumed)
    resumed_bytes = hub.wait_idle().bytes_served - served
    assert indices(tail) == list(range(k, total))
    video = resumed.statistics().video
    assert video["frames_returned"] == (total - k) * cameras  # none of a delivered item

    fresh = remote(layout, hub, options, batch_items=8, episodes=[3, 4])
    served = hub.wait_idle().bytes_served
    assert indices(await collect(fresh)) == list(range(sum(LENGTHS[:3]), total))
    fresh_bytes = hub.wait_idle().bytes_served - served
    assert video["frame_bytes"] < fresh.statistics().video["frame_bytes"]
    assert resumed_bytes < fresh_bytes


RESUME_SYNC_SCRIPT = """
import json, sys
from pathlib import Path
from aiostream_hf import StreamOptions
from aiostream_hf import lerobot

uri, endpoint, cache, out = sys.argv[1:]
options = StreamOptions(cache_dir=Path(cache))
head = []
with lerobot.stream(uri, endpoint=endpoint, options=options, shuffle=20, batch_items=4) as s:
    for item in s:
        head.append(int(item["index"]))
        if len(head) == 37:
            break
    state = json.dumps(s.state_dict())
with lerobot.stream(uri, endpoint=endpoint, options=options, shuffle=20, batch_items=4) as s:
    s.load_state_dict(json.loads(state))
    tail = [int(item["index"]) for item in s]
with lerobot.stream(uri, endpoint=endpoint, options=options, shuffle=20, batch_items=4) as s:
    full = [int(item["index"]) for item in s]
Path(out).write_text(json.dumps([head, tail, full]))
"""


def test_sync_iteration_resumes(
    datasets: dict[str, LeRobotLayout], hub: HubServer, tmp_path: Path
) -> None:
    layout = datasets["v21"]
    out = tmp_path / "indices.json"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            RESUME_SYNC_SCRIPT,
            layout.uri,
            hub.endpoint,
            str(tmp_path),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    head, tail, full = json.loads(out.read_text())
    assert len(head) == 37
    assert head + tail == full
    assert sorted(full) == list(range(layout.total_frames))


async def test_a_state_from_another_dataset_or_arguments_is_refused(
    datasets: dict[str, LeRobotLayout], hub: HubServer, options: StreamOptions
) -> None:
    _, state = await take(remote(datasets["v3-av1"], hub, options, seed=1), 5)
    assert state["dataset"]["frames"] == sum(LENGTHS)
    # same episode lengths and file names, another repo (commit)
    other = remote(datasets["v3-h264"], hub, options, seed=1)
    other.load_state_dict(state)
    with pytest.raises(SourceError, match="another dataset or selection"):
        await collect(other)
    subset = remote(datasets["v3-av1"], hub, options, seed=1, episodes=[0, 1, 2])
    subset.load_state_dict(state)
    with pytest.raises(SourceError, match=r"\(5 episodes, 145 frames\).*\(3 episodes"):
        await collect(subset)
    # with the metadata loaded, the check is made at once
    loaded = remote(datasets["v3-h264"], hub, options, seed=1)
    await loaded.load_metadata()
    with pytest.raises(SourceError, match="another dataset"):
        loaded.load_state_dict(state)
    with pytest.raises(SourceError, match="seed=1"):
        remote(datasets["v3-av1"], hub, options, seed=2).load_state_dict(state)
    with pytest.raises(SourceError, match="shuffle=0"):
        remote(datasets["v3-av1"], hub, options, seed=1, shuffle=5).load_state_dict(state)
    with pytest.raises(SourceError, match="version"):
        remote(datasets["v3-av1"], hub, options).load_state_dict({**state, "version": 99})
    with pytest.raises(SourceError, match="not a LeRobot stream's"):
        remote(datasets["v3-av1"], hub, options).load_state_dict({**state, "kind": None})


async def test_stream_from_loaded_metadata_makes_no_api_request(
    datasets: dict[str, LeRobotLayout], hub: HubServer, options: StreamOptions
) -> None:
    layout = datasets["v3-av1"]
    meta = await remote(layout, hub, options).load_metadata()
    assert meta.endpoint == hub.endpoint
    before = hub.stats().by_bucket.get("api", 0)
    got = await collect(lerobot.stream(meta, options=options, episodes=[1]))
    assert hub.stats().by_bucket.get("api", 0) == before
    assert_items_equal(got, reference_items(layout, episodes=[1]))


# -- errors -----------------------------------------------------------------------------------


def copy_repo(layout: LeRobotLayout, hub_root: Path, name: str) -> Path:
    target = hub_root / "datasets" / "org" / name
    for path in layout.path.rglob("*"):
        if path.is_file():
            dest = target / path.relative_to(layout.path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(path.read_bytes())
    return target


def shift_from_timestamp(repo: Path, episode: int, key: str, by: float) -> None:
    path = repo / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    column = f"videos/{key}/from_timestamp"
    values = table.column(column).to_pylist()
    values[episode] += by
    index = table.column_names.index(column)
    pq.write_table(table.set_column(index, column, pa.array(values, pa.float64())), path)


async def test_missing_info_json(
    datasets: dict[str, LeRobotLayout], hub_root: Path, hub: HubServer, options: StreamOptions
) -> None:
    repo = copy_repo(datasets["v3-av1"], hub_root, "no-info")
    (repo / "meta" / "info.json").unlink()
    s = lerobot.stream("hf://datasets/org/no-info", endpoint=hub.endpoint, options=options)
    with pytest.raises(EntryNotFoundError, match=r"org/no-info has no meta/info\.json"):
        await collect(s)


async def test_unsupported_codebase_version(
    datasets: dict[str, LeRobotLayout], hub_root: Path, hub: HubServer, options: StreamOptions
) -> None:
    repo = copy_repo(datasets["v3-av1"], hub_root, "old-version")
    info = json.loads((repo / "meta" / "info.json").read_text())
    info["codebase_version"] = "v1.6"
    (repo / "meta" / "info.json").write_text(json.dumps(info))
    s = lerobot.stream("hf://datasets/org/old-version", endpoint=hub.endpoint, options=options)
    with pytest.raises(SourceError, match=r"unsupported LeRobot codebase_version 'v1\.6'"):
        await collect(s)


async def test_timestamp_outside_the_video(
    datasets: dict[str, LeRobotLayout], hub_root: Path, hub: HubServer, options: StreamOptions
) -> None:
    repo = copy_repo(datasets["v3-av1"], hub_root, "past-the-end")
    shift_from_timestamp(repo, 4, TOP, 5.0)
    s = lerobot.stream(
        "hf://datasets/org/past-the-end", endpoint=hub.endpoint, options=options, episodes=[4]
    )
    with pytest.raises(FrameTimestampError) as caught:
        await collect(s)
    message = str(caught.value)
    assert "observation.images.top of episode 4" in message
    assert "videos/observation.images.top/chunk-000/file-001.mp4" in message
    assert "6.3333" in message
    assert "outside the video" in message


async def test_timestamp_between_frames(
    datasets: dict[str, LeRobotLayout], hub_root: Path, hub: HubServer, options: StreamOptions
) -> None:
    repo = copy_repo(datasets["v3-av1"], hub_root, "half-frame")
    shift_from_timestamp(repo, 1, WRIST, 0.5 / 30)
    s = lerobot.stream(
        "hf://datasets/org/half-frame", endpoint=hub.endpoint, options=options, episodes=[1]
    )
    with pytest.raises(FrameTimestampError, match=r"wrist of episode 1 .*no frame within"):
        await collect(s)
    # a looser tolerance accepts the nearest frame, as LeRobot does
    loose = lerobot.stream(
        "hf://datasets/org/half-frame",
        endpoint=hub.endpoint,
        options=options,
        episodes=[1],
        tolerance_s=0.6 / 30,
    )
    assert len(await collect(loose)) == LENGTHS[1]


async def test_data_rows_that_disagree_with_the_metadata(
    datasets: dict[str, LeRobotLayout], hub_root: Path, hub: HubServer, options: StreamOptions
) -> None:
    repo = copy_repo(datasets["v3-av1"], hub_root, "bad-rows")
    path = repo / "data" / "chunk-000" / "file-000.parquet"
    pq.write_table(pq.read_table(path).slice(0, 30), path)  # episode 1 loses rows
    s = lerobot.stream("hf://datasets/org/bad-rows", endpoint=hub.endpoint, options=options)
    with pytest.raises(DecodeError, match=r"episode 1 has 10 rows with index 20-29 in data/"):
        await collect(s)


def local_copy(layout: LeRobotLayout, tmp_path: Path, **info_changes: Any) -> Path:
    """A copy of ``layout`` in ``tmp_path`` with ``info_changes`` made to its info.json."""
    folder = tmp_path / "dataset"
    shutil.copytree(layout.path, folder)
    info = json.loads((folder / "meta" / "info.json").read_text())
    info.update(info_changes)
    (folder / "meta" / "info.json").write_text(json.dumps(info))  # NaN, Infinity as Python's
    return folder


@pytest.mark.parametrize(
    "fps",
    [float("nan"), float("inf"), 1e300, 10**400, 1e6 + 1, 1e-320],
    ids=["nan", "inf", "1e300", "10**400", "1e6+1", "1e-320"],
)
async def test_fps_that_is_not_a_frame_rate(
    datasets: dict[str, LeRobotLayout], tmp_path: Path, options: StreamOptions, fps: float
) -> None:
    folder = local_copy(datasets["v3-av1"], tmp_path, fps=fps)
    s = lerobot.stream(folder, delta_timestamps={"action": [0.0, 1 / 30]}, options=options)
    with pytest.raises(DecodeError, match=r"meta/info\.json: fps=.* is not a frame rate") as caught:
        await collect(s)
    assert repr(fps)[:20] in str(caught.value)


@pytest.mark.parametrize("key", ["data_path", "video_path"])
async def test_a_missing_path_template_is_a_decode_error(
    datasets: dict[str, LeRobotLayout], tmp_path: Path, options: StreamOptions, key: str
) -> None:
    folder = local_copy(datasets["v3-av1"], tmp_path, **{key: None})
    s = lerobot.stream(folder, options=options)
    with pytest.raises(DecodeError, match=rf"info\.json .*{key}"):
        await collect(s)


async def test_a_number_too_long_for_python_is_a_decode_error(
    datasets: dict[str, LeRobotLayout], tmp_path: Path, options: StreamOptions
) -> None:
    """A 5000-digit integer in info.json: json.loads raises a plain ValueError (over
    Python's 4300-digit limit), which is the file's fault: DecodeError."""
    folder = local_copy(datasets["v3-av1"], tmp_path)
    info = folder / "meta" / "info.json"
    info.write_text(info.read_text()[:-1] + ', "huge": ' + "9" * 5000 + "}")
    s = lerobot.stream(folder, options=options)
    with pytest.raises(DecodeError, match=r"info\.json is not JSON"):
        await collect(s)


@pytest.mark.parametrize(
    ("key", "template"),
    [
        ("video_path", "videos/{video_key.nope}/x.mp4"),
        ("video_path", "videos/{video_key[0]}/x.mp4"),
        ("video_path", "videos/{video_key!r}/x.mp4"),
        ("video_path", "videos/{video_key:>9}/{chunk_index}/{file_index}.mp4"),
        ("data_path", "data/{chunk_index:>1500000000}.parquet"),
        ("data_path", "data/{chunk_index:021d}/{file_index}.parquet"),
        ("data_path", "data/{chunk_index:{file_index}}.parquet"),
        ("data_path", "data/{episode_index}.parquet"),
        ("data_path", "data/{0}.parquet"),
        ("data_path", "data/{chunk_index.real}.parquet"),
        ("data_path", "data/{chunk_index"),
    ],
)
async def test_path_template_with_more_than_plain_fields(
    datasets: dict[str, LeRobotLayout],
    tmp_path: Path,
    options: StreamOptions,
    key: str,
    template: str,
) -> None:
    folder = local_copy(datasets["v3-av1"], tmp_path, **{key: template})
    s = lerobot.stream(folder, options=options)
    with pytest.raises(DecodeError) as caught:
        await collect(s)
    message = str(caught.value)
    assert f"meta/info.json: {key} {template!r}" in message
    assert "a template may only hold the fields {" in message
    assert f"fix {key} in meta/info.json" in message


@pytest.mark.parametrize(
    "template",
    [
        "../data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "data/../../chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "/data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "data//chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "./data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "data\\chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet\0",
    ],
)
async def test_path_outside_a_local_dataset(
    datasets: dict[str, LeRobotLayout], tmp_path: Path, options: StreamOptions, template: str
) -> None:
    folder = local_copy(datasets["v3-av1"], tmp_path, data_path=template)
    s = lerobot.stream(folder, options=options)
    with pytest.raises(DecodeError, match=r"is not a clean path inside the dataset") as caught:
        await collect(s)
    path = template.format(chunk_index=0, file_index=0)
    assert f"data_path {template!r} gives the path {path!r}" in str(caught.value)


async def test_video_path_into_another_repo_is_refused(
    datasets: dict[str, LeRobotLayout], hub_root: Path, hub: HubServer, options: StreamOptions
) -> None:
    """A video_path climbing out of org/escape to org/v3-av1 (same endpoint and token)
    would read the frames of the other repo; org/escape has no videos of its own."""
    repo = copy_repo(datasets["v3-av1"], hub_root, "escape")
    shutil.rmtree(repo / "videos")
    info = json.loads((repo / "meta" / "info.json").read_text())
    info["video_path"] = "../../../v3-av1/resolve/main/" + info["video_path"]
    (repo / "meta" / "info.json").write_text(json.dumps(info))
    s = lerobot.stream("hf://datasets/org/escape", endpoint=hub.endpoint, options=options)
    with pytest.raises(DecodeError, match=r"is not a clean path inside the dataset") as caught:
        await s.load_metadata()  # refused with the metadata: no frame is requested
    await s.aclose()
    path = f"../../../v3-av1/resolve/main/videos/{TOP}/chunk-000/file-000.mp4"
    assert f"gives the path {path!r}" in str(caught.value)
    assert "org/escape meta/info.json: video_path" in str(caught.value)


async def test_episode_rows_that_disagree_with_their_length(
    datasets: dict[str, LeRobotLayout], tmp_path: Path, options: StreamOptions
) -> None:
    """dataset_to_index is checked against the length before anything is sized by it."""
    folder = local_copy(datasets["v3-av1"], tmp_path)
    path = folder / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    column = table.column_names.index("dataset_to_index")
    ends = table.column("dataset_to_index").to_pylist()
    ends[1] += 2**40
    pq.write_table(table.set_column(column, "dataset_to_index", pa.array(ends, pa.int64())), path)
    s = lerobot.stream(folder, options=options)
    with pytest.raises(DecodeError) as caught:
        await s.load_metadata()
    await s.aclose()
    message = str(caught.value)
    assert "(episode 1): dataset_from_index=20 and dataset_to_index=" in message
    assert f"do not hold length={LENGTHS[1]} rows" in message


async def test_bad_selection(
    datasets: dict[str, LeRobotLayout], hub: HubServer, options: StreamOptions
) -> None:
    layout = datasets["v3-av1"]
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"split": "test"}, SplitNotFoundError, r"no split 'test' in .*: splits are train"),
        ({"episodes": [2, 9]}, SourceError, r"episodes \[9\] are not episodes"),
        ({"delta_timestamps": {"nope": [0.0]}}, SourceError, r"keys \['nope'\] are not features"),
        ({"delta_timestamps": {"action": [0.01]}}, SourceError, r"not multiples of 1/30"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            await collect(remote(layout, hub, options, **kwargs))


def test_bad_arguments(datasets: dict[str, LeRobotLayout], tmp_path: Path) -> None:
    folder = datasets["v21"].path
    for kwargs, match in [
        ({"image_format": "float16"}, "image_format"),
        ({"tolerance_s": -1}, "tolerance_s"),
        ({"shuffle": 0}, "shuffle"),
        ({"episodes": []}, "episodes"),
        ({"episodes": "12"}, "episodes"),
        ({"delta_timestamps": {"action": []}}, "delta_timestamps"),
        ({"delta_timestamps": {"action": [float("nan")]}}, "finite"),
        ({"batch_items": 0}, "batch_items"),
        ({"rank": 1}, "rank"),
    ]:
        with pytest.raises(SourceError, match=match):
            lerobot.stream(folder, **kwargs)
    with pytest.raises(SourceError, match="hf://datasets/org/name"):
        lerobot.stream("org/name")
    with pytest.raises(SourceError, match="no LeRobot dataset folder"):
        lerobot.stream(tmp_path / "missing")
    with pytest.raises(SourceError, match="not one LeRobot dataset"):
        lerobot.stream("hf://datasets/org/name/data/*.parquet")
    with pytest.raises(SourceError, match="give hf://datasets"):
        lerobot.stream("https://example.com/dataset")


async def test_closed_stream(datasets: dict[str, LeRobotLayout], options: StreamOptions) -> None:
    s = lerobot.stream(datasets["v21"].path, options=options)
    meta = await s.load_metadata()
    assert meta.version == "v2.1"
    assert meta.video_keys == (TOP, WRIST)
    assert meta.total_frames == sum(LENGTHS)
    assert s.metadata is meta
    await s.aclose()
    with pytest.raises(ClosedResourceError):
        s.__aiter__()


def test_maker_is_deterministic(tmp_path: Path) -> None:
    a = make_lerobot_dataset(tmp_path / "a", "org/x", episodes=2, width=W, height=H, seed=5)
    b = make_lerobot_dataset(tmp_path / "b", "org/x", episodes=2, width=W, height=H, seed=5)
    for path in a.path.rglob("*"):
        if path.suffix in (".parquet", ".json", ".jsonl"):
            assert path.read_bytes() == (b.path / path.relative_to(a.path)).read_bytes()
    assert a.episodes == b.episodes
    assert len(a.episodes) == 2


@pytest.mark.parametrize("shuffled", [False, True], ids=["in-order", "shuffled"])
async def test_batches_reach_a_reader_in_the_order_they_began(
    datasets: dict[str, LeRobotLayout],
    hub: HubServer,
    options: StreamOptions,
    monkeypatch: pytest.MonkeyPatch,
    shuffled: bool,
) -> None:
    """Batches fetched side by side call each file's reader in the order they began, on
    every backend: the frames fetched and decoded are those of one batch at a time (a
    batch out of turn finds the decoder past its frames and fetches their GOP again)."""
    monkeypatch.setattr(video_module._Reads, "whole", lambda self: None)  # frames by range
    layout = datasets["v3-h264"]
    kw: dict[str, Any] = {"batch_items": 4, "shuffle": 16 if shuffled else None, "seed": 3}

    async def run(prefetch_count: int) -> tuple[list[int], dict[str, Any]]:
        s = remote(layout, hub, dataclasses.replace(options, prefetch_count=prefetch_count), **kw)
        got = indices(await collect(s))
        return got, s.statistics().video

    one_at_a_time, alone = await run(1)
    side_by_side, together = await run(8)
    assert side_by_side == one_at_a_time
    for name in ("frame_bytes", "frame_requests", "decoder_starts", "packets_decoded"):
        assert together[name] == alone[name], name


async def test_turns_pass_in_ticket_order_and_a_ticket_given_up_passes_its_turn() -> None:
    pool = lerobot._ReaderPool(source=None, limit=1)  # type: ignore[arg-type]  # no reads
    file = FileRef("https://example.invalid/v.mp4", "v.mp4")
    first, second, third = (pool.take_turn(file) for _ in range(3))
    order: list[str] = []

    async def wait(ticket: Any, name: str) -> None:
        await ticket.wait()
        order.append(name)
        pool.done(file, ticket)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, third, "third")
        tg.start_soon(wait, second, "second")
        await anyio.wait_all_tasks_blocked()
        assert order == []  # both wait for the first
        pool.done(file, first)
        pool.done(file, first)  # a second done is a no-op: the second still goes first
    assert order == ["second", "third"]
    assert pool._turns == {}  # every ticket done: the file is forgotten

    given_up, waiting = pool.take_turn(file), pool.take_turn(file)
    with anyio.fail_after(5):
        pool.done(file, given_up)  # its batch failed before using it
        await waiting.wait()
    pool.done(file, waiting)
    assert pool._turns == {}


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        ("info", "chunks_size", "abc"),
        ("info", "chunks_size", float("nan")),
        ("info", "chunks_size", float("inf")),
        ("episodes", "length", "abc"),
        ("episodes", "length", float("nan")),
        ("episodes", "episode_index", float("inf")),
    ],
)
async def test_a_count_that_is_not_a_whole_number_is_a_decode_error(
    datasets: dict[str, LeRobotLayout],
    tmp_path: Path,
    options: StreamOptions,
    where: str,
    key: str,
    value: Any,
) -> None:
    """v2.1's counts come from JSON: "abc", NaN or 1e400 were given to int() and raised
    a bare ValueError or OverflowError."""
    if where == "info":
        folder = local_copy(datasets["v21"], tmp_path, **{key: value})
    else:
        folder = local_copy(datasets["v21"], tmp_path)
        episodes = folder / "meta" / "episodes.jsonl"
        rows = [json.loads(line) for line in episodes.read_text().splitlines() if line.strip()]
        rows[1][key] = value
        episodes.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = lerobot.stream(folder, options=options)
    with pytest.raises(DecodeError, match=rf"{key}=.* is not a whole number"):
        await collect(s)


async def test_a_template_too_long_to_fill_is_refused_before_filling(
    datasets: dict[str, LeRobotLayout], tmp_path: Path, options: StreamOptions
) -> None:
    """100,000 fields in video_path (1.1 MB of info.json) filled 3 GB paths; now refused."""
    template = "videos/" + "{video_key}" * 100_000 + ".mp4"
    folder = local_copy(datasets["v3-av1"], tmp_path, video_path=template)
    s = lerobot.stream(folder, options=options)
    with pytest.raises(DecodeError, match=r"video_path is 1,100,011 characters with 100,000"):
        await collect(s)


async def test_a_table_that_decodes_past_its_bound_is_refused_before_decoding(
    datasets: dict[str, LeRobotLayout],
    options: StreamOptions,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LeRobot's tables are read whole: one whose row groups' floor (rows x flat fixed
    widths) passes max(_MAX_TABLE_BYTES, _MAX_TABLE_EXPANSION x its file) is refused
    before it is decoded (a few-byte RLE run of 2**30 rows took gigabytes). Here the
    bound is lowered under the test data's own tables."""
    monkeypatch.setattr(_lerobot_meta, "_MAX_TABLE_BYTES", 64)
    monkeypatch.setattr(_lerobot_meta, "_MAX_TABLE_EXPANSION", 0)
    s = lerobot.stream(datasets["v3-av1"].path, options=options)
    with pytest.raises(DecodeError, match=r"decodes to at least [\d,]+ bytes .* over 64 for a"):
        await collect(s)


async def test_a_table_whose_list_pages_announce_past_its_bound_is_refused_before_decoding(
    datasets: dict[str, LeRobotLayout],
    options: StreamOptions,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LeRobot's tables go through the stream's Parquet checks: besides the row groups'
    flat floor, the values their list columns' pages announce (one row may hold any
    number of them: a 148-byte file of 2**28 int32s took 2.9 GB). Here the bound is set
    over every table's flat floor and under a data file's floor with its lists
    (observation.state and action are lists of 6 floats)."""
    from aiostream_hf.formats.parquet import least_list_bytes, parse_footer, plan_row_groups

    flat, lists = {}, {}
    for path in sorted(datasets["v3-av1"].path.rglob("*.parquet")):
        data = path.read_bytes()
        footer = parse_footer(data, len(data), path.name)
        columns = [c for c in footer.schema.names if not c.startswith("stats/")]
        plans = plan_row_groups(footer, columns)
        flat[path] = sum(p.least_decoded for p in plans)
        lists[path] = sum(least_list_bytes(footer, p, {(0, len(data)): data}) for p in plans)
    bound = max(flat.values())
    assert any(flat[p] + lists[p] > bound for p in flat if "data" in p.parts)
    monkeypatch.setattr(_lerobot_meta, "_MAX_TABLE_BYTES", bound)
    monkeypatch.setattr(_lerobot_meta, "_MAX_TABLE_EXPANSION", 0)
    s = lerobot.stream(datasets["v3-av1"].path, options=options)
    with pytest.raises(
        DecodeError,
        match=rf"data/chunk-\d+/file-\d+\.parquet decodes to at least [\d,]+ bytes \([\d,]+ bytes "
        rf"of them the values its list columns' pages announce\), over {bound:,} for a file",
    ):
        await collect(s)
