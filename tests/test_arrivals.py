"""Bytes arriving on the event loop for worker threads (``aiostream_hf._arrivals``)."""

from __future__ import annotations

import threading

import pytest

from aiostream_hf._arrivals import Arrivals, Unfinished, merge_spans

DATA = bytes(range(256)) * 64  # 16 KiB


def test_merge_spans_joins_ranges_closer_than_the_gap() -> None:
    ranges = [(0, 10), (10, 20), (25, 30), (100, 110)]
    assert merge_spans(ranges, 1) == [(0, 20), (25, 30), (100, 110)]
    assert merge_spans(ranges, 6) == [(0, 30), (100, 110)]
    assert merge_spans([], 6) == []


def test_take_returns_bytes_across_blocks_and_spans() -> None:
    arrivals = Arrivals([(0, 8192), (10000, 16384)])
    for start in range(0, 8192, 1000):  # blocks of uneven sizes
        arrivals.add(0, DATA[start : min(8192, start + 1000)])
    arrivals.add(1, DATA[10000:16384])
    assert bytes(arrivals.take(0, 8192)) == DATA[:8192]
    assert bytes(arrivals.take(1500, 4321)) == DATA[1500:4321]  # across three blocks
    assert bytes(arrivals.take(2000, 3000)) == DATA[2000:3000]  # exactly one block
    assert bytes(arrivals.take(12000, 12001)) == DATA[12000:12001]
    assert arrivals.received(0) == 8192
    assert arrivals.received() == 8192 + 6384
    with pytest.raises(AssertionError, match="in no span"):
        arrivals.take(9000, 9001)


def test_a_waiting_thread_gets_its_bytes_or_gives_up() -> None:
    arrivals = Arrivals([(0, 4096), (8192, 12288)])
    got: dict[str, object] = {}

    def wait(name: str, start: int, end: int) -> None:
        try:
            got[name] = bytes(arrivals.take(start, end))
        except Unfinished as exc:
            got[name] = exc

    threads = [
        threading.Thread(target=wait, args=("first", 1000, 3000)),
        threading.Thread(target=wait, args=("second", 9000, 9100)),
    ]
    for t in threads:
        t.start()
    arrivals.add(0, DATA[:2000])
    arrivals.add(0, DATA[2000:4096])  # the first waiter's bytes are in
    threads[0].join(10)
    assert got["first"] == DATA[1000:3000]
    assert threads[1].is_alive()  # still waiting: span 1 has nothing yet
    arrivals.close(1)  # its read ended without the bytes
    threads[1].join(10)
    assert isinstance(got["second"], Unfinished)
    assert "9000-9099" in str(got["second"])
