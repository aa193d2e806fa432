"""The process's decode threads: where the parts of one decode run side by side.

The engine decodes each unit in a worker thread (``anyio.to_thread``, at most one
per usable core). A large Parquet row group is decoded in column groups, one per
core, and those parts run here: a pool of long-lived threads shared by every stream
of the process. A pool per row group gave every row group fresh threads, and so fresh
allocator heaps (memory and time). The thread that asks waits for its parts, and parts
never ask for parts, so the pool cannot deadlock on itself.

Decoders own no thread (``formats`` does no I/O and starts nothing): the engine
scopes ``decoding()`` around its decodes, and a decoder that can split its work
(``formats.parquet.parallel_parts``) runs its parts through ``run_all``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import TypeVar

from .formats.parquet import parallel_parts

__all__ = ["decoding", "run_all"]

_T = TypeVar("_T")

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(os.cpu_count() or 2, thread_name_prefix="aiostream-parquet")
        return _POOL


def run_all(calls: Sequence[Callable[[], _T]]) -> list[_T]:
    """The results of ``calls``, in order, each run on a thread of the pool while the
    calling thread waits (``formats.parquet.Parallel``). The first exception of a call
    (in order) is raised once every call has ended: none goes on reading the buffers of
    a decode that failed."""
    pool = _pool()
    futures = [pool.submit(call) for call in calls]
    wait(futures)
    return [future.result() for future in futures]


@contextmanager
def decoding() -> Iterator[None]:
    """Decodes on this thread within the block may run their parts on the pool."""
    with parallel_parts(run_all):
        yield
