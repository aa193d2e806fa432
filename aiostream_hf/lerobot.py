"""LeRobot datasets (v3.0 and v2.1) streamed from the Hub, item by item, as LeRobot gives them.

::

    from aiostream_hf import lerobot

    s = lerobot.stream(
        "hf://datasets/lerobot/svla_so101_pickplace",
        delta_timestamps={"observation.images.up": [-0.1, 0.0], "action": [0.0, 1 / 30]},
    )
    async with s:
        async for item in s:
            item["observation.images.up"]         # uint8 2 x H x W x 3
            item["observation.images.up_is_pad"]  # bool (2,)
            item["action"], item["task"]

Items have the keys and values of ``LeRobotDataset.__getitem__`` (lerobot
``datasets/lerobot_dataset.py``) as numpy arrays: every column of the data
Parquet files (numpy scalars for ``shape: [1]`` features, arrays otherwise),
one entry per camera (video feature) with its frame, ``task`` (the text of
``task_index``), and with ``delta_timestamps`` a window ``T x ...`` per key with
``{key}_is_pad``. Frames are uint8 ``H x W x 3`` (RGB); ``image_format="float32"``
gives float32 ``3 x H x W`` in [0, 1] (``uint8 / 255``), as LeRobot's decoders do.
Features stored as images in the data files (``dtype: image``) are passed through as
their Parquet values (``{"bytes", "path"}``), not decoded.

The rules are LeRobot's:

- ``get_delta_indices``: ``round(delta * fps)`` rows; ``check_delta_timestamps``:
  every delta is a multiple of ``1 / fps`` within ``tolerance_s``.
- ``_get_query_indices``: the rows ``index + delta`` clamped to the episode's rows
  ``[dataset_from_index, dataset_to_index)``; ``{key}_is_pad`` is True where clamped.
- ``_get_query_timestamps``: a camera with deltas is read at the ``timestamp`` of
  the clamped rows, one without at the item's own ``timestamp``.
- ``_query_videos``: the video is read at that timestamp plus the episode's
  ``videos/{key}/from_timestamp`` (v3.0, where one MP4 holds several episodes;
  v2.1 has one file per episode, from 0), and each frame is the one nearest in
  time, which must lie within ``tolerance_s`` (else ``FrameTimestampError``).

How it reads: ``meta/info.json`` and the episodes metadata (``meta/episodes/``
Parquet without its ``stats/`` columns, or ``meta/episodes.jsonl``) and tasks once;
each data Parquet file once (only the row groups of the selected episodes), when
its first episode comes up; the frames of a batch of items through one
``VideoReader`` per video file (kept open, at most ``max_open_videos``), which
fetches only the samples from each frame's keyframe and decodes them in a worker
thread. The cameras of a batch, and batches (up to ``StreamOptions.prefetch_count``
and ``prefetch_bytes`` of frames), are fetched and decoded concurrently.

Order: episodes in dataset order, frames in order. ``shuffle`` shuffles the data
files, the episodes in each file and the frames in each episode by ``(seed,
epoch)``, then draws items at random from a buffer of ``shuffle`` (1000 for True)
pending items, which hold row numbers, not pictures. ``rank`` / ``world_size``
(default: ``RANK`` / ``WORLD_SIZE``) give each rank every ``world_size``-th episode
(every ``world_size``-th item when there are fewer episodes than ranks).

Resume: ``state_dict()`` is the exact position of the consumer (the next frame in the
order above, the shuffle buffer's row numbers and its RNG state, and a fingerprint
of the dataset); ``load_state_dict(state)`` before an iteration makes it start with
the item after the last one delivered. It reads the data rows of the episodes still
to come (and of those the buffer holds) and fetches no frame of a delivered item.
``lerobot.stream(metadata)`` streams from metadata loaded before (``load_metadata()``,
e.g. in a DataLoader's parent process): no API request is made.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import random
import re
import string
from collections import OrderedDict
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeAlias
from urllib.parse import quote

import anyio
import anyio.to_thread
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ._client import HubClient
from ._decode_pool import decoding
from ._engine import (
    Engine,
    EngineStatistics,
    ShuffleBuffer,
    as_rng_state,
    check_state,
    open_readers,
    rank_share,
    shuffle_buffer_size,
)
from ._exceptions import (
    ClosedResourceError,
    DecodeError,
    EntryNotFoundError,
    FetchError,
    FrameTimestampError,
    SourceError,
    SplitNotFoundError,
)
from ._models import FileRef
from ._options import StreamOptions
from ._prefetch import Job
from ._received import Received
from ._resolver import Resolver
from ._sources import BucketSource, HubSource, has_glob, is_bucket_uri, parse_sources
from .formats import ByteSource, ReadRequest
from .formats.parquet import DecodeBudget, ParquetDecoder, decode_units, read_footer
from .video import VideoReader, VideoStatistics

__all__ = [
    "SUPPORTED_VERSIONS",
    "EpisodeInfo",
    "LeRobotMetadata",
    "LeRobotStatistics",
    "LeRobotStream",
    "VideoSpan",
    "stream",
]

SUPPORTED_VERSIONS = ("v2.0", "v2.1", "v3.0")
"""The ``codebase_version`` values of ``meta/info.json`` that this module reads."""

ImageFormat: TypeAlias = Literal["uint8", "float32"]
Array: TypeAlias = npt.NDArray[Any]

_INFO = "meta/info.json"
_TASKS_V3 = "meta/tasks.parquet"
_EPISODES_V3 = "meta/episodes/"
_EPISODES_V2 = "meta/episodes.jsonl"
_TASKS_V2 = "meta/tasks.jsonl"
_WHOLE_READ = 4 << 20  # JSON files are read with one suffix request of this many bytes
_BATCH_ITEMS = 16  # items whose frames are fetched with one request per video file
_SHUFFLE_BUFFER = 1000
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SPLIT_RANGE = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")
_STATE_VERSION = 1
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


@dataclass(frozen=True, kw_only=True)
class LeRobotStatistics(EngineStatistics):
    """What a LeRobot stream did so far.

    items / episodes / data_files: delivered items, episodes started, data files read.
    videos_opened / videos_evicted: VideoReaders opened, and closed to stay within
        ``max_open_videos``.
    video: the summed ``VideoStatistics`` counters of every reader (index and frame
        requests and bytes, packets decoded, decoder starts and reuses).
    fetcher / resolver / client / max_prefetched...: as every stream (``EngineStatistics``).
    """

    items: int
    episodes: int
    data_files: int
    videos_opened: int
    videos_evicted: int
    time_to_first_item: float | None
    video: Mapping[str, int] = field(default_factory=dict)


# -- the public call --------------------------------------------------------------------


def stream(
    repo: str | os.PathLike[str] | LeRobotMetadata,
    *,
    delta_timestamps: Mapping[str, Sequence[float]] | None = None,
    tolerance_s: float = 1e-4,
    episodes: Sequence[int] | None = None,
    image_format: ImageFormat = "uint8",
    split: str | None = "train",
    shuffle: bool | int | None = None,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    batch_items: int = _BATCH_ITEMS,
    max_open_videos: int = 16,
    options: StreamOptions | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    client: HubClient | None = None,
) -> LeRobotStream:
    """A lazy stream of the items of a LeRobot dataset; nothing is read until iteration.

    ``repo`` is ``hf://datasets/ORG/NAME[@REVISION]``, an ``s3://BUCKET/PREFIX/`` folder
    (listed once), a local dataset folder, or the ``LeRobotMetadata`` of one, loaded
    before (then no API request is made).
    ``episodes`` selects episodes by ``episode_index``; ``split`` picks the episode
    range that ``meta/info.json`` gives it (``"train": "0:50"``; None for every
    episode). ``batch_items`` items share one frame request per video file.
    ``client``: the ``HubClient`` to read through (default: the event loop's shared one).
    See the module docstring for the items, the order and the rules.
    """
    return LeRobotStream(
        repo,
        delta_timestamps=delta_timestamps,
        tolerance_s=tolerance_s,
        episodes=episodes,
        image_format=image_format,
        split=split,
        shuffle=shuffle,
        seed=seed,
        rank=rank,
        world_size=world_size,
        batch_items=batch_items,
        max_open_videos=max_open_videos,
        options=options,
        token=token,
        endpoint=endpoint,
        client=client,
    )


def _parse_repo(repo: object) -> HubSource | BucketSource | Path:
    if isinstance(repo, str) and is_bucket_uri(repo):
        sources = parse_sources(repo)
        bucket = sources[0] if len(sources) == 1 else None
        if not isinstance(bucket, BucketSource) or has_glob(bucket.key):
            raise SourceError(
                f"{repo!r} is not one LeRobot dataset: give its folder, s3://BUCKET/PREFIX/"
            )
        folder = bucket.key.strip("/")
        return BucketSource(bucket.bucket, f"{folder}/" if folder else "", bucket.scheme)
    if isinstance(repo, str) and repo.startswith("hf://"):
        sources = parse_sources(repo)
        found = sources[0] if len(sources) == 1 else None
        if not isinstance(found, HubSource) or (found.path is not None and has_glob(found.path)):
            raise SourceError(
                f"{repo!r} is not one LeRobot dataset: give hf://datasets/ORG/NAME[@REVISION]"
            )
        return found
    if not isinstance(repo, (str, os.PathLike)):
        raise SourceError(
            f"cannot read {repo!r} as a LeRobot dataset: give hf://datasets/ORG/NAME or a folder"
        )
    text = os.fspath(repo)
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", text):
        raise SourceError(
            f"cannot read {text!r} as a LeRobot dataset: give hf://datasets/ORG/NAME[@REVISION], "
            "s3://BUCKET/PREFIX/ or a local folder"
        )
    path = Path(text).expanduser()
    if path.is_dir():
        return path.resolve()
    if _REPO_ID.match(text):
        raise SourceError(f"no folder {text!r}: for the Hub dataset, give 'hf://datasets/{text}'")
    raise SourceError(f"no LeRobot dataset folder at {text!r}: check the path")


def _check_deltas(deltas: object) -> dict[str, tuple[float, ...]] | None:
    if deltas is None:
        return None
    if not isinstance(deltas, Mapping) or not deltas:
        raise SourceError(
            f"delta_timestamps={deltas!r}: give a dict of feature -> list of seconds, "
            'e.g. {"action": [0.0, 0.1]}'
        )
    checked: dict[str, tuple[float, ...]] = {}
    for key, values in deltas.items():
        if (
            not isinstance(key, str)
            or isinstance(values, (str, bytes))
            or not isinstance(values, Sequence)
            or not values
        ):
            raise SourceError(
                f"delta_timestamps[{key!r}]={values!r}: give a non-empty list of seconds"
            )
        numbers: list[float] = []
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise SourceError(f"delta_timestamps[{key!r}] holds {v!r}: not a finite number")
            numbers.append(float(v))
        checked[key] = tuple(numbers)
    return checked


class LeRobotStream(Engine["_Batch"]):
    """A lazy stream of LeRobot items: async-iterable, sync-iterable, closable. See ``stream``.

    The engine (``_engine.Engine``) gives its life and iteration, and the order, rank
    share, shuffle buffer and state checks every stream shares; this class plans
    episodes into batches of items and assembles them (data rows and video frames)."""

    _kind = "LeRobot stream"
    _again = "call lerobot.stream() again"

    def __init__(
        self,
        repo: str | os.PathLike[str] | LeRobotMetadata,
        *,
        delta_timestamps: Mapping[str, Sequence[float]] | None,
        tolerance_s: float,
        episodes: Sequence[int] | None,
        image_format: ImageFormat,
        split: str | None,
        shuffle: bool | int | None,
        seed: int,
        rank: int | None,
        world_size: int | None,
        batch_items: int,
        max_open_videos: int,
        options: StreamOptions | None,
        token: str | None,
        endpoint: str | None,
        client: HubClient | None = None,
    ) -> None:
        if image_format not in ("uint8", "float32"):
            raise SourceError(
                f"image_format={image_format!r}: use 'uint8' (H x W x 3) or "
                "'float32' (3 x H x W in [0, 1], as LeRobot)"
            )
        if isinstance(tolerance_s, bool) or not (
            isinstance(tolerance_s, (int, float)) and tolerance_s >= 0
        ):
            raise SourceError(f"tolerance_s={tolerance_s!r}: must be a number >= 0")
        buffer = shuffle_buffer_size(shuffle, _SHUFFLE_BUFFER)
        if episodes is not None:
            if isinstance(episodes, (str, bytes)) or not isinstance(episodes, Sequence):
                raise SourceError(f"episodes={episodes!r}: give a list of episode indices")
            if not episodes or not all(
                isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in episodes
            ):
                raise SourceError(
                    f"episodes={episodes!r}: give a non-empty list of episode indices >= 0"
                )
        for name, value in (("batch_items", batch_items), ("max_open_videos", max_open_videos)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SourceError(f"{name}={value!r}: must be an integer >= 1")
        if split is not None and not isinstance(split, str):
            raise SourceError(f"split={split!r}: give a split name or None")
        self._meta: LeRobotMetadata | None = None
        self._source: HubSource | BucketSource | Path | None = None
        if isinstance(repo, LeRobotMetadata):
            self._meta = repo  # loaded elsewhere (e.g. in a DataLoader's parent process)
            if endpoint is None:
                endpoint = repo.endpoint
        else:
            self._source = _parse_repo(repo)
        super().__init__(
            shuffle_buffer=buffer,
            seed=seed,
            rank=rank,
            world_size=world_size,
            options=options,
            token=token,
            endpoint=endpoint,
            client=client,
        )
        self._deltas = _check_deltas(delta_timestamps)
        self._tolerance = float(tolerance_s)
        self._episodes = None if episodes is None else tuple(dict.fromkeys(episodes))
        self._image_format: ImageFormat = image_format
        self._split = split
        self._batch_items = batch_items
        self._max_open = max_open_videos
        self._pool: _ReaderPool | None = None
        self._video_totals: dict[str, int] = {"opened": 0, "evicted": 0}
        self._items = self._episodes_started = self._data_files = 0
        self._resume: dict[str, Any] | None = None  # the cursor to start the next iteration at
        self._loaded: dict[str, Any] | None = None  # a loaded state, until an item is delivered
        self._position: tuple[_Checkpoint, int] | None = None  # (checkpoint, items after it)
        self._fingerprint: dict[str, Any] | None = None

    # -- lifecycle: the engine's --------------------------------------------------------

    @property
    def metadata(self) -> LeRobotMetadata | None:
        """The dataset's metadata, once an iteration (or ``load_metadata``) has read it."""
        return self._meta

    async def load_metadata(self) -> LeRobotMetadata:
        """Read (once) and return the dataset's metadata."""
        self._check_open()
        if self._meta is None:
            async with open_readers(
                self._options, token=self._token, endpoint=self._endpoint, client=self._client
            ) as readers:
                root = await self._root(readers.resolver)
                self._meta = await _load_metadata(root, readers.fetcher)
        return self._meta

    def statistics(self) -> LeRobotStatistics:
        totals = dict(self._video_totals)
        if self._pool is not None:
            _merge_counts(totals, self._pool.counts())
        opened, evicted = totals.pop("opened"), totals.pop("evicted")
        video = totals
        return LeRobotStatistics(
            items=self._items,
            episodes=self._episodes_started,
            data_files=self._data_files,
            videos_opened=opened,
            videos_evicted=evicted,
            time_to_first_item=self._first_sample,
            video=video,
            **self._engine_statistics(),
        )

    # -- resume ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The exact position of this stream: load it into a new stream to go on from here.

        ``cursor`` holds the next frame to consider in this rank's order (data file
        group, episode, frame), the items of the sequence before it (``seq``, for
        item-level rank splits), the shuffle buffer as ``[episode_index, frame]``
        pairs and its RNG state, and ``skip``: the items after that point that were
        delivered already. ``dataset`` fingerprints the episodes read (and the commit),
        so that a state is not loaded into another dataset. JSON-able and small: the
        buffer holds row numbers, not pictures.
        """
        cursor: dict[str, Any] | None
        if self._position is not None:
            checkpoint, skip = self._position
            cursor, dataset = checkpoint.to_state(skip), self._fingerprint
        elif self._loaded is not None:  # loaded, and no item delivered since
            cursor, dataset = self._loaded.get("cursor"), self._loaded.get("dataset")
        else:
            cursor, dataset = None, self._fingerprint
        return {
            "version": _STATE_VERSION,
            "kind": "lerobot",
            "epoch": self._epoch,
            "seed": self._seed,
            "rank": self._rank,
            "world_size": self._world_size,
            "shuffle": self._shuffle_buffer,
            "dataset": dataset,
            "cursor": cursor,
            "items": self._items,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue, on the next iteration, with the item after the last one ``state`` saw.

        A state saved with other ``seed``, ``rank``, ``world_size`` or ``shuffle``, or
        over other episodes (another dataset, revision, split or selection), is
        refused with ``SourceError`` (the dataset is checked here when the metadata is
        loaded already, else when the iteration has read it).
        """
        check_state(
            state,
            version=_STATE_VERSION,
            kind="lerobot",
            same={
                "seed": self._seed,
                "rank": self._rank,
                "world_size": self._world_size,
                "shuffle": self._shuffle_buffer,
            },
        )
        if self._meta is not None and state.get("dataset") is not None:
            _check_dataset(_fingerprint(self._build_plan()), state["dataset"])
        self._epoch = int(state["epoch"])
        self._resume = dict(state)
        self._loaded = dict(state)
        self._position = None
        self._items = int(state.get("items", 0))

    def _build_plan(self) -> _Plan:
        assert self._meta is not None
        return _Plan.build(
            self._meta,
            deltas=self._deltas,
            tolerance_s=self._tolerance,
            episodes=self._episodes,
            split=self._split,
            image_format=self._image_format,
        )

    # -- iteration ---------------------------------------------------------------------

    def _begin(self) -> dict[str, Any] | None:
        """An iteration starts (on the consumer's side): the state it resumes from, if any."""
        resume, self._resume = self._resume, None
        self._position = None
        if resume is None:
            self._loaded = None
        return resume

    def _shape_unit(self, batch: _Batch) -> Iterator[dict[str, Any]]:
        """The items of a batch; the position moves as each one is taken."""
        last = len(batch.items) - 1
        for i, item in enumerate(batch.items):
            self._position = (batch.end, 0) if i == last else (batch.start, batch.first + i + 1)
            self._left = last - i
            yield self._emit(item)

    def _emit(self, item: Any) -> Any:
        self._items += 1
        return super()._emit(item)

    async def _root(self, resolver: Resolver) -> _Root:
        assert self._source is not None  # no metadata given: the stream has a source
        if isinstance(self._source, Path):
            return await anyio.to_thread.run_sync(_local_root, self._source)
        if isinstance(self._source, BucketSource):
            return await _bucket_root(self._source, resolver)
        return await _hub_root(self._source, resolver)

    async def _loaded_units(self, resume: Mapping[str, Any] | None) -> AsyncGenerator[_Batch, None]:
        """Items in batches: metadata, then data files and frames, read ahead."""
        opts = self._options
        async with self._reading(
            opts, token=self._token, endpoint=self._endpoint, client=self._client
        ) as readers:
            resolver, fetcher = readers.resolver, readers.fetcher
            if self._meta is None:
                self._meta = await _load_metadata(await self._root(resolver), fetcher)
            plan = self._build_plan()
            fingerprint = _fingerprint(plan)
            if resume is not None and resume.get("dataset") is not None:
                _check_dataset(fingerprint, resume["dataset"])
            self._fingerprint = fingerprint
            cursor = resume.get("cursor") if resume is not None else None
            pool = self._pool = _ReaderPool(fetcher, self._max_open)
            try:
                ahead = self._read_ahead(self._jobs(plan, fetcher, pool, cursor), opts)
                try:
                    async for batch in ahead:
                        yield batch
                finally:
                    await ahead.aclose()  # on this task, which holds its scopes
            finally:
                with anyio.CancelScope(shield=True):
                    await pool.aclose()
                _merge_counts(self._video_totals, pool.counts())
                if self._pool is pool:
                    self._pool = None

    def _order(self, plan: _Plan) -> list[list[EpisodeInfo]]:
        """This rank's episodes grouped by data file, in reading order."""
        chosen, _ = rank_share(plan.episodes, self._rank, self._world_size)
        groups: dict[str, list[EpisodeInfo]] = {}
        for episode in chosen:
            groups.setdefault(episode.data_file.url, []).append(episode)
        order = list(groups.values())
        if self._shuffle_buffer:
            rng = random.Random(f"{self._seed}:{self._epoch}:episodes")
            rng.shuffle(order)
            for group in order:
                rng.shuffle(group)
        return order

    def _frames(self, episode: EpisodeInfo) -> list[int]:
        """The episode's frames in reading order: shuffled by (seed, epoch, episode), the
        same on every rank (a rank keeps every world_size-th item of one sequence)."""
        positions = list(range(episode.length))
        if self._shuffle_buffer:
            random.Random(f"{self._seed}:{self._epoch}:frames:{episode.index}").shuffle(positions)
        return positions

    async def _jobs(
        self,
        plan: _Plan,
        fetcher: ByteSource,
        pool: _ReaderPool,
        cursor: Mapping[str, Any] | None,
    ) -> AsyncIterator[Job[_Batch]]:
        """Batches of items to assemble, in delivery order (runs ahead of the consumer).

        Each batch carries the checkpoints before and after it. A resume starts at a
        checkpoint (loading the data rows of the buffer's episodes and of the rest of
        the current data file) and drops the ``skip`` items delivered after it before
        any of their frames is fetched.
        """
        order = self._order(plan)
        _, split_items = rank_share(plan.episodes, self._rank, self._world_size)
        # The buffer holds row numbers, not pictures; its draws differ per rank; its
        # state is saved with every checkpoint.
        shuffle: ShuffleBuffer[_Row] | None = None
        if self._shuffle_buffer:
            seed = f"{self._seed}:{self._epoch}:buffer:{self._rank}"
            shuffle = ShuffleBuffer(self._shuffle_buffer, seed)
        g0 = e0 = f0 = seq = skip = 0
        preloaded: dict[int, _EpisodeRows] = {}
        if cursor is not None:
            g0, e0, f0, seq, skip, pending, rng_state = _parse_cursor(cursor, order)
            by_index = {e.index: e for e in plan.episodes}
            wanted = {e: by_index[e] for e, _ in pending if e in by_index}
            if len(wanted) < len({e for e, _ in pending}):
                raise SourceError(
                    "state's shuffle buffer holds episodes that this stream does not read: "
                    "resume with the same dataset and selection"
                )
            if g0 < len(order):
                wanted.update((e.index, e) for e in order[g0][e0:])
            preloaded, files = await _load_rows(fetcher, plan, wanted.values())
            self._data_files += files
            if shuffle is not None:
                shuffle.restore([_Row(preloaded[e], pos) for e, pos in pending], rng_state)

        def checkpoint(g: int, e: int, f: int) -> _Checkpoint:
            if shuffle is None:
                return _Checkpoint(g, e, f, seq)
            held, rng_state = shuffle.state()
            return _Checkpoint(g, e, f, seq, tuple(held), rng_state)

        start = checkpoint(g0, e0, f0)
        batch: list[_Row] = []

        def cut(end: _Checkpoint) -> Job[_Batch] | None:
            nonlocal batch, skip, start
            drop = min(skip, len(batch))
            rows, first, before = batch[drop:], drop, start
            skip -= drop
            batch, start = [], end
            if not rows:
                return None
            job = plan.job(rows, pool)

            async def run() -> _Batch:
                return _Batch(await job.run(), before, first, end)

            return Job(job.cost, run)

        for g in range(g0, len(order)):
            group = order[g]
            e_first = e0 if g == g0 else 0
            if g == g0 and cursor is not None:
                rows = preloaded
            else:
                rows = await _load_episodes(fetcher, plan, group)
                self._data_files += 1
            for e in range(e_first, len(group)):
                episode = group[e]
                data = rows[episode.index]
                self._episodes_started += 1
                positions = self._frames(episode)
                for f in range(f0 if (g, e) == (g0, e0) else 0, episode.length):
                    seq += 1
                    if split_items and (seq - 1) % self._world_size != self._rank:
                        continue
                    row = _Row(data, positions[f])
                    if shuffle is not None:
                        out = shuffle.push(row)
                        if out is None:
                            continue
                        row = out
                    batch.append(row)
                    if len(batch) == self._batch_items:
                        job = cut(checkpoint(*_following(order, g, e, f)))
                        if job is not None:
                            yield job
        # The buffer drains with one draw per item, so a checkpoint mid-drain resumes it.
        for row in shuffle.drain() if shuffle is not None else ():
            batch.append(row)
            if len(batch) == self._batch_items:
                job = cut(checkpoint(len(order), 0, 0))
                if job is not None:
                    yield job
        if batch:
            job = cut(checkpoint(len(order), 0, 0))
            if job is not None:
                yield job


