"""What ``aiostream-hf ls`` and ``head`` tell of a dataset beyond its list of files.

- ``local_lerobot`` / ``find_lerobot``: whether a local folder or a Hub dataset is a
  LeRobot dataset (it has ``meta/info.json``), and its metadata, read by
  ``aiostream_hf.lerobot``; ``LeRobotSummary`` is what ``ls`` shows of it
  (codebase version, episodes, frames, fps, cameras as ``info.json`` describes them,
  the data and video file counts).
- ``webdataset_summary``: the shards of each split (count, total size, first and last)
  and the extensions the first samples of the first shard carry, read through the
  library's own stream and stopped after a few samples.
- ``payload_value``: a WebDataset payload of a text-like extension (``.txt``,
  ``.cls``, ``.json``...) decoded as webdataset's default decoders decode it; other
  payloads stay bytes.
- ``check_names``: which of the files a brace pattern (``shard-{000..009}.tar``) or an
  http(s) URL names are there, with the sizes of the URLs, and those that are not
  (``Absent``: ``missing (HTTP 404)``, ``missing (not in the repo)``...).

Rendering is the CLI's (``cli.py``); nothing here prints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import anyio

from ._exceptions import (
    AiostreamError,
    EntryNotFoundError,
    FetchError,
    RangeMismatchError,
    SourceError,
)
from ._models import FileRef, Manifest
from ._sources import (
    BucketSource,
    HubSource,
    expand_braces,
    has_glob,
    is_bucket_uri,
    parse_sources,
)

if TYPE_CHECKING:
    from ._engine import Readers
    from ._options import StreamOptions
    from .lerobot import LeRobotMetadata

__all__ = [
    "Absent",
    "Camera",
    "LeRobotSummary",
    "Names",
    "ShardGroup",
    "WebDatasetSummary",
    "check_names",
    "find_lerobot",
    "load_lerobot",
    "local_lerobot",
    "payload_value",
    "webdataset_summary",
]

_INFO = "meta/info.json"
_PEEK_SAMPLES = 5  # samples of the first shard ``ls`` reads to learn the extensions

# The extensions of webdataset's default decoders (``autodecode.basichandlers``) whose
# payloads are text or numbers: shown as their value, decoded as those handlers decode
# them, written out here (importing webdataset imports torch: a second or two before
# ``head`` prints). Pickle, torch and the binary tensor formats are left out on purpose:
# ``head`` never runs what a dataset holds.
_TEXT_DECODERS: dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(("txt", "text", "transcript"), lambda data: data.decode("utf-8")),
    **dict.fromkeys(("cls", "cls2", "index", "inx", "id"), lambda data: int(data)),
    **dict.fromkeys(("json", "jsn"), lambda data: json.loads(data)),
}
TEXT_EXTENSIONS = frozenset(_TEXT_DECODERS)


# -- LeRobot ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Camera:
    """One video feature of a LeRobot dataset, as ``meta/info.json`` describes it."""

    key: str
    codec: str | None
    width: int | None
    height: int | None
    fps: float | None
    pix_fmt: str | None

    @property
    def resolution(self) -> str | None:
        if self.width is None or self.height is None:
            return None
        return f"{self.width}x{self.height}"


@dataclass(frozen=True)
class LeRobotSummary:
    """What ``ls`` shows of a LeRobot dataset."""

    source: str
    version: str
    robot_type: str | None
    episodes: int
    frames: int
    fps: float
    tasks: int
    splits: Mapping[str, str]
    cameras: tuple[Camera, ...]
    data_files: int
    data_bytes: int | None  # None when a data file's size is unknown
    video_files: int
    commit: str | None = None
    endpoint: str | None = None
    features: Mapping[str, str] = field(default_factory=dict)  # data key -> "dtype [shape]"

    @classmethod
    def from_metadata(cls, meta: LeRobotMetadata) -> LeRobotSummary:
        info = meta.info
        data = {e.data_file.path: e.data_file for e in meta.episodes}
        videos = {span.file.path for e in meta.episodes for span in e.videos.values()}
        sizes = [f.size for f in data.values()]
        robot = info.get("robot_type")
        splits = info.get("splits")
        return cls(
            source=meta.source,
            version=meta.version,
            robot_type=robot if isinstance(robot, str) else None,
            episodes=len(meta.episodes),
            frames=meta.total_frames,
            fps=meta.fps,
            tasks=len(meta.tasks),
            splits=(
                {str(k): str(v) for k, v in splits.items()} if isinstance(splits, Mapping) else {}
            ),
            cameras=tuple(_camera(k, meta.features[k]) for k in meta.video_keys),
            data_files=len(data),
            data_bytes=sum(s for s in sizes if s is not None)
            if all(s is not None for s in sizes)
            else None,
            video_files=len(videos),
            commit=meta.commit,
            endpoint=meta.endpoint,
            features={k: _feature_type(meta.features[k]) for k in meta.data_keys},
        )


def _camera(key: str, feature: Mapping[str, Any]) -> Camera:
    """A camera from its feature: ``info`` (``video.codec``, ``video.width``...; LeRobot
    v2.0 named it ``video_info``), else the ``shape`` and its ``names``."""
    info = feature.get("info") or feature.get("video_info") or {}
    if not isinstance(info, Mapping):
        info = {}
    width, height = _number(info.get("video.width")), _number(info.get("video.height"))
    shape, names = feature.get("shape"), feature.get("names")
    if (width is None or height is None) and isinstance(shape, Sequence) and len(shape) == 3:
        order = list(names) if isinstance(names, Sequence) else ["height", "width", "channels"]
        dims = dict(zip(order, shape, strict=False))
        width = width if width is not None else _number(dims.get("width"))
        height = height if height is not None else _number(dims.get("height"))
    codec, pix_fmt = info.get("video.codec"), info.get("video.pix_fmt")
    fps = info.get("video.fps")
    return Camera(
        key=key,
        codec=codec if isinstance(codec, str) else None,
        width=None if width is None else int(width),
        height=None if height is None else int(height),
        fps=float(fps) if isinstance(fps, (int, float)) and not isinstance(fps, bool) else None,
        pix_fmt=pix_fmt if isinstance(pix_fmt, str) else None,
    )


def _number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _feature_type(feature: Mapping[str, Any]) -> str:
    dtype, shape = feature.get("dtype", "?"), feature.get("shape")
    if isinstance(shape, Sequence) and list(shape) != [1]:
        return f"{dtype} {list(shape)}"
    return str(dtype)


def local_lerobot(source: str) -> Path | None:
    """The folder ``source`` names if it is a local LeRobot dataset (has ``meta/info.json``)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", source) or has_glob(source):
        return None
    folder = Path(source).expanduser()
    return folder if (folder / _INFO).is_file() else None


