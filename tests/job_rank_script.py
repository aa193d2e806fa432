"""A simulated job (tests/test_job_resolution.py): ``job_rank_script.py CONFIG_JSON``.

The launcher imports what the ranks need once, then forks every rank (a process of its
own: fork, so that 16 ranks do not import torch 16 times on a 2-core machine), and exits
non-zero if one of them failed. CONFIG: mode ("distributed", "lerobot", "mix" or
"shared"), endpoint, source (and shards, for mix), splits (one per rank), ranks, per_node,
tmp (a folder: node caches, the FileStore or the job folder, one result file per rank).

- distributed: torch.distributed over gloo (a FileStore); StreamDataset, so rank 0
  resolves and broadcasts. Ranks of even nodes read through a DataLoader of the
  StreamDataset (the manifest pickled to its 4 workers); ranks of odd nodes through a
  DataLoader whose 4 workers each call stream(SOURCE) by name, which finds the manifest
  rank 0 broadcast in the node's cache (seeded when the dataset was built).
- lerobot: torch.distributed; a LeRobotStreamDataset of SOURCE, whose metadata rank 0
  reads and broadcasts; each rank reads its share itself (no workers).
- mix: torch.distributed; a MixDataset of the Parquet source and the TAR shards,
  elastic, through a DataLoader of 2 workers: rank 0 resolves each and broadcasts it.
- shared: no torch: StreamOptions(manifest_dir=TMP/job); "workers" streams (default 4)
  side by side in one event loop (on "backend": asyncio, the default, or trio), each
  resolving SOURCE by name; with "slice_bytes", elastic (StreamOptions(elastic=True)).

Each rank writes TMP/rank-N.json: {"ids": [...]} (and, shared, "per_consumer": the rows
each of its streams delivered) or {"error": "Type: message"}; in shared mode a rank
whose client received an answer 429 fails with it.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path
from typing import Any

import anyio

import aiostream_hf as ash

WORKERS = 4


def _options(cache: Path, **kw: Any) -> ash.StreamOptions:
    # pin_ttl: the seed of a node's cache must outlive a slow start of its workers
    return ash.StreamOptions(cache_dir=cache, pin_ttl=600, **kw)


def distributed(config: dict[str, Any], rank: int) -> list[int]:
    import torch.distributed as dist
    import torch.utils.data

    from aiostream_hf.torch import StreamDataset

    tmp, world = Path(config["tmp"]), config["ranks"]
    node = rank // config["per_node"]
    endpoint, source, split = config["endpoint"], config["source"], config["splits"][rank]
    cache = tmp / f"node-{node}"

    class ByName(torch.utils.data.IterableDataset[Any]):
        """Each DataLoader worker streams its share of ``source`` by name."""

        def __iter__(self) -> Any:
            info = torch.utils.data.get_worker_info()
            assert info is not None
            s = ash.stream(
                source,
                split=split,
                endpoint=endpoint,
                columns=["id"],
                options=_options(cache),
                rank=rank * info.num_workers + info.id,
                world_size=world * info.num_workers,
            )
            yield from s

    store = tmp / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        ds: torch.utils.data.IterableDataset[Any] = StreamDataset(
            source, split=split, endpoint=endpoint, columns=["id"], options=_options(cache)
        )
        if node % 2 == 1:
            ds = ByName()
        # fork: the workers inherit ByName, a class of this function
        loader = torch.utils.data.DataLoader(
            ds, batch_size=4, num_workers=WORKERS, multiprocessing_context="fork"
        )
        return [int(i) for batch in loader for i in batch["id"]]
    finally:
        dist.destroy_process_group()


def lerobot(config: dict[str, Any], rank: int) -> list[int]:
    """torch.distributed; a LeRobotStreamDataset (rank 0 reads meta/ and broadcasts it),
    read in the rank itself (no workers): the frame indices."""
    import torch.distributed as dist
    import torch.utils.data

    from aiostream_hf.torch import LeRobotStreamDataset

    tmp, world = Path(config["tmp"]), config["ranks"]
    cache = tmp / f"node-{rank // config['per_node']}"
    store = tmp / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        ds = LeRobotStreamDataset(
            config["source"], endpoint=config["endpoint"], options=_options(cache), batch_items=4
        )
        loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=0)
        return [int(i) for batch in loader for i in batch["index"]]
    finally:
        dist.destroy_process_group()


def mix(config: dict[str, Any], rank: int) -> list[str]:
    """torch.distributed; a MixDataset of two StreamDatasets (Parquet ``source`` and TAR
    ``shards``, both elastic; rank 0 resolves each and broadcasts it), read through a
    DataLoader of 2 workers, one sample at a time: the rows' ids and the samples' keys."""
    import torch.distributed as dist
    import torch.utils.data

    from aiostream_hf.torch import MixDataset, StreamDataset

    tmp, world = Path(config["tmp"]), config["ranks"]
    cache = tmp / f"node-{rank // config['per_node']}"
    store = tmp / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        kw: dict[str, Any] = {"split": "train", "endpoint": config["endpoint"]}
        kw["options"] = _options(cache, elastic=True)
        rows = StreamDataset(config["source"], columns=["id"], **kw)
        shards = StreamDataset(config["shards"], **kw)
        ds = MixDataset([rows, shards], [0.5, 0.5], seed=1, stop="all_exhausted")
        loader = torch.utils.data.DataLoader(
            ds, batch_size=None, num_workers=2, multiprocessing_context="fork"
        )
        return [str(item["id"] if "id" in item else item["__key__"]) for item in loader]
    finally:
        dist.destroy_process_group()


async def shared(config: dict[str, Any], rank: int) -> dict[str, list[int]]:
    tmp, world = Path(config["tmp"]), config["ranks"]
    cache = tmp / f"node-{rank // config['per_node']}"
    workers = config.get("workers", WORKERS)
    sliced: dict[str, Any] = {}
    if "slice_bytes" in config:
        sliced = {"elastic": True, "slice_bytes": config["slice_bytes"]}
    ids: list[int] = []
    per_consumer = [0] * workers
    throttled = 0

    async def consumer(k: int) -> None:
        nonlocal throttled
        s = ash.stream(
            config["source"],
            split=config["splits"][rank],
            endpoint=config["endpoint"],
            columns=["id"],
            options=_options(cache, manifest_dir=tmp / "job", **sliced),
            rank=rank * workers + k,
            world_size=world * workers,
        )
        async with s:
            got = [int(row["id"]) async for row in s]
            throttled = max(throttled, int(s.statistics().client.get("throttled", 0)))
        ids.extend(got)
        per_consumer[k] = len(got)

    async with anyio.create_task_group() as tg:
        for k in range(workers):
            tg.start_soon(consumer, k)
    if throttled:  # the client of this process saw 429s: say so in the result
        raise RuntimeError(f"rank {rank}: {throttled} answers 429 (Too Many Requests)")
    return {"ids": ids, "per_consumer": per_consumer}


def run_rank(config: dict[str, Any], rank: int) -> None:
    result: dict[str, Any]
    try:
        if config["mode"] == "distributed":
            result = {"ids": distributed(config, rank)}
        elif config["mode"] == "lerobot":
            result = {"ids": lerobot(config, rank)}
        elif config["mode"] == "mix":
            result = {"ids": mix(config, rank)}
        else:
            result = anyio.run(shared, config, rank, backend=config.get("backend", "asyncio"))
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    (Path(config["tmp"]) / f"rank-{rank}.json").write_text(json.dumps(result))


def main() -> int:
    config = json.loads(sys.argv[1])
    if config["mode"] in ("distributed", "lerobot", "mix"):
        import torch.distributed  # noqa: F401  (once, here, for every rank)
        import torch.utils.data  # noqa: F401

        import aiostream_hf.torch  # noqa: F401
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=run_rank, args=(config, r)) for r in range(config["ranks"])]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join()
    return max(abs(p.exitcode or 0) for p in ranks)


if __name__ == "__main__":
    sys.exit(main())
