"""The public surface is explicit: __all__ is sorted and is exactly what is exported."""

from __future__ import annotations

import importlib
import types

import pytest

MODULES = [
    "aiostream_hf",
    "aiostream_hf.testing",
    "aiostream_hf.formats",
    "aiostream_hf.torch",
    "aiostream_hf.ray",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_complete(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert exported == sorted(exported)
    assert all(hasattr(module, n) for n in exported)
    # Every public class or function of ours reachable here is exported.
    ours = {
        n
        for n, v in vars(module).items()
        if not n.startswith("_")
        and not isinstance(v, types.ModuleType)
        and getattr(v, "__module__", "").startswith("aiostream_hf")
    }
    if name != "aiostream_hf":
        ours -= set(importlib.import_module("aiostream_hf").__all__)
    assert ours <= set(exported)


def test_every_error_derives_from_the_root() -> None:
    import aiostream_hf as ash

    errors = [getattr(ash, n) for n in ash.__all__ if n.endswith("Error")]
    assert len(errors) >= 15
    assert all(issubclass(e, ash.AiostreamError) for e in errors)


# What a decoder may not import: the client, the engine, the bridge, the integrations
# above the engine, torch, or an HTTP stack. Decoders turn bytes into samples; the bytes
# come from the ByteSource they are given.
_DOING_IO = {
    "aiostream_hf._client",
    "aiostream_hf._fetcher",
    "aiostream_hf._transfer",
    "aiostream_hf.stores.local",
    "aiostream_hf._resolver",
    "aiostream_hf._stream",
    "aiostream_hf._bridge",
    "aiostream_hf._prefetch",
    "aiostream_hf._readahead",
    "aiostream_hf._transport",
    "aiostream_hf.lerobot",
    "aiostream_hf.video",
    "aiostream_hf.webdataset",
    "aiostream_hf.torch",
    "aiostream_hf.ray",
    "torch",
    "ray",
    "httpx2",
    "httpcore2",
    "urllib3",
    "huggingface_hub",
    "filelock",
    "urllib.request",
    "socket",
}


def test_no_format_module_imports_anything_that_does_io() -> None:
    import ast
    from pathlib import Path

    import aiostream_hf.formats as formats

    folder = Path(formats.__file__).parent
    found: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        package = "aiostream_hf.formats"
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against aiostream_hf.formats
                    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
            bad = {n for n in names if any(n == m or n.startswith(m + ".") for m in _DOING_IO)}
            if bad:
                found.setdefault(path.name, set()).update(bad)
    assert found == {}
