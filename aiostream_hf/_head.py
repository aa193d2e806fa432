"""A file's head, read while the file is planned: one round trip less before its first row.

A Parquet stream's first row costs, after the resolution, a tail read (the footer) and
then a read of the first row group, one round trip after the other. Where the stream
reads a whole file (every column, every row group), the first row group's bytes are
known to start right after the magic, so the stream reads the file's head beside its
tail (``Decoder.head_range``), and the first units' ranges that lie in that head are
cut from it instead of being fetched (``HeadFirst``). The head is at most a block and a
quarter of the readahead budget, and only the first file of a stream reads one: the
others are planned while earlier files are read, so their round trips are hidden.

The read is a guess: one the server failed (its retries spent) is dropped, and the
units fetch their own bytes; an error of the file itself (changed since its first answer,
gone, denied) ends the stream, in order before any row, as it would at any other read.
The head and the tail are the file's first answers together: whichever comes first pins
its version, and the other must show it. Of a range that runs past the head's end only
the part past it is fetched: no byte is fetched twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio

from ._exceptions import RetriesExhaustedError, UnreachableError
from ._fetcher import RangeFetcher
from ._models import FileRef

__all__ = ["HeadFirst", "HeadRead"]

logger = logging.getLogger("aiostream_hf")


class HeadRead:
    """The bytes ``start`` to ``end`` of ``file``, read once by ``read``; None if it failed."""

    def __init__(self, file: FileRef, start: int, end: int) -> None:
        if not 0 <= start < end:
            raise ValueError(f"a head read of {file.url} needs 0 <= start < end: {start}, {end}")
        self.file = file
        self.start = start
        self.end = end
        self.data: memoryview | None = None
        self.done = anyio.Event()

    async def read(self, source: RangeFetcher) -> None:
        """Read the head. A server that failed it (retries spent, unreachable) leaves
        ``data`` None; any other error is the file's (changed, gone, denied) and is raised,
        as the file's other reads would."""
        try:
            (self.data,) = await source.read_buffers(self.file, [(self.start, self.end)])
        except (RetriesExhaustedError, UnreachableError) as exc:
            # Not the file's fault: its units fetch their own bytes, with their own retries.
            logger.debug("the early head read of %s failed (%r): not used", self.file.url, exc)
        finally:
            self.done.set()


class HeadFirst:
    """A ``ByteSource`` that cuts the ranges lying in a file's head read from it (waiting
    for it if it is still on its way) and fetches the rest from ``source``."""

    def __init__(self, source: RangeFetcher, head: HeadRead) -> None:
        self._source = source
        self._head = head

    async def read_ranges(self, file: FileRef, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return await self._source.read_ranges(file, ranges)

    async def read_tail(self, file: FileRef, n: int) -> tuple[bytes, int]:
        return await self._source.read_tail(file, n)

    async def read_buffers(
        self, file: FileRef, ranges: Sequence[tuple[int, int]]
    ) -> list[memoryview]:
        head = self._head
        if file.url != head.file.url or not any(_in_head(head, s, e) for s, e in ranges):
            return await self._source.read_buffers(file, ranges)
        # Each range is its part in the head (if any) then its part past it (if any); a
        # range starting before the head (which no decoder asks) is fetched whole. The
        # parts past the head are fetched while the head is still on its way.
        cuts = [(s, min(e, head.end) if _in_head(head, s, e) else s, e) for s, e in ranges]
        past = [(m, e) for _, m, e in cuts if m < e]
        later = await self._source.read_buffers(file, past) if past else []
        await head.done.wait()
        data = head.data
        if data is None:  # the head read failed: its parts are fetched now
            own = [(s, m) for s, m, _ in cuts if s < m]
            got = iter(await self._source.read_buffers(file, own))
            firsts = [next(got) if s < m else None for s, m, _ in cuts]
        else:
            firsts = [data[s - head.start : m - head.start] if s < m else None for s, m, _ in cuts]
        rest = iter(later)
        out: list[memoryview] = []
        for (s, m, e), first in zip(cuts, firsts, strict=True):
            second = next(rest) if m < e else None
            if second is None:
                assert first is not None
                out.append(first)
            elif first is None:
                out.append(second)
            else:  # cut in two: joined as one buffer
                joined = bytearray(e - s)
                joined[: m - s] = first
                joined[m - s :] = second
                out.append(memoryview(joined).toreadonly())
        return out


def _in_head(head: HeadRead, start: int, end: int) -> bool:
    """Whether the range starts inside the head (its first bytes can be cut from it)."""
    return head.start <= start < head.end and start < end
