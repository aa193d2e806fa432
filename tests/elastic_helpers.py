"""Helpers of the elastic tests (tests/test_elastic.py, tests/test_elastic_sources.py and
the torchrun example's test in tests/test_examples.py): chains of jobs, and the most bytes
a job of a chain may be served, from the job state it starts from.

A Parquet file of ``size`` bytes is cut into ``ceil(size / slice_bytes)`` units, each
holding the row groups whose first byte lies in it (the last holds the rest); the units
of the files (in path order) are put in the one order of ``aiostream_hf._elastic``. A
unit left is read as its file's tail read and its row groups from the one it stopped in;
a unit done, or the row groups before a position, are never read again.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import aiostream_hf as ash
from aiostream_hf import _elastic
from aiostream_hf.formats.parquet import TAIL_READ_SIZE
from aiostream_hf.testing import HubServer, make_repo, make_text_parquet


def spans(path: Path) -> list[tuple[int, int]]:
    """The byte span of each row group of a Parquet file."""
    meta = pq.ParquetFile(path).metadata
    out = []
    for r in range(meta.num_row_groups):
        group = meta.row_group(r)
        starts = [
            min(
                c.data_page_offset,
                c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset,
            )
            for c in (group.column(i) for i in range(group.num_columns))
        ]
        ends = [
            s + group.column(i).total_compressed_size
            for i, s in enumerate(starts)  # noqa: B007
        ]
        out.append((min(starts), max(ends)))
    return out


def covered(ranges: Sequence[tuple[int, int]]) -> int:
    """Bytes covered by ``ranges`` (overlaps counted once)."""
    total = reach = 0
    for start, end in sorted(ranges):
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total


def parquet_bound(
    paths: Sequence[Path], slice_bytes: int, seed: int, shuffle: bool
) -> Callable[[dict[str, Any] | None], int]:
    """bound(job): the most a job starting from ``job`` (None: a fresh epoch) reads, when
    its ranges are fetched exactly (``StreamOptions(coalesce_gap=0)``, or few reads at
    once, as the in-process chains make: ranges coalesced across holes fetch the holes)."""
    paths = sorted(paths)
    sizes = [p.stat().st_size for p in paths]
    groups = [spans(p) for p in paths]
    units = [
        (f, s, -(-sizes[f] // slice_bytes))
        for f in range(len(paths))
        for s in range(-(-sizes[f] // slice_bytes))
    ]

    def bound(job: dict[str, Any] | None) -> int:
        base = (
            _elastic.Base()
            if job is None
            else _elastic.Base.from_state(job["elastic"]["base"], len(units), "job")
        )
        order = _elastic.unit_order(len(units), seed=seed, epoch=0, shuffle=shuffle)
        total = 0
        for g, start in _elastic.remaining(base, len(units)):
            f, s, n = units[order[g]]
            mine = [
                (r, span)
                for r, span in enumerate(groups[f])
                if min(span[0] // slice_bytes, n - 1) == s
            ]
            first = start["unit"] if start else 0
            tail = (max(0, sizes[f] - TAIL_READ_SIZE), sizes[f])
            total += covered([tail, *(span for r, span in mine if r >= first)])
        return total

    return bound


# -- chains of jobs -------------------------------------------------------------------


def ids(item: Any) -> list[Any]:
    if isinstance(item, pa.RecordBatch):
        return item.column("id").to_pylist()
    if isinstance(item, dict) and isinstance(item.get("id"), list):
        return list(item["id"])
    if "index" in item:  # a LeRobot item: its frame's global index
        return [int(item["index"])]
    return [item["id"] if "id" in item else item["__key__"]]


async def take(s: Any, n: int | None) -> list[Any]:
    """Samples of ``s`` until ``n`` ids are taken (None: to the end); a state is then exact."""
    got: list[Any] = []
    if n == 0:
        return got
    async for item in s:
        got += ids(item)
        if n is not None and len(got) >= n:
            break
    return got


async def run_chain(
    make: Callable[[int, int], Any],
    chain: Sequence[tuple[int, Sequence[int | None]]],
    *,
    hub: HubServer | None = None,
    phase_bound: Callable[[dict[str, Any] | None], int] | None = None,
    bounds: Sequence[tuple[HubServer, Callable[[dict[str, Any] | None], int]]] = (),
    on_job: Callable[[list[Any], int], None] | None = None,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Every job of ``chain`` in turn: each consumer loads the job state (JSON round trip),
    takes its samples and saves its state; the states are merged for the next job.
    Returns every id delivered, and the job states. With ``phase_bound``, the bytes each
    job is served are checked against it (what is left of the job state it started from).
    ``bounds``: (server, bound) pairs checked the same way (a mixture's members' servers).
    ``on_job(statistics, delivered)``: each job's consumers' statistics, its sample count."""
    checks = list(bounds)
    if hub is not None and phase_bound is not None:
        checks.append((hub, phase_bound))
    delivered: list[Any] = []
    job: dict[str, Any] | None = None
    jobs: list[dict[str, Any]] = []
    for world, takes in chain:
        for server, _ in checks:
            server.wait_idle()
            server.reset_stats()
        states, statistics, before = [], [], len(delivered)
        for rank in range(world):
            s = make(rank, world)
            if job is not None:
                s.load_state_dict(job)
            async with s:
                delivered += await take(s, takes[rank])
                states.append(roundtrip(s.state_dict()))
                statistics.append(s.statistics())
        for state in leaves(states):
            # A consumer's base holds no buffered samples: its share of them is its own.
            assert not (state.get("elastic") or {}).get("base", {}).get("buffer")
        if on_job is not None:
            on_job(statistics, len(delivered) - before)
        for server, bound in checks:
            served = server.wait_idle()
            assert served.bytes_served <= bound(job), (world, job)
        job = roundtrip(ash.merge_states(states))
        jobs.append(job)
    return delivered, jobs


def leaves(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The streams' states in ``states`` (a mixture's members', at any depth)."""
    out: list[dict[str, Any]] = []
    for state in states:
        out += leaves(state["members"]) if state.get("kind") == "mix" else [state]
    return out


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    """A state as saved to disk and read back: JSON, or pickle for a buffer of TAR
    samples (bytes, which JSON has not)."""
    try:
        return dict(json.loads(json.dumps(state)))
    except TypeError:
        return dict(pickle.loads(pickle.dumps(state)))


def exactly_once(delivered: list[Any], expected: set[Any]) -> None:
    assert len(delivered) == len(set(delivered)), "a sample was delivered twice"
    assert set(delivered) == expected, "a sample was lost"


async def consumers(make: Callable[[int, int], Any], world: int) -> list[list[Any]]:
    out = []
    for rank in range(world):
        async with make(rank, world) as s:
            out.append(await take(s, None))
    return out


def is_subsequence(part: list[Any], whole: list[Any]) -> bool:
    mine = set(part)
    return [x for x in whole if x in mine] == part


def make_parquet_repo(root: Path, name: str = "org/elastic") -> Path:
    """Three Parquet files of 330 rows (ids 0-329; 200 rows in row groups of 20, then
    60 and 70 in row groups of 25), texts of 2-4 kB; the files' folder."""
    folder = make_repo(root, name, {})
    start = 0
    for i, (rows, group) in enumerate([(200, 20), (60, 25), (70, 25)]):
        make_text_parquet(
            folder / "data" / f"train-{i}.parquet",
            rows=rows,
            row_group_size=group,
            start_id=start,
            seed=i,
            min_text=2000,
            max_text=4000,
        )
        start += rows
    return folder / "data"
