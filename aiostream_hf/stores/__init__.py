"""Stores: where files live, one module each; nothing outside a store knows its wire
format or its rules.

- ``hub``: the Hub's repos (``HubSource``). Its listing has configs and splits, so the
  resolver drives it (``_hub_layout`` with ``hub``'s pin, tree and card); its reads go
  through ``/resolve/`` (``_transfer``); ``HubStore.read_error`` explains a refusal.
- ``http``: plain http(s) URLs (``UrlSource``).
- ``local``: files on disk (``LocalSource``, ``file://``), read with ``os.pread``.
- ``s3``, and any other *bucket store*: ``SCHEME://BUCKET/KEY`` sources
  (``_sources.BucketSource``), listed by the store and signed by it as each request
  leaves.

Every store but the Hub lists its sources with ``Store.resolve``; every store reached
over HTTP says what a refused read means with ``read_error(Refusal)``. The resolver and
the fetcher ask through this module and nothing else::

    store = stores.for_source(src)              # the resolver: list the sources
    files = await store.resolve(sources, lister)
    store = stores.for_file(file)               # the fetcher: a bucket store signs
    signer = await store.context(options, file.path)
    error = stores.reader_of(file, access).read_error(refusal)   # a refused read

Adding a store (e.g. ``gs://``) is one module here: a class with ``name``, ``scheme``,
``check_available``, ``context``, ``resolve``, ``error_body`` and ``read_error``, and
its ``STORE`` passed to ``register`` (docs/design.md, "Adding a store";
tests/test_stores.py adds one of a single module).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import httpx2

from .._access import Access, origin
from .._client import RequestSigner
from .._exceptions import FetchError
from .._models import FileRef
from .._options import StreamOptions
from .._sources import (
    BucketSource,
    LocalSource,
    Source,
    UrlSource,
    register_bucket_scheme,
    unregister_bucket_scheme,
)
from . import http, hub, local, s3
from ._refusal import Refusal

__all__ = [
    "BucketStore",
    "Lister",
    "Refusal",
    "Store",
    "for_file",
    "for_scheme",
    "for_source",
    "reader_of",
    "register",
    "unregister",
]

T = TypeVar("T")


class Lister(Protocol):
    """What the resolver gives a store to list a bucket with."""

    @property
    def options(self) -> StreamOptions: ...

    async def get(
        self,
        url: str,
        *,
        signer: RequestSigner,
        refused: Callable[[httpx2.Response, bytes, int], Exception],
    ) -> bytes:
        """The body of one GET through the client (``HubClient.request``), signed by
        ``signer``; an error answer becomes ``refused(response, body, attempts)``."""
        ...

    async def once(
        self,
        key: tuple[Any, ...],
        compute: Callable[[], Awaitable[T]],
        encode: Callable[[T], Any],
        decode: Callable[[Any], T],
    ) -> T:
        """``compute()``, coalesced in the process and on the machine and cached for
        ``pin_ttl`` seconds under ``key`` (which must name whose credentials it was)."""
        ...

    def glob(self, pattern: str) -> Any:
        """The matcher of a glob over keys (``.match(key)`` is true for a key it
        matches), as globs match on the Hub."""
        ...


class Store(Protocol):
    """Where the files of some sources live: it lists them."""

    name: str

    async def resolve(self, sources: Sequence[Any], lister: Lister) -> tuple[FileRef, ...]:
        """The files ``sources`` (all of this store; of one bucket for a bucket store)
        name, with what the listing tells of them (size, ETag)."""
        ...


class Reader(Protocol):
    """A store reached over HTTP: it says what a refused read means."""

    def read_error(self, refusal: Refusal) -> FetchError:
        """The error for a read the server refused (``refusal.status``)."""
        ...


class BucketStore(Store, Reader, Protocol):
    """An object store of ``scheme://BUCKET/KEY`` sources, signing every request."""

    scheme: str

    def check_available(self) -> None:
        """Raise ``SourceError`` naming the extra to install when it cannot be used."""

    async def context(self, options: StreamOptions, what: str) -> RequestSigner:
        """Where the store is and who we are there: signs the requests it covers."""
        ...

    async def error_body(self, response: httpx2.Response) -> bytes:
        """The start of an error answer, read for what it says (bounded)."""
        ...


_STORES: dict[str, BucketStore] = {}


def register(store: BucketStore) -> None:
    """Serve ``store.scheme://`` sources with ``store``."""
    _STORES[store.scheme] = store
    register_bucket_scheme(store.scheme, store.check_available)


def unregister(scheme: str) -> None:
    """Stop serving ``scheme://`` sources (a test's store, once the test is done)."""
    _STORES.pop(scheme, None)
    unregister_bucket_scheme(scheme)


def for_scheme(scheme: str) -> BucketStore:
    return _STORES[scheme]


def for_source(src: Source) -> Store:
    """The store that lists ``src`` (not a ``HubSource``: the resolver lists the Hub)."""
    if isinstance(src, BucketSource):
        return _STORES[src.scheme]
    if isinstance(src, UrlSource):
        return http.STORE
    if isinstance(src, LocalSource):
        return local.STORE
    raise TypeError(f"no store lists {src!r}: the resolver lists the Hub's repos")


def for_file(file: FileRef) -> BucketStore | None:
    """The bucket store ``file`` was listed from (its path is ``scheme://BUCKET/KEY``),
    if any: its requests are signed by that store."""
    scheme, sep, _ = file.path.partition("://")
    return _STORES.get(scheme) if sep else None


def reader_of(file: FileRef, access: Access) -> Reader:
    """The store that explains a refused read of ``file``: its bucket store, else the
    Hub for a file of ``access``'s endpoint, else the http store."""
    bucket = for_file(file)
    if bucket is not None:
        return bucket
    try:
        at_hub = origin(file.url) == origin(access.endpoint)
    except httpx2.InvalidURL:
        at_hub = False
    return hub.STORE if at_hub else http.STORE


register(s3.STORE)
