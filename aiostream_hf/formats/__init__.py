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
it subclasses ``SequentialDecoder`` and streams each file with one long GET
(``StreamSource.iter_bytes``), parsing blocks as they arrive and handing
``Chunk``s of rows to ``emit``, each row with the position a reader resumes
from after it::

    class MyStreamFormat(SequentialDecoder[Unit]):
        async def read_chunks(self, file, source, request, start, emit): ...
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
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
    "Emit",
    "Position",
    "ReadRequest",
    "SequentialDecoder",
    "StreamSource",
    "Unit",
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


Emit = Callable[[Chunk], Awaitable[None]]
"""Where a sequential decoder hands its chunks: waits while the stream's readahead is full."""


class SequentialDecoder(Decoder[_U]):
    """A format read front to back, one long GET per file, in blocks as they arrive.

    The stream calls ``read_chunks`` instead of ``plan``/``fetch``/``decode``,
    each file in a task of its own, ``readahead`` files ahead of the one being
    consumed, within the stream's byte budget (``StreamOptions.prefetch_bytes``).
    ``resampled`` draws files with replacement, endlessly, deterministic by seed
    and rank.
    """

    readahead: int = 2
    resampled: bool = False

    @abstractmethod
    async def read_chunks(
        self,
        file: FileRef,
        source: StreamSource,
        request: ReadRequest,
        start: Position,
        emit: Emit,
    ) -> None:
        """Read ``file`` from ``start``, ``await emit(chunk)`` for each chunk in order.

        Chunks are of bounded size; the last one is ``final`` (possibly empty).
        Parsing and decoding run in worker threads; the only I/O is ``source``.
        This runs as a task of its own: it may start tasks (to read ahead of
        the parser), which an async generator could not.
        """


_REGISTRY: dict[str, Decoder[Any]] = {}


def register(decoder: Decoder[Any]) -> None:
    """Make a format available by its name and extensions (a later one wins)."""
    _REGISTRY[decoder.name] = decoder


def registered() -> dict[str, Decoder[Any]]:
    """The registered formats by name."""
    _load_builtins()
    return dict(_REGISTRY)


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
