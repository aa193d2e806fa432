"""The Resolver against the local Hub server, with `datasets` as the oracle for file choice."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import fsspec.utils
import httpx2
import pytest
from anyio import wait_all_tasks_blocked

from aiostream_hf import (
    ClosedResourceError,
    ConfigNotFoundError,
    EntryNotFoundError,
    GatedRepoError,
    RepoNotFoundError,
    ResolutionError,
    RevisionNotFoundError,
    SourceError,
    SplitNotFoundError,
)
from aiostream_hf._client import HubClient
from aiostream_hf._hub_layout import Glob
from aiostream_hf._models import FileRef, Manifest
from aiostream_hf._options import StreamOptions
from aiostream_hf._resolver import Resolver
from aiostream_hf.testing import (
    Faults,
    HubServer,
    RateLimits,
    make_repo,
    make_repo_split_folders,
    make_repo_split_naming,
    make_repo_yaml_configs,
    make_text_parquet,
)

HELPER = Path(__file__).with_name("resolver_oracle.py")


# -- helpers -------------------------------------------------------------------------------


def _run(mode: str, hub: HubServer, tmp: Path, *args: str) -> Any:
    """Run tests/resolver_oracle.py in a fresh process pointed at the server."""
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(tmp / "hf-home"),
        "HF_DATASETS_CACHE": str(tmp / "hf-datasets"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_DATASETS_OFFLINE", None)
    done = subprocess.run(
        [sys.executable, str(HELPER), mode, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _by_split(manifest: Manifest) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in manifest.files:
        assert f.split is not None
        out.setdefault(f.split, []).append(f.path)
    return out


def _options(tmp_path: Path, **changes: Any) -> StreamOptions:
    return StreamOptions(cache_dir=tmp_path / "cache", **changes)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "hub"
    r.mkdir()
    return r


@pytest.fixture
def one_parquet(tmp_path: Path) -> Path:
    path = tmp_path / "one.parquet"
    make_text_parquet(path, rows=3, min_text=5, max_text=10)
    return path


@pytest.fixture
def parquet_size(one_parquet: Path) -> int:
    return one_parquet.stat().st_size


# -- the layouts, and what datasets picks in them ------------------------------------------

_YAML_LIST_README = """\
---
configs:
- config_name: single
  data_files: one/*.parquet
- config_name: many
  default: true
  data_files:
  - two/a.parquet
  - two/b/*.parquet
- config_name: nested
  data_dir: three
---
# yaml-list
"""


def _build_layouts(root: Path, parquet: Path) -> None:
    make_repo_split_naming(root)
    make_repo_split_folders(root)
    make_repo_yaml_configs(root)
    p = parquet
    make_repo(root, "org/root-files", {"README.md": "# x\n", "train.parquet": p, "test.parquet": p})
    make_repo(
        root,
        "org/data-dirs",
        {
            "data/train/a.parquet": p,
            "data/train/b.parquet": p,
            "data/validation/a.parquet": p,
        },
    )
    make_repo(
        root,
        "org/keywords",
        {
            "data/foo-train-0.parquet": p,
            "data/foo-train-1.parquet": p,
            "data/foo-test-0.parquet": p,
            "data/foo-dev-0.parquet": p,
            "other/x.parquet": p,
        },
    )
    make_repo(
        root,
        "org/only-one",
        {
            "foo.parquet": p,
            "notes.txt": "not data",
            ".hidden/a.parquet": p,
            "__pycache__/b.parquet": p,
            "dataset_info.json": "{}",
        },
    )
    make_repo(
        root,
        "org/mixed",
        {
            "a.parquet": p,
            "b.parquet": p,
            "c.tar": b"tar" * 10,
            "d.tar.gz": b"gz" * 10,
            "e.tar.gz": b"gz" * 10,
            "f.jsonl": "{}\n",
        },
    )
    make_repo(
        root,
        "org/mixed-parquet",
        {"a.parquet": p, "b.parquet": p, "c.parquet": p, "d.tar": b"tar" * 10},
    )
    make_repo(
        root,
        "org/sharded-custom",
        {
            "data/train-00000-of-00001.parquet": p,
            "data/random-00000-of-00002.parquet": p,
            "data/random-00001-of-00002.parquet": p,
            "data/validation-00000-of-00001.parquet": p,
            "data/extra/ignored.parquet": p,
        },
    )
    make_repo(
        root,
        "org/training-folders",
        {"training/x.parquet": p, "eval/y.parquet": p, "eval/z.parquet": p, "misc.parquet": p},
    )
    make_repo(
        root,
        "org/yaml-list",
        {
            "README.md": _YAML_LIST_README,
            "one/a.parquet": p,
            "one/b.parquet": p,
            "two/a.parquet": p,
            "two/b/c.parquet": p,
            "two/b/d.parquet": p,
            "three/train/x.parquet": p,
            "three/test/y.parquet": p,
        },
    )
    make_repo(
        root,
        "org/standalone-yaml",
        {
            "README.md": "# no YAML here\n",
            ".huggingface.yaml": "configs:\n- config_name: sub\n  data_files: sub/*.parquet\n",
            "sub/a.parquet": p,
            "train.parquet": p,
        },
    )
    convert = root / "datasets" / "org" / "split-naming@refs%2Fconvert%2Fparquet" / "default"
    for split, name in [
        ("train", "0000.parquet"),
        ("train", "0001.parquet"),
        ("test", "0000.parquet"),
    ]:
        make_text_parquet(convert / split / name, rows=2, min_text=5, max_text=10)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    source: str  # hf://datasets/ + this
    oracle: dict[str, Any]  # load_dataset_builder(**oracle)
    config: str | None = None
    data_files: Any = None


CASES = [
    Case("split-naming", "org/split-naming", {"repo": "org/split-naming"}),
    Case("split-folders", "org/split-folders", {"repo": "org/split-folders"}),
    Case("yaml-en", "org/yaml-configs", {"repo": "org/yaml-configs", "name": "en"}, "en"),
    Case("yaml-fr", "org/yaml-configs", {"repo": "org/yaml-configs", "name": "fr"}, "fr"),
    Case("yaml-default", "org/yaml-configs", {"repo": "org/yaml-configs"}),
    Case("root-files", "org/root-files", {"repo": "org/root-files"}),
    Case("data-dirs", "org/data-dirs", {"repo": "org/data-dirs"}),
    Case("keywords", "org/keywords", {"repo": "org/keywords"}),
    Case("only-one", "org/only-one", {"repo": "org/only-one"}),
    Case("mixed", "org/mixed", {"repo": "org/mixed"}),
    Case("mixed-parquet", "org/mixed-parquet", {"repo": "org/mixed-parquet"}),
    Case("sharded-custom", "org/sharded-custom", {"repo": "org/sharded-custom"}),
    Case("training-folders", "org/training-folders", {"repo": "org/training-folders"}),
    Case("yaml-single", "org/yaml-list", {"repo": "org/yaml-list", "name": "single"}, "single"),
    Case("yaml-many", "org/yaml-list", {"repo": "org/yaml-list", "name": "many"}, "many"),
    Case("yaml-nested", "org/yaml-list", {"repo": "org/yaml-list", "name": "nested"}, "nested"),
    Case("yaml-list-default", "org/yaml-list", {"repo": "org/yaml-list"}),
    Case("standalone-yaml", "org/standalone-yaml", {"repo": "org/standalone-yaml"}),
    Case(
        "convert-parquet",
        "org/split-naming@refs%2Fconvert%2Fparquet",
        {"repo": "org/split-naming", "revision": "refs/convert/parquet"},
    ),
    Case(
        "data-files-dict",
        "org/split-naming",
        {"repo": "org/split-naming", "data_files": {"validation": "data/test-*.parquet"}},
        data_files={"validation": "data/test-*.parquet"},
    ),
    Case(
        "data-files-list",
        "org/yaml-configs",
        {"repo": "org/yaml-configs", "data_files": ["fr/*.parquet", "en/test.parquet"]},
        data_files=["fr/*.parquet", "en/test.parquet"],
    ),
    Case(
        "data-files-split-dicts",
        "org/split-naming",
        {
            "repo": "org/split-naming",
            "data_files": [
                {"split": "a", "path": "data/test-*"},
                {"split": "b", "path": ["data/train-00001-of-00002.parquet"]},
            ],
        },
        data_files=[
            {"split": "a", "path": "data/test-*"},
            {"split": "b", "path": ["data/train-00001-of-00002.parquet"]},
        ],
    ),
    Case("data-dir", "org/data-dirs/data", {"repo": "org/data-dirs", "data_dir": "data"}),
    Case(
        "glob",
        "org/split-naming/data/*.parquet",
        {"repo": "parquet", "data_files": "hf://datasets/org/split-naming/data/*.parquet"},
    ),
    Case(
        "glob-recursive",
        "org/yaml-configs/**/*.parquet",
        {"repo": "parquet", "data_files": "hf://datasets/org/yaml-configs/**/*.parquet"},
    ),
    Case(
        "one-file",
        "org/split-folders/test/part-0.parquet",
        {"repo": "parquet", "data_files": "hf://datasets/org/split-folders/test/part-0.parquet"},
    ),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubServer, dict[str, Any]]]:
    """Every layout on one server, and datasets' choice for each case (one subprocess)."""
    tmp = tmp_path_factory.mktemp("resolver-layouts")
    root = tmp / "hub"
    root.mkdir()
    parquet = tmp / "one.parquet"
    make_text_parquet(parquet, rows=3, min_text=5, max_text=10)
    _build_layouts(root, parquet)
    specs = [{"id": case.id, **case.oracle} for case in CASES]
    with HubServer(root) as hub:
        yield hub, _run("datasets", hub, tmp, json.dumps(specs))


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
async def test_picks_the_files_datasets_picks(
    case: Case, world: tuple[HubServer, dict[str, Any]], tmp_path: Path
) -> None:
    hub, oracle = world
    expected = oracle[case.id]
    assert "splits" in expected, expected
    want: dict[str, list[str]] = expected["splits"]
    source = f"hf://datasets/{case.source}"
    async with Resolver(options=_options(tmp_path)) as resolver:
        everything = await resolver.resolve(
            source, config=case.config, data_files=case.data_files, endpoint=hub.endpoint
        )
        assert _by_split(everything) == want
        assert list(everything.splits) == list(want)  # split order too
        assert dict(everything.splits) == {s: len(files) for s, files in want.items()}
        if case.oracle["repo"] != "parquet":
            assert everything.config == expected["config"]
        for split, paths in want.items():
            manifest = await resolver.resolve(
                source,
                config=case.config,
                split=split,
                data_files=case.data_files,
                endpoint=hub.endpoint,
            )
            assert [f.path for f in manifest.files] == paths
            assert manifest.split == split
            assert {f.split for f in manifest.files} == {split}
            assert manifest.commit is not None
            assert all(f"/resolve/{manifest.commit}/" in f.url for f in manifest.files)


