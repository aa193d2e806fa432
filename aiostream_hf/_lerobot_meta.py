"""LeRobot metadata: ``meta/info.json``, its path templates, the episodes and tasks of the
v3.0 and v2.1 layouts, and the roots they are read from (a Hub repo, a bucket folder, a
local folder). Read once per stream, bounded (``aiostream_hf.lerobot`` is the public face)."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import string
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import anyio.to_thread
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._decode_pool import decoding
from ._exceptions import DecodeError, EntryNotFoundError, FetchError, SourceError
from ._models import FileRef
from ._received import Received
from ._resolver import Resolver
from ._sources import BucketSource, HubSource
from ._stalls import run_decode
from .formats import ByteSource, ReadRequest
from .formats.parquet import DecodeBudget, ParquetDecoder, decode_units, read_footer

SUPPORTED_VERSIONS = ("v2.0", "v2.1", "v3.0")
"""The ``codebase_version`` values of ``meta/info.json`` that this module reads."""

_INFO = "meta/info.json"
_TASKS_V3 = "meta/tasks.parquet"
_EPISODES_V3 = "meta/episodes/"
_EPISODES_V2 = "meta/episodes.jsonl"
_TASKS_V2 = "meta/tasks.jsonl"
_WHOLE_READ = 4 << 20  # JSON files are read with one suffix request of this many bytes
_MAX_FPS = 1e6
"""The largest ``fps`` of ``meta/info.json`` that is read. Cameras record tens to
thousands of frames per second; a larger value is a damaged file, and would overflow
the frame arithmetic (``round(delta * fps)``)."""
_MIN_FPS = 1e-6
"""The smallest ``fps`` read (a frame every ~12 days): below it, an episode's duration
(``length / fps``) overflows to infinity."""
_MAX_FIELD_WIDTH = 20
"""The widest zero-padded field of a path template, ``{episode_index:020d}``."""
_MAX_TABLE_BYTES = 256 * 1024 * 1024
_MAX_TABLE_EXPANSION = 64
"""A LeRobot table (episodes metadata, a data file) is read whole: one that decodes to
at least the larger of ``_MAX_TABLE_BYTES`` and ``_MAX_TABLE_EXPANSION`` times its file
(by the Parquet decoder's checks on all its row groups together: their flat floor,
``RowGroupPlan.least_decoded``, and the values their list columns' pages announce) is
refused as damaged. Real ones decode to a few times their size."""
_MAX_META_BYTES = 256 * 1024 * 1024
"""The largest metadata file read (``meta/info.json``, ``episodes.jsonl``,
``tasks.jsonl``, ``tasks.parquet``, an episodes Parquet file), checked against its
size before its body is read: each is read whole, and a JSON one becomes Python
objects several times its size. Real ones are kilobytes to tens of megabytes."""
_MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects in a metadata JSON text (LeRobot's go 6
deep), checked before ``json.loads``, whose recursion a deeper one would exhaust."""
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)  # one pass, unterminated too
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_CHUNK = 1 << 20
_MAX_TEMPLATE_FIELDS = 16
"""Most fields in a path template (LeRobot's have two to four)."""
_MAX_PATH = 4096
"""Longest path a template may give (as the Hub's tree paths, ``MAX_PATH_LENGTH``)."""
_INT_SPEC = re.compile(r"0?(\d{1,2})?d")  # an integer field's format spec: "d", "03d", "06d"


# -- metadata ---------------------------------------------------------------------------


@dataclass(frozen=True)
class VideoSpan:
    """One episode of one camera: its video file and its time span in that file (seconds)."""

    file: FileRef
    from_timestamp: float
    to_timestamp: float


@dataclass(frozen=True)
class EpisodeInfo:
    """One episode: its rows ``[dataset_from_index, dataset_to_index)`` and where they lie."""

    index: int
    length: int
    tasks: tuple[str, ...]
    dataset_from_index: int
    dataset_to_index: int
    data_file: FileRef
    videos: Mapping[str, VideoSpan]


