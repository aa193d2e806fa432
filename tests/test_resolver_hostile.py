"""The Resolver against hostile or broken servers: no byte from a server is trusted.

Private entries stay with their token, answers are bounded (pages, files, bytes, YAML
nodes), tree paths are clean, every field is type-checked, every failure is one of the
library's errors, and waits are bounded. Unit tests drive a fake Hub through an
``httpx2.MockTransport``; the private-cache, billion-laughs and unreachable-endpoint
tests use the local Hub server (or a closed loopback port).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import re
import socket
import stat
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import yaml

from aiostream_hf import (
    FetchError,
    RateLimitedError,
    RepoNotFoundError,
    ResolutionError,
    UnreachableError,
)
from aiostream_hf import _resolver as resolver_module
from aiostream_hf._client import HubClient
from aiostream_hf._hub_layout import _load_yaml
from aiostream_hf._models import Manifest
from aiostream_hf._options import StreamOptions
from aiostream_hf._resolver import MAX_REDIRECTS, Resolver
from aiostream_hf.stores import hub as hub_store
from aiostream_hf.testing import Faults, HubServer, make_repo, make_repo_split_naming

pytestmark = pytest.mark.anyio

HUB = "http://hub.test"
SHA = "0123456789abcdef0123456789abcdef01234567"
OID = "f" * 40
SOURCE = "hf://datasets/org/name"
PINNED = f"{SOURCE}@{SHA}"

Handler = Callable[[httpx2.Request], "httpx2.Response | Awaitable[httpx2.Response]"]


def _entry(path: Any, **fields: Any) -> dict[str, Any]:
    return {"type": "file", "path": path, "size": 1, "oid": OID, **fields}


def _page(entries: list[Any], next_url: str | None = None) -> httpx2.Response:
    headers = {"Link": f'<{next_url}>; rel="next"'} if next_url else {}
    headers["Content-Type"] = "application/json"
    return httpx2.Response(200, content=json.dumps(entries).encode(), headers=headers)


class FakeHub:
    """A fake Hub with one dataset repo, org/name: its revision answer (``pin``), its
    tree pages (``tree``) and its files (``resolve``), each replaceable by a test. Counts
    the requests of each kind."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.pin: Handler = lambda request: httpx2.Response(200, json={"sha": SHA})
        self.tree: Handler = lambda request: _page([_entry("train.parquet")])
        self.resolve: Handler = lambda request: httpx2.Response(404)

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if path.startswith("/api/datasets/org/name/revision/"):
            kind = "pin"
        elif path.startswith("/api/datasets/org/name/tree/"):
            kind = "tree"
        elif path.startswith("/datasets/org/name/resolve/"):
            kind = "resolve"
        else:
            self.counts["other"] += 1
            return httpx2.Response(404, headers={"X-Error-Code": "RepoNotFound"})
        self.counts[kind] += 1
        answer = getattr(self, kind)(request)
        if inspect.isawaitable(answer):
            answer = await answer
        assert isinstance(answer, httpx2.Response)
        return answer


@contextlib.asynccontextmanager
async def _resolver(hub: FakeHub, tmp_path: Path, **options: Any) -> AsyncIterator[Resolver]:
    opts = StreamOptions(
        cache_dir=tmp_path / "cache", backoff_base=0.001, backoff_max=0.01, **options
    )
    async with (
        HubClient(transport=httpx2.MockTransport(hub)) as client,
        Resolver(options=opts, client=client) as resolver,
    ):
        yield resolver


async def _resolve(hub: FakeHub, tmp_path: Path, source: str = SOURCE, **options: Any) -> Manifest:
    async with _resolver(hub, tmp_path, **options) as resolver:
        return await resolver.resolve(source, endpoint=HUB, token=False)


async def test_the_fake_hub_resolves_a_file(tmp_path: Path) -> None:
    manifest = await _resolve(FakeHub(), tmp_path)
    assert [(f.path, f.size, f.etag) for f in manifest.files] == [("train.parquet", 1, OID)]
    assert manifest.commit == SHA


