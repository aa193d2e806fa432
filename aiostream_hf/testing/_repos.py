"""The repos the local Hub server serves: a folder of files per repo and ref.

Layout under the server's root::

    ROOT/datasets/ORG/NAME/...                      the files of branch ``main``
    ROOT/datasets/ORG/NAME@BRANCH/...               another branch
    ROOT/datasets/ORG/NAME@refs%2Fconvert%2FX/...   ``refs/convert/X`` (e.g. parquet)
    ROOT/datasets/ORG/NAME@refs%2Ftags%2FT/...      tag ``T``

A ref's commit sha is a digest of its file list and contents, so it changes
when a file changes. File hashes are cached by (size, mtime, inode), so a
rescan costs one ``stat`` per file (a file written in the last 50 ms is hashed
again: see ``_HashCache``). File contents are never cached: every answer reads
the disk, so a file changed between requests is served changed.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from .._exceptions import HubServerError

__all__ = ["LFS_EXTENSIONS", "RefSnapshot", "RepoFile", "RepoStore", "parse_ref_folder"]

# Files stored in LFS on the Hub (and so redirected to the CDN) by extension,
# as in the Hub's default .gitattributes; any file over the size threshold too.
LFS_EXTENSIONS = frozenset(
    {
        ".7z", ".arrow", ".avro", ".bin", ".bz2", ".ckpt", ".flac", ".gz", ".h5", ".jpeg",
        ".jpg", ".joblib", ".lz4", ".mkv", ".mov", ".mp3", ".mp4", ".msgpack", ".npy", ".npz",
        ".onnx", ".ogg", ".parquet", ".pb", ".pickle", ".pkl", ".png", ".pt", ".pth",
        ".safetensors", ".tar", ".tfrecord", ".tgz", ".wav", ".webm", ".xz", ".zip", ".zst",
    }
)  # fmt: skip

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA = re.compile(r"^[0-9a-f]{40}$")
_MAX_COMMITS = 4096  # past commits kept readable (while their files are unchanged)
_RACY_NS = 50_000_000  # over the timestamp tick of common filesystems (1-10 ms)


@dataclass(frozen=True, slots=True)
class RepoFile:
    """One file of a ref, as the Hub describes it."""

    path: str
    size: int
    oid: str  # git blob oid: sha1("blob {size}\0" + bytes)
    sha256: str
    lfs: bool
    disk_path: Path

    @property
    def etag(self) -> str:
        """The ETag the Hub sends: the sha256 for LFS files, the git oid otherwise."""
        return self.sha256 if self.lfs else self.oid


@dataclass(frozen=True, slots=True)
class RefSnapshot:
    """The files of one ref of one repo at one moment, and its commit sha."""

    repo_id: str
    ref: str  # "main", "refs/convert/parquet", "refs/tags/v1", ...
    commit: str
    files: dict[str, RepoFile]
    directories: frozenset[str]
    mtime: float

    def entries(self, under: str = "", *, recursive: bool) -> list[RepoFile | str]:
        """Files (RepoFile) and directories (str) under ``under``, sorted by path."""
        prefix = f"{under}/" if under else ""
        found: list[tuple[str, RepoFile | str]] = []
        for d in self.directories:
            if d.startswith(prefix) and (recursive or "/" not in d[len(prefix) :]):
                found.append((d, d))
        for p, f in self.files.items():
            if p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :]):
                found.append((p, f))
        found.sort(key=lambda item: item[0])
        return [entry for _, entry in found]

    def tree_oid(self, directory: str) -> str:
        """A stable oid for a directory, from the oids of the files under it."""
        h = hashlib.sha1()
        prefix = f"{directory}/"
        for p in sorted(self.files):
            if p.startswith(prefix):
                h.update(f"{p}\0{self.files[p].oid}\n".encode())
        return h.hexdigest()


def parse_ref_folder(folder_name: str) -> tuple[str, str]:
    """Split a repo folder name ``NAME[@QUOTED-REF]`` into (name, ref)."""
    name, sep, ref = folder_name.partition("@")
    if not sep:
        return name, "main"
    ref = unquote(ref)
    if not ref or ref == "main" or ref.startswith("/") or ref.endswith("/"):
        raise HubServerError(
            f"repo folder {folder_name!r}: the part after '@' must be a branch name, "
            "'refs/convert/NAME' or 'refs/tags/NAME', URL-quoted "
            "(e.g. NAME@refs%2Fconvert%2Fparquet)"
        )
    return name, ref


def _git_oid_and_sha256(path: Path, size: int) -> tuple[str, str]:
    git = hashlib.sha1(f"blob {size}\0".encode())
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            git.update(chunk)
            sha.update(chunk)
    return git.hexdigest(), sha.hexdigest()


@dataclass
class _HashCache:
    """File hashes by (path, size, mtime, inode), as git's index keeps them.

    As in git, a hash taken within ``_RACY_NS`` of the file's mtime is not
    trusted ("racily clean"): a same-size rewrite in the same clock tick of a
    coarse-timestamp filesystem would keep the key, so such a file is hashed
    again at its next lookup, until a hash is taken safely after its mtime.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    by_key: dict[tuple[str, int, int, int], tuple[str, str, int]] = field(default_factory=dict)

    def hashes(self, path: Path, st: os.stat_result) -> tuple[str, str]:
        key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
        with self.lock:
            found = self.by_key.get(key)
        if found is not None and abs(found[2] - st.st_mtime_ns) > _RACY_NS:
            return found[0], found[1]
        hashed_at = time.time_ns()  # before the read: a later rewrite gets a later mtime
        oid, sha256 = _git_oid_and_sha256(path, st.st_size)
        with self.lock:
            self.by_key[key] = (oid, sha256, hashed_at)
        return oid, sha256


