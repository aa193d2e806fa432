"""Subprocess helpers for tests/test_resolver.py.

    resolver_oracle.py datasets SPECS_JSON
        For each spec {"id", "repo", "name"?, "revision"?, "data_files"?, "data_dir"?}, print
        which files ``datasets.load_dataset_builder(...).config.data_files`` picks, per split,
        as repo-relative paths: {id: {"splits": {split: [path, ...]}} | {"error": "..."}}.

    resolver_oracle.py resolve SPECS_JSON CACHE_DIR
        Resolve each spec {"id", "source", "config"?, "split"?, "data_files"?} with a fresh
        aiostream_hf Resolver (a second process sharing CACHE_DIR); print
        {"manifests": {id: manifest JSON}, "statistics": {...}}.

Run with HF_ENDPOINT pointing at the local Hub server. The last stdout line is the JSON.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

_HF_PATH = re.compile(r"^hf://datasets/[^/@]+/[^/@]+(?:@[^/]+)?/(.+)$")


def _datasets(specs: list[dict[str, Any]]) -> dict[str, Any]:
    import datasets

    out: dict[str, Any] = {}
    for spec in specs:
        try:
            builder = datasets.load_dataset_builder(
                spec["repo"],
                spec.get("name"),
                revision=spec.get("revision"),
                data_files=spec.get("data_files"),
                data_dir=spec.get("data_dir"),
            )
        except Exception as exc:  # the oracle reports errors, the test decides
            out[spec["id"]] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        splits: dict[str, list[str]] = {}
        for split, files in (builder.config.data_files or {}).items():
            paths = []
            for url in files:
                match = _HF_PATH.match(str(url))
                paths.append(match.group(1) if match else str(url))
            splits[str(split)] = paths
        out[spec["id"]] = {"splits": splits, "config": builder.config.name}
    return out


def _resolve(specs: list[dict[str, Any]], cache_dir: str) -> dict[str, Any]:
    import anyio

    from aiostream_hf._options import StreamOptions
    from aiostream_hf._resolver import Resolver

    async def main() -> dict[str, Any]:
        manifests: dict[str, Any] = {}
        options = StreamOptions(cache_dir=Path(cache_dir))
        async with Resolver(options=options) as resolver:
            for spec in specs:
                manifest = await resolver.resolve(
                    spec["source"],
                    config=spec.get("config"),
                    split=spec.get("split"),
                    data_files=spec.get("data_files"),
                )
                manifests[spec["id"]] = manifest.to_json()
            stats = dataclasses.asdict(resolver.statistics())
        return {"manifests": manifests, "statistics": stats}

    return anyio.run(main)


def main(argv: list[str]) -> None:
    mode, specs = argv[0], json.loads(argv[1])
    if mode == "datasets":
        result = _datasets(specs)
    elif mode == "resolve":
        result = _resolve(specs, argv[2])
    else:
        raise SystemExit(f"unknown mode {mode!r}: use 'datasets' or 'resolve'")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
