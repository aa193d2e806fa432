"""Ray Data: datasets that resolve once, at the driver, and read with the engine in tasks.

    import aiostream_hf.ray

    ds = aiostream_hf.ray.read("hf://datasets/org/name", split="train", columns=["text"])
    ds.map_batches(tokenize).write_parquet("s3://bucket/tokens")

    items = aiostream_hf.ray.read_lerobot("hf://datasets/lerobot/pusht",
                                          delta_timestamps={"action": [0.0, 0.1]})

What runs where:

- ``read()`` resolves the source on the driver, once (a revision call and the tree
  listing: the same API requests as ``stream()``), into a ``Manifest``: the files with
  their sizes, etags and ``/resolve/`` URLs pinned to the commit.
- Each read task gets the manifest's files of its share and streams them with the
  engine (``stream(manifest, output="arrow")`` through the sync bridge), yielding
  ``pyarrow.Table`` blocks. A task makes no API request: one ``/resolve/`` request per
  file it reads (then range reads on the CDN), as ``stream()`` makes.
- Shares are disjoint and together cover every file once: ``min(parallelism, files)``
  groups of consecutive files. When there are fewer files than the parallelism Ray
  asks for, a Parquet file of at least two ``DataContext.target_max_block_size`` (128
  MiB by default) on disk is split further, into row-group shares of at least that
  size (a share of ``k`` reads every ``k``-th row group; each share reads the footer
  and resolves the file, one request more per share). TAR shards are read whole.
- ``columns=`` and ``filter=`` reach the engine, so only those column chunks are
  fetched and row groups whose statistics exclude the filter are skipped.

``override_num_blocks`` follows Ray's rules: Ray asks the datasource for that many
read tasks and splits the tasks' output blocks when it gets fewer, so the dataset
still has about that many blocks. Row counts are unknown until read (the driver reads
no footer).

Errors: an error in a task reaches the caller of the consuming call (``take_all``,
``iter_batches``, ``materialize``, ``write_*``) as Ray raises it: a
``ray.exceptions.RayTaskError`` made an instance of our error's class (Ray's
``as_instanceof_cause``), so ``except aiostream_hf.FetchError`` catches it; its
``cause`` is our error, whose message names the file.

``read_lerobot()`` reads the LeRobot metadata on the driver once and gives each task a
run of consecutive episodes (``lerobot.stream(metadata, episodes=...)``): items become
rows (frames as Ray tensor columns), with exact row counts known before the read.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pyarrow as pa

try:
    import ray.data
    from ray.data.block import Block, BlockAccessor, BlockMetadata
except ImportError as exc:
    raise ImportError(
        f"aiostream_hf.ray needs Ray Data, which cannot be imported ({exc}): "
        "pip install 'aiostream-hf[ray]'"
    ) from exc

from . import _bridge, _engine, formats
from ._exceptions import SourceError
from ._models import FileRef, Manifest
from ._stream import stream

if TYPE_CHECKING:
    from . import lerobot

__all__ = ["LeRobotDatasource", "StreamDatasource", "read", "read_lerobot"]

_STREAM_KEYS = frozenset(
    {"columns", "config", "data_files", "endpoint", "filter", "format", "options", "split", "token"}
)
_LEROBOT_KEYS = frozenset(
    {
        "batch_items",
        "delta_timestamps",
        "endpoint",
        "episodes",
        "image_format",
        "max_open_videos",
        "options",
        "split",
        "token",
        "tolerance_s",
    }
)
#: Arguments of stream() that a Ray read sets itself, and what to use instead.
_RAY_DOES = {
    "rank": "Ray splits the work across read tasks itself",
    "world_size": "Ray splits the work across read tasks itself",
    "output": "read tasks yield Arrow blocks; convert with ds.iter_batches(batch_format=...)",
    "batch_size": "size the batches where you take them: ds.iter_batches(batch_size=...)",
    "shuffle": "shuffle the Dataset: ds.randomize_block_order() or ds.random_shuffle()",
    "seed": "shuffle the Dataset: ds.random_shuffle(seed=...)",
    "client": "a client lives in one process; each read task uses its own",
}
#: A read task: the function Ray calls in the task, and what is known before it runs.
_Task: TypeAlias = "tuple[Callable[[], Iterator[Block]], BlockMetadata]"
_BLOCK_ITEMS = 256  # LeRobot items per block at most (fewer when their bytes fill a block)


def read(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Manifest,
    *,
    override_num_blocks: int | None = None,
    concurrency: int | None = None,
    num_cpus: float | None = None,
    memory: float | None = None,
    **stream_options: Any,
) -> ray.data.Dataset:
    """A Ray Dataset of the rows of ``source``, resolved here and read by Ray tasks.

    ``stream_options`` are ``stream()``'s: ``split``, ``config``, ``data_files``,
    ``format``, ``columns``, ``filter``, ``options``, ``token``, ``endpoint``.
    ``override_num_blocks``, ``concurrency``, ``num_cpus`` and ``memory`` are
    ``ray.data.read_datasource``'s. See the module docstring for what runs where.
    """
    return _read(
        StreamDatasource(source, **stream_options),
        override_num_blocks,
        concurrency,
        num_cpus,
        memory,
    )


def read_lerobot(
    repo: str | os.PathLike[str] | lerobot.LeRobotMetadata,
    *,
    override_num_blocks: int | None = None,
    concurrency: int | None = None,
    num_cpus: float | None = None,
    memory: float | None = None,
    **lerobot_options: Any,
) -> ray.data.Dataset:
    """A Ray Dataset of the items of a LeRobot dataset (``lerobot.stream()``'s), one row each.

    ``lerobot_options`` are ``lerobot.stream()``'s: ``delta_timestamps``,
    ``tolerance_s``, ``episodes``, ``image_format``, ``split``, ``batch_items``,
    ``max_open_videos``, ``options``, ``token``, ``endpoint``. The metadata is read
    here, once; each read task streams a run of consecutive episodes.
    """
    return _read(
        LeRobotDatasource(repo, **lerobot_options),
        override_num_blocks,
        concurrency,
        num_cpus,
        memory,
    )


def _read(
    datasource: ray.data.Datasource,
    override_num_blocks: int | None,
    concurrency: int | None,
    num_cpus: float | None,
    memory: float | None,
) -> ray.data.Dataset:
    dataset: ray.data.Dataset = ray.data.read_datasource(
        datasource,
        override_num_blocks=override_num_blocks,
        concurrency=concurrency,
        num_cpus=num_cpus,
        memory=memory,
    )
    return dataset


def _check_names(kind: str, given: Mapping[str, Any], allowed: frozenset[str]) -> None:
    for name in given:
        if name in _RAY_DOES:
            raise SourceError(f"{kind} takes no {name}=: {_RAY_DOES[name]}")
        if name not in allowed:
            raise SourceError(
                f"{kind} got an unknown option {name}=: it takes {', '.join(sorted(allowed))}"
            )


@dataclasses.dataclass(frozen=True)
class _Share:
    """The files one read task streams, and which of their units: every
    ``world_size``-th from ``rank`` (a row-group share of one large file), or all."""

    files: tuple[FileRef, ...]
    rank: int = 0
    world_size: int = 1

    @property
    def size(self) -> int | None:
        sizes = [f.size for f in self.files]
        if any(s is None for s in sizes):
            return None
        return sum(s for s in sizes if s is not None) // self.world_size


def _shares(
    files: Sequence[FileRef], parallelism: int, splittable: bool, share_bytes: int | None
) -> list[_Share]:
    """Disjoint shares covering ``files`` once: consecutive groups of files, or, with
    fewer files than ``parallelism``, row-group shares of the large (splittable) ones."""
    n, parallelism = len(files), max(1, parallelism)
    if n == 0:
        return []
    if n >= parallelism or not splittable or not share_bytes:
        groups = min(parallelism, n)
        return [
            _Share(tuple(files[i * n // groups : (i + 1) * n // groups])) for i in range(groups)
        ]
    shares: list[_Share] = []
    for f in files:
        k = max(1, min(parallelism // n, (f.size or 0) // share_bytes))
        shares += [_Share((f,), rank, k) for rank in range(k)]
    return shares


class _Datasource(ray.data.Datasource):
    """What both datasources share: Ray's read-task protocol over ``_tasks``."""

    def _tasks(self, parallelism: int, context: ray.data.DataContext) -> list[_Task]:
        """(read function, metadata) of each read task for ``parallelism``; no I/O."""
        raise NotImplementedError

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: ray.data.DataContext | None = None,
    ) -> list[ray.data.ReadTask]:
        context = data_context or ray.data.DataContext.get_current()
        return [
            ray.data.ReadTask(read, metadata, per_task_row_limit=per_task_row_limit)
            for read, metadata in self._tasks(parallelism, context)
        ]