class RepoStore:
    """Reads dataset repos and their refs from ``ROOT/datasets/ORG/NAME[@REF]``."""

    def __init__(self, root: str | os.PathLike[str], *, lfs_threshold: int = 10 * 1024 * 1024):
        self.root = Path(root)
        if not self.root.is_dir():
            raise HubServerError(
                f"Hub root {str(self.root)!r} is not a folder: create it, with repos at "
                "ROOT/datasets/ORG/NAME/"
            )
        self.lfs_threshold = lfs_threshold
        self._hashes = _HashCache()
        self._lock = threading.Lock()
        self._by_ref: dict[tuple[str, str], RefSnapshot] = {}
        self._by_commit: dict[tuple[str, str], RefSnapshot] = {}

    def validate(self) -> None:
        """Fail with a clear error if a folder under ROOT/datasets is not a repo."""
        for repo_id, refs in self.repos().items():
            for ref, folder in refs.items():
                if not folder.is_dir():
                    raise HubServerError(f"repo {repo_id!r} ref {ref!r}: {folder} is not a folder")

    def repos(self) -> dict[str, dict[str, Path]]:
        """repo_id -> {ref: folder}, for every repo under ROOT/datasets."""
        base = self.root / "datasets"
        found: dict[str, dict[str, Path]] = {}
        if not base.is_dir():
            return found
        for org in sorted(base.iterdir()):
            if not org.is_dir():
                continue
            if not _NAME.match(org.name):
                raise HubServerError(f"{org}: an org folder name must match {_NAME.pattern}")
            for entry in sorted(org.iterdir()):
                if not entry.is_dir():
                    raise HubServerError(
                        f"{entry}: expected repo folders under {org}, found a file; "
                        "repos live at ROOT/datasets/ORG/NAME/"
                    )
                name, ref = parse_ref_folder(entry.name)
                if not _NAME.match(name):
                    raise HubServerError(f"{entry}: a repo name must match {_NAME.pattern}")
                found.setdefault(f"{org.name}/{name}", {})[ref] = entry
        return found

    def refs(self, repo_id: str) -> dict[str, Path] | None:
        """{ref: folder} of a repo, or None if it does not exist (or has no main)."""
        org, _, name = repo_id.partition("/")
        if not (_NAME.match(org) and _NAME.match(name)):
            return None
        base = self.root / "datasets" / org
        main = base / name
        if not main.is_dir():
            return None
        refs = {"main": main}
        for entry in base.glob(f"{name}@*"):
            if entry.is_dir():
                refs[parse_ref_folder(entry.name)[1]] = entry
        return refs

    def snapshot(self, repo_id: str, ref: str, *, path: str | None = None) -> RefSnapshot | None:
        """The current files of a ref.

        Without ``path`` the ref is rescanned (one stat per file). With ``path``
        the last snapshot is reused when that one file is unchanged on disk, so
        a file read costs one stat.
        """
        refs = self.refs(repo_id)
        if refs is None or ref not in refs:
            return None
        if path is not None:
            with self._lock:
                cached = self._by_ref.get((repo_id, ref))
            if cached is not None and self.is_current(cached, path):
                return cached
        return self._scan(repo_id, ref, refs[ref])

    def _scan(self, repo_id: str, ref: str, folder: Path) -> RefSnapshot:
        files: dict[str, RepoFile] = {}
        directories: set[str] = set()
        latest = 0.0
        for disk_path, rel in _walk(folder):
            st = disk_path.stat()
            oid, sha256 = self._hashes.hashes(disk_path, st)
            lfs = st.st_size >= self.lfs_threshold or disk_path.suffix.lower() in LFS_EXTENSIONS
            files[rel] = RepoFile(rel, st.st_size, oid, sha256, lfs, disk_path)
            latest = max(latest, st.st_mtime)
            parts = rel.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                directories.add("/".join(parts[:i]))
        digest = hashlib.sha1(f"{repo_id}\0{ref}\n".encode())
        for rel in sorted(files):
            digest.update(f"{rel}\0{files[rel].oid}\n".encode())
        snap = RefSnapshot(repo_id, ref, digest.hexdigest(), files, frozenset(directories), latest)
        with self._lock:
            self._by_ref[(repo_id, ref)] = snap
            self._by_commit[(repo_id, snap.commit)] = snap
            while len(self._by_commit) > _MAX_COMMITS:  # bounded: forget the oldest commits
                del self._by_commit[next(iter(self._by_commit))]
        return snap

    def resolve(
        self, repo_id: str, revision: str, *, path: str | None = None
    ) -> RefSnapshot | None:
        """The snapshot for a branch, full ref, tag name, or 40-hex commit sha.

        A commit stays readable while the files it names are unchanged on disk;
        once they change it is gone (the server cannot serve old bytes).
        """
        refs = self.refs(repo_id)
        if refs is None:
            return None
        for candidate in (revision, f"refs/tags/{revision}"):
            if candidate in refs:
                return self.snapshot(repo_id, candidate, path=path)
        if not _SHA.match(revision):
            return None
        with self._lock:
            seen = self._by_commit.get((repo_id, revision))
        if seen is not None and path is not None and self.is_current(seen, path):
            return seen
        for ref in refs:
            snap = self.snapshot(repo_id, ref)
            if snap is not None and snap.commit == revision:
                return snap
        return None

    def is_current(self, snap: RefSnapshot, path: str) -> bool:
        """Whether a file of a snapshot is still the same on disk (one stat)."""
        f = snap.files.get(path)
        if f is None:
            return False
        try:
            st = f.disk_path.stat()
        except FileNotFoundError:
            return False
        return self._hashes.hashes(f.disk_path, st)[0] == f.oid


def _walk(folder: Path) -> Iterator[tuple[Path, str]]:
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        rel_dir = os.path.relpath(dirpath, folder)
        for fn in sorted(filenames):
            rel = fn if rel_dir == "." else f"{rel_dir}/{fn}".replace(os.sep, "/")
            yield Path(dirpath) / fn, rel
