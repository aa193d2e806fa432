"""The local Hub server's hostile modes (Faults), driven over loopback with httpx2 and
huggingface_hub: each test asserts what a client can observe (status, headers, bytes,
counts from HubServer.stats())."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from collections.abc import Iterator
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import LocalEntryNotFoundError

from aiostream_hf import HubServerError
from aiostream_hf.testing import Faults, HubServer, make_repo

REPO = "org/hostile"
BLOB = "data/blob.parquet"  # LFS-like: served by the CDN
OTHER = "data/other.parquet"
SMALL = "small.txt"  # served by the Hub itself
README = "---\nlicense: mit\n---\n# hostile\n"
HF_YAML = "data_dir: data\n"


class Repo:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.blob = os.urandom(300_000)
        self.other = os.urandom(50_000)
        self.small = os.urandom(1000)
        self.folder = make_repo(
            root,
            REPO,
            {
                BLOB: self.blob,
                OTHER: self.other,
                SMALL: self.small,
                "README.md": README,
                ".huggingface.yaml": HF_YAML,
                **{f"d/f{i:02d}.txt": f"{i}\n" for i in range(12)},
            },
        )


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    root = tmp_path / "hub"
    root.mkdir()
    return Repo(root)


@pytest.fixture
def client() -> Iterator[httpx2.Client]:
    with httpx2.Client(timeout=30) as c:
        yield c


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _location(client: httpx2.Client, hub: HubServer, path: str) -> str:
    head = client.head(hub.url(REPO, path))
    assert head.status_code == 302, head.status_code
    return head.headers["Location"]


# -- 1. a file replaced mid-stream ----------------------------------------------------------


def test_a_cdn_file_is_replaced_after_its_nth_request(repo: Repo, client: httpx2.Client) -> None:
    faults = Faults(replace_after=2, replace_path=BLOB)
    new = faults.replacement(repo.blob)
    with HubServer(repo.root, faults=faults) as hub:
        head = client.head(hub.url(REPO, BLOB))
        location, old = head.headers["Location"], head.headers["X-Linked-Etag"]
        first = [client.get(location, headers={"Range": "bytes=0-99"}) for _ in range(2)]
        relinked = client.head(hub.url(REPO, BLOB))  # the Hub links what the CDN serves next
        third = client.get(location, headers={"Range": "bytes=0-99"})
        stale = client.get(location, headers={"If-Match": old, "Range": "bytes=0-99"})
        fresh = client.get(location, headers={"If-Match": third.headers["ETag"]})
        other = client.get(_location(client, hub, OTHER))
        listed = HfApi(endpoint=hub.endpoint).get_paths_info(REPO, [BLOB], repo_type="dataset")
        stats = hub.stats()
    assert old == f'"{_sha256(repo.blob)}"'
    assert [(r.status_code, r.headers["ETag"], r.content) for r in first] == [
        (206, old, repo.blob[:100])
    ] * 2
    assert new != repo.blob
    assert len(new) == len(repo.blob)
    assert third.status_code == 206
    assert third.content == new[:100]
    assert third.headers["ETag"] == f'"{_sha256(new)}"'
    assert relinked.headers["X-Linked-Etag"] == third.headers["ETag"]
    assert stale.status_code == 412
    assert fresh.status_code == 200
    assert fresh.content == new
    assert other.content == repo.other  # replace_path names one file
    assert listed[0].lfs is not None
    assert listed[0].lfs.sha256 == _sha256(repo.blob)  # the API still describes the disk
    assert stats.faults["replaced"] == 3


def test_any_direct_file_replaced_by_one_of_another_size(repo: Repo, client: httpx2.Client) -> None:
    faults = Faults(replace_after=0, replace_size=10)
    with HubServer(repo.root, faults=faults) as hub:
        small = client.get(hub.url(REPO, SMALL))
        readme = client.get(hub.url(REPO, "README.md"))
        stale = client.get(hub.url(REPO, SMALL), headers={"If-Match": f'"{_git_oid(repo.small)}"'})
        matching = client.get(hub.url(REPO, SMALL), headers={"If-Match": small.headers["ETag"]})
        longer = hub.set_faults(replace_size=2000)
        grown = client.get(hub.url(REPO, SMALL))
    assert small.status_code == 200
    assert small.content == repo.small[:10].translate(bytes(range(255, -1, -1)))
    assert small.content == faults.replacement(repo.small)
    assert small.headers["Content-Length"] == "10"
    assert small.headers["ETag"] == f'"{_git_oid(small.content)}"'
    assert readme.content == faults.replacement(README.encode())  # every path, with no path
    assert stale.status_code == 412
    assert len(stale.headers["X-Repo-Commit"]) == 40
    assert matching.status_code == 200
    assert grown.content == longer.replacement(repo.small)
    assert grown.content[1000:] == b"\xa5" * 1000


def test_a_lying_cdn_keeps_the_old_etag_over_other_bytes(repo: Repo, client: httpx2.Client) -> None:
    faults = Faults(replace_after=0, replace_keeps_etag=True)
    old = f'"{_sha256(repo.blob)}"'
    with HubServer(repo.root, faults=faults) as hub:
        head = client.head(hub.url(REPO, BLOB))
        got = client.get(head.headers["Location"], headers={"If-Match": old, "Range": "bytes=0-9"})
    assert head.headers["X-Linked-Etag"] == old
    assert got.status_code == 206  # If-Match holds: the ETag is the old one
    assert got.headers["ETag"] == old
    assert got.content == faults.replacement(repo.blob)[:10]
    assert got.content != repo.blob[:10]


def test_a_cdn_that_ignores_if_match_never_answers_412(repo: Repo, client: httpx2.Client) -> None:
    faults = Faults(replace_after=0, ignore_if_match=("cdn",))
    old = f'"{_sha256(repo.blob)}"'
    with HubServer(repo.root, faults=faults) as hub:
        location = _location(client, hub, BLOB)
        stale = client.get(location, headers={"If-Match": old, "Range": "bytes=0-9"})
        forged = client.get(location, headers={"If-Match": '"0000"', "Range": "bytes=0-9"})
        direct = client.get(hub.url(REPO, SMALL), headers={"If-Match": '"0000"'})
    assert stale.status_code == forged.status_code == 206
    assert stale.content == faults.replacement(repo.blob)[:10]
    assert stale.headers["ETag"] != old  # the new ETag, served despite If-Match
    assert direct.status_code == 412  # the Hub itself still honours If-Match


def test_replacement_is_set_while_running_and_counts_from_then(
    repo: Repo, client: httpx2.Client
) -> None:
    with HubServer(repo.root) as hub:
        before = client.get(hub.url(REPO, SMALL)).content
        faults = hub.set_faults(replace_after=1)
        counted = [client.get(hub.url(REPO, SMALL)).content for _ in range(2)]
        hub.set_faults(Faults())
        after = client.get(hub.url(REPO, SMALL)).content
        stats = hub.stats()
    assert before == counted[0] == after == repo.small
    assert counted[1] == faults.replacement(repo.small)
    assert stats.faults["replaced"] == 1


def test_a_file_changed_on_disk_is_served_changed_at_once(
    repo: Repo, client: httpx2.Client
) -> None:
    # Nothing caches contents; the hashes (ETags) follow size, mtime and inode, and a
    # file written in the last 50 ms is hashed again: a same-size rewrite right after a
    # read is seen at the next request.
    new_small, new_blob = os.urandom(len(repo.small)), os.urandom(len(repo.blob))
    with HubServer(repo.root) as hub:
        first = client.get(hub.url(REPO, SMALL))
        old_location = _location(client, hub, BLOB)
        (repo.folder / SMALL).write_bytes(new_small)
        (repo.folder / BLOB).write_bytes(new_blob)
        second = client.get(hub.url(REPO, SMALL))
        gone = client.get(old_location)
        stale = client.get(old_location, headers={"If-Match": f'"{_sha256(repo.blob)}"'})
        head = client.head(hub.url(REPO, BLOB))
        fresh = client.get(head.headers["Location"])
    assert first.content == repo.small
    assert second.content == new_small
    assert second.headers["ETag"] == f'"{_git_oid(new_small)}"'
    assert second.headers["X-Repo-Commit"] != first.headers["X-Repo-Commit"]
    assert gone.status_code == 410  # the signed URL named the old blob
    assert stale.status_code == 412
    assert head.headers["X-Linked-Etag"] == f'"{_sha256(new_blob)}"'
    assert fresh.content == new_blob


# -- 2. ETag flavours -------------------------------------------------------------------------


def test_strong_etags_and_last_modified_by_default(repo: Repo, client: httpx2.Client) -> None:
    with HubServer(repo.root) as hub:
        direct = client.get(hub.url(REPO, SMALL))
        cdn = client.get(_location(client, hub, BLOB), headers={"Range": "bytes=0-9"})
    assert direct.headers["ETag"] == f'"{_git_oid(repo.small)}"'
    assert cdn.headers["ETag"] == f'"{_sha256(repo.blob)}"'
    mtime = (repo.folder / SMALL).stat().st_mtime
    assert int(parsedate_to_datetime(direct.headers["Last-Modified"]).timestamp()) == int(mtime)
    assert "Last-Modified" in cdn.headers


def test_weak_etags_never_match_if_match_or_if_range(repo: Repo, client: httpx2.Client) -> None:
    with HubServer(repo.root, faults=Faults(etag_style="weak")) as hub:
        direct = client.get(hub.url(REPO, SMALL))
        head = client.head(hub.url(REPO, BLOB))
        location = head.headers["Location"]
        cdn = client.get(location, headers={"Range": "bytes=0-9"})
        weak = cdn.headers["ETag"]
        if_range = client.get(location, headers={"Range": "bytes=0-9", "If-Range": weak})
        if_match = client.get(location, headers={"Range": "bytes=0-9", "If-Match": weak})
        strong_if_match = client.get(
            hub.url(REPO, SMALL), headers={"If-Match": f'"{_git_oid(repo.small)}"'}
        )
    assert direct.headers["ETag"] == f'W/"{_git_oid(repo.small)}"'
    assert weak == f'W/"{_sha256(repo.blob)}"'
    assert head.headers["X-Linked-Etag"] == f'"{_sha256(repo.blob)}"'  # the Hub's metadata
    assert if_range.status_code == 200  # a weak validator: the whole file, not a range
    assert if_range.content == repo.blob
    assert if_match.status_code == 412
    assert strong_if_match.status_code == 412


def test_no_etag_and_no_last_modified(repo: Repo, client: httpx2.Client, tmp_path: Path) -> None:
    faults = Faults(etag_style="none", last_modified=False)
    with HubServer(repo.root, faults=faults) as hub:
        direct = client.get(hub.url(REPO, SMALL), headers={"If-Match": '"0000"'})
        location = _location(client, hub, BLOB)
        cdn = client.get(
            location, headers={"Range": "bytes=0-9", "If-Range": '"0000"', "If-Match": '"0000"'}
        )
        with pytest.raises(LocalEntryNotFoundError, match="does not have an ETag"):
            hf_hub_download(
                REPO, SMALL, repo_type="dataset", endpoint=hub.endpoint, cache_dir=tmp_path / "c"
            )
        hub.set_faults(etag_targets=("cdn",), last_modified=True)
        direct_again = client.get(hub.url(REPO, SMALL))
        cdn_again = client.get(location, headers={"Range": "bytes=0-9"})
    for r in (direct, cdn):
        assert "ETag" not in r.headers
        assert "Last-Modified" not in r.headers
    assert direct.status_code == 200  # no validators: If-Match is not evaluated
    assert cdn.status_code == 206  # nor If-Range: the range is served
    assert cdn.content == repo.blob[:10]
    assert direct_again.headers["ETag"] == f'"{_git_oid(repo.small)}"'  # only the CDN has none
    assert "ETag" not in cdn_again.headers
    assert "Last-Modified" in cdn_again.headers


# -- 3. trickle --------------------------------------------------------------------------------


def test_a_trickled_body_never_trips_a_per_read_timeout(repo: Repo) -> None:
    # 1 byte every 20 ms: the 300 kB blob would take 100 minutes, far past the test's
    # timeout, while every read gets its byte well within the 10 s read timeout.
    faults = Faults(trickle_every=1, trickle_bytes=1, trickle_interval_ms=20, targets=("cdn",))
    received = b""
    reads = 0
    with (
        HubServer(repo.root, faults=faults) as hub,
        httpx2.Client(timeout=httpx2.Timeout(10.0)) as client,
    ):
        location = _location(client, hub, BLOB)  # the resolvers bucket is not targeted
        whole_small = client.get(hub.url(REPO, SMALL)).content
        with client.stream("GET", location) as response:
            announced = int(response.headers["Content-Length"])
            for chunk in response.iter_raw():
                received += chunk
                reads += 1
                if reads == 8:
                    break
        stats = hub.stats()
    assert whole_small == repo.small
    assert announced == len(repo.blob)
    assert received == repo.blob[: len(received)]
    assert 8 <= len(received) < len(repo.blob)
    assert stats.faults["trickle"] == 1


def test_a_trickle_stops_when_its_client_goes(repo: Repo) -> None:
    faults = Faults(trickle_every=1, trickle_interval_ms=20, targets=("resolvers",))
    with HubServer(repo.root, faults=faults) as hub:
        with httpx2.Client(timeout=10) as client, client.stream("GET", hub.url(REPO, SMALL)) as r:
            first = next(r.iter_raw())
        # The server notices the closed connection between two pieces (nothing timed:
        # the wait is bounded only so that a failure does not hang).
        app = hub._app
        assert app is not None
        for _ in range(1000):
            if app.counters.concurrent == 0:
                break
            time.sleep(0.01)
        stats = hub.stats()
    assert first == repo.small[: len(first)]
    assert app.counters.concurrent == 0
    assert stats.bytes_served < len(repo.small)


# -- 4. endless pages --------------------------------------------------------------------------


def _pages(client: httpx2.Client, url: str, n: int) -> tuple[list[Any], set[str]]:
    pages, next_urls = [], set()
    for _ in range(n):
        r = client.get(url)
        assert r.status_code == 200
        pages.append(r.json())
        url = r.links["next"]["url"]
        next_urls.add(url)
    return pages, next_urls


@pytest.mark.parametrize("mode", ["repeat", "empty", "fresh"])
def test_the_tree_announces_a_next_page_forever(
    repo: Repo, client: httpx2.Client, mode: Any
) -> None:
    with HubServer(repo.root, tree_page_size=5, faults=Faults(endless_pages=mode)) as hub:
        url = f"{hub.endpoint}/api/datasets/{REPO}/tree/main/d"
        pages, next_urls = _pages(client, url, 12)
        listed: list[Any] = []
        if mode != "empty":  # an empty page forever would never yield
            entries = HfApi(endpoint=hub.endpoint).list_repo_tree(REPO, "d", repo_type="dataset")
            listed = list(itertools.islice(entries, 40))
        stats = hub.stats()
    real = [e["path"] for page in pages[:3] for e in page]
    past = pages[3:]
    assert real == [f"d/f{i:02d}.txt" for i in range(12)]
    assert len(next_urls) == 12  # a new cursor every time
    if mode == "repeat":
        assert past[:6] == pages[:3] * 2
    elif mode == "empty":
        assert past == [[]] * 9
    else:
        paths = [e["path"] for page in past for e in page]
        assert len(paths) == len(set(paths)) == 45
        assert all(p.startswith("d/endless-") for p in paths)
    if mode != "empty":
        assert len(listed) == 40  # huggingface_hub follows the pages past the 12 entries
    assert stats.faults["endless_page"] >= 9
    assert stats.by_endpoint["tree"] >= 12


# -- 5. oversized bodies and lying Content-Length ----------------------------------------------


def test_api_answers_padded_to_a_size_stay_valid_json(repo: Repo, client: httpx2.Client) -> None:
    size = 2_000_000
    with HubServer(repo.root, faults=Faults(pad_api_bytes=size)) as hub:
        info = client.get(f"{hub.endpoint}/api/datasets/{REPO}")
        revision = client.get(f"{hub.endpoint}/api/datasets/{REPO}/revision/main")
        tree = client.get(f"{hub.endpoint}/api/datasets/{REPO}/tree/main")
        by_hub = HfApi(endpoint=hub.endpoint).dataset_info(REPO)
        hub.set_faults(pad_api_endpoints=("tree",))
        small_info = client.get(f"{hub.endpoint}/api/datasets/{REPO}")
        missing = client.get(f"{hub.endpoint}/api/datasets/org/missing")
        stats = hub.stats()
    for r in (info, revision, tree):
        assert r.headers["Content-Length"] == str(size)
        assert len(r.content) == size
    assert info.json()["id"] == revision.json()["id"] == by_hub.id == REPO
    assert "README.md" in {e["path"] for e in tree.json()}
    assert len(small_info.content) < 10_000
    assert len(missing.content) < 10_000  # errors are never padded
    assert stats.faults["padded_api"] == 4


def test_text_files_padded_to_a_size(repo: Repo, client: httpx2.Client) -> None:
    size = 1_000_000
    with HubServer(repo.root, faults=Faults(pad_text_bytes=size)) as hub:
        readme = client.get(hub.url(REPO, "README.md"))
        hf_yaml = client.get(hub.url(REPO, ".huggingface.yaml"))
        small = client.get(hub.url(REPO, SMALL))
        listed = HfApi(endpoint=hub.endpoint).get_paths_info(
            REPO, ["README.md"], repo_type="dataset"
        )
        stats = hub.stats()
    assert readme.headers["Content-Length"] == str(size)
    assert readme.content == README.encode() + b"\n" * (size - len(README))
    assert readme.headers["ETag"] == f'"{_git_oid(readme.content)}"'
    assert len(hf_yaml.content) == size
    assert yaml.safe_load(hf_yaml.content) == {"data_dir": "data"}  # still the same YAML
    assert small.content == repo.small  # not a padded path
    assert listed[0].size == len(README)  # the API still describes the disk
    assert stats.faults["padded_text"] == 2


def test_a_content_length_that_announces_more_than_is_sent(
    repo: Repo, client: httpx2.Client
) -> None:
    faults = Faults(length_lie_every=1, length_lie_bytes=100, targets=("resolvers",))
    received = b""
    with HubServer(repo.root, faults=faults) as hub:
        with client.stream("GET", hub.url(REPO, SMALL)) as r:
            announced = int(r.headers["Content-Length"])
            with pytest.raises(httpx2.RemoteProtocolError):  # noqa: PT012
                for chunk in r.iter_raw():
                    received += chunk
        stats = hub.stats()
    assert announced == len(repo.small) + 100
    assert received == repo.small  # all the true bytes, then the connection closed
    assert stats.faults["length_lie"] == 1


def test_a_content_length_that_announces_fewer_bytes(repo: Repo, client: httpx2.Client) -> None:
    faults = Faults(length_lie_every=1, length_lie_bytes=-100, targets=("resolvers", "cdn"))
    with HubServer(repo.root, faults=faults) as hub:
        short = client.get(hub.url(REPO, SMALL))
        location = _location(client, hub, BLOB)  # a HEAD: not a lie, no body
        ranged = client.get(location, headers={"Range": "bytes=0-999"})
        stats = hub.stats()
    assert short.status_code == 200  # a complete, short answer
    assert short.content == repo.small[:-100]
    assert short.headers["Content-Length"] == str(len(repo.small) - 100)
    assert ranged.status_code == 206
    assert ranged.headers["Content-Range"] == f"bytes 0-999/{len(repo.blob)}"
    assert ranged.content == repo.blob[:900]
    assert stats.faults["length_lie"] == 2


# -- 6. redirect loops and hostile tree paths ----------------------------------------------


def test_a_resolver_that_redirects_to_itself(repo: Repo) -> None:
    faults = Faults(redirect_loop_every=1, targets=("resolvers",))
    with HubServer(repo.root, faults=faults) as hub, httpx2.Client() as client:
        url = hub.url(REPO, SMALL)
        looped = client.get(url)
        with pytest.raises(httpx2.TooManyRedirects):
            client.get(url, follow_redirects=True)
        hub.set_faults(redirect_loop_every=None, redirect_loop_at=(1,))
        once = client.get(url, follow_redirects=True)
        stats = hub.stats()
    assert looped.status_code == 302
    assert looped.headers["Location"] == url
    assert once.content == repo.small  # one loop, then the file
    assert len(once.history) == 1
    assert stats.faults["redirect_loop"] == 1 + 21 + 1  # httpx2 follows 20 redirects
    assert stats.by_endpoint["redirect_loop"] == stats.faults["redirect_loop"]


def test_a_cdn_redirect_loop_keeps_the_signed_query(repo: Repo, client: httpx2.Client) -> None:
    with HubServer(repo.root, faults=Faults(redirect_loop_at=(1,), targets=("cdn",))) as hub:
        location = _location(client, hub, BLOB)
        looped = client.get(location)
        served = client.get(location, headers={"Range": "bytes=0-9"})
    assert looped.status_code == 302
    assert looped.headers["Location"] == location
    assert served.content == repo.blob[:10]


def test_hostile_paths_in_tree_listings(repo: Repo, client: httpx2.Client) -> None:
    hostile = Faults.HOSTILE_PATHS
    assert any(".." in p.split("/") for p in hostile)
    assert any(p.startswith("/") for p in hostile)
    assert any("%2F.." in p for p in hostile)
    with HubServer(repo.root, faults=Faults(hostile_tree_paths=hostile)) as hub:
        api = HfApi(endpoint=hub.endpoint)
        tree = [e.path for e in api.list_repo_tree(REPO, repo_type="dataset", recursive=True)]
        sub = client.get(f"{hub.endpoint}/api/datasets/{REPO}/tree/main/d").json()
        infos = api.get_paths_info(REPO, [hostile[0], SMALL], repo_type="dataset")
        siblings = [s.rfilename for s in api.dataset_info(REPO).siblings or []]
        resolved = [client.get(hub.url(REPO, p)).status_code for p in hostile]
    assert set(hostile) <= set(tree)
    assert set(hostile) <= {e["path"] for e in sub}
    assert [i.path for i in infos] == [hostile[0], SMALL]
    assert set(hostile) <= set(siblings)
    assert resolved == [404] * len(hostile)


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"trickle_bytes": 0}, "trickle_bytes"),
        ({"trickle_interval_ms": 0}, "trickle_interval_ms"),
        ({"trickle_at": (0,)}, "trickle_at"),
        ({"length_lie_bytes": 0}, "no lie"),
        ({"etag_style": "bogus"}, "etag_style"),
        ({"endless_pages": "sometimes"}, "endless_pages"),
        ({"ignore_if_match": ("api",)}, "ignore_if_match"),
        ({"etag_targets": ("pages",)}, "etag_targets"),
        ({"pad_api_endpoints": ("nope",)}, "pad_api_endpoints"),
        ({"replace_after": -1}, "replace_after"),
        ({"replace_path": "/"}, "replace_path"),
        ({"redirect_loop_rate": 2.0}, "redirect_loop_rate"),
        ({"hostile_tree_paths": ("",)}, "hostile_tree_paths"),
    ],
)
def test_bad_hostile_settings_get_clear_errors(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(HubServerError, match=match):
        Faults(**changes)


def test_hostile_faults_survive_json_and_a_subprocess(repo: Repo) -> None:
    faults = Faults(
        trickle_at=(3,),
        length_lie_at=(2,),
        redirect_loop_at=(4,),
        replace_after=1,
        replace_path=SMALL,
        replace_size=5,
        ignore_if_match=("cdn",),
        etag_style="weak",
        etag_targets=("resolvers",),
        endless_pages="fresh",
        pad_api_endpoints=("tree",),
        pad_text_paths=("README.md",),
        hostile_tree_paths=Faults.HOSTILE_PATHS,
    )
    assert Faults.from_json(json.loads(json.dumps(faults.to_json()))) == faults
    assert Faults().replacement(b"\x00\x0f") == b"\xff\xf0"
    assert Faults(replace_size=1).replacement(b"\x00\x0f") == b"\xff"
    with HubServer(repo.root, subprocess=True) as hub, httpx2.Client() as client:
        hub.set_faults(etag_style="weak", replace_after=0, replace_path=SMALL)
        r = client.get(hub.url(REPO, SMALL))
    new = Faults().replacement(repo.small)
    assert r.content == new
    assert r.headers["ETag"] == f'W/"{_git_oid(new)}"'
