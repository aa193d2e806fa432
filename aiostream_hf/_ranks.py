"""Which share of a dataset this process reads: rank and world size.

``rank_and_world`` checks what a caller gave, else takes ``RANK`` and
``WORLD_SIZE`` from the environment (torchrun and most launchers set them).
"""

from __future__ import annotations

import os
import sys

from ._exceptions import SourceError

__all__ = ["environment_rank", "loader_workers", "rank_and_world"]


def environment_rank() -> tuple[int, int] | None:
    """(RANK, WORLD_SIZE) from the environment, None unless both are set."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    try:
        return int(rank), int(world)
    except ValueError:
        raise SourceError(
            f"RANK={rank!r}, WORLD_SIZE={world!r} in the environment: both must be integers"
        ) from None


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """The (rank, world size) to read with: as given, else from the environment, else (0, 1)."""
    if rank is None and world_size is None:
        return environment_rank() or (0, 1)
    if rank is None or world_size is None:
        raise SourceError(f"rank={rank!r}, world_size={world_size!r}: give both or neither")
    if world_size < 1 or not 0 <= rank < world_size:
        raise SourceError(
            f"rank={rank!r}, world_size={world_size!r}: need world_size >= 1 and "
            "0 <= rank < world_size"
        )
    return rank, world_size


def loader_workers() -> int:
    """How many torch DataLoader worker processes read side by side with this one, this
    one included: ``num_workers`` when this process is one of them, else 1. Asks torch
    only if something imported it already (a DataLoader worker always has)."""
    torch = sys.modules.get("torch")
    data = getattr(getattr(torch, "utils", None), "data", None)
    info = data.get_worker_info() if data is not None else None
    return int(info.num_workers) if info is not None else 1
