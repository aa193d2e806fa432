"""WebDataset TAR shards: streaming, and the bridge into existing webdataset pipelines.

Stream shards with aiostream-hf's engine (one long GET per shard, parsed block
by block, the next shards read ahead, exact resume)::

    import aiostream_hf.webdataset as ashwds

    s = ashwds.stream("https://host/train-{000000..000099}.tar", decode="rgb8",
                      shuffle=1000, seed=0, on_error="warn")
    async for sample in s:          # or: for sample in s
        sample["__key__"], sample["jpg"], sample["cls"]

Or keep webdataset code as it is and let it read ``hf://`` and ``http(s)://``
shards through this library's fetcher (retries, resume on cut, redirect cache)
instead of ``curl`` pipes::

    ashwds.install_gopen()
    dataset = wds.WebDataset("hf://datasets/org/name/train-{000000..000099}.tar", ...)

or put this library's stream at the head of a ``wds.DataPipeline``::

    pipeline = wds.DataPipeline(ashwds.ShardSource(urls), wds.shuffle(1000),
                                wds.decode("pil"), wds.to_tuple("jpg", "cls"))

Samples are what ``webdataset`` builds: ``{"__key__", "__url__", ext: bytes}``
(see ``aiostream_hf.formats.webdataset`` for the few differences, all on purpose).

Image decoding (``decode="rgb8"``, ``"pil"``, ...) is webdataset's, with Pillow:
``pip install 'aiostream-hf[image]'`` (without it the stream is refused when made,
naming that extra).
"""

from __future__ import annotations

import importlib
import io
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import anyio

from . import _bridge
from ._access import find_access
from ._client import HubClient
from ._engine import Readers, make_readers, open_readers
from ._exceptions import SourceError
from ._interleave import Interleaved
from ._models import FileRef, Manifest
from ._options import StreamOptions
from ._ranks import environment_rank
from ._resolver import Resolver
from ._sources import HubSource, parse_sources
from ._stream import Output, Stream
from ._stream import stream as _stream
from .formats.webdataset import (
    OnError,
    SkippedShardWarning,
    WebDatasetDecoder,
    sample_decoder,
)

__all__ = [
    "ShardFile",
    "ShardSource",
    "SkippedShardWarning",
    "WebDatasetDecoder",
    "install_gopen",
    "open_shard",
    "sample_decoder",
    "stream",
    "uninstall_gopen",
]

Sample = dict[str, Any]


def stream(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Manifest,
    *,
    decode: Any = None,
    shuffle: bool | int | None = None,
    seed: int = 0,
    resampled: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    on_error: OnError = "raise",
    readahead: int = 2,
    columns: Sequence[str] | None = None,
    missing_is_error: bool = True,
    batch_size: int | None = None,
    output: Output = "python",
    split: str | None = None,
    config: str | None = None,
    data_files: str | Sequence[str] | Mapping[str, str | Sequence[str]] | None = None,
    options: StreamOptions | None = None,
    token: str | None = None,
    endpoint: str | None = None,
) -> Stream | Interleaved:
    """A lazy stream of the samples of WebDataset shards (``aiostream_hf.stream`` with a
    configured ``WebDatasetDecoder``).

    ``decode``: None (bytes), an image spec of webdataset (``"pil"``, ``"rgb8"``,
    ``"torchrgb"``, ...; Pillow, the ``image`` extra), a handler, or a list of them
    (webdataset's ``autodecode``). ``shuffle``: shard order by (seed, epoch), and samples
    through a buffer of that size (True: 1000). ``resampled``: shards drawn
    with replacement, endlessly, by (seed, epoch, rank). ``rank``/``world_size``
    split the shards (``aiostream_hf.torch.StreamDataset`` passes rank x
    DataLoader worker). ``on_error``: ``"raise"``, ``"warn"`` or
    ``"skip_shard"`` for a damaged shard. ``readahead``: shards read ahead of
    the one being consumed. ``columns``: the extensions to keep (plus
    ``__key__``/``__url__`` if named); as with webdataset's ``to_tuple``, a
    sample without one of them raises ``SourceError`` naming it, unless
    ``missing_is_error=False`` (optional columns: None where a sample lacks one).
    """
    decoder = WebDatasetDecoder(
        decode=decode,
        on_error=on_error,
        readahead=readahead,
        resampled=resampled,
        missing_is_error=missing_is_error,
    )
    if decode is not None and (output != "python" or batch_size is not None):
        raise SourceError(
            f"decode={decode!r} gives Python objects, which output={output!r} and "
            f"batch_size={batch_size!r} cannot hold: take dict rows (batch in your DataLoader)"
        )
    return _stream(
        source,
        split=split,
        config=config,
        data_files=data_files,
        format=decoder,
        columns=columns,
        batch_size=batch_size,
        output=output,
        shuffle=shuffle,
        seed=seed,
        rank=rank,
        world_size=world_size,
        options=options,
        token=token,
        endpoint=endpoint,
    )


