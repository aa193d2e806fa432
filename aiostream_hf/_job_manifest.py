"""One resolution per job: one process resolves a request, every other process of the job
(on every node) reads its manifest and makes no API request.

Two carriers, for two kinds of jobs:

- A folder every node sees (``StreamOptions.manifest_dir``, default
  ``AIOSTREAM_HF_MANIFEST_DIR``). ``Resolver.resolve`` looks there first: the first
  process to take the request's file lock resolves (through the machine's own caches, as
  without a folder) and writes the manifest atomically; every other process, on any node,
  reads it. An entry never expires: it pins the job, restarts included, to one commit.
- torch.distributed (``_job_ranks.resolve_for_ranks``, which ``aiostream_hf.torch``
  datasets call when a process group is initialised): global rank 0 resolves and
  ``broadcast_object_list`` hands the manifest to every rank, which checks it here too
  and seeds its machine's resolution cache with it (``seed_machine_cache``), so that a
  process of that machine resolving the same source by name (a DataLoader worker
  calling ``stream()``) finds it on disk within ``pin_ttl``.

What one of those processes receives is checked as hostile (``check_entry``), the folder's
files above all (another job, another version of this library, a damaged or planted
file): its size before it is read, a format and version stamp, the request it answers
(sources, revision, config, split, data_files, endpoint, token identity), a sha256 of the
manifest, every field's type, every file's URL (the endpoint's ``/resolve/`` URL of the
repo at one commit sha, of the path listed: no other host), a commit the source names,
the config and split asked for. A file that fails is an error naming it and the way out
(remove it, or use a folder of this job's), never a fresh resolution: ranks that already
read it would read another listing than this one.

Only Hub sources are shared (``shareable``); files, URLs and S3 objects are resolved as
before, per machine. A LeRobot dataset's listing of its folder at the commit its
resolution pinned is kept in the job's folder too (``shared_folder``), so a job of any
size reads a Hub LeRobot dataset's files with one pin and two listings.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import anyio.to_thread
import filelock

from ._access import Access
from ._exceptions import ResolutionError
from ._hub_layout import _path_problem, _short
from ._models import Manifest
from ._options import StreamOptions
from ._resolution_cache import (
    _FILE_MODE,
    _acquire,
    _key,
    _prepare_folder,
    _write_entry,
    manifest_key,
    pin_key,
)
from ._sources import HubSource, Source, parse_sources
from .stores.hub import MAX_TREE_FILES, Pin, is_sha

__all__ = [
    "MAX_JOB_MANIFEST_BYTES",
    "check_entry",
    "make_entry",
    "read_entry",
    "request_key",
    "seed_machine_cache",
    "shareable",
    "shared",
    "shared_folder",
]

FORMAT = "aiostream-hf job manifest"
VERSION = 1
#: The largest job manifest file read, in bytes: checked before a byte is read. A
#: manifest of 100,000 Hub files is about 30 MB.
MAX_JOB_MANIFEST_BYTES = 256 * 1024 * 1024
_ETAG = re.compile(r"[0-9a-fA-F]{1,128}")
_SHA_PART = re.compile(r"([0-9a-f]{40})/(.+)")
_WAY_OUT = (
    "remove it to resolve afresh (with every rank of the job stopped: they must all read "
    "one listing), or point StreamOptions.manifest_dir / AIOSTREAM_HF_MANIFEST_DIR at a "
    "folder of this job's"
)


# -- what a request is ----------------------------------------------------------------


def shareable(sources: Sequence[Source]) -> bool:
    """Whether a job shares the resolution of ``sources``: Hub repos only (files, URLs
    and buckets are resolved per machine, as before)."""
    return bool(sources) and all(isinstance(s, HubSource) for s in sources)


def request_key(
    sources: Sequence[Source],
    config: str | None,
    split: str | None,
    data_files: dict[str, list[str]] | None,
    access: Access,
) -> dict[str, Any]:
    """What a job manifest answers: the request, with the token's identity (a manifest
    is only ever read by a caller with the same token)."""
    return {
        "sources": [s.uri for s in sources if isinstance(s, HubSource)],
        "config": config,
        "split": split,
        "data_files": data_files,
        "endpoint": access.endpoint,
        "identity": access.identity,
    }


def _describe(key: Mapping[str, Any]) -> str:
    sources = key.get("sources")
    what = ", ".join(map(str, sources)) if isinstance(sources, list) else _short(sources)
    extra = [
        f"{name}={key.get(name)!r}"
        for name in ("config", "split", "data_files")
        if key.get(name) is not None
    ]
    extra.append(f"endpoint {key.get('endpoint')!r}")
    identity = key.get("identity")
    extra.append(f"token {str(identity)[:8]}..." if identity else "no token")
    return f"{what} ({', '.join(extra)})"


# -- entries: made, read, checked --------------------------------------------------------


def _digest(manifest_json: Any) -> str:
    text = json.dumps(manifest_json, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def make_entry(key: Mapping[str, Any], manifest: Manifest) -> dict[str, Any]:
    """What a job manifest file (or broadcast) holds: stamped, keyed, digested."""
    value = manifest.to_json()
    return {
        "format": FORMAT,
        "version": VERSION,
        "key": dict(key),
        "created": time.time(),
        "sha256": _digest(value),
        "manifest": value,
    }


def read_entry(path: Path, key: Mapping[str, Any]) -> Manifest | None:
    """The manifest kept at ``path`` for ``key`` (checked: ``check_entry``), None when
    there is none; ``ResolutionError`` naming the file when it cannot be trusted."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _bad(str(path), f"cannot be opened ({exc}; a symlink is refused)") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _bad(str(path), "is not a regular file")
    with os.fdopen(fd, "rb") as f:
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise _bad(str(path), f"belongs to uid {st.st_uid}, not to this user")
        if st.st_size > MAX_JOB_MANIFEST_BYTES:
            raise _bad(
                str(path),
                f"holds {st.st_size} bytes, over MAX_JOB_MANIFEST_BYTES ({MAX_JOB_MANIFEST_BYTES})",
            )
        data = f.read(MAX_JOB_MANIFEST_BYTES + 1)
    if len(data) > MAX_JOB_MANIFEST_BYTES:
        raise _bad(str(path), "grew over MAX_JOB_MANIFEST_BYTES while it was read")
    try:
        entry = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise _bad(str(path), f"is not JSON ({exc})") from None
    return check_entry(entry, key, str(path))


