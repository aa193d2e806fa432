"""The sync bridge: one event-loop thread per process, bounded hand-off, clean exits."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest

import aiostream_hf as ash
from aiostream_hf import _bridge


def _bridge_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "aiostream-hf-bridge"]


def test_items_arrive_in_order_on_one_shared_thread() -> None:
    async def numbers(n: int) -> AsyncIterator[int]:
        for i in range(n):
            if i % 100 == 0:
                await anyio.lowlevel.checkpoint()
            yield i

    assert list(_bridge.iterate(lambda: numbers(5000), buffer=64)) == list(range(5000))
    assert list(_bridge.iterate(lambda: numbers(10))) == list(range(10))
    assert len(_bridge_threads()) == 1
    assert _bridge.statistics().alive


def test_an_error_is_raised_in_the_consumer_with_its_cause() -> None:
    async def failing() -> AsyncIterator[int]:
        yield 1
        try:
            raise KeyError("inner")
        except KeyError as exc:
            raise ValueError("decoder failed") from exc

    got = []
    with pytest.raises(ValueError, match="decoder failed") as info:
        for item in _bridge.iterate(failing):
            got.append(item)
    assert got == [1]
    assert isinstance(info.value.__cause__, KeyError)


def test_break_cancels_the_producer_and_runs_its_cleanup() -> None:
    cleaned = threading.Event()
    produced = []

    async def endless() -> AsyncIterator[int]:
        try:
            i = 0
            while True:
                produced.append(i)
                yield i
                i += 1
        finally:
            cleaned.set()

    threads_before = threading.active_count()
    for item in _bridge.iterate(endless, buffer=8):
        if item == 3:
            break
    assert cleaned.is_set()  # close() waited for the producer's finally
    n = len(produced)
    # Bounded, however the threads interleave: the consumer's batch that holds item 3
    # ends at most buffer + 1 items after its start (the buffered items and the one a
    # blocked sender holds); meanwhile the producer refills the buffer, blocks one more
    # in send, and may have made one more in hand. Unbounded production fails this.
    assert n <= 4 + 3 * (8 + 1)
    assert threading.active_count() == threads_before


def test_close_waits_for_a_cleanup_that_awaits() -> None:
    """A producer's cleanup that awaits (closing a connection, a file) has ended when
    close() returns: the resources are released when the loop is left, not later."""
    cleaned = threading.Event()

    async def endless() -> AsyncIterator[int]:
        try:
            while True:
                yield 1
                await anyio.lowlevel.checkpoint()
        finally:
            with anyio.CancelScope(shield=True):
                for _ in range(20):
                    await anyio.sleep(0.005)
            cleaned.set()

    for _ in _bridge.iterate(endless, buffer=2):
        break
    assert cleaned.is_set()


def test_close_is_idempotent_and_stops_iteration() -> None:
    async def endless() -> AsyncIterator[int]:
        while True:
            yield 0
            await anyio.lowlevel.checkpoint()

    it = _bridge.SyncIterator(endless, buffer=4)
    assert next(it) == 0
    it.close()
    it.close()
    with pytest.raises(StopIteration):
        next(it)


def _child_uses_bridge(queue: multiprocessing.Queue[object]) -> None:
    async def numbers() -> AsyncIterator[int]:
        for i in range(3):
            yield i

    queue.put((list(_bridge.iterate(numbers)), _bridge.statistics().starts))


def test_a_forked_child_gets_its_own_bridge() -> None:
    list(_bridge.iterate(_empty))  # the parent's bridge is running
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[object] = ctx.Queue()
    proc = ctx.Process(target=_child_uses_bridge, args=(queue,))
    proc.start()
    result = queue.get(timeout=60)
    proc.join(timeout=60)
    queue.close()
    queue.join_thread()
    assert proc.exitcode == 0
    items, starts = result  # type: ignore[misc]
    assert items == [0, 1, 2]
    assert starts >= 2  # started again after fork


async def _empty() -> AsyncIterator[int]:
    return
    yield  # pragma: no cover


SCRIPT = textwrap.dedent(
    """
    import sys, anyio
    from aiostream_hf import _bridge

    async def slow():
        i = 0
        while True:
            await anyio.sleep(0.01)
            yield i
            i += 1

    for i in _bridge.iterate(slow):
        if i == 2:
            print("ready", flush=True)
    """
)


def test_ctrl_c_ends_the_process_promptly() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)  # a hang fails here
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err


def test_the_interpreter_exits_with_a_producer_still_running() -> None:
    script = textwrap.dedent(
        """
        import anyio
        from aiostream_hf import _bridge

        async def endless():
            while True:
                await anyio.sleep(0.01)
                yield 1

        it = _bridge.SyncIterator(endless)
        next(it)
        print("leaving", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "leaving"


def test_stopping_at_exit_cancels_producers_and_nothing_waits_after() -> None:
    """What the atexit hook does: every producer is cancelled and cleaned up, the loop
    ends; a left iterator's close() then waits on nothing, and its next() says why."""
    cleaned = threading.Event()

    async def endless() -> AsyncIterator[int]:
        try:
            while True:
                yield 1
                await anyio.sleep(0.01)
        finally:
            cleaned.set()

    it = _bridge.SyncIterator(endless, buffer=2)
    assert next(it) == 1
    starts = _bridge.statistics().starts
    (thread,) = _bridge_threads()
    _bridge._stop_at_exit()
    assert cleaned.is_set()  # cancelled, its finally ran, before the hook returned
    assert not thread.is_alive()
    assert not _bridge.statistics().alive
    with pytest.raises(ash.ClosedResourceError, match="interpreter is exiting"):
        next(it)
    it.close()  # returns: nothing left to wait on
    # A later user gets a new bridge.
    assert list(_bridge.iterate(_empty)) == []
    assert _bridge.statistics().starts == starts + 1


def test_close_on_the_bridge_thread_does_not_wait_for_itself() -> None:
    """A garbage collection on the bridge's own thread may close an iterator there
    (a ShardFile collected in a decode); it cancels its producer, closes the hand-off
    (no ResourceWarning) and returns."""
    cleaned = threading.Event()

    async def endless() -> AsyncIterator[int]:
        try:
            while True:
                yield 1
                await anyio.sleep(0.01)
        finally:
            cleaned.set()

    it = _bridge.SyncIterator(endless, buffer=2)
    assert next(it) == 1

    _bridge.portal().call(it.close)  # runs on the bridge's thread
    assert cleaned.wait(30)


def test_a_cleanup_stuck_at_exit_delays_the_exit_by_a_bound_only() -> None:
    """The exit hook gives the producers EXIT_TIMEOUT to clean up; one stuck for an
    hour (shielded) is left to the interpreter, which exits silently."""
    script = textwrap.dedent(
        """
        import anyio
        from aiostream_hf import _bridge

        async def stuck():
            try:
                while True:
                    await anyio.sleep(0.01)
                    yield 1
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(3600)

        def rows():
            yield from _bridge.iterate(stuck)

        it = rows()
        next(it)
        print("leaving", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "leaving"
    assert done.stderr == ""
