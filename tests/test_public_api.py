"""The public surface is explicit: __all__ is sorted and is exactly what is exported."""

from __future__ import annotations

import importlib
import types

import pytest

MODULES = ["aiostream_hf", "aiostream_hf.testing", "aiostream_hf.formats", "aiostream_hf.torch"]


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
