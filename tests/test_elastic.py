"""Elastic epochs (issue 32, lines 1-3 and 5): one order per (dataset, seed, epoch), shares
taken from it by any layout, and the states of a job's consumers merged into one job state
that a job of another size loads: every sample once, small states, no unit read again."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import aiostream_hf as ash
from aiostream_hf import _elastic
from aiostream_hf.formats.parquet import TAIL_READ_SIZE
from aiostream_hf.testing import HubServer, make_repo, make_text_parquet

pytestmark = pytest.mark.anyio

SLICE = 100_000  # bytes: the large file is cut into 6 slices, the small ones into 2
# (ranks x workers of each job of a chain, the samples each consumer takes before the
# checkpoint): five changes of layout, then a job that reads to the end
CHAIN: list[tuple[int, list[int]]] = [
    (4, [9, 30, 3, 17]),  # 2 ranks x 2 workers
    (3, [26, 1, 40]),  # 3 x 1
    (1, [33]),  # 1 x 1
    (5, [12, 0, 21, 8, 50]),  # 5 x 1 (one consumer checkpoints before its first sample)
    (8, [4, 11, 2, 30, 6, 9, 1, 19]),  # 4 ranks x 2 workers
    (2, [None, None]),  # to the end
]


def _make_parquet_repo(root: Path, name: str = "org/elastic") -> Path:
    folder = make_repo(root, name, {})
    sizes = [(200, 20), (60, 25), (70, 25)]  # (rows, rows per row group)
    start = 0
    for i, (rows, group) in enumerate(sizes):
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


@pytest.fixture(scope="module")
def parquet_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    _make_parquet_repo(root)
    return root


TOTAL = 330


def _ids(item: Any) -> list[Any]:
    if isinstance(item, pa.RecordBatch):
        return item.column("id").to_pylist()
    if isinstance(item, dict) and isinstance(item.get("id"), list):
        return list(item["id"])
    if "index" in item:  # a LeRobot item: its frame's global index
        return [int(item["index"])]
    return [item["id"] if "id" in item else item["__key__"]]


async def _take(s: Any, n: int | None) -> list[Any]:
    """Samples of ``s`` until ``n`` ids are taken (None: to the end); a state is then exact."""
    got: list[Any] = []
    if n == 0:
        return got
    async for item in s:
        got += _ids(item)
        if n is not None and len(got) >= n:
            break
    return got


async def run_chain(
    make: Callable[[int, int], Any],
    chain: Sequence[tuple[int, Sequence[int | None]]] = CHAIN,
    *,
    hub: HubServer | None = None,
    phase_bound: Callable[[dict[str, Any] | None], int] | None = None,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Every job of ``chain`` in turn: each consumer loads the job state (JSON round trip),
    takes its samples and saves its state; the states are merged for the next job.
    Returns every id delivered, and the job states. With ``phase_bound``, the bytes each
    job is served are checked against it (what is left of the job state it started from)."""
    delivered: list[Any] = []
    job: dict[str, Any] | None = None
    jobs: list[dict[str, Any]] = []
    for world, takes in chain:
        if hub is not None:
            hub.wait_idle()
            hub.reset_stats()
        states = []
        for rank in range(world):
            s = make(rank, world)
            if job is not None:
                s.load_state_dict(job)
            async with s:
                delivered += await _take(s, takes[rank])
                states.append(_roundtrip(s.state_dict()))
        if hub is not None and phase_bound is not None:
            served = hub.wait_idle()
            assert served.bytes_served <= phase_bound(job), (world, job)
        job = _roundtrip(ash.merge_states(states))
        jobs.append(job)
    return delivered, jobs


def _roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    """A state as saved to disk and read back: JSON, or pickle for a buffer of TAR
    samples (bytes, which JSON has not)."""
    try:
        return dict(json.loads(json.dumps(state)))
    except TypeError:
        return dict(pickle.loads(pickle.dumps(state)))


def _exactly_once(delivered: list[Any], expected: set[Any]) -> None:
    assert len(delivered) == len(set(delivered)), "a sample was delivered twice"
    assert set(delivered) == expected, "a sample was lost"


# -- Parquet ----------------------------------------------------------------------------


PARQUET_MODES: dict[str, dict[str, Any]] = {
    "rows-shuffled": {"shuffle": 23, "seed": 3},
    "rows": {},
    "arrow-shuffled": {"output": "arrow", "shuffle": True, "seed": 1},
    "batches": {"batch_size": 7, "shuffle": True},
}