@pytest.mark.anyio
async def test_file_refs_point_at_the_bytes(
    world: tuple[HubServer, dict[str, Any]], tmp_path: Path
) -> None:
    hub, _ = world
    async with Resolver(options=_options(tmp_path)) as resolver:
        manifest = await resolver.resolve(
            "hf://datasets/org/yaml-list", config="single", endpoint=hub.endpoint
        )
        main = await resolver.resolve(
            "hf://datasets/org/split-naming", split="train", endpoint=hub.endpoint
        )
        convert = await resolver.resolve(
            "hf://datasets/org/split-naming@refs/convert/parquet",
            split="train",
            endpoint=hub.endpoint,
        )
    assert manifest.repo_id == "org/yaml-list"
    assert manifest.endpoint == hub.endpoint
    assert manifest.configs == ("single", "many", "nested")
    assert manifest.format == "parquet"
    assert convert.commit != main.commit  # the ref is its own commit
    assert convert.files[0].url == (
        f"{hub.endpoint}/datasets/org/split-naming/resolve/{convert.commit}/default/train/0000.parquet"
    )
    async with httpx2.AsyncClient(follow_redirects=False) as client:
        for f in [*manifest.files, *convert.files]:
            head = await client.head(f.url)
            assert head.status_code == 302
            assert head.headers["X-Linked-Etag"].strip('"') == f.etag
            assert int(head.headers["X-Linked-Size"]) == f.size
            assert head.headers["X-Repo-Commit"] in (manifest.commit, convert.commit)


