"""stream() and Stream: planning, readahead, output shaping, statistics.

    async with ash.stream("hf://datasets/org/name", split="train") as s:
        async for row in s:
            ...

Data flows one way: sources -> Resolver (Manifest) -> plan (shard order, rank
selection) -> decoder units -> RangeFetcher -> Prefetcher -> shuffle buffer and
batching -> the consumer.
"""

from __future__ import annotations

import itertools
import os
import random
from collections import deque
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.compute as pc

from ._client import HubClient
from ._decode_pool import decoding
from ._elastic import (
    JOB_KIND,
    StreamShare,
    check_stream_state,
    elastic_field,
    job_to_consumer,
    share_for,
)
from ._elastic import start_of as _start
from ._engine import (
    Engine,
    EngineStatistics,
    ShuffleBuffer,
    check_state,
    digest,
    epoch_order,
    rank_share,
    shuffle_buffer_size,
)
from ._exceptions import DecodeError, SourceError
from ._fetcher import RangeFetcher
from ._interleave import Interleaved, interleaved
from ._models import FileRef, Manifest
from ._options import StreamOptions
from ._prefetch import Job, Prefetcher
from ._readahead import Emit, Lane, LaneReadahead
from ._received import Received
from ._sequential import read_sequential
from ._sources import parse_sources
from ._stalls import run_decode
from ._stream_state import check_cursor, check_unit
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
from .formats._split import usable_cpus

__all__ = ["Stream", "StreamStatistics", "stream"]

