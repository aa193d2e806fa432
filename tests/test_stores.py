"""Adding a store is one module (docs/design.md, "Adding a store"): tests/tiny_store.py,
registered here, streams Parquet through the engine, signed by its own context, with its
own errors; and the library's stores are only reached through ``aiostream_hf.stores``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import tiny_store

import aiostream_hf as ash
from aiostream_hf import stores
from aiostream_hf.testing import make_text_parquet


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tiny_store.TinyServer]:
    bucket = tmp_path / "objects" / "bkt"
    bucket.mkdir(parents=True)
    for i in range(2):
        make_text_parquet(bucket / f"part-{i}.parquet", rows=40, start_id=40 * i, seed=i)
    server = tiny_store.TinyServer(tmp_path / "objects")
    monkeypatch.setenv("TINY_ENDPOINT", server.endpoint)
    stores.register(tiny_store.STORE)
    try:
        yield server
    finally:
        stores.unregister("tiny")
        server.close()


async def _rows(s: Any) -> list[Any]:
    async with s:
        return [row async for row in s]


@pytest.mark.anyio
async def test_a_store_of_one_module_streams(tiny: tiny_store.TinyServer, tmp_path: Path) -> None:
    rows = await _rows(
        ash.stream("tiny://bkt/*.parquet", options=ash.StreamOptions(cache_dir=tmp_path))
    )
    expected = [
        r
        for i in range(2)
        for r in pq.read_table(tmp_path / "objects" / "bkt" / f"part-{i}.parquet").to_pylist()
    ]
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in expected)
    assert tiny.requests, "nothing reached the store"
    assert all(signed for _, signed in tiny.requests)  # every request signed by its context
    assert any(path == "/bkt/" for path, _ in tiny.requests)  # one listing


@pytest.mark.anyio
async def test_a_stores_errors_are_its_own(tiny: tiny_store.TinyServer, tmp_path: Path) -> None:
    with pytest.raises(ash.EntryNotFoundError, match="tiny://nope: no such bucket"):
        await _rows(ash.stream("tiny://nope/x", options=ash.StreamOptions(cache_dir=tmp_path)))


def test_an_unknown_scheme_is_refused_until_its_store_is_registered() -> None:
    with pytest.raises(ash.SourceError, match="unsupported scheme 'tiny://'"):
        ash.stream("tiny://bkt/x.parquet")
