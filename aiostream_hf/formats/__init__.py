"""Pluggable format decoders and their registry.

A format turns a file into decode units (row groups, TAR blocks, ...), asks a
byte source (the fetcher) for each unit's ranges, and decodes those bytes into
a ``pyarrow.Table`` in a worker thread. It never opens a socket.

    class MyFormat(Decoder[MyUnit]):
        name = "myformat"
        extensions = (".myf",)
        async def plan(self, file, source, request): ...   # -> list of units
        async def fetch(self, unit, source): ...           # -> fetched bytes
        def decode(self, unit, fetched): ...               # -> pyarrow.Table (sync)

    register(MyFormat())

A sequential format (TAR shards) cannot be cut into units before it is read:
it subclasses ``SequentialDecoder``, whose ``parser`` gives, for each file, a
``SequentialParser``: blocks of the file's bytes in, ``Chunk``s of rows out,
each row with the position a reader resumes from after it. The stream reads
the file with one long GET and feeds the parser the blocks as they arrive::

    class MyStreamFormat(SequentialDecoder[Unit]):
        def parser(self, file, request, start): ...        # -> MyParser

    class MyParser(SequentialParser):
        def feed(self, block): ...                         # -> Chunk | None (sync)
        def finish(self): ...                              # -> the final Chunk (sync)

Nothing here does I/O or holds a thread, a task or a lock: the stream's side
(``aiostream_hf._sequential``) reads the bytes, calls the parser in worker
threads and hands its chunks on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import pyarrow as pa

from .._exceptions import SourceError
from .._models import FileRef

__all__ = [
    "ByteBlocks",
    "ByteSource",
    "Chunk",
    "Decoder",
    "Position",
    "ReadRequest",
    "SequentialDecoder",
    "SequentialParser",
    "StreamSource",
    "Unit",
    "data_file_extensions",
    "decoder_for",
    "register",
    "registered",
]


class ByteSource(Protocol):
    """What a decoder may ask of the fetcher: byte ranges, nothing else."""

    async def read_ranges(
        self, file: FileRef, ranges: Sequence[tuple[int, int]]
    ) -> list[bytes]: ...

    async def read_buffers(
        self, file: FileRef, ranges: Sequence[tuple[int, int]]
    ) -> list[memoryview]:
        """The bytes of ``read_ranges`` as read-only views of buffers received in place
        (no copy joins a body's pieces), for decoders that take any buffer."""
        ...

    async def read_tail(self, file: FileRef, n: int) -> tuple[bytes, int]: ...

    async def read_pieces(
        self, file: FileRef, ranges: Sequence[tuple[int, int]]
    ) -> list[list[tuple[int, memoryview]]]:
        """Each range's bytes as pieces in order, ``(offset in the file, view)``: one per
        range from the fetcher; several where some of a range's bytes were already held
        (a stream's kept reads), for decoders that read pieces as one (Parquet)."""
        ...


class ByteBlocks(Protocol):
    """A file's bytes in order, in blocks (``RangeFetcher.iter_bytes``); close it when done."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> ByteBlocks: ...

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class StreamSource(ByteSource, Protocol):
    """A byte source that also streams a file front to back: what sequential formats read."""

    def iter_bytes(
        self,
        file: FileRef,
        start: int = 0,
        end: int | None = None,
        *,
        block_size: int | None = None,
    ) -> ByteBlocks: ...


@dataclass(frozen=True)
class ReadRequest:
    """What the stream wants from every file: columns and a row filter.

    ``rows``: sequential formats yield a list of dict rows instead of a
    ``pyarrow.Table`` (the stream asks for them when it hands out dict rows).
    ``verify_checksums``: check the checksums the file carries (Parquet page CRCs),
    as ``StreamOptions.verify_checksums`` says.
    ``max_unit_bytes``: the most one decoded unit may hold (the stream's
    ``prefetch_bytes``): a unit that surely decodes to more is refused at its plan,
    before anything is allocated (None: no bound).
    """

    columns: tuple[str, ...] | None = None
    filter: Any = None  # a pyarrow.compute.Expression
    rows: bool = False
    verify_checksums: bool = True
    max_unit_bytes: int | None = None


@dataclass(frozen=True)
class Position:
    """Where a sequential read of one file starts, and what it counts from.

    ``offset``: the byte of the file to start reading at (a record boundary
    the decoder gave in a ``Chunk``), or None to read from byte 0 and pass the
    first ``skip`` records (a compressed file, which cannot start mid-way).
    ``row``: the rows of this file delivered before (the first chunk's
    ``first_row``).
    """

    offset: int | None = 0
    skip: int = 0
    row: int = 0


@dataclass(frozen=True)
class Chunk:
    """Rows of a sequentially read file, and where a reader resumes after each of them.

    ``rows`` is a list of dict rows when the request asked for ``rows``, else a
    ``pyarrow.Table``. ``positions`` has one entry more than there are rows:
    ``positions[i]`` is where a read resumes after the first ``i`` rows of this
    chunk: a byte offset when ``by_offset``, else the records to pass from
    byte 0 (``Position.skip``). ``first_row`` counts the rows of the file
    before this chunk; ``final`` marks the file's last chunk (possibly empty);
    ``nbytes`` is what the chunk holds, for the readahead budget. ``skipped``
    counts the samples passed over (under the decoder's ``on_error``) since the
    previous chunk; ``damaged`` marks the final chunk of a file whose rest was
    skipped after damage: both go to the stream's statistics.
    """

    rows: pa.Table | list[dict[str, Any]]
    positions: tuple[int, ...]
    first_row: int
    final: bool
    nbytes: int
    by_offset: bool = True
    skipped: int = 0
    damaged: bool = False

    def resume_at(self, taken: int) -> Position:
        """The position after the first ``taken`` rows of this chunk."""
        at = self.positions[taken]
        if self.by_offset:
            return Position(at, 0, self.first_row + taken)
        return Position(None, at, self.first_row + taken)


@dataclass(frozen=True)
class Unit:
    """One decode unit of a file: the bytes it costs and its position for resume.

    ``cost`` is the bytes fetched for it; ``decoded`` an estimate of the bytes
    its decoded rows will hold (0: unknown). The stream's readahead budget
    reserves both while the unit loads, then holds what the rows really take.
    """

    file: FileRef
    index: int  # position of the unit within its file (row group number, block number)
    cost: int
    num_rows: int | None = None
    decoded: int = 0


_U = TypeVar("_U", bound=Unit)


class Decoder(ABC, Generic[_U]):
    """A format: plans units of a file, fetches their bytes, decodes them."""

    name: ClassVar[str]
    extensions: ClassVar[tuple[str, ...]]
    joins_units: ClassVar[bool] = False
    """True when ``fetch_many`` asks for units side by side in one request: the stream
    then loads runs of small units as one job (else each unit is a job of its own)."""

    def head_range(self, file: FileRef, limit: int) -> tuple[int, int] | None:
        """The bytes at the start of ``file`` (at most ``limit``) that a read of all of
        it asks for first, known before its plan: the stream reads them beside the plan,
        and the first units' ranges in them are cut from them. None (the default): no
        such range. Asked only where the stream reads whole files, every column."""
        return None

    @abstractmethod
    async def plan(self, file: FileRef, source: ByteSource, request: ReadRequest) -> list[_U]:
        """The file's decode units, in order (reads the file's index if it has one)."""

    @abstractmethod
    async def fetch(self, unit: _U, source: ByteSource) -> Any:
        """The bytes of one unit."""

    async def fetch_many(self, units: Sequence[_U], source: ByteSource) -> list[Any]:
        """The bytes of several units of one file, in their order: one ``fetch`` after
        another, unless the decoder asks for them together (``joins_units``)."""
        return [await self.fetch(unit, source) for unit in units]

    @abstractmethod
    def decode(self, unit: _U, fetched: Any, request: ReadRequest) -> pa.Table:
        """Turn a unit's bytes into rows. Synchronous and pure: runs in a worker thread."""


class SequentialParser(ABC):
    """One file of a sequential format, parsed as its bytes arrive: blocks in, chunks out.

    Synchronous and free of I/O. The stream reads the file with one long GET from
    ``start.offset`` (the ``Position`` the parser was made for) and calls ``feed``
    with each block, then ``finish``; each call runs in a worker thread, one at a
    time, while the next block is read. When the read or the parse breaks off (a
    ``DecodeError`` from ``feed`` or ``finish``, a ``FetchError`` from the read),
    the stream calls ``salvage`` and then ``abandon``. After each call, ``report``
    runs on the event loop's thread.
    """

    @abstractmethod
    def feed(self, block: bytes) -> Chunk | None:
        """The rows the next block completes, as a chunk (None: none yet)."""

    @property
    def ended(self) -> bool:
        """The file's data is over (a TAR's end-of-archive blocks): the rest of the file
        is not read, and ``finish`` follows."""
        return False

    @abstractmethod
    def finish(self) -> Chunk:
        """The file's final chunk (possibly empty) once its bytes are all fed; raises
        ``DecodeError`` if the file ended where it cannot (a truncated file)."""

    def salvage(self, error: Exception) -> Chunk | None:
        """After ``error`` broke the file off: a chunk of the rows held that are whole
        (delivered before the error), or None."""
        return None

    def abandon(self, error: Exception) -> Chunk | None:
        """After ``error`` broke the file off (and ``salvage``): the file's final chunk
        when the decoder skips the rest of a damaged file, or None for the error to
        be raised."""
        return None

    def report(self) -> None:  # noqa: B027 (a hook: most parsers have nothing to say)
        """Say what the last call skipped (warnings, log lines); on the event loop's
        thread."""


class SequentialDecoder(Decoder[_U]):
    """A format read front to back, one long GET per file, in blocks as they arrive.

    The stream asks ``parser`` for each file instead of ``plan``/``fetch``/
    ``decode``, and reads each file in a task of its own, ``readahead`` files
    ahead of the one being consumed, within the stream's byte budget
    (``StreamOptions.prefetch_bytes``). ``resampled`` draws files with
    replacement, endlessly, deterministic by seed and rank.
    """

    readahead: int = 2
    resampled: bool = False

    @abstractmethod
    def parser(self, file: FileRef, request: ReadRequest, start: Position) -> SequentialParser:
        """The parser of ``file``'s bytes from ``start`` (``start.offset``, or byte 0
        when it is None). Chunks are of bounded size, in order; the last is ``final``."""


_REGISTRY: dict[str, Decoder[Any]] = {}


def register(decoder: Decoder[Any]) -> None:
    """Make a format available by its name and extensions (a later one wins). The
    extensions are the one list of them: ``decoder_for`` picks a file's decoder by them,
    and the Hub resolver counts data files by them (``data_file_extensions``), from the
    formats registered when it is imported (the built-in ones)."""
    _REGISTRY[decoder.name] = decoder


def registered() -> dict[str, Decoder[Any]]:
    """The registered formats by name."""
    _load_builtins()
    return dict(_REGISTRY)


def data_file_extensions() -> dict[str, str]:
    """The registered formats' one-suffix extensions, each with its format's name (a
    later registration wins): what the Hub resolver counts as data files (a file counts
    when one of its suffixes is here, so ``a.tar.gz`` counts by ``.tar``, as in
    ``datasets``). An extension of two suffixes (``.tar.gz``) is not a key: its last
    suffix alone (``.gz``) says nothing of the format."""
    _load_builtins()
    found: dict[str, str] = {}
    for decoder in _REGISTRY.values():
        for extension in decoder.extensions:
            if extension.count(".") == 1:
                found[extension.lower()] = decoder.name
    return found


def decoder_for(file: FileRef, format: str | Decoder[Any] | None = None) -> Decoder[Any]:
    """The decoder named by ``format`` (or ``format`` itself, a configured decoder),
    else the one whose extension the file has."""
    _load_builtins()
    if isinstance(format, Decoder):
        return format
    if format is not None:
        found = _REGISTRY.get(format)
        if found is None:
            raise SourceError(
                f"unknown format {format!r}: known formats are {', '.join(sorted(_REGISTRY))}"
            )
        return found
    name = file.path.lower().split("?", 1)[0]
    matching = [d for d in _REGISTRY.values() if name.endswith(d.extensions)]
    if matching:
        return matching[-1]  # the latest registration wins
    raise SourceError(
        f"cannot tell the format of {file.path!r} from its name: pass format= "
        f"(one of {', '.join(sorted(_REGISTRY))})"
    )


def _load_builtins() -> None:
    if "parquet" not in _REGISTRY:
        from . import parquet

        register(parquet.ParquetDecoder())
    if "webdataset" not in _REGISTRY:
        from . import webdataset

        register(webdataset.WebDatasetDecoder())