# -- 1. private stays private ----------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def test_a_private_manifest_is_not_served_to_a_caller_without_its_token(
    tmp_path: Path,
) -> None:
    root = tmp_path / "hub"
    root.mkdir()
    make_repo_split_naming(root, "org/private")
    source = "hf://datasets/org/private"
    options = StreamOptions(cache_dir=tmp_path / "cache", pin_ttl=3600)
    async with HubServer(root, private={"org/private": ["tok"]}) as hub:
        async with Resolver(options=options) as r:
            owned = await r.resolve(source, endpoint=hub.endpoint, token="tok")
            assert len(owned.files) == 3
            # The same Resolver (its memory) does not hand it to another caller either.
            with pytest.raises(RepoNotFoundError, match="'org/private'"):
                await r.resolve(source, endpoint=hub.endpoint, token=False)
        for token in (False, "wrong"):
            async with Resolver(options=options) as r:  # a fresh process: the disk cache
                with pytest.raises(RepoNotFoundError, match="'org/private'"):
                    await r.resolve(source, endpoint=hub.endpoint, token=token)
                assert r.statistics().disk_hits == 0
        hub.reset_stats()
        async with Resolver(options=options) as r:  # the token's owner still gets it
            again = await r.resolve(source, endpoint=hub.endpoint, token="tok")
            assert r.statistics().disk_hits == 2  # the pin and the manifest
        assert hub.stats().requests == 0
    assert again == owned

    folder = tmp_path / "cache" / "resolutions"
    assert _mode(folder) == 0o700
    entries = sorted(folder.glob("*.json"))
    locks = sorted(folder.glob("*.lock"))
    assert entries
    assert locks
    assert {p.name: _mode(p) for p in [*entries, *locks]} == {
        p.name: 0o600 for p in [*entries, *locks]
    }
    assert "tok" not in "".join(p.read_text() for p in entries)  # a hash of it at most


async def test_a_cache_folder_with_wider_bits_is_made_private(tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "resolutions"
    folder.mkdir(parents=True)
    folder.chmod(0o755)
    await _resolve(FakeHub(), tmp_path)
    assert _mode(folder) == 0o700
    assert all(_mode(p) == 0o600 for p in folder.iterdir())


async def test_tokens_do_not_share_in_memory_entries(tmp_path: Path) -> None:
    """A public repo read with two tokens and none: three resolutions, none shared."""
    hub = FakeHub()
    async with _resolver(hub, tmp_path) as r:
        for token in ("a", "b", False, "a"):
            await r.resolve(SOURCE, endpoint=HUB, token=token)
        assert r.statistics().resolutions == 3
        assert r.statistics().memory_hits == 2  # token "a" again: its pin and manifest
    assert hub.counts == {"pin": 3, "tree": 3}


# -- 2. bounded answers ------------------------------------------------------------------------


async def test_endless_tree_pages_stop_at_max_tree_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_store, "MAX_TREE_PAGES", 5)
    hub = FakeHub()

    def endless(request: httpx2.Request) -> httpx2.Response:
        n = int(request.url.params.get("cursor", "0"))
        return _page(
            [_entry(f"p{n}.parquet")], f"{HUB}/api/datasets/org/name/tree/{SHA}?cursor={n + 1}"
        )

    hub.tree = endless
    with pytest.raises(ResolutionError, match=r"org/name.* past 5 pages \(MAX_TREE_PAGES\)"):
        await _resolve(hub, tmp_path)
    assert hub.counts["tree"] == 5


async def test_an_empty_page_that_announces_another_is_refused(tmp_path: Path) -> None:
    hub = FakeHub()
    hub.tree = lambda request: _page([], f"{HUB}/api/datasets/org/name/tree/{SHA}?cursor=x")
    with pytest.raises(ResolutionError, match="org/name.* is empty yet announces another"):
        await _resolve(hub, tmp_path)
    assert hub.counts["tree"] == 1


async def test_a_listing_over_max_tree_files_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_store, "MAX_TREE_FILES", 3)
    hub = FakeHub()
    hub.tree = lambda request: _page([_entry(f"{i}.parquet") for i in range(4)])
    with pytest.raises(ResolutionError, match=r"org/name.* more than 3 files \(MAX_TREE_FILES\)"):
        await _resolve(hub, tmp_path)


