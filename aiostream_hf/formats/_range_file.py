"""A file of which only some byte ranges are present, read by pyarrow in place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

import pyarrow as pa

__all__ = ["BufferLike", "RangeFile"]

BufferLike: TypeAlias = bytes | bytearray | memoryview | pa.Buffer
"""What a fetched byte range may be handed over as; none of them is copied."""


class RangeFile:
    """A read-only file of ``size`` bytes of which only the given ranges are present.

    Handed to pyarrow through ``pa.PythonFile``: pyarrow seeks and reads whole
    column chunks, and each read returns a zero-copy view of a fetched buffer.
    A read of bytes that no buffer holds is a planning bug and raises.
    """

    mode = "rb"

    def __init__(self, name: str, size: int, buffers: Mapping[tuple[int, int], BufferLike]):
        self._name = name
        self._size = size
        self._position = 0
        self.closed = False
        pieces = []
        for (start, end), buffer in buffers.items():
            view = memoryview(buffer).cast("B")
            if not 0 <= start <= end <= size or len(view) != end - start:
                raise ValueError(
                    f"buffer for bytes [{start}, {end}) of {name} ({size} bytes) "
                    f"holds {len(view)} bytes"
                )
            pieces.append((start, end, view))
        pieces.sort(key=lambda piece: piece[0])
        self._pieces = pieces

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._position, self._size)[whence]
        self._position = base + offset
        return self._position

    def read(self, nbytes: int = -1) -> Any:
        start = self._position
        end = self._size if nbytes is None or nbytes < 0 else min(start + nbytes, self._size)
        if end <= start:
            return b""
        self._position = end
        parts = []
        position = start
        for piece_start, piece_end, view in self._pieces:
            if piece_end <= position or piece_start > position:
                continue
            take = min(end, piece_end)
            parts.append(view[position - piece_start : take - piece_start])
            position = take
            if position == end:
                break
        if position != end:
            raise ValueError(
                f"pyarrow read bytes [{start}, {end}) of {self._name}, but no buffer given "
                f"holds bytes from {position}: pass buffers for every range of the plan"
            )
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        self.closed = True