@dataclass(frozen=True)
class _Checkpoint:
    """Where the producer of items stands: the next frame to consider (data file group,
    episode, frame, in this rank's order), the items of the sequence before it, and
    the shuffle buffer with its RNG state."""

    group: int
    episode: int
    frame: int
    seq: int
    buffer: tuple[_Row, ...] = ()
    rng: tuple[Any, ...] | None = None

    def to_state(self, skip: int) -> dict[str, Any]:
        return {
            "group": self.group,
            "episode": self.episode,
            "frame": self.frame,
            "seq": self.seq,
            "skip": skip,
            "buffer": [[row.episode.info.index, row.pos] for row in self.buffer],
            "rng": self.rng,
        }


@dataclass(frozen=True)
class _Batch:
    """Assembled items, the checkpoint before them (``first`` items after it were dropped
    on a resume) and the one after them."""

    items: list[dict[str, Any]]
    start: _Checkpoint
    first: int
    end: _Checkpoint


def _following(
    order: Sequence[Sequence[EpisodeInfo]], g: int, e: int, f: int
) -> tuple[int, int, int]:
    """The position after frame ``f`` of episode ``e`` of group ``g`` (past empty episodes)."""
    f += 1
    while g < len(order):
        if e >= len(order[g]):
            g, e, f = g + 1, 0, 0
        elif f >= order[g][e].length:
            e, f = e + 1, 0
        else:
            return g, e, f
    return len(order), 0, 0