def check_entry(entry: Any, key: Mapping[str, Any], what: str, way_out: str = _WAY_OUT) -> Manifest:
    """The manifest of a job manifest entry, once everything in it is checked against
    ``key``: its stamp, its request, its digest, its fields and its files' URLs. A
    failed check is a ``ResolutionError`` naming ``what`` and ``way_out``."""

    def bad(problem: str) -> ResolutionError:
        return ResolutionError(f"job manifest {what} {problem}: {way_out}")

    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        raise bad(f"is not an aiostream-hf job manifest (no {FORMAT!r} stamp)")
    version = entry.get("version")
    if version != VERSION:
        raise bad(
            f"has version {_short(version)}: this aiostream-hf reads version {VERSION} "
            "(every process of a job must run the same aiostream-hf)"
        )
    if entry.get("key") != key:
        other = entry.get("key")
        named = _describe(other) if isinstance(other, dict) else _short(other)
        raise bad(f"is for {named}, not for {_describe(key)}")
    value = entry.get("manifest")
    if not isinstance(value, dict) or entry.get("sha256") != _digest(value):
        raise bad("does not match its sha256: it was changed or damaged")
    problem = _manifest_problem(value, key)
    if problem is not None:
        raise bad(problem)
    try:
        return Manifest.from_json(value)
    except (ValueError, KeyError, TypeError) as exc:  # pragma: no cover: checked above
        raise bad(f"holds no manifest ({exc})") from None


def _bad(what: str, problem: str) -> ResolutionError:
    return ResolutionError(f"job manifest {what} {problem}: {_WAY_OUT}")


