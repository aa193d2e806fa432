"""The local Hub server, proven against the real huggingface_hub and datasets clients."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pyarrow.parquet as pq
import pytest
from huggingface_hub import HfApi, HfFileSystem, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from aiostream_hf import HubServerError
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

ORACLE = Path(__file__).with_name("datasets_oracle.py")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "hub"
    r.mkdir()
    return r


@pytest.fixture
def blob_repo(root: Path) -> bytes:
    """org/blobs: a 3 MB LFS-like file, a small plain file, and 30 files in 5 folders."""
    blob = os.urandom(3_000_000)
    files: dict[str, bytes | str] = {"data/blob.parquet": blob, "README.md": "# blobs\n"}
    for d in range(5):
        for i in range(6):
            files[f"dir{d}/f{i}.txt"] = f"{d}-{i}\n"
    make_repo(root, "org/blobs", files)
    return blob


def _run_oracle(hub: HubServer, tmp_path: Path, *args: str) -> Any:
    """Run datasets.load_dataset(..., streaming=True) in a fresh process pointed at the server."""
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_DATASETS_OFFLINE", None)
    done = subprocess.run(
        [sys.executable, str(ORACLE), *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rows(table: Any) -> list[dict[str, Any]]:
    return list(table.to_pylist())


# -- datasets.load_dataset(streaming=True) is the oracle for split inference ---------------


def test_datasets_streams_split_naming_layout(root: Path, tmp_path: Path) -> None:
    expected = make_repo_split_naming(root)["default"]
    with HubServer(root) as hub:
        got = _run_oracle(hub, tmp_path, "org/split-naming", "default:train", "default:test")
    assert got["default:train"] == _rows(expected["train"])
    assert got["default:test"] == _rows(expected["test"])
    assert len(got["default:train"]) == 100


def test_datasets_streams_split_folders_layout(root: Path, tmp_path: Path) -> None:
    expected = make_repo_split_folders(root)["default"]
    with HubServer(root) as hub:
        got = _run_oracle(hub, tmp_path, "org/split-folders", "default:train", "default:test")
    assert got["default:train"] == _rows(expected["train"])
    assert got["default:test"] == _rows(expected["test"])


def test_datasets_streams_yaml_configs_layout(root: Path, tmp_path: Path) -> None:
    expected = make_repo_yaml_configs(root)
    with HubServer(root) as hub:
        got = _run_oracle(hub, tmp_path, "org/yaml-configs", "en:train", "en:test", "fr:train")
    assert got["en:train"] == _rows(expected["en"]["train"])
    assert got["en:test"] == _rows(expected["en"]["test"])
    assert got["fr:train"] == _rows(expected["fr"]["train"])


def test_datasets_streams_explicit_data_files(root: Path, tmp_path: Path) -> None:
    expected = make_repo_split_naming(root)["default"]
    with HubServer(root) as hub:
        got = _run_oracle(
            hub,
            tmp_path,
            "org/split-naming",
            "default:validation",
            "--data-files",
            json.dumps({"validation": "data/test-*.parquet"}),
        )
    assert got["default:validation"] == _rows(expected["test"])


# -- huggingface_hub: HfApi, HfFileSystem, hf_hub_download ---------------------------------


def test_hffilesystem_glob_ls_info_and_ranged_reads(root: Path, blob_repo: bytes) -> None:
    with HubServer(root) as hub:
        fs = HfFileSystem(endpoint=hub.endpoint, skip_instance_cache=True)
        assert fs.glob("datasets/org/blobs/dir1/*.txt") == [
            f"datasets/org/blobs/dir1/f{i}.txt" for i in range(6)
        ]
        listing = fs.ls("datasets/org/blobs", detail=False)
        assert sorted(listing) == sorted(
            ["datasets/org/blobs/README.md", "datasets/org/blobs/data"]
            + [f"datasets/org/blobs/dir{d}" for d in range(5)]
        )
        info = fs.info("datasets/org/blobs/data/blob.parquet")
        assert info["size"] == len(blob_repo)
        assert info["lfs"]["size"] == len(blob_repo)
        with fs.open("datasets/org/blobs/data/blob.parquet", "rb", block_size=64 * 1024) as f:
            f.seek(1_234_567)
            assert f.read(1000) == blob_repo[1_234_567 : 1_234_567 + 1000]
            f.seek(-500, 2)
            assert f.read() == blob_repo[-500:]
            f.seek(10)
            assert f.read(20) == blob_repo[10:30]
        assert fs.cat_file("datasets/org/blobs/dir3/f4.txt") == b"3-4\n"
        assert fs.cat_file("datasets/org/blobs/dir3/f4.txt", start=1, end=3) == b"-4"
        stats = hub.stats()
        assert stats.by_status.get(206, 0) >= 3  # ranged reads, not whole-file downloads


def test_hf_hub_download_exact_bytes_and_resume_after_cut(root: Path, tmp_path: Path) -> None:
    # huggingface_hub writes 10 MB chunks and resumes from the last one written: a 24 MB
    # file cut half-way resumes at 10 MB with a Range request.
    blob = os.urandom(24_000_000)
    make_repo(root, "org/big", {"big.parquet": blob, "small.txt": "small"})
    with HubServer(root, faults=Faults(cut_at=(1,), targets=("cdn",))) as hub:
        kwargs: dict[str, Any] = {
            "repo_type": "dataset",
            "endpoint": hub.endpoint,
            "cache_dir": tmp_path / "cache",
        }
        path = hf_hub_download("org/big", "big.parquet", **kwargs)
        assert Path(path).read_bytes() == blob
        assert Path(hf_hub_download("org/big", "small.txt", **kwargs)).read_text() == "small"
        stats = hub.stats()
    assert stats.faults["cut"] == 1
    assert stats.by_status[206] == 1  # the resume asked for the rest only
    assert stats.bytes_served < 2 * len(blob)  # not downloaded twice


def test_list_repo_tree_follows_all_pages(root: Path, blob_repo: bytes) -> None:
    with HubServer(root, tree_page_size=10) as hub:
        api = HfApi(endpoint=hub.endpoint)
        entries = list(api.list_repo_tree("org/blobs", repo_type="dataset", recursive=True))
        stats = hub.stats()
    # 30 + 2 files, 5 + 1 folders... the fixture has dir0..dir4, data, README and blob.
    assert len(entries) == 38
    assert len({e.path for e in entries}) == 38
    assert stats.by_endpoint["tree"] == 4


def test_list_repo_tree_35_entries_with_page_size_10(root: Path) -> None:
    files = {f"d{d}/f{i}.txt": f"{d}{i}" for d in range(5) for i in range(6)}  # 30 files, 5 dirs
    make_repo(root, "org/tree35", files)
    with HubServer(root, tree_page_size=10) as hub:
        api = HfApi(endpoint=hub.endpoint)
        entries = list(api.list_repo_tree("org/tree35", repo_type="dataset", recursive=True))
        link = httpx2.get(f"{hub.endpoint}/api/datasets/org/tree35/tree/main?recursive=true")
    assert len(entries) == 35
    assert sorted(e.path for e in entries) == sorted([*files, *(f"d{d}" for d in range(5))])
    next_url = link.links["next"]["url"]
    assert next_url.startswith(hub.endpoint + "/api/datasets/org/tree35/tree/main?")
    assert "recursive=true" in next_url
    assert "cursor=" in next_url


def test_paths_info_form_and_json_bodies(root: Path, blob_repo: bytes) -> None:
    with HubServer(root) as hub:
        api = HfApi(endpoint=hub.endpoint)
        infos = api.get_paths_info(
            "org/blobs", ["README.md", "dir2", "missing.txt"], repo_type="dataset"
        )
        as_json = httpx2.post(
            f"{hub.endpoint}/api/datasets/org/blobs/paths-info/main",
            json={"paths": ["data/blob.parquet", "nope"]},
        ).json()
    assert [i.path for i in infos] == ["README.md", "dir2"]
    assert [e["path"] for e in as_json] == ["data/blob.parquet"]
    assert as_json[0]["lfs"]["size"] == len(blob_repo)


# -- resolve, CDN, ranges ------------------------------------------------------------------


def test_resolve_redirects_lfs_files_to_a_signed_cdn_url(root: Path, blob_repo: bytes) -> None:
    with HubServer(root) as hub, httpx2.Client() as client:
        head = client.head(hub.url("org/blobs", "data/blob.parquet"))
        assert head.status_code == 302
        location = head.headers["Location"]
        assert location.startswith(hub.cdn_endpoint)
        assert httpx2.URL(location).host != httpx2.URL(hub.endpoint).host
        assert "expires=" in location
        assert "sig=" in location
        assert head.headers["X-Linked-Size"] == str(len(blob_repo))
        assert len(head.headers["X-Repo-Commit"]) == 40
        assert "X-Xet-Hash" not in head.headers
        ranged = client.get(location, headers={"Range": "bytes=100-199"})
        assert ranged.status_code == 206
        assert ranged.headers["Content-Range"] == f"bytes 100-199/{len(blob_repo)}"
        assert ranged.content == blob_repo[100:200]
        suffix = client.get(location, headers={"Range": "bytes=-10"})
        assert suffix.content == blob_repo[-10:]
        past = client.get(location, headers={"Range": f"bytes={len(blob_repo)}-"})
        assert past.status_code == 416
        assert past.headers["Content-Range"] == f"bytes */{len(blob_repo)}"
        etag = head.headers["X-Linked-Etag"]
        assert (
            client.get(location, headers={"If-Match": etag, "Range": "bytes=0-0"}).status_code
            == 206
        )
        assert client.get(location, headers={"If-Match": '"0000"'}).status_code == 412
        # If-Range with a stale etag: the whole file, not a range of other bytes.
        stale = client.get(location, headers={"If-Range": '"0000"', "Range": "bytes=0-9"})
        assert stale.status_code == 200
        assert len(stale.content) == len(blob_repo)
        forged = location.replace("sig=", "sig=0")
        assert client.get(forged).status_code == 403


def test_small_files_are_served_by_the_hub_with_ranges(root: Path, blob_repo: bytes) -> None:
    with HubServer(root) as hub, httpx2.Client() as client:
        r = client.get(hub.url("org/blobs", "README.md"), headers={"Range": "bytes=2-6"})
        assert r.status_code == 206
        assert r.content == b"blobs"
        assert (
            r.headers["ETag"].strip('"')
            == HfApi(endpoint=hub.endpoint)
            .get_paths_info("org/blobs", ["README.md"], repo_type="dataset")[0]
            .blob_id
        )


def test_expired_cdn_url_answers_403(root: Path, blob_repo: bytes) -> None:
    with HubServer(root, cdn_url_ttl_s=1e-6) as hub, httpx2.Client() as client:
        location = client.head(hub.url("org/blobs", "data/blob.parquet")).headers["Location"]
        r = client.get(location)
    assert r.status_code == 403
    assert b"Expired" in r.content


def test_commit_sha_follows_content_and_extra_refs(root: Path) -> None:
    repo = make_repo(root, "org/refs", {"a.txt": "one"})
    convert = root / "datasets" / "org" / "refs@refs%2Fconvert%2Fparquet"
    make_text_parquet(convert / "default" / "train" / "0000.parquet", rows=3)
    with HubServer(root) as hub:
        api = HfApi(endpoint=hub.endpoint)
        first = api.dataset_info("org/refs").sha
        (repo / "a.txt").write_text("two")
        second = api.dataset_info("org/refs").sha
        refs = api.list_repo_refs("org/refs", repo_type="dataset")
        files = api.list_repo_files(
            "org/refs", repo_type="dataset", revision="refs/convert/parquet"
        )
        fs = HfFileSystem(endpoint=hub.endpoint, skip_instance_cache=True)
        table = pq.read_table(
            fs.open("datasets/org/refs@refs%2Fconvert%2Fparquet/default/train/0000.parquet")
        )
        # A sha answers like the branch it came from.
        by_sha = api.dataset_info("org/refs", revision=second)
    assert first != second
    assert len(second) == 40
    assert [b.name for b in refs.branches] == ["main"]
    assert [c.name for c in refs.converts] == ["parquet"]
    assert files == ["default/train/0000.parquet"]
    assert table.num_rows == 3
    assert by_sha.sha == second


# -- errors huggingface_hub maps by header -------------------------------------------------


def test_private_gated_revision_and_entry_errors(root: Path) -> None:
    make_repo(root, "org/private", {"a.txt": "secret"})
    make_repo(root, "org/gated", {"a.txt": "gated"})
    make_repo(root, "org/public", {"a.txt": "public"})
    with HubServer(root, private={"org/private": ["tok"]}, gated={"org/gated": ["tok"]}) as hub:
        api = HfApi(endpoint=hub.endpoint)
        with pytest.raises(RepositoryNotFoundError):
            api.dataset_info("org/private", token=False)
        with pytest.raises(RepositoryNotFoundError):
            api.dataset_info("org/private", token="wrong")
        assert api.dataset_info("org/private", token="tok").id == "org/private"
        with pytest.raises(RepositoryNotFoundError):
            api.dataset_info("org/missing", token=False)
        with pytest.raises(GatedRepoError):
            hf_hub_download(
                "org/gated",
                "a.txt",
                repo_type="dataset",
                endpoint=hub.endpoint,
                token=False,
                cache_dir=root.parent / "c1",
            )
        got = hf_hub_download(
            "org/gated",
            "a.txt",
            repo_type="dataset",
            endpoint=hub.endpoint,
            token="tok",
            cache_dir=root.parent / "c2",
        )
        assert Path(got).read_text() == "gated"
        with pytest.raises(RevisionNotFoundError):
            api.dataset_info("org/public", revision="nope", token=False)
        with pytest.raises(EntryNotFoundError):
            hf_hub_download(
                "org/public",
                "missing.txt",
                repo_type="dataset",
                endpoint=hub.endpoint,
                token=False,
                cache_dir=root.parent / "c3",
            )
        r = httpx2.get(hub.url("org/public", "missing.txt"))
    assert r.status_code == 404
    assert r.headers["X-Error-Code"] == "EntryNotFound"
    assert len(r.headers["X-Repo-Commit"]) == 40


# -- rate limits and faults ----------------------------------------------------------------


def test_resolvers_quota_answers_429_with_rate_limit_headers(root: Path) -> None:
    make_repo(root, "org/rl", {"a.txt": "x"})
    with HubServer(root, rate_limits=RateLimits(resolvers=5, window_s=300)) as hub:
        with httpx2.Client() as client:
            answers = [client.get(hub.url("org/rl", "a.txt")) for _ in range(6)]
            api_answer = client.get(f"{hub.endpoint}/api/datasets/org/rl")
        stats = hub.stats()
    assert [a.status_code for a in answers] == [200] * 5 + [429]
    assert answers[0].headers["RateLimit"] == '"resolvers";r=4;t=300'
    assert answers[4].headers["RateLimit"].startswith('"resolvers";r=0;')
    last = answers[5]
    assert 0 < int(last.headers["Retry-After"]) <= 300
    assert last.headers["RateLimit"].startswith('"resolvers";r=0;t=')
    assert last.headers["RateLimit-Policy"] == '"fixed window";"resolvers";q=5;w=300'
    assert "RateLimit" not in api_answer.headers  # the api bucket has no quota here
    assert stats.throttled == 1
    assert stats.by_status[429] == 1


def test_faults_happen_at_the_configured_rates(root: Path, blob_repo: bytes) -> None:
    n = 200
    faults = Faults(latency_ms=1, error_rate=0.2, cut_rate=0.25, targets=("cdn",), seed=7)
    with HubServer(root, faults=faults) as hub, httpx2.Client() as client:
        location = client.head(hub.url("org/blobs", "data/blob.parquet")).headers["Location"]
        hub.reset_stats()
        errors = cuts = 0
        for i in range(n):
            try:
                r = client.get(location, headers={"Range": f"bytes={i * 1000}-{i * 1000 + 9999}"})
            except httpx2.RemoteProtocolError:
                cuts += 1
                continue
            if r.status_code == 503:
                errors += 1
            else:
                assert r.content == blob_repo[i * 1000 : i * 1000 + 10000]
        stats = hub.stats()
    assert stats.faults["latency"] == n
    assert stats.faults["error"] == errors
    assert stats.faults["cut"] == cuts
    # Binomial(200, 0.2) and (~160, 0.25): far inside 4 standard deviations.
    assert 17 <= errors <= 63
    assert 15 <= cuts <= 65


def test_bandwidth_caps_and_slow_first_byte_keep_bytes_exact(root: Path, blob_repo: bytes) -> None:
    faults = Faults(
        bandwidth_per_connection=50e6,
        bandwidth_total=80e6,
        slow_first_byte_every=2,
        slow_first_byte_ms=5,
        targets=("cdn",),
    )
    with HubServer(root, faults=faults) as hub, httpx2.Client(follow_redirects=True) as client:
        for _ in range(2):
            assert client.get(hub.url("org/blobs", "data/blob.parquet")).content == blob_repo
        stats = hub.stats()
    assert stats.faults["slow_first_byte"] == 1


@pytest.mark.parametrize("subprocess_mode", [False, True])
def test_wait_idle_counts_a_response_once_it_is_done(
    root: Path, blob_repo: bytes, subprocess_mode: bool
) -> None:
    slow = Faults(bandwidth_per_connection=4e6, targets=("cdn",))  # 3 MB: under way 0.75 s
    with (
        HubServer(root, subprocess=subprocess_mode, faults=slow) as hub,
        httpx2.Client() as client,
    ):
        url = hub.url("org/blobs", "data/blob.parquet")
        cdn = client.get(url).headers["location"]
        with client.stream("GET", cdn) as response:
            chunks = response.iter_bytes(1024)
            body = next(chunks)  # the server is still sending the rest
            assert hub.stats().in_flight == 1
            with pytest.raises(HubServerError, match="1 requests still under way after 0.2 s"):
                hub.wait_idle(timeout=0.2)
            body += b"".join(chunks)
        stats = hub.wait_idle()
    assert body == blob_repo
    assert stats.in_flight == 0
    assert stats.bytes_served == len(blob_repo)


def test_wait_idle_waits_for_a_request_whose_client_left_before_it_was_read(
    root: Path, blob_repo: bytes
) -> None:
    # A stream closed with its readahead under way: the request was sent, the client is
    # gone, and the server has not read it yet. Its bytes belong before wait_idle returns.
    with HubServer(root) as hub, httpx2.Client() as client:
        cdn = urlsplit(client.get(hub.url("org/blobs", "data/blob.parquet")).headers["location"])
        hub.wait_idle()
        hub.reset_stats()
        assert hub._server is not None
        loop = next(iter(hub._server.server_state.connections)).loop  # the server's loop
        held, release = threading.Event(), threading.Event()
        loop.call_soon_threadsafe(lambda: (held.set(), release.wait(10)))
        assert held.wait(10)
        try:  # the loop is held: what is sent now waits unread
            with socket.create_connection((cdn.hostname or "", cdn.port or 80)) as sock:
                sock.sendall(
                    f"GET {cdn.path}?{cdn.query} HTTP/1.1\r\nHost: {cdn.netloc}\r\n"
                    "Range: bytes=0-999\r\n\r\n".encode()
                )
            waiting = hub.stats()
            assert (waiting.requests, waiting.in_flight) == (0, 1)
            with pytest.raises(HubServerError, match="1 requests still under way"):
                hub.wait_idle(timeout=0.1)
        finally:
            release.set()
        served = hub.wait_idle()
    assert (served.requests, served.in_flight) == (1, 0)


def test_a_reset_while_a_response_is_under_way_keeps_it_under_way(
    root: Path, blob_repo: bytes
) -> None:
    slow = Faults(bandwidth_per_connection=4e6, targets=("cdn",))  # 3 MB: under way 0.75 s
    with HubServer(root, faults=slow) as hub, httpx2.Client() as client:
        cdn = client.get(hub.url("org/blobs", "data/blob.parquet")).headers["location"]
        with client.stream("GET", cdn) as response:
            chunks = response.iter_bytes(1024)
            body = next(chunks)
            hub.reset_stats()
            assert hub.stats().in_flight == 1
            body += b"".join(chunks)
        stats = hub.wait_idle()  # it would wait forever for a count gone below 0
    assert body == blob_repo
    assert stats.in_flight == 0
    assert 0 < stats.bytes_served <= len(blob_repo)  # what was counted after the reset


def test_set_faults_while_running(root: Path, blob_repo: bytes) -> None:
    with HubServer(root) as hub, httpx2.Client() as client:
        assert client.get(hub.url("org/blobs", "README.md")).status_code == 200
        hub.set_faults(error_every=1, targets=("resolvers",))
        assert client.get(hub.url("org/blobs", "README.md")).status_code == 503
        hub.set_faults(Faults())
        assert client.get(hub.url("org/blobs", "README.md")).status_code == 200


# -- how it runs ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_async_context_manager(root: Path, blob_repo: bytes) -> None:
    async with HubServer(root) as hub, httpx2.AsyncClient() as client:
        r = await client.get(f"{hub.endpoint}/api/datasets/org/blobs")
    assert r.json()["id"] == "org/blobs"


def test_subprocess_mode_and_stats_endpoint(root: Path, blob_repo: bytes) -> None:
    with HubServer(root, subprocess=True, faults=Faults(latency_ms=1)) as hub:
        api = HfApi(endpoint=hub.endpoint)
        assert api.dataset_info("org/blobs").id == "org/blobs"
        over_http = httpx2.get(f"{hub.endpoint}/_emulator/stats").json()
        stats = hub.stats()
        hub.set_faults(error_every=1, targets=("api",))
        assert httpx2.get(f"{hub.endpoint}/api/datasets/org/blobs").status_code == 503
    assert over_http["by_endpoint"]["dataset_info"] == 1
    assert stats.by_bucket["api"] == 1
    assert stats.faults["latency"] == 1


def test_a_subprocess_server_exits_when_its_parent_is_killed(root: Path, blob_repo: bytes) -> None:
    # A parent killed with SIGKILL cannot terminate its server: the server sees its
    # stdin close and exits by itself, leaving no orphan bound to its ports.
    import os
    import signal
    import time

    script = (
        "import sys\n"
        "from aiostream_hf.testing import HubServer\n"
        "hub = HubServer(sys.argv[1], subprocess=True)\n"
        "hub.start()\n"
        "print(hub._process.pid, hub.endpoint, flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as parent:
        assert parent.stdout is not None
        pid_text, endpoint = parent.stdout.readline().split()
        child = int(pid_text)
        assert httpx2.get(f"{endpoint}/api/datasets/org/blobs").status_code == 200
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the server outlived its killed parent")


def test_command_line_serves_until_terminated(root: Path, blob_repo: bytes) -> None:
    args = [
        sys.executable,
        "-m",
        "aiostream_hf.cli",
        "hub",
        "serve",
        str(root),
        "--latency-ms",
        "1",
    ]
    with subprocess.Popen(args, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            ready = json.loads(proc.stdout.readline())
            info = HfApi(endpoint=ready["endpoint"]).dataset_info("org/blobs")
            assert info.id == "org/blobs"
        finally:
            proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_bad_configuration_gets_clear_errors(tmp_path: Path, root: Path) -> None:
    with pytest.raises(HubServerError, match="is not a folder"):
        HubServer(tmp_path / "missing")
    (root / "datasets" / "org").mkdir(parents=True)
    (root / "datasets" / "org" / "stray.parquet").write_bytes(b"x")
    with pytest.raises(HubServerError, match="found a file"):
        HubServer(root)
    (root / "datasets" / "org" / "stray.parquet").unlink()
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        port = busy.getsockname()[1]
        with pytest.raises(HubServerError, match=f"127.0.0.1:{port}"):
            HubServer(root, port=port).start()
    finally:
        busy.close()
    with pytest.raises(HubServerError, match="error_rate"):
        Faults(error_rate=2)


def test_missing_root_from_the_command_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aiostream_hf.cli", "hub", "serve", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "is not a folder" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    return
