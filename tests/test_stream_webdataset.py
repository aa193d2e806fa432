"""WebDataset shards through stream(), the gopen integration and the DataPipeline source.

Every comparison is against ``webdataset.WebDataset`` reading the same shards
from local disk (keys and bytes; ``__url__`` differs where the URL does). The
network is the real local Hub server over loopback.
"""

from __future__ import annotations

import gc
import importlib
import io
import json
import logging
import pickle
import re
import tarfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
import webdataset as wds

import aiostream_hf as ash
import aiostream_hf.webdataset as ashwds
from aiostream_hf.formats.webdataset import SampleGrouper, TarReader
from aiostream_hf.testing import Faults, HubServer, make_repo, make_webdataset_shards

pytestmark = pytest.mark.anyio

Sample = dict[str, Any]
SHARDS = 4
PER_SHARD = 30
FAST = dict(backoff_base=0.001, backoff_max=0.01)


def _options(tmp_path: Path, **kw: Any) -> ash.StreamOptions:
    # Odd small blocks: samples and headers straddle blocks all the time.
    return ash.StreamOptions(cache_dir=tmp_path / "cache", **{"block_size": 7001, **FAST, **kw})


def reference(urls: str | Sequence[str], decode: str | None = None) -> list[Sample]:
    """What webdataset.WebDataset yields from local files, without ``__local_path__``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset 1.0.2 leaks file handles
        dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        if decode is not None:
            dataset = dataset.decode(decode)
        try:
            samples = list(dataset)
        finally:
            del dataset
            gc.collect()
    for sample in samples:
        sample.pop("__local_path__", None)
    return samples


def content(samples: Sequence[Sample]) -> list[tuple[str, list[tuple[str, Any]]]]:
    """Keys and members, without ``__url__`` (which names where each side read from)."""
    return [
        (s["__key__"], sorted((k, v) for k, v in s.items() if not k.startswith("__")))
        for s in samples
    ]


def braces(hub: HubServer, repo: str, pattern: str) -> str:
    return hub.url(repo, pattern).replace("%7B", "{").replace("%7D", "}")


async def collect(s: ash.Stream, k: int | None = None) -> list[Any]:
    out = []
    async for item in s:
        out.append(item)
        if k is not None and len(out) == k:
            break
    return out


def sample_spans(path: Path) -> list[tuple[int, int]]:
    """(start, end) TAR offsets of each sample of an uncompressed shard."""
    reader, grouper = TarReader(str(path)), SampleGrouper(str(path))
    spans: list[tuple[int, int]] = []
    start = None
    for member in reader.feed(path.read_bytes()):
        if start is None:
            start = member.offset
        if grouper.push(member) is not None:
            spans.append((spans[-1][1] if spans else 0, grouper.last_end))
    reader.close()
    if grouper.flush() is not None:
        spans.append((spans[-1][1] if spans else 0, grouper.last_end))
    return spans


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp("hub")
    repo = make_repo(r, "org/wds", {"README.md": "# shards\n"})
    make_webdataset_shards(repo / "data", shards=SHARDS, samples_per_shard=PER_SHARD, seed=1)
    gz = make_repo(r, "org/gz", {})
    for i, path in enumerate(sorted((repo / "data").glob("*.tar"))):
        with tarfile.open(path) as src, tarfile.open(gz / f"train-{i:06d}.tar.gz", "w:gz") as dst:
            for info in src:
                dst.addfile(info, src.extractfile(info))
    return r


@pytest.fixture(scope="module")
def shard_paths(root: Path) -> list[Path]:
    return sorted((root / "datasets/org/wds/data").glob("*.tar"))


@pytest.fixture(scope="module")
def expected(shard_paths: list[Path]) -> list[Sample]:
    return reference([str(p) for p in shard_paths])


@pytest.fixture
def hub(root: Path) -> Iterator[HubServer]:
    with HubServer(root, lfs_threshold=1) as server:  # every shard through the CDN
        yield server


# -- samples equal webdataset's ------------------------------------------------------------


async def test_hf_http_and_local_sources_equal_webdataset(
    hub: HubServer, tmp_path: Path, shard_paths: list[Path], expected: list[Sample]
) -> None:
    assert len(expected) == SHARDS * PER_SHARD
    opts = _options(tmp_path)
    async with ash.stream("hf://datasets/org/wds", endpoint=hub.endpoint, options=opts) as s:
        got = await collect(s)
        stats = s.statistics()
    assert content(got) == content(expected)
    assert stats.fetcher["requests"]["stream"] == SHARDS  # one long GET per shard
    assert stats.fetcher["requests"]["range"] == 0
    assert stats.samples == len(expected)

    url = braces(hub, "org/wds", "data/train-{000000..000003}.tar")
    async with ashwds.stream(url, options=opts) as s:
        got = await collect(s)
    assert content(got) == content(expected)
    assert [g["__url__"] for g in got] == [
        hub.url("org/wds", f"data/train-{i // PER_SHARD:06d}.tar") for i in range(len(got))
    ]

    async with ashwds.stream([str(p) for p in shard_paths], options=opts) as s:
        assert content(await collect(s)) == content(expected)


def _mixed(tar: tarfile.TarFile) -> None:
    """Long names, directories, several dots, upper-case extensions, empty and meta members."""

    def add(name: str, data: bytes = b"", **attrs: Any) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = 1_700_000_000
        for key, value in attrs.items():
            setattr(info, key, value)
        tar.addfile(info, io.BytesIO(data) if info.isreg() else None)

    long_dir = "d" * 70 + "/" + "e" * 70
    add("images", type=tarfile.DIRTYPE)
    add("images/a.b.c.jpg", b"jpeg a" * 300)
    add("images/a.TXT", b"caption a")
    add("__meta__", b"meta")
    add("README", b"no dot")
    add("link.jpg", type=tarfile.SYMTYPE, linkname="images/a.b.c.jpg")
    add("b.jpg", b"")
    add("b.cls", b"7")
    add(f"{long_dir}/c.jpg", b"c" * 5000)
    add(f"{long_dir}/c.PNG", b"C" * 513)
    add("f" * 150 + ".jpg", b"long name")
    add("dir.with.dots/h.jpg", b"h")


@pytest.mark.parametrize(
    ("name", "mode", "fmt"),
    [
        ("gnu.tar", "w", tarfile.GNU_FORMAT),
        ("pax.tar", "w", tarfile.PAX_FORMAT),
        ("gnu.tar.gz", "w:gz", tarfile.GNU_FORMAT),
        ("pax.tgz", "w:gz", tarfile.PAX_FORMAT),
    ],
)
async def test_tarfile_variants_equal_webdataset(
    tmp_path: Path, name: str, mode: str, fmt: int
) -> None:
    root = tmp_path / "hub"
    repo = make_repo(root, "org/variants", {})
    with tarfile.open(repo / name, mode, format=fmt) as tar:  # type: ignore[call-overload]
        _mixed(tar)
    ref = reference(str(repo / name))
    assert len(ref) == 5
    with HubServer(root) as hub:
        async with ashwds.stream(hub.url("org/variants", name), options=_options(tmp_path)) as s:
            assert content(await collect(s)) == content(ref)


async def test_gopen_integration_reads_through_our_fetcher(
    hub: HubServer, tmp_path: Path, expected: list[Sample], shard_paths: list[Path]
) -> None:
    gopen = importlib.import_module("webdataset.gopen")  # webdataset.gopen is also a function
    curl = gopen.gopen_schemes["http"]
    ashwds.install_gopen(endpoint=hub.endpoint, options=_options(tmp_path))
    try:
        assert gopen.gopen_schemes["http"] is not curl
        url = braces(hub, "org/wds", "data/train-{000000..000003}.tar")
        got = reference(url)
        assert content(got) == content(expected)
        hf = "hf://datasets/org/wds/data/train-{000000..000003}.tar"
        assert content(reference(hf)) == content(expected)
        stats = hub.stats()
        assert stats.by_bucket["cdn"] == 2 * SHARDS  # one GET per shard, no curl retries

        decoded = list(
            wds.DataPipeline(
                ashwds.ShardSource(hf, endpoint=hub.endpoint, options=_options(tmp_path)),
                wds.to_tuple("__key__", "json", "cls"),
            )
        )
        assert decoded == [(s["__key__"], s["json"], s["cls"]) for s in expected]

        with ashwds.open_shard(hub.url("org/wds", "data/train-000001.tar")) as f:
            assert f.read(100) + f.read() == shard_paths[1].read_bytes()
    finally:
        ashwds.uninstall_gopen()
    assert gopen.gopen_schemes["http"] is curl


async def test_every_sample_exactly_once_under_cuts(
    root: Path, tmp_path: Path, expected: list[Sample]
) -> None:
    faults = Faults(cut_rate=0.02, cut_at=(1, 3), targets=("cdn",), seed=4)
    with HubServer(root, lfs_threshold=1, faults=faults) as hub:
        opts = _options(tmp_path, block_size=4096)
        async with ash.stream("hf://datasets/org/wds", endpoint=hub.endpoint, options=opts) as s:
            got = await collect(s)
            resumes = s.statistics().fetcher["resumes"]
        cuts = hub.stats().faults.get("cut", 0)
    assert content(got) == content(expected)
    assert cuts >= 2
    assert resumes >= 2


# -- resume --------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 17, PER_SHARD, PER_SHARD + 1, 3 * PER_SHARD - 1])
@pytest.mark.parametrize("mode", ["rows", "batches", "arrow"])
async def test_resume_continues_with_the_next_sample_and_refetches_nothing(
    root: Path, tmp_path: Path, shard_paths: list[Path], expected: list[Sample], k: int, mode: str
) -> None:
    kw: dict[str, Any] = {"rows": {}, "batches": {"batch_size": 1}, "arrow": {"output": "arrow"}}[
        mode
    ]

    def keys(items: list[Any]) -> list[str]:
        if mode == "rows":
            return [item["__key__"] for item in items]
        if mode == "batches":
            return [key for item in items for key in item["__key__"]]
        return [key for item in items for key in item.column("__key__").to_pylist()]

    def make(hub: HubServer) -> ash.Stream:
        url = braces(hub, "org/wds", "data/train-{000000..000003}.tar")
        # Blocks of several samples: a position is kept for each sample of a chunk.
        return ashwds.stream(url, options=_options(tmp_path, block_size=32 * 1024), **kw)

    with HubServer(root) as hub:
        async with make(hub) as first:
            head: list[str] = []
            async for item in first:
                head += keys([item])
                if len(head) >= k:
                    break
            state = json.loads(json.dumps(first.state_dict()))
    # A server of its own (the first one may still be sending the bytes read ahead), which
    # serves the shards directly: its bytes_served is the resumed run's shard bytes.
    with HubServer(root) as hub:
        async with make(hub) as second:
            second.load_state_dict(state)
            tail = keys(await collect(second))
        served = hub.stats().bytes_served
    assert head + tail == [s["__key__"] for s in expected]
    taken = len(head)
    shard, index = divmod(taken, PER_SHARD)
    sizes = [p.stat().st_size for p in shard_paths]
    spans = sample_spans(shard_paths[min(shard, SHARDS - 1)])
    start = spans[index][0] if shard < SHARDS else sizes[-1]
    remaining = sizes[shard] - start + sum(sizes[shard + 1 :]) if shard < SHARDS else 0
    largest = max(e - s for s, e in spans)
    assert remaining <= served <= remaining + largest


@pytest.mark.parametrize("k", [5, PER_SHARD + 3])
async def test_resume_of_gzip_shards_and_of_a_shuffled_stream(
    hub: HubServer, tmp_path: Path, k: int
) -> None:
    cases = [
        ("hf://datasets/org/gz", {}),
        ("hf://datasets/org/wds", {"shuffle": 20, "seed": 3}),
        ("hf://datasets/org/gz", {"shuffle": 7, "seed": 1}),
    ]
    for source, kw in cases:

        def make(source: str = source, kw: dict[str, Any] = kw) -> ash.Stream:
            return ashwds.stream(source, endpoint=hub.endpoint, options=_options(tmp_path), **kw)

        async with make() as s:
            full = [x["__key__"] for x in await collect(s)]
        async with make() as s:
            head = [x["__key__"] for x in await collect(s, k)]
            state = pickle.loads(pickle.dumps(s.state_dict()))  # the buffer holds bytes
        async with make() as s:
            s.load_state_dict(state)
            tail = [x["__key__"] for x in await collect(s)]
        assert head + tail == full, (source, kw)
        assert len(full) == SHARDS * PER_SHARD


# -- options -------------------------------------------------------------------------------


async def test_shuffle_resampled_and_rank_splits(
    hub: HubServer, tmp_path: Path, expected: list[Sample]
) -> None:
    src = "hf://datasets/org/wds"
    kw: dict[str, Any] = dict(endpoint=hub.endpoint, options=_options(tmp_path))
    all_keys = [s["__key__"] for s in expected]

    async def keys(take: int | None = None, **more: Any) -> list[str]:
        async with ashwds.stream(src, **kw, **more) as s:
            return [x["__key__"] for x in await collect(s, take)]

    a, b, c = (
        await keys(shuffle=10, seed=1),
        await keys(shuffle=10, seed=1),
        await keys(shuffle=10, seed=2),
    )
    assert a == b != c
    assert sorted(a) == sorted(all_keys)
    assert a != all_keys

    r1 = await keys(resampled=True, seed=5, take=150)
    r2 = await keys(resampled=True, seed=5, take=150)
    r3 = await keys(resampled=True, seed=6, take=150)
    assert r1 == r2 != r3
    assert len(r1) == 150
    assert set(r1) <= set(all_keys)
    assert len(set(r1)) < 150  # drawn with replacement: shards come again

    for world in (2, 3, 5):
        shares = [await keys(rank=r, world_size=world) for r in range(world)]
        assert sorted(sum(shares, [])) == sorted(all_keys)
        assert sum(len(share) for share in shares) == len(all_keys)


async def test_decode_rgb8_equals_webdataset(
    hub: HubServer, tmp_path: Path, shard_paths: list[Path]
) -> None:
    pytest.importorskip("PIL")
    import numpy as np

    ref = reference([str(p) for p in shard_paths[:2]], decode="rgb8")
    url = braces(hub, "org/wds", "data/train-{000000..000001}.tar")
    async with ashwds.stream(url, decode="rgb8", options=_options(tmp_path)) as s:
        got = await collect(s)
    assert [g["__key__"] for g in got] == [r["__key__"] for r in ref]
    for g, r in zip(got, ref, strict=True):
        assert isinstance(g["jpg"], np.ndarray)
        assert g["jpg"].dtype == np.uint8
        assert np.array_equal(g["jpg"], r["jpg"])
        assert g["json"] == r["json"]  # webdataset's default handlers come after ours
        assert g["cls"] == r["cls"]
    with pytest.raises(ash.SourceError, match="not an image spec"):
        ashwds.stream(url, decode="jpeg-please")
    with pytest.raises(ash.SourceError, match="output='arrow'"):
        ashwds.stream(url, decode="pil", output="arrow")


# -- columns: webdataset's to_tuple ------------------------------------------------------


@pytest.fixture
def optional_png(tmp_path: Path) -> Iterator[tuple[HubServer, str]]:
    """One shard whose middle sample alone has a png; the server and the shard's URL."""
    root = tmp_path / "hub"
    repo = make_repo(root, "org/optional", {})
    with (repo / "train-000000.tar").open("wb") as f, wds.TarWriter(f, encoder=False) as w:
        w.write({"__key__": "a", "jpg": b"A", "cls": b"0"})
        w.write({"__key__": "b", "jpg": b"B", "png": b"P", "cls": b"1"})
        w.write({"__key__": "c", "jpg": b"C", "cls": b"2"})
    with HubServer(root) as server:
        yield server, server.url("org/optional", "train-000000.tar")