def _optional_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _manifest_problem(value: Mapping[str, Any], key: Mapping[str, Any]) -> str | None:
    """Why ``value`` is not a manifest that answers ``key`` (None when it is one)."""
    for name in ("repo_id", "commit", "endpoint", "config", "split", "format"):
        if not _optional_str(value.get(name)):
            return f"has a {name} that is not a string: {_short(value.get(name))}"
    configs, splits, files = value.get("configs", []), value.get("splits", {}), value.get("files")
    if not isinstance(configs, list) or not all(isinstance(c, str) for c in configs):
        return f"has configs that are not a list of names: {_short(configs)}"
    if not isinstance(splits, dict) or not all(_is_count(n) for n in splits.values()):
        return f"has splits that are not counts of files: {_short(splits)}"
    if not isinstance(files, list):
        return f"has files that are not a list: {_short(files)}"
    if len(files) > MAX_TREE_FILES:
        return f"lists {len(files)} files, over MAX_TREE_FILES ({MAX_TREE_FILES})"
    endpoint = key["endpoint"]
    if value.get("endpoint") != endpoint:
        return f"was resolved at {_short(value.get('endpoint'))}, not at {endpoint!r}"
    for name in ("config", "split"):
        if key[name] is not None and value.get(name) != key[name]:
            return f"holds {name} {_short(value.get(name))}, not {key[name]!r} as asked"
    sources = [_source_of(uri) for uri in key["sources"]]
    repo = value.get("repo_id")
    if repo is not None and repo not in {s.repo_id for s in sources}:
        return f"is a listing of {repo!r}, which none of its sources names"
    commits: dict[str, set[str]] = {}
    for i, f in enumerate(files):
        problem = _file_problem(f, endpoint, sources, key["split"], commits)
        if problem is not None:
            return f"files[{i}] {problem}"
    for name, shas in commits.items():
        named = {s.revision for s in sources if s.repo_id == name}
        if len(shas) > len(named) or (all(r and is_sha(r) for r in named) and shas - named):
            return f"reads {name} at commits {sorted(shas)}, not at the ones its sources name"
    commit = value.get("commit")
    if commit is not None and files and commit not in set().union(*commits.values()):
        return f"names commit {commit!r}, which none of its files is read at"
    return None


def _source_of(uri: str) -> HubSource:
    (src,) = parse_sources(uri)  # made by request_key from HubSource.uri: parses back
    assert isinstance(src, HubSource)
    return src


def _file_problem(
    f: Any,
    endpoint: str,
    sources: Sequence[HubSource],
    split: str | None,
    commits: dict[str, set[str]],
) -> str | None:
    """Why ``f`` is not one Hub file of ``sources``; its repo's commit noted in ``commits``."""
    if not isinstance(f, dict):
        return f"is not an object: {_short(f)}"
    url, path = f.get("url"), f.get("path")
    problem = _path_problem(path)
    if problem is not None:
        return f"has a path that {problem}: {_short(path)}"
    if not _is_count(f.get("size")):
        return f"has a size that is not a whole number >= 0: {_short(f.get('size'))}"
    etag = f.get("etag")
    if etag is not None and not (isinstance(etag, str) and _ETAG.fullmatch(etag)):
        return f"has an etag that is not a hex object id: {_short(etag)}"
    if not _optional_str(f.get("split")) or (split is not None and f.get("split") != split):
        return f"is in split {_short(f.get('split'))}, not in {split!r} as asked"
    if not isinstance(url, str):
        return f"has a URL that is not a string: {_short(url)}"
    for src in sources:
        prefix = f"{endpoint}/datasets/{src.repo_id}/resolve/"
        if not url.startswith(prefix):
            continue
        m = _SHA_PART.fullmatch(url[len(prefix) :])
        if m is not None and m.group(2) == quote(str(path)):
            commits.setdefault(src.repo_id, set()).add(m.group(1))
            return None
    return (
        f"has URL {_short(url)}, not the /resolve/ URL of its path at a commit of "
        f"{', '.join(sorted({s.repo_id for s in sources}))} on {endpoint}"
    )


# -- the job's folder -------------------------------------------------------------------


