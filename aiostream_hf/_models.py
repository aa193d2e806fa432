"""The values every part passes around: FileRef (one file to read) and Manifest (the
files of one selection of a source). Plain frozen dataclasses at the bottom of the
import graph: the fetcher, the formats and the engine import them without the resolver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FileRef", "Manifest", "combine_manifests"]

_MANIFEST_VERSION = 1


@dataclass(frozen=True, slots=True)
class FileRef:
    """One file to read.

    url: where its bytes are read: a Hub ``/resolve/`` URL pinned to a commit
        sha (``{endpoint}/datasets/{repo}/resolve/{sha}/{quoted path}``), an
        http(s) URL, or a ``file://`` URL for a local file.
    path: its path in the repo (a URL or local path for other sources).
    size: bytes, when known (always for Hub and local files).
    etag: the Hub's etag (sha256 for LFS files, git oid otherwise), when known.
    split: the split the file belongs to.
    """

    url: str
    path: str
    size: int | None = None
    etag: str | None = None
    split: str | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    """The files of one selection (config, split) of a source, in read order.

    ``splits`` maps every split of the selected config to its file count, so
    errors and ``ls`` can list them; ``configs`` lists the source's configs.
    ``split`` is None when no split was asked for and the config has several:
    ``files`` then holds every split, in split order, each tagged with its split.
    ``format`` is the decoder the files need ("parquet", "webdataset"), when known.

    A manifest is picklable and JSON-serialisable (``to_json``/``from_json``), so a
    torch Dataset resolves once and hands it to its workers.
    """

    files: tuple[FileRef, ...]
    repo_id: str | None = None
    commit: str | None = None
    endpoint: str | None = None
    config: str | None = None
    split: str | None = None
    configs: tuple[str, ...] = ()
    splits: Mapping[str, int] = field(default_factory=dict)
    format: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict that ``Manifest.from_json`` turns back into this manifest."""
        files = []
        for f in self.files:
            entry: dict[str, Any] = {"url": f.url, "path": f.path}
            if f.size is not None:
                entry["size"] = f.size
            if f.etag is not None:
                entry["etag"] = f.etag
            if f.split is not None:
                entry["split"] = f.split
            files.append(entry)
        return {
            "version": _MANIFEST_VERSION,
            "repo_id": self.repo_id,
            "commit": self.commit,
            "endpoint": self.endpoint,
            "config": self.config,
            "split": self.split,
            "configs": list(self.configs),
            "splits": dict(self.splits),
            "format": self.format,
            "files": files,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        """The manifest that ``to_json`` described."""
        if data.get("version") != _MANIFEST_VERSION:
            raise ValueError(
                f"manifest JSON version {data.get('version')!r} is not {_MANIFEST_VERSION}"
            )
        return cls(
            files=tuple(
                FileRef(
                    url=f["url"],
                    path=f["path"],
                    size=f.get("size"),
                    etag=f.get("etag"),
                    split=f.get("split"),
                )
                for f in data["files"]
            ),
            repo_id=data.get("repo_id"),
            commit=data.get("commit"),
            endpoint=data.get("endpoint"),
            config=data.get("config"),
            split=data.get("split"),
            configs=tuple(data.get("configs", ())),
            splits={str(k): int(v) for k, v in data.get("splits", {}).items()},
            format=data.get("format"),
        )


def combine_manifests(manifests: Sequence[Manifest]) -> Manifest:
    """One manifest for several sources: files in order, shared fields where they agree."""

    def common(values: Sequence[Any]) -> Any:
        return values[0] if all(v == values[0] for v in values) else None

    splits: dict[str, int] = {}
    for m in manifests:
        for name, count in m.splits.items():
            splits[name] = splits.get(name, 0) + count
    return Manifest(
        files=tuple(f for m in manifests for f in m.files),
        repo_id=common([m.repo_id for m in manifests]),
        commit=common([m.commit for m in manifests]),
        endpoint=common([m.endpoint for m in manifests]),
        config=common([m.config for m in manifests]),
        split=common([m.split for m in manifests]),
        configs=common([m.configs for m in manifests]) or (),
        splits=splits,
        format=common([m.format for m in manifests]),
    )
