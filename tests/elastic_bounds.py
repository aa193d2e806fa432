"""The most bytes a job of an elastic chain may be served, from the job state it starts
from (tests/test_elastic.py, and the torchrun example's test in tests/test_examples.py).

A Parquet file of ``size`` bytes is cut into ``ceil(size / slice_bytes)`` units, each
holding the row groups whose first byte lies in it (the last holds the rest); the units
of the files (in path order) are put in the one order of ``aiostream_hf._elastic``. A
unit left is read as its file's tail read and its row groups from the one it stopped in;
a unit done, or the row groups before a position, are never read again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from aiostream_hf import _elastic
from aiostream_hf.formats.parquet import TAIL_READ_SIZE


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
    """bound(job): the most a job starting from ``job`` (None: a fresh epoch) reads."""
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