# -- request economy -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_thousand_files_cost_one_pin_and_the_tree_pages(
    root: Path, one_parquet: Path, parquet_size: int, tmp_path: Path
) -> None:
    files: dict[str, Any] = {f"data/part-{i:04d}.parquet": one_parquet for i in range(1000)}
    files["README.md"] = "# big\n\nNo YAML here.\n"
    make_repo(root, "org/big", files)
    entries = 1000 + 1 + 1  # the files, README.md and the data/ folder
    async with HubServer(root) as hub:
        async with Resolver(options=_options(tmp_path)) as first:
            manifest = await first.resolve("hf://datasets/org/big", endpoint=hub.endpoint)
            stats = hub.stats()
            assert stats.by_endpoint == {"dataset_info": 1, "tree": math.ceil(entries / 1000)}
            assert stats.by_bucket == {"api": 1 + math.ceil(entries / 1000)}
            assert first.statistics().api_requests == 3
            assert first.statistics().resolver_requests == 0
        assert [f.path for f in manifest.files] == sorted(p for p in files if p.startswith("data/"))
        assert manifest.split == "train"
        assert manifest.splits == {"train": 1000}
        assert all(f.size == parquet_size for f in manifest.files)
        assert len({f.etag for f in manifest.files}) == 1  # copies of one file: one sha256

        # A second Resolver (as a second process would) reads the on-disk cache.
        hub.reset_stats()
        async with Resolver(options=_options(tmp_path)) as second:
            again = await second.resolve("hf://datasets/org/big", endpoint=hub.endpoint)
            pinned = await second.resolve(
                f"hf://datasets/org/big@{manifest.commit}", endpoint=hub.endpoint
            )
            stats2 = second.statistics()
        assert hub.stats().requests == 0
        assert again == manifest
        assert pinned == manifest
        assert stats2.api_requests == 0
        assert stats2.disk_hits == 2  # the pin of main, the manifest
        assert stats2.memory_hits == 1  # the sha-pinned manifest is the same entry


@pytest.mark.anyio
async def test_a_second_process_reads_the_cache(root: Path, tmp_path: Path) -> None:
    make_repo_split_naming(root)
    async with HubServer(root) as hub:
        async with Resolver(options=_options(tmp_path)) as resolver:
            train = await resolver.resolve(
                "hf://datasets/org/split-naming", split="train", endpoint=hub.endpoint
            )
        hub.reset_stats()
        specs = [
            {"id": "train", "source": "hf://datasets/org/split-naming", "split": "train"},
            {"id": "pinned", "source": f"hf://datasets/org/split-naming@{train.commit}",
             "split": "train"},
        ]  # fmt: skip
        child = await anyio.to_thread.run_sync(
            lambda: _run("resolve", hub, tmp_path, json.dumps(specs), str(tmp_path / "cache"))
        )
        assert hub.stats().requests == 0
    assert Manifest.from_json(child["manifests"]["train"]) == train
    assert Manifest.from_json(child["manifests"]["pinned"]) == train
    assert child["statistics"]["api_requests"] == 0
    assert child["statistics"]["disk_hits"] == 2


