"""The layers hold: decoders (``aiostream_hf/formats/``) are synchronous code from bytes to
rows, with no concurrency machinery of their own. Threads, tasks, locks and the reads
are the engine's side (``_sequential.py``, ``_stream.py``, ``_prefetch.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import aiostream_hf.formats

FORMATS = Path(aiostream_hf.formats.__file__).parent

# What a decoder does not import: an event loop or task library, threads, pools of them.
CONCURRENCY = (
    "anyio",
    "asyncio",
    "trio",
    "sniffio",
    "threading",
    "_thread",
    "concurrent.futures",
    "multiprocessing",
)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (in functions too), by its full name;
    relative imports resolved against ``aiostream_hf.formats``."""
    package = "aiostream_hf.formats"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _concurrency(names: set[str]) -> set[str]:
    return {n for n in names if any(n == m or n.startswith(m + ".") for m in CONCURRENCY)}


def _modules() -> list[object]:
    params: list[object] = []
    for path in sorted(FORMATS.rglob("*.py")):
        name = str(path.relative_to(FORMATS))
        params.append(pytest.param(path, id=name))
    return params


@pytest.mark.parametrize("path", _modules())
def test_no_format_module_imports_concurrency(path: Path) -> None:
    assert _concurrency(_imports(path)) == set()


def test_the_check_sees_every_form_of_import(tmp_path: Path) -> None:
    """The walk finds the imports a module could hide its threads behind."""
    source = tmp_path / "m.py"
    source.write_text(
        "import anyio.to_thread\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from concurrent import futures\n"
        "def f():\n"
        "    import threading\n"
        "    from trio import lowlevel\n"
        "import os, json\n"
        "from . import parquet\n"
    )
    assert _concurrency(_imports(source)) == {
        "anyio.to_thread",
        "concurrent.futures",
        "concurrent.futures.ThreadPoolExecutor",
        "threading",
        "trio",
        "trio.lowlevel",
    }