def _parse_cursor(
    cursor: Mapping[str, Any], order: Sequence[Sequence[EpisodeInfo]]
) -> tuple[int, int, int, int, int, list[tuple[int, int]], tuple[Any, ...] | None]:
    """A saved cursor, checked against this rank's order."""
    try:
        g, e, f, seq, skip = (int(cursor[k]) for k in ("group", "episode", "frame", "seq", "skip"))
        pending = [(int(ep), int(pos)) for ep, pos in cursor.get("buffer") or ()]
        saved_rng = cursor.get("rng")
        rng = None if saved_rng is None else as_rng_state(saved_rng)
    except (KeyError, TypeError, ValueError) as exc:
        raise SourceError(
            f"state's cursor is not a LeRobot stream's ({type(exc).__name__}: {exc}): load the "
            "state_dict() of a LeRobot stream"
        ) from exc
    inside = g < len(order) and 0 <= e < len(order[g]) and 0 <= f <= order[g][e].length
    if min(g, e, f, seq, skip) < 0 or not (inside or (g, e, f) == (len(order), 0, 0)):
        raise SourceError(
            f"state's cursor (data file group {g}, episode {e}, frame {f}) is not a position "
            "of this stream: resume with the same dataset and arguments"
        )
    return g, e, f, seq, skip, pending, rng


