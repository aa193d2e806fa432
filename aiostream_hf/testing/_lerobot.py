"""Synthetic LeRobot datasets (v3.0 and v2.1) and plain test videos.

    layout = make_lerobot_dataset(root, "org/robot", episodes=(30, 45, 38), width=64, height=48)
    with HubServer(root) as hub:
        ...  # hf://datasets/org/robot is a LeRobot v3.0 dataset

The files follow what LeRobot writes (``lerobot.datasets``: ``utils.py``,
``lerobot_dataset.py``, ``v30/convert_dataset_v21_to_v30.py``):

v3.0 (``codebase_version: "v3.0"``)::

    meta/info.json                           fps, features, data_path / video_path templates
    meta/stats.json
    meta/tasks.parquet                       index "task" (the text), column task_index
    meta/episodes/chunk-000/file-000.parquet one row per episode: episode_index, tasks, length,
                                             data/chunk_index, data/file_index,
                                             dataset_from_index, dataset_to_index,
                                             videos/{key}/chunk_index, .../file_index,
                                             .../from_timestamp, .../to_timestamp,
                                             meta/episodes/chunk_index, .../file_index, stats/...
    data/chunk-000/file-000.parquet          the frames of several episodes
    videos/{key}/chunk-000/file-000.mp4      several episodes, one after the other

``from_timestamp`` is the sum of the durations of the episodes before it in the
same video file, and ``to_timestamp`` adds the episode's own (``length / fps``),
exactly as LeRobot accumulates them when it concatenates episode videos.
File indices roll over to the next chunk after ``chunks_size`` files.

v2.1 (``codebase_version: "v2.1"``): ``meta/episodes.jsonl``, ``meta/tasks.jsonl``,
``meta/episodes_stats.jsonl``, ``data/chunk-000/episode_000000.parquet`` and
``videos/chunk-000/{key}/episode_000000.mp4``: one episode per file.

Videos are AV1 (libsvtav1, ``g=2``, ``crf=30``: LeRobot's defaults) or H.264
(libx264), 480x640 at 30 fps unless told otherwise. Every frame differs (moving
gradients and the frame number as a binary stripe), and the tables are drawn from
``numpy.random.default_rng(seed)``: the same arguments give the same Parquet and
JSON bytes and the same pictures (the encoders' bytes may differ between builds).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Literal, TypeAlias

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from ._datasets import _check_int, _check_repo_id, make_repo

__all__ = [
    "LeRobotEpisode",
    "LeRobotLayout",
    "LeRobotVideoSpan",
    "lerobot_frame",
    "make_lerobot_dataset",
    "make_video",
]

StrPath: TypeAlias = "str | os.PathLike[str]"
Codec: TypeAlias = Literal["av1", "h264"]

V30_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V30_EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"

DEFAULT_CAMERAS = ("observation.images.top", "observation.images.wrist")
DEFAULT_TASKS = ("Pick up the red cube.", "Put the cube in the bin.", "Open the drawer.")

#: codec -> (encoder, its options). LeRobot encodes with g=2 and crf=30 whatever the codec.
_ENCODERS: dict[str, str] = {"av1": "libsvtav1", "h264": "libx264"}
_CODEC_NAMES: dict[str, str] = {"av1": "av1", "h264": "h264"}


@dataclasses.dataclass(frozen=True)
class LeRobotVideoSpan:
    """Where one episode of one camera lies: its file and its time span in that file."""

    path: str
    from_timestamp: float
    to_timestamp: float
    first_frame: int  # the episode's first frame, counted from the file's first frame


@dataclasses.dataclass(frozen=True)
class LeRobotEpisode:
    """One episode as written: its rows ``[dataset_from_index, dataset_to_index)``."""

    index: int
    length: int
    task: str
    task_index: int
    dataset_from_index: int
    dataset_to_index: int
    data_path: str
    videos: Mapping[str, LeRobotVideoSpan]


@dataclasses.dataclass(frozen=True)
class LeRobotLayout:
    """What ``make_lerobot_dataset`` wrote."""

    path: pathlib.Path  # the repo folder (the dataset root)
    repo_id: str
    version: str
    fps: int
    width: int
    height: int
    codec: str
    video_keys: tuple[str, ...]
    tasks: tuple[str, ...]
    episodes: tuple[LeRobotEpisode, ...]
    info: Mapping[str, Any]

    @property
    def total_frames(self) -> int:
        return sum(e.length for e in self.episodes)

    @property
    def uri(self) -> str:
        return f"hf://datasets/{self.repo_id}"


# -- pictures and videos ----------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _grid(width: int, height: int) -> tuple[NDArray[np.int32], NDArray[np.int32]]:
    y, x = np.mgrid[0:height, 0:width].astype(np.int32)
    return x, y


def lerobot_frame(
    i: int, width: int, height: int, *, seed: int = 0, camera: int = 0
) -> NDArray[np.uint8]:
    """Frame ``i`` of a synthetic camera: moving gradients and ``i`` as a binary stripe."""
    x, y = _grid(width, height)
    base = (seed * 37 + camera * 91) % 256
    image = np.empty((height, width, 3), dtype=np.uint8)
    image[..., 0] = (x * 2 + i * 3 + base) & 255
    image[..., 1] = (y * 3 + i * 5 + camera * 64) & 255
    image[..., 2] = ((x + y) + i * 7 + base * 3) & 255
    block = max(2, min(width // 20, height // 8))
    for bit in range(16):
        if bit * block + block > width:
            break
        image[0:block, bit * block : bit * block + block] = 255 if (i >> bit) & 1 else 0
    return image


def _encoder_options(
    codec: Codec, gop: int, crf: int, extra: Mapping[str, str] | None
) -> dict[str, str]:
    options = {"g": str(gop), "crf": str(crf)}
    if codec == "av1":
        options["preset"] = "12"
    else:
        options["preset"] = "veryfast"  # B-frames, unlike ultrafast
    options.update(extra or {})
    return options


def make_video(
    path: StrPath,
    *,
    frames: int,
    fps: int = 30,
    width: int = 640,
    height: int = 480,
    encoder: str = "libx264",
    options: Mapping[str, str] | None = None,
    container_options: Mapping[str, str] | None = None,
    seed: int = 0,
    camera: int = 0,
    first_frame: int = 0,
) -> pathlib.Path:
    """Encode ``frames`` synthetic frames (``lerobot_frame(first_frame + n)``) to ``path``.

    Frame ``n`` has pts ``n / fps`` s. ``options`` go to the encoder (``{"g": "250",
    "preset": "ultrafast"}``), ``container_options`` to the muxer (``{"movflags":
    "faststart"}``).
    """
    _check_int("frames", frames, 1)
    _check_int("fps", fps, 1)
    _check_int("width", width, 2)
    _check_int("height", height, 2)
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    time_base = Fraction(1, fps)
    with av.open(str(target), "w", options=dict(container_options or {})) as container:
        stream = container.add_stream(encoder, rate=fps, options=dict(options or {}))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for n in range(frames):
            image = lerobot_frame(first_frame + n, width, height, seed=seed, camera=camera)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = n, time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return target


# -- the dataset ------------------------------------------------------------------------


def _next_file(chunk: int, file: int, chunks_size: int) -> tuple[int, int]:
    """``lerobot.datasets.utils.update_chunk_file_indices``."""
    return (chunk + 1, 0) if file == chunks_size - 1 else (chunk, file + 1)


def _groups(count: int, per_file: int | None) -> list[list[int]]:
    size = count if per_file is None else per_file
    return [list(range(start, min(count, start + size))) for start in range(0, count, size)]


def _vector_feature(names: Sequence[str], fps: int | None) -> dict[str, Any]:
    feature: dict[str, Any] = {"dtype": "float32", "shape": [len(names)], "names": list(names)}
    if fps is not None:
        feature["fps"] = fps
    return feature


def _scalar_feature(dtype: str, fps: int | None) -> dict[str, Any]:
    feature: dict[str, Any] = {"dtype": dtype, "shape": [1], "names": None}
    if fps is not None:
        feature["fps"] = fps
    return feature


def _features(
    cameras: Sequence[str],
    state_dim: int,
    action_dim: int,
    width: int,
    height: int,
    fps: int,
    codec: str,
    version: str,
) -> dict[str, Any]:
    per = fps if version == "v3.0" else None
    features: dict[str, Any] = {
        "observation.state": _vector_feature([f"joint_{j}" for j in range(state_dim)], per),
        "action": _vector_feature([f"motor_{j}" for j in range(action_dim)], per),
    }
    for key in cameras:
        features[key] = {
            "dtype": "video",
            "shape": [height, width, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": height,
                "video.width": width,
                "video.codec": _CODEC_NAMES[codec],
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": fps,
                "video.channels": 3,
                "has_audio": False,
            },
        }
    features["timestamp"] = _scalar_feature("float32", per)
    for name in ("frame_index", "episode_index", "index", "task_index"):
        features[name] = _scalar_feature("int64", per)
    return features


def _vectors(values: NDArray[np.float32]) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(
        pa.array(values.reshape(-1), type=pa.float32()), values.shape[1]
    )


def _episode_table(
    rng: np.random.Generator,
    episode: int,
    length: int,
    start: int,
    task_index: int,
    fps: int,
    state_dim: int,
    action_dim: int,
) -> pa.Table:
    state = np.cumsum(rng.normal(0.0, 0.05, size=(length, state_dim)), axis=0).astype(np.float32)
    action = (state + rng.normal(0.0, 0.01, size=(length, state_dim)))[:, :action_dim]
    if action_dim > state_dim:
        action = np.concatenate(
            [action, rng.normal(0.0, 1.0, size=(length, action_dim - state_dim))], axis=1
        )
    frame_index = np.arange(length, dtype=np.int64)
    return pa.table(
        {
            "observation.state": _vectors(state),
            "action": _vectors(action.astype(np.float32)),
            "timestamp": pa.array((frame_index / fps).astype(np.float32)),
            "frame_index": pa.array(frame_index),
            "episode_index": pa.array(np.full(length, episode, dtype=np.int64)),
            "index": pa.array(np.arange(start, start + length, dtype=np.int64)),
            "task_index": pa.array(np.full(length, task_index, dtype=np.int64)),
        }
    )


def _stats(values: NDArray[Any]) -> dict[str, list[float]]:
    return {
        "min": values.min(axis=0).tolist(),
        "max": values.max(axis=0).tolist(),
        "mean": values.mean(axis=0).tolist(),
        "std": values.std(axis=0).tolist(),
        "count": [len(values)],
    }


def _vector_column(table: pa.Table, name: str) -> NDArray[np.float32]:
    column = table.column(name).combine_chunks()
    width = column.type.list_size
    return np.asarray(column.values.to_numpy(), dtype=np.float32).reshape(-1, width)


def _write_json(path: pathlib.Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=4, ensure_ascii=False), encoding="utf-8")


def _write_jsonl(path: pathlib.Path, rows: Sequence[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")


def _write_table(table: pa.Table, path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="snappy")


def _tasks_table(tasks: Sequence[str]) -> pa.Table:
    """``pd.DataFrame({"task_index": ...}, index=pd.Index(tasks, name="task")).to_parquet()``."""
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": "task",
                "field_name": "task",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    schema = pa.schema(
        [pa.field("task_index", pa.int64()), pa.field("task", pa.string())],
        metadata={b"pandas": json.dumps(pandas_meta).encode()},
    )
    return pa.table({"task_index": list(range(len(tasks))), "task": list(tasks)}, schema=schema)


def make_lerobot_dataset(
    root: StrPath,
    repo_id: str = "org/lerobot",
    *,
    version: Literal["v3.0", "v2.1"] = "v3.0",
    episodes: int | Sequence[int] = 4,
    fps: int = 30,
    width: int = 640,
    height: int = 480,
    cameras: Sequence[str] = DEFAULT_CAMERAS,
    codec: Codec = "av1",
    gop: int = 2,
    crf: int = 30,
    encoder_options: Mapping[str, str] | None = None,
    faststart: bool = False,
    state_dim: int = 6,
    action_dim: int = 6,
    tasks: Sequence[str] = DEFAULT_TASKS,
    episodes_per_video_file: int | None = None,
    episodes_per_data_file: int | None = None,
    chunks_size: int = 1000,
    seed: int = 0,
) -> LeRobotLayout:
    """Write a LeRobot dataset to ``root/datasets/ORG/NAME/``; describe what was written.

    ``episodes`` is a count (lengths drawn from 30-90 frames) or the length of each
    episode. In v3.0, every video file holds ``episodes_per_video_file`` episodes
    and every data file ``episodes_per_data_file`` (all of them by default: one file
    each), so later episodes start in the middle of a file. ``codec`` is ``"av1"``
    (libsvtav1) or ``"h264"`` (libx264); ``gop`` and ``crf`` set the encoder's
    keyframe interval and quality, ``encoder_options`` anything else.
    """
    if version not in ("v3.0", "v2.1"):
        raise ValueError(f"version must be 'v3.0' or 'v2.1', got {version!r}")
    if codec not in _ENCODERS:
        raise ValueError(f"codec must be one of {sorted(_ENCODERS)}, got {codec!r}")
    _check_repo_id(repo_id)
    for name, value, minimum in (
        ("fps", fps, 1),
        ("width", width, 16),
        ("height", height, 16),
        ("gop", gop, 1),
        ("crf", crf, 0),
        ("state_dim", state_dim, 1),
        ("action_dim", action_dim, 1),
        ("chunks_size", chunks_size, 1),
        ("seed", seed, 0),
    ):
        _check_int(name, value, minimum)
    for name, per in (
        ("episodes_per_video_file", episodes_per_video_file),
        ("episodes_per_data_file", episodes_per_data_file),
    ):
        if per is not None:
            _check_int(name, per, 1)
    if not tasks or not all(isinstance(t, str) and t for t in tasks):
        raise ValueError(f"tasks must be non-empty strings, got {tasks!r}")
    if len(set(cameras)) != len(cameras) or any("/" in key for key in cameras):
        raise ValueError(f"cameras must be distinct feature names without '/', got {cameras!r}")
    rng = np.random.default_rng(seed)
    if isinstance(episodes, int):
        _check_int("episodes", episodes, 1)
        lengths = [int(n) for n in rng.integers(30, 91, size=episodes)]
    else:
        lengths = [int(n) for n in episodes]
        if not lengths:
            raise ValueError("episodes must name at least one episode length")
        for n in lengths:
            _check_int("an episode length", n, 1)

    repo = make_repo(root, repo_id, {})
    count = len(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(int).tolist()
    task_of = [int(t) for t in rng.integers(len(tasks), size=count)]
    order = sorted(set(task_of), key=task_of.index)  # LeRobot numbers tasks as first seen
    task_index = {t: i for i, t in enumerate(order)}
    task_texts = tuple(tasks[t] for t in order)
    tables = [
        _episode_table(
            rng, e, lengths[e], starts[e], task_index[task_of[e]], fps, state_dim, action_dim
        )
        for e in range(count)
    ]
    features = _features(cameras, state_dim, action_dim, width, height, fps, codec, version)
    options = _encoder_options(codec, gop, crf, encoder_options)
    container = {"movflags": "faststart"} if faststart else {}
    encoder = _ENCODERS[codec]

    # Files: which episodes each data and video file holds, and their paths.
    data_paths: list[str] = [""] * count
    spans: list[dict[str, LeRobotVideoSpan]] = [{} for _ in range(count)]
    file_of: list[tuple[int, int]] = [(0, 0)] * count
    if version == "v3.0":
        chunk, file = 0, 0
        for group in _groups(count, episodes_per_data_file):
            path = V30_DATA_PATH.format(chunk_index=chunk, file_index=file)
            _write_table(pa.concat_tables([tables[e] for e in group]), repo / path)
            for e in group:
                data_paths[e], file_of[e] = path, (chunk, file)
            chunk, file = _next_file(chunk, file, chunks_size)
        for c, key in enumerate(cameras):
            chunk, file = 0, 0
            for group in _groups(count, episodes_per_video_file):
                path = V30_VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file)
                make_video(
                    repo / path,
                    frames=sum(lengths[e] for e in group),
                    fps=fps,
                    width=width,
                    height=height,
                    encoder=encoder,
                    options=options,
                    container_options=container,
                    seed=seed,
                    camera=c,
                )
                elapsed, first = 0.0, 0
                for e in group:
                    end = elapsed + lengths[e] / fps
                    spans[e][key] = LeRobotVideoSpan(path, elapsed, end, first)
                    elapsed, first = end, first + lengths[e]
                chunk, file = _next_file(chunk, file, chunks_size)
    else:
        for e in range(count):
            chunk = e // chunks_size
            data_paths[e] = V21_DATA_PATH.format(episode_chunk=chunk, episode_index=e)
            _write_table(tables[e], repo / data_paths[e])
            for c, key in enumerate(cameras):
                path = V21_VIDEO_PATH.format(episode_chunk=chunk, video_key=key, episode_index=e)
                make_video(
                    repo / path,
                    frames=lengths[e],
                    fps=fps,
                    width=width,
                    height=height,
                    encoder=encoder,
                    options=options,
                    container_options=container,
                    seed=seed,
                    camera=c,
                )
                spans[e][key] = LeRobotVideoSpan(path, 0.0, lengths[e] / fps, 0)

    described = tuple(
        LeRobotEpisode(
            index=e,
            length=lengths[e],
            task=tasks[task_of[e]],
            task_index=task_index[task_of[e]],
            dataset_from_index=starts[e],
            dataset_to_index=starts[e + 1],
            data_path=data_paths[e],
            videos=spans[e],
        )
        for e in range(count)
    )
    info = _info(version, count, starts[-1], len(task_texts), chunks_size, fps, features, cameras)
    _write_json(repo / "meta" / "info.json", info)
    _write_json(repo / "meta" / "stats.json", _global_stats(tables))
    (repo / "README.md").write_text(_CARD.format(version=version), encoding="utf-8")
    if version == "v3.0":
        _write_table(_tasks_table(task_texts), repo / "meta" / "tasks.parquet")
        _write_table(
            _episodes_table(described, tables, file_of, cameras),
            repo / V30_EPISODES_PATH.format(chunk_index=0, file_index=0),
        )
    else:
        _write_jsonl(
            repo / "meta" / "tasks.jsonl",
            [{"task_index": i, "task": t} for i, t in enumerate(task_texts)],
        )
        _write_jsonl(
            repo / "meta" / "episodes.jsonl",
            [{"episode_index": e.index, "tasks": [e.task], "length": e.length} for e in described],
        )
        _write_jsonl(
            repo / "meta" / "episodes_stats.jsonl",
            [{"episode_index": e, "stats": _episode_stats(tables[e])} for e in range(count)],
        )
    return LeRobotLayout(
        path=repo,
        repo_id=repo_id,
        version=version,
        fps=fps,
        width=width,
        height=height,
        codec=codec,
        video_keys=tuple(cameras),
        tasks=task_texts,
        episodes=described,
        info=info,
    )


_CARD = """---
license: apache-2.0
task_categories:
- robotics
tags:
- LeRobot
configs:
- config_name: default
  data_files: data/*/*.parquet
---
A synthetic LeRobot {version} dataset written by aiostream_hf.testing.make_lerobot_dataset.
"""


def _info(
    version: str,
    episodes: int,
    frames: int,
    tasks: int,
    chunks_size: int,
    fps: int,
    features: Mapping[str, Any],
    cameras: Sequence[str],
) -> dict[str, Any]:
    if version == "v3.0":
        return {
            "codebase_version": "v3.0",
            "robot_type": "aiostream-synthetic",
            "total_episodes": episodes,
            "total_frames": frames,
            "total_tasks": tasks,
            "chunks_size": chunks_size,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 500,
            "fps": fps,
            "splits": {"train": f"0:{episodes}"},
            "data_path": V30_DATA_PATH,
            "video_path": V30_VIDEO_PATH if cameras else None,
            "features": dict(features),
        }
    return {
        "codebase_version": "v2.1",
        "robot_type": "aiostream-synthetic",
        "total_episodes": episodes,
        "total_frames": frames,
        "total_tasks": tasks,
        "total_videos": episodes * len(cameras),
        "total_chunks": (episodes - 1) // chunks_size + 1,
        "chunks_size": chunks_size,
        "fps": fps,
        "splits": {"train": f"0:{episodes}"},
        "data_path": V21_DATA_PATH,
        "video_path": V21_VIDEO_PATH if cameras else None,
        "features": dict(features),
    }


def _episode_stats(table: pa.Table) -> dict[str, Any]:
    return {name: _stats(_vector_column(table, name)) for name in ("observation.state", "action")}


def _global_stats(tables: Sequence[pa.Table]) -> dict[str, Any]:
    return _episode_stats(pa.concat_tables(tables))


def _episodes_table(
    episodes: Sequence[LeRobotEpisode],
    tables: Sequence[pa.Table],
    file_of: Sequence[tuple[int, int]],
    cameras: Sequence[str],
) -> pa.Table:
    columns: dict[str, Any] = {
        "episode_index": pa.array([e.index for e in episodes], pa.int64()),
        "tasks": pa.array([[e.task] for e in episodes], pa.list_(pa.string())),
        "length": pa.array([e.length for e in episodes], pa.int64()),
        "data/chunk_index": pa.array([file_of[e.index][0] for e in episodes], pa.int64()),
        "data/file_index": pa.array([file_of[e.index][1] for e in episodes], pa.int64()),
        "dataset_from_index": pa.array([e.dataset_from_index for e in episodes], pa.int64()),
        "dataset_to_index": pa.array([e.dataset_to_index for e in episodes], pa.int64()),
    }
    for key in cameras:
        chunk_file = [_chunk_file(e.videos[key].path) for e in episodes]
        columns[f"videos/{key}/chunk_index"] = pa.array([c for c, _ in chunk_file], pa.int64())
        columns[f"videos/{key}/file_index"] = pa.array([f for _, f in chunk_file], pa.int64())
        columns[f"videos/{key}/from_timestamp"] = pa.array(
            [e.videos[key].from_timestamp for e in episodes], pa.float64()
        )
        columns[f"videos/{key}/to_timestamp"] = pa.array(
            [e.videos[key].to_timestamp for e in episodes], pa.float64()
        )
    columns["meta/episodes/chunk_index"] = pa.array([0] * len(episodes), pa.int64())
    columns["meta/episodes/file_index"] = pa.array([0] * len(episodes), pa.int64())
    for name in ("observation.state", "action"):
        stats = [_stats(_vector_column(tables[e.index], name)) for e in episodes]
        for stat in ("min", "max", "mean", "std", "count"):
            columns[f"stats/{name}/{stat}"] = pa.array(
                [s[stat] for s in stats],
                pa.list_(pa.int64() if stat == "count" else pa.float64()),
            )
    return pa.table(columns)


def _chunk_file(path: str) -> tuple[int, int]:
    """The (chunk, file) indices of a v3.0 ``.../chunk-CCC/file-FFF.ext`` path."""
    parts = pathlib.PurePosixPath(path).parts
    return int(parts[-2].removeprefix("chunk-")), int(parts[-1].split(".")[0].removeprefix("file-"))
