"""Splitting jobs of known cost between worker threads (``formats._split``): what the
video reader's decode threads use to end together."""

from __future__ import annotations

import pytest

from aiostream_hf.formats import _split


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_jobs_are_split_between_threads_to_end_together(workers: int) -> None:
    """Every job goes to one thread, each thread's longest first; with two threads the
    split is the best there is (here: a perfect one), where longest-first-to-the-least-
    loaded would leave one thread 43 behind (the costs of a real frames_at call)."""
    costs = [147, 133, 106, 100, 80, 13, 7]
    queues = _split.split(costs, workers)
    assert len(queues) == workers
    assert sorted(i for q in queues for i in q) == list(range(len(costs)))
    for q in queues:
        assert [costs[i] for i in q] == sorted((costs[i] for i in q), reverse=True)
    loads = sorted(sum(costs[i] for i in q) for q in queues)
    if workers == 2:
        assert loads == [293, 293]
    taken = []
    while (i := _split.next_job(queues, 0)) is not None:  # thread 0 alone takes them all
        taken.append(i)
    assert sorted(taken) == list(range(len(costs)))
