"""``aiostream-hf ls`` of a brace pattern (``shard-{000..009}.tar``) or a URL checks that
each file it names is there, through the library's readers: real sizes for those that
are, a ``missing (HTTP 404)`` line (or ``missing (not in the repo)``...) for each that is
not, and exit code 1 with one ``Error:`` line naming them and the way out; never a
shard that does not exist listed with size "?".

Served by the local Hub server (its ``/resolve/`` URLs as plain http(s) URLs, and
``hf://``) and by a static file server that ignores Range (Python's ``http.server``).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from aiostream_hf import StreamOptions
from aiostream_hf._demo import human_bytes
from aiostream_hf._describe import Absent, check_names
from aiostream_hf._engine import open_readers
from aiostream_hf.cli import main
from aiostream_hf.testing import Faults, HubServer, make_repo, make_text_parquet
from aiostream_hf.testing import make_webdataset_shards as make_shards


@dataclass(frozen=True)
class _Served:
    hub: HubServer
    static: str  # base URL of the static server (it ignores Range)
    shards: list[Path]  # org/shards: train-000000.tar .. train-000002.tar
    parquet: list[Path]  # org/text: data/train-0.parquet .. data/train-2.parquet
    www: list[Path]  # the static server's shards: train-000000.tar, train-000001.tar


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _StaticServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that closes before a 404's body is sent: not the test's concern


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Served]:
    root = tmp_path_factory.mktemp("served")
    shards = make_shards(make_repo(root / "hub", "org/shards", {"README.md": "# s\n"}), shards=3)
    text = make_repo(root / "hub", "org/text", {"README.md": "# t\n"})
    parquet = [text / f"data/train-{i}.parquet" for i in range(3)]
    for i, path in enumerate(parquet):
        make_text_parquet(path, rows=20 * (i + 1), seed=i)
    www = make_shards(root / "www", shards=2, samples_per_shard=3)
    handler = functools.partial(_Quiet, directory=str(root / "www"))
    static = _StaticServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=static.serve_forever, daemon=True)
    thread.start()
    try:
        with HubServer(root / "hub") as hub:
            yield _Served(hub, f"http://127.0.0.1:{static.server_address[1]}", shards, parquet, www)
    finally:
        static.shutdown()
        static.server_close()
        thread.join()


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIOSTREAM_HF_CACHE", str(tmp_path / "cache"))


def _ls(served: _Served, source: str) -> Result:
    return CliRunner().invoke(main, ["ls", source, "--endpoint", served.hub.endpoint])


def _resolve_url(served: _Served, repo: str, path: str) -> str:
    """The /resolve/ URL of ``path`` (braces left as they are, unlike ``hub.url``)."""
    return f"{served.hub.endpoint}/datasets/{repo}/resolve/main/{path}"


def _size(paths: list[Path]) -> str:
    return human_bytes(sum(p.stat().st_size for p in paths))


def _missing_lines(out: str) -> list[tuple[str, str]]:
    """(reason, name) of each line that says a file is not there."""
    found = re.findall(r"^((?:missing|refused) \([^)]*\)) +(\S+)$", out, re.MULTILINE)
    return [(reason, name) for reason, name in found]


def _error(result: Result) -> str:
    """Exit code 1, no traceback, and one ``Error:`` line on stderr: returned."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Error: ")
    return line


def test_a_url_pattern_lists_the_shards_there_and_names_the_missing(served: _Served) -> None:
    pattern = _resolve_url(served, "org/shards", "train-{000000..000004}.tar")
    result = _ls(served, pattern)
    line = _error(result)
    out = result.stdout
    assert "format: webdataset" in out
    (row,) = [r.split() for r in out.splitlines() if r.startswith("default ")]
    # The three shards there, with their real size; not five, and no "?".
    assert row == ["default", "train", "3", *_size(served.shards).split()] + [
        "train-000000.tar",
        "train-000002.tar",
    ]
    assert "?" not in out.replace(pattern, "")
    assert "not there: 2 of the 5 files named" in out
    assert _missing_lines(out) == [
        ("missing (HTTP 404)", _resolve_url(served, "org/shards", f"train-00000{i}.tar"))
        for i in (3, 4)
    ]
    assert f"2 of the 5 files that {pattern!r} names are not there" in line
    assert "missing (HTTP 404): train-000003.tar, train-000004.tar" in line
    assert "The 3 that are there are listed above: narrow the braces to them" in line


def test_an_hf_pattern_names_every_missing_shard(served: _Served) -> None:
    pattern = "hf://datasets/org/shards/train-{000001..000005}.tar"
    result = _ls(served, pattern)
    line = _error(result)
    out = result.stdout
    assert out.startswith("org/shards @ ")
    (row,) = [r.split() for r in out.splitlines() if r.startswith("default ")]
    assert row[:3] == ["default", "train", "2"]
    assert row[3:-2] == _size(served.shards[1:]).split()
    assert _missing_lines(out) == [
        ("missing (not in the repo)", f"hf://datasets/org/shards/train-00000{i}.tar")
        for i in (3, 4, 5)
    ]
    assert "missing (not in the repo): train-000003.tar, train-000004.tar, train-000005.tar" in (
        line
    )


