"""Parquet's Thrift metadata, read by hand where pyarrow would allocate first.

    values = chunk_values(read, start, end, name)   # read(offset, n) -> bytes
    groups = row_group_count(footer_thrift, name)   # before pyarrow parses the footer

pyarrow parses a footer whole, into about 50 times its bytes for one of many row
groups (a 31 MB footer of a million row groups: 1 GB); ``row_group_count`` reads only
the length of its ``row_groups`` list (FileMetaData field 4), skipping the schema
before it, so a footer can be refused by its count first.

A footer's row count bounds nothing for a repeated (list) column: one row may hold any
number of values, and Arrow decodes every value a data page announces. The page
headers say it before anything is decoded: each is a Thrift (compact protocol)
``PageHeader`` in front of its page, and the data pages' ``num_values`` add up to the
values the chunk decodes to. This module walks them: header, then the page's
``compressed_page_size`` bytes, to the chunk's end, reading each header with bounds
checked (a field or list that runs past the bytes at hand, a nesting over
``_MAX_DEPTH``, a page past the chunk, all raise ``DecodeError``). It reads bytes
only through ``read``: no I/O of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from .._exceptions import DecodeError

__all__ = ["chunk_values", "row_group_count"]

# Compact-protocol field types.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY = 1, 2, 3, 4, 5, 6, 7, 8
_LIST, _SET, _MAP, _STRUCT = 9, 10, 11, 12
# FileMetaData's field of the row groups (parquet.thrift).
_ROW_GROUPS = 4
# PageHeader fields (parquet.thrift): the compressed size, and the page kinds that
# carry a num_values (data page v1 and v2; a dictionary page's values are not rows).
_COMPRESSED_SIZE, _DATA_PAGE, _DATA_PAGE_V2 = 3, 5, 8
_MAX_DEPTH = 16
# A header is read in a window this large first, then in a larger one (statistics
# with long min/max values make headers long), up to the chunk's end.
_WINDOW = 4096
_MAX_WINDOW = 16 * 1024 * 1024


class _Truncated(Exception):
    """The header runs past the bytes read so far."""


class _Header:
    """Reads one compact-protocol ``PageHeader`` from ``data`` (bytes at hand)."""

    def __init__(self, data: bytes | memoryview, name: str) -> None:
        self.data = data
        self.name = name
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise _Truncated
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise DecodeError(f"{self.name}: a page header has a varint of over 64 bits")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip_bytes(self, n: int) -> None:
        if n < 0:
            raise DecodeError(f"{self.name}: a page header has a field of {n} bytes")
        if self.pos + n > len(self.data):
            raise _Truncated
        self.pos += n

    def skip(self, kind: int, depth: int) -> None:
        """Skip one value of compact type ``kind``."""
        if depth > _MAX_DEPTH:
            raise DecodeError(f"{self.name}: a page header nests over {_MAX_DEPTH} deep")
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self.skip_bytes(1)
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.skip_bytes(8)
        elif kind == _BINARY:
            self.skip_bytes(self.varint())
        elif kind in (_LIST, _SET):
            head = self.byte()
            size, element = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):  # each element takes a byte at least: bounded by the data
                if element in (_TRUE, _FALSE):
                    self.skip_bytes(1)
                else:
                    self.skip(element, depth + 1)
        elif kind == _MAP:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(types >> 4, depth + 1)
                    self.skip(types & 0x0F, depth + 1)
        elif kind == _STRUCT:
            self.struct(depth + 1, lambda field, kind, depth: False)
        else:
            raise DecodeError(f"{self.name}: a page header has a field of unknown type {kind}")

    def struct(self, depth: int, take: Callable[[int, int, int], bool]) -> None:
        """Read a struct's fields, giving each to ``take(field, type, depth)``, which reads
        it and returns True, or returns False to have it skipped."""
        field = 0
        while True:
            head = self.byte()
            if head == 0:  # STOP
                return
            kind, delta = head & 0x0F, head >> 4
            field = field + delta if delta else self.zigzag()
            if not take(field, kind, depth):
                self.skip(kind, depth)


def _page(data: bytes, name: str) -> tuple[int, int, int]:
    """(header length, compressed page size, data values) of the header at ``data``'s
    start; raises ``_Truncated`` when ``data`` ends inside it."""
    header = _Header(data, name)
    found = {"size": -1, "values": 0}

    def num_values(field: int, kind: int, depth: int) -> bool:
        if field == 1 and kind == _I32:
            found["values"] = header.zigzag()
            return True
        return False

    def page(field: int, kind: int, depth: int) -> bool:
        if field == _COMPRESSED_SIZE and kind == _I32:
            found["size"] = header.zigzag()
            return True
        if field in (_DATA_PAGE, _DATA_PAGE_V2) and kind == _STRUCT:
            header.struct(depth + 1, num_values)
            return True
        return False

    header.struct(0, page)
    if found["size"] < 0 or found["values"] < 0:
        raise DecodeError(
            f"{name}: a page header says {found['size']} bytes and {found['values']} values"
        )
    return header.pos, found["size"], found["values"]


def chunk_values(read: Callable[[int, int], bytes], start: int, end: int, name: str) -> int:
    """The values the data pages of the column chunk in bytes ``[start, end)`` hold, by
    their headers, at the least (see the module's text). ``read(offset, n)`` gives ``n``
    bytes of the file from ``offset`` (never past ``end``)."""
    total = 0
    pos = start
    while pos < end:
        window = _WINDOW
        while True:
            n = min(window, end - pos)
            try:
                length, size, values = _page(read(pos, n), name)
                break
            except _Truncated:
                if n == end - pos or window >= _MAX_WINDOW:
                    return total
                window *= 16
            except DecodeError:
                return total
        pos += length + size
        if pos > end:
            return total
        total += values
    return total


def row_group_count(data: bytes | memoryview, name: str) -> int | None:
    """How many row groups the footer's Thrift ``FileMetaData`` in ``data`` lists, read
    from its list's header alone; None when ``data`` does not read as one (pyarrow then
    says what is wrong)."""
    header = _Header(data, name)
    found: list[int] = []

    def row_groups(field: int, kind: int, depth: int) -> bool:
        if field != _ROW_GROUPS or kind != _LIST:
            return False
        head = header.byte()
        size = head >> 4
        found.append(header.varint() if size == 15 else size)
        raise _Found

    with contextlib.suppress(_Found, _Truncated, DecodeError):
        header.struct(0, row_groups)
    return found[0] if found else None


class _Found(Exception):
    """The count is read: the rest of the footer is not."""
