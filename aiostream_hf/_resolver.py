"""Resolver: sources -> Manifest (files with size, etag, pinned commit, split).

(Being written: see the module's owner. FileRef and Manifest are the contract
the fetcher, the decoders and the stream use; change them only with care.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["FileRef", "Manifest"]


@dataclass(frozen=True, slots=True)
class FileRef:
    """One file to read.

    url: where its bytes are read: a Hub ``/resolve/`` URL pinned to a commit
        sha (``{endpoint}/datasets/{repo}/resolve/{sha}/{quoted path}``), an
        http(s) URL, or a ``file://`` URL for a local file.
    path: its path in the repo (a URL or local path for other sources).
    size: bytes, when known (always for Hub and local files).
    etag: the Hub's etag (sha256 for LFS files, git oid otherwise), when known.
    """

    url: str
    path: str
    size: int | None = None
    etag: str | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    """The files of one selection (config, split) of a source, in read order.

    ``splits`` maps every split of the selected config to its file count, so
    errors and ``ls`` can list them; ``configs`` lists the source's configs.
    """

    files: tuple[FileRef, ...]
    repo_id: str | None = None
    commit: str | None = None
    endpoint: str | None = None
    config: str | None = None
    split: str | None = None
    configs: tuple[str, ...] = ()
    splits: Mapping[str, int] = field(default_factory=dict)