def test_a_url_pattern_of_files_all_there_shows_each_size(served: _Served) -> None:
    pattern = _resolve_url(served, "org/text", "data/train-{0..2}.parquet")
    result = _ls(served, pattern)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for path in served.parquet:
        url = _resolve_url(served, "org/text", f"data/{path.name}")
        size = re.escape(human_bytes(path.stat().st_size))
        assert re.search(rf"^train +{size}  {url}$", out, re.MULTILINE)
    (row,) = [r.split() for r in out.splitlines() if r.startswith("default ")]
    assert row == ["default", "train", "3", *_size(served.parquet).split()]
    assert "not there" not in out
    assert result.stderr == ""


def test_a_file_listing_marks_nothing_missing_with_a_size(served: _Served) -> None:
    """Parquet files by URL: the file table holds those there, with their sizes; the
    missing ones are on lines of their own, never a row of size "?"."""
    pattern = _resolve_url(served, "org/text", "data/train-{1..4}.parquet")
    result = _ls(served, pattern)
    line = _error(result)
    rows = [r for r in result.stdout.splitlines() if r.startswith("train ")]
    assert len(rows) == 2
    assert all(not r.split()[1].startswith("?") for r in rows)
    assert [name.rsplit("/", 1)[1] for _, name in _missing_lines(result.stdout)] == [
        "train-3.parquet",
        "train-4.parquet",
    ]
    assert "missing (HTTP 404): train-3.parquet, train-4.parquet" in line


def test_a_server_that_ignores_range_tells_sizes_too(served: _Served) -> None:
    """A static server that answers 200 with the whole file to a range read: each shard
    is there (a HEAD, through the same client, gives its size); 404s are missing."""
    pattern = f"{served.static}/train-{{000000..000003}}.tar"
    result = _ls(served, pattern)
    line = _error(result)
    (row,) = [r.split() for r in result.stdout.splitlines() if r.startswith("default ")]
    assert row == ["default", "train", "2", *_size(served.www).split()] + [
        "train-000000.tar",
        "train-000001.tar",
    ]
    assert [reason for reason, _ in _missing_lines(result.stdout)] == ["missing (HTTP 404)"] * 2
    assert "missing (HTTP 404): train-000002.tar, train-000003.tar" in line


def test_none_there(served: _Served) -> None:
    pattern = _resolve_url(served, "org/shards", "test-{0..2}.tar")
    result = _ls(served, pattern)
    line = _error(result)
    assert result.stdout.splitlines()[0] == pattern
    assert len(_missing_lines(result.stdout)) == 3
    assert "format:" not in result.stdout
    assert f"none of the 3 files that {pattern!r} names is there" in line
    assert "Check the pattern" in line


def test_one_url_not_there(served: _Served) -> None:
    url = _resolve_url(served, "org/shards", "train-000009.tar")
    result = _ls(served, url)
    line = _error(result)
    assert _missing_lines(result.stdout) == [("missing (HTTP 404)", url)]
    assert line == f"Error: {url!r} is not there: missing (HTTP 404). Check the URL."


def test_a_local_pattern_names_the_missing_files(served: _Served) -> None:
    folder = served.shards[0].parent
    pattern = str(folder / "train-{000000..000003}.tar")
    result = _ls(served, pattern)
    line = _error(result)
    (row,) = [r.split() for r in result.stdout.splitlines() if r.startswith("default ")]
    assert row[:3] == ["default", "train", "3"]
    assert _missing_lines(result.stdout) == [
        ("missing (no such file)", str(folder / "train-000003.tar"))
    ]
    assert "1 of the 4 files" in line
    assert "is not there" in line


@pytest.mark.anyio
async def test_check_names_is_bounded_and_learns_sizes(tmp_path: Path) -> None:
    """Twelve URLs, three at a time (max_concurrency=3) however slow the server; one
    request per missing shard (a 404 is not retried); the sizes of those there."""
    root = tmp_path / "hub"
    shards = make_shards(make_repo(root, "org/shards", {}), shards=8, samples_per_shard=2)
    with HubServer(root, faults=Faults(latency_ms=20)) as hub:
        base = f"{hub.endpoint}/datasets/org/shards/resolve/main"
        options = StreamOptions(max_concurrency=3, cache_dir=tmp_path / "cache")
        async with open_readers(options, token=False, endpoint=hub.endpoint) as readers:
            hub.reset_stats()
            names = await check_names(f"{base}/train-{{000000..000011}}.tar", readers)
        stats = hub.stats()
    assert names is not None
    assert names.present == tuple(f"{base}/{p.name}" for p in shards)
    assert names.absent == tuple(
        Absent(f"{base}/train-{i:06d}.tar", "missing (HTTP 404)") for i in range(8, 12)
    )
    assert dict(names.sizes) == {f"{base}/{p.name}": p.stat().st_size for p in shards}
    assert 1 <= stats.peak_concurrent <= 3
    assert stats.by_status.get(404) == 4


@pytest.mark.anyio
async def test_check_names_leaves_one_hub_source_to_the_resolver(served: _Served) -> None:
    options = StreamOptions(cache_dir=None)
    async with open_readers(options, token=False, endpoint=served.hub.endpoint) as readers:
        assert await check_names("hf://datasets/org/shards/train-000009.tar", readers) is None
        assert await check_names("hf://datasets/org/shards/train-{0..1", readers) is None