async def shared(
    folder: Path, key: Mapping[str, Any], resolve: Callable[[], Awaitable[Manifest]]
) -> Manifest:
    """The manifest for ``key`` kept in the job's ``folder``; when there is none, resolved
    by this process (the first to take the request's file lock) and kept there."""
    try:
        await anyio.to_thread.run_sync(_prepare_folder, folder)
    except OSError as exc:
        raise ResolutionError(
            f"job manifest folder {folder} is not usable ({exc}): point "
            "StreamOptions.manifest_dir / AIOSTREAM_HF_MANIFEST_DIR at a folder of yours "
            "that every node of the job sees"
        ) from exc
    name = _key(("job", dict(key)))
    path = folder / f"{name}.json"
    found = await anyio.to_thread.run_sync(read_entry, path, key)
    if found is not None:
        return found
    lock = filelock.FileLock(str(folder / f"{name}.lock"), mode=_FILE_MODE, thread_local=False)
    try:
        await _acquire(lock)
    except OSError as exc:
        raise ResolutionError(
            f"cannot lock {lock.lock_file} ({exc}): the job manifest folder {folder} needs "
            "file locks that work across the job's machines (NFSv4; Lustre mounted with "
            "flock), or use torch.distributed (rank 0 broadcasts)"
        ) from exc
    try:
        found = await anyio.to_thread.run_sync(read_entry, path, key)
        if found is not None:
            return found
        manifest = await resolve()
        entry = await anyio.to_thread.run_sync(_checked_entry, key, manifest, str(path))
        with anyio.CancelScope(shield=True):  # written whole, or not at all
            await anyio.to_thread.run_sync(_write, path, entry)
        return manifest
    finally:
        lock.release()


def shared_folder(
    folder: Path, src: HubSource, access: Access, listing: Callable[[], Awaitable[Manifest]]
) -> Callable[[], Awaitable[Manifest]]:
    """``listing`` (every file of the Hub folder ``src``, at a commit: a LeRobot dataset's
    files) kept in the job's ``folder`` like a resolution, under a key of its own."""
    key = {**request_key([src], None, None, None, access), "listing": "folder"}
    return functools.partial(shared, folder, key, listing)


def _checked_entry(key: Mapping[str, Any], manifest: Manifest, what: str) -> dict[str, Any]:
    """The entry for ``manifest``, checked as the job's other processes will check it."""
    entry = make_entry(key, manifest)
    check_entry(entry, key, what)
    return entry


def _write(path: Path, entry: Mapping[str, Any]) -> None:
    """Write ``entry`` to ``path`` atomically (a whole file appears, or none), synced to
    disk first, so that another machine never reads half of it."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        with open(os.open(tmp, flags, _FILE_MODE), "w", encoding="utf-8") as f:
            json.dump(entry, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ResolutionError(
            f"cannot write the job manifest {path} ({exc}): the job's other processes "
            "would resolve on their own; free the folder, or point "
            "StreamOptions.manifest_dir / AIOSTREAM_HF_MANIFEST_DIR at a writable one"
        ) from exc


# -- torch.distributed -------------------------------------------------------------------


def seed_machine_cache(
    options: StreamOptions,
    sources: Sequence[Source],
    key: Mapping[str, Any],
    manifest: Manifest,
) -> bool:
    """Keep a manifest that rank 0 resolved in this machine's resolution cache, as this
    machine's own resolution would have (the branch's pin for ``pin_ttl``, the manifest
    at its commit for ever), so that its processes resolving the same source find it
    there. One Hub source only (a combined manifest has no single key). Whether kept."""
    if len(sources) != 1 or not isinstance(sources[0], HubSource) or manifest.commit is None:
        return False
    src, who, endpoint = sources[0], key["identity"], key["endpoint"]
    folder = options.resolved_cache_dir() / "resolutions"
    try:
        _prepare_folder(folder)
    except OSError:
        return False
    revision = src.revision or "main"
    entries: list[tuple[tuple[Any, ...], Any]] = []
    if not is_sha(revision):
        # What the manifest tells of the pin: its commit. The card is not known (a
        # resolution of another config reads README.md), nor whether the repo is gated.
        pin = Pin(manifest.commit)
        entries.append((pin_key(who, endpoint, src.repo_id, revision), pin.to_json()))
    parts = manifest_key(
        who,
        endpoint,
        src.repo_id,
        manifest.commit,
        src.path,
        key["config"],
        key["split"],
        key["data_files"],
    )
    entries.append((parts, manifest.to_json()))
    for parts, value in entries:
        stored = json.loads(json.dumps(parts))
        entry = {"key": stored, "created": time.time(), "value": value}
        _write_entry(folder / f"{_key(parts)}.json", entry)
    return True
