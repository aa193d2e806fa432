"""An async service: stream a dataset into concurrent handlers without blocking the loop.

    python examples/async_service.py                      # a local Hub server, synthetic data
    python examples/async_service.py hf://datasets/ORG/NAME --split train --column text

Think of an evaluator, a crawler or a FastAPI worker: rows come from
``ash.stream(...)`` inside the event loop, a few handler tasks process them
concurrently (here: a pretend model call of 2 ms each), and a ticker task measures
how late the loop wakes it. Parquet decoding runs in worker threads, so the loop
stays responsive while rows stream in.

Without a SOURCE the script writes a small web-text dataset with
``aiostream_hf.testing`` and serves it from the local Hub server with 20 ms of
latency per request: no network, no account.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pyarrow.compute as pc

import aiostream_hf as ash


@contextlib.contextmanager
def local_hub() -> Iterator[str]:
    """A local Hub server with org/web-text (3 Parquet files); yields its endpoint."""
    from aiostream_hf.testing import Faults, HubServer, make_repo, make_text_parquet

    with tempfile.TemporaryDirectory() as root:
        repo = make_repo(root, "org/web-text", {"README.md": "# web-text\n"})
        for i in range(3):
            make_text_parquet(
                repo / f"data/train-{i:05d}-of-00003.parquet", rows=400, seed=i, start_id=i * 400
            )
        with HubServer(root, faults=Faults(latency_ms=20)) as hub:
            yield hub.endpoint


async def fake_model(text: str) -> float:
    """Stands in for a call to a model server: I/O-bound, 2 ms."""
    await anyio.sleep(0.002)
    return len(set(text.split())) / max(1, len(text.split()))


async def serve(source: str, endpoint: str | None, args: argparse.Namespace, local: bool) -> None:
    column = args.column
    stall = 0.0
    scored = 0
    done = anyio.Event()

    async def ticker() -> None:
        """How late does the loop wake a 10 ms sleeper? That is the service's stall."""
        nonlocal stall
        while not done.is_set():
            before = time.perf_counter()
            await anyio.sleep(0.01)
            stall = max(stall, time.perf_counter() - before - 0.01)

    async def handler(rows: Any) -> None:
        nonlocal scored
        async with rows:
            async for row in rows:
                await fake_model(row[column])
                scored += 1

    kwargs: dict[str, Any] = {"split": args.split, "columns": [column], "endpoint": endpoint}
    if local:
        # Filters are pyarrow expressions; row groups are pruned by their statistics.
        kwargs["columns"] = [column, "score"]
        kwargs["filter"] = pc.field("score") > 0.5
    stats: Any = None

    async def producer(send: Any) -> None:
        """Owns the stream: it is opened, iterated and closed in this one task."""
        nonlocal stats
        async with send, ash.stream(source, **kwargs) as rows_in:
            taken = 0
            async for row in rows_in:
                await send.send(row)  # waits while every handler is busy: backpressure
                taken += 1
                if args.limit and taken >= args.limit:
                    break
        stats = rows_in.statistics()

    started = time.perf_counter()
    async with anyio.create_task_group() as outer:
        outer.start_soon(ticker)
        async with anyio.create_task_group() as tg:
            send, receive = anyio.create_memory_object_stream[dict[str, Any]](args.handlers)
            tg.start_soon(producer, send)
            async with receive:
                for _ in range(args.handlers):
                    tg.start_soon(handler, receive.clone())
        done.set()  # every handler is done: stop the ticker
    seconds = time.perf_counter() - started
    print(f"scored {scored:,} rows in {seconds:.2f} s ({scored / seconds:,.0f} rows/s)")
    if "filter" in kwargs:
        print(f"the stream kept only the rows where {kwargs['filter']} (filter=)")
    print(
        f"with {args.handlers} concurrent handlers; longest event-loop stall: {stall * 1000:.0f} ms"
    )
    fetcher, resolver = stats.fetcher, stats.resolver
    print(
        f"requests: {resolver['api_requests']} api, {fetcher['requests']['resolve']} resolvers, "
        f"{fetcher['requests']['range']} range reads; first row after "
        f"{(stats.time_to_first_sample or 0) * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", nargs="?", help="hf://datasets/ORG/NAME, a URL or a path")
    parser.add_argument("--split", default="train")
    parser.add_argument("--column", default="text", help="the text column to score")
    parser.add_argument("--handlers", type=int, default=16, help="concurrent handler tasks")
    parser.add_argument("--limit", type=int, default=2000, help="rows to score (0: all)")
    args = parser.parse_args()
    if args.source:
        anyio.run(serve, args.source, None, args, False)
        return
    with local_hub() as endpoint:
        print(f"local Hub server at {endpoint} (+20 ms per request)")
        anyio.run(serve, "hf://datasets/org/web-text", endpoint, args, True)


if __name__ == "__main__":
    main()
