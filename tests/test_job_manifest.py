"""One resolution per job through a shared folder (issue 32, line 6):
``StreamOptions(manifest_dir=...)``. Machines are Resolvers with a cache folder each, as
separate nodes have; the folder is the one they share. What is read from it is hostile:
a damaged, planted, foreign or outdated file is an error naming it and the way out, and
never a fresh resolution or a wrong listing."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import aiostream_hf as ash
from aiostream_hf import _job_manifest
from aiostream_hf._resolver import Resolver
from aiostream_hf.testing import HubServer, make_repo, make_text_parquet

REPO = "org/jobs"
SOURCE = f"hf://datasets/{REPO}"
FILES = 8
ROWS = 6


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    folder = make_repo(root, REPO, {})
    for i in range(FILES):
        make_text_parquet(
            folder / "data" / f"train-{i:05d}-of-{FILES:05d}.parquet",
            rows=ROWS,
            start_id=i * ROWS,
            seed=i,
            min_text=5,
            max_text=20,
        )
    make_text_parquet(
        folder / "data" / "test-00000-of-00001.parquet", rows=3, start_id=1000, min_text=5
    )
    return root


@pytest.fixture
def hub(root: Path) -> Iterator[HubServer]:
    with HubServer(root) as server:
        yield server


def _options(tmp_path: Path, machine: int, **kw: Any) -> ash.StreamOptions:
    return ash.StreamOptions(
        cache_dir=tmp_path / f"machine-{machine}", manifest_dir=tmp_path / "job", **kw
    )


async def _resolve(hub: HubServer, options: ash.StreamOptions, **kw: Any) -> ash.Manifest:
    kw.setdefault("split", "train")
    async with Resolver(options=options) as resolver:
        return await resolver.resolve(SOURCE, endpoint=hub.endpoint, **kw)


def _api(hub: HubServer) -> int:
    return hub.wait_idle().by_bucket.get("api", 0)


@pytest.mark.anyio
async def test_four_machines_sharing_a_folder_resolve_once(hub: HubServer, tmp_path: Path) -> None:
    manifests: list[ash.Manifest] = []

    async def machine(i: int) -> None:
        manifests.append(await _resolve(hub, _options(tmp_path, i)))

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(machine, i)
    once = _api(hub)
    assert 1 <= once <= 2  # the pin and the tree listing, by one of the four
    assert len(manifests) == 4
    assert all(m == manifests[0] for m in manifests)
    assert len(manifests[0].files) == FILES
    # A machine that comes later (a restart, a node that joins) reads the folder too,
    # and without a pin_ttl window: the job stays at the commit it began with.
    late = await _resolve(hub, _options(tmp_path, 9, pin_ttl=0))
    assert late == manifests[0]
    assert _api(hub) == once
    # The folder holds one manifest per request: another split is resolved on its own.
    test = await _resolve(hub, _options(tmp_path, 0), split="test")
    assert [f.split for f in test.files] == ["test"]
    assert test.commit == late.commit


@pytest.mark.anyio
async def test_a_stream_with_a_job_folder_reads_every_row(hub: HubServer, tmp_path: Path) -> None:
    ids: list[int] = []
    for machine in range(2):
        s = ash.stream(
            SOURCE,
            split="train",
            endpoint=hub.endpoint,
            columns=["id"],
            options=_options(tmp_path, machine),
            rank=machine,
            world_size=2,
        )
        async with s:
            ids += [int(row["id"]) async for row in s]
    assert sorted(ids) == list(range(FILES * ROWS))
    assert _api(hub) <= 2


def _entry_path(tmp_path: Path) -> Path:
    (path,) = (tmp_path / "job").glob("job-*.json")
    return path


def _rewrite(path: Path, change: Callable[[dict[str, Any]], None], *, digest: bool) -> None:
    entry = json.loads(path.read_text())
    change(entry)
    if digest:  # a careful forger: the sha256 made to match
        entry["sha256"] = _job_manifest._digest(entry["manifest"])
    path.write_text(json.dumps(entry))


def _files(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def apply(entry: dict[str, Any]) -> None:
        change(entry["manifest"]["files"][0])

    return apply


def _set(**values: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.update(values)


_OTHER_SHA = "0" * 40

#: name -> (how a good entry is spoiled, whether the forger fixed the sha256, message)
HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], None], bool, str]] = {
    "format": (_set(format="something else"), False, "is not an aiostream-hf job manifest"),
    "version": (_set(version=2), False, "has version 2: this aiostream-hf reads version 1"),
    "request": (
        lambda e: e["key"].update(split="test"),
        False,
        "is for hf://datasets/org/jobs .*split='test'.*, not for .*split='train'",
    ),
    "changed": (_files(_set(size=1)), False, "does not match its sha256"),
    "other host": (
        _files(lambda f: f.update(url=f["url"].replace("http://", "http://evil.example@"))),
        True,
        "has URL .*not the /resolve/ URL of its path",
    ),
    "other path": (
        _files(lambda f: f.update(path="data/other.parquet")),
        True,
        "has URL .*not the /resolve/ URL of its path",
    ),
    "negative size": (_files(_set(size=-5)), True, "has a size that is not a whole number"),
    "bool size": (_files(_set(size=True)), True, "has a size that is not a whole number"),
    "escaping path": (_files(_set(path="../../etc/passwd")), True, "has a path that has an empty"),
    "etag": (_files(_set(etag="<script>")), True, "has an etag that is not a hex object id"),
    "split": (_files(_set(split="test")), True, "is in split 'test', not in 'train'"),
    "asked split": (
        lambda e: e["manifest"].update(split="test"),
        True,
        "holds split 'test', not 'train' as asked",
    ),
    "endpoint": (
        lambda e: e["manifest"].update(endpoint="http://127.0.0.2:1"),
        True,
        "was resolved at 'http://127.0.0.2:1'",
    ),
    "files": (lambda e: e["manifest"].update(files={"a": 1}), True, "has files that are not"),
    "repo": (
        lambda e: e["manifest"].update(repo_id="org/other"),
        True,
        "is a listing of 'org/other', which none of its sources names",
    ),
    "splits": (lambda e: e["manifest"].update(splits={"train": -1}), True, "has splits that"),
    "commit": (
        lambda e: e["manifest"].update(commit=_OTHER_SHA),
        True,
        "names commit '0000000000000000000000000000000000000000', which none",
    ),
    "two commits": (
        _files(lambda f: f.update(url=f["url"].replace(f["url"].split("/")[-3], _OTHER_SHA))),
        True,
        "reads org/jobs at commits",
    ),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_a_hostile_job_manifest_is_an_error_never_a_listing(
    hub: HubServer, tmp_path: Path, case: str
) -> None:
    good = await _resolve(hub, _options(tmp_path, 0))
    path = _entry_path(tmp_path)
    change, digest, message = HOSTILE[case]
    _rewrite(path, change, digest=digest)
    before = _api(hub)
    with pytest.raises(ash.ResolutionError, match=message) as caught:
        await _resolve(hub, _options(tmp_path, 1))
    text = str(caught.value)
    assert str(path) in text
    assert "remove it to resolve afresh" in text
    assert _api(hub) == before  # no fresh resolution behind the error's back
    path.unlink()  # the way out the message names
    again = await _resolve(hub, _options(tmp_path, 2))
    assert again == good


@pytest.mark.anyio
async def test_unreadable_job_manifests_are_errors_naming_them(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _resolve(hub, _options(tmp_path, 0))
    path = _entry_path(tmp_path)
    data = path.read_bytes()
    # too large: refused from its size, before a byte is read
    monkeypatch.setattr(_job_manifest, "MAX_JOB_MANIFEST_BYTES", len(data) - 1)
    with pytest.raises(ash.ResolutionError, match="over MAX_JOB_MANIFEST_BYTES"):
        await _resolve(hub, _options(tmp_path, 1))
    monkeypatch.undo()
    # more files than a listing may hold
    monkeypatch.setattr(_job_manifest, "MAX_TREE_FILES", FILES - 1)
    with pytest.raises(ash.ResolutionError, match=f"lists {FILES} files, over MAX_TREE_FILES"):
        await _resolve(hub, _options(tmp_path, 1))
    monkeypatch.undo()
    # cut short (as a copy that stopped half-way would be)
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ash.ResolutionError, match="is not JSON"):
        await _resolve(hub, _options(tmp_path, 1))
    # a symlink to a file elsewhere
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(data)
    path.unlink()
    os.symlink(elsewhere, path)
    with pytest.raises(ash.ResolutionError, match="cannot be opened .*a symlink is refused"):
        await _resolve(hub, _options(tmp_path, 1))
    # a folder
    path.unlink()
    path.mkdir()
    with pytest.raises(ash.ResolutionError, match="is not a regular file|cannot be opened"):
        await _resolve(hub, _options(tmp_path, 1))


@pytest.mark.anyio
async def test_a_commit_the_source_names_is_checked(hub: HubServer, tmp_path: Path) -> None:
    first = await _resolve(hub, _options(tmp_path, 0))
    assert first.commit is not None
    pinned = f"{SOURCE}@{first.commit}"
    async with Resolver(options=_options(tmp_path, 0)) as resolver:
        at = await resolver.resolve(pinned, split="train", endpoint=hub.endpoint)
    assert at.commit == first.commit
    path = next(p for p in (tmp_path / "job").glob("job-*.json") if "@" in p.read_text())
    other = "1" * 40

    def elsewhere(entry: dict[str, Any]) -> None:
        for f in entry["manifest"]["files"]:
            f["url"] = f["url"].replace(first.commit or "", other)
        entry["manifest"]["commit"] = other

    _rewrite(path, elsewhere, digest=True)
    async with Resolver(options=_options(tmp_path, 1)) as resolver:
        with pytest.raises(ash.ResolutionError, match="not at the ones its sources name"):
            await resolver.resolve(pinned, split="train", endpoint=hub.endpoint)


@pytest.mark.anyio
async def test_a_job_folder_of_another_kind_is_refused(hub: HubServer, tmp_path: Path) -> None:
    (tmp_path / "job").write_text("a file, not a folder")
    with pytest.raises(ash.ResolutionError, match="job manifest folder .* is not usable"):
        await _resolve(hub, _options(tmp_path, 0))
    assert _api(hub) == 0


@pytest.mark.anyio
async def test_tokens_do_not_share_a_job_manifest(hub: HubServer, tmp_path: Path) -> None:
    await _resolve(hub, _options(tmp_path, 0))
    await _resolve(hub, _options(tmp_path, 1), token="hf_another_user")
    # two requests, two entries: a manifest is only read with the token it was made with
    assert len(list((tmp_path / "job").glob("job-*.json"))) == 2


# -- every kind of source: TAR shards, a mixture, a LeRobot dataset ------------------------


@pytest.fixture(scope="module")
def kinds_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from aiostream_hf.testing import make_lerobot_dataset, make_webdataset_shards

    root = tmp_path_factory.mktemp("kinds")
    shards = make_repo(root, "org/shards", {})
    make_webdataset_shards(shards / "data", shards=16, samples_per_shard=3, width=8, height=8)
    rows = make_repo(root, "org/rows", {})
    for i in range(4):
        make_text_parquet(
            rows / "data" / f"train-{i:05d}-of-00004.parquet",
            rows=12,
            row_group_size=3,
            start_id=i * 12,
            seed=i,
            min_text=5,
            max_text=20,
        )
    make_lerobot_dataset(
        root,
        "org/robot",
        episodes=(3,) * 16,
        fps=10,
        width=16,
        height=16,
        cameras=("observation.images.top",),
        codec="h264",
        episodes_per_video_file=4,
        episodes_per_data_file=4,
    )
    return root


def _job_stream(kind: str, hub: HubServer, options: ash.StreamOptions, rank: int) -> Any:
    from aiostream_hf import lerobot

    kw: dict[str, Any] = {"endpoint": hub.endpoint, "options": options, "rank": rank}
    kw["world_size"] = 16
    if kind == "lerobot":
        return lerobot.stream("hf://datasets/org/robot", **kw)
    shards = ash.stream("hf://datasets/org/shards", split="train", **kw)
    if kind == "tar":
        return shards
    rows = ash.stream("hf://datasets/org/rows", split="train", **kw)
    return ash.mix([rows, shards], [0.5, 0.5], seed=1, stop="all_exhausted")


def _key(item: Any) -> Any:
    if "index" in item:  # a LeRobot item: its frame's index
        return int(item["index"])
    return item.get("__key__", item.get("id"))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kind", "datasets", "samples"), [("tar", 1, 48), ("mix", 2, 96), ("lerobot", 1, 48)]
)
async def test_a_job_of_4_machines_x_4_consumers_resolves_each_dataset_once(
    kinds_root: Path, tmp_path: Path, kind: str, datasets: int, samples: int
) -> None:
    """16 elastic consumers of one job, 4 per machine (a cache folder each), all at once:
    one resolution per dataset (a pin and a listing), every sample once. A LeRobot
    dataset's listing of its folder (videos, metadata) is the job's too: without it, each
    machine listed it (5 API requests)."""
    got: list[Any] = []
    with HubServer(kinds_root) as hub:

        async def consumer(rank: int) -> None:
            options = _options(tmp_path, rank // 4, elastic=True)
            async with _job_stream(kind, hub, options, rank) as s:
                got.extend([_key(item) async for item in s])

        async with anyio.create_task_group() as tg:
            for rank in range(16):
                tg.start_soon(consumer, rank)
        api = _api(hub)
    assert len(got) == samples  # nothing twice...
    assert len(set(got)) == samples  # ...nothing lost
    assert api <= 2 * datasets, api