class StreamDatasource(_Datasource):
    """The Ray datasource behind ``read()``: for ``ray.data.read_datasource`` callers.

    Resolves ``source`` when made (unless it is a ``Manifest``); ``get_read_tasks``
    only plans shares of the manifest, so Ray may call it as often as it likes.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Manifest,
        **stream_options: Any,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        _check_names("aiostream_hf.ray.read", stream_options, _STREAM_KEYS)
        manifest, read_kwargs = _engine.resolve_for_workers(source, stream_options)
        # The tasks' arguments fail here, once, rather than in every task.
        stream(manifest, output="arrow", rank=0, world_size=1, **read_kwargs)
        fmt = read_kwargs.get("format")
        self.manifest = manifest
        self._splittable = not any(
            isinstance(formats.decoder_for(f, fmt), formats.SequentialDecoder)
            for f in manifest.files
        )
        self._read_kwargs = read_kwargs

    def get_name(self) -> str:
        return "Aiostream"

    def estimate_inmemory_data_size(self) -> int | None:
        """The bytes of the files on disk (decoded rows take more: an underestimate)."""
        return _Share(self.manifest.files).size

    def _tasks(self, parallelism: int, context: ray.data.DataContext) -> list[_Task]:
        shares = _shares(
            self.manifest.files, parallelism, self._splittable, context.target_max_block_size
        )
        return [
            (
                # Each task carries its own files only, not the whole manifest.
                functools.partial(
                    _read_share,
                    dataclasses.replace(self.manifest, files=share.files),
                    share.rank,
                    share.world_size,
                    self._read_kwargs,
                ),
                BlockMetadata(
                    num_rows=None,
                    size_bytes=share.size,
                    input_files=tuple(f.path for f in share.files),
                    exec_stats=None,
                ),
            )
            for share in shares
        ]


def _read_share(
    manifest: Manifest, rank: int, world_size: int, kwargs: Mapping[str, Any]
) -> Iterator[Block]:
    """One read task: the files of its manifest (every ``world_size``-th unit from
    ``rank`` of them) streamed by the engine, each RecordBatch a block."""
    s = stream(manifest, output="arrow", rank=rank, world_size=world_size, **kwargs)
    with s:
        for batch in s:
            yield pa.Table.from_batches([batch])


class LeRobotDatasource(_Datasource):
    """The Ray datasource behind ``read_lerobot()``: the metadata is read when made."""

    def __init__(
        self, repo: str | os.PathLike[str] | lerobot.LeRobotMetadata, **lerobot_options: Any
    ) -> None:
        from . import lerobot  # PyAV: imported where LeRobot is read, not by every task

        super().__init__()  # type: ignore[no-untyped-call]
        _check_names("aiostream_hf.ray.read_lerobot", lerobot_options, _LEROBOT_KEYS)
        probe = lerobot.stream(repo, rank=0, world_size=1, **lerobot_options)
        self.metadata: lerobot.LeRobotMetadata = _bridge.portal().call(probe.load_metadata)
        plan = probe._build_plan()  # bad episodes, split or delta_timestamps fail here, once
        self._episodes = plan.episodes
        self._item_bytes = sum(plan.frame_bytes.values())
        self._kwargs = {k: v for k, v in lerobot_options.items() if k not in ("split", "episodes")}

    def get_name(self) -> str:
        return "AiostreamLeRobot"

    def estimate_inmemory_data_size(self) -> int | None:
        """The frames' bytes as delivered (the data columns are small beside them)."""
        return sum(e.length for e in self._episodes) * self._item_bytes

    def _tasks(self, parallelism: int, context: ray.data.DataContext) -> list[_Task]:
        episodes, n = self._episodes, len(self._episodes)
        groups = min(max(1, parallelism), n)
        tasks: list[_Task] = []
        for i in range(groups):
            run = episodes[i * n // groups : (i + 1) * n // groups]
            rows = sum(e.length for e in run)
            read = functools.partial(
                _read_episodes,
                self.metadata,
                tuple(e.index for e in run),
                self._kwargs,
                context.target_max_block_size,
            )
            meta = BlockMetadata(
                num_rows=rows,
                size_bytes=rows * self._item_bytes,
                input_files=None,
                exec_stats=None,
            )
            tasks.append((read, meta))
        return tasks


def _read_episodes(
    metadata: lerobot.LeRobotMetadata,
    episodes: tuple[int, ...],
    kwargs: Mapping[str, Any],
    block_bytes: int | None,
) -> Iterator[Block]:
    """One read task: its episodes' items, a block per ``_BLOCK_ITEMS`` items or per
    ``block_bytes`` of them, whichever comes first."""
    from . import lerobot

    s = lerobot.stream(
        metadata, episodes=list(episodes), split=None, rank=0, world_size=1, **kwargs
    )
    pending: list[dict[str, Any]] = []
    held = 0
    with s:
        for item in s:
            pending.append(item)
            held += sum(getattr(v, "nbytes", 0) for v in item.values())
            if len(pending) >= _BLOCK_ITEMS or (block_bytes and held >= block_bytes):
                yield _items_block(pending)
                pending, held = [], 0
    if pending:
        yield _items_block(pending)


def _items_block(items: Sequence[Mapping[str, Any]]) -> Block:
    """Items as one block: a column per key, arrays stacked (frames: tensor columns)."""
    batch = {key: np.asarray([item[key] for item in items]) for key in items[0]}
    return BlockAccessor.batch_to_block(batch)
