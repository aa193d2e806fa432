"""The video readers of a LeRobot stream: one open ``VideoReader`` per video file,
shared by concurrent batches in the order they began, at most ``max_open_videos`` idle
ones kept, and their statistics summed."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import fields

import anyio

from ._exceptions import ClosedResourceError
from ._kept_bytes import KeptBytes
from ._models import FileRef
from ._options import StreamOptions
from .formats import ByteSource
from .video import VideoReader, VideoStatistics

# -- video readers ----------------------------------------------------------------------


class _Entry:
    __slots__ = ("failed", "ready", "reader", "users")

    def __init__(self, reader: VideoReader) -> None:
        self.reader = reader
        self.users = 0
        self.ready = anyio.Event()
        self.failed = False


class _Turns:
    """The order in which batches call one file's reader: the order they began in (the
    prefetcher begins jobs in order), whichever task the backend runs first. A batch
    out of turn would find the decoder past its frames and fetch their GOP again."""

    __slots__ = ("_changed", "_done", "serving", "taken")

    def __init__(self) -> None:
        self.taken = 0  # tickets handed out
        self.serving = 0  # the ticket whose turn it is
        self._done: set[int] = set()
        self._changed = anyio.Event()

    def take(self) -> _Ticket:
        self.taken += 1
        return _Ticket(self, self.taken - 1)

    async def wait(self, number: int) -> None:
        while self.serving < number:
            await self._changed.wait()

    def done(self, number: int) -> None:
        self._done.add(number)
        if self.serving not in self._done:
            return
        while self.serving in self._done:
            self._done.remove(self.serving)
            self.serving += 1
        self._changed.set()
        self._changed = anyio.Event()

    @property
    def idle(self) -> bool:
        """Every ticket handed out is done."""
        return self.serving == self.taken


class _Ticket:
    """A place in a file's ``_Turns``; ``done`` once used or given up (a second call is a
    no-op)."""

    __slots__ = ("number", "turns", "used")

    def __init__(self, turns: _Turns, number: int) -> None:
        self.turns = turns
        self.number = number
        self.used = False

    async def wait(self) -> None:
        await self.turns.wait(self.number)

    def done(self) -> None:
        if not self.used:
            self.used = True
            self.turns.done(self.number)


_COUNTERS = tuple(
    f.name for f in fields(VideoStatistics) if f.name not in ("indexed", "fallback_reason")
)


class _ReaderPool:
    """Open VideoReaders by file, shared by concurrent users, at most ``limit`` idle ones kept
    (least recently used first out). A file is opened once even when asked for at once.

    One reader per file keeps its decoder going forward from batch to batch; the cameras
    (files) of a batch, and the batches of different files, decode concurrently. (Two
    readers per file, alternating batches, measured no faster on 2 cores: decoding is
    already spread over the cameras, and each batch then restarts at a keyframe.)
    """

    def __init__(
        self, source: ByteSource, limit: int, options: StreamOptions | None = None
    ) -> None:
        keep = 0 if options is None else options.kept_video_bytes
        self._kept = KeptBytes(source, keep) if keep else None
        self._source: ByteSource = source if self._kept is None else self._kept
        self._options = options  # the stream's: its max_whole_video_bytes
        self._limit = limit
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._turns: dict[str, _Turns] = {}  # of the files with a ticket not done
        self._closed_counts: dict[str, int] = {}
        self._closed = False
        self.opened = 0
        self.evicted = 0

    def counts(self) -> dict[str, int]:
        """Readers opened and evicted, and the summed statistics of every reader."""
        counts = {**self._closed_counts, "opened": self.opened, "evicted": self.evicted}
        if self._kept is not None:
            counts["bytes_reused"] = self._kept.reused
        for entry in self._entries.values():
            if entry.ready.is_set() and not entry.failed:
                _add_counts(counts, entry.reader.statistics())
        return counts

    def take_turn(self, file: FileRef) -> _Ticket:
        """A ticket for ``use``: the callers of one file's reader get it in the order they
        took their tickets. Every ticket must be done, used (``use`` does it) or not."""
        turns = self._turns.get(file.url)
        if turns is None:
            turns = self._turns[file.url] = _Turns()
        return turns.take()

    def done(self, file: FileRef, ticket: _Ticket) -> None:
        """``ticket`` is used, or given up; a file whose tickets are all done is
        forgotten (what is kept is bounded by the batches running)."""
        ticket.done()
        if ticket.turns.idle and self._turns.get(file.url) is ticket.turns:
            del self._turns[file.url]

    @contextlib.asynccontextmanager
    async def use(self, file: FileRef, ticket: _Ticket | None = None) -> AsyncIterator[VideoReader]:
        """The reader of ``file``; with a ``ticket`` (``take_turn``), once the tickets
        before it are done; the ticket is done on leaving, however it is left."""
        try:
            entry = await self._acquire(file.url, file)
            try:
                if ticket is not None:
                    await ticket.wait()
                yield entry.reader
            finally:
                entry.users -= 1
                with anyio.CancelScope(shield=True):
                    await self._trim()
        finally:
            if ticket is not None:
                self.done(file, ticket)

    async def _acquire(self, key: str, file: FileRef) -> _Entry:
        while True:
            if self._closed:
                raise ClosedResourceError("the video readers of this stream are closed")
            entry = self._entries.get(key)
            if entry is None:
                entry = _Entry(VideoReader(file, fetcher=self._source, options=self._options))
                entry.users = 1
                self._entries[key] = entry
                try:
                    await entry.reader.aopen()
                except BaseException:
                    entry.failed = True
                    if self._entries.get(key) is entry:
                        del self._entries[key]
                    entry.ready.set()
                    raise
                self.opened += 1
                entry.ready.set()
                return entry
            entry.users += 1
            self._entries.move_to_end(key)
            if not entry.ready.is_set():
                try:
                    await entry.ready.wait()
                except BaseException:
                    entry.users -= 1
                    raise
            if entry.failed:  # its opener failed or was cancelled: open it ourselves
                entry.users -= 1
                continue
            return entry

    async def _trim(self) -> None:
        while len(self._entries) > self._limit:
            idle = next(
                (
                    key
                    for key, e in self._entries.items()
                    if e.users == 0 and e.ready.is_set() and not e.failed
                ),
                None,
            )
            if idle is None:
                return
            entry = self._entries.pop(idle)
            self.evicted += 1
            await self._close(entry)

    async def _close(self, entry: _Entry) -> None:
        _add_counts(self._closed_counts, entry.reader.statistics())
        await entry.reader.aclose()

    async def aclose(self) -> None:
        self._closed = True
        entries = list(self._entries.values())
        self._entries.clear()
        for entry in entries:
            if entry.ready.is_set() and not entry.failed:
                await self._close(entry)
            else:
                await entry.reader.aclose()


def _add_counts(counts: dict[str, int], stats: VideoStatistics) -> None:
    for name in _COUNTERS:
        counts[name] = counts.get(name, 0) + int(getattr(stats, name))


def _merge_counts(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for name, value in counts.items():
        into[name] = into.get(name, 0) + value