async def test_a_missing_column_raises_naming_sample_shard_and_extensions(
    optional_png: tuple[HubServer, str], tmp_path: Path
) -> None:
    import pyarrow.compute as pc

    hub, url = optional_png
    opts = _options(tmp_path)
    # Every way in refuses a sample without a requested column, whatever on_error says
    # (it is a question of the request, not damage to skip).
    for s in (
        ashwds.stream(url, columns=["__key__", "png"], options=opts),
        ashwds.stream(url, columns=["png"], options=opts, on_error="warn"),
        ashwds.stream(url, columns=["png"], options=opts, output="arrow"),
        ash.stream("hf://datasets/org/optional", endpoint=hub.endpoint, columns=["png"]),
    ):
        with pytest.raises(ash.SourceError) as info:
            async with s:
                await collect(s)
        message = str(info.value)
        shard = url.replace("/resolve/main/", "/resolve/[0-9a-z]+/")  # hf:// pins the commit
        assert re.match(rf"{shard}: sample 'a' has no 'png' \(its extensions: ", message)
        assert sorted(message.split("extensions: ")[1].split(")")[0].split(", ")) == [
            "cls",
            "jpg",
        ]
        assert "missing_is_error=False" in message
        assert "filter=pyarrow.compute.field('png').is_valid()" in message

    # Optional columns: None where a sample lacks one, as to_tuple(missing_is_error=False).
    async with ashwds.stream(
        url, columns=["__key__", "png"], missing_is_error=False, options=opts
    ) as s:
        assert await collect(s) == [
            {"__key__": "a", "png": None},
            {"__key__": "b", "png": b"P"},
            {"__key__": "c", "png": None},
        ]
    # Or only the samples that have it: those a filter drops are not checked.
    only = pc.field("png").is_valid()
    async with ash.stream(url, columns=["__key__", "png"], filter=only, options=opts) as s:
        assert await collect(s) == [{"__key__": "b", "png": b"P"}]
    # Columns every sample has stream as before.
    async with ashwds.stream(url, columns=["__key__", "cls"], options=opts) as s:
        assert [row["cls"] for row in await collect(s)] == [b"0", b"1", b"2"]


