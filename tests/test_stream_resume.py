"""Exact resume: state_dict after k samples, then a new stream continues with sample k+1."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import aiostream_hf as ash
from aiostream_hf.formats import parquet
from aiostream_hf.formats.parquet import TAIL_READ_SIZE
from aiostream_hf.testing import HubServer, make_repo, make_text_parquet

pytestmark = pytest.mark.anyio

MODES: dict[str, dict[str, Any]] = {
    "rows": {},
    "rows-shuffled": {"shuffle": 37, "seed": 5},
    "batches": {"batch_size": 16},
    "arrow": {"output": "arrow"},
    "arrow-batches": {"output": "arrow", "batch_size": 13},
    "rows-filtered": {"filter": pc.bit_wise_and(pc.field("id"), 3) == 0},
}


def _key(item: Any) -> Any:
    if isinstance(item, pa.RecordBatch):
        return item.column("id").to_pylist()
    if isinstance(item, dict) and isinstance(item.get("id"), list):
        return item["id"]
    return item["id"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "hub"
    folder = make_repo(root, "org/resume", {})
    for i in range(4):
        make_text_parquet(
            folder / f"train-{i}.parquet",
            rows=60 + 10 * i,
            row_group_size=25,
            start_id=i * 100,
            seed=i,
            # rows of ~3 KB: each file is larger than the tail read that brings its
            # footer, so bytes show where a resume starts (test_resume_fetches...)
            min_text=2000,
            max_text=4000,
        )
    return root


async def _take(s: ash.Stream, k: int | None) -> list[Any]:
    out = []
    async for item in s:
        out.append(_key(item))
        if k is not None and len(out) == k:
            break
    return out


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("k", [1, 7, 30, 290])  # 290: inside the final buffer drain
async def test_resume_continues_with_the_next_sample(
    repo: Path, tmp_path: Path, mode: str, k: int
) -> None:
    opts = ash.StreamOptions(cache_dir=tmp_path / "cache")
    with HubServer(repo) as hub:

        def make() -> ash.Stream:
            return ash.stream(
                "hf://datasets/org/resume", endpoint=hub.endpoint, options=opts, **MODES[mode]
            )

        async with make() as full_stream:
            full = await _take(full_stream, None)
        async with make() as first:
            head = await _take(first, k)
            state = json.loads(json.dumps(first.state_dict()))  # state survives JSON
        async with make() as second:
            second.load_state_dict(state)
            tail = await _take(second, None)
            resumed_units = second.statistics().units
    assert head + tail == full
    # The resumed stream re-reads at most the unit it stopped in (plus any units held in
    # the shuffle buffer, which are in the state, not re-read).
    with HubServer(repo) as hub2:
        opts2 = ash.StreamOptions(cache_dir=tmp_path / "cache2")
        async with ash.stream(
            "hf://datasets/org/resume", endpoint=hub2.endpoint, options=opts2, **MODES[mode]
        ) as fresh:
            await _take(fresh, k)
            units_before = fresh.statistics().units
    # files of 60, 70, 80, 90 rows in row groups of 25: 3 + 3 + 4 + 4 = 14 units
    assert resumed_units <= 14 - units_before + 1


@pytest.mark.parametrize("k", [1, 2, 5, 9])
async def test_arrow_resumes_between_the_batches_of_a_row_group(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, k: int
) -> None:
    # Row groups of 25 rows decoded in batches of ~8 rows (formats.parquet._batch_rows):
    # several RecordBatches per unit, and a state taken between two of them.
    monkeypatch.setattr(parquet, "_BATCH_BYTES", 20_000)
    monkeypatch.setattr(parquet, "_MIN_SPLIT_ROWS", 1)
    opts = ash.StreamOptions(cache_dir=tmp_path / "cache")
    with HubServer(repo) as hub:

        def make() -> ash.Stream:
            return ash.stream(
                "hf://datasets/org/resume", endpoint=hub.endpoint, options=opts, output="arrow"
            )

        async with make() as full_stream:
            full = await _take(full_stream, None)
            units = full_stream.statistics().units
        async with make() as first:
            head = await _take(first, k)
            state = json.loads(json.dumps(first.state_dict()))
        async with make() as second:
            second.load_state_dict(state)
            tail = await _take(second, None)
    assert len(full) > 2 * units  # the units were decoded in batches
    assert head + tail == full
    ids = [i for batch in full for i in batch]
    assert len(ids) == len(set(ids)) == 300


async def test_a_finished_stream_resumes_to_nothing(repo: Path, tmp_path: Path) -> None:
    opts = ash.StreamOptions(cache_dir=tmp_path / "cache")
    with HubServer(repo) as hub:
        src = "hf://datasets/org/resume"
        async with ash.stream(src, endpoint=hub.endpoint, options=opts) as s:
            await _take(s, None)
            state = s.state_dict()
        async with ash.stream(src, endpoint=hub.endpoint, options=opts) as again:
            again.load_state_dict(state)
            assert await _take(again, None) == []


async def test_a_state_from_other_arguments_is_refused(repo: Path, tmp_path: Path) -> None:
    opts = ash.StreamOptions(cache_dir=tmp_path / "cache")
    s = ash.stream("hf://datasets/org/resume", options=opts, seed=1)
    state = s.state_dict()
    other = ash.stream("hf://datasets/org/resume", options=opts, seed=2)
    with pytest.raises(ash.SourceError, match="seed=1"):
        other.load_state_dict(state)
    with pytest.raises(ash.SourceError, match="version"):
        other.load_state_dict({**state, "version": 99})


# -- what a resume fetches -------------------------------------------------------------------


Span = tuple[int, int]


def _layout(repo: Path) -> list[tuple[Span, list[Span]]]:
    """Per file, in stream order: the byte span of its first read (the tail that holds
    the footer) and the span of each row group's column chunks, from pyarrow's metadata."""
    out = []
    for path in sorted((repo / "datasets/org/resume").glob("train-*.parquet")):
        meta = pq.ParquetFile(path).metadata
        groups = []
        for r in range(meta.num_row_groups):
            group = meta.row_group(r)
            starts, ends = [], []
            for c in range(group.num_columns):
                chunk = group.column(c)
                start = chunk.data_page_offset
                if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
                    start = min(start, chunk.dictionary_page_offset)
                starts.append(start)
                ends.append(start + chunk.total_compressed_size)
            groups.append((min(starts), max(ends)))
        size = path.stat().st_size
        out.append(((max(0, size - TAIL_READ_SIZE), size), groups))
    return out


def _covered(spans: Sequence[Span]) -> int:
    """The bytes in the union of ``spans``: what is fetched when no byte is fetched twice."""
    total, reach = 0, 0
    for start, end in sorted(spans):
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total


# (mode, items taken) that stop in the second or third row group of a file
MID_FILE = [("rows", 30), ("rows", 95), ("batches", 7), ("arrow-batches", 7)]


@pytest.mark.parametrize(
    ("mode", "k"),
    [
        *MID_FILE,
        ("rows", 7),
        ("rows", 290),  # in the last row group
        ("arrow", 7),  # at a row group's end
        ("arrow", 6),  # at a file's end (files of 3, 3, 4 and 4 row groups)
        ("rows-filtered", 30),
        ("batches", 30),  # the end: nothing left to fetch
    ],
)
async def test_resume_fetches_what_is_left_and_one_row_group(
    repo: Path, tmp_path: Path, mode: str, k: int
) -> None:
    """Bytes served to the resumed stream, counted by a server of its own: at most the
    footer reads of the files left, the row group it stopped in, and the row groups after
    it; at least those after it. Re-reading the current file from its start would add
    the row groups before the cursor (MID_FILE: cases that stop after a file's first
    row group)."""
    opts = ash.StreamOptions(cache_dir=tmp_path / "cache")
    files = "train-{0..3}.parquet"

    def make(hub: HubServer) -> ash.Stream:
        # http(s) URLs: no API request, so the server's bytes are the files' bytes
        url = hub.url("org/resume", files).replace("%7B", "{").replace("%7D", "}")
        return ash.stream(url, options=opts, **MODES[mode])

    with HubServer(repo) as hub:
        async with make(hub) as first:
            head = await _take(first, k)
            state = json.loads(json.dumps(first.state_dict()))
    # A server of its own: the first one may still be sending what was read ahead.
    with HubServer(repo) as hub:
        async with make(hub) as second:
            second.load_state_dict(state)
            tail = await _take(second, None)
        served = hub.stats()
    async with ash.stream(repo / "datasets/org/resume" / files, **MODES[mode]) as local:
        assert head + tail == await _take(local, None)

    layout = _layout(repo)
    cursor = state["cursor"]
    at, unit = cursor["file"], cursor["unit"]
    left = layout[at:]
    # Each file left: its tail, and its row groups from the cursor's on (all of them for
    # the files after it); at least the tail and the row groups after the cursor's.
    most = least = 0
    for i, (tail, groups) in enumerate(left):
        after = unit + 1 if i == 0 else 0
        first = unit if i == 0 and not cursor["done"] else after  # done: the unit ended
        most += _covered([tail, *groups[first:]])
        least += _covered([tail, *groups[after:]])
    assert served.by_bucket.get("api", 0) == 0
    assert least <= served.bytes_served <= most
    if (mode, k) == ("arrow", 6):  # stopped at a file's end: the cursor is on the next
        # file, so the resume reads nothing of the finished one, not even its footer
        assert cursor["unit"] == cursor["row"] == 0
        assert not cursor["done"]
        assert served.bytes_served == sum(_covered([t, *g]) for t, g in left)
    if (mode, k) in MID_FILE:  # the bound would catch a resume that starts its file again
        assert unit >= 1
        tail, groups = left[0]
        assert _covered([tail, *groups]) > _covered([tail, *groups[unit:]])


async def test_a_loaded_state_is_reported_until_the_pipeline_takes_it_up(
    repo: Path, tmp_path: Path
) -> None:
    # A checkpoint between load_state_dict() and the first sample (StatefulDataLoader
    # snapshots a worker right after iter()) must keep the position, not restart.
    opts = ash.StreamOptions(cache_dir=tmp_path / "cache")
    with HubServer(repo) as hub:
        src = "hf://datasets/org/resume"
        async with ash.stream(src, endpoint=hub.endpoint, options=opts) as s:
            await _take(s, 30)
            state = s.state_dict()
        again = ash.stream(src, endpoint=hub.endpoint, options=opts)
        again.load_state_dict(state)
        assert again.state_dict() == state
        async with again:
            rest = await _take(again, None)
        assert len(rest) == 60 + 70 + 80 + 90 - 30


# -- a tampered state is refused field by field -------------------------------------------

_GOOD_CURSOR = {"file": 1, "unit": 0, "row": 3, "done": False, "file_seq": 1}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"epoch": -1}, "'epoch'"),
        ({"epoch": "1"}, "'epoch'"),
        ({"files": 2.5}, "'files'"),
        ({"samples": -3}, "'samples'"),
        ({"cursor": [1, 0, 3]}, "state['cursor']"),
        ({"cursor": {**_GOOD_CURSOR, "file": "1"}}, "['file']"),
        ({"cursor": {**_GOOD_CURSOR, "file": 10**12}}, "past the 4 files"),
        ({"cursor": {**_GOOD_CURSOR, "row": -1}}, "['row']"),
        ({"cursor": {k: v for k, v in _GOOD_CURSOR.items() if k != "unit"}}, "['unit']"),
        ({"cursor": {**_GOOD_CURSOR, "done": "no"}}, "['done']"),
        ({"cursor": {**_GOOD_CURSOR, "offset": -5}}, "['offset']"),
        ({"buffer": "abc"}, "state['buffer']"),
        ({"buffer": list(range(100))}, "more than this stream's shuffle buffer"),
        ({"rng": [3, [1, 2, 3], None]}, "RNG state"),
        ({"rng": "x"}, "RNG state"),
        ({"buffer": [None] * 3}, "state['buffer'][0] is None"),
        ({"buffer": [{"id": 1}, [1]]}, "state['buffer'][1] is [1]"),
        ({"buffer": [{"id": 1}], "rng": None}, "state['rng'] is None"),
        ({"files": None}, "state['files'] is None"),
        ({"cursor": {**_GOOD_CURSOR, "file": 4}}, "at the end of the 4 files"),
    ],
)
def test_a_tampered_state_is_refused_naming_the_field(
    tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    path = tmp_path / "t.parquet"
    make_text_parquet(path, rows=10, row_group_size=5)
    good = ash.stream(str(path), shuffle=10).state_dict()
    good.update(files=4, cursor=dict(_GOOD_CURSOR))
    ash.stream(str(path), shuffle=10).load_state_dict(json.loads(json.dumps(good)))  # loads
    with pytest.raises(ash.SourceError) as info:
        ash.stream(str(path), shuffle=10).load_state_dict({**good, **change})
    assert named in str(info.value)


def _state(path: Path, cursor: dict[str, Any]) -> dict[str, Any]:
    state = ash.stream(str(path)).state_dict()
    return {**state, "files": 1, "cursor": {"done": False, "file_seq": 0, **cursor}}


async def test_a_cursor_past_the_plan_is_refused_naming_the_field(tmp_path: Path) -> None:
    # Such a cursor was taken as the stream's end (or a unit's): its rows were lost.
    path = tmp_path / "t.parquet"
    make_text_parquet(path, rows=10, row_group_size=5)  # two units of 5 rows
    for cursor, named in [
        ({"file": 0, "unit": 10**9, "row": 0}, r"state\['cursor'\]\['unit'\] is 1000000000"),
        ({"file": 0, "unit": 1, "row": 6}, r"state\['cursor'\]\['row'\] is 6, past the 5"),
    ]:
        s = ash.stream(str(path))
        s.load_state_dict(_state(path, cursor))
        async with s:
            with pytest.raises(ash.SourceError, match=named):
                await _take(s, None)
    s = ash.stream(str(path))
    s.load_state_dict(_state(path, {"file": 0, "unit": 1, "row": 2}))
    async with s:
        assert await _take(s, None) == [7, 8, 9]


async def test_a_second_loop_over_a_stream_while_one_runs_is_refused(tmp_path: Path) -> None:
    # A second `async for` used to end the first silently.
    path = tmp_path / "t.parquet"
    make_text_parquet(path, rows=10, row_group_size=5)
    async with ash.stream(str(path)) as s:
        head = []
        async for row in s:
            head.append(row["id"])
            if len(head) == 3:
                with pytest.raises(ash.UsageError, match="already being iterated.*call stream"):
                    async for _ in s:
                        pass
                with pytest.raises(ash.UsageError, match="already being iterated"):
                    iter(s)
                break
        assert head == [0, 1, 2]
        # The first loop was left: a new one may start (from the epoch's start).
        assert await _take(s, None) == list(range(10))
        assert await _take(s, None) == list(range(10))  # and after one that ended