def _info_url(source: str, manifest: Manifest) -> str | None:
    """The ``/resolve/`` URL of ``meta/info.json`` at the commit of ``manifest``, if the Hub
    ``source`` (a repo or a folder of one, with Parquet files) may be a LeRobot dataset."""
    if manifest.format != "parquet" or manifest.commit is None or manifest.endpoint is None:
        return None  # LeRobot frames are Parquet
    sources = parse_sources(source)
    src = sources[0] if len(sources) == 1 else None
    if not isinstance(src, HubSource):
        return None
    folder = (src.path or "").strip("/")
    if has_glob(folder) or any(f.path == folder for f in manifest.files):
        return None  # a glob or one file, not a dataset's folder
    prefix = f"{folder}/" if folder else ""
    base = f"{manifest.endpoint}/datasets/{src.repo_id}/resolve/{manifest.commit}/"
    return base + quote(prefix + _INFO)


async def load_lerobot(
    source: str, readers: Readers, *, options: StreamOptions | None = None
) -> LeRobotMetadata:
    """The metadata of the LeRobot dataset ``source``, read by ``aiostream_hf.lerobot``
    with ``readers``' client and access."""
    from . import lerobot

    access = readers.access
    s = lerobot.stream(
        source,
        split=None,
        token=access.token,
        endpoint=access.endpoint,
        client=readers.client,
        options=options,
    )
    async with s:
        return await s.load_metadata()


async def find_lerobot(
    source: str, manifest: Manifest, readers: Readers, *, options: StreamOptions | None = None
) -> LeRobotMetadata | None:
    """The metadata of the Hub dataset (or S3 folder) ``source`` (resolved to
    ``manifest``) if it is a LeRobot dataset, else None.

    A dataset is LeRobot when it has ``meta/info.json``: that costs one read on the Hub
    (a 404 when absent), nothing in an S3 folder (its listing has every object). Then
    ``aiostream_hf.lerobot`` reads the metadata at the manifest's commit, and an error
    of a LeRobot dataset (a missing episodes file...) is raised.
    """
    folder = _s3_folder(source)
    if folder is not None:
        if not any(f.path == folder + _INFO for f in manifest.files):
            return None
        return await load_lerobot(folder, readers, options=options)
    url = _info_url(source, manifest)
    if url is None or not await _exists(url, readers):
        return None
    src = parse_sources(source)[0]
    assert isinstance(src, HubSource)
    pinned = HubSource(src.repo_id, manifest.commit, src.path).uri  # the listing's commit
    return await load_lerobot(pinned, readers)


