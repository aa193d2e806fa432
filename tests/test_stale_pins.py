"""A branch pin shared through the resolution cache that the Hub no longer knows.

A pin (``main`` -> commit) is shared for ``StreamOptions.pin_ttl`` seconds through the
machine-wide resolution cache (issue 34, item 7). When the Hub forgets that commit in
the meantime (the local server restarted over a changed folder, a branch rewritten),
the pin is dropped and the repo resolved afresh, once; a commit the user named stays an
error, and a file that changes under a read that began still fails loudly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

import aiostream_hf as ash
from aiostream_hf._client import HubClient
from aiostream_hf._resolver import Resolver
from aiostream_hf.testing import Faults, HubServer, make_repo, make_text_parquet, make_video

REPO = "demo/text"
TRAIN = "data/train-00000-of-00001.parquet"
TEST = "data/test-00000-of-00001.parquet"
SOURCE = f"hf://datasets/{REPO}"


def _options(cache: Path, **kw: Any) -> ash.StreamOptions:
    # pin_ttl: an hour, so that every second run here is within it
    return ash.StreamOptions(
        cache_dir=cache, pin_ttl=3600, backoff_base=0.001, backoff_max=0.01, **kw
    )


def _write(root: Path, version: int) -> tuple[list[int], list[int]]:
    """The repo at a version of its own (so a commit of its own): its train and test ids."""
    repo = make_repo(root, REPO, {})
    first = 1000 * version
    train = make_text_parquet(
        repo / TRAIN, rows=20, seed=version, start_id=first, min_text=5, max_text=20
    )
    test = make_text_parquet(
        repo / TEST, rows=5, seed=version + 100, start_id=first + 500, min_text=5, max_text=20
    )
    return train.column("id").to_pylist(), test.column("id").to_pylist()


def _port(hub: HubServer) -> int:
    return int(hub.endpoint.rsplit(":", 1)[1])


async def _ids(hub: HubServer, cache: Path, source: str = SOURCE, **kw: Any) -> list[int]:
    kw.setdefault("split", "train")
    s = ash.stream(source, endpoint=hub.endpoint, options=_options(cache), **kw)
    async with s:
        return [row["id"] async for row in s]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "hub"


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


# -- a server restarted within pin_ttl -------------------------------------------------------


@pytest.mark.anyio
async def test_a_server_restarted_over_a_changed_folder_is_read_afresh(
    root: Path, cache: Path
) -> None:
    """Serve, read, stop; change the folder; serve it again on the same port and read
    within pin_ttl. The shared pin and the manifest of the old commit are both cached,
    so no request goes out before the first read, which the server refuses
    (RevisionNotFound): the pin is dropped and the stream starts over, pinning afresh."""
    old, _ = _write(root, 1)
    with HubServer(root) as first:
        port = _port(first)
        assert await _ids(first, cache) == old
    new, _ = _write(root, 2)
    with HubServer(root, port=port) as second:
        assert await _ids(second, cache) == new
        stats = second.stats()
        # and the renewed pin is shared from now on: a third read pins nothing
        second.reset_stats()
        assert await _ids(second, cache) == new
        again = second.stats()
    assert stats.by_endpoint["dataset_info"] == 1  # the pin, requested again once
    assert stats.by_endpoint["tree"] == 1  # the new commit's listing
    assert stats.by_status.get(404) == 1  # the one refused read at the old commit
    assert again.by_endpoint.get("dataset_info", 0) == 0
    assert again.by_bucket.get("api", 0) == 0


@pytest.mark.anyio
async def test_a_server_restarted_over_a_changed_folder_is_listed_afresh(
    root: Path, cache: Path
) -> None:
    """As ``ls --split test`` after the restart: the manifest is not cached, so the tree
    listing of the shared pin's commit is refused; the resolver drops the pin, pins
    afresh once and lists the new commit."""
    _write(root, 1)
    with HubServer(root) as first:
        port = _port(first)
        async with Resolver(options=_options(cache)) as resolver:
            before = await resolver.resolve(SOURCE, split="train", endpoint=first.endpoint)
    _write(root, 2)
    with HubServer(root, port=port) as second:
        async with Resolver(options=_options(cache)) as resolver:
            after = await resolver.resolve(SOURCE, split="test", endpoint=second.endpoint)
            stats = resolver.statistics()
        hub_stats = second.stats()
        async with Resolver(options=_options(cache)) as resolver:  # the renewed pin is shared
            train = await resolver.resolve(SOURCE, split="train", endpoint=second.endpoint)
            shared = resolver.statistics()
    assert after.commit != before.commit
    assert [f.path for f in after.files] == [TEST]
    assert f"/resolve/{after.commit}/" in after.files[0].url
    assert hub_stats.by_endpoint["dataset_info"] == 1
    assert hub_stats.by_endpoint["tree"] == 2  # refused at the old commit, then the new one
    assert (stats.disk_hits, stats.api_requests) == (1, 3)
    assert train.commit == after.commit
    assert (shared.disk_hits, shared.api_requests) == (1, 1)  # the renewed pin; the tree


@pytest.mark.anyio
async def test_the_same_folder_served_again_keeps_the_shared_pin(root: Path, cache: Path) -> None:
    """A restart over an unchanged folder keeps the commit (a digest of the files): the
    shared pin still holds, and the second read makes no API request at all."""
    old, _ = _write(root, 1)
    with HubServer(root) as first:
        port = _port(first)
        assert await _ids(first, cache) == old
    with HubServer(root, port=port) as second:
        assert await _ids(second, cache) == old
        stats = second.stats()
    assert stats.by_bucket.get("api", 0) == 0
    assert 404 not in stats.by_status


def test_a_commit_changed_under_a_running_server_is_read_afresh_in_sync_iteration(
    root: Path, cache: Path
) -> None:
    """One server, its repo rewritten between two runs (the old commit's files are gone):
    ``for row in stream`` (the bridge) pins afresh too."""
    old, _ = _write(root, 1)
    commits = []
    with HubServer(root) as hub:
        kw: dict[str, Any] = dict(split="train", endpoint=hub.endpoint, options=_options(cache))
        with ash.stream(SOURCE, **kw) as s:
            assert [row["id"] for row in s] == old
            commits.append(s.manifest.commit if s.manifest else None)
        new, _ = _write(root, 2)
        hub.reset_stats()
        with ash.stream(SOURCE, **kw) as s:
            assert [row["id"] for row in s] == new
            commits.append(s.manifest.commit if s.manifest else None)
        stats = hub.stats()
    assert None not in commits
    assert commits[0] != commits[1]
    assert stats.by_endpoint["dataset_info"] == 1
    assert stats.by_status.get(404) == 1


@pytest.mark.anyio
async def test_video_open_after_a_restart_reads_the_new_file(root: Path, cache: Path) -> None:
    """``video.open("hf://...")`` resolves the file (a HEAD, shared like a pin), then
    reads its index: a shared resolution the restarted server refuses is dropped there
    too, and the new video is opened."""
    clip = make_repo(root, "org/clips", {}) / "clip.mp4"
    source = "hf://datasets/org/clips/clip.mp4"
    make_video(clip, frames=10, fps=10, width=32, height=24)
    with HubServer(root) as first:
        port = _port(first)
        async with ash.video.open(source, endpoint=first.endpoint, options=_options(cache)) as r:
            assert (r.fps, r.frame_count) == (10, 10)
    make_video(clip, frames=12, fps=20, width=32, height=24)
    with HubServer(root, port=port) as second:
        async with ash.video.open(source, endpoint=second.endpoint, options=_options(cache)) as r:
            assert (r.fps, r.frame_count) == (20, 12)
            frames = await r.frames_at([0.5])
        stats = second.stats()
    assert frames.data.shape[0] == 1
    # The file's shared resolution (one HEAD of its /resolve/ URL) names the old commit:
    # its first read there is refused (404), it is dropped, and one HEAD resolves the file
    # afresh (no pin, no listing); the small file is then read whole from the CDN.
    assert dict(stats.by_endpoint) == {"resolve": 2, "cdn": 1}
    assert stats.by_status[404] == 1


# -- what stays an error ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_commit_the_user_named_stays_an_error(root: Path, cache: Path) -> None:
    """``@SHA`` of a commit the restarted server no longer has: no pin to drop, so a
    clear error, and no request to pin anything."""
    _write(root, 1)
    with HubServer(root) as first:
        port = _port(first)
        async with Resolver(options=_options(cache)) as resolver:
            old = (await resolver.resolve(SOURCE, split="train", endpoint=first.endpoint)).commit
    _write(root, 2)
    with HubServer(root, port=port) as second:
        async with Resolver(options=_options(cache)) as resolver:  # a listing: refused
            with pytest.raises(ash.RevisionNotFoundError, match=f"revision '{old}' not found"):
                await resolver.resolve(f"{SOURCE}@{old}", endpoint=second.endpoint)
        # Its train manifest is cached (a commit is immutable): the first read is refused.
        with pytest.raises(ash.FetchError, match="no longer has the commit") as info:
            await _ids(second, cache, f"{SOURCE}@{old}")
        stats = second.stats()
    assert info.value.status == 404
    assert not isinstance(info.value, ash.FileChangedError)
    assert stats.by_endpoint.get("dataset_info", 0) == 0  # nothing was pinned
    assert stats.by_status[404] == 2  # the listing, the read: each once


@pytest.mark.anyio
async def test_a_file_replaced_mid_read_still_fails_with_a_shared_pin(
    root: Path, cache: Path
) -> None:
    """The pin and manifest come from the cache, the first read (the footer) pins the
    file's version, then the server serves other bytes: FileChangedError, as ever, and
    never rows of two versions; the shared pin is not dropped for it."""
    repo = make_repo(root, REPO, {})
    table = make_text_parquet(repo / TRAIN, rows=400, row_group_size=50)
    with HubServer(root) as hub:
        assert await _ids(hub, cache) == table.column("id").to_pylist()
        hub.set_faults(
            Faults(replace_after=1, replace_path=TRAIN, ignore_if_match=("cdn", "resolvers"))
        )
        hub.reset_stats()
        rows: list[int] = []
        s = ash.stream(
            SOURCE, split="train", endpoint=hub.endpoint, options=_options(cache, max_retries=1)
        )
        with pytest.raises(ash.FileChangedError, match=TRAIN):
            async with s:
                async for row in s:
                    rows.append(row["id"])
        stats = hub.stats()
    assert rows == table.column("id").to_pylist()[: len(rows)]
    assert stats.by_bucket.get("api", 0) == 0  # no pin, no listing: nothing started over


# -- once, never in a loop -------------------------------------------------------------------

_SHA = "c" * 40
_ENDPOINT = "http://hub.test"


class _ForgetfulHub:
    """A Hub that pins ``main`` to one commit and then no longer knows it: its reads
    (and, with ``lists=False``, its tree listings) answer 404 RevisionNotFound."""

    def __init__(self, *, lists: bool) -> None:
        self.lists = lists
        self.counts = {"pin": 0, "tree": 0, "read": 0}

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        gone = httpx2.Response(
            404,
            headers={"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id"},
        )
        if path == "/api/datasets/org/gone/revision/main":
            self.counts["pin"] += 1
            return httpx2.Response(200, json={"id": "org/gone", "sha": _SHA})
        if path.startswith(f"/api/datasets/org/gone/tree/{_SHA}"):
            self.counts["tree"] += 1
            if not self.lists:
                return gone
            entry = {"type": "file", "oid": "a" * 40, "size": 4096, "path": "data/train.parquet"}
            return httpx2.Response(200, json=[entry])
        if path.startswith(f"/datasets/org/gone/resolve/{_SHA}/"):
            self.counts["read"] += 1
            return gone
        return httpx2.Response(404, headers={"X-Error-Code": "RepoNotFound"})


@pytest.mark.anyio
async def test_a_shared_pin_is_renewed_once_when_the_listing_is_refused(cache: Path) -> None:
    hub = _ForgetfulHub(lists=False)
    async with HubClient(transport=httpx2.MockTransport(hub.handler)) as client:
        for _ in range(2):  # a fresh pin, then a shared one
            async with Resolver(options=_options(cache), client=client) as resolver:
                with pytest.raises(ash.RevisionNotFoundError, match=f"commit {_SHA}.*is gone"):
                    await resolver.resolve("hf://datasets/org/gone", endpoint=_ENDPOINT)
    # the fresh pin's listing: refused, and its error stands; the shared pin's: refused,
    # then pinned afresh (the same commit) and refused again: the error stands
    assert hub.counts == {"pin": 2, "tree": 3, "read": 0}


@pytest.mark.anyio
async def test_a_stream_starts_over_once_when_its_first_read_is_refused(cache: Path) -> None:
    hub = _ForgetfulHub(lists=True)
    async with HubClient(transport=httpx2.MockTransport(hub.handler)) as client:
        kw: dict[str, Any] = dict(endpoint=_ENDPOINT, options=_options(cache), client=client)
        with pytest.raises(ash.FetchError, match="no longer has the commit"):
            await _collect(ash.stream("hf://datasets/org/gone", **kw))
        assert hub.counts == {"pin": 1, "tree": 1, "read": 1}  # a fresh pin: no second run
        with pytest.raises(ash.FetchError, match="no longer has the commit"):
            await _collect(ash.stream("hf://datasets/org/gone", **kw))
    # the shared pin's read refused; pinned afresh (the same commit, its manifest cached),
    # read refused again: the error stands
    assert hub.counts == {"pin": 2, "tree": 1, "read": 3}


async def _collect(s: ash.Stream) -> list[Any]:
    async with s:
        return [row async for row in s]


# -- as a user runs it: `hub serve`, stopped and started again, and the CLI -------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiostream_hf.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )


class _Served:
    """``aiostream-hf hub serve ROOT [--port P]`` in a subprocess, until ``stop()``."""

    def __init__(self, root: Path, port: int = 0) -> None:
        cmd = [sys.executable, "-m", "aiostream_hf.cli", "hub", "serve", str(root)]
        self.proc = subprocess.Popen(
            [*cmd, "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        self.endpoint = json.loads(self.proc.stdout.readline())["endpoint"]
        self.port = int(self.endpoint.rsplit(":", 1)[1])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.communicate(timeout=20)


@pytest.fixture
def served() -> Iterator[list[_Served]]:
    running: list[_Served] = []
    yield running
    for server in running:
        if server.proc.poll() is None:
            server.stop()


def test_the_cli_after_hub_serve_is_restarted(root: Path, served: list[_Served]) -> None:
    """ls and head; stop the server; change the folder; serve it on the same port; ls of
    another split and head, at once (within pin_ttl): both see the new commit. Every
    command shares the resolution cache of $AIOSTREAM_HF_CACHE (conftest's, per test)."""
    assert os.environ.get("AIOSTREAM_HF_CACHE")
    old, _ = _write(root, 1)
    served.append(_Served(root))
    endpoint = served[0].endpoint
    listed = _cli("ls", SOURCE, "--endpoint", endpoint)
    assert listed.returncode == 0, listed.stderr
    head = _cli("head", "-n", "1", SOURCE, "--split", "train", "--endpoint", endpoint)
    assert head.returncode == 0, head.stderr
    assert f"id     {old[0]}" in head.stdout
    old_commit = listed.stdout.split("@ ", 1)[1].split()[0]
    served[0].stop()

    new, new_test = _write(root, 2)
    served.append(_Served(root, served[0].port))
    assert served[1].endpoint == endpoint
    listed = _cli("ls", SOURCE, "--split", "test", "--endpoint", endpoint)
    assert listed.returncode == 0, listed.stderr
    assert old_commit not in listed.stdout
    assert TEST in listed.stdout
    head = _cli("head", "-n", "1", SOURCE, "--split", "train", "--endpoint", endpoint)
    assert head.returncode == 0, head.stderr
    assert f"id     {new[0]}" in head.stdout
    assert "RevisionNotFound" not in head.stderr + listed.stderr
