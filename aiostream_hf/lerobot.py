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

import math
import os
import random
import re
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from ._client import HubClient
from ._elastic import JOB_KIND
from ._engine import (
    Engine,
    EngineStatistics,
    ShuffleBuffer,
    check_state,
    digest,
    open_readers,
    rank_share,
    shuffle_buffer_size,
)
from ._exceptions import SourceError
from ._lerobot_elastic import (
    LeRobotShare,
    check_lerobot_state,
    first_frame,
    job_to_lerobot,
    lerobot_share,
    settle,
)
from ._lerobot_meta import SUPPORTED_VERSIONS as SUPPORTED_VERSIONS
from ._lerobot_meta import EpisodeInfo as EpisodeInfo
from ._lerobot_meta import LeRobotMetadata as LeRobotMetadata
from ._lerobot_meta import VideoSpan as VideoSpan
from ._lerobot_meta import _bucket_root, _hub_root, _load_metadata, _local_root, _Root
from ._lerobot_plan import ImageFormat as ImageFormat
from ._lerobot_plan import (
    _Batch,
    _check_dataset,
    _Checkpoint,
    _fingerprint,
    _following,
    _parse_cursor,
    _Plan,
)
from ._lerobot_readers import _merge_counts, _ReaderPool
from ._lerobot_rows import Array as Array
from ._lerobot_rows import _EpisodeRows, _load_episodes, _load_rows, _Row
from ._options import StreamOptions
from ._prefetch import Job
from ._resolver import Resolver
from ._sources import BucketSource, HubSource, has_glob, is_bucket_uri, parse_sources
from .formats import ByteSource

__all__ = [
    "SUPPORTED_VERSIONS",
    "EpisodeInfo",
    "LeRobotMetadata",
    "LeRobotStatistics",
    "LeRobotStream",
    "VideoSpan",
    "stream",
]

_BATCH_ITEMS = 16  # items whose frames are fetched with one request per video file
_SHUFFLE_BUFFER = 1000
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_STATE_VERSION = 1
_MAX_DELTA_S = 1e9
"""The farthest a delta timestamp may reach, in seconds (31 years): ``round(delta * fps)``
then fits an int64 at any ``fps`` read (at most 1e6)."""


@dataclass(frozen=True, kw_only=True)
class LeRobotStatistics(EngineStatistics):
    """What a LeRobot stream did so far.

    items / episodes / data_files: delivered items, episodes started, data files read.
    videos_opened / videos_evicted: VideoReaders opened, and closed to stay within
        ``max_open_videos``.
    video: the summed ``VideoStatistics`` counters of every reader (index and frame
        requests and bytes, packets decoded, decoder starts and reuses), and
        ``bytes_reused``: frame and index bytes cut from the video bytes the stream kept
        (``StreamOptions.kept_video_bytes``), not fetched.
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
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or (isinstance(v, float) and not math.isfinite(v))
            ):
                raise SourceError(f"delta_timestamps[{key!r}] holds {v!r}: not a finite number")
            if abs(v) > _MAX_DELTA_S:  # an int past float's range too, compared exactly
                shown = repr(v)
                if isinstance(v, int) and v.bit_length() > 128:  # its repr may be too long
                    shown = f"an integer of {v.bit_length():,} bits"
                raise SourceError(
                    f"delta_timestamps[{key!r}] holds {shown}: more than {_MAX_DELTA_S:g} s "
                    "away (_MAX_DELTA_S; an episode is far shorter): give seconds within it"
                )
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
        if options is not None and options.shuffle_units > 1:
            raise SourceError(
                f"StreamOptions(shuffle_units={options.shuffle_units}) is for stream() "
                "(Parquet, TAR): a LeRobot stream does not read episodes side by side (it "
                "permutes episodes and their frames, then buffers items); set shuffle_units=1"
            )
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
        self._share: LeRobotShare | None = None  # this consumer's episodes (elastic)

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

    def _identity(self) -> str:
        """What this stream reads (for a mixture's state; its own carries ``dataset``)."""
        source = self._source
        where = self._meta.source if self._meta is not None else getattr(source, "uri", source)
        return digest(
            {
                "lerobot": where,
                "split": self._split,
                "episodes": self._episodes,
                "deltas": self._deltas,
                "image_format": self._image_format,
                "batch_items": self._batch_items,
                "shuffle": self._shuffle_buffer,
            }
        )

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
            if skip and self._share is not None:  # exact at the item: merge_states reads it
                cursor = settle(cursor, skip, self._share, self._frames, self._shuffle_buffer)
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
            **({"elastic": self._elastic_field()} if self._options.elastic else {}),
        }

    def _elastic_field(self) -> dict[str, Any] | None:
        if self._loaded is not None and self._position is None:
            return self._loaded.get("elastic")  # loaded, no item delivered since
        if self._share is not None:
            return self._share.elastic
        return lerobot_share(self, self._build_plan(), None).elastic if self._meta else None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue, on the next iteration, with the item after the last one ``state`` saw.

        A state saved with other ``seed``, ``rank``, ``world_size`` or ``shuffle``, or
        over other episodes (another dataset, revision, split or selection), is
        refused with ``SourceError`` (the dataset is checked here when the metadata is
        loaded already, else when the iteration has read it).
        """
        if isinstance(state, Mapping) and state.get("kind") == JOB_KIND:
            state = job_to_lerobot(state, self, _STATE_VERSION)  # this consumer's part
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
        check_lerobot_state(state, self)
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
            self._share = lerobot_share(self, plan, resume) if opts.elastic else None
            cursor = resume.get("cursor") if resume is not None else None
            pool = self._pool = _ReaderPool(fetcher, self._max_open, opts)
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
        """This rank's episodes grouped by data file, in reading order (elastic: its
        share's episodes, one per group)."""
        if self._share is not None:
            return self._share.order
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
        lerobot = self._share
        split_items = split_items and lerobot is None
        starts = lerobot.starts if lerobot is not None else {}
        # The buffer holds row numbers, not pictures; its draws differ per rank; its
        # state is saved with every checkpoint.
        shuffle: ShuffleBuffer[_Row] | None = None
        if self._shuffle_buffer:
            seed = lerobot.seed if lerobot else f"{self._seed}:{self._epoch}:buffer:{self._rank}"
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

        ahead: dict[int, _EpisodeRows] = {}  # rows read with an earlier group (elastic)
        for g in range(g0, len(order)):
            group = order[g]
            e_first = e0 if g == g0 else 0
            if g == g0 and cursor is not None:
                rows = preloaded
            elif group[0].index in ahead:
                rows = ahead
            else:
                # Elastic: the next groups (an episode each) of the same data file are
                # read with this one, in one pass over the file.
                run, k = list(group), g + 1
                url = group[0].data_file.url
                while lerobot is not None and k < len(order) and order[k][0].data_file.url == url:
                    run += order[k]
                    k += 1
                rows = ahead = await _load_episodes(fetcher, plan, run)
                self._data_files += 1
            for e in range(e_first, len(group)):
                episode = group[e]
                data = rows[episode.index]
                self._episodes_started += 1
                positions = self._frames(episode)
                for f in range(first_frame(g, e, (g0, e0, f0), starts), episode.length):
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