# -- file objects for webdataset's gopen ---------------------------------------------------


class _Opener:
    """A client, a resolver and a fetcher on the bridge's event loop, shared by the shards
    it opens (``shared``: one connection pool for all), or each shard's own over the
    bridge loop's shared client, closed with the shard.

    Made again in a forked child (a DataLoader worker): the parent's belong to
    the parent's bridge thread, which the child does not have.
    """

    def __init__(
        self,
        options: StreamOptions | None,
        token: str | None,
        endpoint: str | None,
        *,
        shared: bool = True,
    ) -> None:
        self.options = options or StreamOptions()
        self.token = token
        self.endpoint = endpoint
        self.shared = shared
        self._lock = threading.Lock()
        self._pid = -1
        self._reset()

    def _reset(self) -> None:
        self._readers: Readers | None = None
        self._making: anyio.Lock | None = None  # made on the bridge's loop, where it is used
        self._files: dict[str, FileRef] = {}

    def _check_process(self) -> None:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child: start afresh
                self._pid = os.getpid()
                self._reset()

    async def _shared(self) -> Readers:
        """This process's readers (``make_readers``, over a client of their own): made at
        the first shard opened, with the access found then (token=/endpoint=, else the
        environment), and kept for the shards after it until ``close``."""
        if self._making is None:
            self._making = anyio.Lock()
        async with self._making:
            if self._readers is None:
                access = await find_access(self.token, self.endpoint)
                self._readers = make_readers(self.options, access, HubClient())
            return self._readers

    async def _file(self, url: str, resolver: Resolver) -> FileRef:
        known = self._files.get(url)
        if known is not None:
            return known
        (source,) = parse_sources(url)
        if isinstance(source, HubSource):
            manifest = await resolver.resolve(url)
            if len(manifest.files) != 1:
                raise SourceError(
                    f"{url}: names {len(manifest.files)} files; webdataset opens one shard "
                    "per URL (expand braces or globs in the shard list)"
                )
            file = manifest.files[0]
        else:
            file = FileRef(url, url)
        self._files[url] = file
        return file

    async def blocks(self, url: str) -> AsyncIterator[bytes]:
        """The shard's bytes, in blocks of ``options.block_size`` (one long GET)."""
        if self.shared:
            readers = await self._shared()
            file = await self._file(url, readers.resolver)
            async with readers.fetcher.iter_bytes(file) as blocks:
                async for block in blocks:
                    yield block
            return
        async with open_readers(self.options, token=self.token, endpoint=self.endpoint) as r:
            file = await self._file(url, r.resolver)
            async with r.fetcher.iter_bytes(file) as blocks:
                async for block in blocks:
                    yield block

    def close(self) -> None:
        """Close the readers and client of this process (waits for them on the bridge)."""
        self._check_process()
        readers, self._readers = self._readers, None
        if readers is not None:
            for resource in (readers.fetcher, readers.resolver, readers.client):
                _bridge.portal().call(resource.aclose)

    def open(self, url: str) -> ShardFile:
        self._check_process()
        return ShardFile(url, partial(self.blocks, url))