async def test_a_listing_over_max_tree_bytes_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_store, "MAX_TREE_BYTES", 1000)
    hub = FakeHub()

    def pages(request: httpx2.Request) -> httpx2.Response:
        n = int(request.url.params.get("cursor", "0"))
        entries = [_entry(f"{n}-{i}.parquet") for i in range(5)]
        return _page(entries, f"{HUB}/api/datasets/org/name/tree/{SHA}?cursor={n + 1}")

    hub.tree = pages
    with pytest.raises(ResolutionError, match=r"org/name.* over 1000 bytes \(MAX_TREE_BYTES\)"):
        await _resolve(hub, tmp_path)
    page = len(json.dumps([_entry(f"0-{i}.parquet") for i in range(5)]))
    assert hub.counts["tree"] == 1000 // page + 1  # the page that goes over is the last


async def test_a_body_over_its_cap_is_not_read_to_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resolver_module, "MAX_API_BODY", 1000)
    pulled = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal pulled
        yield b"["
        while True:
            pulled += 1
            yield b" " * 500

    hub = FakeHub()
    hub.tree = lambda request: httpx2.Response(200, content=endless())
    with pytest.raises(ResolutionError, match=r"/tree/.* over the 1000 bytes \(MAX_API_BODY\)"):
        await _resolve(hub, tmp_path)
    assert pulled <= 3
    assert hub.counts["tree"] == 1  # not retried


async def test_a_content_length_over_the_cap_fails_before_reading(tmp_path: Path) -> None:
    read = False

    async def body() -> AsyncIterator[bytes]:
        nonlocal read
        read = True
        yield b"{}"

    hub = FakeHub()
    hub.pin = lambda request: httpx2.Response(
        200, content=body(), headers={"Content-Length": str(10**12)}
    )
    with pytest.raises(ResolutionError, match=r"revision/main.* announces a body of 10{12} bytes"):
        await _resolve(hub, tmp_path)
    assert not read


async def test_a_readme_over_max_text_body_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resolver_module, "MAX_TEXT_BODY", 100)
    hub = FakeHub()
    hub.tree = lambda request: _page([_entry("README.md"), _entry("train.parquet")])
    hub.resolve = lambda request: httpx2.Response(200, content=b"---\na: 1\n---\n" + b"x" * 200)
    with pytest.raises(ResolutionError, match=r"README.md .*over the 100 bytes \(MAX_TEXT_BODY\)"):
        await _resolve(hub, tmp_path, PINNED)


# -- 3. YAML -----------------------------------------------------------------------------------


def _laughs() -> str:
    """9 levels of 9 aliases each: 9**9 (387 million) leaves from about 600 bytes."""
    names = "abcdefghi"
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip(names, names[1:], strict=False):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines) + "\n"


LAUGHS = _laughs()


def test_billion_laughs_is_refused_by_node_count() -> None:
    assert len(LAUGHS) < 700
    with pytest.raises(
        ResolutionError, match=r"x.yaml: .* more than 100000 nodes \(MAX_YAML_NODES"
    ):
        _load_yaml(LAUGHS, "x.yaml")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_billion_laughs_allocates_nothing_big() -> None:
    """In a process that may not grow by 1 GiB, the refusal still comes (yaml.safe_load
    of the same text takes several GB, then MemoryError)."""
    script = (
        "import re, resource, sys\n"
        "from aiostream_hf._hub_layout import _load_yaml\n"
        "from aiostream_hf import ResolutionError\n"
        "text = open('/proc/self/status').read()\n"
        "now = int(re.search(r'VmSize:\\s*(\\d+) kB', text).group(1)) * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (now + (1 << 30), now + (1 << 30)))\n"
        "try:\n"
        "    _load_yaml(sys.stdin.read(), 'lol.yaml')\n"
        "except ResolutionError as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], input=LAUGHS, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: lol.yaml" in done.stdout
    assert "MAX_YAML_NODES" in done.stdout


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &a [*a]\n", "points into itself"),
        ("a: &a {b: *a}\n", "points into itself"),
        ("[" * 5000 + "]" * 5000, "cannot be read|not valid YAML"),
        ("a: " + "1" * 5000 + "\n", "cannot be read"),
        ("a: *nope\n", "not valid YAML"),
        ("a: [1\n", "not valid YAML"),
    ],
)
def test_yaml_that_cannot_be_read_is_a_resolution_error(text: str, message: str) -> None:
    with pytest.raises(ResolutionError, match=rf"^card\.yaml.*(?:{message})"):
        _load_yaml(text, "card.yaml")


