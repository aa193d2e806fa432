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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import pyarrow as pa

from .._exceptions import SourceError
from .._resolver import FileRef

__all__ = [
    "ByteSource",
    "Decoder",
    "ReadRequest",
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

    async def read_tail(self, file: FileRef, n: int) -> tuple[bytes, int]: ...


@dataclass(frozen=True)
class ReadRequest:
    """What the stream wants from every file: columns and a row filter."""

    columns: tuple[str, ...] | None = None
    filter: Any = None  # a pyarrow.compute.Expression


@dataclass(frozen=True)
class Unit:
    """One decode unit of a file: the bytes it costs and its position for resume."""

    file: FileRef
    index: int  # position of the unit within its file (row group number, block number)
    cost: int  # bytes fetched for it
    num_rows: int | None = None


_U = TypeVar("_U", bound=Unit)


class Decoder(ABC, Generic[_U]):
    """A format: plans units of a file, fetches their bytes, decodes them."""

    name: ClassVar[str]
    extensions: ClassVar[tuple[str, ...]]

    @abstractmethod
    async def plan(self, file: FileRef, source: ByteSource, request: ReadRequest) -> list[_U]:
        """The file's decode units, in order (reads the file's index if it has one)."""

    @abstractmethod
    async def fetch(self, unit: _U, source: ByteSource) -> Any:
        """The bytes of one unit."""

    @abstractmethod
    def decode(self, unit: _U, fetched: Any, request: ReadRequest) -> pa.Table:
        """Turn a unit's bytes into rows. Synchronous and pure: runs in a worker thread."""


_REGISTRY: dict[str, Decoder[Any]] = {}


def register(decoder: Decoder[Any]) -> None:
    """Make a format available by its name and extensions (a later one wins)."""
    _REGISTRY[decoder.name] = decoder


def registered() -> dict[str, Decoder[Any]]:
    """The registered formats by name."""
    _load_builtins()
    return dict(_REGISTRY)


def decoder_for(file: FileRef, format: str | None = None) -> Decoder[Any]:
    """The decoder named by ``format``, else the one whose extension the file has."""
    _load_builtins()
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