def _fingerprint(plan: _Plan) -> dict[str, Any]:
    """What a state's positions refer to: the episodes read, their rows and data files
    (the last two URL segments and the size), and the commit."""
    episodes = [
        [
            e.index,
            e.length,
            e.dataset_from_index,
            "/".join(e.data_file.url.rsplit("/", 2)[-2:]),
            e.data_file.size,
        ]
        for e in plan.episodes
    ]
    text = json.dumps([plan.meta.commit, episodes])
    return {
        "source": plan.meta.source,
        "commit": plan.meta.commit,
        "episodes": len(episodes),
        "frames": sum(e.length for e in plan.episodes),
        "digest": hashlib.sha256(text.encode()).hexdigest()[:16],
    }


def _check_dataset(mine: Mapping[str, Any], saved: Mapping[str, Any]) -> None:
    if saved.get("digest") == mine["digest"]:
        return

    def describe(fp: Mapping[str, Any]) -> str:
        at = f" at commit {fp.get('commit')}" if fp.get("commit") else ""
        return f"{fp.get('source')}{at} ({fp.get('episodes')} episodes, {fp.get('frames')} frames)"

    raise SourceError(
        f"state was saved over another dataset or selection: {describe(saved)}, but this "
        f"stream reads {describe(mine)}: resume with the same dataset, revision, split and "
        "episodes (pin the revision, hf://datasets/ORG/NAME@COMMIT, so that it cannot move)"
    )


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
    files = {f.path[len(prefix) :]: f for f in manifest.files if f.path.startswith(prefix)}
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


