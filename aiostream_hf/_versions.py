"""File versions: the validators a server gives a file, pinned at first contact.

A reader learns a file's structure from one response (a Parquet footer, an MP4 index)
and reads its bytes with later ones. If the file is replaced in between, decoding new
bytes with the old structure gives wrong samples and no error. So the first response
for a file pins its ``Version`` (ETag, else Last-Modified, and size), and every later
response for it must show the same version (``Version.differs``), whatever request it
answers: a range, a resume, a re-resolved CDN URL.

- A strong ETag is the best validator; a weak one (``W/"..."``) compares by its opaque
  tag (RFC 9110 weak comparison): a server that changes the bytes changes the tag.
- Without an ETag, Last-Modified (with the size) is compared.
- A server that gives neither cannot be checked: ``Version.validated`` is False, and
  the fetcher counts and logs it (``FetcherStatistics.unvalidated_files``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Version", "normalize_etag"]


def normalize_etag(etag: str) -> str:
    """The opaque tag of an ETag: ``W/"abc"`` and ``"abc"`` are both ``abc``."""
    e = etag.strip()
    if e.startswith("W/"):
        e = e[2:]
    return e.strip('"')


@dataclass(frozen=True)
class Version:
    """What a response says of the version of the file it serves."""

    etag: str | None  # the opaque tag (quotes and W/ stripped)
    weak: bool
    last_modified: str | None
    size: int | None  # the whole file's size, when the answer gives it

    @classmethod
    def of(cls, headers: Mapping[str, str], size: int | None) -> Version:
        raw = headers.get("ETag")
        etag = normalize_etag(raw) if raw and normalize_etag(raw) else None
        weak = bool(raw and raw.strip().startswith("W/"))
        last_modified = (headers.get("Last-Modified") or "").strip() or None
        return cls(etag=etag, weak=weak, last_modified=last_modified, size=size)

    @property
    def validated(self) -> bool:
        """Whether a change of the file can be seen in later answers."""
        return self.etag is not None or self.last_modified is not None

    def if_match(self) -> str | None:
        """The ``If-Match`` value (a strong ETag only: If-Match compares strongly)."""
        return f'"{self.etag}"' if self.etag is not None and not self.weak else None

    def if_range(self) -> str | None:
        """The ``If-Range`` value for a resume: a strong ETag, else Last-Modified."""
        return self.if_match() or self.last_modified

    def describe(self) -> str:
        if self.etag is not None:
            return f'ETag {"W/" if self.weak else ""}"{self.etag}"'
        if self.last_modified is not None:
            return f"Last-Modified {self.last_modified}"
        return "no validator"

    def differs(self, seen: Version) -> str | None:
        """Why ``seen`` (a later answer for the file) is not this version, or None."""
        if self.size is not None and seen.size is not None and seen.size != self.size:
            return f"its size went from {self.size} to {seen.size} bytes"
        if self.etag is not None:
            if seen.etag is None:
                return f"it is now served without an ETag (first answer: {self.describe()})"
            if seen.etag != self.etag:
                return f"its {self.describe()} is now {seen.describe()}"
            return None
        if self.last_modified is not None:
            if seen.last_modified is None:
                return f"it is now served without Last-Modified (first: {self.last_modified})"
            if seen.last_modified != self.last_modified:
                return f"its Last-Modified went from {self.last_modified} to {seen.last_modified}"
        return None