async def test_memory_is_bounded_by_the_budget_not_by_shards(
    hub: HubServer, tmp_path: Path, shard_paths: list[Path], expected: list[Sample]
) -> None:
    budget = 32 * 1024
    opts = _options(tmp_path, block_size=16 * 1024, prefetch_bytes=budget)
    assert shard_paths[0].stat().st_size > 2 * budget
    async with ash.stream("hf://datasets/org/wds", endpoint=hub.endpoint, options=opts) as s:
        got = []
        async for x in s:
            got.append(x)
            await anyio.lowlevel.checkpoint()  # let the readahead run between samples
        stats = s.statistics()
    assert content(got) == content(expected)
    largest = max(e - s for p in shard_paths for s, e in sample_spans(p))
    assert stats.max_prefetched_bytes <= budget + 16 * 1024 + largest + 1024


# -- damaged shards ------------------------------------------------------------------------


@pytest.fixture
def damaged(tmp_path: Path, shard_paths: list[Path]) -> tuple[Path, int, int]:
    """A repo of 3 shards, the middle one cut mid-member; (root, cut, samples before it)."""
    root = tmp_path / "damaged"
    repo = make_repo(root, "org/damaged", {})
    data = [p.read_bytes() for p in shard_paths[:3]]
    spans = sample_spans(shard_paths[1])
    cut = spans[10][0] + 700  # inside sample 10's first member
    data[1] = data[1][:cut]
    for i, body in enumerate(data):
        (repo / f"train-{i:06d}.tar").write_bytes(body)
    return root, cut, 10


