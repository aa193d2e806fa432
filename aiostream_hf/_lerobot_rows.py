"""The data rows of LeRobot episodes: read from the data Parquet files (one pass per file,
the selected episodes' row groups) into numpy arrays per column, checked against the
episodes metadata; a ``_Row`` is one item to be (an episode's rows and a frame)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ._exceptions import DecodeError
from ._lerobot_meta import _INFO, EpisodeInfo, _all, _read_parquet
from ._models import FileRef
from ._stalls import run_decode
from .formats import ByteSource

if TYPE_CHECKING:
    from ._lerobot_plan import _Plan


Array: TypeAlias = npt.NDArray[Any]


# -- data rows --------------------------------------------------------------------------


@dataclass(frozen=True)
class _EpisodeRows:
    """The data rows of one episode, in frame order, as numpy arrays per column."""

    info: EpisodeInfo
    columns: Mapping[str, Array]
    timestamps: npt.NDArray[np.float64] | None
    task_index: npt.NDArray[np.int64] | None


@dataclass(frozen=True)
class _Row:
    episode: _EpisodeRows
    pos: int


async def _load_episodes(
    source: ByteSource, plan: _Plan, group: list[EpisodeInfo]
) -> dict[int, _EpisodeRows]:
    """The rows of ``group`` (episodes of one data file), read in one pass over the file."""
    file = group[0].data_file
    in_file = {e.index for e in plan.meta.episodes if e.data_file.url == file.url}
    wanted = sorted(e.index for e in group)
    filter = None
    if set(wanted) != in_file:
        filter = pc.field("episode_index").isin(wanted)
    label = plan.meta.source

    def keep(names: Sequence[str]) -> list[str]:
        missing = [c for c in plan.columns if c not in names]
        if missing:
            raise DecodeError(
                f"{label}: {file.path} has no column {missing[0]!r} of the features in {_INFO} "
                f"(its columns are {', '.join(names)})"
            )
        return list(plan.columns)

    table = await _read_parquet(source, file, keep=keep, filter=filter)
    return await run_decode(_split_episodes, table, group, file, label)


async def _load_rows(
    source: ByteSource, plan: _Plan, episodes: Iterable[EpisodeInfo]
) -> tuple[dict[int, _EpisodeRows], int]:
    """The rows of ``episodes`` (of any data files), one read per file, the files
    concurrently; and how many files were read."""
    by_file: dict[str, list[EpisodeInfo]] = {}
    for episode in episodes:
        by_file.setdefault(episode.data_file.url, []).append(episode)
    rows: dict[int, _EpisodeRows] = {}

    async def load(group: list[EpisodeInfo]) -> None:
        rows.update(await _load_episodes(source, plan, group))

    await _all([functools.partial(load, group) for group in by_file.values()])
    return rows, len(by_file)


def _split_episodes(
    table: pa.Table, group: list[EpisodeInfo], file: FileRef, label: str
) -> dict[int, _EpisodeRows]:
    for needed in ("episode_index", "index"):
        if needed not in table.column_names:
            raise DecodeError(f"{label}: {file.path} has no {needed!r} column")
    columns = {name: _to_numpy(table.column(name)) for name in table.column_names}
    episode_of = columns["episode_index"]
    out: dict[int, _EpisodeRows] = {}
    for episode in group:
        rows = np.flatnonzero(episode_of == episode.index)
        index = columns["index"][rows]
        order = np.argsort(index, kind="stable")
        rows, index = rows[order], index[order]
        start = episode.dataset_from_index
        if (
            len(rows) != episode.length
            or episode.dataset_to_index - start != len(rows)
            or not np.array_equal(index, np.arange(start, start + len(rows)))
        ):
            got = f"{len(rows)} rows" + (
                f" with index {int(index[0])}-{int(index[-1])}" if len(rows) else ""
            )
            raise DecodeError(
                f"{label}: episode {episode.index} has {got} in {file.path}, but the episodes "
                f"metadata says {episode.length} rows with index "
                f"{episode.dataset_from_index}-{episode.dataset_to_index - 1}"
            )
        cols = {name: values[rows] for name, values in columns.items()}
        ts = cols.get("timestamp")
        task = cols.get("task_index")
        out[episode.index] = _EpisodeRows(
            info=episode,
            columns=cols,
            timestamps=None if ts is None else np.asarray(ts, dtype=np.float64),
            task_index=None if task is None else np.asarray(task, dtype=np.int64),
        )
    return out


def _to_numpy(column: pa.ChunkedArray | pa.Array) -> Array:
    """A column as numpy: numbers as they are, equal-length lists as extra dimensions,
    anything else (strings, structs, ragged lists) as a 1-D object array."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    kind = array.type
    if array.null_count == 0:
        if (
            pa.types.is_fixed_size_list(kind)
            or pa.types.is_list(kind)
            or pa.types.is_large_list(kind)
        ):
            if pa.types.is_fixed_size_list(kind):
                width = kind.list_size
                uniform = True
            else:
                lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
                width = int(lengths[0]) if len(lengths) else 0
                uniform = bool(np.all(lengths == width))
            if uniform:
                inner = _to_numpy(array.flatten())
                if inner.dtype != object:
                    return inner.reshape(len(array), width, *inner.shape[1:])
        elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
            return np.asarray(array.to_numpy(zero_copy_only=False))
    values = array.to_pylist()
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out
