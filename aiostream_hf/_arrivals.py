"""Bytes of a file that arrive on the event loop, for worker threads that use each
piece as soon as it is in.

The reads (tasks on the event loop) ``add`` blocks to their span in order and
``close`` it when they end; a worker thread's ``take(start, end)`` returns the
bytes at once when they are in and otherwise waits for them, and raises
``Unfinished`` if the read of their span ended without them.
"""

from __future__ import annotations

import bisect
import threading
from typing import TypeAlias

from ._stalls import bytes_wait

__all__ = ["Arrivals", "Span", "Unfinished", "merge_spans"]

Span: TypeAlias = tuple[int, int]  # bytes [start, end) of the file


def merge_spans(ranges: list[Span], gap: int) -> list[Span]:
    """Sorted ranges merged across gaps under ``gap``: the reads that serve them."""
    spans: list[Span] = []
    for start, end in ranges:
        if spans and start - spans[-1][1] < gap:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    return spans


class Unfinished(Exception):
    """A worker thread stopped: the bytes it waited for will not come (or its caller
    ended the work)."""


class Arrivals:
    """The bytes of a few spans of a file as they are read (on the event loop), for
    worker threads that take each piece as soon as it is in (``take`` waits for it)."""

    def __init__(self, spans: list[Span]) -> None:
        self.spans = spans
        self._starts = [start for start, _ in spans]
        self._filled = list(self._starts)  # per span: everything before this is in
        self._offsets: list[list[int]] = [[] for _ in spans]
        self._blocks: list[list[bytes]] = [[] for _ in spans]
        self._ended = [False] * len(spans)
        self._changed = threading.Condition()

    def add(self, k: int, block: bytes) -> None:
        with self._changed:
            self._offsets[k].append(self._filled[k])
            self._blocks[k].append(block)
            self._filled[k] += len(block)
            self._changed.notify_all()

    def close(self, k: int | None = None) -> None:
        """Span ``k``'s read (every span's, by default) ended: nothing more will come."""
        with self._changed:
            for j in range(len(self.spans)) if k is None else [k]:
                self._ended[j] = True
            self._changed.notify_all()

    def received(self, k: int | None = None) -> int:
        """Bytes in, of span ``k`` (of every span, by default)."""
        if k is None:
            return sum(self._filled) - sum(self._starts)
        return self._filled[k] - self._starts[k]

    def take(self, start: int, end: int) -> memoryview:
        """Bytes ``[start, end)``, once they are in (worker thread: blocks until then).
        Raises ``Unfinished`` if the read ended without them."""
        k = self._span(start)
        with self._changed:
            while self._filled[k] < end:
                if self._ended[k]:
                    raise Unfinished(f"bytes {start}-{end - 1} never came")
                with bytes_wait():
                    self._changed.wait()
        offsets, blocks = self._offsets[k], self._blocks[k]
        i = bisect.bisect_right(offsets, start) - 1
        first = blocks[i]
        at = start - offsets[i]
        if at + (end - start) <= len(first):
            return memoryview(first)[at : at + end - start]
        pieces = [memoryview(first)[at:]]
        got = len(first) - at
        while got < end - start:
            i += 1
            piece = memoryview(blocks[i])[: end - start - got]
            pieces.append(piece)
            got += len(piece)
        return memoryview(b"".join(pieces))

    def _span(self, start: int) -> int:
        k = bisect.bisect_right(self._starts, start) - 1
        if k < 0 or start >= self.spans[k][1]:
            raise AssertionError(f"byte {start} is in no span of {self.spans}")
        return k