@pytest.mark.parametrize("policy", ["raise", "warn", "skip_shard"])
async def test_on_error_policies(
    tmp_path: Path,
    damaged: tuple[Path, int, int],
    expected: list[Sample],
    policy: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    root, cut, before = damaged
    with HubServer(root) as hub:
        url = braces(hub, "org/damaged", "train-{000000..000002}.tar")
        bad = hub.url("org/damaged", "train-000001.tar")
        s = ashwds.stream(url, on_error=policy, options=_options(tmp_path))  # type: ignore[arg-type]
        got: list[Sample] = []
        if policy == "raise":
            with pytest.raises(ash.DecodeError, match=rf"{bad}: truncated TAR shard.*offset \d+"):
                async with s:
                    async for x in s:
                        got.append(x)
            assert content(got) == content(expected[: PER_SHARD + before])
            return
        if policy == "warn":
            with pytest.warns(ashwds.SkippedShardWarning, match=rf"{bad}: skipping .* byte {cut}"):
                async with s:
                    got = await collect(s)
        else:
            with caplog.at_level(logging.WARNING, logger="aiostream_hf.webdataset"):
                async with s:
                    got = await collect(s)
            assert any(
                bad in r.getMessage() and "skipping" in r.getMessage() for r in caplog.records
            )
    # Sample 10, still being grouped when the damage came, is not delivered.
    kept = expected[: PER_SHARD + before] + expected[2 * PER_SHARD : 3 * PER_SHARD]
    assert content(got) == content(kept)


async def test_a_corrupt_header_names_shard_and_offset(
    tmp_path: Path, shard_paths: list[Path]
) -> None:
    root = tmp_path / "corrupt"
    repo = make_repo(root, "org/corrupt", {})
    data = bytearray(shard_paths[0].read_bytes())
    at = sample_spans(shard_paths[0])[3][1]  # the header of sample 4's first member
    data[at + 148 : at + 156] = b"0000000\0"  # a wrong checksum
    (repo / "train-000000.tar").write_bytes(bytes(data))
    with HubServer(root) as hub:
        url = hub.url("org/corrupt", "train-000000.tar")
        s = ashwds.stream(url, options=_options(tmp_path))
        got: list[Sample] = []
        with pytest.raises(ash.DecodeError, match=rf"{url}: corrupt TAR header at offset {at}"):
            async with s:
                async for x in s:
                    got.append(x)
    assert len(got) == 4  # sample 3, being grouped at the damage, too (as webdataset gives it)


# -- sync iteration and torch --------------------------------------------------------------


def test_sync_iteration(root: Path, tmp_path: Path, expected: list[Sample]) -> None:
    with HubServer(root) as hub:
        url = braces(hub, "org/wds", "data/train-{000000..000003}.tar")
        with ashwds.stream(url, options=_options(tmp_path)) as s:
            assert content(list(s)) == content(expected)
        with ashwds.stream(url, options=_options(tmp_path)) as s:
            for i, _ in enumerate(s):
                if i == 40:
                    break


@pytest.mark.torch
def test_torch_dataloader_workers_split_shards(
    root: Path, tmp_path: Path, expected: list[Sample]
) -> None:
    import torch.utils.data

    from aiostream_hf.torch import StreamDataset

    with HubServer(root) as hub:
        ds = StreamDataset(
            "hf://datasets/org/wds",
            endpoint=hub.endpoint,
            options=_options(tmp_path),
            format=ashwds.WebDatasetDecoder(),
            columns=["__key__", "cls"],
        )
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        keys = [sample["__key__"] for sample in loader]
    assert sorted(keys) == sorted(s["__key__"] for s in expected)
    assert len(keys) == len(expected)


async def test_an_unreadable_shard_follows_the_policy(hub: HubServer, tmp_path: Path) -> None:
    good = hub.url("org/wds", "data/train-000000.tar")
    missing = hub.url("org/wds", "data/train-000099.tar")
    opts = _options(tmp_path, max_retries=1)
    with pytest.raises(ash.FetchError, match="train-000099.tar"):
        async with ashwds.stream([good, missing], options=opts) as s:
            await collect(s)
    with pytest.warns(ashwds.SkippedShardWarning, match=rf"{missing}: skipping .* byte 0"):
        async with ashwds.stream([missing, good], options=opts, on_error="warn") as s:
            got = await collect(s)
    assert len(got) == PER_SHARD


class _TarThenZeros:
    """A raw server answering with ``tar`` (chunked, no length), then zero chunks of
    64 KiB until the client goes away; it counts the bytes sent after the TAR."""

    def __init__(self, tar: bytes) -> None:
        import socket
        import threading

        self.tar = tar
        self.after = 0
        self.closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/shard.tar"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        with conn:
            conn.recv(65536)
            head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            zeros = b"%x\r\n%s\r\n" % (1 << 16, bytes(1 << 16))
            try:
                conn.sendall(head + b"%x\r\n%s\r\n" % (len(self.tar), self.tar))
                while self.after < 1 << 30:
                    conn.sendall(zeros)
                    self.after += 1 << 16
            except OSError:
                self.closed.set()

    def close(self) -> None:
        self._listener.close()


async def test_a_shard_ends_at_its_end_of_archive_blocks(
    tmp_path: Path, shard_paths: list[Path]
) -> None:
    """Bytes after the end-of-archive blocks (here zeros without end, on a URL with no
    known size) are not read: the shard ends with its last sample and its response is
    closed. Before, the stream read the zeros forever and never ended."""
    want = reference([str(shard_paths[0])])
    server = _TarThenZeros(shard_paths[0].read_bytes())
    try:
        got: list[Sample] = []
        with anyio.fail_after(60):
            async with ashwds.stream(server.url, options=_options(tmp_path)) as s:
                async for x in s:
                    got.append(x)
        assert [x["__key__"] for x in got] == [x["__key__"] for x in want]
        assert await anyio.to_thread.run_sync(server.closed.wait, 10)
        assert server.after < 64 << 20  # what was in flight, not the 1 GiB on offer
    finally:
        server.close()
