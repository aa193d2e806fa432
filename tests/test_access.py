"""A private repo read the ways users configure access: every entry point, every source of
the token and the endpoint (issue 30's matrix).

The server serves every file through its CDN (``lfs_threshold=0``), so each read crosses
from the Hub (which wants the token) to another origin (which must never see it): the
server counts CDN requests that carried an ``Authorization`` header.

Each way of giving access is applied the way a user does, after ``huggingface_hub`` was
imported (the conftest imported it): ``token=``/``endpoint=`` arguments, ``HF_TOKEN``,
``HF_TOKEN_PATH``, the token file under ``HF_HOME`` (what ``hf auth login`` writes),
``HF_ENDPOINT``. The subprocess tests set them before anything is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aiostream_hf as ash
from aiostream_hf._access import find_access
from aiostream_hf.testing import (
    HubServer,
    make_lerobot_dataset,
    make_repo,
    make_text_parquet,
    make_video,
    make_webdataset_shards,
)

TOKEN = "hf_private_reader_0123456789"
ROWS = 30
SAMPLES = 12


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    text = make_repo(root, "org/text", {})
    make_text_parquet(text / "data" / "train-00000-of-00001.parquet", rows=ROWS, seed=1)
    shards = make_repo(root, "org/shards", {})
    make_webdataset_shards(shards / "data", shards=2, samples_per_shard=SAMPLES // 2)
    clips = make_repo(root, "org/clips", {})
    make_video(clips / "clip.mp4", frames=20, width=64, height=48)
    make_lerobot_dataset(root, "org/robot", episodes=[10, 12], width=64, height=48, codec="h264")
    return root


@pytest.fixture(scope="module")
def hub(root: Path) -> Iterator[HubServer]:
    private = {repo: [TOKEN] for repo in ("org/text", "org/shards", "org/clips", "org/robot")}
    with HubServer(root, private=private, lfs_threshold=0) as server:
        yield server


#: How a user gives the token and the endpoint: (name, applied to the environment, the
#: stream() arguments).
WAYS = ["token=", "HF_TOKEN", "HF_TOKEN_PATH", "HF_HOME/token", "endpoint= with HF_TOKEN"]


def _apply(way: str, hub: HubServer, home: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Set up ``way``; the keyword arguments a reader is then given."""
    if way == "token=":
        return {"token": TOKEN, "endpoint": hub.endpoint}
    if way == "endpoint= with HF_TOKEN":
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        return {"endpoint": hub.endpoint}
    # The rest name the endpoint as most users do: HF_ENDPOINT, set after huggingface_hub
    # was imported (its constants hold the conftest's discard-port value).
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    if way == "HF_TOKEN":
        monkeypatch.setenv("HF_TOKEN", TOKEN)
    elif way == "HF_TOKEN_PATH":
        path = home.parent / "elsewhere" / "my-token"
        path.parent.mkdir()
        path.write_text(TOKEN + "\n")
        monkeypatch.setenv("HF_TOKEN_PATH", str(path))
    elif way == "HF_HOME/token":
        (home / "token").write_text(TOKEN)
    else:  # pragma: no cover - a typo in WAYS
        raise AssertionError(way)
    return {}


async def _all(s: Any) -> list[Any]:
    async with s:
        return [x async for x in s]


