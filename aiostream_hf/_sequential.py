"""Drives a sequential decoder over a file's byte stream: one long GET, parsed as it arrives.

A ``SequentialDecoder`` (``formats/``) is synchronous and does no I/O: its
``SequentialParser`` takes blocks and gives chunks. ``read_sequential`` is the
stream's side of it, for one file in a task of its own:

- a reader task holds the file's one long read (``StreamSource.iter_bytes`` from
  ``start.offset``) and hands each block over a rendezvous (a memory object stream
  of buffer 0): while the parser works on a block in a worker thread, the reader
  holds the next one ready, and no more;
- each block goes to ``parser.feed`` in a worker thread, and the chunk it gives to
  ``emit``, which waits while the stream's readahead is full (the back-pressure
  reaches the socket through the rendezvous);
- when the parser says the data ended (a TAR's end-of-archive blocks), the read is
  cancelled: what a server sends after them (padding, an endless body) is not read;
- a failed read is handed to the parser's side after the blocks before it, so every
  whole row before the failure is delivered;
- on a ``DecodeError`` or ``FetchError`` the parser salvages what it holds whole,
  then either the error is raised or (the decoder's ``on_error``) the parser's final
  chunk of a damaged file ends the file.

Cancellation is never swallowed: the reader passes it on, and the task group ends
the reader when the parser side fails or is cancelled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread

from ._exceptions import DecodeError, FetchError
from ._models import FileRef
from ._stalls import run_decode
from .formats import Chunk, Position, ReadRequest, SequentialDecoder, StreamSource

__all__ = ["Emit", "read_sequential"]

Emit = Callable[[Chunk], Awaitable[None]]
"""Where the chunks of a file go: waits while the stream's readahead is full."""


async def read_sequential(
    decoder: SequentialDecoder[Any],
    file: FileRef,
    source: StreamSource,
    request: ReadRequest,
    start: Position,
    emit: Emit,
) -> None:
    """Read ``file`` from ``start`` with ``decoder``'s parser, ``await emit(chunk)`` for
    each chunk in order, the last one ``final``. While a block is parsed (in a worker
    thread) the next one is read."""
    parser = decoder.parser(file, request, start)
    # A rendezvous: the reader holds one block ready while the parser works on the last.
    send, receive = anyio.create_memory_object_stream[bytes](0)
    failed: list[Exception] = []
    # Cancelled when the parser says the data ended: what a server sends after it (the
    # record's padding, or an endless body) is not read.
    reading = anyio.CancelScope()

    async def read() -> None:
        with reading:
            async with send:
                try:
                    async with source.iter_bytes(file, start=start.offset or 0) as blocks:
                        async for block in blocks:
                            await send.send(block)
                except anyio.get_cancelled_exc_class():
                    raise
                except Exception as exc:  # handed to the parser, after the blocks before it
                    failed.append(exc)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            try:
                async with receive:
                    async for block in receive:
                        chunk = await run_decode(parser.feed, block)
                        parser.report()
                        if chunk is not None:
                            await emit(chunk)
                        if parser.ended:
                            reading.cancel()
                            break
                if failed:
                    raise failed[0]
                last = await run_decode(parser.finish)
                parser.report()
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as exc:  # raised below, outside the task group (unwrapped)
                failed[:] = [exc]
                tg.cancel_scope.cancel()
        if failed:
            raise failed[0]
    except (DecodeError, FetchError) as exc:
        # What the parser holds whole when the stream broke off comes first; then the
        # error, or the final chunk of a file whose rest is skipped.
        salvaged = await run_decode(parser.salvage, exc)
        if salvaged is not None:
            parser.report()
            await emit(salvaged)
        abandoned = parser.abandon(exc)
        if abandoned is None:
            raise
        parser.report()
        last = abandoned
    await emit(last)