def _s3_folder(source: str) -> str | None:
    """``s3://BUCKET/PREFIX/`` if ``source`` names one S3 folder (not a glob or a key)."""
    if not is_bucket_uri(source):
        return None
    sources = parse_sources(source)
    src = sources[0] if len(sources) == 1 else None
    if not isinstance(src, BucketSource) or has_glob(src.key):
        return None
    folder = src.key.strip("/")
    return f"{src.scheme}://{src.bucket}/{folder + '/' if folder else ''}"


async def _exists(url: str, readers: Readers) -> bool:
    try:
        await readers.fetcher.read_tail(FileRef(url, _INFO), 1)
    except FetchError as exc:
        if exc.status == 404:
            return False
        raise
    return True


# -- WebDataset -------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardGroup:
    """The shards of one split of one config."""

    config: str | None
    split: str | None
    count: int
    size: int | None  # None when a shard's size is unknown
    first: str
    last: str


@dataclass(frozen=True)
class WebDatasetSummary:
    """The shards per split, and the extensions of the first samples of the first shard."""

    groups: tuple[ShardGroup, ...]
    extensions: tuple[str, ...]  # in the order they first appear
    sampled: int  # samples read to learn them
    sampled_from: str | None  # the shard they were read from


def _name(file: FileRef, hub: bool) -> str:
    return file.path if hub else posixpath.basename(file.path.replace("\\", "/"))


def shard_groups(manifests: Sequence[Manifest]) -> tuple[ShardGroup, ...]:
    groups = []
    for m in manifests:
        hub = m.repo_id is not None
        for split in m.splits:
            files = [f for f in m.files if f.split == split]
            if not files:
                continue
            sizes = [f.size for f in files]
            groups.append(
                ShardGroup(
                    config=m.config,
                    split=split,
                    count=len(files),
                    size=sum(s for s in sizes if s is not None)
                    if all(s is not None for s in sizes)
                    else None,
                    first=_name(files[0], hub),
                    last=_name(files[-1], hub),
                )
            )
    return tuple(groups)


async def webdataset_summary(
    manifests: Sequence[Manifest],
    readers: Readers,
    *,
    samples: int = _PEEK_SAMPLES,
    options: StreamOptions | None = None,
) -> WebDatasetSummary:
    """The shard groups of ``manifests``, and the extensions of the first ``samples``
    samples of the first shard (read with ``stream``, which stops there)."""
    from ._stream import stream

    groups = shard_groups(manifests)
    first = next((m for m in manifests if m.files), None)
    if first is None:
        return WebDatasetSummary(groups, (), 0, None)
    shard = first.files[0]
    one = dataclasses.replace(
        first, files=(shard,), split=shard.split, splits={shard.split or "train": 1}
    )
    seen: dict[str, None] = {}
    count = 0
    access = readers.access
    s = stream(
        one, token=access.token, endpoint=access.endpoint, client=readers.client, options=options
    )
    async with s:
        async for sample in s:
            count += 1
            for key in sample:
                if not key.startswith("__"):
                    seen.setdefault(key, None)
            if count >= samples:
                break
    return WebDatasetSummary(groups, tuple(seen), count, _name(shard, first.repo_id is not None))


# -- brace patterns and URLs: which files are there --------------------------------------


@dataclass(frozen=True)
class Absent:
    """A file a source names that is not there, and what said so."""

    name: str  # the source string, braces expanded: a URL, an hf:// URI, a path
    reason: str  # "missing (HTTP 404)", "refused (HTTP 403)", "missing (not in the repo)"

    @property
    def short(self) -> str:
        """The last segment of the name: ``shard-003.tar``."""
        return self.name.rstrip("/").rsplit("/", 1)[-1] or self.name


@dataclass(frozen=True)
class Names:
    """The strings a source expands to: those that name files, and those that do not."""

    present: tuple[str, ...]
    absent: tuple[Absent, ...]
    sizes: Mapping[str, int]  # URL -> its size, from the answer to the check

    @property
    def count(self) -> int:
        return len(self.present) + len(self.absent)

    def sized(self, manifest: Manifest) -> Manifest:
        """``manifest`` with the sizes the check learned given to its URLs' files."""
        files = tuple(
            dataclasses.replace(f, size=self.sizes[f.url])
            if f.size is None and f.url in self.sizes
            else f
            for f in manifest.files
        )
        return dataclasses.replace(manifest, files=files)


#: Statuses that say a URL names no file (404, 410), or none we may read (401, 403: an
#: S3 bucket that may not be listed answers 403 for a key that is not there).
_MISSING = (404, 410)
_REFUSED = (401, 403)


