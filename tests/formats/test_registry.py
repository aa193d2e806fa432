"""The formats registry is the one list of extensions, and a sequential format is a plain
synchronous parser: the stream's side reads the bytes and drives it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest

import aiostream_hf as ash
from aiostream_hf import _resolver, formats
from aiostream_hf._models import FileRef
from aiostream_hf.formats import (
    Chunk,
    Position,
    ReadRequest,
    SequentialDecoder,
    SequentialParser,
    Unit,
)


def test_the_resolver_counts_the_extensions_the_decoders_declare() -> None:
    """One list: what the Hub resolver counts as data files is what the registered
    decoders read (``.parq`` was read by the Parquet decoder and not counted)."""
    declared = {
        ext: d.name
        for d in formats.registered().values()
        for ext in d.extensions
        if ext.count(".") == 1
    }
    assert declared == _resolver.DATA_FILE_EXTENSIONS
    assert {".parquet", ".parq", ".tar", ".tgz"} <= set(declared)
    assert ".tar.gz" not in declared  # counted by its '.tar' suffix, as in datasets


class _Lines(SequentialDecoder[Unit]):
    """A toy sequential format: one row per line of text, resumable at a line's end."""

    name: ClassVar[str] = "lines"
    extensions: ClassVar[tuple[str, ...]] = (".lines",)

    def parser(self, file: FileRef, request: ReadRequest, start: Position) -> SequentialParser:
        return _LineParser(request, start)

    async def plan(self, file: FileRef, source: Any, request: ReadRequest) -> list[Unit]:
        raise NotImplementedError

    async def fetch(self, unit: Unit, source: Any) -> Any:
        raise NotImplementedError

    def decode(self, unit: Unit, fetched: Any, request: ReadRequest) -> pa.Table:
        raise NotImplementedError


class _LineParser(SequentialParser):
    def __init__(self, request: ReadRequest, start: Position) -> None:
        self.request = request
        self.held = b""
        self.offset = start.offset or 0  # the file's byte after the last whole line
        self.row = start.row

    def feed(self, block: bytes) -> Chunk | None:
        *lines, self.held = (self.held + bytes(block)).split(b"\n")
        return self._chunk(lines, final=False) if lines else None

    def finish(self) -> Chunk:
        return self._chunk([self.held] if self.held else [], final=True)

    def _chunk(self, lines: list[bytes], *, final: bool) -> Chunk:
        positions = [self.offset]
        for line in lines:
            self.offset += len(line) + 1
            positions.append(self.offset)
        rows = [{"line": line.decode()} for line in lines]
        first, self.row = self.row, self.row + len(rows)
        out = rows if self.request.rows else pa.Table.from_pylist(rows)
        return Chunk(out, tuple(positions), first, final, sum(map(len, lines)) + 64)


@pytest.mark.anyio
async def test_a_sequential_format_is_a_parser_the_stream_feeds(tmp_path: Path) -> None:
    path = tmp_path / "a.lines"
    lines = [f"line {i} " + "x" * (i % 13) for i in range(500)]
    path.write_text("\n".join(lines))
    options = ash.StreamOptions(cache_dir=tmp_path / "cache", block_size=97)
    async with ash.stream(str(path), format=_Lines(), options=options) as s:
        got = [row["line"] async for row in s]
    assert got == lines

    # Resumed after 200 rows: the parser starts at the byte after the 200th line.
    async with ash.stream(str(path), format=_Lines(), options=options) as s:
        it = aiter(s)
        for _ in range(200):
            await anext(it)
        state = s.state_dict()
    async with ash.stream(str(path), format=_Lines(), options=options) as s:
        s.load_state_dict(state)
        rest = [row["line"] async for row in s]
    assert rest == lines[200:]
