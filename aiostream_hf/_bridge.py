"""The sync bridge: one background event-loop thread per process.

    for row in ash.stream(...):      # sync iteration runs the async pipeline here
        ...

The thread starts on first use (and again in a forked child, which does not
inherit threads), is shared by every stream of the process, and is a daemon,
so the interpreter never waits for it at exit. Items cross to the consumer
through a bounded memory object stream; the consumer takes whatever is ready
in one call, so the thread hop is paid per batch of items, not per item.

At interpreter exit, an iterator left half-read (``it = iter(stream); next(it)``,
then the script ends) must neither hang nor print. An ``atexit`` hook, registered
when the first bridge starts, stops the bridge while the interpreter is still whole
(after its non-daemon threads have ended, so no user thread still iterates): every
producer is cancelled, its cleanup (sockets, files) runs, and the loop ends, within
``EXIT_TIMEOUT`` seconds; past that the daemon thread is left to the interpreter.
The iterators are finalised later, when the modules are torn down: ``close()`` of a
stopped bridge's iterator (or of any iterator once the interpreter is finalising)
waits on nothing and touches no module global.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
from anyio.from_thread import BlockingPortal
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._exceptions import ClosedResourceError

__all__ = ["EXIT_TIMEOUT", "BridgeStatistics", "SyncIterator", "portal", "statistics"]

T = TypeVar("T")

#: Seconds the bridge is given at interpreter exit to cancel its producers, run their
#: cleanup and end its loop; a producer stuck longer is left to the interpreter.
EXIT_TIMEOUT = 1.0


class _Bridge:
    """A BlockingPortal served by a daemon thread running an event loop."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        # Set once the loop is told to end (interpreter exit) or has ended: from then on
        # nothing waits on the portal. Plain attributes, read by finalisers at exit.
        self.stopped = False
        self.ended = False  # the loop has ended: its objects may be touched from here
        self._ready = threading.Event()
        self._portal: BlockingPortal | None = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="aiostream-hf-bridge", daemon=True)
        self.thread.start()
        self._ready.wait()
        if self._error is not None:
            raise RuntimeError("the aiostream-hf bridge thread failed to start") from self._error

    def _run(self) -> None:
        try:
            anyio.run(self._serve)
        except BaseException as exc:  # reported to the thread that started us
            self._error = exc
            self._ready.set()
        finally:
            self.stopped = self.ended = True

    async def _serve(self) -> None:
        async with BlockingPortal() as portal:
            self._portal = portal
            self._ready.set()
            await portal.sleep_until_stopped()

    @property
    def portal(self) -> BlockingPortal:
        assert self._portal is not None
        return self._portal

    def stop(self, timeout: float) -> None:
        """Cancel every task of the loop (the producers run their cleanup) and end the
        loop; wait for the thread at most ``timeout`` seconds."""
        if self.stopped:
            return
        self.stopped = True
        try:
            self.portal.start_task_soon(self.portal.stop, True)
        except RuntimeError:  # the loop has already ended
            return
        self.thread.join(timeout)


_lock = threading.Lock()
_bridge: _Bridge | None = None
_starts = 0
_exit_hook = False


def _current() -> _Bridge:
    """The process's bridge, started on first use, after fork, and after a stop."""
    global _bridge, _starts, _exit_hook
    with _lock:
        if (
            _bridge is None
            or _bridge.pid != os.getpid()
            or _bridge.stopped
            or not _bridge.thread.is_alive()
        ):
            _bridge = _Bridge()
            _starts += 1
            if not _exit_hook:  # a forked child inherits the hook with the flag
                atexit.register(_stop_at_exit)
                _exit_hook = True
        return _bridge


def portal() -> BlockingPortal:
    """The process's bridge portal, started on first use and after fork."""
    return _current().portal


def _stop_at_exit() -> None:
    """The atexit hook: stop this process's bridge while the interpreter is whole."""
    with _lock:
        bridge = _bridge
    if bridge is not None and bridge.pid == os.getpid():
        bridge.stop(EXIT_TIMEOUT)


@dataclass(frozen=True)
class BridgeStatistics:
    starts: int  # bridge threads started in this process (1 normally; +1 per fork)
    alive: bool


def statistics() -> BridgeStatistics:
    with _lock:
        alive = _bridge is not None and _bridge.pid == os.getpid() and _bridge.thread.is_alive()
        return BridgeStatistics(_starts, alive)


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


