"""WebDataset TAR shards: an incremental TAR reader, webdataset's sample grouping, planning,
and ``WebDatasetDecoder``, the sequential format that ``stream()`` drives.

Nothing here opens a file or a socket, starts a task or a thread: bytes come from
the stream's fetcher. The stream reads a shard with one long GET and feeds the
blocks, of any size, as they arrive to the shard's parser (in worker threads),
in essence::

    reader = TarReader(file.url)
    grouper = SampleGrouper(file.url)
    async with fetcher.iter_bytes(file) as blocks:      # one seamless byte stream
        async for block in blocks:
            for member in reader.feed(block):
                if (sample := grouper.push(member)) is not None:
                    yield sample
    reader.close()                                      # DecodeError if truncated
    if (sample := grouper.flush()) is not None:
        yield sample

The parts, each free of I/O: ``TarReader`` (``_tar.py``: ustar, GNU, pax and gzip
shards parsed incrementally, every header checked, offsets kept for resume),
``SampleGrouper`` (``_samples.py``: webdataset's key rule) and, here, the decoder:
``WebDatasetDecoder.parser`` gives the stream a parser of one shard that turns
blocks into chunks of samples; ``aiostream_hf._sequential`` drives it (the long
GET, the worker threads, the readahead, the salvage of a cut shard).

Differences from ``webdataset.WebDataset`` (1.0.2, reading through ``tarfile``),
all on purpose:

- no ``__local_path__``: webdataset adds it for local files only; ``__url__`` is
  the URL the reader was given (webdataset keeps the string it was given too).
- damage is an error, never a silent end: ``tarfile`` in stream mode stops
  quietly at a corrupt header or a header cut short after the first member (the
  rest of the shard is lost); we raise ``DecodeError`` naming the shard and offset,
  after delivering every member before the damage. Both accept a stream that
  stops at a member boundary without the end-of-archive blocks, and both refuse
  a 0-byte shard.
- a duplicate extension raises ``DecodeError`` (webdataset: ``ValueError``).
- GNU sparse members are refused with ``DecodeError`` (``tarfile`` expands them);
  no known WebDataset writer produces them.
- names are decoded as UTF-8 with ``surrogateescape`` whatever the locale
  (``tarfile`` uses the file-system encoding, UTF-8 on every usual system).
- a global pax header is not replayed when a stream resumes past it (it only
  matters if it sets ``path``, which no writer does).
- ``columns=`` is webdataset's ``to_tuple``: a sample without one of the columns
  is an error (``SourceError`` naming the sample, the shard, the column and the
  extensions it has), unless ``missing_is_error=False`` (None there), as
  ``to_tuple(..., missing_is_error=False)``; samples a ``filter=`` drops are not
  checked, so ``filter=pc.field("png").is_valid()`` keeps only those with a png.
- an image ``decode=`` without Pillow fails when the stream is made (``SourceError``
  naming the ``image`` extra), not at the first image.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import pyarrow as pa

from .._exceptions import DecodeError, FetchError, SourceError, redact_urls
from .._models import FileRef
from . import ByteSource, Chunk, Position, ReadRequest, SequentialDecoder, SequentialParser, Unit
from ._samples import (
    Sample,
    SampleGrouper,
    base_plus_ext,
    held_sample,
    iter_samples,
    samples_to_table,
)
from ._tar import DEFAULT_MAX_MEMBER_SIZE, MAX_EXTENDED_HEADER_SIZE, TarMember, TarReader

__all__ = [
    "DEFAULT_MAX_MEMBER_SIZE",
    "MAX_EXTENDED_HEADER_SIZE",
    "SampleGrouper",
    "SkippedShardWarning",
    "TarMember",
    "TarReader",
    "WebDatasetDecoder",
    "base_plus_ext",
    "iter_samples",
    "sample_decoder",
    "samples_to_table",
]

OnError = Literal["raise", "warn", "skip_shard"]
_ON_ERROR = ("raise", "warn", "skip_shard")
_SAMPLE_OVERHEAD = 256  # bytes a sample costs beyond its members' bodies (dict, key, url)

_log = logging.getLogger("aiostream_hf.webdataset")


class SkippedShardWarning(UserWarning):
    """Part of a shard was skipped under ``on_error="warn"``; the message says where and why."""


_EXTRAS = {"PIL": ("Pillow", "image"), "torch": ("torch", "torch")}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or blocked in sys.modules
        return False


def _require(module: str, spec: str) -> None:
    """An image spec's library is there, or a ``SourceError`` naming the extra that brings it."""
    if not _installed(module):
        name, extra = _EXTRAS[module]
        raise SourceError(
            f"decode={spec!r} decodes images with {name}, which is not installed: "
            f"pip install 'aiostream-hf[{extra}]'"
        )