@dataclass(frozen=True)
class LeRobotMetadata:
    """``meta/`` of a LeRobot dataset, as read once by a stream."""

    source: str
    version: str
    fps: float
    info: Mapping[str, Any] = field(repr=False)
    features: Mapping[str, Mapping[str, Any]] = field(repr=False)
    video_keys: tuple[str, ...]
    tasks: Mapping[int, str] = field(repr=False)
    episodes: tuple[EpisodeInfo, ...] = field(repr=False)
    commit: str | None = None
    endpoint: str | None = None  # the Hub it was read from (None for a local folder)

    @property
    def total_frames(self) -> int:
        return sum(e.length for e in self.episodes)

    @property
    def data_keys(self) -> tuple[str, ...]:
        """The features stored in the data Parquet files (every one but the videos)."""
        return tuple(k for k, f in self.features.items() if f.get("dtype") != "video")


# -- where the files are ----------------------------------------------------------------


@dataclass(frozen=True)
class _Root:
    """The files of a dataset: known ones (with sizes), and how to name any other."""

    label: str
    files: Mapping[str, FileRef]
    url_base: str | None = None  # Hub: ".../resolve/{sha}/" + the dataset's folder
    prefix: str = ""  # the dataset's folder in the repo ("" or "sub/")
    commit: str | None = None
    endpoint: str | None = None

    def file(self, path: str) -> FileRef | None:
        """The file at ``path`` (relative to the dataset root), if it may exist."""
        found = self.files.get(path)
        if found is not None or self.url_base is None:
            return found
        return FileRef(self.url_base + quote(path), self.prefix + path)

    def under(self, folder: str, suffix: str) -> list[FileRef]:
        return [
            f for p, f in sorted(self.files.items()) if p.startswith(folder) and p.endswith(suffix)
        ]


def _local_root(path: Path) -> _Root:
    files: dict[str, FileRef] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(path).as_posix()
            files[rel] = FileRef(full.as_uri(), str(full), size=full.stat().st_size)
    return _Root(label=str(path), files=files)


async def _bucket_root(folder: BucketSource, resolver: Resolver) -> _Root:
    """Every object of the dataset's folder, with sizes and ETags, from one listing."""
    manifest = await resolver.resolve(folder.uri)
    files = {f.path[len(folder.uri) :]: f for f in manifest.files}
    return _Root(label=folder.uri, files=files)


async def _hub_root(source: HubSource, resolver: Resolver) -> _Root:
    """The dataset's Parquet files (with sizes) and its commit, from one tree listing."""
    folder = (source.path or "").strip("/")
    prefix = f"{folder}/" if folder else ""
    pattern = HubSource(source.repo_id, source.revision, f"{prefix}**/*.parquet").uri
    label = HubSource(source.repo_id, source.revision, source.path).uri
    try:
        manifest = await resolver.resolve(pattern)  # with the stream's access
    except EntryNotFoundError as exc:
        raise EntryNotFoundError(
            f"{label} holds no Parquet file, so it is not a LeRobot v2.1/v3.0 dataset "
            f"(their frames are in data/*/*.parquet): {exc}"
        ) from exc
    # Every file of the folder, from the same tree listing: the videos and metadata carry
    # their sizes and versions as the data files do (the byte cache keeps them).
    assert manifest.commit is not None
    listed = await resolver.folder_files(
        HubSource(source.repo_id, manifest.commit, folder or None).uri
    )
    files = {f.path[len(prefix) :]: f for f in listed.files if f.path.startswith(prefix)}
    base = f"{manifest.endpoint}/datasets/{manifest.repo_id}/resolve/{manifest.commit}/"
    return _Root(
        label=label,
        files=files,
        url_base=base + quote(prefix),
        prefix=prefix,
        commit=manifest.commit,
        endpoint=manifest.endpoint,
    )


