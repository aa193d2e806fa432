"""One of several processes spending one rate-limit quota: streams its rank's share of
org/quota and writes the ids it read and its client's statistics as JSON."""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

import aiostream_hf as ash


async def main(endpoint: str, cache: str, rank: int, world: int, out: str) -> None:
    ids: list[int] = []
    async with ash.stream(
        "hf://datasets/org/quota",
        endpoint=endpoint,
        columns=["id"],
        rank=rank,
        world_size=world,
        options=ash.StreamOptions(cache_dir=cache, max_concurrency=8),
    ) as s:
        async for row in s:
            ids.append(int(row["id"]))
        stats: Any = s.statistics()
    result = {"ids": ids, "throttled": stats.client["throttled"], "paced": stats.client["paced"]}
    await anyio.Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    endpoint, cache, rank, world, out, backend = sys.argv[1:7]
    anyio.run(main, endpoint, cache, int(rank), int(world), out, backend=backend)
