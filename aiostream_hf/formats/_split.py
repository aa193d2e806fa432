"""Jobs of known cost split between worker threads so that the threads end together.

::

    queues = split(costs, workers)
    # in worker thread w:
    while (job := next_job(queues, w)) is not None:
        ...

Each thread takes its own longest job left first; one that runs out takes another
thread's shortest job left. ``collections.deque`` pops are atomic, so the threads
share the queues without a lock.
"""

from __future__ import annotations

import os
from collections import deque

__all__ = ["next_job", "split", "usable_cpus"]


def split(costs: list[int], workers: int) -> list[deque[int]]:
    """The jobs (by position in ``costs``) each of ``workers`` threads takes, longest
    first, split so that the threads end together: exactly for two threads (the subset of
    costs whose sum is nearest half the total), longest-first to the least loaded for
    more. A thread that runs out takes another's shortest job left (``next_job``).
    """
    order = sorted(range(len(costs)), key=lambda i: -costs[i])
    if workers <= 1:
        return [deque(order)]
    queues: list[list[int]] = [[] for _ in range(workers)]
    total = sum(costs)
    if workers == 2 and total <= 1 << 16:
        reach = [1]  # bit s of reach[k]: some of the first k jobs of `order` cost s in all
        for i in order:
            reach.append(reach[-1] | (reach[-1] << costs[i]))
        target = (reach[-1] & ((2 << (total // 2)) - 1)).bit_length() - 1
        for k in range(len(order) - 1, -1, -1):
            i = order[k]
            if (reach[k] >> target) & 1:
                queues[1].append(i)
            else:  # the sum needs job i
                queues[0].append(i)
                target -= costs[i]
        queues = [sorted(q, key=lambda i: -costs[i]) for q in queues]
    else:
        loads = [0] * workers
        for i in order:
            w = loads.index(min(loads))
            queues[w].append(i)
            loads[w] += costs[i]
    return [deque(q) for q in queues]


def next_job(queues: list[deque[int]], w: int) -> int | None:
    """Thread ``w``'s next job: its own longest left, else another's shortest left;
    None when none is left."""
    try:
        return queues[w].popleft()
    except IndexError:
        pass
    for other in queues:
        try:
            return other.pop()
        except IndexError:
            continue
    return None


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