async def check_names(source: str, readers: Readers) -> Names | None:
    """Which of the files ``source`` names are there, when its braces expand to several
    strings or it is an http(s) URL (whose size only an answer tells); None otherwise,
    and for a malformed pattern (the resolver then says what is wrong with it).

    hf:// and bucket URIs are first resolved together: one listing of the repo or bucket,
    as reading them would cost. Otherwise, or when one of them is not there, each
    string is checked by itself, ``max_concurrency`` at a time: an http(s) URL by a
    one-byte suffix read through the fetcher (the answer's ``Content-Range`` gives the
    size; a HEAD when the server ignores Range), 404/410 missing and 401/403 refused; an
    hf:// or bucket URI by resolving it alone (the repo's tree is listed once and kept; a
    bucket is listed under each key, a short answer each), missing when the listing has
    no such file; a local path (not a glob) missing when nothing is there. Any other
    failure is raised, as reading would raise it.
    """
    try:
        names = expand_braces(source)
    except SourceError:
        return None
    if len(names) == 1 and not _is_url(names[0]):
        return None
    if all(_scheme(n) not in ("", "http", "https") for n in names):
        try:  # hf:// or bucket URIs: one listing tells when every one is there
            await readers.resolver.resolve(names)
        except EntryNotFoundError:
            pass  # which are not: each by itself, below
        else:
            return Names(present=tuple(names), absent=(), sizes={})
    results: list[Absent | int | None] = [None] * len(names)
    failures: list[AiostreamError] = []
    pending = iter(enumerate(names))

    async def check() -> None:
        for i, name in pending:  # one iterator, shared by the checkers
            try:
                results[i] = await _check_name(name, readers)
            except AiostreamError as exc:
                failures.append(exc)
                tg.cancel_scope.cancel()  # the command fails with it: the rest is no use
                return

    async with anyio.create_task_group() as tg:
        for _ in range(min(len(names), readers.fetcher.options.max_concurrency)):
            tg.start_soon(check)
    if failures:
        raise failures[0]
    return Names(
        present=tuple(n for n, r in zip(names, results, strict=True) if not isinstance(r, Absent)),
        absent=tuple(r for r in results if isinstance(r, Absent)),
        sizes={n: r for n, r in zip(names, results, strict=True) if isinstance(r, int)},
    )


async def _head_size(url: str, readers: Readers) -> int | None:
    """The ``Content-Length`` of a HEAD of ``url`` (through the client, as every request),
    or None when its answer gives none."""
    answer = await readers.client.request(
        "HEAD", url, options=readers.fetcher.options, access=readers.access, error=FetchError
    )
    length = answer.response.headers.get("Content-Length", "")
    return int(length) if answer.response.status_code == 200 and length.isdigit() else None


def _lexists(path: str) -> bool:
    return os.path.lexists(os.path.expanduser(path))


def _scheme(name: str) -> str:
    scheme, sep, _ = name.partition("://")
    return scheme.lower() if sep else ""


def _is_url(name: str) -> bool:
    return _scheme(name) in ("http", "https")


async def _check_name(name: str, readers: Readers) -> Absent | int | None:
    """``Absent``, the size of a URL that is there, or None (there, size from a listing)."""
    if _is_url(name):
        try:
            _, size = await readers.fetcher.read_tail(FileRef(name, name), 1)
        except RangeMismatchError as exc:
            if exc.status != 200:
                raise
            return await _head_size(name, readers)  # it is there; its server ignores Range
        except FetchError as exc:
            if exc.status in _MISSING:
                return Absent(name, f"missing (HTTP {exc.status})")
            if exc.status in _REFUSED:
                return Absent(name, f"refused (HTTP {exc.status})")
            raise
        return size
    scheme = _scheme(name)
    if not scheme:
        if has_glob(name) or await anyio.to_thread.run_sync(_lexists, name):
            return None
        return Absent(name, "missing (no such file)")
    if scheme == "hf" or is_bucket_uri(name):
        try:
            await readers.resolver.resolve(name)
        except EntryNotFoundError:
            return Absent(name, f"missing (not in the {'repo' if scheme == 'hf' else 'bucket'})")
    return None


# -- head -------------------------------------------------------------------------------


def payload_value(key: str, value: Any) -> Any:
    """A WebDataset payload as ``head`` shows it: text-like extensions (``TEXT_EXTENSIONS``)
    decoded as webdataset's default handlers decode them (``.cls`` -> int, ``.txt`` ->
    str, ``.json`` -> its value); anything else, or a payload they cannot decode, as it is."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        return value
    extension = key.rsplit(".", 1)[-1].lower()
    decode = _TEXT_DECODERS.get(extension)
    if decode is None:
        return value
    try:
        return decode(bytes(value))
    except (ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError; deep JSON
        return value