def test_yaml_with_aliases_under_the_limit_loads_as_safe_load_does() -> None:
    text = (
        "base: &base {data_files: 'x/*.parquet', default: true}\n"
        "configs:\n- <<: *base\n  config_name: one\n- <<: *base\n  config_name: two\n"
        "list: &l [1, 2, 3]\nagain: [*l, *l]\nwhen: 2024-01-02\n"
    )
    assert _load_yaml(text, "card.yaml") == yaml.safe_load(text)


async def test_a_billion_laughs_huggingface_yaml_fails_fast(tmp_path: Path) -> None:
    root = tmp_path / "hub"
    make_repo(root, "org/lol", {".huggingface.yaml": LAUGHS, "train.parquet": b"PAR1"})
    async with HubServer(root) as hub, Resolver(options=StreamOptions(cache_dir=tmp_path)) as r:
        with pytest.raises(
            ResolutionError, match=r"org/lol@main .*\.huggingface\.yaml: .*MAX_YAML_NODES"
        ):
            await r.resolve("hf://datasets/org/lol", endpoint=hub.endpoint)


async def test_a_billion_laughs_readme_fails_fast(tmp_path: Path) -> None:
    hub = FakeHub()
    hub.tree = lambda request: _page([_entry("README.md"), _entry("train.parquet")])
    readme = f"---\n{LAUGHS}---\n# lol\n".encode()
    hub.resolve = lambda request: httpx2.Response(200, content=readme)
    with pytest.raises(ResolutionError, match=rf"org/name@{SHA}: README.md: .*MAX_YAML_NODES"):
        await _resolve(hub, tmp_path, PINNED)


# -- 4. hostile tree paths ---------------------------------------------------------------------

BAD_PATHS = [
    "../escape.parquet",
    "data/../../escape.parquet",
    "/etc/escape.parquet",
    "data\\..\\escape.parquet",
    "a\x00b.parquet",
    "a\nb.parquet",
    "data//x.parquet",
    "./x.parquet",
    "data/./x.parquet",
    "data/",
    "",
    "\ud800.parquet",
    "x" * 5000 + ".parquet",
    7,
    None,
]


@pytest.mark.parametrize("path", BAD_PATHS, ids=[repr(p)[:24] for p in BAD_PATHS])
async def test_a_tree_path_that_is_not_clean_is_refused(path: Any, tmp_path: Path) -> None:
    hub = FakeHub()
    hub.tree = lambda request: _page([_entry("train.parquet"), _entry(path)])
    with pytest.raises(ResolutionError, match=r"the tree of org/name@main .* lists a file") as e:
        await _resolve(hub, tmp_path)
    assert repr(path)[:40] in str(e.value)
    assert "refusing it" in str(e.value)
    assert hub.counts["resolve"] == 0


async def test_a_tree_path_outside_the_listed_folder_is_refused(tmp_path: Path) -> None:
    hub = FakeHub()
    hub.tree = lambda request: _page([_entry("data/a.parquet"), _entry("other/b.parquet")])
    with pytest.raises(ResolutionError, match=r"'other/b.parquet' .*outside the folder 'data'"):
        await _resolve(hub, tmp_path, f"{SOURCE}/data/*.parquet")


async def test_a_path_listed_twice_is_refused(tmp_path: Path) -> None:
    hub = FakeHub()
    hub.tree = lambda request: _page([_entry("a.parquet"), _entry("a.parquet", size=2)])
    with pytest.raises(ResolutionError, match="lists 'a.parquet' twice"):
        await _resolve(hub, tmp_path)


# -- 5. every field type-checked, every error ours ---------------------------------------------

BAD_ENTRIES: list[Any] = [
    _entry("a.parquet", size="12"),
    _entry("a.parquet", size=-1),
    _entry("a.parquet", size=True),
    _entry("a.parquet", size=1.5),
    _entry("a.parquet", size=None),
    _entry("a.parquet", size=2**64),
    _entry("a.parquet", oid="not-hex"),
    _entry("a.parquet", oid=12),
    _entry("a.parquet", oid="F" * 40),
    {"type": "file", "path": "a.parquet", "size": 1},
    _entry("a.parquet", lfs="x"),
    _entry("a.parquet", lfs={"oid": "../x"}),
    "a.parquet",
    ["a.parquet"],
    {"path": "a.parquet", "size": 1, "oid": OID},
    {"type": 5, "path": "a.parquet"},
]