@pytest.mark.anyio
async def test_processes_starting_together_make_one_resolution(root: Path, tmp_path: Path) -> None:
    make_repo_split_naming(root)
    specs = json.dumps([{"id": "m", "source": "hf://datasets/org/split-naming", "split": "train"}])
    children: list[Any] = []
    async with HubServer(root, faults=Faults(latency_ms=300, targets=())) as hub:

        async def child() -> None:
            children.append(
                await anyio.to_thread.run_sync(
                    lambda: _run("resolve", hub, tmp_path, specs, str(tmp_path / "cache"))
                )
            )

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(child)
        stats = hub.stats()
    assert stats.by_endpoint == {"dataset_info": 1, "tree": 1}  # one machine, one resolution
    manifests = [Manifest.from_json(c["manifests"]["m"]) for c in children]
    assert all(m == manifests[0] for m in manifests)
    assert sum(c["statistics"]["api_requests"] for c in children) == 2


@pytest.mark.anyio
async def test_32_concurrent_resolves_make_one_resolution(root: Path, tmp_path: Path) -> None:
    make_repo_split_naming(root)
    results: list[Manifest] = []
    async with (
        HubServer(root, faults=Faults(latency_ms=20, targets=())) as hub,
        Resolver(options=_options(tmp_path)) as resolver,
    ):

        async def one() -> None:
            results.append(
                await resolver.resolve(
                    "hf://datasets/org/split-naming", split="test", endpoint=hub.endpoint
                )
            )

        async with anyio.create_task_group() as tg:
            for _ in range(32):
                tg.start_soon(one)
        stats = hub.stats()
    assert len(results) == 32
    assert all(m == results[0] for m in results)
    assert [f.path for f in results[0].files] == ["data/test-00000-of-00001.parquet"]
    assert stats.by_endpoint == {"dataset_info": 1, "tree": 1}
    s = resolver.statistics()
    assert s.resolutions == 1
    assert s.coalesced_waits == 31
    assert s.api_requests == 2


