"""PyTorch integration: ``StreamDataset``, an ``IterableDataset`` over ``stream()``.

    ds = ash.torch.StreamDataset("hf://datasets/org/name", split="train")
    loader = torchdata.stateful_dataloader.StatefulDataLoader(ds, num_workers=4)

The dataset resolves its source once, in the process that builds it, and
pickles the manifest to DataLoader workers: workers make no API request.
Files are split across rank x worker (row groups when there are fewer files
than consumers). ``state_dict()``/``load_state_dict()`` follow torchdata's
Stateful protocol, so ``StatefulDataLoader`` checkpoints each worker's exact
position. ``set_epoch(n)`` reaches persistent workers through shared memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed
import torch.utils.data

from . import _bridge
from ._exceptions import SourceError
from ._options import StreamOptions
from ._resolver import Manifest, Resolver
from ._stream import Stream, stream

__all__ = ["StreamDataset", "distributed_rank"]

_RESOLVE_KEYS = ("config", "split", "data_files", "token", "endpoint")


def distributed_rank() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when initialised, else RANK/WORLD_SIZE."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None:
        return int(rank), int(world)
    return 0, 1


class StreamDataset(torch.utils.data.IterableDataset[Any]):
    """A torch IterableDataset streaming ``source`` with ``stream(**stream_kwargs)``."""

    def __init__(self, source: Any, **stream_kwargs: Any) -> None:
        for key in ("rank", "world_size"):
            if key in stream_kwargs:
                raise SourceError(
                    f"StreamDataset takes no {key}=: it reads rank and world size from "
                    "torch.distributed (or RANK/WORLD_SIZE) and splits across workers itself"
                )
        options = stream_kwargs.get("options") or StreamOptions()
        resolve_kwargs = {k: stream_kwargs[k] for k in _RESOLVE_KEYS if k in stream_kwargs}
        if isinstance(source, Manifest):
            self.manifest = source
        else:
            self.manifest = _bridge.portal().call(_resolve, source, options, resolve_kwargs)
        self._stream_kwargs = {k: v for k, v in stream_kwargs.items() if k not in _RESOLVE_KEYS}
        self._stream_kwargs["token"] = stream_kwargs.get("token")
        self._stream_kwargs["endpoint"] = stream_kwargs.get("endpoint")
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._stream: Stream | None = None
        self._pending_state: dict[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Shuffle orders depend on (seed, epoch); persistent workers see it too."""
        self._epoch.fill_(epoch)

    def _consumer(self) -> tuple[int, int]:
        rank, world = distributed_rank()
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * workers + worker, world * workers

    def __iter__(self) -> Iterator[Any]:
        consumer, consumers = self._consumer()
        s = stream(self.manifest, rank=consumer, world_size=consumers, **self._stream_kwargs)
        s.set_epoch(int(self._epoch))
        if self._pending_state is not None:
            s.load_state_dict(self._pending_state)
            self._pending_state = None
        self._stream = s
        return iter(s)

    def state_dict(self) -> dict[str, Any]:
        """This consumer's exact position (torchdata Stateful protocol)."""
        if self._stream is not None:
            return {"stream": self._stream.state_dict()}
        return {"stream": self._pending_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pending_state = state.get("stream")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_stream"] = None  # a live stream stays in its process
        return state


async def _resolve(source: Any, options: StreamOptions, kwargs: dict[str, Any]) -> Manifest:
    async with Resolver(options=options) as resolver:
        return await resolver.resolve(source, **kwargs)