@pytest.mark.parametrize("entry", BAD_ENTRIES, ids=[repr(e)[:40] for e in BAD_ENTRIES])
async def test_a_malformed_tree_entry_is_refused(entry: Any, tmp_path: Path) -> None:
    hub = FakeHub()
    hub.tree = lambda request: _page([entry])
    with pytest.raises(ResolutionError, match=r"/tree/.* in org/name@main"):
        await _resolve(hub, tmp_path)


async def test_an_lfs_entry_takes_its_sha256_as_etag(tmp_path: Path) -> None:
    sha256 = "e" * 64
    hub = FakeHub()
    hub.tree = lambda request: _page([_entry("a.parquet", lfs={"oid": sha256, "size": 1})])
    manifest = await _resolve(hub, tmp_path)
    assert manifest.files[0].etag == sha256


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ([], "answered list, not an object"),
        ({"sha": 5}, "no commit sha"),
        ({"sha": "abc"}, "no commit sha"),
        ({"sha": SHA, "gated": {}}, "gated=.*not a bool"),
    ],
)
async def test_a_malformed_revision_answer_is_refused(
    answer: Any, message: str, tmp_path: Path
) -> None:
    hub = FakeHub()
    hub.pin = lambda request: httpx2.Response(200, json=answer)
    with pytest.raises(ResolutionError, match=rf"GET {re.escape(HUB)}/api/.*{message}"):
        await _resolve(hub, tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"sha": "\xff"}', "not UTF-8"),
        (b"[" * 100_000, "not JSON"),
        (b"{not json", "not JSON"),
        (b"\xef\xbb\xbf{}", "not JSON"),
    ],
    ids=["not-utf8", "deep", "garbage", "bom"],
)
async def test_a_body_that_is_not_json_is_a_resolution_error(
    content: bytes, message: str, tmp_path: Path
) -> None:
    hub = FakeHub()
    hub.pin = lambda request: httpx2.Response(200, content=content)
    with pytest.raises(
        ResolutionError, match=rf"revision/main answered something that is {message}"
    ):
        await _resolve(hub, tmp_path)


async def test_a_readme_that_is_not_utf8_is_a_resolution_error(tmp_path: Path) -> None:
    hub = FakeHub()
    hub.tree = lambda request: _page([_entry("README.md"), _entry("train.parquet")])
    hub.resolve = lambda request: httpx2.Response(200, content=b"---\na: \xff\n---\n")
    with pytest.raises(ResolutionError, match=r"README.md \(http://hub.test/.*\) is not UTF-8"):
        await _resolve(hub, tmp_path, PINNED)


async def test_a_body_that_does_not_decode_is_a_resolution_error(tmp_path: Path) -> None:
    hub = FakeHub()
    hub.pin = lambda request: httpx2.Response(
        200, content=b"not gzip at all", headers={"Content-Encoding": "gzip"}
    )
    with pytest.raises(ResolutionError, match=r"GET http://hub.test/api/.*revision/main.* Decod"):
        await _resolve(hub, tmp_path)
    assert hub.counts["pin"] == 1


async def test_a_redirect_loop_is_a_resolution_error(tmp_path: Path) -> None:
    hub = FakeHub()
    hub.pin = lambda request: httpx2.Response(302, headers={"Location": str(request.url)})
    with pytest.raises(
        ResolutionError, match=rf"revision/main.* redirects more than {MAX_REDIRECTS} times"
    ):
        await _resolve(hub, tmp_path)
    assert hub.counts["pin"] == MAX_REDIRECTS + 1


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("ftp://hub.test/x", "not an http\\(s\\) URL"),
        ("http://[::1", "not a valid URL"),
        ("file:///etc/passwd", "not an http\\(s\\) URL"),
    ],
)
async def test_a_redirect_off_http_is_a_resolution_error(
    location: str, message: str, tmp_path: Path
) -> None:
    hub = FakeHub()
    hub.pin = lambda request: httpx2.Response(307, headers={"Location": location})
    with pytest.raises(ResolutionError, match=rf"revision/main redirects to .*{message}"):
        await _resolve(hub, tmp_path)