def _parquet(hub: HubServer, **kw: Any) -> Callable[[int, int], ash.Stream]:
    opts = ash.StreamOptions(elastic=True, slice_bytes=SLICE, prefetch_count=2)
    # An http(s) source: no API request, so the server's bytes are the files' bytes.
    url = hub.url("org/elastic", "data/train-{0..2}.parquet").replace("%7B", "{")
    url = url.replace("%7D", "}")

    def make(rank: int, world: int) -> ash.Stream:
        return ash.stream(url, options=opts, rank=rank, world_size=world, **kw)

    return make


def _spans(path: Path) -> list[tuple[int, int]]:
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


def _covered(spans: Sequence[tuple[int, int]]) -> int:
    total = reach = 0
    for start, end in sorted(spans):
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total


def _parquet_bound(folder: Path, seed: int, shuffle: bool) -> Callable[[Any], int]:
    """The most a job may be served, from the job state it starts from: for each unit
    left (a slice of a file), its file's tail read and its row groups from the one it
    stopped in; a unit done, or the row groups before a position, are never read again."""
    paths = sorted(folder.glob("train-*.parquet"))
    sizes = [p.stat().st_size for p in paths]
    spans = [_spans(p) for p in paths]
    units = [
        (f, s, -(-sizes[f] // SLICE))
        for f in range(len(paths))
        for s in range(-(-sizes[f] // SLICE))
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
                (r, span) for r, span in enumerate(spans[f]) if min(span[0] // SLICE, n - 1) == s
            ]
            first = start["unit"] if start else 0
            tail = (max(0, sizes[f] - TAIL_READ_SIZE), sizes[f])
            total += _covered([tail, *(span for r, span in mine if r >= first)])
        return total

    return bound


@pytest.mark.parametrize("mode", list(PARQUET_MODES))
async def test_parquet_resumes_across_five_layouts_every_row_once_nothing_read_again(
    parquet_root: Path, mode: str
) -> None:
    kw = PARQUET_MODES[mode]
    with HubServer(parquet_root) as hub:
        bound = _parquet_bound(
            parquet_root / "datasets/org/elastic/data", kw.get("seed", 0), bool(kw.get("shuffle"))
        )
        delivered, jobs = await run_chain(_parquet(hub, **kw), hub=hub, phase_bound=bound)
    _exactly_once(delivered, set(range(TOTAL)))
    # The chain stopped mid-unit somewhere: some job state held a partial unit.
    assert any(j["elastic"]["base"]["partial"] for j in jobs[:-1])
    if "shuffle" in kw and "batch_size" not in kw and kw.get("output") != "arrow":
        assert any(j["elastic"]["base"]["buffer"] for j in jobs[:-1])  # buffers carried over


# -- TAR shards ---------------------------------------------------------------------------

SHARDS, PER_SHARD = 6, 12
TAR_CHAIN: list[tuple[int, list[int | None]]] = [
    (4, [5, 13, 0, 7]),
    (3, [2, 9, 4]),
    (1, [6]),
    (5, [3, 1, 0, 8, 2]),
    (2, [5, 3]),
    (3, [None, None, None]),
]


@pytest.fixture(scope="module")
def tar_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from aiostream_hf.testing import make_webdataset_shards

    root = tmp_path_factory.mktemp("hub")
    repo = make_repo(root, "org/shards", {})
    make_webdataset_shards(repo / "data", shards=SHARDS, samples_per_shard=PER_SHARD, seed=2)
    return root


def _tar(hub: HubServer, **kw: Any) -> Callable[[int, int], ash.Stream]:
    opts = ash.StreamOptions(elastic=True, prefetch_count=2)
    url = hub.url("org/shards", f"data/train-{{000000..{SHARDS - 1:06d}}}.tar")
    url = url.replace("%7B", "{").replace("%7D", "}")

    def make(rank: int, world: int) -> ash.Stream:
        return ash.stream(url, options=opts, rank=rank, world_size=world, **kw)

    return make


def _tar_bound(folder: Path, seed: int, shuffle: bool) -> Callable[[Any], int]:
    """The most a job may be served: each shard left, from the byte its position names."""
    sizes = [p.stat().st_size for p in sorted(folder.glob("*.tar"))]

    def bound(job: dict[str, Any] | None) -> int:
        base = (
            _elastic.Base()
            if job is None
            else _elastic.Base.from_state(job["elastic"]["base"], len(sizes), "job")
        )
        order = _elastic.unit_order(len(sizes), seed=seed, epoch=0, shuffle=shuffle)
        return sum(
            sizes[order[g]] - ((start or {}).get("offset") or 0)
            for g, start in _elastic.remaining(base, len(sizes))
        )

    return bound


@pytest.mark.parametrize("shuffle", [False, 9])
async def test_tar_resumes_across_five_layouts_every_sample_once_nothing_read_again(
    tar_root: Path, shuffle: int | bool
) -> None:
    with HubServer(tar_root) as hub:
        names = sorted(p.name for p in (tar_root / "datasets/org/shards/data").glob("*.tar"))
        assert len(names) == SHARDS
        folder = tar_root / "datasets/org/shards/data"
        bound = _tar_bound(folder, 4, bool(shuffle))
        make = _tar(hub, shuffle=shuffle, seed=4)
        delivered, jobs = await run_chain(make, TAR_CHAIN, hub=hub, phase_bound=bound)
        async with ash.stream(str(folder / "*.tar")) as whole:
            expected = set(await _take(whole, None))
    assert len(expected) == SHARDS * PER_SHARD
    _exactly_once(delivered, expected)
    partial = [pos for j in jobs[:-1] for _, pos in j["elastic"]["base"]["partial"]]
    assert any(pos.get("offset") for pos in partial)  # a shard resumed mid-way, by byte


# -- LeRobot ----------------------------------------------------------------------------

LEROBOT_CHAIN: list[tuple[int, list[int | None]]] = [
    (4, [9, 30, 3, 17]),
    (3, [6, 1, 21]),
    (1, [13]),
    (5, [5, 0, 11, 8, 2]),
    (2, [7, 12]),
    (3, [None, None, None]),
]
EPISODES = (20, 33, 27, 40, 25)


@pytest.fixture(scope="module")
def robot(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    from aiostream_hf.testing import make_lerobot_dataset

    root = tmp_path_factory.mktemp("hub")
    layout = make_lerobot_dataset(
        root,
        "org/robot",
        width=64,
        height=48,
        episodes=EPISODES,
        codec="h264",
        gop=6,
        episodes_per_video_file=3,
        episodes_per_data_file=2,
    )
    return root, layout


def _lerobot(hub: HubServer, layout: Any, **kw: Any) -> Callable[[int, int], Any]:
    from aiostream_hf import lerobot

    opts = ash.StreamOptions(elastic=True, prefetch_count=2)

    def make(rank: int, world: int) -> Any:
        return lerobot.stream(
            layout.uri,
            endpoint=hub.endpoint,
            options=opts,
            rank=rank,
            world_size=world,
            batch_items=4,
            **kw,
        )

    return make


@pytest.mark.parametrize("shuffle", [False, 16])
async def test_lerobot_resumes_across_five_layouts_every_frame_once(
    robot: tuple[Path, Any], shuffle: int | bool
) -> None:
    root, layout = robot
    with HubServer(root) as hub:
        make = _lerobot(hub, layout, shuffle=shuffle, seed=2)
        delivered, jobs = await run_chain(make, LEROBOT_CHAIN)
    _exactly_once(delivered, set(range(sum(EPISODES))))
    assert any(j["elastic"]["base"]["partial"] for j in jobs[:-1])
    if shuffle:
        assert any(j["elastic"]["base"]["buffer"] for j in jobs[:-1])


# -- mix() --------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, 11])
async def test_mix_of_parquet_and_tar_resumes_across_five_layouts_every_sample_once(
    parquet_root: Path, tar_root: Path, shuffle: int | bool
) -> None:
    with HubServer(parquet_root) as pq_hub, HubServer(tar_root) as tar_hub:
        rows = _parquet(pq_hub, shuffle=shuffle, seed=7)
        shards = _tar(tar_hub, shuffle=shuffle, seed=7)

        def make(rank: int, world: int) -> ash.Mix:
            return ash.mix(
                [rows(rank, world), shards(rank, world)], [0.7, 0.3], seed=5, stop="all_exhausted"
            )

        delivered, jobs = await run_chain(make, CHAIN)
        folder = tar_root / "datasets/org/shards/data"
        async with ash.stream(str(folder / "*.tar")) as whole:
            keys = set(await _take(whole, None))
    _exactly_once(delivered, set(range(TOTAL)) | keys)
    assert all(j["of"] == "mix" for j in jobs)
    assert any(j["members"][0]["elastic"]["base"]["partial"] for j in jobs[:-1])
    assert any(j["members"][1]["elastic"]["base"]["partial"] for j in jobs[:-1])


async def test_a_mixture_that_stops_at_the_first_exhausted_is_refused_naming_the_stop(
    parquet_root: Path,
) -> None:
    with HubServer(parquet_root) as hub:
        rows = _parquet(hub)
        states = []
        for rank in range(2):
            m = ash.mix([rows(rank, 2), rows(rank, 2)], stop="first_exhausted")
            async with m:
                await _take(m, 3)
                states.append(m.state_dict())
    with pytest.raises(ash.SourceError, match="first_exhausted.*stop='all_exhausted'"):
        ash.merge_states(states)