async def _read_whole(source: ByteSource, file: FileRef) -> bytes:
    data, size = await source.read_tail(file, _WHOLE_READ)
    if size > len(data):
        (head,) = await source.read_ranges(file, [(0, size - len(data))])
        data = head + data
    return data


async def _read_meta_file(source: ByteSource, root: _Root, path: str, what: str) -> bytes:
    file = root.file(path)
    if file is None:
        raise EntryNotFoundError(f"{root.label} has no {path}: {what}")
    try:
        return await _read_whole(source, file)
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
) -> pa.Table:
    """A Parquet file's selected columns (``keep(names)`` picks them), read with one tail
    read plus one request for the bytes of their row groups the tail does not hold.

    Read by the stream's Parquet decoder, with its checks: the table is read whole, so
    its row groups together must not surely decode past the larger of _MAX_TABLE_BYTES
    and _MAX_TABLE_EXPANSION times the file (their flat floor at the plan, and the values
    their list columns' pages announce before decoding)."""
    received = Received(source)
    footer, _, _ = await read_footer(received, file, file.path)
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

    return await anyio.to_thread.run_sync(decode)


def _json(data: bytes, path: str, label: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:  # not UTF-8, not JSON, or a number of over 4300 digits
        raise DecodeError(f"{label}: {path} is not JSON: {exc}") from exc


def _jsonl(data: bytes, path: str, label: str) -> list[dict[str, Any]]:
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
        indices = [int(i) for i in table.column("task_index").to_pylist()]
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
        results[i] = await _read_parquet(source, file, keep=keep)

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
                    float(_need(row, f"videos/{key}/from_timestamp", where)),
                    float(_need(row, f"videos/{key}/to_timestamp", where)),
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
                    tasks=tuple(str(t) for t in row.get("tasks") or ()),
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
                tasks=tuple(str(t) for t in row.get("tasks") or ()),
                dataset_from_index=start,
                dataset_to_index=start + length,
                data_file=_data_file(root, data, e),
                videos=videos,
            )
        )
        start += length
    return tasks, episodes


