"""The http store: files named by their plain http(s) URL (``UrlSource``).

- Listing (``HttpStore.resolve``): none; a URL is one file (braces were expanded when the
  source was parsed), its size and version learned from its first answer.
- Reads: the fetcher's (``_transfer``), no signature; the token goes only to the Hub's
  endpoint (``_access.auth_headers``), never to another host.
- Validators: the answer's ``ETag``/``Last-Modified`` (``_versions.Version``).
- Errors (``read_error``): the status, and for a 401/403 where a token exists, that it
  is not sent to this host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._exceptions import FetchError
from .._models import FileRef
from .._sources import UrlSource
from ._refusal import Refusal

__all__ = ["STORE", "HttpStore"]


class HttpStore:
    """Files named by their http(s) URL."""

    name = "http"

    async def resolve(self, sources: Sequence[Any], lister: Any) -> tuple[FileRef, ...]:
        return tuple(
            FileRef(url=src.url, path=src.url, split="train")
            for src in sources
            if isinstance(src, UrlSource)
        )

    def read_error(self, refusal: Refusal) -> FetchError:
        r = refusal
        if r.status == 404:
            problem = f"not found: HTTP 404 from {r.where}{r.note}"
        elif r.status in (401, 403) and r.url == r.file.url and r.access.token:
            problem = (
                f"HTTP {r.status} from {r.where}{r.note}: the token is sent only to the Hub "
                f"endpoint {r.access.endpoint}; pass endpoint= if this file's Hub is another one"
            )
        else:
            problem = f"HTTP {r.status} from {r.where}{r.note}"
        return r.error(problem)


STORE = HttpStore()