@pytest.mark.anyio
async def test_concurrent_callers_share_an_error(root: Path, tmp_path: Path) -> None:
    errors: list[Exception] = []
    # 20 ms per answer, as for the 32 callers above: the first request is still in flight
    # when the last caller joins (without it, a loaded machine let the first error land
    # before the eighth caller reached the resolver, which then asked again).
    async with (
        HubServer(root, faults=Faults(latency_ms=20, targets=())) as hub,
        Resolver(options=_options(tmp_path)) as resolver,
    ):

        async def one() -> None:
            try:
                await resolver.resolve("hf://datasets/org/missing", endpoint=hub.endpoint)
            except RepoNotFoundError as exc:
                errors.append(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(one)
        assert hub.stats().requests == 1
    assert len(errors) == 8
    assert resolver.statistics().coalesced_waits == 7


class _StallFirst(httpx2.AsyncBaseTransport):
    """Passes requests to the network, except the first: that one waits until cancelled."""

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.stalled = anyio.Event()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if not self.stalled.is_set():
            self.stalled.set()
            await anyio.sleep_forever()
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.anyio
async def test_a_cancelled_resolution_is_taken_over_by_a_waiter(root: Path, tmp_path: Path) -> None:
    make_repo_split_naming(root)
    got: list[Manifest] = []
    transport = _StallFirst()
    async with (
        HubServer(root) as hub,
        HubClient(transport=transport) as client,
        Resolver(options=_options(tmp_path), client=client) as resolver,
    ):
        source = "hf://datasets/org/split-naming"
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                owner = anyio.CancelScope()

                async def first() -> None:
                    with owner:
                        await resolver.resolve(source, endpoint=hub.endpoint)

                async def second() -> None:
                    got.append(await resolver.resolve(source, endpoint=hub.endpoint))

                tg.start_soon(first)
                await transport.stalled.wait()  # the first call is waiting for the Hub
                tg.start_soon(second)
                while resolver.statistics().coalesced_waits == 0:  # the second waits for it
                    await wait_all_tasks_blocked()
                owner.cancel()
        assert owner.cancelled_caught
        assert hub.stats().by_bucket == {"api": 2}  # the second call's pin and tree
    assert _by_split(got[0]) == {
        "train": ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"],
        "test": ["data/test-00000-of-00001.parquet"],
    }
    stats = resolver.statistics()
    assert (stats.coalesced_waits, stats.resolutions, stats.api_requests) == (1, 1, 3)


@pytest.mark.anyio
async def test_a_branch_pin_lasts_pin_ttl(root: Path, one_parquet: Path, tmp_path: Path) -> None:
    repo = make_repo(root, "org/moving", {"data/train-0.parquet": one_parquet})
    async with HubServer(root) as hub:
        # pin_ttl=0: every resolve() pins main again, and sees a new commit.
        async with Resolver(options=_options(tmp_path, pin_ttl=0)) as resolver:
            before = await resolver.resolve("hf://datasets/org/moving", endpoint=hub.endpoint)
            make_repo(root, "org/moving", {"data/train-1.parquet": one_parquet})
            after = await resolver.resolve("hf://datasets/org/moving", endpoint=hub.endpoint)
            assert hub.stats().by_endpoint["dataset_info"] == 2
        assert before.commit != after.commit
        assert [f.path for f in after.files] == ["data/train-0.parquet", "data/train-1.parquet"]

        # Within pin_ttl a new Resolver on the same cache keeps the shared pin.
        (repo / "data" / "train-1.parquet").unlink()
        async with Resolver(options=_options(tmp_path / "shared")) as resolver:
            pinned = await resolver.resolve("hf://datasets/org/moving", endpoint=hub.endpoint)
        hub.reset_stats()
        make_repo(root, "org/moving", {"data/train-2.parquet": one_parquet})
        async with Resolver(options=_options(tmp_path / "shared")) as resolver:
            same = await resolver.resolve("hf://datasets/org/moving", endpoint=hub.endpoint)
        assert hub.stats().requests == 0
        assert same == pinned


# -- sources, data_files, revisions ---------------------------------------------------------


@pytest.mark.anyio
async def test_globs_files_and_data_files_errors(root: Path, tmp_path: Path) -> None:
    make_repo_split_naming(root)
    async with HubServer(root) as hub, Resolver(options=_options(tmp_path)) as resolver:
        kw: dict[str, Any] = {"endpoint": hub.endpoint}
        glob = await resolver.resolve("hf://datasets/org/split-naming/data/train-*", **kw)
        assert [f.path for f in glob.files] == [
            "data/train-00000-of-00002.parquet",
            "data/train-00001-of-00002.parquet",
        ]
        assert glob.splits == {"train": 2}
        listed = await resolver.resolve(
            [
                "hf://datasets/org/split-naming/data/test-00000-of-00001.parquet",
                "hf://datasets/org/split-naming/data/train-0000{0,1}-of-00002.parquet",
            ],
            **kw,
        )
        assert [f.path for f in listed.files] == [
            "data/test-00000-of-00001.parquet",
            "data/train-00000-of-00002.parquet",
            "data/train-00001-of-00002.parquet",
        ]
        assert listed.repo_id == "org/split-naming"
        assert listed.splits == {"train": 3}

        with pytest.raises(EntryNotFoundError, match=r"'data/\*\.json'"):
            await resolver.resolve("hf://datasets/org/split-naming/data/*.json", **kw)
        with pytest.raises(EntryNotFoundError, match=r"'nope/\*\.parquet'"):
            await resolver.resolve("hf://datasets/org/split-naming/nope/*.parquet", **kw)
        with pytest.raises(EntryNotFoundError, match=r"'data/missing\.parquet'"):
            await resolver.resolve("hf://datasets/org/split-naming/data/missing.parquet", **kw)
        with pytest.raises(EntryNotFoundError, match=r"'data/\*\.csv'"):
            await resolver.resolve(
                "hf://datasets/org/split-naming", data_files={"train": "data/*.csv"}, **kw
            )
        with pytest.raises(EntryNotFoundError, match=r"'data/exact\.parquet'"):
            await resolver.resolve(
                "hf://datasets/org/split-naming", data_files="data/exact.parquet", **kw
            )
        with pytest.raises(SplitNotFoundError, match="no split 'test' in .*: splits are train"):
            await resolver.resolve("hf://datasets/org/split-naming/data/*", split="test", **kw)
        with pytest.raises(SourceError, match="data_files"):
            await resolver.resolve("hf://datasets/org/split-naming/data/*", data_files="x", **kw)
        with pytest.raises(SourceError, match="data_files"):
            await resolver.resolve("hf://datasets/org/split-naming", data_files={"train": 3}, **kw)
        with pytest.raises(SourceError, match="whole path segment"):
            await resolver.resolve("hf://datasets/org/split-naming", data_files="**.parquet", **kw)


@pytest.mark.anyio
async def test_a_sha_pinned_repo_reads_its_yaml_from_readme(root: Path, tmp_path: Path) -> None:
    make_repo_yaml_configs(root)
    async with HubServer(root) as hub:
        async with httpx2.AsyncClient() as client:
            info = await client.get(f"{hub.endpoint}/api/datasets/org/yaml-configs")
        sha = info.json()["sha"]
        hub.reset_stats()
        async with Resolver(options=_options(tmp_path)) as resolver:
            fr = await resolver.resolve(
                f"hf://datasets/org/yaml-configs@{sha}", config="fr", endpoint=hub.endpoint
            )
            en = await resolver.resolve(
                f"hf://datasets/org/yaml-configs@{sha}", split="test", endpoint=hub.endpoint
            )
        stats = hub.stats()
    assert [f.path for f in fr.files] == ["fr/a.parquet", "fr/b.parquet"]
    assert (en.config, [f.path for f in en.files]) == ("en", ["en/test.parquet"])
    assert fr.commit == sha
    # no pin request; one tree listing and README.md once, shared by both calls
    assert stats.by_endpoint == {"tree": 1, "resolve": 1}


@pytest.mark.anyio
async def test_plain_files_and_urls(tmp_path: Path, one_parquet: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(3):
        (shards / f"s-{i}.tar").write_bytes(b"x" * (i + 1))
    async with Resolver(options=_options(tmp_path)) as resolver:
        local = await resolver.resolve(str(shards / "s-*.tar"))
        assert [f.path for f in local.files] == [str(shards / f"s-{i}.tar") for i in range(3)]
        assert [f.size for f in local.files] == [1, 2, 3]
        assert local.files[0].url == (shards / "s-0.tar").as_uri()
        assert (local.split, local.splits, local.format) == ("train", {"train": 3}, "webdataset")
        urls = await resolver.resolve("https://example.com/d/shard-{000..002}.tar", split="train")
        assert [f.url for f in urls.files] == [
            f"https://example.com/d/shard-{i:03d}.tar" for i in range(3)
        ]
        assert all(f.size is None and f.split == "train" for f in urls.files)
        mixed = await resolver.resolve([one_parquet, "https://example.com/x.tar"])
        assert mixed.format is None
        assert [f.path for f in mixed.files] == [str(one_parquet), "https://example.com/x.tar"]
        with pytest.raises(SplitNotFoundError, match="no split 'test' in .*'train'"):
            await resolver.resolve(one_parquet, split="test")
        with pytest.raises(ConfigNotFoundError, match="no config 'en'"):
            await resolver.resolve(one_parquet, config="en")
        with pytest.raises(SourceError, match="data_files= applies to Hub repos"):
            await resolver.resolve(one_parquet, data_files="*.parquet")
        assert resolver.statistics().api_requests == 0


# -- tokens ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_tokens_from_argument_env_and_stored_login(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_repo_split_naming(root, "org/private")
    source = "hf://datasets/org/private"
    async with HubServer(root, private={"org/private": ["tok"]}) as hub:
        kw: dict[str, Any] = {"endpoint": hub.endpoint}

        def fresh(name: str) -> Resolver:
            return Resolver(options=_options(tmp_path / name))

        async with fresh("none") as r:
            with pytest.raises(RepoNotFoundError, match="'org/private'.*private.*token"):
                await r.resolve(source, **kw)
        async with fresh("wrong") as r:
            with pytest.raises(RepoNotFoundError, match="'org/private'"):
                await r.resolve(source, token="wrong", **kw)
        async with fresh("arg") as r:
            assert len((await r.resolve(source, token="tok", **kw)).files) == 3

        monkeypatch.setenv("HF_TOKEN", "tok")
        # conftest disables implicit tokens, as huggingface_hub's HF_HUB_DISABLE_IMPLICIT_TOKEN
        async with fresh("env-disabled") as r:
            with pytest.raises(RepoNotFoundError):
                await r.resolve(source, **kw)
        monkeypatch.delenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", raising=False)
        async with fresh("env") as r:
            assert len((await r.resolve(source, **kw)).files) == 3
        async with fresh("false") as r:
            with pytest.raises(RepoNotFoundError):
                await r.resolve(source, token=False, **kw)

        monkeypatch.delenv("HF_TOKEN")
        # The login `hf auth login` stored: HF_HOME's token file, read when resolving.
        monkeypatch.delenv("HF_TOKEN_PATH", raising=False)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        (tmp_path / "hf-home").mkdir()
        (tmp_path / "hf-home" / "token").write_text("tok\n")
        async with fresh("stored") as r:
            assert len((await r.resolve(source, **kw)).files) == 3


@pytest.mark.anyio
async def test_gated_repo_needs_a_token_with_access(root: Path, tmp_path: Path) -> None:
    make_repo_split_naming(root, "org/gated")
    async with HubServer(root, gated={"org/gated": ["tok"]}) as hub:
        async with Resolver(options=_options(tmp_path / "a")) as r:
            with pytest.raises(GatedRepoError, match="'org/gated' is gated.*request access"):
                await r.resolve("hf://datasets/org/gated", endpoint=hub.endpoint, token=False)
        async with Resolver(options=_options(tmp_path / "b")) as r:
            manifest = await r.resolve(
                "hf://datasets/org/gated", endpoint=hub.endpoint, token="tok"
            )
            assert r.statistics().resolver_requests == 1  # the access check
    assert len(manifest.files) == 3


@pytest.mark.anyio
async def test_hf_endpoint_is_read_at_call_time(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_repo_split_naming(root)
    async with HubServer(root) as hub, Resolver(options=_options(tmp_path)) as resolver:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint + "/")
        manifest = await resolver.resolve("hf://datasets/org/split-naming", split="test")
    assert manifest.endpoint == hub.endpoint
    assert manifest.files[0].url.startswith(f"{hub.endpoint}/datasets/org/split-naming/resolve/")


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_error_messages_name_the_input(root: Path, one_parquet: Path, tmp_path: Path) -> None:
    make_repo_split_naming(root)
    make_repo_yaml_configs(root)
    make_repo(root, "org/empty", {"README.md": "# nothing\n"})
    make_repo(root, "org/jsonl", {"train.jsonl": "{}\n"})
    two_defaults = (
        "---\nconfigs:\n"
        "- config_name: a\n  default: true\n  data_files: a/*\n"
        "- config_name: b\n  default: true\n  data_files: b/*\n"
        "---\n"
    )
    no_default = two_defaults.replace("  default: true\n", "")
    make_repo(root, "org/two-defaults", {"README.md": two_defaults, "a/x.parquet": one_parquet})
    make_repo(root, "org/no-default", {"README.md": no_default, "a/x.parquet": one_parquet})
    make_repo(root, "org/formats", {"train.parquet": one_parquet, "test.tar": b"t" * 10})
    async with HubServer(root) as hub, Resolver(options=_options(tmp_path)) as resolver:

        async def resolve(source: str, **kw: Any) -> Manifest:
            return await resolver.resolve(f"hf://datasets/{source}", endpoint=hub.endpoint, **kw)

        with pytest.raises(RepoNotFoundError, match="'org/missing' not found.*private.*token"):
            await resolve("org/missing")
        with pytest.raises(RevisionNotFoundError, match="revision 'nope' not found in .*org/"):
            await resolve("org/split-naming@nope")
        with pytest.raises(RevisionNotFoundError, match="revision '0{40}'"):
            await resolve(f"org/split-naming@{'0' * 40}")
        with pytest.raises(
            ConfigNotFoundError, match="no config 'de' in org/yaml-configs: configs are en, fr"
        ):
            await resolve("org/yaml-configs", config="de")
        with pytest.raises(ConfigNotFoundError, match="configs are default"):
            await resolve("org/split-naming", config="en")
        with pytest.raises(
            SplitNotFoundError,
            match=r"^no split 'tain' in org/split-naming: splits are test, train$",
        ):
            await resolve("org/split-naming", split="tain")
        with pytest.raises(SplitNotFoundError, match=r"\(config 'fr'\): splits are train$"):
            await resolve("org/yaml-configs", config="fr", split="test")
        with pytest.raises(ConfigNotFoundError, match="none is the default.*a, b"):
            await resolve("org/no-default")
        assert [f.path for f in (await resolve("org/no-default", config="a")).files] == [
            "a/x.parquet"
        ]
        with pytest.raises(ResolutionError, match="several default configs: 'a' and 'b'"):
            await resolve("org/two-defaults")
        with pytest.raises(ResolutionError, match="no data files in org/empty@main"):
            await resolve("org/empty")
        with pytest.raises(
            ResolutionError, match=r"no data files that aiostream-hf streams .* has train.jsonl"
        ):
            await resolve("org/jsonl")
        with pytest.raises(ResolutionError, match=r"different formats \(train: parquet, test: web"):
            await resolve("org/formats")
        with pytest.raises(SourceError, match="endpoint"):
            await resolver.resolve("hf://datasets/org/x", endpoint="localhost:1")


@pytest.mark.anyio
async def test_http_failures_are_retried_then_reported(root: Path, tmp_path: Path) -> None:
    make_repo_split_naming(root)
    options = _options(tmp_path, max_retries=2, backoff_base=0.001, pin_ttl=0)
    faults = Faults(error_at=(1,), targets=("api",))
    async with HubServer(root, faults=faults) as hub, Resolver(options=options) as resolver:
        manifest = await resolver.resolve("hf://datasets/org/split-naming", endpoint=hub.endpoint)
        assert len(manifest.files) == 3
        assert resolver.statistics().retries == 1

        hub.set_faults(Faults(error_every=1, targets=("api",)))
        hub.reset_stats()
        url = f"{hub.endpoint}/api/datasets/org/split-naming/revision/main"
        with pytest.raises(ResolutionError, match=rf"GET {re.escape(url)}.* 503 after 3 attempts"):
            await resolver.resolve("hf://datasets/org/split-naming", endpoint=hub.endpoint)
        assert hub.stats().by_endpoint == {"injected_error": 3}


@pytest.mark.anyio
async def test_the_rate_limit_window_is_waited_out_before_a_429(root: Path, tmp_path: Path) -> None:
    """The server allows 1 API request a second and says so (RateLimit: r=0): the
    client pauses the host until the window resets, so the second request is not
    refused (before the one client, the resolver ignored RateLimit and took a 429)."""
    make_repo_split_naming(root)
    limits = RateLimits(api=1, window_s=1)
    async with (
        HubServer(root, rate_limits=limits) as hub,
        Resolver(options=_options(tmp_path)) as resolver,
    ):
        manifest = await resolver.resolve("hf://datasets/org/split-naming", endpoint=hub.endpoint)
        stats = hub.stats()
    assert len(manifest.files) == 3
    assert stats.by_bucket == {"api": 2}
    assert stats.throttled == 0
    assert resolver.statistics().retries == 0


@pytest.mark.anyio
async def test_a_429_is_waited_out_for_its_retry_after(root: Path, tmp_path: Path) -> None:
    """A server that refuses without warning: the 429's Retry-After pauses the host."""
    make_repo_split_naming(root)
    limits = RateLimits(api=1, window_s=1)
    async with (
        HubServer(root, rate_limits=limits) as hub,
        Resolver(options=_options(tmp_path)) as r,
    ):
        # Another client used the window up: this one has not seen its RateLimit header.
        async with httpx2.AsyncClient() as other:
            await other.get(f"{hub.endpoint}/api/datasets/org/split-naming")
        manifest = await r.resolve("hf://datasets/org/split-naming", endpoint=hub.endpoint)
        stats = hub.stats()
    assert len(manifest.files) == 3
    assert stats.throttled == 1
    assert r.statistics().retries == 1


# -- the cache, the manifest, the lifecycle --------------------------------------------------


@pytest.mark.anyio
async def test_unreadable_cache_entries_are_ignored(root: Path, tmp_path: Path) -> None:
    make_repo_split_naming(root)
    async with HubServer(root) as hub:
        async with Resolver(options=_options(tmp_path)) as resolver:
            first = await resolver.resolve("hf://datasets/org/split-naming", endpoint=hub.endpoint)
        entries = sorted((tmp_path / "cache" / "resolutions").glob("*.json"))
        assert [p.name.split("-")[0] for p in entries] == ["manifest", "pin"]
        for path in entries:
            path.write_text("{not json")
        async with Resolver(options=_options(tmp_path)) as resolver:
            second = await resolver.resolve("hf://datasets/org/split-naming", endpoint=hub.endpoint)
            assert resolver.statistics().disk_hits == 0
    assert second == first
    assert json.loads(entries[0].read_text())["value"] == first.to_json()


def test_manifest_pickles_and_round_trips_through_json() -> None:
    manifest = Manifest(
        files=(
            FileRef("https://h/a.parquet", "a.parquet", 10, "e1", "train"),
            FileRef("https://h/b.parquet", "b.parquet", None, None, None),
        ),
        repo_id="org/name",
        commit="a" * 40,
        endpoint="https://h",
        config="default",
        split=None,
        configs=("default",),
        splits={"train": 1, "test": 1},
        format="parquet",
    )
    assert pickle.loads(pickle.dumps(manifest)) == manifest
    assert Manifest.from_json(json.loads(json.dumps(manifest.to_json()))) == manifest
    with pytest.raises(ValueError, match="version"):
        Manifest.from_json({**manifest.to_json(), "version": 99})


@pytest.mark.anyio
async def test_closed_resolver_refuses_work_and_a_given_client_stays_open(
    tmp_path: Path, one_parquet: Path
) -> None:
    async with HubClient() as client:
        async with Resolver(options=_options(tmp_path), client=client) as resolver:
            await resolver.resolve(one_parquet)
        assert not client.closed
        with pytest.raises(ClosedResourceError, match="closed"):
            await resolver.resolve(one_parquet)


@pytest.mark.parametrize(
    "pattern",
    [
        "**",
        "*",
        "data/*.parquet",
        "**/*.parquet",
        "data/**",
        "a/**/b/*.tar",
        "data/train-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*",
        "**/train[-._ 0-9]*",
        "**/*[-._ 0-9]validation[-._ 0-9]*/**",
        "x?y[!ab]z[]]q",
        "[!]",
        "[]",
        "open[bracket",
        "a[z-a]b",
        "a[^x]b",
        "dots.and+plus(paren)",
        "a[b-d-f]c",
    ],
)
def test_globs_match_like_fsspec(pattern: str) -> None:
    regex = re.compile(fsspec.utils.glob_translate(pattern))
    keys = [
        *("", "a", "ab", "a/b", "a//b", "/a", "a/", "x/a/b/c/b/y.tar", "a/b/z.tar", "a]b"),
        *("[!]", "[]", "open[bracket", "dots.and+plus(paren)", "a^b", "aeb", "a-c", "xqyczq"),
        *("data/x.parquet", "data/a/b.parquet", "data/train-00001-of-00002-x.parquet"),
        *("x/train.json", "x/train-0", "x/my-validation-1/y", "data/", "data/a/b", "abc"),
    ]
    assert [bool(Glob(pattern).match(k)) for k in keys] == [bool(regex.match(k)) for k in keys]


_ATOMS = ["a", "b", "-", ".", "*", "?", "[ab]", "[a-b]", "[-.]", "[]a]", "[]", "a[", "[z-a]"]


def _random_glob(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.15:
            parts.append("**")
        elif r < 0.25:
            parts.append("*")
        else:
            parts.append("".join(rng.choice(_ATOMS) for _ in range(rng.randint(0, 4))))
    return "/".join(parts)


def _random_path(rng: random.Random) -> str:
    segments = ("".join(rng.choice("ab-.[") for _ in range(rng.randint(0, 4))) for _ in range(5))
    return "/".join(list(segments)[: rng.randint(1, 5)])


def test_random_globs_match_as_fsspec_s_regex() -> None:
    """The matcher against the regex globs were matched with before (fsspec's), on
    random patterns and paths (empty segments, stars, classes, '**' anywhere)."""
    rng = random.Random(31)
    compared = 0
    for _ in range(3000):
        pattern = _random_glob(rng)
        if any("**" in part and part != "**" for part in pattern.split("/")):
            with pytest.raises(SourceError, match="must be a whole path segment"):
                Glob(pattern)
            continue
        glob, regex = Glob(pattern), re.compile(fsspec.utils.glob_translate(pattern))
        for path in (_random_path(rng) for _ in range(20)):
            assert glob.match(path) == bool(regex.match(path)), (pattern, path)
            compared += 1
    assert compared > 30_000


def test_a_class_never_matches_a_slash() -> None:
    """The one difference with fsspec's regex: '[!a]' matches any character but '/'."""
    assert Glob("x[!a]y").match("xby")
    assert not Glob("x[!a]y").match("x/y")
    assert re.match(fsspec.utils.glob_translate("x[!a]y"), "x/y")


def test_a_glob_that_backtracks_as_a_regex_matches_long_keys() -> None:
    """'*-*-*-*' over keys of 1,000 '-': a backtracking regex tries every way to place
    its stars (hours for these keys); the matcher takes the earliest place of each piece."""
    keys = [f"data/{'-' * 1000}{i}.txt" for i in range(100)] + [f"data/{'-' * 1000}.parquet"]
    glob = Glob("data/*-*-*-*.parquet")
    assert [k for k in keys if glob.match(k)] == [f"data/{'-' * 1000}.parquet"]
    assert Glob("**/*-*-*/**/*-*-*.txt").match(f"{'--/' * 300}{'-' * 1000}.txt")