# -- the plan: selection and the rules --------------------------------------------------


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


@dataclass(frozen=True)
class _Plan:
    """What to read and how: selected episodes, data columns, LeRobot's delta indices."""

    meta: LeRobotMetadata
    episodes: tuple[EpisodeInfo, ...]
    columns: tuple[str, ...]
    delta_indices: Mapping[str, npt.NDArray[np.int64]] | None
    tolerance_s: float
    image_format: ImageFormat
    frame_bytes: Mapping[str, int]  # estimated bytes of one frame per camera, as delivered

    @classmethod
    def build(
        cls,
        meta: LeRobotMetadata,
        *,
        deltas: Mapping[str, tuple[float, ...]] | None,
        tolerance_s: float,
        episodes: Sequence[int] | None,
        split: str | None,
        image_format: ImageFormat,
    ) -> _Plan:
        label = meta.source
        selected = list(meta.episodes)
        if split is not None:
            splits = meta.info.get("splits") or {}
            if split in splits:
                match = _SPLIT_RANGE.match(str(splits[split]))
                if match is None:
                    raise DecodeError(
                        f"{label} {_INFO}: split {split!r} is {splits[split]!r}, not 'start:end'"
                    )
                lo, hi = int(match.group(1)), int(match.group(2))
                selected = [e for e in selected if lo <= e.index < hi]
            elif splits or split != "train":
                names = ", ".join(sorted(splits)) or "train (every episode)"
                raise SplitNotFoundError(f"no split {split!r} in {label}: splits are {names}")
        if episodes is not None:
            by_index = {e.index: e for e in selected}
            missing = [e for e in episodes if e not in by_index]
            if missing:
                within = f" of split {split!r}" if split is not None else ""
                raise SourceError(
                    f"episodes {missing} are not episodes{within} of {label}: it has "
                    f"{_describe_indices(sorted(by_index))}"
                )
            wanted = set(episodes)
            selected = [e for e in selected if e.index in wanted]
        delta_indices: dict[str, npt.NDArray[np.int64]] | None = None
        if deltas is not None:
            unknown = [k for k in deltas if k not in meta.features]
            if unknown:
                raise SourceError(
                    f"delta_timestamps keys {unknown} are not features of {label}: features "
                    f"are {', '.join(meta.features)}"
                )
            fps = meta.fps
            off = {
                k: [d for d in v if abs(d * fps - round(d * fps)) / fps > tolerance_s]
                for k, v in deltas.items()
            }
            off = {k: v for k, v in off.items() if v}
            if off:
                raise SourceError(
                    f"delta_timestamps {off} are not multiples of 1/{fps:g} s within "
                    f"tolerance_s={tolerance_s} (LeRobot's check_delta_timestamps)"
                )
            delta_indices = {
                k: np.array([round(d * fps) for d in v], dtype=np.int64) for k, v in deltas.items()
            }
        frame_bytes = {}
        for key in meta.video_keys:
            shape = meta.features[key].get("shape") or [480, 640, 3]
            try:
                n = int(np.prod([int(s) for s in shape]))
            except (TypeError, ValueError):
                n = 480 * 640 * 3
            frame_bytes[key] = n * (4 if image_format == "float32" else 1)
        return cls(
            meta=meta,
            episodes=tuple(selected),
            columns=meta.data_keys,
            delta_indices=delta_indices,
            tolerance_s=tolerance_s,
            image_format=image_format,
            frame_bytes=frame_bytes,
        )

    def job(self, rows: list[_Row], pool: _ReaderPool) -> Job[list[dict[str, Any]]]:
        """A batch of items, assembled when the job runs; its cost is its frames' bytes."""
        windows = {k: len(v) for k, v in (self.delta_indices or {}).items()}
        cost = len(rows) * sum(n * windows.get(k, 1) for k, n in self.frame_bytes.items())
        batch = list(rows)

        async def run() -> list[dict[str, Any]]:
            return await _assemble(self, batch, pool)

        return Job(max(cost, 1), run)


