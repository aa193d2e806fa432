"""stream() and Stream: planning, readahead, output shaping, statistics.

    async with ash.stream("hf://datasets/org/name", split="train") as s:
        async for row in s:
            ...

Data flows one way: sources -> Resolver (Manifest) -> plan (shard order, rank
selection) -> decoder units -> RangeFetcher -> Prefetcher -> shuffle buffer and
batching -> the consumer.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.compute as pc
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._bridge import SyncIterator
from ._client import HubClient, use_client
from ._exceptions import ClosedResourceError, SourceError, UsageError
from ._fetcher import RangeFetcher
from ._models import FileRef, Manifest
from ._options import StreamOptions
from ._prefetch import Job, Prefetcher
from ._ranks import rank_and_world
from ._readahead import Emit, Lane, LaneReadahead
from ._resolver import Resolver
from ._sources import parse_sources
from .formats import (
    ByteSource,
    Chunk,
    Decoder,
    Position,
    ReadRequest,
    SequentialDecoder,
    Unit,
    decoder_for,
)

__all__ = ["Stream", "StreamStatistics", "stream"]

Output = Literal["python", "arrow"]
_CHANNEL_UNITS = 1  # loaded units between the producer and the consumer, past the readahead
_PLAN_COST = 64 * 1024  # bytes a file's plan (its footer or index read) holds
_STATE_VERSION = 1


@dataclass(frozen=True)
class StreamStatistics:
    """What a stream did so far: requests, bytes, retries, samples, time to first sample."""

    samples: int
    files: int
    units: int
    time_to_first_sample: float | None
    fetcher: Mapping[str, Any] = field(default_factory=dict)
    resolver: Mapping[str, Any] = field(default_factory=dict)
    client: Mapping[str, Any] = field(default_factory=dict)
    max_prefetched: int = 0
    max_prefetched_bytes: int = 0


def stream(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Manifest,
    *,
    split: str | None = None,
    config: str | None = None,
    data_files: str | Sequence[str] | Mapping[str, str | Sequence[str]] | None = None,
    format: str | Decoder[Any] | None = None,
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
    client: HubClient | None = None,
) -> Stream:
    """A lazy stream of the samples of ``source``; nothing is read until iteration.

    ``source`` is a source string (``hf://datasets/ORG/NAME[@REV][/PATH]``, an
    http(s) URL with ``{000..099}`` braces, a local path or glob), a list of
    them, or a ``Manifest`` resolved before (then no API request is made).

    ``output="python"`` yields dict rows (or dict-of-lists batches with
    ``batch_size``); ``output="arrow"`` yields ``pyarrow.RecordBatch`` without
    converting to Python objects. ``shuffle`` (True, or a buffer size) shuffles
    the file order by (seed, epoch) and samples through a bounded buffer.
    ``rank``/``world_size`` (default: RANK/WORLD_SIZE from the environment)
    select a disjoint share; all ranks together read everything once.
    ``format`` names a registered format, or is a configured decoder (e.g.
    ``aiostream_hf.webdataset.WebDatasetDecoder(decode="rgb8")``).
    ``client``: the ``HubClient`` whose connection pool, host gates and CDN URL
    cache the stream uses; by default the event loop's shared one.
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
        client=client,
    )


