"""mix(): weights, stops, determinism, exact resume, sync and async, formats, torch.

The members are local files made by aiostream_hf.testing, with one tiny column, so that
tens of thousands of samples take a fraction of a second. Member i's ids are
``i * 100_000 + k`` for its k-th row: an id says which member and which row.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import aiostream_hf as ash
from aiostream_hf.testing import (
    make_lerobot_dataset,
    make_text_parquet,
    make_webdataset_shards,
)

SIZES = (6000, 4000, 2000)  # the members of most tests
WEIGHTS = (0.5, 0.3, 0.2)
BIG = 20_000  # rows of each member of the weights test
GROUP = 500  # rows per row group
STOPS = ("first_exhausted", "all_exhausted")
SPAN = 100_000  # member i's ids start at i * SPAN


def _write(folder: Path, name: str, rows: int, member: int, group: int = GROUP) -> Path:
    path = folder / f"{name}-{member}.parquet"
    make_text_parquet(
        path,
        rows=rows,
        row_group_size=group,
        seed=member,
        min_text=1,
        max_text=2,
        start_id=member * SPAN,
    )
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("small")
    return [_write(folder, "small", n, i) for i, n in enumerate(SIZES)]


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("big")
    return [_write(folder, "big", BIG, i, group=5000) for i in range(3)]


def _members(paths: list[Path], **kw: Any) -> list[ash.Stream]:
    return [ash.stream(str(p), columns=["id"], **kw) for p in paths]


def _ids(samples: Any) -> list[int]:
    return [int(s["id"]) for s in samples]


def _take(m: ash.Mix, k: int) -> tuple[list[int], dict[str, Any]]:
    """The first k ids of a sync iteration, and the state after them, through JSON."""
    it = iter(m)
    head = [int(next(it)["id"]) for _ in range(k)]
    state = json.loads(json.dumps(m.state_dict()))
    it.close()
    return head, state


async def _ids_async(m: ash.Mix, limit: int | None = None) -> list[int]:
    out: list[int] = []
    async with m:
        async for sample in m:
            out.append(int(sample["id"]))
            if len(out) == limit:
                break
    return out


def _reference_first_exhausted(
    sizes: tuple[int, ...], weights: tuple[float, ...] | None, seed: int
) -> list[int]:
    """The ids a first_exhausted mixture gives, computed from the draws alone: numpy's
    default_rng(seed), 1000 draws at a time as datasets makes them; the mixture ends
    right after the last row of the first member to end."""
    rng = np.random.default_rng(seed)
    n = len(sizes)
    taken = [0] * n
    out: list[int] = []
    while True:
        if weights is None:
            batch = rng.integers(0, n, size=1000)
        else:
            p = np.array(weights) / sum(weights)
            batch = rng.choice(n, size=1000, p=p)
        for i in batch.tolist():
            if taken[i] == sizes[i]:  # an empty member, drawn: nothing more
                return out
            out.append(i * SPAN + taken[i])
            taken[i] += 1
            if taken[i] == sizes[i]:
                return out


# -- what is drawn ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_weights_land_within_4_sigma_over_30000_samples(big: list[Path]) -> None:
    draws = 30_000
    m = ash.mix(_members(big), list(WEIGHTS), seed=7, stop="all_exhausted")
    ids = await _ids_async(m, limit=draws)
    assert len(ids) == draws
    counts = Counter(i // SPAN for i in ids)
    for member, p in enumerate(WEIGHTS):
        sigma = math.sqrt(draws * p * (1 - p))
        assert abs(counts[member] - draws * p) <= 4 * sigma, (member, counts)
    # No member ran out within the 30,000, so every draw counted (and each member's
    # rows came in their order).
    assert max(counts.values()) < BIG
    for member in range(3):
        mine = [i for i in ids if i // SPAN == member]
        assert mine == [member * SPAN + k for k in range(len(mine))]
    assert m.statistics().drawn == tuple(counts[i] for i in range(3))


@pytest.mark.parametrize("weights", [WEIGHTS, None, (0.1, 0.1, 0.8), (0.5, 0.0, 0.5)])
def test_first_exhausted_stops_right_after_the_first_members_last_sample(
    small: list[Path], weights: tuple[float, ...] | None
) -> None:
    m = ash.mix(_members(small), weights, seed=3)
    ids = _ids(m)
    assert ids == _reference_first_exhausted(SIZES, weights, seed=3)
    ended = ids[-1] // SPAN
    assert ids[-1] % SPAN == SIZES[ended] - 1  # its last row is the last sample
    stats = m.statistics()
    assert stats.exhausted == tuple(i == ended for i in range(3))
    assert stats.samples == len(ids) == sum(stats.drawn)


# datasets' interleave_datasets over Parquet files, in a process of its own (offline: it
# makes no request), printing the ids of each (seed, stopping_strategy) as JSON.
_DATASETS_ORACLE = """
import json, sys
import datasets

