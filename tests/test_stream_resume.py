"""Exact resume: state_dict after k samples, then a new stream continues with sample k+1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import aiostream_hf as ash
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
            min_text=5,
            max_text=10,
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