def _require_image_libraries(spec: str) -> None:
    from webdataset import autodecode

    _require("PIL", spec)  # every image spec reads the image with Pillow
    kind = autodecode.imagespecs.get(spec, ("",))[0]
    if kind == "torch":
        _require("torch", spec)


def sample_decoder(decode: Any) -> Callable[[Sample], Sample] | None:
    """webdataset's ``autodecode.Decoder`` for ``decode``, as ``wds.decode(*specs)`` builds it.

    ``decode``: None (bytes as stored), an image spec (``"pil"``, ``"rgb8"``,
    ``"torchrgb"``, ... see ``webdataset.autodecode.imagespecs``), a handler
    callable ``(key, data) -> value``, or a list of those; the default handlers
    (text, json, cls, npy, ...) come after them, as in webdataset. Image specs
    (and webdataset's ``ImageHandler``) need Pillow, the ``image`` extra: without
    it this raises ``SourceError`` at once, naming the extra.
    """
    if decode is None:
        return None
    from webdataset import autodecode

    specs = list(decode) if isinstance(decode, (list, tuple)) else [decode]
    handlers = []
    for spec in specs:
        if isinstance(spec, str):
            if spec not in autodecode.imagespecs:
                raise SourceError(
                    f"decode={spec!r}: not an image spec; use one of "
                    f"{', '.join(sorted(autodecode.imagespecs))}, a handler, or None"
                )
            _require_image_libraries(spec)
            handlers.append(autodecode.imagehandler(spec))
        elif callable(spec):
            if isinstance(spec, autodecode.ImageHandler):
                _require_image_libraries(spec.imagespec)
            handlers.append(spec)
        else:
            raise SourceError(f"decode={spec!r}: give an image spec string or a handler callable")
    decoder: Callable[[Sample], Sample] = autodecode.Decoder(handlers)
    return decoder


def _check_columns(samples: Iterable[Sample], columns: Sequence[str], url: str) -> None:
    """``SourceError`` for the first sample that lacks one of ``columns`` (webdataset's
    ``to_tuple`` raises for a missing key too), naming the sample, shard, column and
    the extensions the sample has, and the two ways out."""
    for sample in samples:
        missing = [name for name in columns if name not in sample]
        if not missing:
            continue
        has = [name for name in sample if name not in ("__key__", "__url__")]
        raise SourceError(
            f"{url}: sample {sample.get('__key__')!r} has no {missing[0]!r} (its extensions: "
            f"{', '.join(has) or 'none'}), which columns={list(columns)!r} asks for: "
            "pass missing_is_error=False (aiostream_hf.webdataset.stream or "
            "WebDatasetDecoder) for None where a sample lacks a column, or "
            f"filter=pyarrow.compute.field({missing[0]!r}).is_valid() to skip such samples"
        )