class ShardFile(io.RawIOBase):
    """A read-only, forward-only file object over a shard's bytes.

    The bytes come from ``RangeFetcher.iter_bytes`` on the bridge thread (one
    long GET, resumed if cut), at most two blocks ahead; reads are served
    from the current block without crossing threads. ``close()`` (also on
    garbage collection) cancels the request.
    """

    def __init__(self, name: str, blocks: Callable[[], AsyncIterator[bytes]]) -> None:
        super().__init__()
        self.name = name
        self._blocks: _bridge.SyncIterator[bytes] = _bridge.SyncIterator(blocks, buffer=2)
        self._block = memoryview(b"")
        self._pos = 0
        self._eof = False

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        while self._pos >= len(self._block):
            if self._eof:
                return False
            try:
                self._block = memoryview(next(self._blocks))
            except StopIteration:
                self._eof = True
                self._block = memoryview(b"")
                return False
            self._pos = 0
        return True

    def read(self, size: int | None = -1) -> bytes:
        if self.closed:
            raise ValueError("read of a closed ShardFile")
        if size is None or size < 0:
            parts = []
            while self._fill():
                parts.append(self._block[self._pos :].tobytes())
                self._pos = len(self._block)
            return b"".join(parts)
        if not size or not self._fill():
            return b""
        end = min(len(self._block), self._pos + size)
        data = self._block[self._pos : end].tobytes()
        self._pos = end
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self.closed:
            raise ValueError("read of a closed ShardFile")
        if not len(view) or not self._fill():
            return 0
        n = min(len(view), len(self._block) - self._pos)
        view[:n] = self._block[self._pos : self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            self._block = memoryview(b"")
            # Also from the garbage collector, on any thread (the bridge's own) and at
            # interpreter exit: SyncIterator.close waits only where it can.
            self._blocks.close()
        super().close()


_installed: dict[str, Any] = {}  # scheme -> the handler it had before install_gopen
_opener: _Opener | None = None
_install_lock = threading.Lock()


def open_shard(
    url: str,
    *,
    options: StreamOptions | None = None,
    token: str | None = None,
    endpoint: str | None = None,
) -> ShardFile:
    """A file object reading one ``hf://`` or ``http(s)://`` shard through aiostream-hf.

    With ``install_gopen()`` in effect and no arguments, its shared fetcher is
    used; otherwise a fetcher is made for this file, and closed with it.
    """
    if _opener is not None and options is None and token is None and endpoint is None:
        return _opener.open(url)
    return _Opener(options, token, endpoint, shared=False).open(url)


def install_gopen(
    *,
    options: StreamOptions | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    schemes: Sequence[str] = ("hf", "http", "https"),
) -> None:
    """Make webdataset open ``schemes`` URLs through aiostream-hf's fetcher.

    Replaces the handlers in ``webdataset.gopen.gopen_schemes`` (webdataset's
    ``curl`` pipes), so existing ``wds.WebDataset(urls)`` and
    ``wds.DataPipeline`` code reads shards with one long GET each, retried and
    resumed on cuts, with Hub redirects cached; write modes keep webdataset's
    handler. ``token``/``endpoint`` are for ``hf://`` URLs (default: the usual
    huggingface_hub token and ``HF_ENDPOINT``). Calling it again replaces the
    settings; ``uninstall_gopen()`` restores webdataset's handlers. DataLoader
    workers made by fork inherit it; with spawn, call it in ``worker_init_fn``.
    """
    global _opener
    gopen = _gopen_module()
    bad = [s for s in schemes if s not in ("hf", "http", "https")]
    if bad:
        raise SourceError(f"install_gopen(schemes={list(schemes)!r}): only hf, http and https")
    with _install_lock:
        old, _opener = _opener, _Opener(options, token, endpoint)
        for scheme in schemes:
            previous = gopen.gopen_schemes.get(scheme)
            if scheme not in _installed:
                _installed[scheme] = previous
            gopen.gopen_schemes[scheme] = partial(_gopen, _opener, _installed[scheme])
    if old is not None:
        old.close()


def uninstall_gopen() -> None:
    """Give webdataset its own handlers back and close the shared fetcher."""
    global _opener
    gopen = _gopen_module()
    with _install_lock:
        for scheme, previous in _installed.items():
            if previous is None:
                gopen.gopen_schemes.pop(scheme, None)
            else:
                gopen.gopen_schemes[scheme] = previous
        _installed.clear()
        old, _opener = _opener, None
    if old is not None:
        old.close()


def _gopen_module() -> Any:
    # ``webdataset.gopen`` is also the name of a function that webdataset exports.
    return importlib.import_module("webdataset.gopen")


def _gopen(
    opener: _Opener, fallback: Any, url: str, mode: str = "rb", *args: Any, **kw: Any
) -> Any:
    if mode[0] == "r":
        return opener.open(url)
    if fallback is None:
        raise ValueError(f"{url}: no webdataset handler to open it in mode {mode!r}")
    return fallback(url, mode, *args, **kw)


# -- a source stage for wds.DataPipeline -------------------------------------------------


class ShardSource:
    """The samples of shards, streamed by aiostream-hf, as the first stage of a
    ``wds.DataPipeline`` (or any loop)::

        wds.DataPipeline(ShardSource(urls, shuffle=1000), wds.decode("pil"), ...)

    ``stream_kwargs`` are those of ``aiostream_hf.webdataset.stream``. Without
    ``rank``/``world_size``, shards are split across torch.distributed ranks
    (or RANK/WORLD_SIZE) and DataLoader workers, as webdataset's
    ``split_by_node`` and ``split_by_worker`` do. The source is resolved once,
    when the stage is made, so DataLoader workers make no API request.
    ``set_epoch(n)`` changes the shuffle order of the next iteration.
    """

    def __init__(self, source: Any, **stream_kwargs: Any) -> None:
        options = stream_kwargs.get("options") or StreamOptions()
        resolve = {
            k: stream_kwargs.pop(k) for k in ("split", "config", "data_files") if k in stream_kwargs
        }
        if isinstance(source, Manifest):
            self.manifest = source
        else:
            self.manifest = _bridge.portal().call(
                partial(
                    _resolve,
                    source,
                    options,
                    token=stream_kwargs.get("token"),
                    endpoint=stream_kwargs.get("endpoint"),
                    **resolve,
                )
            )
        stream(self.manifest, **stream_kwargs)  # bad arguments fail here, not in a worker
        self._kwargs = stream_kwargs
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __call__(self) -> Iterator[Sample]:
        kwargs = dict(self._kwargs)
        if "rank" not in kwargs and "world_size" not in kwargs:
            kwargs["rank"], kwargs["world_size"] = _consumer()
        s = stream(self.manifest, **kwargs)
        s.set_epoch(self.epoch)
        return iter(s)

    def __iter__(self) -> Iterator[Sample]:
        return self()


def _consumer() -> tuple[int, int]:
    """(rank x DataLoader worker, world size x workers), from torch when it is installed."""
    rank, world = environment_rank() or (0, 1)
    try:
        import torch.distributed
        import torch.utils.data
    except ImportError:
        return rank, world
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    info = torch.utils.data.get_worker_info()
    if info is None:
        return rank, world
    return rank * info.num_workers + info.id, world * info.num_workers


async def _resolve(
    source: Any,
    options: StreamOptions,
    *,
    token: str | None = None,
    endpoint: str | None = None,
    **kwargs: Any,
) -> Manifest:
    async with open_readers(options, token=token, endpoint=endpoint) as r:
        return await r.resolver.resolve(source, **kwargs)