# datasets sleeps 5 s after each interleaved iteration (a guard for pyarrow's threads at
# interpreter exit, apache/arrow#45214); this process iterates to the end and exits once.
datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN = 0
paths, weights, runs = json.loads(sys.argv[1])
out = []
for seed, stop in runs:
    members = [
        datasets.load_dataset("parquet", data_files=p, split="train", streaming=True)
        .select_columns(["id"])
        for p in paths
    ]
    mixed = datasets.interleave_datasets(
        members, probabilities=weights, seed=seed, stopping_strategy=stop
    )
    out.append([int(row["id"]) for row in mixed])
print(json.dumps(out))
"""


def test_first_exhausted_and_the_draws_are_datasets_own(tmp_path: Path) -> None:
    """datasets.interleave_datasets(probabilities=...) over the same Parquet files, as the
    oracle: the same sequence for first_exhausted; for all_exhausted, datasets'
    all_exhausted_without_replacement gives the same samples up to the first member's
    end, then its own order. (datasets takes ~1 ms a row here: small members.)"""
    pytest.importorskip("datasets")
    sizes = (150, 100, 50)
    paths = [_write(tmp_path, "oracle", n, i, group=32) for i, n in enumerate(sizes)]
    runs = [
        (0, "first_exhausted"),
        (11, "first_exhausted"),
        (11, "all_exhausted_without_replacement"),
    ]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _DATASETS_ORACLE,
            json.dumps([[str(p) for p in paths], WEIGHTS, runs]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout)
    for (seed, _), reference in zip(runs[:2], theirs, strict=False):
        ours = _ids(ash.mix(_members(paths), WEIGHTS, seed=seed))
        assert ours == reference
        assert ours == _reference_first_exhausted(sizes, WEIGHTS, seed)
    ours = _ids(ash.mix(_members(paths), WEIGHTS, seed=11, stop="all_exhausted"))
    first_end = len(theirs[1])
    assert ours[:first_end] == theirs[2][:first_end]
    assert ours[first_end:] != theirs[2][first_end:]
    assert sorted(ours) == sorted(theirs[2])


@pytest.mark.anyio
async def test_all_exhausted_delivers_every_sample_of_every_member_once(
    small: list[Path],
) -> None:
    m = ash.mix(_members(small), list(WEIGHTS), seed=5, stop="all_exhausted")
    ids = await _ids_async(m)
    every = [i * SPAN + k for i, n in enumerate(SIZES) for k in range(n)]
    assert len(ids) == len(every)
    assert sorted(ids) == every
    stats = m.statistics()
    assert stats.drawn == SIZES
    assert stats.exhausted == (True, True, True)
    assert [s.samples for s in stats.members] == list(SIZES)
    # Past the first member's end, the others go on with renormalized weights: the
    # member that ended first (the smallest share of its weight) ends before the rest.
    first_out = next(i for i, x in enumerate(ids) if x == 2 * SPAN + SIZES[2] - 1)
    assert first_out < len(ids) - 1


def test_an_empty_member(tmp_path: Path, small: list[Path]) -> None:
    empty = _write(tmp_path, "empty", 0, 3)
    paths = [*small, empty]
    weights = (*WEIGHTS, 0.25)
    # first_exhausted: the mixture ends when the empty member is first drawn (as datasets)
    ids = _ids(ash.mix(_members(paths), weights, seed=2))
    assert ids == _reference_first_exhausted((*SIZES, 0), weights, seed=2)
    assert 0 < len(ids) < 20
    # all_exhausted: it leaves the draw, the others are delivered whole
    ids = _ids(ash.mix(_members(paths), weights, seed=2, stop="all_exhausted"))
    assert sorted(ids) == [i * SPAN + k for i, n in enumerate(SIZES) for k in range(n)]


def test_same_seed_same_order_other_epoch_other_order(small: list[Path]) -> None:
    def run(seed: int = 0, epoch: int | None = None, **kw: Any) -> list[int]:
        m = ash.mix(_members(small, **kw), list(WEIGHTS), seed=seed, stop="all_exhausted")
        if epoch is not None:
            m.set_epoch(epoch)
        return _ids(m)

    base = run()
    assert run() == base
    assert run(epoch=0) == base
    assert run(seed=1) != base
    epoch1 = run(epoch=1)
    assert epoch1 != base
    assert run(epoch=1) == epoch1
    assert sorted(epoch1) == sorted(base)
    # set_epoch reaches the members: shuffled members change order with the epoch too
    shuffled = run(epoch=1, shuffle=50, seed=4)
    assert shuffled == run(epoch=1, shuffle=50, seed=4)
    member0 = [i for i in shuffled if i < SPAN]
    other = [i for i in run(epoch=2, shuffle=50, seed=4) if i < SPAN]
    assert sorted(member0) == sorted(other)
    assert member0 != other


# -- resume ------------------------------------------------------------------------------------


def _read_ahead_points(make: Callable[[], ash.Mix], limit: int) -> list[int]:
    """The sample counts after which the mixture holds a sample read ahead of a member
    (first_exhausted, at the end of a member's row group)."""
    m = make()
    points = []
    for k, _ in enumerate(m, 1):
        if any(held is not None for held in m._pending):
            points.append(k)
            if len(points) == limit:
                break
    return points


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("shuffle", [None, 64], ids=["ordered", "shuffled"])
def test_resume_after_k_samples_through_json_continues_exactly(
    small: list[Path], stop: str, shuffle: int | None
) -> None:
    def make() -> ash.Mix:
        return ash.mix(_members(small, shuffle=shuffle), list(WEIGHTS), seed=9, stop=stop)

    straight = _ids(make())
    n = len(straight)
    ks = {0, 1, 137, min(10_000, n - 1), n}
    if stop == "first_exhausted" and shuffle is None:
        ahead = _read_ahead_points(make, 2)
        assert ahead, "no state was taken while a sample was read ahead"
        ks |= set(ahead)
    for k in sorted(ks):
        head, state = _take(make(), k)
        assert head == straight[:k]
        resumed = make()
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state  # reported as loaded until taken up
        assert _ids(resumed) == straight[k:], k
        assert resumed.statistics().samples == n


@pytest.mark.anyio
@pytest.mark.parametrize("stop", STOPS)
async def test_resume_in_async_iteration(small: list[Path], stop: str) -> None:
    def make() -> ash.Mix:
        return ash.mix(_members(small), list(WEIGHTS), seed=1, stop=stop)

    straight = await _ids_async(make())
    m = make()
    head = await _ids_async(m, limit=2500)
    state = json.loads(json.dumps(m.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    assert head + await _ids_async(resumed) == straight


@pytest.mark.anyio
@pytest.mark.parametrize("stop", STOPS)
async def test_sync_iteration_equals_async(small: list[Path], stop: str) -> None:
    sync = _ids(ash.mix(_members(small), list(WEIGHTS), seed=4, stop=stop))
    assert await _ids_async(ash.mix(_members(small), list(WEIGHTS), seed=4, stop=stop)) == sync


@pytest.mark.anyio
@pytest.mark.parametrize("stop", STOPS)
async def test_a_cancelled_draw_loses_nothing(small: list[Path], stop: str) -> None:
    """Every sample is first asked for in a cancelled scope: where that waits (a member's
    next unit, a read ahead), it is cancelled and asked for again; the samples and the
    state are those of a straight run."""

    def make() -> ash.Mix:
        return ash.mix(_members(small[1:]), [0.6, 0.4], seed=8, stop=stop)

    straight = _ids(make())
    got: list[int] = []
    cancelled = 0
    m = make()
    async with m:
        it = aiter(m)
        while True:
            with anyio.CancelScope() as scope:
                scope.cancel()
                try:
                    got.append(int((await anext(it))["id"]))
                    continue
                except StopAsyncIteration:
                    break
            cancelled += scope.cancelled_caught
            try:
                got.append(int((await anext(it))["id"]))
            except StopAsyncIteration:
                break
    assert cancelled >= len(SIZES[1:]) * 2  # each member's first unit, and later ones
    assert got == straight


def test_leaving_a_sync_loop_stops_the_members(small: list[Path]) -> None:
    m = ash.mix(_members(small), list(WEIGHTS), seed=3)
    for _ in m:
        break
    assert m.statistics().samples == 1
    assert all(not s._sync_iterators for s in m._members)  # their bridge producers stopped
    state = json.loads(json.dumps(m.state_dict()))
    resumed = ash.mix(_members(small), list(WEIGHTS), seed=3)
    resumed.load_state_dict(state)
    assert _ids(resumed) == _ids(ash.mix(_members(small), list(WEIGHTS), seed=3))[1:]


@pytest.mark.anyio
async def test_a_member_that_fails_ends_the_iteration_with_its_error(
    small: list[Path], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not a parquet file, " * 100)

    def make() -> ash.Mix:
        return ash.mix([*_members(small[:1]), ash.stream(str(bad))], stop="all_exhausted")

    with pytest.raises(ash.DecodeError, match="bad.parquet"):
        _ids(make())
    async with make() as m:
        it = aiter(m)
        with pytest.raises(ash.DecodeError, match="bad.parquet"):
            while True:
                await anext(it)
        with pytest.raises(StopAsyncIteration):  # not drawn on as if that member had ended
            await anext(it)


def test_a_mixture_within_a_mixture(small: list[Path]) -> None:
    def make() -> ash.Mix:
        a, b, c = _members(small)
        inner = ash.mix([a, b], [0.6, 0.4], seed=1, stop="all_exhausted")
        return ash.mix([inner, c], [0.8, 0.2], seed=2, stop="all_exhausted")

    straight = _ids(make())
    assert sorted(straight) == [i * SPAN + k for i, n in enumerate(SIZES) for k in range(n)]
    head, state = _take(make(), 3001)
    resumed = make()
    resumed.load_state_dict(state)
    assert head + _ids(resumed) == straight


@pytest.mark.anyio
async def test_a_stream_in_two_mixtures_is_refused(small: list[Path]) -> None:
    # One stream read by two mixtures had its position moved by both: samples came twice.
    a, b, c = _members(small)
    inner = ash.mix([a, b], seed=1, stop="all_exhausted")
    with pytest.raises(ash.SourceError, match=r"streams\[1\] is also inside streams\[0\]"):
        ash.mix([inner, a])
    with pytest.raises(ash.SourceError, match=r"streams\[0\] is already a member of another"):
        ash.mix([b, c])
    with pytest.raises(ash.SourceError, match=r"streams\[0\] is already a member of another"):
        ash.mix([ash.mix([a, c]), c])
    ids = await _ids_async(ash.mix([inner, c], seed=2, stop="all_exhausted"))
    assert Counter(ids) == Counter(i * SPAN + k for i, n in enumerate(SIZES) for k in range(n))


@pytest.mark.anyio
async def test_a_state_loads_only_into_the_same_mixture(small: list[Path]) -> None:
    def make(order: tuple[int, int] = (0, 1)) -> ash.Mix:
        members = _members(small)
        return ash.mix([members[i] for i in order], seed=4, stop="all_exhausted")

    first = make()
    async with first:
        async for _ in first:
            if first.statistics().samples == 500:
                break
        state = json.loads(json.dumps(first.state_dict()))
    # Members in another order: their states would load into each other's streams.
    with pytest.raises(ash.SourceError, match=r"state\['streams'\]\[0\].*member 1"):
        make((1, 0)).load_state_dict(state)
    # Flags the members' states deny: the samples left would be lost.
    with pytest.raises(ash.SourceError, match=r"state\['ended'\] is True"):
        make().load_state_dict({**state, "ended": True})
    with pytest.raises(ash.SourceError, match=r"state\['exhausted'\]\[0\] is True but"):
        make().load_state_dict({**state, "exhausted": [True, False]})
    # A state of version 1 names no members: it might be of another order.
    older = {k: v for k, v in state.items() if k != "streams"}
    with pytest.raises(ash.SourceError, match="state version 1 is not 2"):
        make().load_state_dict({**older, "version": 1})
    again = make()
    again.load_state_dict(state)
    rest = await _ids_async(again)
    assert len(rest) == SIZES[0] + SIZES[1] - 500


@pytest.mark.anyio
async def test_a_second_loop_while_one_runs_is_refused(small: list[Path]) -> None:
    # A second `async for` used to end the first silently.
    m = ash.mix(_members(small)[:2], seed=3, stop="all_exhausted")
    head: list[int] = []
    async with m:
        async for sample in m:
            head.append(int(sample["id"]))
            if len(head) == 10:
                with pytest.raises(ash.UsageError, match="already being iterated.*one loop"):
                    async for _ in m:
                        pass
                with pytest.raises(ash.UsageError, match="already being iterated"):
                    iter(m)
                with pytest.raises(ash.UsageError, match="already being iterated"):
                    aiter(m._members[0])
            if len(head) == 20:
                break
        # The first loop was left: a new one may start (from the epoch's start).
        again = [int(s["id"]) async for s in m]
    assert again[:20] == head
    assert sorted(again) == [i * SPAN + k for i in range(2) for k in range(SIZES[i])]
    sync = ash.mix(_members(small)[:2])
    outer = iter(sync)
    next(outer)
    with pytest.raises(ash.UsageError, match="already being iterated"):
        iter(sync)
    outer.close()
    assert next(iter(sync))


# -- formats -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("formats")
    parquet = _write(root, "rows", 300, 0, group=50)
    shards = make_webdataset_shards(
        root / "shards", shards=3, samples_per_shard=40, width=8, height=8
    )
    robot = make_lerobot_dataset(
        root / "robot", episodes=(12, 9), width=16, height=16, codec="h264", cameras=("cam",)
    )
    return {"parquet": parquet, "shards": shards, "robot": robot}


def _key(sample: dict[str, Any]) -> str:
    if "__key__" in sample:
        return f"tar:{sample['__key__']}"
    if "id" in sample:
        return f"parquet:{sample['id']}"
    return f"lerobot:{int(sample['index'])}"


def test_members_of_different_formats(formats: dict[str, Any]) -> None:
    def members() -> list[Any]:
        return [
            ash.stream(str(formats["parquet"]), columns=["id"]),
            ash.stream([str(p) for p in formats["shards"]]),
            ash.lerobot.stream(formats["robot"].path),
        ]

    def make(stop: str = "all_exhausted") -> ash.Mix:
        return ash.mix(members(), [0.5, 0.3, 0.2], seed=6, stop=stop)

    alone = [[_key(s) for s in member] for member in members()]
    straight = [_key(s) for s in make()]
    assert len(straight) == sum(len(keys) for keys in alone)
    for keys in alone:  # every sample of every member, once and in the member's order
        kind = keys[0].split(":")[0]
        assert [k for k in straight if k.startswith(kind + ":")] == keys
    m = make()
    it = iter(m)
    head = [_key(next(it)) for _ in range(150)]
    state = json.loads(json.dumps(m.state_dict()))
    it.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [_key(s) for s in resumed] == straight
    first = [_key(s) for s in make("first_exhausted")]
    assert first == straight[: len(first)]  # the same draws until a member ends
    assert first[-1] in {keys[-1] for keys in alone}


# -- bad input ---------------------------------------------------------------------------------


def _bad_calls(paths: list[Path]) -> list[tuple[Callable[[], Any], str]]:
    def three() -> list[ash.Stream]:
        return _members(paths)

    s = three()[0]
    return [
        (lambda: ash.mix(s), "streams is one stream"),
        (lambda: ash.mix([]), "streams is empty"),
        (lambda: ash.mix("abc"), "streams is a str"),
        (lambda: ash.mix([s, "hf://datasets/org/name"]), r"streams\[1\] is a str, not a stream"),
        (lambda: ash.mix([s, s]), r"streams\[1\] is streams\[0\]"),
        (lambda: ash.mix(three(), [1, 2]), "weights has 2 values for 3 streams"),
        (lambda: ash.mix(three(), [1, -1, 1]), r"weights\[1\] is -1.0: weights must be >= 0"),
        (lambda: ash.mix(three(), [1, math.nan, 1]), r"weights\[1\] is nan: give finite"),
        (lambda: ash.mix(three(), [1, math.inf, 1]), r"weights\[1\] is inf"),
        (lambda: ash.mix(three(), [1, True, 1]), r"weights\[1\] is True, not a number"),
        (lambda: ash.mix(three(), ["1", 1, 1]), r"weights\[0\] is '1', not a number"),
        (lambda: ash.mix(three(), [0, 0, 0]), "are all 0"),
        (lambda: ash.mix(three(), [1e308, 1e308, 1]), "sum to inf"),
        (lambda: ash.mix(three(), 0.5), "give a list of numbers"),
        (
            lambda: ash.mix(three(), [1, 0, 1], stop="all_exhausted"),
            r"weights\[1\] is 0 with stop='all_exhausted'.*streams\[1\] would never be drawn",
        ),
        (lambda: ash.mix(three(), stop="longest"), "stop='longest': use 'first_exhausted'"),
        (
            lambda: ash.mix(three(), stop="all_exhausted_without_replacement"),
            "exactly once",
        ),
        (lambda: ash.mix(three(), seed=-1), "seed=-1"),
        (
            lambda: ash.mix([s, ash.stream(str(paths[1]), batch_size=4)]),
            r"streams\[1\] yields batches \(batch_size=4\).*DataLoader's batch_size",
        ),
        (
            lambda: ash.mix([s, ash.stream(str(paths[1]), output="arrow")]),
            r"streams\[1\] yields Arrow record batches",
        ),
    ]


def test_bad_arguments_are_named(small: list[Path]) -> None:
    for call, message in _bad_calls(small):
        with pytest.raises(ash.SourceError, match=message):
            call()


@pytest.mark.anyio
async def test_a_bare_async_for_and_a_closed_mixture(small: list[Path]) -> None:
    m = ash.mix(_members(small))
    with pytest.raises(ash.UsageError, match="async with"):
        async for _ in m:
            pass
    async with m:
        with pytest.raises(ash.UsageError, match="already open"):
            await m.__aenter__()
    with pytest.raises(ash.ClosedResourceError, match="mix"):
        async with m:
            pass
    with pytest.raises(ash.ClosedResourceError):
        iter(m)


def _tamper(state: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    changed = json.loads(json.dumps(state))
    target = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return changed


TAMPERED = [
    (("version",), 1, "state version 1"),
    (("kind",), None, "not a mixture"),
    (("seed",), 10, "seed=10"),
    (("stop",), "all_exhausted", "stop='all_exhausted'"),
    (("weights",), [1, 1, 1], "weights="),
    (("consumer",), 3, "consumer=3"),
    (("epoch",), -1, r"state\['epoch'\]"),
    (("offset",), 1001, r"state\['offset'\] is 1001"),
    (("offset",), "7", r"state\['offset'\]"),
    (("samples",), None, r"state\['samples'\]"),
    (("exhausted",), [False], r"state\['exhausted'\]"),
    (("exhausted",), [0, 0, 0], r"state\['exhausted'\]\[0\]"),
    (("exhausted",), [True, False, False], r"state\['ended'\] does not"),
    (("drawn",), [1, -1, 0], r"state\['drawn'\]\[1\]"),
    (("ended",), "no", r"state\['ended'\]"),
    (("last",), 3, r"state\['last'\] is 3"),
    (("last",), True, r"state\['last'\]"),
    (("rng",), "seed", r"state\['rng'\]"),
    (("rng", "state", "state"), "1", r"state\['rng'\]"),
    (("rng", "bit_generator"), "MT19937", r"state\['rng'\]"),
    (("members",), {}, r"state\['members'\]"),
    (("members",), [None, None], r"state\['members'\] is \[None, None\], not a list of 3"),
    (("members", 1), [], r"state\['members'\]\[1\] is a list"),
    (("members", 2, "cursor", "file"), "x", r"state\['cursor'\]\['file'\]"),
    (("members", 2, "files"), None, r"state\['files'\] is None but state\['cursor'\]"),
    (("ended",), True, r"state\['ended'\] is True"),
    (("streams",), None, r"state\['streams'\]"),
    (("streams", 0), "0123456789abcdef", r"state\['streams'\]\[0\]"),
]


@pytest.mark.parametrize(("path", "value", "message"), TAMPERED)
def test_a_tampered_state_is_refused_naming_the_field(
    small: list[Path], path: tuple[Any, ...], value: Any, message: str
) -> None:
    def make() -> ash.Mix:
        return ash.mix(_members(small), list(WEIGHTS), seed=9)

    _, state = _take(make(), 700)
    m = make()
    before = m.state_dict()
    with pytest.raises(ash.SourceError, match=message):
        m.load_state_dict(_tamper(state, path, value))
    assert m.state_dict() == before  # nothing of it was loaded, into any member


def test_a_state_that_is_not_a_dict(small: list[Path]) -> None:
    with pytest.raises(ash.SourceError, match="state is a list"):
        ash.mix(_members(small)).load_state_dict([])


# -- torch -------------------------------------------------------------------------------------


def _mix_dataset(paths: list[list[Path]], stop: str, **kw: Any) -> Any:
    from aiostream_hf.torch import MixDataset, StreamDataset

    members = [StreamDataset([str(p) for p in files], columns=["id"]) for files in paths]
    return MixDataset(members, [0.5, 0.3, 0.2], seed=2, stop=stop, **kw)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> list[list[Path]]:
    """Three members: of 2 files (one each per worker), 1 file (row groups split between
    the workers) and 3 files."""
    folder = tmp_path_factory.mktemp("sharded")
    members: list[list[Path]] = []
    for member, (files, rows) in enumerate([(2, 400), (1, 300), (3, 100)]):
        paths = []
        for f in range(files):
            path = folder / f"m{member}-{f}.parquet"
            make_text_parquet(
                path,
                rows=rows,
                row_group_size=50,
                seed=f,
                min_text=1,
                max_text=2,
                start_id=member * SPAN + f * rows,
            )
            paths.append(path)
        members.append(paths)
    return members


def _every(sharded: list[list[Path]]) -> list[int]:
    sizes = [(2, 400), (1, 300), (3, 100)]
    return sorted(
        i * SPAN + k for i, (files, rows) in enumerate(sizes) for k in range(files * rows)
    )


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_dataloader_workers_deliver_every_sample_once(sharded: list[list[Path]]) -> None:
    from torch.utils.data import DataLoader

    ds = _mix_dataset(sharded, "all_exhausted")
    ids = [int(i) for batch in DataLoader(ds, batch_size=16, num_workers=2) for i in batch["id"]]
    assert sorted(ids) == _every(sharded)
    again = [int(i) for batch in DataLoader(ds, batch_size=16, num_workers=2) for i in batch["id"]]
    assert again == ids  # deterministic: each worker's draws come from (seed, epoch, worker)


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_stateful_dataloader_resumes_a_mixture(sharded: list[list[Path]]) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    got: list[int] = []
    state = None
    for stop in (5, 0, None):  # k batches; resume, one batch; resume, the rest
        loader = StatefulDataLoader(
            _mix_dataset(sharded, "all_exhausted"), batch_size=8, num_workers=2
        )
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))
        for i, batch in enumerate(loader):
            got += [int(x) for x in batch["id"]]
            if i == stop:
                break
        state = loader.state_dict()
        del loader
    assert len(got) == len(_every(sharded))
    assert sorted(got) == _every(sharded)


@pytest.mark.torch
def test_mix_dataset_checks_its_arguments_in_the_parent(sharded: list[list[Path]]) -> None:
    from aiostream_hf.torch import MixDataset, StreamDataset

    with pytest.raises(ash.SourceError, match=r"weights has 2 values for 3 datasets"):
        MixDataset([StreamDataset(str(p[0]), columns=["id"]) for p in sharded], [1, 2])
    with pytest.raises(ash.SourceError, match=r"datasets\[0\] is a str"):
        MixDataset(["hf://datasets/org/name"])
    with pytest.raises(ash.SourceError, match=r"datasets\[0\] yields batches"):
        MixDataset([StreamDataset(str(sharded[0][0]), batch_size=4)])
