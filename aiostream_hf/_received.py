"""Received: the bytes a stream has fetched, kept by file, so that no byte is fetched twice.

    received = Received(fetcher)
    tail, size = await received.read_tail(file, 64 << 10)   # kept: a footer, and more
    await received.keep(file, 4, 8 << 20)                    # a head, read ahead of its use
    pieces = await received.read_pieces(file, [(4, 9 << 20)])  # the head, then the rest
    received.forget(file)                                    # the file's reads are done

A Parquet file's tail read (the footer) holds, in a small file, some or all of its
row groups; a stream's first file has its head read beside the tail, before its row
groups are known. Both are kept here, and a later read of their bytes is cut from them:
only the parts not held are fetched (one ``read_buffers`` call, beside the wait for a
kept read still on its way). A range cut in parts comes as its pieces from
``read_pieces``, for a decoder that reads pieces as one (Parquet, on its decode thread).
``read_buffers`` and ``read_ranges`` give one buffer per range: they cut a range from a
kept read only when it lies within it, and fetch any other whole, never joining pieces
on the event loop.

A kept read that the server failed (retries spent, unreachable) is dropped, and the reads
that waited on it fetch its bytes themselves; any other error is the file's (changed
since its first answer, gone, denied) and is raised, as the file's other reads would.

Bounds: what is kept is what the stream asked to keep (each file's tail read, and one
head of at most a block), until it ``forget``s the file once its last unit's bytes are
fetched; the files planned and loading at once are bounded by the stream's readahead.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from ._exceptions import RetriesExhaustedError, UnreachableError
from ._models import FileRef
from .formats import ByteSource

__all__ = ["Received"]

logger = logging.getLogger("aiostream_hf")

#: (offset in the file, bytes from there): one piece of a range
Piece = tuple[int, memoryview]
Buffer = bytes | memoryview


@dataclass(eq=False)
class _Span:
    """Bytes ``start`` to ``end`` of a file: held (``data``), or on their way (``done``
    unset); a read that failed leaves ``data`` None once done."""

    start: int
    end: int
    data: memoryview | None = None
    done: anyio.Event = field(default_factory=anyio.Event)


class Received:
    """A ``ByteSource`` over ``source`` that keeps the tail reads and the reads it is told
    to ``keep``, by file, and cuts later reads of their bytes from them."""

    def __init__(self, source: ByteSource) -> None:
        self._source = source
        self._spans: dict[str, list[_Span]] = {}  # by file URL, sorted by start

    def held_bytes(self) -> int:
        """Bytes kept now, over every file (reads on their way count for their size)."""
        return sum(s.end - s.start for spans in self._spans.values() for s in spans)

    # -- what is kept ------------------------------------------------------------------------

    def _add(self, file: FileRef, span: _Span) -> None:
        spans = self._spans.setdefault(file.url, [])
        spans.append(span)
        spans.sort(key=lambda s: s.start)

    def _drop(self, file: FileRef, span: _Span) -> None:
        spans = self._spans.get(file.url)
        if spans is not None and span in spans:
            spans.remove(span)

    def forget(self, file: FileRef) -> None:
        """The file's reads are done: its kept bytes are let go (a later read fetches)."""
        self._spans.pop(file.url, None)

    async def keep(self, file: FileRef, start: int, end: int) -> None:
        """Read bytes ``start`` to ``end`` of ``file`` and keep them. Reads of them made
        meanwhile wait for this one. A read the server failed (retries spent, unreachable)
        is dropped: those reads fetch the bytes themselves."""
        if not 0 <= start < end:
            raise ValueError(f"keep({start}, {end}) of {file.url}: need 0 <= start < end")
        span = _Span(start, end)
        self._add(file, span)
        try:
            (span.data,) = await self._source.read_buffers(file, [(start, end)])
        except (RetriesExhaustedError, UnreachableError) as exc:
            # Not the file's fault: the reads of these bytes fetch them, with their own retries.
            logger.debug("a read of %s kept ahead failed (%r): not used", file.url, exc)
            self._drop(file, span)
        except BaseException:
            self._drop(file, span)
            raise
        finally:
            span.done.set()

    # -- ByteSource ----------------------------------------------------------------------------

    async def read_tail(self, file: FileRef, n: int) -> tuple[bytes, int]:
        """The source's tail read, kept: its bytes serve the file's later reads."""
        data, size = await self._source.read_tail(file, n)
        if data:
            span = _Span(size - len(data), size, memoryview(data).toreadonly())
            span.done.set()
            self._add(file, span)
        return data, size

    async def read(self, file: FileRef, start: int, end: int) -> bytes:
        """The bytes ``start`` to ``end`` (exclusive), as ``RangeFetcher.read``."""
        return (await self.read_ranges(file, [(start, end)]))[0]

    def _inside(self, file: FileRef, ranges: Sequence[tuple[int, int]]) -> list[bool]:
        """Whether each range lies within one kept read (all of it cut from there)."""
        spans = self._spans.get(file.url, ())
        return [any(s.start <= start and end <= s.end for s in spans) for start, end in ranges]

    async def _one_buffer_each(
        self,
        file: FileRef,
        ranges: Sequence[tuple[int, int]],
        fetch: Callable[[FileRef, Sequence[tuple[int, int]]], Awaitable[Sequence[Buffer]]],
    ) -> list[Buffer]:
        """A buffer per range for callers that want one: a range within one kept read is
        cut from it; any other is fetched whole by ``fetch`` (a few held bytes again),
        never joined from pieces on the event loop (a shard's read of all its bytes but
        the kept tail byte would be copied whole)."""
        inside = self._inside(file, ranges)
        if not any(inside):
            return list(await fetch(file, ranges))
        others = [r for r, i in zip(ranges, inside, strict=True) if not i]
        within = [r for r, i in zip(ranges, inside, strict=True) if i]
        fetched = iter(await fetch(file, others) if others else [])
        kept = iter(await self.read_pieces(file, within))
        return [next(kept)[0][1] if i else next(fetched) for i in inside]

    async def read_ranges(self, file: FileRef, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        got = await self._one_buffer_each(file, ranges, self._source.read_ranges)
        return [b if isinstance(b, bytes) else bytes(b) for b in got]

    async def read_buffers(
        self, file: FileRef, ranges: Sequence[tuple[int, int]]
    ) -> list[memoryview]:
        got = await self._one_buffer_each(file, ranges, self._source.read_buffers)
        return [memoryview(b) for b in got]

    async def read_pieces(
        self, file: FileRef, ranges: Sequence[tuple[int, int]]
    ) -> list[list[Piece]]:
        """Each range's bytes as pieces in order, ``(offset, view)``: the parts held cut
        from what is kept, the others fetched in one ``read_buffers`` call while the
        kept reads still on their way are waited for."""
        spans = list(self._spans.get(file.url, ()))  # as now: a later forget changes nothing
        cuts = [_cut(spans, start, end) for start, end in ranges]
        wanted = [(s, e) for parts in cuts for s, e, span in parts if span is None]
        got: dict[tuple[int, int], memoryview] = {}
        if wanted:
            got.update(zip(wanted, await self._source.read_buffers(file, wanted), strict=True))
        waited = {id(span): span for parts in cuts for _, _, span in parts if span is not None}
        for span in waited.values():
            await span.done.wait()
        # The parts of kept reads that failed are fetched now.
        lost = [(s, e) for parts in cuts for s, e, span in parts if _lost(span)]
        if lost:
            got.update(zip(lost, await self._source.read_buffers(file, lost), strict=True))
        out: list[list[Piece]] = []
        for parts in cuts:
            pieces: list[Piece] = []
            for s, e, holder in parts:
                held = None if holder is None else holder.data
                if held is None:
                    pieces.append((s, got[(s, e)]))
                else:
                    assert holder is not None
                    pieces.append((s, held[s - holder.start : e - holder.start]))
            out.append(pieces)
        return out


def _lost(span: _Span | None) -> bool:
    return span is not None and span.data is None


def _cut(spans: Sequence[_Span], start: int, end: int) -> list[tuple[int, int, _Span | None]]:
    """``[start, end)`` in parts, in order: each held by a span (the first that holds
    its first byte) or not (None)."""
    parts: list[tuple[int, int, _Span | None]] = []
    pos = start
    while pos < end:
        holder = next((s for s in spans if s.start <= pos < s.end), None)
        if holder is not None:
            stop = min(end, holder.end)
        else:  # up to the next span that starts before the end, or the end
            stop = min([s.start for s in spans if pos < s.start < end] + [end])
        parts.append((pos, stop, holder))
        pos = stop
    return parts