Output = Literal["python", "arrow"]
_PLAN_COST = 64 * 1024  # bytes a file's plan (its footer or index read) holds
_STATE_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class StreamStatistics(EngineStatistics):
    """What a stream did so far: samples, files, units, time to first sample, and the
    requests, bytes and retries of its reading (``EngineStatistics``).

    ``skipped_samples``: samples passed over under a decoder's ``on_error`` (a TAR
    sample that ``decode=`` failed on). ``damaged_files``: files whose rest was
    skipped under ``on_error`` (a corrupt or truncated TAR shard, a failed read),
    after every sample before the damage. Each skip is also warned or logged."""

    samples: int
    files: int
    units: int
    time_to_first_sample: float | None
    skipped_samples: int = 0
    damaged_files: int = 0


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
) -> Stream | Interleaved:
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
    cache the stream uses; by default the event loop's shared one. With
    ``StreamOptions(shuffle_units=K)`` and ``shuffle``, the rows are drawn from K units
    read side by side (an ``Interleaved`` stream; see ``_interleave``).
    """
    make = partial(
        Stream, source, split=split, config=config, data_files=data_files, format=format,
        columns=columns, filter=filter, batch_size=batch_size, output=output, seed=seed,
        token=token, endpoint=endpoint, client=client,
    )  # fmt: skip
    if options is not None and options.shuffle_units > 1 and shuffle_buffer_size(shuffle):
        return interleaved(make, shuffle_buffer_size(shuffle), rank, world_size, options)
    return make(shuffle=shuffle, rank=rank, world_size=world_size, options=options)


class Stream(Engine["tuple[_Tag, Any]"]):
    """One lazy stream: async-iterable, closable, observable. See :func:`stream`.

    The engine (``_engine.Engine``) gives its life and iteration; this class plans
    files into units, loads them, and shapes them into rows or batches."""

    _kind = "Stream"
    _again = "call stream(...) again"

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
        buffer = shuffle_buffer_size(shuffle)
        if columns is not None and (isinstance(columns, str) or not columns):
            raise SourceError(f"columns={columns!r}: give a non-empty list of column names")
        if filter is not None and not isinstance(filter, pc.Expression):
            raise SourceError(
                f"filter={filter!r}: give a pyarrow.compute expression, "
                "e.g. pyarrow.compute.field('score') > 0.5"
            )
        if not isinstance(source, Manifest):
            parse_sources(source)  # bad sources fail here, before any I/O
        if endpoint is None and isinstance(source, Manifest):
            endpoint = source.endpoint
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
        self._source = source
        self._split = split
        self._config = config
        self._data_files = data_files
        self._format = format
        self._request = ReadRequest(
            tuple(columns) if columns else None,
            filter,
            verify_checksums=self._options.verify_checksums,
            max_unit_bytes=self._options.prefetch_bytes,
        )
        self._batch_size = batch_size
        self._output: Output = output
        self._manifest: Manifest | None = None
        self._samples = 0
        self._files = 0
        self._units = 0
        self._skipped_samples = 0
        self._damaged_files = 0
        self._resume: dict[str, Any] | None = None
        self._cursor: dict[str, Any] | None = None
        self._files_order: list[FileRef] | None = None
        self._shuffle: ShuffleBuffer[Any] | None = None
        self._pending: deque[list[Any]] = deque()  # [tag, table, rows taken] for batches
        self._held = 0  # rows in _pending not yet taken
        self._end: dict[str, Any] | None = None
        self._elastic: dict[str, Any] | None = None  # the share's state field (elastic)

    # -- lifecycle: the engine's ------------------------------------------------

    @property
    def manifest(self) -> Manifest | None:
        """The files being read, once resolved."""
        return self._manifest

    def statistics(self) -> StreamStatistics:
        return StreamStatistics(
            samples=self._samples,
            files=self._files,
            units=self._units,
            time_to_first_sample=self._first_sample,
            skipped_samples=self._skipped_samples,
            damaged_files=self._damaged_files,
            **self._engine_statistics(),
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
            "buffer": self._shuffle.state()[0] if self._shuffle is not None else [],
            "rng": self._shuffle.state()[1] if self._shuffle is not None else None,
            "samples": self._samples,
            **({"elastic": elastic_field(self)} if self._options.elastic else {}),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue, on the next iteration, exactly where ``state`` was taken.

        Every field is checked here (types, ranges, the shuffle buffer's samples), and
        the cursor again against the files and units once they are planned: a changed
        state is a ``SourceError`` naming the field."""
        if not isinstance(state, Mapping):
            raise SourceError(f"state is a {type(state).__name__}, not a state_dict() (a dict)")
        if state.get("kind") == JOB_KIND:  # merge_states(): this consumer's part of it
            state = job_to_consumer(state, None, self, _STATE_VERSION)
        check_state(
            state,
            version=_STATE_VERSION,
            kind=None,
            same={"seed": self._seed, "rank": self._rank, "world_size": self._world_size},
        )
        rows = self._output == "python" and self._batch_size is None
        extra = check_stream_state(state, self)  # a merged job's buffers, shared out
        check_cursor(state, self._shuffle_buffer + extra if rows else 0)
        self._epoch = int(state["epoch"])
        self._resume = dict(state)
        self._samples = int(state.get("samples") or 0)

    # -- the pipeline --------------------------------------------------------

    def _begin(self) -> dict[str, Any] | None:
        """The loaded state, if any: the producer takes it up and holds the cursor from then
        (a second run of ``_loaded_units``, with a fresh pin, starts from it again)."""
        return self._resume

    async def _loaded_units(
        self, begun: dict[str, Any] | None
    ) -> AsyncGenerator[tuple[_Tag, Any], None]:
        """Resolve, plan, fetch and decode: loaded units in order, read ahead."""
        opts = self._options
        resume = begun  # taken up (self._resume set to None) once the cursor holds it
        async with self._reading(
            opts, token=self._token, endpoint=self._endpoint, client=self._client
        ) as readers:
            resolver, fetcher = readers.resolver, readers.fetcher
            if isinstance(self._source, Manifest):
                manifest = self._source  # resolved elsewhere (e.g. in a DataLoader's parent)
            else:
                manifest = await resolver.resolve(
                    self._source,
                    config=self._config,
                    split=self._split,
                    data_files=self._data_files,
                )
            self._manifest = manifest
            share = share_for(self, manifest, resume) if opts.elastic else None
            self._elastic = share.elastic if share is not None else None
            if share is not None:  # every n-th unit of the epoch's one order
                files, by_file = share.files, True
            else:
                files = epoch_order(
                    manifest.files,
                    seed=self._seed,
                    epoch=self._epoch,
                    shuffle=bool(self._shuffle_buffer),
                    what="files",
                )
                # Whole files per rank when there are enough; else every rank plans
                # every file and keeps every world_size-th unit.
                files, split_units = rank_share(files, self._rank, self._world_size)
                by_file = not split_units
            self._files_order = files
            cursor = resume.get("cursor") if resume else None
            if resume is not None and resume.get("files") not in (None, len(files)):
                raise SourceError(
                    f"state was saved over {resume['files']} files but the source now has "
                    f"{len(files)} for this rank: the dataset changed; start a new epoch"
                )
            self._shuffle = None
            if self._shuffle_buffer:
                seed = share.seed if share else f"{self._seed}:{self._epoch}:samples"
                self._shuffle = ShuffleBuffer(self._shuffle_buffer, seed)
            self._pending = deque()
            self._end = None
            if resume is not None and self._shuffle is not None:
                self._shuffle.restore(resume.get("buffer") or [], resume.get("rng"))
            first_file = cursor["file"] if cursor else 0
            self._cursor = dict(cursor) if cursor else None
            self._resume = None
            decoders = {f.url: decoder_for(f, self._format) for f in files}
            sequential = _sequential(decoders.values())
            if sequential is not None:  # TAR shards: streamed, not planned into units
                mine = files if by_file else files[self._rank :: self._world_size]
                streamed = self._streamed(sequential, mine, manifest, fetcher, cursor, share)
                try:
                    async for item in streamed:
                        yield item
                finally:
                    await streamed.aclose()  # on this task: it holds a task group's scope
                return

            async def plan_jobs() -> AsyncIterator[Job[tuple[int, list[Unit]]]]:
                for pos in range(first_file, len(files)):
                    f = files[pos]
                    run = partial(self._plan, decoders[f.url], f, received, pos)
                    yield Job(_PLAN_COST, run, group=pos)

            async def unit_jobs(
                planned: Prefetcher[tuple[int, list[Unit]]],
            ) -> AsyncIterator[Job[list[tuple[_Tag, Any]]]]:
                seq = cursor["file_seq"] if cursor else 0
                head = None if cursor or share else _head_range(files, decoders, join_limit)
                if head is not None:
                    # Read beside the first file's plan; its units cut their bytes from it.
                    file, start, end = head
                    read = partial(_read_head, received, file, start, end)
                    yield Job(end - start, read, group=0, more_in_group=True, grows=False)
                async for pos, units in planned:
                    at = _start(share, pos, cursor)
                    if at is not None:
                        check_unit(at, files[pos], units)
                    self._files += 1
                    file_seq = seq
                    last = units[-1] if units else None
                    kept: list[tuple[Unit, int]] = []  # this rank's units, rows to skip
                    for unit in units:
                        seq += 1
                        if not by_file and (seq - 1) % self._world_size != self._rank:
                            continue
                        if share is not None and not share.keeps(pos, unit):
                            continue  # another slice's row group
                        skip = 0
                        if at is not None:
                            if unit.index < at["unit"]:
                                continue
                            if unit.index == at["unit"]:
                                if at["done"]:
                                    continue
                                skip = at["row"]
                        kept.append((unit, skip))
                    last_kept = kept[-1][0] if kept else None
                    if share is not None:  # the cursor moves on after its slice's last
                        last = last_kept
                    if last_kept is None:  # none of its units is this rank's
                        received.forget(files[pos])
                    group: list[tuple[Unit, _Tag]] = []
                    heaviest = weight = 0  # of the run in ``group``, as the readahead reserves
                    for unit, skip in kept:
                        # After a file's last unit, the cursor moves to the next file.
                        after = file_seq + len(units) if unit is last else None
                        tag = _Tag(pos, unit.index, file_seq, skip, next_file_seq=after)
                        group.append((unit, tag))
                        reserved = sizes.reserve(unit)
                        heaviest, weight = max(heaviest, reserved), weight + reserved
                        # Small units side by side load together: their bytes in one
                        # request, their decodes in one thread hand-off (_load); once a
                        # unit is measured, for an estimate can be far off (_UnitSizes).
                        joins = (
                            join_limit > 0
                            and decoders[unit.file.url].joins_units
                            and sizes.measured.is_set()
                            and _joins(heaviest, weight, join_limit)
                        )
                        if unit is not last_kept and joins:
                            continue
                        job = self._unit_job(
                            decoders, group, received, sizes, decoding, last=unit is last_kept
                        )
                        group = []
                        heaviest = weight = 0
                        # Whether more of this file's units follow for this rank: none after
                        # its last kept one, though other ranks' may.
                        yield replace(job, group=pos, more_in_group=unit is not last_kept)
                        sizes.started += 1
                        if sizes.started >= _UNMEASURED_UNITS:
                            await sizes.measured.wait()
                    # The last kept unit always ends its run: none is left behind.
                    assert not group, "a run of units did not end with its file"

            # The bytes read with a file's footer, and the first file's head: kept until
            # the file's last unit is fetched, they serve its units' reads of them.
            received = Received(fetcher)
            sizes = _UnitSizes()
            # Units loaded together hold a block at most, and a quarter of the budget; only
            # units side by side in their file join (whole files for this rank, every
            # column, no row group pruned): a read of several never spans bytes not asked.
            whole = by_file and self._request.columns is None and self._request.filter is None
            join_limit = min(opts.block_size, opts.prefetch_bytes // 4) if whole else 0
            # Decodes beyond the cores only slow the one the consumer waits for.
            decoding = anyio.CapacityLimiter(usable_cpus())
            # One ramp bounds both readaheads: the files planned (a resolver request and
            # a tail read each) and the files whose units are loading are at most its
            # window together, which grows as units reach the consumer (slow start). The
            # row groups of a file being read load freely (they cost no resolution); a
            # plan waits for the ramp even when none is held, for each opens a file.
            ramp = self._ramp(opts.prefetch_count)
            plan_ahead = Prefetcher(
                plan_jobs(),
                max_count=opts.prefetch_count,
                max_bytes=1 << 62,
                ramp=ramp,
                grow_ramp=False,
                ramp_first=True,
            )
            async with plan_ahead:
                # Row groups smaller than a block count as their share of a unit: a
                # file of small row groups keeps enough bytes in flight to hide the
                # round trip of each (at most four times prefetch_count of them).
                loaded = self._read_ahead(
                    unit_jobs(plan_ahead), opts, ramp, unit_bytes=opts.block_size
                )
                try:
                    async for items in loaded:
                        for item in items:
                            if isinstance(item[1], _Failed):
                                raise item[1].error
                            yield item
                finally:
                    await loaded.aclose()  # on this task, which holds its scopes
            self._end = {"file": len(files), "unit": 0, "row": 0, "done": True, "file_seq": 0}

    # -- sequential formats: one long read per file, chunks through a readahead -----------

    async def _streamed(
        self,
        decoder: SequentialDecoder[Any],
        files: Sequence[FileRef],
        manifest: Manifest,
        fetcher: RangeFetcher,
        cursor: Mapping[str, Any] | None,
        share: StreamShare | None,
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
                at = _start(share, pos, cursor)
                if at is not None:
                    if at["done"]:
                        continue
                    size, offset = file_at(pos).size, at.get("offset")
                    if size is not None and offset is not None and offset > size:
                        raise SourceError(
                            f"state['cursor']['offset'] is {offset}, past the {size} bytes "
                            f"of {file_at(pos).url}: load a state_dict() of this stream, "
                            "unchanged"
                        )
                    start = Position(at.get("offset"), at.get("skip", 0), at["row"])
                yield partial(self._lane, decoder, file_at(pos), fetcher, request, start, pos)

        readahead: LaneReadahead[tuple[_Tag, Any]] = LaneReadahead(
            lanes(),
            max_open=1 + decoder.readahead,
            max_lanes=max(opts.prefetch_count, 1 + decoder.readahead),
            max_bytes=opts.prefetch_bytes,
            ramp=self._ramp(max(opts.prefetch_count, 1 + decoder.readahead)),
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
            self._skipped_samples += chunk.skipped
            self._damaged_files += chunk.damaged
            await emit(chunk.nbytes, (_Tag(pos, 0, 0, chunk.first_row, chunk), chunk.rows))

        await read_sequential(decoder, file, source, request, start, put)

    async def _plan(
        self, decoder: Decoder[Any], file: FileRef, source: ByteSource, pos: int
    ) -> tuple[int, list[Unit]]:
        return pos, await decoder.plan(file, source, self._request)

    def _unit_job(
        self,
        decoders: Mapping[str, Decoder[Any]],
        group: list[tuple[Unit, _Tag]],
        source: Received,
        sizes: _UnitSizes,
        decoding: anyio.CapacityLimiter,
        *,
        last: bool,
    ) -> Job[list[tuple[_Tag, Any]]]:
        """The job that loads a run of units of one file (usually one unit); ``last``:
        the run ends the file's units for this rank (its kept bytes are let go then)."""
        decoder = decoders[group[0][0].file.url]
        run = partial(self._load, decoder, group, source, sizes, decoding, last=last)
        return Job(sum(sizes.reserve(unit) for unit, _ in group), run, held=_held_bytes)

    async def _load(
        self,
        decoder: Decoder[Any],
        group: list[tuple[Unit, _Tag]],
        source: Received,
        sizes: _UnitSizes,
        decoding: anyio.CapacityLimiter,
        *,
        last: bool,
    ) -> list[tuple[_Tag, Any]]:
        """Fetch and decode units of one file: (tag, table) of each, in order."""
        units = [unit for unit, _ in group]
        try:
            try:
                fetched = await decoder.fetch_many(units, source)
            finally:
                # The units before it started first and have asked for their bytes; one
                # that had not would fetch its kept bytes again, not fail.
                if last:
                    source.forget(units[0].file)
            loaded = await run_decode(self._decode_all, decoder, group, fetched, limiter=decoding)
            for (unit, _), item in zip(group, loaded, strict=False):  # shorter if one failed
                if not isinstance(item[1], _Failed):
                    sizes.learn(unit, _held_bytes([item]))
            return loaded
        finally:
            sizes.measured.set()

    def _decode_all(
        self, decoder: Decoder[Any], group: list[tuple[Unit, _Tag]], fetched: list[Any]
    ) -> list[tuple[_Tag, Any]]:
        """Decode each unit in turn; a unit that fails ends the run with its error in
        place of its table, so that the units before it are still delivered."""
        loaded: list[tuple[_Tag, Any]] = []
        with decoding():  # a large row group's columns on the process's decode threads
            for (unit, tag), data in zip(group, fetched, strict=True):
                try:
                    loaded.append((tag, self._decode(decoder, unit, data, tag)))
                except Exception as exc:
                    loaded.append((tag, _Failed(exc)))
                    break
        return loaded

    def _decode(self, decoder: Decoder[Any], unit: Unit, fetched: Any, tag: _Tag) -> Any:
        table = decoder.decode(unit, fetched, self._request)
        if tag.offset > len(table):  # a resumed unit: its rows taken are at most its rows
            raise SourceError(
                f"state['cursor']['row'] is {tag.offset}, past the {len(table)} rows of "
                f"{unit.file.url}, unit {unit.index}: the state is of another stream or was "
                "changed; load a state_dict() of this stream, unchanged"
            )
        permute = self._output == "arrow" or self._options.elastic  # rows: a buffer's job
        if self._shuffle_buffer and permute and table.num_rows > 1:
            # Elastic: the file by its path, so that the order is the same from any host.
            name = _without_host(unit.file.url) if self._options.elastic else unit.file.url
            rng = random.Random(f"{self._seed}:{self._epoch}:{name}:{unit.index}")
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

    def _shape_unit(self, loaded: tuple[_Tag, Any]) -> Iterator[Any]:
        """The samples (rows, batches) of one loaded unit; the cursor moves as each
        sample is taken, so it always describes what the consumer has."""
        tag, payload = loaded
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
        shuffle = self._shuffle
        last = len(payload) - 1
        if last < 0:
            self._advance(tag, 0, True)
        for i, row in enumerate(_rows(payload, partial(self._unit_name, tag))):
            self._advance(tag, i + 1, i == last)
            self._left = last - i
            if shuffle is not None:
                out = shuffle.push(row)
                if out is None:
                    continue
                row = out
            self._samples += 1
            yield self._emit(row)

    def _holds_more(self) -> bool:
        """Rows of the unit being taken still to come, or samples in the shuffle buffer
        (which all come out, at the latest when it drains)."""
        return self._left > 0 or (self._shuffle is not None and len(self._shuffle) > 0)

    def _identity(self) -> str:
        """What this stream reads, by the arguments that decide its samples and their
        order (seed, rank and world_size are checked on their own)."""
        fmt = self._format
        return digest(
            {
                "source": _source_name(self._source),
                "split": self._split,
                "config": self._config,
                "data_files": self._data_files,
                "format": fmt if fmt is None or isinstance(fmt, str) else fmt.name,
                "columns": self._request.columns,
                "filter": None if self._request.filter is None else str(self._request.filter),
                "batch_size": self._batch_size,
                "output": self._output,
                "shuffle": self._shuffle_buffer,
            }
        )

    def _state_ended(self, state: Mapping[str, Any]) -> bool | None:
        cursor, files = state.get("cursor"), state.get("files")
        if cursor is None or files is None:
            return False
        return bool(cursor["file"] >= files and not state.get("buffer"))

    def _sample_shape(self) -> str | None:
        if self._batch_size is not None:
            return f"batches (batch_size={self._batch_size})"
        if self._output != "python":
            return f"Arrow record batches (output={self._output!r})"
        return None

    def _shape_end(self) -> Iterator[Any]:
        """What is held when the units end: a last partial batch, the shuffle buffer."""
        if self._held:
            held, self._held = self._held, 0
            yield self._emit(self._take(self._pending, held))
        if self._shuffle is not None:
            # One draw per sample, so a state taken mid-drain resumes the same order.
            for row in self._shuffle.drain():
                self._samples += 1
                yield self._emit(row)
        if self._end is not None:
            self._cursor = self._end

    def _take(self, pending: deque[list[Any]], n: int) -> Any:
        """The next n rows across the pending tables, as one batch; advances the cursor."""
        pieces: list[pa.Table] = []
        tags: list[_Tag] = []
        while n:
            tag, table, taken = pending[0]
            k = min(n, table.num_rows - taken)
            pieces.append(table.slice(taken, k))
            tags.append(tag)
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
        try:
            return batch.to_pydict()
        except (ValueError, OverflowError) as exc:  # UnicodeDecodeError is a ValueError
            names = " or ".join(dict.fromkeys(self._unit_name(tag) for tag in tags))
            raise _conversion_error(names, exc) from exc

    def _unit_name(self, tag: _Tag, start: int | None = None) -> str:
        """The file (and row group, and rows) of a loaded unit, for an error message."""
        files = self._files_order
        name = files[tag.file].url if files is not None and tag.file < len(files) else "a file"
        if tag.chunk is None:
            name += f", row group {tag.unit}"
            if start is not None:
                end = start + _ROWS_PER_CONVERSION
                name += f" (rows {tag.offset + start}-{tag.offset + end - 1})"
        return name


#: Units that start before any unit is measured (see ``_UnitSizes``).
_UNMEASURED_UNITS = 2


class _UnitSizes:
    """What a unit will hold while it loads, learned from the units loaded so far.

    A unit's own estimate is its fetched bytes plus its decoder's guess of its
    decoded bytes, which can be far off (a dictionary-encoded column decodes to
    many times its size in the file). The readahead reserves the estimate
    times the largest ratio of held to estimated bytes seen so far.

    Until a unit is measured, ``_UNMEASURED_UNITS`` units start on their own
    estimates, no more: the first, and the next one fetching while the first
    decodes (a start is mostly waiting on the network). So at most one unit beyond
    the first is held on a guess, and it is re-costed once decoded (the
    Prefetcher's ``held``); every unit after waits for the measured ratio.
    """

    def __init__(self) -> None:
        self.ratio = 1.0
        self.measured = anyio.Event()
        self.started = 0

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


def _source_name(source: Any) -> Any:
    """A stream's ``source`` as JSON: its strings, or a manifest's repo and files."""
    if isinstance(source, Manifest):
        return {
            "repo": source.repo_id,
            "commit": source.commit,
            "config": source.config,
            "split": source.split,
            "files": [f.url for f in source.files],
        }
    if isinstance(source, (str, os.PathLike)):
        return _without_host(os.fspath(source))
    return [_without_host(os.fspath(s)) for s in source]


def _without_host(source: str) -> str:
    """An http(s) URL without its scheme and host, so that the same files served from
    another host (a mirror, a test server on another port) are the same source."""
    parts = urlsplit(source)
    return parts.path if parts.scheme in ("http", "https") else source


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


_ROWS_PER_CONVERSION = 1024


def _rows(
    payload: pa.Table | list[dict[str, Any]], name: Callable[[int], str]
) -> Iterator[dict[str, Any]]:
    """The dict rows of a loaded unit; a table is converted a slice at a time, so
    Python objects exist for the rows being taken, not for the whole readahead.
    ``name(start)`` names the unit and its rows from ``start`` in an error."""
    if isinstance(payload, list):
        yield from payload
        return
    for start in range(0, payload.num_rows, _ROWS_PER_CONVERSION):
        try:
            rows = payload.slice(start, _ROWS_PER_CONVERSION).to_pylist()
        except (ValueError, OverflowError) as exc:  # UnicodeDecodeError is a ValueError
            raise _conversion_error(name(start), exc) from exc
        yield from rows


def _conversion_error(where: str, exc: Exception) -> DecodeError:
    """A value Arrow holds that Python cannot (invalid UTF-8 in a string column, a
    timestamp outside ``datetime``'s range): named, with the way to read it anyway."""
    return DecodeError(
        f"{where}: a value cannot be converted to Python ({type(exc).__name__}: {exc}); "
        "the file is corrupt, or holds values Python cannot represent: read it with "
        "output='arrow' to get the Arrow values as they are"
    )


def _held_bytes(loaded: Sequence[tuple[_Tag, Any]]) -> int:
    """What loaded units hold: their tables' buffers."""
    return sum(
        int(table.get_total_buffer_size()) for _, table in loaded if not isinstance(table, _Failed)
    )


@dataclass(frozen=True)
class _Failed:
    """A unit whose decode failed, in place of its table (``Stream._decode_all``)."""

    error: Exception


def _joins(heaviest: int, weight: int, limit: int) -> bool:
    """True while a run of units may take one more: each weighs (fetched and decoded,
    as the readahead reserves it) under a quarter of ``limit`` (a row group of a few
    hundred KB), and all of them with one more at most ``limit``. ``heaviest`` and
    ``weight``: the run's heaviest unit and its total, kept as it grows (a file of
    thousands of tiny row groups is not weighed again at each one)."""
    small = limit // 4
    return heaviest < small and weight < limit - small


def _head_range(
    files: Sequence[FileRef], decoders: Mapping[str, Decoder[Any]], limit: int
) -> tuple[FileRef, int, int] | None:
    """The first file's head (file, start, end), read beside its plan: where whole files
    are read (``limit`` > 0: every column, every row group of this rank's files)."""
    if limit <= 0 or not files:
        return None
    file = files[0]
    at = decoders[file.url].head_range(file, limit)
    return None if at is None else (file, *at)


async def _read_head(
    received: Received, file: FileRef, start: int, end: int
) -> list[tuple[_Tag, Any]]:
    """The head read as a readahead job, kept for the file's units: it delivers no rows."""
    await received.keep(file, start, end)
    return []


def _batches(table: pa.Table) -> list[pa.RecordBatch]:
    if not table.num_rows:
        return []
    # One batch per chunk: a row group decodes to a few chunks (formats.parquet), and
    # combining them would copy the unit on the consumer's thread.
    return [b for b in table.to_batches() if b.num_rows]