def _no_token_elsewhere(hub: HubServer) -> None:
    stats = hub.stats()
    assert stats.by_bucket.get("cdn", 0) > 0, "the reads did not cross to the CDN"
    assert stats.cdn_authorized == 0


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.anyio
async def test_parquet_and_tar_streams_read_a_private_repo(
    way: str, hub: HubServer, plain_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kwargs = _apply(way, hub, plain_env, monkeypatch)
    hub.reset_stats()
    rows = await _all(ash.stream("hf://datasets/org/text", split="train", **kwargs))
    assert len(rows) == ROWS
    samples = await _all(ash.stream("hf://datasets/org/shards", **kwargs))
    assert len(samples) == SAMPLES
    _no_token_elsewhere(hub)


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.anyio
async def test_frames_and_lerobot_read_a_private_repo(
    way: str, hub: HubServer, plain_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kwargs = _apply(way, hub, plain_env, monkeypatch)
    hub.reset_stats()
    async with ash.video.open("hf://datasets/org/clips/clip.mp4", **kwargs) as reader:
        frames = await reader.frames_at([0.0, 0.3])
    assert frames.data.shape[0] == 2
    items = await _all(ash.lerobot.stream("hf://datasets/org/robot", **kwargs))
    assert len(items) == 22
    _no_token_elsewhere(hub)


@pytest.mark.parametrize("way", WAYS)
def test_webdataset_gopen_reads_a_private_repo(
    way: str, hub: HubServer, plain_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import webdataset as wds

    kwargs = _apply(way, hub, plain_env, monkeypatch)
    hub.reset_stats()
    ash.webdataset.install_gopen(**kwargs)
    try:
        urls = [f"hf://datasets/org/shards/data/train-00000{i}.tar" for i in range(2)]
        got = list(wds.WebDataset(urls, shardshuffle=False))
    finally:
        ash.webdataset.uninstall_gopen()
    assert len(got) == SAMPLES
    _no_token_elsewhere(hub)


@pytest.mark.torch
@pytest.mark.parametrize("way", WAYS)
def test_torch_workers_read_a_private_repo(
    way: str, hub: HubServer, plain_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.utils.data import DataLoader

    from aiostream_hf.torch import StreamDataset

    kwargs = _apply(way, hub, plain_env, monkeypatch)
    dataset = StreamDataset("hf://datasets/org/text", split="train", columns=["id"], **kwargs)
    # The access was found in this process; the workers are told it, and look nothing up:
    # the token and the endpoint are gone from their environment and HF_HOME.
    for name in ("HF_TOKEN", "HF_TOKEN_PATH", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    (plain_env / "token").unlink(missing_ok=True)
    ids = [
        int(i) for batch in DataLoader(dataset, num_workers=2, batch_size=5) for i in batch["id"]
    ]
    assert sorted(ids) == list(range(ROWS))


@pytest.mark.anyio
async def test_a_wrong_token_is_one_clear_error(
    hub: HubServer, plain_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(ash.RepoNotFoundError, match=r"the token \(from \$HF_TOKEN\) cannot read"):
        await _all(ash.stream("hf://datasets/org/text", split="train"))
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(ash.RepoNotFoundError, match="no token was sent"):
        await _all(ash.stream("hf://datasets/org/text", split="train"))


@pytest.mark.anyio
async def test_the_environment_is_read_when_the_stream_opens(
    hub: HubServer, plain_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream made before HF_TOKEN/HF_ENDPOINT are set reads with them (the listing and
    the reads alike): nothing is decided when the stream object is made."""
    s = ash.stream("hf://datasets/org/text", split="train")
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert len(await _all(s)) == ROWS


@pytest.mark.anyio
async def test_offline_fails_at_once_naming_the_variable(
    hub: HubServer, plain_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.reset_stats()
    with pytest.raises(ash.SourceError, match="HF_HUB_OFFLINE is set"):
        await _all(ash.stream("hf://datasets/org/text", token=TOKEN, endpoint=hub.endpoint))
    assert hub.stats().requests == 0


@pytest.mark.parametrize(
    ("token", "match"),
    [
        (5, "must be a string"),
        ("hf_abc\r\nX-Evil: 1", "control or a non-ASCII"),
        ("hf_\u00e9t\u00e9", "control or a non-ASCII"),
    ],
)
def test_a_token_that_cannot_be_sent_is_refused_when_the_stream_is_made(
    token: object, match: str
) -> None:
    with pytest.raises(ash.SourceError, match=match):
        ash.stream("hf://datasets/org/text", token=token)  # type: ignore[arg-type]


def test_an_endpoint_that_is_not_a_url_is_refused_when_the_stream_is_made() -> None:
    with pytest.raises(ash.SourceError, match="endpoint"):
        ash.stream("hf://datasets/org/text", endpoint=5)  # type: ignore[arg-type]
    with pytest.raises(ash.SourceError, match="not an http"):
        ash.stream("hf://datasets/org/text", endpoint="ftp://example.org")


@pytest.mark.anyio
async def test_find_access_follows_huggingface_hubs_order(
    plain_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (plain_env / "token").write_text("from-file")
    assert (await find_access()).token == "from-file"
    monkeypatch.setenv("HF_TOKEN", "from-env")
    assert (await find_access()).token == "from-env"
    assert (await find_access("given")).token == "given"
    assert (await find_access(False)).token is None
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    assert (await find_access()).token is None
    assert (await find_access(True)).token == "from-env"
    monkeypatch.delenv("HF_ENDPOINT")
    assert (await find_access()).endpoint == "https://huggingface.co"
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.local:8080/")
    assert (await find_access()).endpoint == "http://hub.local:8080"
    assert (await find_access(endpoint="http://other")).endpoint == "http://other"


_SCRIPT = """
import json, sys
import anyio
import aiostream_hf as ash

async def main():
    async with ash.stream("hf://datasets/org/text", split="train") as s:
        rows = [r async for r in s]
    async with ash.video.open("hf://datasets/org/clips/clip.mp4") as reader:
        frames = await reader.frames_at([0.0])
    print(json.dumps({"rows": len(rows), "frames": int(frames.data.shape[0])}))

anyio.run(main)
"""


def _env(hub: HubServer, home: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HF_") and k not in ("HUGGING_FACE_HUB_TOKEN", "AIOSTREAM_HF_CACHE")
    }
    env.update(HF_HOME=str(home), HF_ENDPOINT=hub.endpoint, HF_HUB_DISABLE_TELEMETRY="1")
    env.update(extra)
    return env


def test_hf_endpoint_set_before_import_in_a_fresh_process(hub: HubServer, tmp_path: Path) -> None:
    """HF_ENDPOINT and the `hf auth login` token file, set before anything is imported."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "token").write_text(TOKEN)
    run = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        env=_env(hub, home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"rows": ROWS, "frames": 1}


_TOKEN_MODULE = """
import json, sys
import anyio
from aiostream_hf._access import find_access
token = anyio.run(find_access).token
print(json.dumps({"token": token, "imported": "huggingface_hub.utils._auth" in sys.modules}))
"""


@pytest.mark.parametrize("logged_in", [False, True])
def test_huggingface_hubs_get_token_is_imported_only_for_a_token_file(
    hub: HubServer, tmp_path: Path, logged_in: bool
) -> None:
    """Without a token file (nor OIDC, nor Colab), nothing get_token() adds can apply: its
    import (a fresh process's largest cost in a warm video open) is not paid. With one,
    the file is read through it (an OAuth login it refreshes)."""
    home = tmp_path / "home"
    home.mkdir()
    if logged_in:
        (home / "token").write_text(TOKEN)
    run = subprocess.run(
        [sys.executable, "-c", _TOKEN_MODULE],
        env=_env(hub, home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    expected = (
        {"token": TOKEN, "imported": True} if logged_in else {"token": None, "imported": False}
    )
    assert json.loads(run.stdout) == expected


@pytest.mark.parametrize("way", ["--token", *WAYS[1:4]])
@pytest.mark.parametrize("command", ["ls", "head", "frames"])
def test_cli_reads_a_private_repo(command: str, way: str, hub: HubServer, tmp_path: Path) -> None:
    args = {
        "ls": ["ls", "hf://datasets/org/text"],
        "head": ["head", "hf://datasets/org/text", "-n", "3"],
        "frames": [
            "frames",
            "hf://datasets/org/clips/clip.mp4",
            "--at",
            "0.0",
            "--out",
            str(tmp_path / "f.png"),
        ],
    }[command]
    home = tmp_path / "home"
    home.mkdir()
    extra: dict[str, str] = {}
    if way == "--token":
        args += ["--token", TOKEN, "--endpoint", hub.endpoint]
    elif way == "HF_TOKEN":
        extra["HF_TOKEN"] = TOKEN
    elif way == "HF_TOKEN_PATH":
        (tmp_path / "my-token").write_text(TOKEN + "\n")
        extra["HF_TOKEN_PATH"] = str(tmp_path / "my-token")
    else:
        (home / "token").write_text(TOKEN)
    hub.reset_stats()
    run = subprocess.run(
        [sys.executable, "-m", "aiostream_hf.cli", *args],
        env=_env(hub, home, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert hub.stats().cdn_authorized == 0