def _weight(sample: Sample) -> int:
    """Roughly the bytes a sample holds (bodies, decoded arrays and images)."""
    total = _SAMPLE_OVERHEAD
    for value in sample.values():
        if isinstance(value, (bytes, bytearray, str)):
            total += len(value)
            continue
        nbytes = getattr(value, "nbytes", None)
        if isinstance(nbytes, int):
            total += nbytes
        elif hasattr(value, "getbands") and hasattr(value, "size"):  # a PIL image
            width, height = value.size
            total += width * height * len(value.getbands())
    return total


class _Shard(SequentialParser):
    """One shard's parse between blocks: TAR members grouped into samples, chunks of
    them out. ``feed``, ``finish`` and ``salvage`` run in worker threads, one call at a
    time; ``report`` on the event loop's thread, which warns or logs the skips."""

    def __init__(
        self,
        decoder: WebDatasetDecoder,
        url: str,
        start: Position,
        request: ReadRequest,
        size: int | None = None,
    ) -> None:
        offset = start.offset
        self.url = url
        self.policy = decoder.on_error
        self.decode = decoder.sample_decoder
        self.missing_is_error = decoder.missing_is_error
        self.request = request
        self.reader = TarReader(
            url,
            max_member_size=decoder.max_member_size,
            compression="none" if offset else "auto",
            start_offset=offset or 0,
            size=size,
        )
        self.torn = False  # the TAR stream broke off (damage, a cut): see salvage()
        self.skipped = 0  # samples skipped under on_error since the last chunk
        self.grouper = SampleGrouper(url)
        self.skip = start.skip if offset is None else 0  # samples to pass (a resumed gzip)
        self.passed = 0  # samples parsed from where the reading started (for skip counts)
        self.row = start.row  # rows of the shard delivered before the next chunk
        self.mark_offset = offset or 0  # resume offset after the samples passed so far
        self.problems: list[str] = []  # skips, said by report() on the event loop's thread

    @property
    def by_offset(self) -> bool:
        return not self.reader.compressed

    def _mark(self) -> int:
        return self.mark_offset if self.by_offset else self.passed

    @property
    def ended(self) -> bool:
        return self.reader.ended  # the end-of-archive blocks: what follows is not read

    def feed(self, block: bytes) -> Chunk | None:
        samples = []
        grouper = self.grouper
        try:
            members = self.reader.feed(block)
        except DecodeError:
            self.torn = True
            raise
        for member in members:
            sample = grouper.push(member)
            if sample is not None:
                samples.append((sample, grouper.last_end))
        return self._counted(self._chunk(samples, final=False)) if samples else None

    def finish(self) -> Chunk:
        try:
            self.reader.close()
        except DecodeError:
            self.torn = True
            raise
        sample = self.grouper.flush()
        done = [(sample, self.grouper.last_end)] if sample is not None else []
        return self._counted(self._chunk(done, final=True))

    def salvage(self, exc: Exception) -> Chunk | None:
        """After the TAR stream broke off (a corrupt header, a cut, a failed read): the
        sample being grouped, as webdataset delivers it, unless the break is inside one
        of its members (then it is incomplete, and dropped)."""
        if not (self.torn or isinstance(exc, FetchError)):
            return None  # not damage to the stream (a sample decode= failed on, ...)
        sample = held_sample(self.reader, self.grouper)
        if sample is None:
            return None
        columns = self.request.columns
        if columns is not None and any(c not in sample for c in columns):
            return None  # the members it lacks may lie past the damage: not known whole
        return self._counted(self._chunk([(sample, self.grouper.last_end)], final=False))

    def abandon(self, exc: Exception) -> Chunk | None:
        """After damage: None under ``on_error="raise"`` (the error stands), else the
        final, empty chunk (the rest of the shard is skipped, and said so)."""
        if self.policy == "raise":
            return None
        self.problems.append(
            f"{self.url}: skipping the rest of the shard from byte {self.reader.offset}"
            f"{'' if self.by_offset else ' of the gzip stream'} "
            f"({self.row} samples delivered from it): {exc}"
        )
        skipped, self.skipped = self.skipped, 0
        return Chunk(
            [] if self.request.rows else samples_to_table([]),
            (self._mark(),),
            self.row,
            True,
            _SAMPLE_OVERHEAD,
            self.by_offset,
            skipped=skipped,
            damaged=True,
        )

    def report(self) -> None:
        """Warn (``on_error="warn"``) or log what was skipped since the last report."""
        problems, self.problems = self.problems, []
        for message in map(redact_urls, problems):
            if self.policy == "warn":
                warnings.warn(message, SkippedShardWarning, stacklevel=2)
            else:
                _log.warning("%s", message)

    def _counted(self, chunk: Chunk) -> Chunk:
        """The chunk, with the samples skipped since the last one counted in it."""
        skipped, self.skipped = self.skipped, 0
        return dataclasses.replace(chunk, skipped=skipped) if skipped else chunk

    def _chunk(self, samples: list[tuple[Sample, int]], *, final: bool) -> Chunk:
        """Samples (each with the TAR offset just past it) as the next chunk."""
        request = self.request
        kept: list[Sample] = []
        positions = [self._mark()]
        for sample, end in samples:
            self.passed += 1
            self.mark_offset = end  # after this sample (and the skipped members before it)
            if self.skip:
                self.skip -= 1
                positions[0] = self._mark()
                continue
            kept.append(sample)
            positions.append(self._mark())
        if request.filter is not None:
            table = samples_to_table(kept, request.columns)
            index = pa.array(range(len(kept)), pa.int64())
            picked = table.append_column("__row__", index).filter(request.filter)
            chosen = picked.column("__row__").to_pylist()
            kept = [kept[i] for i in chosen]
            positions = [positions[0], *(positions[i + 1] for i in chosen)]
        if request.columns is not None and self.missing_is_error:
            _check_columns(kept, request.columns, self.url)
        if request.columns is not None and request.rows:
            kept = [{name: s.get(name) for name in request.columns} for s in kept]
        if self.decode is not None:
            kept, positions = self._decode(kept, positions)
        rows: pa.Table | list[Sample]
        if request.rows:
            rows = kept
            nbytes = sum(_weight(s) for s in kept)
        else:
            rows = samples_to_table(kept, request.columns)
            nbytes = rows.nbytes + _SAMPLE_OVERHEAD
        first, self.row = self.row, self.row + len(kept)
        return Chunk(rows, tuple(positions), first, final, nbytes, self.by_offset)

    def _decode(
        self, samples: list[Sample], positions: list[int]
    ) -> tuple[list[Sample], list[int]]:
        assert self.decode is not None
        out: list[Sample] = []
        kept = [positions[0]]
        for sample, position in zip(samples, positions[1:], strict=True):
            try:
                decoded = self.decode(sample)
            except Exception as exc:  # webdataset's handlers raise anything; this is its channel
                cause = exc.__cause__ or exc
                message = (
                    f"{self.url}: cannot decode sample {sample.get('__key__')!r} "
                    f"({type(cause).__name__}: {cause})"
                )
                if self.policy == "raise":
                    raise DecodeError(message) from exc
                self.problems.append(message + "; the sample is skipped")
                self.skipped += 1
                if not out:
                    kept[0] = position
                continue
            out.append(decoded)
            kept.append(position)
        return out, kept


