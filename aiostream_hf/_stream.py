"""stream() and Stream: planning, readahead, output shaping, statistics.

    async with ash.stream("hf://datasets/org/name", split="train") as s:
        async for row in s:
            ...

Data flows one way: sources -> Resolver (Manifest) -> plan (shard order, rank
selection) -> decoder units -> RangeFetcher -> Prefetcher -> shuffle buffer and
batching -> the consumer.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.to_thread
import pyarrow as pa

from ._bridge import SyncIterator
from ._exceptions import ClosedResourceError, SourceError
from ._fetcher import RangeFetcher
from ._options import StreamOptions
from ._prefetch import Job, Prefetcher
from ._resolver import FileRef, Manifest, Resolver
from ._sources import parse_sources
from .formats import ByteSource, Decoder, ReadRequest, Unit, decoder_for

__all__ = ["Stream", "StreamStatistics", "stream"]

Output = Literal["python", "arrow"]
_PLAN_COST = 64 * 1024  # bytes a file's plan (its footer or index read) holds


@dataclass(frozen=True)
class StreamStatistics:
    """What a stream did so far: requests, bytes, retries, samples, time to first sample."""

    samples: int
    files: int
    units: int
    time_to_first_sample: float | None
    fetcher: Mapping[str, Any] = field(default_factory=dict)
    resolver: Mapping[str, Any] = field(default_factory=dict)
    max_prefetched: int = 0
    max_prefetched_bytes: int = 0


def stream(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    split: str | None = None,
    config: str | None = None,
    data_files: str | Sequence[str] | Mapping[str, str | Sequence[str]] | None = None,
    format: str | None = None,
    columns: Sequence[str] | None = None,
    filter: Any = None,
    batch_size: int | None = None,
    output: Output = "python",
    shuffle: bool | int | None = None,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    options: StreamOptions | None = None,
    token: str | None = None,
    endpoint: str | None = None,
) -> Stream:
    """A lazy stream of the samples of ``source``; nothing is read until iteration.

    ``output="python"`` yields dict rows (or dict-of-lists batches with
    ``batch_size``); ``output="arrow"`` yields ``pyarrow.RecordBatch`` without
    converting to Python objects. ``shuffle`` (True, or a buffer size) shuffles
    the file order by (seed, epoch) and samples through a bounded buffer.
    ``rank``/``world_size`` (default: RANK/WORLD_SIZE from the environment)
    select a disjoint share; all ranks together read everything once.
    """
    return Stream(
        source,
        split=split,
        config=config,
        data_files=data_files,
        format=format,
        columns=columns,
        filter=filter,
        batch_size=batch_size,
        output=output,
        shuffle=shuffle,
        seed=seed,
        rank=rank,
        world_size=world_size,
        options=options,
        token=token,
        endpoint=endpoint,
    )


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None and world_size is None:
        env_rank, env_world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
        if env_rank is not None and env_world is not None:
            rank, world_size = int(env_rank), int(env_world)
    if rank is None and world_size is None:
        return 0, 1
    if rank is None or world_size is None:
        raise SourceError(f"rank={rank!r}, world_size={world_size!r}: give both or neither")
    if world_size < 1 or not 0 <= rank < world_size:
        raise SourceError(
            f"rank={rank!r}, world_size={world_size!r}: need world_size >= 1 and "
            "0 <= rank < world_size"
        )
    return rank, world_size


class Stream:
    """One lazy stream: async-iterable, closable, observable. See :func:`stream`."""

    def __init__(
        self,
        source: Any,
        *,
        split: str | None,
        config: str | None,
        data_files: Any,
        format: str | None,
        columns: Sequence[str] | None,
        filter: Any,
        batch_size: int | None,
        output: Output,
        shuffle: bool | int | None,
        seed: int,
        rank: int | None,
        world_size: int | None,
        options: StreamOptions | None,
        token: str | None,
        endpoint: str | None,
    ) -> None:
        if output not in ("python", "arrow"):
            raise SourceError(f"output={output!r}: use 'python' (dict rows) or 'arrow'")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise SourceError(f"batch_size={batch_size!r}: must be a positive int or None")
        if isinstance(shuffle, bool) or shuffle is None:
            buffer = 1000 if shuffle else 0
        elif isinstance(shuffle, int) and shuffle >= 1:
            buffer = shuffle
        else:
            raise SourceError(f"shuffle={shuffle!r}: use True, False, or a buffer size >= 1")
        if columns is not None and (isinstance(columns, str) or not columns):
            raise SourceError(f"columns={columns!r}: give a non-empty list of column names")
        if filter is not None and not isinstance(filter, pa.compute.Expression):
            raise SourceError(
                f"filter={filter!r}: give a pyarrow.compute expression, "
                "e.g. pyarrow.compute.field('score') > 0.5"
            )
        parse_sources(source)  # bad sources fail here, before any I/O
        self._source = source
        self._split = split
        self._config = config
        self._data_files = data_files
        self._format = format
        self._request = ReadRequest(tuple(columns) if columns else None, filter)
        self._batch_size = batch_size
        self._output: Output = output
        self._shuffle_buffer = buffer
        self._seed = seed
        self._rank, self._world_size = _rank_and_world(rank, world_size)
        self._options = options or StreamOptions()
        self._token = token
        self._endpoint = endpoint
        self._epoch = 0
        self._closed = False
        self._iterators: list[AsyncIterator[Any]] = []
        self._sync_iterators: list[SyncIterator[Any]] = []
        self._fetcher: RangeFetcher | None = None
        self._resolver: Resolver | None = None
        self._prefetch: Prefetcher[Any] | None = None
        self._manifest: Manifest | None = None
        self._samples = 0
        self._files = 0
        self._units = 0
        self._first_sample: float | None = None

    # -- lifecycle -----------------------------------------------------------

    async def __aenter__(self) -> Stream:
        if self._closed:
            raise ClosedResourceError("this Stream is closed: call stream(...) again")
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop every iteration of this stream and release its connections."""
        self._closed = True
        iterators, self._iterators = self._iterators, []
        with anyio.CancelScope(shield=True):
            for it in iterators:
                await it.aclose()  # type: ignore[attr-defined]

    def __aiter__(self) -> AsyncIterator[Any]:
        if self._closed:
            raise ClosedResourceError("this Stream is closed: call stream(...) again")
        it = self._iterate()
        self._iterators.append(it)
        return it

    def __iter__(self) -> Iterator[Any]:
        """Sync iteration: the pipeline runs on the process's bridge thread."""
        if self._closed:
            raise ClosedResourceError("this Stream is closed: call stream(...) again")
        it: SyncIterator[Any] = SyncIterator(self.__aiter__)
        self._sync_iterators.append(it)
        return _sync_rows(it, self._sync_iterators)

    def close(self) -> None:
        """Sync ``aclose()``: stop every sync iteration of this stream."""
        self._closed = True
        iterators, self._sync_iterators = self._sync_iterators, []
        for it in iterators:
            it.close()

    def __enter__(self) -> Stream:
        if self._closed:
            raise ClosedResourceError("this Stream is closed: call stream(...) again")
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def set_epoch(self, epoch: int) -> None:
        """Shuffle orders depend on (seed, epoch): call before each epoch's iteration."""
        self._epoch = epoch

    @property
    def manifest(self) -> Manifest | None:
        """The files being read, once resolved."""
        return self._manifest

    def statistics(self) -> StreamStatistics:
        prefetch = self._prefetch.statistics() if self._prefetch is not None else None
        return StreamStatistics(
            samples=self._samples,
            files=self._files,
            units=self._units,
            time_to_first_sample=self._first_sample,
            fetcher=asdict(self._fetcher.statistics()) if self._fetcher is not None else {},
            resolver=asdict(self._resolver.statistics()) if self._resolver is not None else {},
            max_prefetched=prefetch.max_held if prefetch else 0,
            max_prefetched_bytes=prefetch.max_held_bytes if prefetch else 0,
        )

    # -- the pipeline --------------------------------------------------------

    def _order(self, files: Sequence[FileRef]) -> list[FileRef]:
        order = list(files)
        if self._shuffle_buffer:
            random.Random(f"{self._seed}:{self._epoch}:files").shuffle(order)
        return order

    async def _iterate(self) -> AsyncIterator[Any]:
        started = time.monotonic()
        opts = self._options
        async with (
            Resolver(options=opts) as resolver,
            RangeFetcher(opts, token=self._token, endpoint=self._endpoint) as fetcher,
        ):
            self._resolver, self._fetcher = resolver, fetcher
            manifest = await resolver.resolve(
                self._source,
                config=self._config,
                split=self._split,
                data_files=self._data_files,
                token=self._token,
                endpoint=self._endpoint,
            )
            self._manifest = manifest
            files = self._order(manifest.files)
            # Whole files per rank when there are enough; else every rank plans
            # every file and keeps every world_size-th unit.
            by_file = len(files) >= self._world_size
            if by_file:
                files = files[self._rank :: self._world_size]
            decoders = {f.url: decoder_for(f, self._format) for f in files}

            async def plan_jobs() -> AsyncIterator[Job[list[Unit]]]:
                for f in files:
                    run = partial(decoders[f.url].plan, f, fetcher, self._request)
                    yield Job(_PLAN_COST, run)

            async def unit_jobs(planned: Prefetcher[list[Unit]]) -> AsyncIterator[Job[Any]]:
                n = 0
                async for units in planned:
                    self._files += 1
                    for unit in units:
                        n += 1
                        if not by_file and (n - 1) % self._world_size != self._rank:
                            continue
                        decoder = decoders[unit.file.url]
                        yield Job(unit.cost, partial(self._load, decoder, unit, fetcher))

            plan_ahead = Prefetcher(plan_jobs(), max_count=opts.prefetch_count, max_bytes=1 << 62)
            async with plan_ahead:
                loaded = Prefetcher(
                    unit_jobs(plan_ahead),
                    max_count=opts.prefetch_count,
                    max_bytes=opts.prefetch_bytes,
                )
                self._prefetch = loaded
                async with loaded:
                    async for out in self._shape(loaded):
                        if self._first_sample is None:
                            self._first_sample = time.monotonic() - started
                        yield out

    async def _load(self, decoder: Decoder[Any], unit: Unit, source: ByteSource) -> Any:
        fetched = await decoder.fetch(unit, source)
        return await anyio.to_thread.run_sync(self._decode, decoder, unit, fetched)

    def _decode(self, decoder: Decoder[Any], unit: Unit, fetched: Any) -> Any:
        table = decoder.decode(unit, fetched, self._request)
        if self._shuffle_buffer and self._output == "arrow" and table.num_rows > 1:
            rng = random.Random(f"{self._seed}:{self._epoch}:{unit.file.url}:{unit.index}")
            order = list(range(table.num_rows))
            rng.shuffle(order)
            table = table.take(order)
        if self._output == "python" and self._batch_size is None:
            return table.to_pylist()
        return table

    async def _shape(self, loaded: Prefetcher[Any]) -> AsyncIterator[Any]:
        if self._output == "arrow":
            async for table in loaded:
                self._units += 1
                for batch in _batches(table, self._batch_size):
                    self._samples += batch.num_rows
                    yield batch
            return
        if self._batch_size is not None:
            pending: list[pa.Table] = []
            rows = 0
            async for table in loaded:
                self._units += 1
                pending.append(table)
                rows += table.num_rows
                while rows >= self._batch_size:
                    whole = pa.concat_tables(pending)
                    batch, rest = whole.slice(0, self._batch_size), whole.slice(self._batch_size)
                    pending, rows = [rest], rest.num_rows
                    self._samples += batch.num_rows
                    yield batch.to_pydict()
            if rows:
                self._samples += rows
                yield pa.concat_tables(pending).to_pydict()
            return
        rng = random.Random(f"{self._seed}:{self._epoch}:samples")
        buffer: list[Any] = []
        async for rows_ in loaded:
            self._units += 1
            for row in rows_:
                if self._shuffle_buffer:
                    if len(buffer) < self._shuffle_buffer:
                        buffer.append(row)
                        continue
                    i = rng.randrange(len(buffer))
                    row, buffer[i] = buffer[i], row
                self._samples += 1
                yield row
        rng.shuffle(buffer)
        for row in buffer:
            self._samples += 1
            yield row


def _sync_rows(it: SyncIterator[Any], live: list[SyncIterator[Any]]) -> Iterator[Any]:
    try:
        yield from it
    finally:
        it.close()
        if it in live:
            live.remove(it)


def _batches(table: pa.Table, size: int | None) -> Iterator[pa.RecordBatch]:
    if size is None:
        yield from table.combine_chunks().to_batches() if table.num_rows else ()
        return
    for start in range(0, table.num_rows, size):
        yield from table.slice(start, size).combine_chunks().to_batches()
