"""Every ```python block of README.md and docs/*.md runs, as written, against the local Hub.

The blocks are read from the pages when the tests are collected, so a page being
edited is tested as it is now. Each block runs in a fresh subprocess (its own
``__main__``, a loopback-only socket guard, a fresh resolution cache) with
``HF_ENDPOINT`` pointing at a local Hub server that holds repos under the names the
snippets use: ``HuggingFaceFW/fineweb-edu`` (config ``sample-10BT``), ``lerobot/pusht``
and ``lerobot/svla_so101_pickplace`` (with the cameras, fps and dimensions of the
real datasets, made small), and the WebDataset shards and the video that the
snippets fetch from the placeholder hosts ``https://example.com/`` and
``https://host/``. Those two hosts are the only text the test changes: it maps
them to the local server's ``/resolve/`` URLs of the same paths (the counterpart,
for URL sources, of adding ``endpoint=``). A block that names an ``s3://`` source runs
with the ``AWS_*`` variables of moto's S3 server (the ``s3_store`` fixture), whose
bucket ``my-bucket`` holds the objects the snippets read.

Blocks with top-level ``await``/``async with``/``async for`` run as an async REPL
runs them (``python -m asyncio``, Jupyter): compiled with top-level await allowed
and run on asyncio. A block that cannot run (a signature, a fragment that uses
names it does not define) is marked right above its fence with
``<!-- snippet: not run (why) -->``; every other block must run without error.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import aiostream_hf.testing
from aiostream_hf.testing import (
    HubServer,
    make_lerobot_dataset,
    make_repo,
    make_text_parquet,
    make_video,
    make_webdataset_shards,
)

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DEMO_RECORD = ROOT / "docs" / "demo-output.txt"

_FENCE = re.compile(r"^\s*(`{3,})(\S*)\s*$")  # indented fences too (in list items)
_SKIP = re.compile(r"^<!--\s*snippet:\s*not run\s*\((?P<why>[^)]+)\)\s*-->\s*$")
_ANY_MARKER = re.compile(r"<!--\s*snippet:")
_TORCH = re.compile(r"^\s*(from|import) (torch|torchdata)\b|aiostream_hf\.torch", re.M)

#: Placeholder hosts of the snippets -> the local repo that serves the same paths.
PLACEHOLDER_HOSTS = {
    "https://example.com/": "placeholder/example.com",
    "https://host/": "placeholder/host",
}


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repo root
    line: int  # of the opening fence, from 1
    language: str
    code: str
    skip: str | None  # the reason given in a skip marker right above the fence

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a markdown page, with the skip marker above each."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    page = str(path.relative_to(ROOT))
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, language = opening.groups()
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].strip() == fence),
            None,
        )
        if end is None:
            raise AssertionError(f"{page}:{i + 1}: a code fence that is never closed")
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _SKIP.match(before.strip())
        code = textwrap.dedent("\n".join(lines[i + 1 : end]) + "\n")
        found.append(Block(page, i + 1, language, code, marker["why"] if marker else None))
        i = end + 1
    return found


def python_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page) if b.language == "python"]


def _params() -> list[object]:
    params: list[object] = []
    for block in python_blocks():
        marks: list[pytest.MarkDecorator] = [pytest.mark.timeout(240)]
        if block.skip is not None:
            marks.append(pytest.mark.skip(reason=f"marked in the page: not run ({block.skip})"))
        elif _TORCH.search(block.code):
            marks.append(pytest.mark.torch)
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


# -- the local Hub, with the repos the snippets name ---------------------------------------

_FINEWEB_README = """\
---
license: odc-by
configs:
- config_name: default
  data_files:
  - split: train
    path: data/*/*
- config_name: sample-10BT
  data_files:
  - split: train
    path: sample/10BT/*
---
# FineWeb-Edu (a small local stand-in)
"""


def _build(root: Path) -> None:
    fineweb = make_repo(root, "HuggingFaceFW/fineweb-edu", {"README.md": _FINEWEB_README})
    for i in range(3):
        make_text_parquet(
            fineweb / f"sample/10BT/{i:03d}_00000.parquet",
            rows=64,
            row_group_size=32,
            seed=i,
            min_text=20,
            max_text=300,
            start_id=64 * i,
        )
    make_text_parquet(
        fineweb / "data/CC-MAIN-2024-10/000_00000.parquet", rows=32, min_text=20, max_text=300
    )
    # lerobot/pusht: one camera "observation.image" (96 x 96), 10 fps, 2-D state and action.
    make_lerobot_dataset(
        root,
        "lerobot/pusht",
        episodes=(12, 15),
        fps=10,
        width=96,
        height=96,
        cameras=("observation.image",),
        state_dim=2,
        action_dim=2,
        tasks=("Push the T-shaped block onto the T-shaped target.",),
        codec="h264",
    )
    # lerobot/svla_so101_pickplace: cameras "up" and "side", 30 fps, 6 joints (made small).
    make_lerobot_dataset(
        root,
        "lerobot/svla_so101_pickplace",
        episodes=(20, 24),
        fps=30,
        width=64,
        height=48,
        cameras=("observation.images.up", "observation.images.side"),
        tasks=("pink lego brick into the transparent box",),
        codec="h264",
    )
    # https://example.com/data/train-{000000..000099}.tar: 100 WebDataset shards.
    web = make_repo(root, PLACEHOLDER_HOSTS["https://example.com/"], {})
    make_webdataset_shards(web / "data", shards=100, samples_per_shard=2, width=16, height=16)
    # https://host/videos/episode_000000.mp4: 5 s at 30 fps.
    host = make_repo(root, PLACEHOLDER_HOSTS["https://host/"], {})
    make_video(host / "videos/episode_000000.mp4", frames=150, fps=30, width=64, height=48)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    root = tmp_path_factory.mktemp("hub")
    _build(root)
    with HubServer(root) as server:
        yield server


@pytest.fixture(scope="module")
def s3_env(s3_store: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Bucket ``my-bucket`` with the objects of docs/object-stores.md, and the variables
    of a shell with the reader's credentials (none of the user's own AWS config)."""
    root = tmp_path_factory.mktemp("s3-docs")
    data = root / "data"
    make_webdataset_shards(data / "shards", shards=10, samples_per_shard=2, width=16, height=16)
    for i in range(2):
        make_text_parquet(
            data / f"text/part-{i}.parquet",
            rows=20,
            seed=i,
            min_text=20,
            max_text=80,
            start_id=20 * i,
        )
    make_video(data / "videos/episode_000000.mp4", frames=90, fps=30, width=64, height=48)
    robot = make_lerobot_dataset(
        root / "lerobot",
        "lerobot/pusht",
        episodes=(8, 10),
        fps=10,
        width=32,
        height=32,
        cameras=("observation.image",),
        state_dim=2,
        action_dim=2,
        codec="h264",
    )
    s3_store.put_folder("my-bucket", root / "data")
    s3_store.put_folder("my-bucket", robot.path, prefix="robots/pusht/")
    return s3_store.variables(root, s3_store.reader)


def localize(code: str, hub: HubServer) -> str:
    """The snippet with its placeholder hosts mapped to the local server."""
    for prefix, repo in PLACEHOLDER_HOSTS.items():
        code = code.replace(prefix, f"{hub.endpoint}/datasets/{repo}/resolve/main/")
    return code


# The snippet runs as __main__ of its own: a clean namespace, as `python snippet.py` has.
_RUNNER = textwrap.dedent(
    """
    import ast, asyncio, inspect, socket, sys, types

    def _main(path):
        real_connect = socket.socket.connect

        def guarded(self, address):
            host = address[0] if isinstance(address, tuple) else None
            if isinstance(host, str) and not (
                host.startswith("127.") or host in ("localhost", "::1")
            ):
                raise OSError(f"snippet tried to reach {address!r}: snippets stay on loopback")
            return real_connect(self, address)

        socket.socket.connect = guarded
        with open(path, encoding="utf-8") as f:
            source = f.read()
        try:
            code = compile(source, path, "exec", dont_inherit=True)
        except SyntaxError:  # top-level await: run it as `python -m asyncio` would
            code = compile(
                source, path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
            )
        main = types.ModuleType("__main__")
        main.__file__ = path
        sys.modules["__main__"] = main
        result = eval(code, main.__dict__)
        if code.co_flags & inspect.CO_COROUTINE:
            asyncio.run(result)

    _main(sys.argv[1])
    """
)


def run_snippet(
    code: str, cwd: Path, hub: HubServer, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = cwd / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "RANK", "WORLD_SIZE", "LOCAL_RANK")
        and not k.startswith("AWS_")
    }
    env.update(extra_env or {})
    env.update(
        HF_ENDPOINT=hub.endpoint,
        HF_HUB_DISABLE_IMPLICIT_TOKEN="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HOME=str(cwd / "hf-home"),
        XDG_CACHE_HOME=str(cwd / "xdg-cache"),
        AIOSTREAM_HF_CACHE=str(cwd / "aiostream-cache"),
        RAY_USAGE_STATS_ENABLED="0",  # docs/ray.md's snippets start a local Ray cluster
    )
    return subprocess.run(
        [sys.executable, "-c", _RUNNER, str(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )


@pytest.mark.parametrize("block", _params())
def test_snippet_runs(
    block: Block, hub: HubServer, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    extra = request.getfixturevalue("s3_env") if "s3://" in block.code else None
    proc = run_snippet(localize(block.code, hub), tmp_path, hub, extra)
    assert proc.returncode == 0, (
        f"{block.id}: the snippet failed (exit {proc.returncode}); fix it, or mark it with "
        f"<!-- snippet: not run (why) --> if it cannot run\n--- snippet\n{block.code}"
        f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    )


# -- the markers and the runner -------------------------------------------------------------


def test_every_skip_marker_is_above_a_python_block() -> None:
    """A marker names its reason and sits right above the block it skips."""
    for page in PAGES:
        marked = {b.line for b in blocks(page) if b.skip is not None and b.language == "python"}
        lines = page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            if not _ANY_MARKER.search(line):
                continue
            assert _SKIP.match(line.strip()), f"{page.name}:{number}: malformed marker {line!r}"
            fence = next(
                (n for n in range(number + 1, len(lines) + 1) if lines[n - 1].strip()), None
            )
            assert fence in marked, f"{page.name}:{number}: the marker is not above a python block"


def test_skip_markers_are_few() -> None:
    skipped = [b.id for b in python_blocks() if b.skip is not None]
    ran = [b.id for b in python_blocks() if b.skip is None]
    assert len(ran) >= 20, ran
    assert len(skipped) <= 8, f"too many snippets marked not run: {skipped}"
    # .ci/run fails on a skipped test whose reason names torch (a torch test that did not
    # run): a marker's reason must not, or CI refuses a page with a snippet marked so.
    named = [b.id for b in python_blocks() if b.skip is not None and "torch" in b.skip.lower()]
    assert not named, f"a not-run reason names torch (CI reads it as a skipped torch test): {named}"


def test_runner_fails_a_failing_snippet(hub: HubServer, tmp_path: Path) -> None:
    """The runner reports failures: an undefined name, and a reach beyond loopback."""
    undefined = run_snippet("for row in rows:\n    ...\n", tmp_path, hub)
    assert undefined.returncode != 0
    assert "NameError: name 'rows' is not defined" in undefined.stderr
    # The runner's own names are not visible to the snippet.
    leaked = run_snippet("print(ast, sys)\n", tmp_path, hub)
    assert "NameError" in leaked.stderr
    outside = run_snippet(
        "import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=1)\n", tmp_path, hub
    )
    assert "snippets stay on loopback" in outside.stderr


def test_runner_runs_top_level_await(hub: HubServer, tmp_path: Path) -> None:
    code = "import anyio\nawait anyio.sleep(0)\nprint('awaited')\n"
    proc = run_snippet(code, tmp_path, hub)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "awaited\n"


def test_placeholder_urls_map_to_the_local_server(hub: HubServer) -> None:
    code = localize('u = "https://example.com/data/train-{000000..000099}.tar"\n', hub)
    assert code == (
        f'u = "{hub.endpoint}/datasets/placeholder/example.com/resolve/main/'
        'data/train-{000000..000099}.tar"\n'
    )


# -- the testing page covers aiostream_hf.testing ------------------------------------------


def test_testing_page_names_every_public_name_of_aiostream_hf_testing() -> None:
    page = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    missing = [name for name in aiostream_hf.testing.__all__ if f"`{name}" not in page]
    assert not missing, f"docs/testing.md does not document {missing}"
    runnable = [b for b in blocks(ROOT / "docs" / "testing.md") if b.language == "python"]
    assert all(b.skip is None for b in runnable)
    for maker in [n for n in aiostream_hf.testing.__all__ if n.startswith("make_")]:
        assert any(f"{maker}(" in b.code for b in runnable), f"no snippet runs {maker}"


# -- the README's demo table is the recorded run -------------------------------------------


def _record_table(text: str) -> str:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("workload "))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[start:end]) + "\n"


def test_readme_demo_table_is_the_recorded_run() -> None:
    record = DEMO_RECORD.read_text(encoding="utf-8")
    date = re.match(r"aiostream-hf demo, recorded (\d{4}-\d\d-\d\d) ", record)
    assert date is not None, "docs/demo-output.txt must start with the date of its run"
    assert "\nmachine: " in record
    assert "\ncommand: " in record
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("## See it work")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    section = "\n".join(lines[start:end])
    tables = [b.code for b in blocks(ROOT / "README.md") if start < b.line - 1 < end]
    assert len(tables) == 1, "## See it work must show exactly one table, the recorded one"
    assert tables[0] == _record_table(record), (
        "the README's demo table differs from docs/demo-output.txt: copy it from there "
        "(record a new run with `python -m aiostream_hf._demo docs/demo-output.txt`)"
    )
    assert date[1] in section, "the README must say when the table was recorded"
    assert "docs/demo-output.txt" in section
