"""The engine's order, share, shuffle buffer and state checks (one copy for every stream)."""

from __future__ import annotations

import random

import pytest

from aiostream_hf._engine import (
    ShuffleBuffer,
    check_state,
    epoch_order,
    rank_share,
    shuffle_buffer_size,
)
from aiostream_hf._exceptions import SourceError


def test_rank_shares_are_disjoint_and_complete() -> None:
    for n in (0, 1, 5, 13, 64):
        items = [f"s{i}" for i in range(n)]
        for world_size in (1, 2, 3, 4):
            shares = [rank_share(items, rank, world_size) for rank in range(world_size)]
            if n >= world_size:
                assert not any(split for _, split in shares)
                flat = [x for share, _ in shares for x in share]
                assert sorted(flat) == sorted(items)  # complete, and disjoint (no repeats)
                assert max(len(s) for s, _ in shares) - min(len(s) for s, _ in shares) <= 1
                assert shares[0][0] == items[0::world_size]  # webdataset's split_by_node
            else:  # fewer than ranks: every rank holds all, and splits their units
                assert all(share == items and split for share, split in shares)


def test_the_epoch_order_is_deterministic() -> None:
    urls = [f"s{i}.tar" for i in range(100)]
    assert epoch_order(urls, seed=0, epoch=0, shuffle=False, what="files") == urls
    first = epoch_order(urls, seed=1, epoch=0, shuffle=True, what="files")
    assert sorted(first) == sorted(urls)
    assert first != urls
    assert epoch_order(urls, seed=1, epoch=0, shuffle=True, what="files") == first
    assert epoch_order(urls, seed=1, epoch=1, shuffle=True, what="files") != first
    assert epoch_order(urls, seed=2, epoch=0, shuffle=True, what="files") != first
    expected = list(urls)
    random.Random("1:0:files").shuffle(expected)  # the order saved states refer to
    assert first == expected


def _shuffled(items: list[int], size: int, seed: int) -> tuple[list[int], int]:
    buffer: ShuffleBuffer[int] = ShuffleBuffer(size, seed)
    out, held = [], 0
    for item in items:
        got = buffer.push(item)
        held = max(held, len(buffer))
        if got is not None:
            out.append(got)
    return out + list(buffer.drain()), held


def test_shuffle_buffer() -> None:
    items = list(range(1000))
    out, held = _shuffled(items, 50, 1)
    assert sorted(out) == items  # each exactly once
    assert out != items
    assert held == 50
    assert _shuffled(items, 50, 1)[0] == out
    assert _shuffled(items, 50, 2)[0] != out
    assert _shuffled(items, 1, 1)[0] == items  # a buffer of one keeps the order
    # bounded: an item comes out at most (size - 1) + its wait later than a full buffer allows
    assert max(i - out.index(i) for i in items) <= 50
    with pytest.raises(SourceError):
        ShuffleBuffer(0)
    with pytest.raises(ValueError, match="None"):
        ShuffleBuffer[object](2).push(None)


def test_a_shuffle_buffer_resumes_exactly_from_its_state_even_mid_drain() -> None:
    items = list(range(300))
    whole, _ = _shuffled(items, 40, 7)
    for cut in (10, 150, 280, 295):  # before, while and after it fills; mid-drain
        buffer: ShuffleBuffer[int] = ShuffleBuffer(40, 7)
        out: list[int] = []
        feed = iter(items)
        for item in feed:
            got = buffer.push(item)
            if got is not None:
                out.append(got)
            if len(out) == cut:
                break
        drained = buffer.drain()
        while len(out) < cut:
            out.append(next(drained))
        held, rng = buffer.state()
        again: ShuffleBuffer[int] = ShuffleBuffer(40, "another seed")
        again.restore(held, [rng[0], list(rng[1]), rng[2]])  # as after a JSON round trip
        rest = [x for x in (again.push(i) for i in feed) if x is not None]
        assert out + rest + list(again.drain()) == whole


def test_shuffle_options_and_state_checks() -> None:
    assert shuffle_buffer_size(True) == 1000
    assert shuffle_buffer_size(None) == shuffle_buffer_size(False) == 0
    assert shuffle_buffer_size(7) == 7
    for bad in (0, -1, 1.5, "yes"):
        with pytest.raises(SourceError, match="shuffle="):
            shuffle_buffer_size(bad)
    state = {"version": 1, "seed": 3, "rank": 0, "epoch": 2}
    check_state(state, version=1, kind=None, same={"seed": 3, "rank": 0})
    for epoch in (None, -1, "2", True):
        with pytest.raises(SourceError, match="'epoch'"):
            check_state({**state, "epoch": epoch}, version=1, kind=None, same={})
    with pytest.raises(SourceError, match="version"):
        check_state(state, version=2, kind=None, same={})
    with pytest.raises(SourceError, match="kind"):
        check_state(state, version=1, kind="lerobot", same={})
    with pytest.raises(SourceError, match="seed=3"):
        check_state(state, version=1, kind=None, same={"seed": 4})
