"""Elastic epochs (issue 32, lines 1-3 and 5): one order per (dataset, seed, epoch), shares
taken from it by any layout, and the states of a job's consumers merged into one job state
that a job of another size loads: every sample once, small states, no unit read again."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from elastic_helpers import (
    consumers,
    covered,
    exactly_once,
    is_subsequence,
    make_parquet_repo,
    parquet_bound,
    run_chain,
    spans,
    take,
)

import aiostream_hf as ash
from aiostream_hf import _elastic
from aiostream_hf._engine import resolve_for_workers
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


@pytest.fixture(scope="module")
def parquet_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    make_parquet_repo(root)
    return root


TOTAL = 330


# -- Parquet ----------------------------------------------------------------------------


PARQUET_MODES: dict[str, dict[str, Any]] = {
    "rows-shuffled": {"shuffle": 23, "seed": 3},
    "rows": {},
    "arrow-shuffled": {"output": "arrow", "shuffle": True, "seed": 1},
    "batches": {"batch_size": 7, "shuffle": True},
}


_MANIFESTS: dict[tuple[str, str, str], ash.Manifest] = {}


def _manifest(hub: HubServer, repo: str = "org/elastic") -> ash.Manifest:
    """The repo's files with their sizes (from the tree listing), resolved once: streams
    over it make no API request, so the server's bytes are the files' bytes."""
    key = (str(hub.root), hub.endpoint, repo)  # a port is reused by later servers
    if key not in _MANIFESTS:
        opts = ash.StreamOptions(cache_dir=hub.root / ".." / "cache")
        kwargs = {"endpoint": hub.endpoint, "options": opts}
        _MANIFESTS[key] = resolve_for_workers(f"hf://datasets/{repo}", kwargs)[0]
    return _MANIFESTS[key]


def _parquet(hub: HubServer, **kw: Any) -> Callable[[int, int], ash.Stream]:
    opts = ash.StreamOptions(elastic=True, slice_bytes=SLICE, prefetch_count=2)
    manifest = _manifest(hub)
    assert all(f.size for f in manifest.files)  # sizes known: large files are sliced

    def make(rank: int, world: int) -> ash.Stream:
        return ash.stream(
            manifest, endpoint=hub.endpoint, options=opts, rank=rank, world_size=world, **kw
        )

    return make


def _parquet_bound(folder: Path, seed: int, shuffle: bool) -> Callable[[Any], int]:
    """The most a job may be served, from the job state it starts from: for each unit
    left (a slice of a file), its file's tail read and its row groups from the one it
    stopped in; a unit done, or the row groups before a position, are never read again."""
    return parquet_bound(list(folder.glob("train-*.parquet")), SLICE, seed, shuffle)


@pytest.mark.parametrize("mode", list(PARQUET_MODES))
async def test_parquet_resumes_across_five_layouts_every_row_once_nothing_read_again(
    parquet_root: Path, mode: str
) -> None:
    kw = PARQUET_MODES[mode]
    with HubServer(parquet_root) as hub:
        bound = _parquet_bound(
            parquet_root / "datasets/org/elastic/data", kw.get("seed", 0), bool(kw.get("shuffle"))
        )
        delivered, jobs = await run_chain(_parquet(hub, **kw), CHAIN, hub=hub, phase_bound=bound)
    exactly_once(delivered, set(range(TOTAL)))
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
            expected = set(await take(whole, None))
    assert len(expected) == SHARDS * PER_SHARD
    exactly_once(delivered, expected)
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
        returned: list[tuple[int, int]] = []
        started: list[int] = []

        def frames(statistics: list[Any], items: int) -> None:
            returned.append((sum(s.video.get("frames_returned", 0) for s in statistics), items))
            started.append(sum(s.episodes for s in statistics))

        delivered, jobs = await run_chain(make, LEROBOT_CHAIN, on_job=frames)
    # No episode the job state says is done is started again: each job's consumers start
    # at most the episodes left (partial ones, and those not done), readahead included.
    units = len(EPISODES)
    for i, count in enumerate(started):
        base = (
            _elastic.Base()
            if i == 0
            else _elastic.Base.from_state(jobs[i - 1]["elastic"]["base"], units, "job")
        )
        assert count <= len(_elastic.remaining(base, units)), (i, count)
    assert started[-1] < units  # the last job started from a state with episodes done
    # The last job reads to the end: it fetches and decodes the frames of the items it
    # delivers and no others (none of an item delivered before a checkpoint).
    cameras = len(layout.video_keys)
    last_returned, last_items = returned[-1]
    assert last_items > 0
    assert last_returned == last_items * cameras
    exactly_once(delivered, set(range(sum(EPISODES))))
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

        parquet_bound = _parquet_bound(parquet_root / "datasets/org/elastic/data", 7, bool(shuffle))
        tar_bound = _tar_bound(tar_root / "datasets/org/shards/data", 7, bool(shuffle))

        def member(i: int, bound: Callable[[Any], int]) -> Callable[[Any], int]:
            return lambda job: bound(None if job is None else job["members"][i])

        bounds = [(pq_hub, member(0, parquet_bound)), (tar_hub, member(1, tar_bound))]
        delivered, jobs = await run_chain(make, CHAIN, bounds=bounds)
        folder = tar_root / "datasets/org/shards/data"
        async with ash.stream(str(folder / "*.tar")) as whole:
            keys = set(await take(whole, None))
    exactly_once(delivered, set(range(TOTAL)) | keys)
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
                await take(m, 3)
                states.append(m.state_dict())
    with pytest.raises(ash.SourceError, match="first_exhausted.*stop='all_exhausted'"):
        ash.merge_states(states)


# -- line 1: the order is the dataset's, seed's and epoch's; consumers take shares of it ---


async def test_the_order_is_one_for_every_layout_and_each_consumer_takes_a_share_of_it(
    parquet_root: Path, tar_root: Path, robot: tuple[Path, Any]
) -> None:
    with HubServer(parquet_root) as pq_hub, HubServer(tar_root) as tar_hub:
        cases = {
            # units permuted, rows permuted within each unit: no buffer
            "parquet-arrow-shuffled": _parquet(pq_hub, output="arrow", shuffle=True, seed=9),
            "parquet-rows": _parquet(pq_hub),
            "tar": _tar(tar_hub),
        }
        for name, make in cases.items():
            (whole,) = await consumers(make, 1)
            assert len(whole) == len(set(whole)), name
            for world in (2, 3, 5):
                shares = await consumers(make, world)
                assert sorted(sum(shares, []), key=str) == sorted(whole, key=str), (name, world)
                for share in shares:  # each consumer's samples in the one order
                    assert is_subsequence(share, whole), (name, world)
        # A shuffle buffer reorders within a consumer only: its samples are the share of
        # the same order (the units' permutation depends on seed and epoch, not the buffer).
        buffered = await consumers(_parquet(pq_hub, shuffle=23, seed=9), 3)
        plain = await consumers(_parquet(pq_hub, output="arrow", shuffle=True, seed=9), 3)
        assert [set(b) for b in buffered] == [set(p) for p in plain]
        # Another epoch is another order.
        s0, s1 = _parquet(pq_hub, output="arrow", shuffle=True, seed=9)(0, 1), None
        async with s0:
            first = await take(s0, None)
        s1 = _parquet(pq_hub, output="arrow", shuffle=True, seed=9)(0, 1)
        s1.set_epoch(1)
        async with s1:
            second = await take(s1, None)
        assert sorted(first) == sorted(second)
        assert first != second
    root, layout = robot
    with HubServer(root) as hub:
        make = _lerobot(hub, layout)
        (whole,) = await consumers(make, 1)
        for world in (2, 4):
            shares = await consumers(make, world)
            assert sorted(sum(shares, [])) == sorted(whole)
            assert all(is_subsequence(share, whole) for share in shares)


# -- line 3: a state's size does not grow with the dataset ---------------------------------


def _small_rows(root: Path, name: str, files: int) -> None:
    folder = make_repo(root, name, {})
    for i in range(files):
        make_text_parquet(
            folder / "data" / f"train-{i:04d}.parquet",
            rows=40,
            row_group_size=10,
            start_id=i * 40,
            seed=i,
            min_text=10,
            max_text=20,
        )


async def test_a_state_is_as_small_for_a_dataset_ten_times_larger(tmp_path: Path) -> None:
    _small_rows(tmp_path / "hub", "org/small", 4)
    _small_rows(tmp_path / "hub", "org/large", 40)
    sizes: dict[str, tuple[int, int]] = {}
    with HubServer(tmp_path / "hub") as hub:
        for name, files in (("small", 4), ("large", 40)):
            url = hub.url(f"org/{name}", f"data/train-{{0000..{files - 1:04d}}}.parquet")
            url = url.replace("%7B", "{").replace("%7D", "}")
            opts = ash.StreamOptions(elastic=True)
            states = []
            for rank, n in enumerate([25, 35, 7]):  # uneven progress, mid-file
                async with ash.stream(url, options=opts, rank=rank, world_size=3) as s:
                    assert len(await take(s, n)) >= n
                    states.append(s.state_dict())
            job = ash.merge_states(states)
            sizes[name] = (len(json.dumps(states[1])), len(json.dumps(job)))
            assert len(json.dumps(job)) < 1500  # no list of samples or of files
    (small_state, small_job), (large_state, large_job) = sizes["small"], sizes["large"]
    # The same positions: only numbers grow (a digit or two), not lists.
    assert large_state <= small_state + 40
    assert large_job <= small_job + 40


# -- line 5: one large file is shared by its row groups -----------------------------------


async def test_one_large_file_is_shared_by_row_group_and_no_consumer_idles(
    parquet_root: Path,
) -> None:
    path = parquet_root / "datasets/org/elastic/data/train-0.parquet"
    size = path.stat().st_size
    assert pq.ParquetFile(path).metadata.num_row_groups == 10
    with HubServer(parquet_root) as hub:
        opts = ash.StreamOptions(elastic=True, slice_bytes=SLICE)
        whole = _manifest(hub)
        one = dataclasses.replace(whole, files=whole.files[:1])  # train-0.parquet alone
        assert one.files[0].url.endswith("train-0.parquet")
        got = []
        for rank in range(4):
            hub.wait_idle()
            hub.reset_stats()
            async with ash.stream(one, options=opts, rank=rank, world_size=4) as s:
                ids = await take(s, None)
            served = hub.wait_idle().bytes_served
            assert ids, f"consumer {rank} of 4 read nothing of the one file"
            # Its slices (slice rank, rank + 4: every 4th), each its row groups and the
            # footer read (a slice is planned on its own: its file's tail is read for each).
            slices = -(-size // SLICE)
            tail = (max(0, size - TAIL_READ_SIZE), size)
            most = sum(
                covered([tail, *(g for g in spans(path) if min(g[0] // SLICE, slices - 1) == s)])
                for s in range(rank, slices, 4)
            )
            assert served <= most < size
            got.append(ids)
    assert sorted(sum(got, [])) == list(range(200))


# -- bad input ---------------------------------------------------------------------------


async def _states(make: Callable[[int, int], Any], world: int, n: int) -> list[dict[str, Any]]:
    states = []
    for rank in range(world):
        async with make(rank, world) as s:
            await take(s, n)
            states.append(s.state_dict())
    return states


async def test_states_of_another_job_or_dataset_are_refused_naming_the_way_out(
    parquet_root: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    _small_rows(other, "org/elastic", 2)
    with HubServer(parquet_root) as hub, HubServer(other) as other_hub:
        make = _parquet(hub, shuffle=5, seed=1)
        states = await _states(make, 3, 10)
        with pytest.raises(ash.SourceError, match=r"consumers \[2\] are missing"):
            ash.merge_states(states[:2])
        with pytest.raises(ash.SourceError, match="both of consumer 1"):
            ash.merge_states([states[0], states[1], states[1]])
        reseeded = await _states(_parquet(hub, shuffle=5, seed=2), 3, 10)
        with pytest.raises(ash.SourceError, match=r"states\[1\]\['seed'\] is 2.*one job"):
            ash.merge_states([states[0], reseeded[1], states[2]])
        with pytest.raises(ash.SourceError, match="job state already"):
            ash.merge_states([ash.merge_states(states)])
        job = ash.merge_states(states)
        with pytest.raises(ash.SourceError, match="seed=1.*seed=2.*same arguments"):
            _parquet(hub, shuffle=5, seed=2)(0, 2).load_state_dict(job)
        plain = ash.stream(hub.url("org/elastic", "data/train-0.parquet"))
        with pytest.raises(ash.SourceError, match=r"StreamOptions\(elastic=True\)"):
            plain.load_state_dict(job)
        with pytest.raises(ash.SourceError, match="no 'elastic' field"):
            ash.merge_states([s for s in [await _states(lambda r, w: plain, 1, 3)][0]])
        # Another dataset under the same name (on another server): refused.
        with pytest.raises(ash.SourceError, match="another stream.*same arguments"):
            _parquet(other_hub, shuffle=5, seed=1)(0, 2).load_state_dict(job)
        # The same files named, other bytes behind them: refused once they are listed.
        listed = _manifest(hub)
        edited = dataclasses.replace(
            listed, files=tuple(dataclasses.replace(f, size=f.size + 1) for f in listed.files)
        )
        opts = ash.StreamOptions(elastic=True, slice_bytes=SLICE)
        changed = ash.stream(edited, options=opts, rank=0, world_size=2, shuffle=5, seed=1)
        changed.load_state_dict(job)
        async with changed:
            with pytest.raises(ash.SourceError, match="saved over other files.*pin the revision"):
                await take(changed, None)
        # A changed state names its field.
        bad = json.loads(json.dumps(job))
        bad["elastic"]["base"]["frontier"] = 10**6
        with pytest.raises(ash.SourceError, match=r"\['frontier'\] is 1000000"):
            _parquet(hub, shuffle=5, seed=1)(0, 2).load_state_dict(bad)
        bad = json.loads(json.dumps(job))
        bad["elastic"]["base"]["partial"] = [[bad["elastic"]["base"]["frontier"], {"unit": "x"}]]
        with pytest.raises(ash.SourceError, match="not a position of a Parquet or TAR unit"):
            _parquet(hub, shuffle=5, seed=1)(0, 2).load_state_dict(bad)


# -- the same layout: a consumer's own state resumes it exactly -----------------------------


async def test_a_consumers_own_state_resumes_it_exactly_in_the_same_layout(
    parquet_root: Path, robot: tuple[Path, Any]
) -> None:
    root, layout = robot
    with HubServer(parquet_root) as pq_hub, HubServer(root) as robot_hub:
        cases = {
            "parquet": (_parquet(pq_hub, shuffle=23, seed=4), 37),
            "lerobot": (_lerobot(robot_hub, layout, shuffle=16, seed=4), 21),
        }
        for name, (make, k) in cases.items():
            async with make(1, 3) as s:
                full = await take(s, None)
            async with make(1, 3) as s:
                head = await take(s, k)
                state = json.loads(json.dumps(s.state_dict()))
            again = make(1, 3)
            again.load_state_dict(state)
            async with again:
                tail = await take(again, None)
            assert head + tail == full, name