class Stream:
    """One lazy stream: async-iterable, closable, observable. See :func:`stream`."""

    def __init__(
        self,
        source: Any,
        *,
        split: str | None,
        config: str | None,
        data_files: Any,
        format: str | Decoder[Any] | None,
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
        client: HubClient | None = None,
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
        if filter is not None and not isinstance(filter, pc.Expression):
            raise SourceError(
                f"filter={filter!r}: give a pyarrow.compute expression, "
                "e.g. pyarrow.compute.field('score') > 0.5"
            )
        if not isinstance(source, Manifest):
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
        self._rank, self._world_size = rank_and_world(rank, world_size)
        self._options = options or StreamOptions()
        self._token = token
        if endpoint is None and isinstance(source, Manifest):
            endpoint = source.endpoint
        self._endpoint = endpoint
        self._client = client
        self._hub: HubClient | None = None
        self._epoch = 0
        self._closed = False
        self._tg: TaskGroup | None = None
        self._iterations: list[_Iteration] = []
        self._sync_iterators: list[SyncIterator[Any]] = []
        self._fetcher: RangeFetcher | None = None
        self._resolver: Resolver | None = None
        self._prefetch: Prefetcher[Any] | LaneReadahead[Any] | None = None
        self._manifest: Manifest | None = None
        self._samples = 0
        self._files = 0
        self._units = 0
        self._first_sample: float | None = None
        self._resume: dict[str, Any] | None = None
        self._cursor: dict[str, Any] | None = None
        self._files_order: list[FileRef] | None = None
        self._buffer: list[Any] = []
        self._rng: random.Random | None = None
        self._pending: deque[list[Any]] = deque()  # [tag, table, rows taken] for batches
        self._held = 0  # rows in _pending not yet taken
        self._end: dict[str, Any] | None = None
        self._started = 0.0

    # -- lifecycle -----------------------------------------------------------

    async def __aenter__(self) -> Stream:
        """Open the scope the stream's background tasks live in (``async with``)."""
        if self._closed:
            raise ClosedResourceError("this Stream is closed: call stream(...) again")
        if self._tg is not None:
            raise UsageError("this Stream is already open: enter `async with` once")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        await self.aclose()
        tg, self._tg = self._tg, None
        if tg is None:
            return None
        tg.cancel_scope.cancel()
        # The background tasks raise nothing (their errors reach the consumer through
        # the channel), so the user's own error leaves as it is, not in an ExceptionGroup.
        if e is None or isinstance(e, anyio.get_cancelled_exc_class()):
            return await tg.__aexit__(et, e, tb)
        await tg.__aexit__(None, None, None)
        return None

    async def aclose(self) -> None:
        """Stop every iteration of this stream; ``async with`` then waits for its tasks."""
        self._closed = True
        iterations, self._iterations = self._iterations, []
        for it in iterations:
            it.close()

    def __aiter__(self) -> AsyncIterator[Any]:
        if self._closed:
            raise ClosedResourceError("this Stream is closed: call stream(...) again")
        if self._tg is None:
            raise UsageError(
                "a Stream is iterated inside `async with`, which owns its background tasks: "
                "write `async with ash.stream(...) as s: async for sample in s: ...` "
                "(or iterate it synchronously with `for sample in s`)"
            )
        for it in self._iterations:  # one iteration at a time: the cursor is the stream's
            it.close()
        it = _Iteration(self, self._tg)
        self._iterations = [it]
        return it

    def __iter__(self) -> Iterator[Any]:
        """Sync iteration: the pipeline runs on the process's bridge thread."""
        if self._closed:
            raise ClosedResourceError("this Stream is closed: call stream(...) again")
        return self._iterate_sync()

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
            client=asdict(self._hub.statistics()) if self._hub is not None else {},
            max_prefetched=prefetch.max_held if prefetch else 0,
            max_prefetched_bytes=prefetch.max_held_bytes if prefetch else 0,
        )

    # -- resume --------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The exact position of this stream: load it into a new stream to go on from here.

        Positions are (file, unit, row) in this rank's file order, plus the
        shuffle buffer's samples and RNG state, so a resume re-reads no sample
        already delivered (only the rest of the unit it stopped in). A file read
        front to back (a TAR shard) has (file, row, offset): the byte where its
        next sample starts (or, compressed, the samples to pass from byte 0).
        """
        if self._resume is not None:  # loaded, not yet taken up by an iteration
            return {**self._resume, "samples": self._samples}
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "seed": self._seed,
            "rank": self._rank,
            "world_size": self._world_size,
            "files": len(self._files_order) if self._files_order is not None else None,
            "cursor": dict(self._cursor) if self._cursor is not None else None,
            "buffer": list(self._buffer),
            "rng": self._rng.getstate() if self._rng is not None else None,
            "samples": self._samples,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue, on the next iteration, exactly where ``state`` was taken."""
        if state.get("version") != _STATE_VERSION:
            raise SourceError(
                f"state version {state.get('version')!r} is not {_STATE_VERSION}: "
                "it was saved by another version of aiostream-hf"
            )
        for key, mine in (
            ("seed", self._seed),
            ("rank", self._rank),
            ("world_size", self._world_size),
        ):
            if state[key] != mine:
                raise SourceError(
                    f"state was saved with {key}={state[key]!r} but this stream has "
                    f"{key}={mine!r}: resume with the same arguments"
                )
        self._epoch = int(state["epoch"])
        self._resume = dict(state)
        self._samples = int(state.get("samples", 0))

    # -- the pipeline --------------------------------------------------------

    def _order(self, files: Sequence[FileRef]) -> list[FileRef]:
        order = list(files)
        if self._shuffle_buffer:
            random.Random(f"{self._seed}:{self._epoch}:files").shuffle(order)
        return order

    def _iterate_sync(self) -> Iterator[Any]:
        """Sync iteration: units cross the bridge, samples are shaped on the consumer's
        thread, so ``state_dict()`` is exact at every sample the consumer has."""
        if self._closed:
            raise ClosedResourceError("this Stream is closed: call stream(...) again")
        self._started = time.monotonic()
        it: SyncIterator[tuple[_Tag, Any]] = SyncIterator(self._loaded_units, buffer=2)
        self._sync_iterators.append(it)
        try:
            for tag, payload in it:
                yield from self._shape_unit(tag, payload)
            yield from self._shape_end()
        finally:
            it.close()
            if it in self._sync_iterators:
                self._sync_iterators.remove(it)

    async def _loaded_units(self) -> AsyncGenerator[tuple[_Tag, Any], None]:
        """Resolve, plan, fetch and decode: loaded units in order, read ahead."""
        opts = self._options
        resume = self._resume  # taken up (set to None) once the cursor holds it
        async with (
            use_client(self._client) as hub,
            Resolver(options=opts, client=hub) as resolver,
            RangeFetcher(opts, token=self._token, endpoint=self._endpoint, client=hub) as fetcher,
        ):
            self._resolver, self._fetcher, self._hub = resolver, fetcher, hub
            if isinstance(self._source, Manifest):
                manifest = self._source  # resolved elsewhere (e.g. in a DataLoader's parent)
            else:
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
            self._files_order = files
            cursor = resume.get("cursor") if resume else None
            if resume is not None and resume.get("files") not in (None, len(files)):
                raise SourceError(
                    f"state was saved over {resume['files']} files but the source now has "
                    f"{len(files)} for this rank: the dataset changed; start a new epoch"
                )
            self._rng = random.Random(f"{self._seed}:{self._epoch}:samples")
            self._buffer = []
            self._pending = deque()
            self._end = None
            if resume is not None:
                if resume.get("rng") is not None:
                    self._rng.setstate(_as_rng_state(resume["rng"]))
                self._buffer = list(resume.get("buffer") or [])
            first_file = cursor["file"] if cursor else 0
            self._cursor = dict(cursor) if cursor else None
            self._resume = None
            decoders = {f.url: decoder_for(f, self._format) for f in files}
            sequential = _sequential(decoders.values())
            if sequential is not None:  # TAR shards: streamed, not planned into units
                mine = files if by_file else files[self._rank :: self._world_size]
                streamed = self._streamed(sequential, mine, manifest, fetcher, cursor)
                try:
                    async for item in streamed:
                        yield item
                finally:
                    await streamed.aclose()  # on this task: it holds a task group's scope
                return

            async def plan_jobs() -> AsyncIterator[Job[tuple[int, list[Unit]]]]:
                for pos in range(first_file, len(files)):
                    f = files[pos]
                    run = partial(self._plan, decoders[f.url], f, fetcher, pos)
                    yield Job(_PLAN_COST, run)

            async def unit_jobs(
                planned: Prefetcher[tuple[int, list[Unit]]],
            ) -> AsyncIterator[Job[Any]]:
                seq = cursor["file_seq"] if cursor else 0
                async for pos, units in planned:
                    self._files += 1
                    file_seq = seq
                    last = units[-1] if units else None
                    for unit in units:
                        seq += 1
                        if not by_file and (seq - 1) % self._world_size != self._rank:
                            continue
                        skip = 0
                        if cursor is not None and pos == cursor["file"]:
                            if unit.index < cursor["unit"]:
                                continue
                            if unit.index == cursor["unit"]:
                                if cursor["done"]:
                                    continue
                                skip = cursor["row"]
                        # After a file's last unit, the cursor moves to the next file.
                        after = file_seq + len(units) if unit is last else None
                        tag = _Tag(pos, unit.index, file_seq, skip, next_file_seq=after)
                        decoder = decoders[unit.file.url]
                        run = partial(self._load, decoder, unit, fetcher, tag, sizes)
                        yield Job(sizes.reserve(unit), run, held=_held_bytes)
                        await sizes.measured.wait()

            sizes = _UnitSizes()
            plan_ahead = Prefetcher(plan_jobs(), max_count=opts.prefetch_count, max_bytes=1 << 62)
            async with plan_ahead:
                loaded = Prefetcher(
                    unit_jobs(plan_ahead),
                    max_count=opts.prefetch_count,
                    max_bytes=opts.prefetch_bytes,
                )
                self._prefetch = loaded
                async with loaded:
                    async for item in loaded:
                        yield item
            self._end = {"file": len(files), "unit": 0, "row": 0, "done": True, "file_seq": 0}

    # -- sequential formats: one long read per file, chunks through a readahead -----------

    async def _streamed(
        self,
        decoder: SequentialDecoder[Any],
        files: Sequence[FileRef],
        manifest: Manifest,
        fetcher: RangeFetcher,
        cursor: Mapping[str, Any] | None,
    ) -> AsyncGenerator[tuple[_Tag, Any], None]:
        """Loaded chunks of files read front to back, ``decoder.readahead`` files ahead.

        The cursor of such a file is (file, row, offset or skip): a resume reads
        from the byte after the last sample delivered (or passes ``skip``
        samples of a compressed file), so nothing delivered is read again.
        """
        opts = self._options
        request = replace(self._request, rows=self._output == "python" and self._batch_size is None)
        first = cursor["file"] if cursor else 0
        pool = list(manifest.files)
        if decoder.resampled and not pool:
            raise SourceError("resampled=True: the source has no files to draw from")

        def file_at(pos: int) -> FileRef:
            if not decoder.resampled:
                return files[pos]
            key = f"{self._seed}:{self._epoch}:{self._rank}:{self._world_size}:resampled:{pos}"
            return pool[random.Random(key).randrange(len(pool))]

        async def lanes() -> AsyncIterator[Lane[tuple[_Tag, Any]]]:
            positions = itertools.count(first) if decoder.resampled else range(first, len(files))
            for pos in positions:
                start = Position()
                if cursor is not None and pos == cursor["file"]:
                    if cursor["done"]:
                        continue
                    start = Position(cursor.get("offset"), cursor.get("skip", 0), cursor["row"])
                yield partial(self._lane, decoder, file_at(pos), fetcher, request, start, pos)

        readahead: LaneReadahead[tuple[_Tag, Any]] = LaneReadahead(
            lanes(),
            max_open=1 + decoder.readahead,
            max_lanes=max(opts.prefetch_count, 1 + decoder.readahead),
            max_bytes=opts.prefetch_bytes,
        )
        self._prefetch = readahead
        async with readahead:
            async for item in readahead:
                yield item
        self._end = {"file": len(files), "unit": 0, "row": 0, "done": True, "file_seq": 0}

    async def _lane(
        self,
        decoder: SequentialDecoder[Any],
        file: FileRef,
        source: RangeFetcher,
        request: ReadRequest,
        start: Position,
        pos: int,
        emit: Emit[tuple[_Tag, Any]],
    ) -> None:
        """One file, read by its decoder in a task of its own, chunks into the readahead."""
        self._files += 1

        async def put(chunk: Chunk) -> None:
            await emit(chunk.nbytes, (_Tag(pos, 0, 0, chunk.first_row, chunk), chunk.rows))

        await decoder.read_chunks(file, source, request, start, put)

    async def _plan(
        self, decoder: Decoder[Any], file: FileRef, source: ByteSource, pos: int
    ) -> tuple[int, list[Unit]]:
        return pos, await decoder.plan(file, source, self._request)

    async def _load(
        self, decoder: Decoder[Any], unit: Unit, source: ByteSource, tag: _Tag, sizes: _UnitSizes
    ) -> tuple[_Tag, Any]:
        try:
            fetched = await decoder.fetch(unit, source)
            table = await anyio.to_thread.run_sync(self._decode, decoder, unit, fetched, tag)
            sizes.learn(unit, _held_bytes((tag, table)))
            return tag, table
        finally:
            sizes.measured.set()

    def _decode(self, decoder: Decoder[Any], unit: Unit, fetched: Any, tag: _Tag) -> Any:
        table = decoder.decode(unit, fetched, self._request)
        if self._shuffle_buffer and self._output == "arrow" and table.num_rows > 1:
            rng = random.Random(f"{self._seed}:{self._epoch}:{unit.file.url}:{unit.index}")
            order = list(range(table.num_rows))
            rng.shuffle(order)
            table = table.take(order)
        if tag.offset:
            table = table.slice(tag.offset)
        return table  # dict rows are made as they are taken: the readahead holds Arrow

    def _advance(self, tag: _Tag, rows: int, done: bool) -> None:
        chunk = tag.chunk
        if done and tag.next_file_seq is not None:  # a resume starts at the next file
            self._cursor = {
                "file": tag.file + 1,
                "unit": 0,
                "row": 0,
                "done": False,
                "file_seq": tag.next_file_seq,
            }
            return
        self._cursor = {
            "file": tag.file,
            "unit": tag.unit,
            "row": tag.offset + rows,
            "done": done if chunk is None else done and chunk.final,
            "file_seq": tag.file_seq,
        }
        if chunk is not None:  # a sequentially read file: where its next sample starts
            at = chunk.positions[rows]  # as chunk.resume_at(rows), without an object per row
            self._cursor["offset"] = at if chunk.by_offset else None
            self._cursor["skip"] = 0 if chunk.by_offset else at

    def _emit(self, out: Any) -> Any:
        if self._first_sample is None:
            self._first_sample = time.monotonic() - self._started
        return out

    def _shape_unit(self, tag: _Tag, payload: Any) -> Iterator[Any]:
        """The samples (rows, batches) of one loaded unit; the cursor moves as each
        sample is taken, so it always describes what the consumer has."""
        self._units += 1
        if self._batch_size is not None:
            self._pending.append([tag, payload, 0])
            self._held += payload.num_rows
            while self._held >= self._batch_size:
                self._held -= self._batch_size
                yield self._emit(self._take(self._pending, self._batch_size))
            return
        if self._output == "arrow":
            batches = _batches(payload)
            if not batches:
                self._advance(tag, 0, True)
            done_rows = 0
            for i, batch in enumerate(batches):
                done_rows += batch.num_rows
                self._advance(tag, done_rows, i == len(batches) - 1)
                self._samples += batch.num_rows
                yield self._emit(batch)
            return
        buffer, rng, size = self._buffer, self._rng, self._shuffle_buffer
        assert rng is not None
        last = len(payload) - 1
        if last < 0:
            self._advance(tag, 0, True)
        for i, row in enumerate(_rows(payload)):
            self._advance(tag, i + 1, i == last)
            if size:
                if len(buffer) < size:
                    buffer.append(row)
                    continue
                j = rng.randrange(len(buffer))
                row, buffer[j] = buffer[j], row
            self._samples += 1
            yield self._emit(row)

    def _shape_end(self) -> Iterator[Any]:
        """What is held when the units end: a last partial batch, the shuffle buffer."""
        if self._held:
            held, self._held = self._held, 0
            yield self._emit(self._take(self._pending, held))
        if self._buffer:
            rng, buffer = self._rng, self._buffer
            assert rng is not None
            while buffer:
                # One draw per sample, so a state taken mid-drain resumes the same order.
                j = rng.randrange(len(buffer))
                buffer[j], buffer[-1] = buffer[-1], buffer[j]
                self._samples += 1
                yield self._emit(buffer.pop())
        if self._end is not None:
            self._cursor = self._end

    def _take(self, pending: deque[list[Any]], n: int) -> Any:
        """The next n rows across the pending tables, as one batch; advances the cursor."""
        pieces: list[pa.Table] = []
        while n:
            tag, table, taken = pending[0]
            k = min(n, table.num_rows - taken)
            pieces.append(table.slice(taken, k))
            taken += k
            n -= k
            done = taken == table.num_rows
            self._advance(tag, taken, done)
            if done:
                pending.popleft()
            else:
                pending[0][2] = taken
        batch = pa.concat_tables(pieces)
        self._samples += batch.num_rows
        if self._output == "arrow":
            return batch.combine_chunks().to_batches()[0]
        return batch.to_pydict()