class SyncIterator(Generic[T]):
    """Iterates an async iterator (made in the bridge thread) from sync code.

    ``buffer`` bounds the items in flight between the two threads. ``close()``
    (also on ``break`` through the generator that wraps it, and on
    KeyboardInterrupt) cancels the producer and waits for its cleanup; on the
    bridge's own thread (a garbage collection there), once the bridge has stopped
    (interpreter exit), or while the interpreter finalises, it waits on nothing.
    """

    # Bound on the class: a finaliser at interpreter exit may run after this module's
    # globals (``sys``, ``threading``) have been cleared.
    _finalizing = staticmethod(sys.is_finalizing)
    _ident = staticmethod(threading.get_ident)

    def __init__(
        self,
        make: Callable[[], AsyncIterator[T]],
        *,
        buffer: int = 256,
        close_timeout: float = 30.0,
    ) -> None:
        self._bridge = _current()
        self._portal = self._bridge.portal
        self._make = make
        self._close_timeout = close_timeout
        send, receive = self._portal.call(_make_stream, buffer)
        self._receive: MemoryObjectReceiveStream[Any] = receive
        self._ready: list[Any] = []
        self._closed = False
        self._produced = threading.Event()  # set when the producer and its cleanup ended
        self._future: Future[None] = self._portal.start_task_soon(self._produce, send)

    async def _produce(self, send: MemoryObjectSendStream[Any]) -> None:
        try:
            async with send:
                try:
                    iterator = self._make()
                    try:
                        async for item in iterator:
                            await send.send(item)
                    finally:
                        # Not shielded: the iterator may hold task groups whose cancel
                        # scopes are still open on this task, and must close them
                        # innermost first.
                        aclose = getattr(iterator, "aclose", None)
                        if aclose is not None:
                            await aclose()
                except anyio.get_cancelled_exc_class():
                    raise
                except Exception as exc:  # handed to the consumer thread, raised there
                    await send.send(_Failure(exc))
                    return
                await send.send(_DONE)
        finally:
            self._produced.set()

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if not self._ready:
            if self._closed:
                raise StopIteration
            if self._bridge.stopped:
                self.close()
                raise ClosedResourceError(
                    "the aiostream-hf bridge stopped (the interpreter is exiting): "
                    "iterate streams before the program's end, not in an atexit hook"
                )
            self._ready = self._portal.call(_receive_ready, self._receive)
            self._ready.reverse()
        item = self._ready.pop()
        if item is _DONE:
            self._finish()
            raise StopIteration
        if isinstance(item, _Failure):
            self._finish()
            raise item.error
        return item  # type: ignore[no-any-return]

    def _finish(self) -> None:
        self._closed = True
        self._ready.clear()
        with contextlib.suppress(CancelledError):
            self._future.result(timeout=self._close_timeout)
        self._portal.call(self._receive.aclose)

    def close(self) -> None:
        """Cancel the producer (if still running) and wait for its cleanup."""
        if self._closed:
            return
        self._closed = True
        self._ready.clear()
        bridge = self._bridge
        if bridge.stopped or self._finalizing():
            # Interpreter exit: the bridge cancelled its producers when it stopped, or
            # its thread is frozen (finalising). Waiting would hang; cancelling would
            # call into modules that may be torn down. Once the loop has ended, nothing
            # else touches the hand-off: close it here (no sender is left to wake).
            if bridge.ended:
                self._receive.close()
            return
        self._future.cancel()
        if self._ident() == bridge.thread.ident:
            # Collected on the bridge's own thread: it cannot wait for itself; the
            # cancelled producer cleans up on its own.
            self._receive.close()
            return
        # The future is cancelled at once, before the task has run its cleanup: wait for
        # the cleanup itself (sockets closed, files released), at most close_timeout.
        self._produced.wait(self._close_timeout)
        with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
            self._portal.call(self._receive.aclose)


async def _make_stream(
    buffer: int,
) -> tuple[MemoryObjectSendStream[Any], MemoryObjectReceiveStream[Any]]:
    return anyio.create_memory_object_stream[Any](buffer)


async def _receive_ready(receive: MemoryObjectReceiveStream[Any]) -> list[Any]:
    """The next item, and every item that is ready after it (at most the buffer)."""
    try:
        items = [await receive.receive()]
    except anyio.EndOfStream:
        return [_Failure(ClosedResourceError("the stream's producer ended without a result"))]
    while True:
        try:
            items.append(receive.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            return items


def iterate(make: Callable[[], AsyncIterator[T]], *, buffer: int = 256) -> Iterator[T]:
    """Sync iteration over ``make()``; leaving the loop early cancels the producer."""
    it = SyncIterator(make, buffer=buffer)
    try:
        yield from it
    finally:
        it.close()