class WebDatasetDecoder(SequentialDecoder[Unit]):
    """WebDataset TAR shards (``.tar``, ``.tar.gz``, ``.tgz``), read block by block.

    A stream reads each shard with one long GET (``iter_bytes``) and parses
    the blocks as they arrive (``TarReader`` + ``SampleGrouper`` in worker
    threads), yielding one chunk of samples per block: memory is set by the
    block size and the stream's readahead budget, not by shard sizes.

    ``decode``: None (bytes), or webdataset's decoders (see ``sample_decoder``).
    ``on_error``: what a damaged shard (corrupt, truncated, unreadable) does:
    ``"raise"`` a ``DecodeError``/``FetchError`` naming the shard and offset,
    after every sample before the damage; ``"warn"``: a ``SkippedShardWarning``
    naming them and the rest of the shard is skipped; ``"skip_shard"``: the
    same, logged on the ``aiostream_hf.webdataset`` logger instead of warned.
    A sample that ``decode`` fails on is raised, or skipped with the same report.
    ``readahead``: shards read ahead of the one being consumed (open GETs).
    ``resampled``: draw shards with replacement, endlessly (by seed and rank).
    ``missing_is_error`` (webdataset's ``to_tuple`` argument): a sample without
    one of the stream's ``columns`` raises ``SourceError`` (True, the default;
    whatever ``on_error`` says: it is a question of the request, not damage) or
    has None there (False).

    ``plan``/``fetch``/``decode`` remain for code that drives decoders by
    units: one unit per shard, the whole shard in one read.
    """

    name = "webdataset"
    extensions = (".tar", ".tar.gz", ".tgz")

    def __init__(
        self,
        *,
        decode: Any = None,
        on_error: OnError = "raise",
        readahead: int = 2,
        resampled: bool = False,
        max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
        missing_is_error: bool = True,
    ) -> None:
        if on_error not in _ON_ERROR:
            raise SourceError(f"on_error={on_error!r}: use 'raise', 'warn' or 'skip_shard'")
        if isinstance(readahead, bool) or not isinstance(readahead, int) or readahead < 0:
            raise SourceError(f"readahead={readahead!r}: shards read ahead, an int >= 0")
        self.decode_spec = decode
        self.sample_decoder = sample_decoder(decode)
        self.on_error: OnError = on_error
        self.readahead = readahead
        self.resampled = bool(resampled)
        self.max_member_size = max_member_size
        self.missing_is_error = bool(missing_is_error)

    def __repr__(self) -> str:
        return (
            f"WebDatasetDecoder(decode={self.decode_spec!r}, on_error={self.on_error!r}, "
            f"readahead={self.readahead}, resampled={self.resampled}, "
            f"missing_is_error={self.missing_is_error})"
        )

    # -- streaming ------------------------------------------------------------------------

    def parser(self, file: FileRef, request: ReadRequest, start: Position) -> SequentialParser:
        """The parser of one shard from ``start``: samples grouped as the blocks of its
        one long GET arrive, a chunk per block that completes any."""
        if self.sample_decoder is not None and not request.rows:
            raise SourceError(
                f"decode={self.decode_spec!r} gives Python objects, which output='arrow' "
                "and batch_size= cannot hold: take dict rows (batch in your DataLoader)"
            )
        return _Shard(self, file.url, start, request, size=file.size)

    # -- one unit per shard (the plan/fetch/decode model) -----------------------------------

    async def plan(self, file: FileRef, source: ByteSource, request: ReadRequest) -> list[Unit]:
        size = file.size
        if size is None:
            _, size = await source.read_tail(file, 1)
            file = dataclasses.replace(file, size=size)
        return [Unit(file, 0, size)]

    async def fetch(self, unit: Unit, source: ByteSource) -> bytes:
        size = unit.file.size
        if not size:
            return b""
        (data,) = await source.read_ranges(unit.file, [(0, size)])
        return data

    def decode(self, unit: Unit, fetched: Any, request: ReadRequest) -> pa.Table:
        url = unit.file.url
        samples = list(iter_samples(url, [fetched]))
        table = samples_to_table(samples, request.columns)
        if request.filter is not None:
            keep = table.append_column("__row__", pa.array(range(len(samples)), pa.int64()))
            chosen = keep.filter(request.filter).column("__row__").to_pylist()
            table = table.take(pa.array(chosen, pa.int64()))
            samples = [samples[i] for i in chosen]
        if request.columns is not None and self.missing_is_error:
            _check_columns(samples, request.columns, url)
        return table