def _describe_indices(indices: Sequence[int]) -> str:
    if not indices:
        return "no episodes"
    if indices == list(range(indices[0], indices[-1] + 1)):
        return f"episodes {indices[0]}-{indices[-1]}"
    shown = ", ".join(map(str, indices[:20]))
    return f"episodes {shown}" + (", ..." if len(indices) > 20 else "")


# -- data rows --------------------------------------------------------------------------


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
    return await anyio.to_thread.run_sync(_split_episodes, table, group, file, label)


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


# -- frames -----------------------------------------------------------------------------


async def _assemble(plan: _Plan, rows: list[_Row], pool: _ReaderPool) -> list[dict[str, Any]]:
    """The items of ``rows``: data windows, then every camera's frames, fetched at once."""
    meta = plan.meta
    deltas = plan.delta_indices or {}
    positions: list[dict[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]]] = []
    for row in rows:
        length = row.episode.info.length
        per_key = {}
        for key, delta in deltas.items():
            wanted = row.pos + delta
            per_key[key] = (np.clip(wanted, 0, length - 1), (wanted < 0) | (wanted >= length))
        positions.append(per_key)

    # Every camera's timestamps, grouped by video file.
    requests: dict[tuple[str, str], list[tuple[int, npt.NDArray[np.float64]]]] = {}
    files: dict[tuple[str, str], FileRef] = {}
    for i, row in enumerate(rows):
        episode = row.episode
        for key in meta.video_keys:
            if episode.timestamps is None:
                raise DecodeError(
                    f"{meta.source}: {episode.info.data_file.path} has no 'timestamp' column, "
                    f"needed to read the {key} video"
                )
            picked = positions[i][key][0] if key in deltas else np.array([row.pos])
            span = episode.info.videos[key]
            # LeRobot: from_timestamp + the float32 timestamp of each (clamped) row.
            query = span.from_timestamp + episode.timestamps[picked]
            group = (key, span.file.url)
            requests.setdefault(group, []).append((i, query))
            files[group] = span.file

    frames: dict[tuple[str, str], tuple[npt.NDArray[np.float64], npt.NDArray[np.uint8]]] = {}
    # Taken before the first checkpoint, so in the order the batches began: each file's
    # reader serves the batches in that order, and its decoder goes on forward.
    tickets = {group: pool.take_turn(file) for group, file in files.items()}

    async def fetch(group: tuple[str, str]) -> None:
        entries = requests[group]
        # Sorted, repeats dropped (np.unique would import numpy.ma: ~8 ms in a new process).
        unique = np.sort(np.concatenate([q for _, q in entries]))
        unique = unique[np.diff(unique, prepend=np.nan) != 0]
        async with pool.use(files[group], tickets[group]) as reader:
            try:  # LeRobot's rule (strict): the nearest frame, within tolerance_s of t
                got = await reader.frames_at(unique, tolerance_s=plan.tolerance_s)
            except FrameTimestampError as exc:
                raise _explain(plan, group[0], reader, rows, entries, exc) from exc
        frames[group] = (unique, got.data)

    try:
        await _all([functools.partial(fetch, group) for group in requests])
    finally:
        for group, ticket in tickets.items():  # a fetch that never ran gives its turn up
            pool.done(files[group], ticket)

    def build() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = [{} for _ in rows]
        for group, entries in requests.items():
            key = group[0]
            unique, data = frames[group]
            for i, query in entries:
                picked = data[np.searchsorted(unique, query)]
                if plan.image_format == "float32":
                    picked = np.ascontiguousarray(
                        np.moveaxis(picked.astype(np.float32) / np.float32(255), -1, -3)
                    )
                items[i][key] = picked if key in deltas else picked[0]
        for i, row in enumerate(rows):
            item = items[i]
            columns = row.episode.columns
            for name, values in columns.items():
                item[name] = values[positions[i][name][0]] if name in deltas else values[row.pos]
            for key in deltas:
                item[f"{key}_is_pad"] = positions[i][key][1]
            task_index = row.episode.task_index
            if task_index is not None:
                t = int(task_index[row.pos])
                task = meta.tasks.get(t)
                if task is None:
                    raise DecodeError(
                        f"{meta.source}: task_index {t} (episode {row.episode.info.index}) is "
                        "not in the tasks metadata"
                    )
                item["task"] = task
        return items

    return await anyio.to_thread.run_sync(build)


def _explain(
    plan: _Plan,
    key: str,
    reader: VideoReader,
    rows: list[_Row],
    entries: list[tuple[int, npt.NDArray[np.float64]]],
    exc: FrameTimestampError,
) -> FrameTimestampError:
    """The error of a frame request, naming the item and the episode it comes from."""
    pts = reader.pts
    duration = reader.duration
    for i, query in entries:
        for t in query.tolist():
            j = int(np.clip(np.searchsorted(pts, t), 1, max(1, len(pts) - 1)))
            near = min(pts[j - 1 : j + 1].tolist(), key=lambda p: abs(p - t)) if len(pts) else None
            inside = 0.0 <= t <= duration + 1e-9
            if near is not None and inside and abs(near - t) <= plan.tolerance_s:
                continue
            row = rows[i]
            span = row.episode.info.videos[key]
            what = (
                f"is outside the video, which spans [0, {duration:.6f}]s"
                if not inside
                else f"has no frame within tolerance_s={plan.tolerance_s}: the nearest is at "
                f"{near!r}s"
            )
            return FrameTimestampError(
                f"{plan.meta.source}: {key} of episode {row.episode.info.index} (row "
                f"{row.episode.info.dataset_from_index + row.pos}, frame {row.pos}): timestamp "
                f"{t!r}s in {span.file.path} {what}; the episode spans "
                f"[{span.from_timestamp}, {span.to_timestamp}]s of that file ({exc})"
            )
    return FrameTimestampError(f"{plan.meta.source}: {key}: {exc}")


# -- video readers ----------------------------------------------------------------------


class _Entry:
    __slots__ = ("failed", "ready", "reader", "users")

    def __init__(self, reader: VideoReader) -> None:
        self.reader = reader
        self.users = 0
        self.ready = anyio.Event()
        self.failed = False


