"""Stores: where files live, one module each; nothing outside a store knows its wire
format.

A *bucket store* serves ``SCHEME://BUCKET/KEY`` sources (``_sources.BucketSource``): it
lists a bucket (``resolve``), signs every request to it as the request leaves (the
``RequestSigner`` its ``context`` gives), and says what an error answer means. The
resolver and the fetcher ask it through ``BucketStore`` and nothing else::

    store = stores.for_scheme(source.scheme)    # the resolver: list the bucket
    files = await store.resolve(sources, lister)
    store = stores.for_file(file)                # the fetcher: sign, read, explain
    signer = await store.context(options, file.path)

Adding a store (e.g. ``gs://``) is one module here: a class with ``scheme``,
``check_available``, ``context``, ``resolve``, ``error_body`` and ``read_error``, and
its ``STORE`` added to ``_STORES`` below (docs/design.md, "Adding a store";
tests/test_stores.py adds one of a single module). The Hub's files and plain http(s) and
local ones are read by the resolver and fetcher themselves (their rules: the Hub's
listing and ``/resolve/`` routes, a URL's own answer, a file's ``stat``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import httpx2

from .._client import RequestSigner
from .._exceptions import FetchError
from .._models import FileRef
from .._options import StreamOptions
from .._sources import BucketSource, register_bucket_scheme, unregister_bucket_scheme
from . import s3

__all__ = ["BucketStore", "Lister", "for_file", "for_scheme", "register", "unregister"]

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


class BucketStore(Protocol):
    """An object store of ``scheme://BUCKET/KEY`` sources."""

    scheme: str

    def check_available(self) -> None:
        """Raise ``SourceError`` naming the extra to install when it cannot be used."""

    async def context(self, options: StreamOptions, what: str) -> RequestSigner:
        """Where the store is and who we are there: signs the requests it covers."""
        ...

    async def resolve(self, sources: Sequence[BucketSource], lister: Lister) -> tuple[FileRef, ...]:
        """The files ``sources`` (of one bucket) name, each with its size and ETag."""
        ...

    async def error_body(self, response: httpx2.Response) -> bytes:
        """The start of an error answer, read for what it says (bounded)."""
        ...

    def read_error(
        self, ctx: Any, file: FileRef, status: int, body: bytes, attempts: int
    ) -> FetchError:
        """The error for a read of ``file`` that the store refused."""
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


def for_file(file: FileRef) -> BucketStore | None:
    """The store ``file`` was listed from (its path is ``scheme://BUCKET/KEY``), if any."""
    scheme, sep, _ = file.path.partition("://")
    return _STORES.get(scheme) if sep else None


register(s3.STORE)