class _Failure:
    """An error of the producer, handed to the consumer through the channel."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class _Iteration:
    """One ``async for`` over a stream: a producer task in the stream's task group loads
    units into a bounded channel; ``__anext__`` shapes them into samples on the
    consumer's task. Nothing is held across the consumer's code but the channel: no
    cancel scope, task group or lock, so leaving the loop (``break``, an error in its
    body, a cancellation) at any point is clean; the stream's ``async with`` exit stops
    the producer and waits for its cleanup."""

    def __init__(self, stream: Stream, tg: TaskGroup) -> None:
        self._stream = stream
        self._tg = tg
        self._send: MemoryObjectSendStream[Any]
        self._receive: MemoryObjectReceiveStream[Any]
        self._send, self._receive = anyio.create_memory_object_stream[Any](_CHANNEL_UNITS)
        self._scope: anyio.CancelScope | None = None
        self._started = False
        self._closed = False
        self._samples: Iterator[Any] | None = None
        self._ended = False

    def __aiter__(self) -> _Iteration:
        return self

    async def __anext__(self) -> Any:
        stream = self._stream
        while True:
            if self._samples is not None:
                for sample in self._samples:
                    return sample
                self._samples = None
            if self._ended or self._closed:
                raise StopAsyncIteration
            if not self._started:
                self._started = True
                stream._started = time.monotonic()
                self._scope = await self._tg.start(self._produce)
            try:
                item = await self._receive.receive()
            except anyio.EndOfStream:
                self._ended = True
                self._samples = stream._shape_end()
                continue
            except anyio.ClosedResourceError:
                raise StopAsyncIteration from None
            if isinstance(item, _Failure):
                self.close()
                raise item.error
            tag, payload = item
            self._samples = stream._shape_unit(tag, payload)

    async def _produce(self, *, task_status: TaskStatus[anyio.CancelScope]) -> None:
        with anyio.CancelScope() as scope:
            task_status.started(scope)
            async with self._send as send:
                units = self._stream._loaded_units()
                try:
                    try:
                        async for item in units:
                            await send.send(item)
                    finally:
                        await units.aclose()  # on this task, which holds its scopes
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # the consumer is gone
                except Exception as exc:  # raised in the consumer, in order
                    with contextlib.suppress(anyio.BrokenResourceError):
                        await send.send(_Failure(exc))

    def close(self) -> None:
        """Stop this iteration: its producer is cancelled, its channel closed."""
        if self._closed:
            return
        self._closed = True
        self._samples = None
        if self._scope is not None:
            self._scope.cancel()
        self._receive.close()
        if not self._started:
            self._send.close()

    async def aclose(self) -> None:
        self.close()

    def __del__(self) -> None:
        # Left without close() (``break`` out of the loop): the producer's next send
        # finds the channel closed and ends; the stream's exit waits for it.
        if not self._closed:
            self._closed = True
            self._receive.close()
            if not self._started:
                self._send.close()


class _UnitSizes:
    """What a unit will hold while it loads, learned from the units loaded so far.

    A unit's own estimate is its fetched bytes plus its decoder's guess of its
    decoded bytes, which can be far off (a dictionary-encoded column decodes to
    many times its size in the file). The readahead reserves the estimate
    times the largest ratio of held to estimated bytes seen so far; until the
    first unit is measured, the others wait, so no guess is taken on trust.
    """

    def __init__(self) -> None:
        self.ratio = 1.0
        self.measured = anyio.Event()

    def reserve(self, unit: Unit) -> int:
        return int((unit.cost + unit.decoded) * self.ratio)

    def learn(self, unit: Unit, held: int) -> None:
        estimate = unit.cost + unit.decoded
        if estimate > 0:
            self.ratio = max(self.ratio, held / estimate)


@dataclass(frozen=True)
class _Tag:
    """Where a loaded unit sits: its file (position in this rank's order), its unit
    index, the count of units before its file (for unit-level rank splits), and the
    rows skipped at its start on resume. A chunk of a sequentially read file has
    unit 0, its first row's number in the file as offset, and its Chunk (for the
    resume position after each row)."""

    file: int
    unit: int
    file_seq: int
    offset: int
    chunk: Chunk | None = None
    next_file_seq: int | None = None  # the file_seq of the next file, on a file's last unit


def _sequential(decoders: Any) -> SequentialDecoder[Any] | None:
    """The one sequential decoder of a stream's files, None if they have none."""
    found = {id(d): d for d in decoders}
    sequential = [d for d in found.values() if isinstance(d, SequentialDecoder)]
    if not sequential:
        return None
    if len(found) > 1:
        names = sorted({d.name for d in found.values()})
        raise SourceError(
            f"the source mixes formats {', '.join(names)}: stream each format separately"
        )
    return sequential[0]


def _as_rng_state(state: Any) -> tuple[Any, ...]:
    """random.Random state, also after a JSON round trip (lists instead of tuples)."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


_ROWS_PER_CONVERSION = 1024


def _rows(payload: pa.Table | list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The dict rows of a loaded unit; a table is converted a slice at a time, so
    Python objects exist for the rows being taken, not for the whole readahead."""
    if isinstance(payload, list):
        yield from payload
        return
    for start in range(0, payload.num_rows, _ROWS_PER_CONVERSION):
        yield from payload.slice(start, _ROWS_PER_CONVERSION).to_pylist()


def _held_bytes(loaded: tuple[_Tag, pa.Table]) -> int:
    """What a loaded unit holds: its table's buffers."""
    return int(loaded[1].get_total_buffer_size())


def _batches(table: pa.Table) -> list[pa.RecordBatch]:
    if not table.num_rows:
        return []
    return [b for b in table.combine_chunks().to_batches() if b.num_rows]
