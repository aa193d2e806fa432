"""An error answer to a read, as the fetcher hands it to the file's store to explain."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx2

from .._access import Access
from .._exceptions import FetchError, display_url
from .._models import FileRef

__all__ = ["Refusal"]


@dataclass(frozen=True)
class Refusal:
    """A read of ``file`` that ``url`` (its own URL, or a CDN's it was sent to) refused
    with ``status``: what its store needs to say why, and what to do."""

    file: FileRef
    status: int
    url: str
    headers: httpx2.Headers
    body: bytes  # the start of the answer (bucket stores read their error code there)
    attempts: int
    access: Access
    context: Any = None  # the store's signing context, for a bucket store's object

    @property
    def note(self) -> str:
        """The server's own words (``X-Error-Code``/``X-Error-Message``), if any."""
        code = self.headers.get("X-Error-Code")
        detail = self.headers.get("X-Error-Message")
        return f" ({': '.join(x for x in (code, detail) if x)})" if code or detail else ""

    @property
    def where(self) -> str:
        """The file's URL, and the server that answered when it is another."""
        if self.url == self.file.url:
            return self.file.url
        return f"{self.file.url} (served by {display_url(self.url)})"

    def error(self, problem: str) -> FetchError:
        """The ``FetchError`` for this refusal: the file's path, then ``problem``."""
        return FetchError(
            f"{self.file.path}: {problem}",
            url=self.file.url,
            status=self.status,
            attempts=self.attempts,
        )