class _Turns:
    """The order in which batches call one file's reader: the order they began in (the
    prefetcher begins jobs in order), whichever task the backend runs first. A batch
    out of turn would find the decoder past its frames and fetch their GOP again."""

    __slots__ = ("_changed", "_done", "serving", "taken")

    def __init__(self) -> None:
        self.taken = 0  # tickets handed out
        self.serving = 0  # the ticket whose turn it is
        self._done: set[int] = set()
        self._changed = anyio.Event()

    def take(self) -> _Ticket:
        self.taken += 1
        return _Ticket(self, self.taken - 1)

    async def wait(self, number: int) -> None:
        while self.serving < number:
            await self._changed.wait()

    def done(self, number: int) -> None:
        self._done.add(number)
        if self.serving not in self._done:
            return
        while self.serving in self._done:
            self._done.remove(self.serving)
            self.serving += 1
        self._changed.set()
        self._changed = anyio.Event()

    @property
    def idle(self) -> bool:
        """Every ticket handed out is done."""
        return self.serving == self.taken


class _Ticket:
    """A place in a file's ``_Turns``; ``done`` once used or given up (a second call is a
    no-op)."""

    __slots__ = ("number", "turns", "used")

    def __init__(self, turns: _Turns, number: int) -> None:
        self.turns = turns
        self.number = number
        self.used = False

    async def wait(self) -> None:
        await self.turns.wait(self.number)

    def done(self) -> None:
        if not self.used:
            self.used = True
            self.turns.done(self.number)


_COUNTERS = tuple(
    f.name for f in fields(VideoStatistics) if f.name not in ("indexed", "fallback_reason")
)


class _ReaderPool:
    """Open VideoReaders by file, shared by concurrent users, at most ``limit`` idle ones kept
    (least recently used first out). A file is opened once even when asked for at once.

    One reader per file keeps its decoder going forward from batch to batch; the cameras
    (files) of a batch, and the batches of different files, decode concurrently. (Two
    readers per file, alternating batches, measured no faster on 2 cores: decoding is
    already spread over the cameras, and each batch then restarts at a keyframe.)
    """

    def __init__(self, source: ByteSource, limit: int) -> None:
        self._source = source
        self._limit = limit
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._turns: dict[str, _Turns] = {}  # of the files with a ticket not done
        self._closed_counts: dict[str, int] = {}
        self._closed = False
        self.opened = 0
        self.evicted = 0

    def counts(self) -> dict[str, int]:
        """Readers opened and evicted, and the summed statistics of every reader."""
        counts = {**self._closed_counts, "opened": self.opened, "evicted": self.evicted}
        for entry in self._entries.values():
            if entry.ready.is_set() and not entry.failed:
                _add_counts(counts, entry.reader.statistics())
        return counts

    def take_turn(self, file: FileRef) -> _Ticket:
        """A ticket for ``use``: the callers of one file's reader get it in the order they
        took their tickets. Every ticket must be done, used (``use`` does it) or not."""
        turns = self._turns.get(file.url)
        if turns is None:
            turns = self._turns[file.url] = _Turns()
        return turns.take()

    def done(self, file: FileRef, ticket: _Ticket) -> None:
        """``ticket`` is used, or given up; a file whose tickets are all done is
        forgotten (what is kept is bounded by the batches running)."""
        ticket.done()
        if ticket.turns.idle and self._turns.get(file.url) is ticket.turns:
            del self._turns[file.url]

    @contextlib.asynccontextmanager
    async def use(self, file: FileRef, ticket: _Ticket | None = None) -> AsyncIterator[VideoReader]:
        """The reader of ``file``; with a ``ticket`` (``take_turn``), once the tickets
        before it are done; the ticket is done on leaving, however it is left."""
        try:
            entry = await self._acquire(file.url, file)
            try:
                if ticket is not None:
                    await ticket.wait()
                yield entry.reader
            finally:
                entry.users -= 1
                with anyio.CancelScope(shield=True):
                    await self._trim()
        finally:
            if ticket is not None:
                self.done(file, ticket)

    async def _acquire(self, key: str, file: FileRef) -> _Entry:
        while True:
            if self._closed:
                raise ClosedResourceError("the video readers of this stream are closed")
            entry = self._entries.get(key)
            if entry is None:
                entry = _Entry(VideoReader(file, fetcher=self._source))
                entry.users = 1
                self._entries[key] = entry
                try:
                    await entry.reader.aopen()
                except BaseException:
                    entry.failed = True
                    if self._entries.get(key) is entry:
                        del self._entries[key]
                    entry.ready.set()
                    raise
                self.opened += 1
                entry.ready.set()
                return entry
            entry.users += 1
            self._entries.move_to_end(key)
            if not entry.ready.is_set():
                try:
                    await entry.ready.wait()
                except BaseException:
                    entry.users -= 1
                    raise
            if entry.failed:  # its opener failed or was cancelled: open it ourselves
                entry.users -= 1
                continue
            return entry

    async def _trim(self) -> None:
        while len(self._entries) > self._limit:
            idle = next(
                (
                    key
                    for key, e in self._entries.items()
                    if e.users == 0 and e.ready.is_set() and not e.failed
                ),
                None,
            )
            if idle is None:
                return
            entry = self._entries.pop(idle)
            self.evicted += 1
            await self._close(entry)

    async def _close(self, entry: _Entry) -> None:
        _add_counts(self._closed_counts, entry.reader.statistics())
        await entry.reader.aclose()

    async def aclose(self) -> None:
        self._closed = True
        entries = list(self._entries.values())
        self._entries.clear()
        for entry in entries:
            if entry.ready.is_set() and not entry.failed:
                await self._close(entry)
            else:
                await entry.reader.aclose()


def _add_counts(counts: dict[str, int], stats: VideoStatistics) -> None:
    for name in _COUNTERS:
        counts[name] = counts.get(name, 0) + int(getattr(stats, name))


def _merge_counts(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for name, value in counts.items():
        into[name] = into.get(name, 0) + value