async def test_redirects_are_followed_with_the_token_on_the_endpoint_only(
    tmp_path: Path,
) -> None:
    hub = FakeHub()
    seen: list[tuple[str, str | None]] = []

    def pin(request: httpx2.Request) -> httpx2.Response:
        seen.append((str(request.url), request.headers.get("Authorization")))
        if "renamed" not in request.url.path:
            return httpx2.Response(
                307, headers={"Location": "/api/datasets/org/name/revision/renamed"}
            )
        return httpx2.Response(200, json={"sha": SHA})

    hub.pin = pin
    async with _resolver(hub, tmp_path) as r:
        manifest = await r.resolve(SOURCE, endpoint=HUB, token="tok")
    assert manifest.commit == SHA
    assert [auth for _, auth in seen] == ["Bearer tok", "Bearer tok"]
    assert seen[1][0] == f"{HUB}/api/datasets/org/name/revision/renamed"


@pytest.mark.parametrize(
    ("link", "message"),
    [
        ("http://elsewhere.test/api/datasets/org/name/tree/x?cursor=1", "off http://hub.test"),
        ("ftp://hub.test/x", "off http://hub.test"),
        ("http://[::1", "not a valid URL"),
    ],
)
async def test_a_next_page_off_the_endpoint_is_refused(
    link: str, message: str, tmp_path: Path
) -> None:
    hub = FakeHub()
    hub.tree = lambda request: _page([_entry("a.parquet")], link)
    with pytest.raises(
        ResolutionError, match=rf"org/name@main .*announces a next page .*{message}"
    ):
        await _resolve(hub, tmp_path)
    assert hub.counts == {"pin": 1, "tree": 1}


# -- 6. bounded waits --------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_an_unreachable_endpoint_fails_fast_naming_hf_endpoint(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    options = StreamOptions(cache_dir=tmp_path, max_retries=8)
    async with HubClient() as client, Resolver(options=options, client=client) as r:
        with pytest.raises(UnreachableError, match=r"127\.0\.0\.1.*HF_ENDPOINT.*endpoint=") as e:
            await r.resolve(SOURCE, endpoint=endpoint, token=False)
        assert r.statistics().api_requests == 2  # one quick retry, not max_retries
        assert client.statistics().unreachable_hosts == 1
    assert isinstance(e.value, FetchError)
    assert e.value.attempts == 2


async def test_a_host_paused_past_max_rate_limit_wait_fails_at_once(tmp_path: Path) -> None:
    hub = FakeHub()
    hub.pin = lambda request: httpx2.Response(429, headers={"Retry-After": "3600"})
    with pytest.raises(RateLimitedError, match="max_rate_limit_wait"):
        await _resolve(hub, tmp_path, max_rate_limit_wait=5)
    assert hub.counts["pin"] == 1


@pytest.mark.parametrize("how", ["trickle", "silent"])
async def test_an_answer_that_never_completes_is_a_bounded_timeout(
    how: str, tmp_path: Path
) -> None:
    """The per-read timeout never fires on a trickle: the whole answer has a deadline."""

    async def trickle() -> AsyncIterator[bytes]:
        yield b"{"
        while True:
            await anyio.sleep(0.02)
            yield b" "

    async def answer(request: httpx2.Request) -> httpx2.Response:
        if how == "silent":
            await anyio.sleep_forever()
        return httpx2.Response(200, content=trickle())

    hub = FakeHub()
    hub.pin = answer
    with pytest.raises(ResolutionError, match="failed after 2 attempts: no whole answer within"):
        await _resolve(hub, tmp_path, timeout=0.05, max_retries=1)
    assert hub.counts["pin"] == 2


