"""The bytes the local Hub server serves for a file, and the HTTP rules that pick them.

A file is served as on disk or as a hostile variant of it (``_Content``); a request
reads a slice of it by ``Range`` (``_parse_range``), under ``If-Match`` and ``If-Range``
by the strong comparison (``_if_match``, ``_strong_match``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from ._faults import INVERT, REPLACEMENT_FILL
from ._repos import RepoFile

__all__ = ["DeliberateCut"]

#: Bytes read from disk and sent per step: a paced body (a bandwidth cap) in small
#: steps, so that no burst outruns its cap; any other in large ones, so that the
#: server, on the client's cores in a benchmark, spends little CPU per byte (a 1 MiB
#: step costs it ~40% less than 64 KiB does on the same reads).
_CHUNK = 64 * 1024
_CHUNK_UNPACED = 1024 * 1024


class DeliberateCut(Exception):
    """Raised inside the app to close a connection mid-body (an injected fault)."""


@dataclass(frozen=True)
class _Content:
    """The bytes served for a file: as on disk, or a hostile variant of them.

    Read from disk at every request (nothing is cached but the hashes of the
    variants), so a file changed on disk is served changed at once.
    """

    file: RepoFile
    size: int
    kind: Literal["disk", "replaced", "padded"] = "disk"

    def chunks(self, start: int, length: int, step: int = _CHUNK) -> Iterator[bytes]:
        end = min(start + length, self.size)
        pos = start
        disk_end = min(end, self.file.size)
        if pos < disk_end:
            with self.file.disk_path.open("rb") as fh:
                fh.seek(pos)
                while pos < disk_end:
                    chunk = fh.read(min(step, disk_end - pos))
                    if not chunk:
                        raise DeliberateCut("file shrank on disk while it was served")
                    pos += len(chunk)
                    yield chunk.translate(INVERT) if self.kind == "replaced" else chunk
        fill = REPLACEMENT_FILL if self.kind == "replaced" else b"\n"
        while pos < end:
            n = min(step, end - pos)
            yield fill * n
            pos += n


def _parse_range(header: str, size: int) -> tuple[int, int] | None | str:
    """(start, end exclusive), None to ignore the header, or "unsatisfiable"."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None  # multi-range or unknown unit: answer the whole file (RFC 9110 allows it)
    first, _, last = spec.strip().partition("-")
    try:
        if first == "":
            n = int(last)
            if n <= 0:
                return "unsatisfiable"
            return (max(0, size - n), size) if size > 0 else "unsatisfiable"
        start = int(first)
        end = int(last) + 1 if last else size
    except ValueError:
        return None
    if start >= size or end <= start:
        return "unsatisfiable"
    return start, min(end, size)


def _if_match(header: str, strong: str | None) -> bool:
    """If-Match by the strong comparison (RFC 9110): a weak tag on either side never matches."""
    candidates = [c.strip() for c in header.split(",")]
    if "*" in candidates:
        return True
    return strong is not None and any(
        not c.startswith("W/") and c.strip('"') == strong for c in candidates
    )


def _strong_match(if_range: str, strong: str | None) -> bool:
    """If-Range holds a strong ETag equal to the current one (a date never matches)."""
    value = if_range.strip()
    return strong is not None and not value.startswith("W/") and value.strip('"') == strong


def _mtime(content: _Content) -> float:
    try:
        mtime = content.file.disk_path.stat().st_mtime
    except OSError:
        mtime = time.time()
    return mtime + 1 if content.kind == "replaced" else mtime  # the other bytes are newer