async def _all(calls: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Run ``calls`` concurrently. The first error cancels the others and is raised as it
    is, not wrapped in an ExceptionGroup; cancellation from outside propagates."""
    errors: list[Exception] = []

    async def run(call: Callable[[], Awaitable[None]], scope: anyio.CancelScope) -> None:
        try:
            await call()
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # re-raised below, after the task group
            errors.append(exc)
            scope.cancel()

    async with anyio.create_task_group() as tg:
        for call in calls:
            tg.start_soon(run, call, tg.cancel_scope)
    if errors:
        raise errors[0]


# -- reading metadata -------------------------------------------------------------------


def _check_meta_size(size: int | None, path: str, label: str) -> None:
    if size is not None and size > _MAX_META_BYTES:
        raise DecodeError(
            f"{label}: {path} is {size:,} bytes, over the {_MAX_META_BYTES:,} a LeRobot "
            "metadata file may be (_lerobot_meta._MAX_META_BYTES; it is read whole): it is "
            "damaged or not LeRobot metadata"
        )


async def _read_whole(source: ByteSource, file: FileRef, path: str, label: str) -> bytes:
    """The whole file, at most ``_MAX_META_BYTES``: its size is checked before its body
    is read (a local or listed file's at once, another's from the tail read's answer)."""
    _check_meta_size(file.size, path, label)
    data, size = await source.read_tail(file, _WHOLE_READ)
    _check_meta_size(size, path, label)
    if size > len(data):
        (head,) = await source.read_ranges(file, [(0, size - len(data))])
        data = head + data
    return data


async def _read_meta_file(source: ByteSource, root: _Root, path: str, what: str) -> bytes:
    file = root.file(path)
    if file is None:
        raise EntryNotFoundError(f"{root.label} has no {path}: {what}")
    try:
        return await _read_whole(source, file, path, root.label)
    except FetchError as exc:
        if exc.status == 404:
            raise EntryNotFoundError(f"{root.label} has no {path}: {what}") from exc
        raise


_PARQUET = ParquetDecoder()


async def _read_parquet(
    source: ByteSource,
    file: FileRef,
    *,
    columns: Sequence[str] | None = None,
    keep: Any = None,
    filter: pc.Expression | None = None,
    label: str | None = None,
) -> pa.Table:
    """A Parquet file's selected columns (``keep(names)`` picks them), read with one tail
    read plus one request for the bytes of their row groups the tail does not hold.

    Read by the stream's Parquet decoder, with its checks: the table is read whole, so
    its row groups together must not surely decode past the larger of _MAX_TABLE_BYTES
    and _MAX_TABLE_EXPANSION times the file (their flat floor at the plan, and the values
    their list columns' pages announce before decoding). A metadata table (``label``
    given: the dataset's) is also at most ``_MAX_META_BYTES`` of file, checked before
    its footer is read and against the size that read tells."""
    if label is not None:
        _check_meta_size(file.size, file.path, label)
    received = Received(source)
    footer, _, _ = await read_footer(received, file, file.path)
    if label is not None:
        _check_meta_size(footer.file_size, file.path, label)
    if keep is not None:
        columns = keep(footer.schema.names)
    request = ReadRequest(columns=None if columns is None else tuple(columns), filter=filter)
    most = max(_MAX_TABLE_BYTES, _MAX_TABLE_EXPANSION * footer.file_size)
    budget = DecodeBudget(
        most,
        lambda _: (
            f"over {most:,} for a file of {footer.file_size:,} bytes: a metadata or data table "
            f"of a LeRobot dataset is read whole, and this one is damaged or not one"
        ),
        whole_file=True,
    )
    units = _PARQUET.units(footer, file, request, budget)
    fetched = await _PARQUET.fetch_many(units, received)

    def decode() -> pa.Table:
        with decoding():
            return decode_units(footer, units, fetched, request, budget)

    return await run_decode(decode)


def _check_depth(data: bytes, what: str) -> None:
    """Refuse JSON text (``what`` names it) whose arrays and objects nest deeper than
    ``_MAX_JSON_DEPTH``, before it is parsed. Strings are cut out first; the brackets
    left are counted in chunks, so memory stays a few times ``_DEPTH_CHUNK``."""
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    level = 0
    for at in range(0, len(brackets), _DEPTH_CHUNK):
        chunk = np.frombuffer(brackets, np.uint8, min(_DEPTH_CHUNK, len(brackets) - at), at)
        levels = level + np.cumsum(np.where((chunk == 0x5B) | (chunk == 0x7B), 1, -1))
        if int(levels.max()) > _MAX_JSON_DEPTH:
            raise DecodeError(
                f"{what} nests arrays and objects more than {_MAX_JSON_DEPTH} deep "
                "(_lerobot_meta._MAX_JSON_DEPTH): it is damaged or not LeRobot metadata"
            )
        level = int(levels[-1])


def _json(data: bytes, path: str, label: str) -> Any:
    _check_depth(data, f"{label}: {path}")
    try:
        return json.loads(data)
    except ValueError as exc:  # not UTF-8, not JSON, or a number of over 4300 digits
        raise DecodeError(f"{label}: {path} is not JSON: {exc}") from exc


def _jsonl(data: bytes, path: str, label: str) -> list[dict[str, Any]]:
    _check_depth(data, f"{label}: {path}")
    rows = []
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:  # not JSON, or a number of over 4300 digits
            raise DecodeError(f"{label}: line {n} of {path} is not JSON: {exc}") from exc
        if not isinstance(row, dict):
            raise DecodeError(f"{label}: line {n} of {path} is not a JSON object")
        rows.append(row)
    return rows


def _need(row: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in row or row[key] is None:
        raise DecodeError(f"{where} has no {key!r}")
    return row[key]


def _whole(row: Mapping[str, Any], key: str, where: str) -> int:
    """``row[key]``, a whole number (a float such as 3.0 too), else a DecodeError: "abc",
    NaN, 1e400 or null in a metadata file are not counts, and int() of them raised a
    bare ValueError, OverflowError or TypeError."""
    value = _need(row, key, where)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise DecodeError(f"{where}: {key}={value!r} is not a whole number")
    if isinstance(value, (float, np.floating)) and not (
        math.isfinite(value) and float(value).is_integer()
    ):
        raise DecodeError(f"{where}: {key}={value!r} is not a whole number")
    return int(value)


def _seconds(row: Mapping[str, Any], key: str, where: str) -> float:
    """``row[key]``, a finite number of seconds, else a DecodeError naming it."""
    value = _need(row, key, where)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise DecodeError(f"{where}: {key}={value!r} is not a number of seconds")
    try:
        seconds = float(value)
    except OverflowError:  # an int past float's range
        seconds = math.inf
    if not math.isfinite(seconds):
        raise DecodeError(f"{where}: {key}={value!r} is not a finite number of seconds")
    return seconds


def _task_names(row: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """``row["tasks"]``: a list of task texts (none when missing), else a DecodeError."""
    tasks = row.get("tasks")
    if tasks is None:
        return ()
    if not isinstance(tasks, (list, tuple)):
        raise DecodeError(f"{where}: tasks={tasks!r} is not a list of task texts")
    return tuple(str(t) for t in tasks)


@dataclass(frozen=True)
class _PathTemplate:
    """A path template of ``meta/info.json`` (``data_path``, ``video_path``), checked
    before use: only plain fields of known names (integers may have a zero-padded width),
    and every path it gives must stay inside the dataset."""

    key: str
    template: str
    where: str  # the dataset and info.json, for messages

    @classmethod
    def parse(
        cls, info: Mapping[str, Any], key: str, fields: Mapping[str, type], where: str
    ) -> _PathTemplate:
        """``info[key]``, whose fields are names of ``fields`` (``str`` or ``int`` values)."""
        template = info.get(key)
        if not isinstance(template, str) or not template:
            raise DecodeError(
                f"{where}: {key} is {template!r}, not a path template: {_INFO} must give "
                f"{key} for this dataset's files"
            )
        names = ", ".join(f"{{{name}}}" for name in fields)
        ints = [name for name, kind in fields.items() if kind is int]
        allowed = (
            f"a template may only hold the fields {names}, and integer fields ("
            f"{', '.join(ints)}) a zero-padded width up to {_MAX_FIELD_WIDTH}, like "
            f"{{{ints[0]}:03d}}: fix {key} in {_INFO}"
        )
        try:
            parts = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise DecodeError(
                f"{where}: {key} {template!r} is not a path template ({exc}): {allowed}"
            ) from exc
        fields_used = sum(1 for _, name, _, _ in parts if name is not None)
        if len(template) > _MAX_PATH or fields_used > _MAX_TEMPLATE_FIELDS:
            raise DecodeError(
                f"{where}: {key} is {len(template):,} characters with {fields_used:,} fields "
                f"(at most {_MAX_PATH:,} and {_MAX_TEMPLATE_FIELDS}): fix {key} in {_INFO}"
            )
        for _, name, spec, conversion in parts:
            if name is None:  # literal text only
                continue
            if name not in fields or conversion is not None:
                ok = False
            elif not spec:
                ok = True
            else:
                match = _INT_SPEC.fullmatch(spec)
                ok = (
                    fields[name] is int
                    and match is not None
                    and int(match.group(1) or 0) <= _MAX_FIELD_WIDTH
                )
            if not ok:
                shown = (
                    name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
                )
                raise DecodeError(
                    f"{where}: {key} {template!r} has the field {{{shown}}}: {allowed}"
                )
        return cls(key, template, where)

    def fill(self, context: str, **values: int | str) -> str:
        """The template filled with ``values``: a clean path relative to the dataset root
        (``context`` says which episode, for messages)."""
        path = self.template.format(**values)  # at most _MAX_TEMPLATE_FIELDS values
        if len(path) > _MAX_PATH:
            raise DecodeError(
                f"{self.where}: {self.key} {self.template!r} gives a path of {len(path):,} "
                f"characters for {context} (at most {_MAX_PATH:,}): fix {self.key} and the "
                f"feature names in {_INFO}"
            )
        segments = path.split("/")
        if "\\" in path or "\0" in path or any(s in ("", ".", "..") for s in segments):
            raise DecodeError(
                f"{self.where}: {self.key} {self.template!r} gives the path {path!r} for "
                f"{context}, which is not a clean path inside the dataset (no empty, '.' or "
                f"'..' segments, not absolute, no backslash or NUL): fix {self.key} and the "
                f"feature names in {_INFO}"
            )
        return path


def _templates(
    root: _Root, info: Mapping[str, Any], video_keys: tuple[str, ...], fields: Mapping[str, type]
) -> tuple[_PathTemplate, _PathTemplate | None]:
    """The checked ``data_path`` and ``video_path`` (None without video features) of
    ``info``, whose fields are ``fields`` (and ``video_key`` in ``video_path``)."""
    where = f"{root.label} {_INFO}"
    data_path = _PathTemplate.parse(info, "data_path", fields, where)
    if not video_keys:
        return data_path, None
    video_fields = {"video_key": str, **fields}
    return data_path, _PathTemplate.parse(info, "video_path", video_fields, where)


async def _load_metadata(root: _Root, source: ByteSource) -> LeRobotMetadata:
    info_bytes = await _read_meta_file(
        source,
        root,
        _INFO,
        "it is not a LeRobot dataset (LeRobot v2.1 and v3.0 datasets describe themselves there)",
    )
    info = _json(info_bytes, _INFO, root.label)
    if not isinstance(info, dict):
        raise DecodeError(f"{root.label}: {_INFO} is not a JSON object")
    version = info.get("codebase_version")
    if version not in SUPPORTED_VERSIONS:
        raise SourceError(
            f"{root.label}: unsupported LeRobot codebase_version {version!r} in {_INFO}: "
            f"aiostream-hf reads {', '.join(SUPPORTED_VERSIONS)} (convert older datasets "
            "with lerobot's conversion scripts)"
        )
    where = f"{root.label} {_INFO}"
    fps = _need(info, "fps", where)
    features = _need(info, "features", where)
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or fps <= 0:
        raise DecodeError(f"{where}: fps={fps!r} is not a positive number")
    if fps > _MAX_FPS or not math.isfinite(fps) or fps < _MIN_FPS:  # a huge int: no float
        raise DecodeError(
            f"{where}: fps={fps!r} is not a frame rate (from {_MIN_FPS:g} to {_MAX_FPS:g} "
            f"frames per second): fix fps in {_INFO}"
        )
    if not isinstance(features, dict) or not all(isinstance(f, dict) for f in features.values()):
        raise DecodeError(f"{where}: 'features' is not an object of feature objects")
    video_keys = tuple(k for k, f in features.items() if f.get("dtype") == "video")
    if video_keys and not isinstance(info.get("video_path"), str):
        raise DecodeError(f"{where} has video features {list(video_keys)} but no video_path")
    if not isinstance(info.get("data_path"), str):
        raise DecodeError(f"{where} has no data_path template")
    if version == "v3.0":
        tasks, episodes = await _v3_meta(root, source, info, video_keys)
    else:
        tasks, episodes = await _v2_meta(root, source, info, video_keys, float(fps))
    return LeRobotMetadata(
        source=root.label,
        version=version,
        fps=float(fps),
        info=info,
        features=features,
        video_keys=video_keys,
        tasks=tasks,
        episodes=tuple(sorted(episodes, key=lambda e: e.index)),
        commit=root.commit,
        endpoint=root.endpoint,
    )


def _data_file(root: _Root, path: str, episode: int) -> FileRef:
    file = root.file(path)
    if file is None:
        raise EntryNotFoundError(f"{root.label} has no {path} (the data file of episode {episode})")
    return file


def _video_file(root: _Root, path: str, episode: int, key: str) -> FileRef:
    file = root.file(path)
    if file is None:
        raise EntryNotFoundError(
            f"{root.label} has no {path} (the {key} video of episode {episode})"
        )
    return file


def _task_texts(table: pa.Table, where: str) -> dict[int, str]:
    """``meta/tasks.parquet``: pandas writes the task text as its index (named ``task``,
    or unnamed: ``__index_level_0__``), with a ``task_index`` column."""
    names = table.column_names
    candidates: list[str] = []
    pandas_meta = (table.schema.metadata or {}).get(b"pandas")
    if pandas_meta:
        _check_depth(pandas_meta, f"{where}: its pandas metadata")
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            candidates += [
                c for c in json.loads(pandas_meta).get("index_columns", []) if isinstance(c, str)
            ]
    candidates += ["task", "__index_level_0__"]
    text = next((c for c in candidates if c in names and c != "task_index"), None)
    if text is None:
        raise DecodeError(f"{where} has no task text column (looked for {candidates})")
    texts = [str(t) for t in table.column(text).to_pylist()]
    if "task_index" in names:
        indices = [
            _whole({"task_index": i}, "task_index", f"{where} (row {n})")
            for n, i in enumerate(table.column("task_index").to_pylist())
        ]
    else:
        indices = list(range(len(texts)))
    return dict(zip(indices, texts, strict=True))


async def _v3_meta(
    root: _Root, source: ByteSource, info: Mapping[str, Any], video_keys: tuple[str, ...]
) -> tuple[dict[int, str], list[EpisodeInfo]]:
    tasks_file = root.file(_TASKS_V3)
    if tasks_file is None:
        raise EntryNotFoundError(f"{root.label} has no {_TASKS_V3} (a v3.0 dataset needs it)")
    episode_files = root.under(_EPISODES_V3, ".parquet")
    if not episode_files:
        raise EntryNotFoundError(
            f"{root.label} has no {_EPISODES_V3}*/*.parquet (a v3.0 dataset needs them)"
        )

    def keep(names: Sequence[str]) -> list[str]:
        return [n for n in names if not n.startswith("stats/")]

    results: dict[int, pa.Table] = {}

    async def read(i: int, file: FileRef) -> None:
        results[i] = await _read_parquet(source, file, keep=keep, label=root.label)

    await _all(
        [functools.partial(read, i, f) for i, f in [(-1, tasks_file), *enumerate(episode_files)]]
    )
    tasks = _task_texts(results.pop(-1), f"{root.label} {_TASKS_V3}")
    data_path, video_path = _templates(
        root, info, video_keys, {"chunk_index": int, "file_index": int}
    )
    episodes: list[EpisodeInfo] = []
    for i, file in enumerate(episode_files):
        for row in results[i].to_pylist():
            where = f"{root.label} {file.path} (episode {row.get('episode_index')!r})"
            e = _whole(row, "episode_index", where)
            data = data_path.fill(
                f"episode {e}",
                chunk_index=_whole(row, "data/chunk_index", where),
                file_index=_whole(row, "data/file_index", where),
            )
            videos: dict[str, VideoSpan] = {}
            for key in video_keys:
                assert video_path is not None  # there are video keys
                path = video_path.fill(
                    f"the {key} video of episode {e}",
                    video_key=key,
                    chunk_index=_whole(row, f"videos/{key}/chunk_index", where),
                    file_index=_whole(row, f"videos/{key}/file_index", where),
                )
                videos[key] = VideoSpan(
                    _video_file(root, path, e, key),
                    _seconds(row, f"videos/{key}/from_timestamp", where),
                    _seconds(row, f"videos/{key}/to_timestamp", where),
                )
            length = _whole(row, "length", where)
            start = _whole(row, "dataset_from_index", where)
            end = _whole(row, "dataset_to_index", where)
            if length < 0 or start < 0 or end - start != length:
                raise DecodeError(
                    f"{where}: dataset_from_index={start} and dataset_to_index={end} do not "
                    f"hold length={length} rows (dataset_to_index - dataset_from_index must be "
                    "the length, none negative): the episodes metadata is damaged; rewrite it "
                    "with lerobot"
                )
            episodes.append(
                EpisodeInfo(
                    index=e,
                    length=length,
                    tasks=_task_names(row, where),
                    dataset_from_index=start,
                    dataset_to_index=end,
                    data_file=_data_file(root, data, e),
                    videos=videos,
                )
            )
    return tasks, episodes


async def _v2_meta(
    root: _Root,
    source: ByteSource,
    info: Mapping[str, Any],
    video_keys: tuple[str, ...],
    fps: float,
) -> tuple[dict[int, str], list[EpisodeInfo]]:
    texts: dict[str, bytes] = {}

    async def read(path: str) -> None:
        texts[path] = await _read_meta_file(
            source, root, path, f"a {info['codebase_version']} dataset needs it"
        )

    await _all([functools.partial(read, _EPISODES_V2), functools.partial(read, _TASKS_V2)])
    tasks: dict[int, str] = {}
    for row in _jsonl(texts[_TASKS_V2], _TASKS_V2, root.label):
        where = f"{root.label} {_TASKS_V2}"
        tasks[_whole(row, "task_index", where)] = str(_need(row, "task", where))
    rows = sorted(
        _jsonl(texts[_EPISODES_V2], _EPISODES_V2, root.label),
        key=lambda r: _whole(r, "episode_index", f"{root.label} {_EPISODES_V2}"),
    )
    in_info = f"{root.label} {_INFO}"
    chunks_size = _whole({"chunks_size": info.get("chunks_size") or 1000}, "chunks_size", in_info)
    if chunks_size < 1:
        raise DecodeError(f"{in_info}: chunks_size={chunks_size} is not a positive count")
    data_path, video_path = _templates(
        root, info, video_keys, {"episode_chunk": int, "episode_index": int}
    )
    episodes: list[EpisodeInfo] = []
    start = 0
    for row in rows:
        e = _whole(row, "episode_index", f"{root.label} {_EPISODES_V2}")
        where = f"{root.label} {_EPISODES_V2} (episode {e})"
        length = _whole(row, "length", where)
        chunk = e // chunks_size
        data = data_path.fill(f"episode {e}", episode_chunk=chunk, episode_index=e)
        videos: dict[str, VideoSpan] = {}
        for key in video_keys:
            assert video_path is not None  # there are video keys
            path = video_path.fill(
                f"the {key} video of episode {e}",
                episode_chunk=chunk,
                video_key=key,
                episode_index=e,
            )
            videos[key] = VideoSpan(_video_file(root, path, e, key), 0.0, length / fps)
        episodes.append(
            EpisodeInfo(
                index=e,
                length=length,
                tasks=_task_names(row, where),
                dataset_from_index=start,
                dataset_to_index=start + length,
                data_file=_data_file(root, data, e),
                videos=videos,
            )
        )
        start += length
    return tasks, episodes
