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


def _names(nodes: list[ast.AST], package: str) -> set[str]:
    """The full names the import statements among ``nodes`` bring in, relative imports
    resolved against ``package`` (``from . import x`` gives the package and ``package.x``)."""
    names: set[str] = set()
    for node in nodes:
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


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (in functions too), by its full name;
    relative imports resolved against ``aiostream_hf.formats``."""
    return _names(list(ast.walk(ast.parse(path.read_text(), str(path)))), "aiostream_hf.formats")


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


# -- the package's layers: stores, import cycles, module sizes ------------------------------

PACKAGE = Path(aiostream_hf.formats.__file__).parent.parent
#: Library modules still over 1,000 lines. Strict: a module that falls under the bound
#: fails its entry here, so the ledger only shrinks. Empty since issue 30's splits.
STILL_OVER_1000: set[str] = set()


def _library_modules() -> dict[str, Path]:
    """Every module of the package by dotted name (``aiostream_hf.stores.s3``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _module_imports(name: str, path: Path, *, top_level_only: bool) -> set[str]:
    """The package modules ``name`` imports (``from . import x`` counted as module x), never
    those under ``if TYPE_CHECKING``; with ``top_level_only``, not those in functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    nodes: list[ast.AST] = list(tree.body) if top_level_only else list(ast.walk(tree))
    names = _names(nodes, package)
    modules = _library_modules()
    return {n for n in names if n in modules and n != name}


def test_only_the_s3_store_knows_s3() -> None:
    """botocore and the S3 store's module are imported by the S3 store alone (and the
    stores registry that lists it)."""
    allowed = {"aiostream_hf.stores", "aiostream_hf.stores.s3"}
    offenders = {}
    for name, path in _library_modules().items():
        if name in allowed or name.startswith("aiostream_hf.testing"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        bad = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bad |= {a.name for a in node.names if a.name.split(".")[0] in ("botocore", "boto3")}
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if module.split(".")[0] in ("botocore", "boto3") or module.endswith("s3"):
                    bad.add(module)
                bad |= {a.name for a in node.names if a.name in ("s3", "_s3")}
        if bad:
            offenders[name] = sorted(bad)
    assert offenders == {}


def test_readers_are_made_in_one_place() -> None:
    """A Resolver or a RangeFetcher is made by ``_engine.make_readers`` alone: every
    entry point gets its readers (one access, one client) from there (issue 30)."""
    made = []
    for name, path in _library_modules().items():
        tree = ast.parse(path.read_text(), str(path))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call):
                    callee = node.func
                    called = getattr(callee, "id", None) or getattr(callee, "attr", None)
                    if called in ("Resolver", "RangeFetcher"):
                        made.append(f"{name}.{function.name}: {called}")
    assert sorted(made) == [
        "aiostream_hf._engine.make_readers: RangeFetcher",
        "aiostream_hf._engine.make_readers: Resolver",
    ]


@pytest.mark.parametrize("top_level_only", [True, False], ids=["module-level", "all"])
def test_no_import_cycle(top_level_only: bool) -> None:
    """The package's imports form no cycle (the layers hold): neither at module level
    nor counting the imports made inside functions (a lazy import is still a circle)."""
    modules = _library_modules()
    graph = {n: _module_imports(n, p, top_level_only=top_level_only) for n, p in modules.items()}
    # A package imports its own submodules by design (``from . import s3``); an edge from a
    # module to its own package's ``__init__`` is the same package, not a layer above.
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def _sizes() -> list[object]:
    params: list[object] = []
    for name, path in _library_modules().items():
        marks = []
        if name in STILL_OVER_1000:
            marks.append(pytest.mark.xfail(strict=True, reason="to be split (issue 30)"))
        params.append(pytest.param(path, id=name, marks=marks))
    return params


@pytest.mark.parametrize("path", _sizes())
def test_no_library_module_over_1000_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= 1000, f"{path.name} has {lines} lines"