async def test_a_transport_error_is_retried_then_reported(tmp_path: Path) -> None:
    hub = FakeHub()

    def broken(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.RemoteProtocolError("peer closed", request=request)

    hub.pin = broken
    with pytest.raises(ResolutionError, match="failed after 3 attempts: RemoteProtocolError"):
        await _resolve(hub, tmp_path, max_retries=2)
    assert hub.counts["pin"] == 3


def test_the_limits_are_documented() -> None:
    doc = resolver_module.__doc__ or ""
    for name in (
        "MAX_API_BODY",
        "MAX_TEXT_BODY",
        "MAX_TREE_PAGES",
        "MAX_TREE_FILES",
        "MAX_TREE_BYTES",
        "MAX_YAML_NODES",
        "MAX_PATH_LENGTH",
        "MAX_REDIRECTS",
    ):
        assert name in doc, name
        assert name in resolver_module.__all__, name


# -- the same against the local Hub server's hostile modes ---------------------------------------

_HOSTILE_MODES = {"endless_pages", "pad_api_bytes", "redirect_loop_every", "trickle_every"}
needs_hostile_modes = pytest.mark.skipif(
    not _HOSTILE_MODES.issubset(f.name for f in dataclasses.fields(Faults)),
    reason="the local Hub server has no hostile modes yet",
)


@pytest.fixture
def hub_root(tmp_path: Path) -> Path:
    root = tmp_path / "hub"
    root.mkdir()
    make_repo_split_naming(root)
    make_repo(root, "org/yaml", {".huggingface.yaml": "configs: []\n", "train.parquet": b"PAR1"})
    return root


async def _resolve_on(hub: HubServer, tmp_path: Path, repo: str, **options: Any) -> Manifest:
    opts = StreamOptions(
        cache_dir=tmp_path / "cache", backoff_base=0.001, backoff_max=0.01, **options
    )
    async with Resolver(options=opts) as r:
        return await r.resolve(f"hf://datasets/{repo}", endpoint=hub.endpoint, token=False)


@needs_hostile_modes
@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("empty", "is empty yet announces another"),
        ("fresh", r"past 5 pages \(MAX_TREE_PAGES\)"),
        ("repeat", "twice"),
    ],
)
async def test_endless_pages_of_the_hub_server_stop(
    mode: str, message: str, hub_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_store, "MAX_TREE_PAGES", 5)
    faults = Faults(endless_pages=mode)
    async with HubServer(hub_root, faults=faults, tree_page_size=2) as hub:
        with pytest.raises(ResolutionError, match=rf"org/split-naming@main .*{message}"):
            await _resolve_on(hub, tmp_path, "org/split-naming")
        assert hub.stats().by_endpoint["tree"] <= 5


@needs_hostile_modes
async def test_oversized_answers_of_the_hub_server_are_refused(
    hub_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resolver_module, "MAX_API_BODY", 64 * 1024)
    monkeypatch.setattr(resolver_module, "MAX_TEXT_BODY", 64 * 1024)
    async with HubServer(hub_root, faults=Faults(pad_api_bytes=1 << 20)) as hub:
        with pytest.raises(ResolutionError, match=r"announces a body of 1048576 bytes"):
            await _resolve_on(hub, tmp_path, "org/split-naming")
    async with HubServer(hub_root, faults=Faults(pad_text_bytes=1 << 20)) as hub:
        with pytest.raises(ResolutionError, match=r"\.huggingface\.yaml announces .*MAX_TEXT_BODY"):
            await _resolve_on(hub, tmp_path, "org/yaml")


@needs_hostile_modes
async def test_a_redirect_loop_of_the_hub_server_is_refused(hub_root: Path, tmp_path: Path) -> None:
    faults = Faults(redirect_loop_every=1, targets=("api",))
    async with HubServer(hub_root, faults=faults) as hub:
        with pytest.raises(ResolutionError, match=r"redirects more than \d+ times"):
            await _resolve_on(hub, tmp_path, "org/split-naming")
        assert hub.stats().by_endpoint == {"redirect_loop": MAX_REDIRECTS + 1}


@needs_hostile_modes
async def test_a_trickle_from_the_hub_server_times_out(hub_root: Path, tmp_path: Path) -> None:
    faults = Faults(trickle_every=1, trickle_interval_ms=50, targets=("api",))
    async with HubServer(hub_root, faults=faults) as hub:
        with pytest.raises(ResolutionError, match="failed after 2 attempts: no whole answer"):
            await _resolve_on(hub, tmp_path, "org/split-naming", timeout=0.2, max_retries=1)


@needs_hostile_modes
async def test_hostile_tree_paths_of_the_hub_server_are_refused(
    hub_root: Path, tmp_path: Path
) -> None:
    faults = Faults(hostile_tree_paths=("../outside.parquet", "/etc/absolute.parquet"))
    async with HubServer(hub_root, faults=faults) as hub:
        with pytest.raises(ResolutionError, match=r"lists a file '(\.\./outside|/etc/absolute)"):
            await _resolve_on(hub, tmp_path, "org/split-naming")
