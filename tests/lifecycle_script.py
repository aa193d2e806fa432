"""Leaves streams every way a user can, on one anyio backend, then counts what is left.

    python tests/lifecycle_script.py BACKEND ENDPOINT REPO LEROBOT_REPO CACHE_DIR

Run by tests/test_stream_lifecycle.py in a fresh process, so that stderr holds only
what these exits print (it must hold nothing) and the counts are this process's own:
it prints one JSON line with the threads, tasks and sockets before and after.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import threading
from typing import Any

import anyio

import aiostream_hf as ash

# The event loops' own thread pools outlive any one user by design: anyio's worker
# threads (they exit after 10 s idle), asyncio's default executor (getaddrinfo) and
# trio's thread cache. Every other thread counts.
_POOLS = ("AnyIO worker thread", "asyncio_", "Trio thread ")


def threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if not t.name.startswith(_POOLS))


def sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return n


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def tasks(backend: str) -> int:
    if backend == "trio":
        import trio

        count, stack = 0, [trio.lowlevel.current_root_task()]
        while stack:
            task = stack.pop()
            count += 1
            for nursery in task.child_nurseries:
                stack.extend(nursery.child_tasks)
        return count
    import asyncio

    return len(asyncio.all_tasks())


async def leave_every_way(make: Any) -> dict[str, Any]:
    """Exits 1-6 of the streams (or mixtures) ``make()`` gives; what each one left."""
    outcomes: dict[str, Any] = {}

    # 1. A bare `async for` fails at once, naming the fix.
    try:
        async for _ in make():
            break
        outcomes["bare"] = "iterated"
    except ash.UsageError as exc:
        outcomes["bare"] = "UsageError" if "async with" in str(exc) else str(exc)

    # 2. `break` inside `async with`.
    async with make() as s:
        async for _ in s:
            break
    outcomes["break"] = s.statistics().samples

    # 3. `break` in a task of the user's own task group, a sibling still running.
    async def consume() -> None:
        async with make() as s:
            async for _ in s:
                break

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.sleep, 0.05)
        tg.start_soon(consume)
    outcomes["task_group"] = "ok"

    # 4. An exception in the loop body leaves as itself, not in an ExceptionGroup.
    try:
        async with make() as s:
            async for _ in s:
                raise KeyError("mine")
    except KeyError as exc:
        outcomes["body_error"] = type(exc).__name__
    except BaseException as exc:  # reported, not hidden
        outcomes["body_error"] = repr(exc)

    # 5. The user's task is cancelled while it holds a sample.
    with anyio.move_on_after(0.2) as scope:
        async with make() as s:
            async for _ in s:
                await anyio.sleep(10)
    outcomes["cancelled"] = scope.cancelled_caught

    # 6. An iteration dropped without being closed (garbage collected), then the stream
    #    iterated again to its end in the same `async with`.
    async with make() as s:
        it = aiter(s)
        await anext(it)
        del it
        gc.collect()
        outcomes["after_gc"] = sum([1 async for _ in s])
    return outcomes


async def main(
    backend: str, endpoint: str, repo: str, robot_repo: str, cache: str
) -> dict[str, Any]:
    options = ash.StreamOptions(cache_dir=cache, prefetch_count=4)

    def make() -> ash.Stream:
        return ash.stream(f"hf://datasets/{repo}", endpoint=endpoint, options=options)

    before = {"threads": threads(), "tasks": tasks(backend), "sockets": sockets(), "fds": fds()}
    outcomes = await leave_every_way(make)

    # 7. The same for a LeRobot stream: the same engine.
    def robot() -> Any:
        return ash.lerobot.stream(f"hf://datasets/{robot_repo}", endpoint=endpoint, options=options)

    try:
        async for _ in robot():
            break
        outcomes["lerobot_bare"] = "iterated"
    except ash.UsageError:
        outcomes["lerobot_bare"] = "UsageError"
    async with robot() as r:
        async for _ in r:
            break
    outcomes["lerobot_break"] = r.statistics().items

    async def consume_robot() -> None:
        async with robot() as r:
            async for _ in r:
                break

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.sleep, 0.05)
        tg.start_soon(consume_robot)
    outcomes["lerobot_task_group"] = "ok"

    # 8. Exits 1-6 of a mixture of two streams (it enters the members' `async with`).
    def mixture() -> ash.Mix:
        return ash.mix([make(), make()], [0.5, 0.5], stop="all_exhausted")

    mixed = await leave_every_way(mixture)
    outcomes.update({f"mix_{key}": value for key, value in mixed.items()})

    gc.collect()
    await anyio.sleep(0.1)  # let closed sockets' transports finish on asyncio
    after = {"threads": threads(), "tasks": tasks(backend), "sockets": sockets(), "fds": fds()}
    return {"outcomes": outcomes, "before": before, "after": after}


if __name__ == "__main__":
    backend, endpoint, repo, robot_repo, cache = sys.argv[1:6]
    result = anyio.run(main, backend, endpoint, repo, robot_repo, cache, backend=backend)
    print(json.dumps(result))
