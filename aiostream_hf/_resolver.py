"""Resolver: sources -> Manifest (files with size, etag, pinned commit, split).

A Hub source becomes a manifest with as few requests as the Hub allows:

1. pin: ``GET {endpoint}/api/datasets/{repo}/revision/{rev}`` (asking only for ``sha``,
   ``cardData`` and ``gated``) turns a branch or tag into a commit sha and brings the
   README's YAML along, so ``configs:`` costs no extra request. A 40-hex revision is
   already a commit: no request.
2. list: one recursive tree listing of that commit (of the folder a path or glob names),
   following the absolute ``Link: <...>; rel="next"`` pages. ``README.md`` is fetched only
   for a sha-pinned whole-repo source (step 1 was skipped), ``.huggingface.yaml`` only
   when the repo has one, and one ``HEAD`` checks access to a gated repo.
3. select: configs and splits are inferred with the rules of ``datasets`` (reproduced here
   from ``datasets/data_files.py``, ``load.py`` and ``utils/metadata.py``; ``datasets`` is a
   test oracle, never imported): README YAML ``configs:``, then
   ``data/{split}-NNNNN-of-NNNNN.*`` shard names, then ``*.eval`` logs and harbor tasks,
   then split-named folders, then split-named files, else everything is ``train``. Globs
   match like fsspec's ``glob`` (``**`` crosses folders); hidden files, ``__special__``
   folders and ``README.md``-like files are left out unless a pattern names them. Only
   files of a format this project streams count (``DATA_FILE_EXTENSIONS``); when a split
   holds several, the most common wins, as ``datasets.load.infer_module_for_data_files``
   picks it.

Resolutions are coalesced. In a process, concurrent ``resolve()`` calls with the same key
share one pending result (the first caller does the work; if it is cancelled a waiter
takes over). On a machine, a file lock per key and a JSON file under
``{cache_dir}/resolutions/`` make one process do the work while the others read its
answer. Manifests are keyed by endpoint, repo, commit, path, config, split and
``data_files`` and never expire (a commit is immutable); a branch-to-commit pin is shared
for ``StreamOptions.pin_ttl`` seconds, so ranks that start together make one call. A
shared pin (one this call did not request) may name a commit the Hub has forgotten since
(a local server restarted over a changed folder, a rewritten branch): when its listing
answers RevisionNotFound, or a stream's first read of a file at it answers 404
(``forget_stale_pin``, which ``Engine`` and ``ls`` call), the pin is dropped, in memory
and on disk, and the branch pinned afresh, once. A commit the user named, a pin this
call requested, and a file whose read already began (``FileChangedError``) keep their
errors. Across machines, ``StreamOptions.manifest_dir`` (a folder the job's nodes share)
is asked first: one process of the job resolves a Hub request, every other reads its
manifest there (``_job_manifest``; checked as hostile, never expired).

Guarantees and limits. No byte from a server is trusted:

- Private stays private. Every cache entry, in memory and on disk (pins, tree listings,
  cards, manifests), is keyed by the caller's token identity (a truncated sha256 of the
  token, "" for none) as well, so an entry is only ever served to a caller with the same
  token. The ``resolutions`` folder is made (or, if it is ours, chmod-ed) ``0700``; its
  entries and lock files are ``0600``. A folder that belongs to another user is not used
  (a warning, then resolution without the disk cache).
- Bounded answers. Every body is read as a stream with a cap, and an announced
  ``Content-Length`` over the cap fails before a byte is read: ``MAX_API_BODY`` for API
  answers, ``MAX_TEXT_BODY`` for ``README.md`` and ``.huggingface.yaml``. A tree listing
  stops with ``ResolutionError`` past ``MAX_TREE_PAGES`` pages, ``MAX_TREE_FILES`` files
  or ``MAX_TREE_BYTES`` bytes, at a page that is empty yet announces another, at a loop,
  and at a next page off the endpoint's origin. YAML (README front matter,
  ``.huggingface.yaml``) is parsed safely and refused when its document, aliases counted
  as the size of what they point to (billion laughs), exceeds ``MAX_YAML_NODES`` nodes,
  before any Python object is made; recursive aliases are refused.
- Typed answers. Every field read from JSON is type-checked: a commit sha is 40 hex
  digits, a size an int >= 0, an etag a hex object id, and a tree path a clean relative
  POSIX path (no ``..``, ``.`` or empty segment, no leading ``/``, no backslash, NUL or
  control character, at most ``MAX_PATH_LENGTH`` characters, below the folder listed,
  listed once): anything else is a ``ResolutionError`` naming the entry and the repo.
- Every error is ours. Every request goes through ``HubClient.request`` (the one
  request path: retries, redirects at most ``MAX_REDIRECTS`` and to http(s) only, the
  token to its endpoint only); an invalid URL, a redirect loop, a body that is not
  UTF-8 or not JSON become ``ResolutionError`` naming the URL.
- Bounded waits. A request's whole answer (headers and body, redirects included) must
  arrive within ``StreamOptions.timeout`` plus a second (a trickled answer counts as a
  timeout and is retried); a rate-limited host that wants us to wait past
  ``StreamOptions.max_rate_limit_wait`` fails at once with ``RateLimitedError``; an
  endpoint that never answered and refuses connections (or has no DNS name) fails after
  one quick retry with ``UnreachableError`` naming ``HF_ENDPOINT`` / ``endpoint=``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import posixpath
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeAlias, TypeVar, cast
from urllib.parse import quote, urlsplit

import anyio
import anyio.to_thread
import filelock
import httpx2

from . import _job_manifest as job
from . import stores
from ._access import DEFAULT_ENDPOINT, Access, find_access
from ._answers import Answer, BodyCap
from ._client import MAX_REDIRECTS, HubClient, RequestSigner, use_client
from ._exceptions import (
    ClosedResourceError,
    ConfigNotFoundError,
    FetchError,
    FileChangedError,
    RevisionNotFoundError,
    SourceError,
    SplitNotFoundError,
    UsageError,
)
from ._hub_layout import (
    DATA_FILE_EXTENSIONS,
    MAX_PATH_LENGTH,
    MAX_TEXT_BODY,
    MAX_YAML_NODES,
    _bad_input,
    _common_format,
    _File,
    _glob,
    _glob_base,
    _sanitize_data_files,
    _select,
    _Where,
)
from ._models import FileRef, Manifest, combine_manifests
from ._options import StreamOptions
from ._resolution_cache import (
    _FILE_MODE,
    _acquire,
    _Codec,
    _drop_entry,
    _key,
    _Lru,
    _Pending,
    _prepare_folder,
    _read_entry,
    _weight,
    _write_entry,
    manifest_key,
    pin_key,
)
from ._sources import (
    BucketSource,
    HubSource,
    LocalSource,
    Source,
    UrlSource,
    has_glob,
    parse_sources,
)
from ._stalls import network as stage_network
from .stores import hub
from .stores.hub import MAX_TREE_BYTES, MAX_TREE_FILES, MAX_TREE_PAGES

__all__ = [
    "DATA_FILE_EXTENSIONS",
    "DEFAULT_ENDPOINT",
    "MAX_API_BODY",
    "MAX_PATH_LENGTH",
    "MAX_REDIRECTS",
    "MAX_TEXT_BODY",
    "MAX_TREE_BYTES",
    "MAX_TREE_FILES",
    "MAX_TREE_PAGES",
    "MAX_YAML_NODES",
    "DataFiles",
    "Resolver",
    "ResolverStatistics",
]

logger = logging.getLogger("aiostream_hf.resolver")

#: What ``data_files=`` accepts, as in ``datasets``: a pattern, a list of patterns (split
#: "train"), a mapping split -> pattern(s), or a list of ``{"split": ..., "path": ...}``.
DataFiles: TypeAlias = (
    "str | Sequence[str] | Mapping[str, str | Sequence[str]] | Sequence[Mapping[str, Any]]"
)

_MiB = 1024 * 1024
#: The largest API answer (a tree page, a revision's info) read, in bytes. A Hub tree
#: page of 1,000 entries is about 0.3 MB.
MAX_API_BODY = 16 * _MiB
# In-memory caches are bounded by the files they hold (a pin or a card counts as one).
_MEMORY_WEIGHT = 2_000_000
_LISTING_WEIGHT = 2_000_000


@dataclass(frozen=True, slots=True)
class ResolverStatistics:
    """What a Resolver did since it was created.

    api_requests / resolver_requests: HTTP requests to ``/api/...`` and to ``/resolve/``
        URLs, retries included (the Hub's two rate-limit buckets).
    retries: requests repeated after a 408/429/5xx answer or a network error.
    memory_hits / disk_hits: pins, tree listings, cards and manifests answered from this
        process's memory, or (pins and manifests) from the on-disk cache that another
        process, or an earlier run, wrote.
    coalesced_waits: calls that waited for a resolution another task had in flight.
    resolutions: manifests computed from the network (cache misses).
    """

    api_requests: int = 0
    resolver_requests: int = 0
    retries: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    coalesced_waits: int = 0
    resolutions: int = 0


# --- the Resolver ----------------------------------------------------------------------

T = TypeVar("T")


_MANIFEST_CODEC: _Codec[Manifest] = _Codec("manifest", Manifest.to_json, Manifest.from_json)
_PIN_CODEC: _Codec[hub.Pin] = _Codec("pin", hub.Pin.to_json, hub.Pin.from_json)
_HEAD_CODEC: _Codec[hub.FileHead | None] = _Codec(
    "file", lambda h: h and h.to_json(), lambda d: d and hub.FileHead.from_json(d)
)
# Memory only: a tree listing can be large, and the manifests made from it are on disk.
_TREE_CODEC: _Codec[tuple[_File, ...]] = _Codec("tree")
_CARD_CODEC: _Codec[dict[str, Any] | None] = _Codec("card")
_JOB_CODEC: _Codec[Manifest] = _Codec("job")  # memory only: its folder is the job's


class _Counts:
    def __init__(self) -> None:
        self.api_requests = 0
        self.resolver_requests = 0
        self.retries = 0
        self.memory_hits = 0
        self.disk_hits = 0
        self.coalesced_waits = 0
        self.resolutions = 0


class _Call:
    """One resolve() call: its access (endpoint and token, found once when the call or
    its stream began) and whether it already waited for another task (counted once)."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self.waited = False

    async def token(self) -> str | None:
        return self.access.token

    async def identity(self) -> str:
        """Whose cache entries this call may read: see ``Access.identity``."""
        return self.access.identity


class Resolver:
    """Turns sources into Manifests, coalescing work in the process and on the machine.

        async with Resolver() as resolver:
            manifest = await resolver.resolve("hf://datasets/org/name", split="train")

    ``client``: the ``HubClient`` to send requests through (the caller closes it), so
    that a 429 pauses its host for the resolver and the fetcher alike; without one,
    ``async with`` takes the event loop's shared client (``use_client``), as streams do.
    ``options`` gives the cache folder (``StreamOptions.resolved_cache_dir()``),
    ``pin_ttl``, retries and timeout.
    ``access``: the endpoint and token of calls that name neither (a stream's readers
    share the one found when it opened); without it each call finds its own.
    One Resolver belongs to one event loop; share it between the tasks of that loop.
    """

    def __init__(
        self,
        *,
        options: StreamOptions | None = None,
        client: HubClient | None = None,
        access: Access | None = None,
    ) -> None:
        self._options = options or StreamOptions()
        self._access = access
        self._client = client
        self._shared: contextlib.AbstractAsyncContextManager[HubClient] | None = None
        self._closed = False
        self._counts = _Counts()
        self._pending: dict[str, _Pending] = {}
        self._memory = _Lru(_MEMORY_WEIGHT)
        self._listings = _Lru(_LISTING_WEIGHT)
        self._folders: dict[Path, bool] = {}  # cache folders checked: usable or not
        # (endpoint, repo, commit) of the pins taken from a cache -> the pin's key
        self._shared_pins: dict[tuple[str, str, str], tuple[Any, ...]] = {}

    # -- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Resolver:
        self._check_open()
        if self._client is None:  # the event loop's shared client (``use_client``)
            self._shared = use_client()
            self._client = await self._shared.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Leave the event loop's shared client if ``async with`` took it (the last user
        closes it); later calls raise ClosedResourceError."""
        self._closed = True
        self._client = None
        shared, self._shared = self._shared, None
        if shared is not None:
            with anyio.CancelScope(shield=True):
                await shared.__aexit__(None, None, None)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError("this Resolver is closed: create a new one")

    def statistics(self) -> ResolverStatistics:
        """Requests made, cache hits and coalesced waits so far."""
        c = self._counts
        return ResolverStatistics(
            api_requests=c.api_requests,
            resolver_requests=c.resolver_requests,
            retries=c.retries,
            memory_hits=c.memory_hits,
            disk_hits=c.disk_hits,
            coalesced_waits=c.coalesced_waits,
            resolutions=c.resolutions,
        )

    # -- the public call ------------------------------------------------------------------

    async def resolve(
        self,
        source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        config: str | None = None,
        split: str | None = None,
        data_files: DataFiles | None = None,
        token: str | bool | None = None,
        endpoint: str | None = None,
        access: Access | None = None,
    ) -> Manifest:
        """The files of ``source`` for ``config`` and ``split``, pinned to a commit.

        ``source`` is anything ``parse_sources`` accepts. ``data_files`` replaces the
        config's files with patterns relative to the repo (or to the folder the source
        names). ``token``: a token, False for none, or None to use ``HF_TOKEN`` or the
        login stored by huggingface_hub. ``endpoint`` defaults to ``$HF_ENDPOINT``, then
        ``https://huggingface.co``; both are read from the environment now (``find_access``)
        unless ``access`` gives them (a stream's readers share the one it found when it
        opened). ``split=None`` selects every split of the config.
        """
        self._check_open()
        sources = await anyio.to_thread.run_sync(parse_sources, source)
        patterns = None if data_files is None else _sanitize_data_files(data_files, _bad_input)
        if access is None and token is None and endpoint is None:
            access = self._access
        if access is None:
            access = await find_access(token, endpoint)
        elif token is not None or endpoint is not None:
            raise SourceError("Resolver.resolve: pass access= or token=/endpoint=, not both")
        call = _Call(access)
        resolve = functools.partial(self._resolve_sources, sources, config, split, data_files)
        folder = self._options.resolved_manifest_dir()
        if folder is None or not job.shareable(sources):
            return await resolve(patterns, call)
        # One resolution per job: the manifest kept in the job's folder (_job_manifest).
        key = job.request_key(sources, config, split, patterns, access)
        compute = functools.partial(resolve, patterns, call)
        shared = functools.partial(job.shared, folder, key, compute)
        return await self._once(("job", key), shared, _JOB_CODEC, ttl=None, call=call)

    async def _resolve_sources(
        self,
        sources: Sequence[Source],
        config: str | None,
        split: str | None,
        data_files: DataFiles | None,
        patterns: dict[str, list[str]] | None,
        call: _Call,
    ) -> Manifest:
        hub_endpoint = call.access.endpoint
        manifests: list[Manifest] = []
        run: list[UrlSource | LocalSource | BucketSource] = []  # resolved together
        for src in sources:
            if isinstance(src, HubSource):
                if run:
                    manifests.append(await self._resolve_run(run, config, split, call))
                    run = []
                if patterns is not None and src.path is not None and has_glob(src.path):
                    raise SourceError(
                        f"data_files={data_files!r} cannot narrow a glob source "
                        f"({src.uri!r}): put the pattern in one of them only"
                    )
                manifests.append(
                    await self._resolve_hub(src, config, split, patterns, hub_endpoint, call)
                )
            else:
                if patterns is not None:
                    raise SourceError(
                        f"data_files= applies to Hub repos, not to {_describe(src)!r}: "
                        "pass the files themselves as the source"
                    )
                if run and not _same_run(run[-1], src):
                    manifests.append(await self._resolve_run(run, config, split, call))
                    run = []
                run.append(src)
        if run:
            manifests.append(await self._resolve_run(run, config, split, call))
        return manifests[0] if len(manifests) == 1 else combine_manifests(manifests)

    async def file_head(self, src: HubSource) -> tuple[FileRef, str | None] | None:
        """One Hub file in one request (``hub.fetch_file_head``): its FileRef at the
        commit, and the CDN URL it redirects to (None if cached). Shared like a pin
        (``pin_ttl``; a commit's forever). None: the answer lacked a field (list it)."""
        assert src.path is not None  # (a closed resolver refuses in _get)
        call = _Call(self._access or await find_access())
        endpoint, revision = call.access.endpoint, src.revision or "main"
        where, found = _Where(src.repo_id, revision, None, endpoint), [cast("str | None", None)]

        async def fetch() -> hub.FileHead | None:
            head, found[0] = await hub.fetch_file_head(self._hub_get(call), where, src.path or "")
            return head

        key = ("file", await call.identity(), endpoint, src.repo_id, revision, src.path)
        ttl = None if hub.is_sha(revision) else self._options.pin_ttl
        head = await self._once(key, fetch, _HEAD_CODEC, ttl=ttl, call=call)
        if head is None:
            return None
        if found[0] is None and not hub.is_sha(revision):  # shared: forgotten if stale
            self._shared_pins[(endpoint, src.repo_id, head.sha)] = key
        url = f"{endpoint}/datasets/{src.repo_id}/resolve/{head.sha}/{quote(src.path)}"
        return FileRef(url, src.path, size=head.size, etag=head.etag), found[0]

    async def _resolve_run(
        self,
        run: Sequence[UrlSource | LocalSource | BucketSource],
        config: str | None,
        split: str | None,
        call: _Call,
    ) -> Manifest:
        """Plain files and URLs; or objects of one bucket (one listing for all of them)."""
        what = _describe(run[0]) + (f" and {len(run) - 1} more" if len(run) > 1 else "")
        _check_one_split(what, config, split)
        files = await stores.for_source(run[0]).resolve(run, _StoreLister(self, call))
        return Manifest(
            files=files,
            config="default",
            split="train",
            configs=("default",),
            splits={"train": len(files)},
            format=_common_format([f.path for f in files]),
        )

    # -- Hub repos ----------------------------------------------------------------------

    async def _resolve_hub(
        self,
        src: HubSource,
        config: str | None,
        split: str | None,
        data_files: dict[str, list[str]] | None,
        endpoint: str,
        call: _Call,
    ) -> Manifest:
        revision = src.revision or "main"
        who = await call.identity()  # every key carries it: entries stay with their token
        args = (src, revision, config, split, data_files, endpoint, call, who)
        if hub.is_sha(revision):  # a commit the user named: no pin, nothing to drop
            return await self._manifest(hub.Pin(revision), *args)
        key = pin_key(who, endpoint, src.repo_id, revision)
        pin, shared = await self._pin(key, src.repo_id, revision, endpoint, call)
        if not shared:
            return await self._manifest(pin, *args)
        try:
            return await self._manifest(pin, *args)
        except RevisionNotFoundError:
            # The Hub no longer knows the commit of a shared pin (a server restarted
            # over a changed folder, a rewritten branch): drop it, and pin afresh once.
            await self._drop_pin(key, pin.sha)
        pin, _ = await self._pin(key, src.repo_id, revision, endpoint, call)
        return await self._manifest(pin, *args)

    async def _pin(
        self, key: tuple[Any, ...], repo: str, revision: str, endpoint: str, call: _Call
    ) -> tuple[hub.Pin, bool]:
        """The commit ``revision`` names, and whether the pin is shared: taken from a
        cache (this resolver's, the machine's) or from another task, not requested by this
        call. A shared pin's commit is remembered, for ``forget_stale_pin``."""
        fetched = False

        async def fetch() -> hub.Pin:
            nonlocal fetched
            fetched = True
            return await hub.fetch_pin(self._hub_get(call), endpoint, repo, revision)

        pin = await self._once(key, fetch, _PIN_CODEC, ttl=self._options.pin_ttl, call=call)
        if not fetched:
            self._shared_pins[(endpoint, repo, pin.sha)] = key
        return pin, not fetched

    async def _drop_pin(self, key_parts: tuple[Any, ...], sha: str) -> None:
        """Forget the pin under ``key_parts`` if it still names ``sha``: in memory, and on
        disk under its lock (a pin another process has renewed since is kept)."""
        key = _key(key_parts)
        hit, pin = self._memory.get(key)
        if hit and pin.sha == sha:
            self._memory.discard(key)
        folder = await self._cache_folder()
        if folder is None:
            return
        stored = json.loads(json.dumps(key_parts))
        try:
            lock = filelock.FileLock(
                str(folder / f"{key}.lock"), mode=_FILE_MODE, thread_local=False
            )
            await _acquire(lock)
        except OSError as exc:
            logger.warning("resolution cache %s is not usable (%s)", folder, exc)
            return
        try:
            stale = functools.partial(_names_commit, sha)
            path = folder / f"{key}.json"
            if await anyio.to_thread.run_sync(_drop_entry, path, stored, stale):
                logger.info("dropped a shared pin to %s: the Hub no longer knows it", sha)
        finally:
            lock.release()

    async def forget_stale_pin(self, error: BaseException) -> bool:
        """Whether ``error`` refused, with a 404, a file's first read at a commit that a
        shared pin of this resolver named (so the Hub no longer knows that commit). Then
        the pin is dropped (``_drop_pin``), and the next resolution pins afresh.

        A read that already began (``FileChangedError``), a commit the user named and a
        pin this resolver requested itself are not forgotten: their errors stand."""
        if isinstance(error, FileChangedError) or not isinstance(error, FetchError):
            return False
        if error.status != 404:
            return False
        for (endpoint, repo, sha), key in list(self._shared_pins.items()):
            if error.url.startswith(f"{endpoint}/datasets/{repo}/resolve/{sha}/"):
                del self._shared_pins[(endpoint, repo, sha)]
                await self._drop_pin(key, sha)
                return True
        return False

    async def with_fresh_pin(self, read: Callable[[], Awaitable[T]]) -> T:
        """``read()`` (which resolves with this resolver, then reads); run once more when
        it failed because the Hub no longer knows the commit of a shared pin
        (``forget_stale_pin``), so that the second run pins afresh."""
        try:
            return await read()
        except Exception as exc:
            if not await self.forget_stale_pin(exc):
                raise
        return await read()

    async def _manifest(
        self,
        pin: hub.Pin,
        src: HubSource,
        revision: str,
        config: str | None,
        split: str | None,
        data_files: dict[str, list[str]] | None,
        endpoint: str,
        call: _Call,
        who: str,
    ) -> Manifest:
        """The manifest of ``src`` at ``pin``'s commit: cached forever (a commit is
        immutable), else built from its tree listing and card."""
        key = manifest_key(who, endpoint, src.repo_id, pin.sha, src.path, config, split, data_files)
        build = functools.partial(
            self._build, src, revision, pin, config, split, data_files, endpoint, call, who
        )
        return await self._once(key, build, _MANIFEST_CODEC, ttl=None, call=call)

    async def _tree(
        self, where: _Where, base: str, path: str | None, call: _Call, who: str
    ) -> tuple[_File, ...]:
        """Every file below ``base`` at ``where``'s commit: the repo's whole tree listing
        when this resolver holds it, else the listing of ``base`` (cached forever)."""
        assert where.sha is not None
        root = ("tree", who, where.endpoint, where.repo, where.sha, "")
        hit, tree = self._listings.get(_key(root))  # the whole tree serves any folder
        if hit:
            self._counts.memory_hits += 1
            return cast("tuple[_File, ...]", tree)
        return await self._once(
            root[:-1] + (base,),
            functools.partial(hub.list_tree, self._hub_get(call), where, base, path),
            _TREE_CODEC,
            ttl=None,
            call=call,
        )

    async def folder_files(self, source: str) -> Manifest:
        """Every file of a Hub folder (``hf://datasets/ORG/NAME@SHA[/FOLDER]``, at a
        commit), with its size and ETag, whatever its format: the tree listing that a
        resolution of the folder reads (shared with it, cached). LeRobot's videos and
        metadata so carry their versions, as the data files do."""
        self._check_open()
        sources = await anyio.to_thread.run_sync(parse_sources, source)
        src = sources[0] if len(sources) == 1 else None
        if (
            not isinstance(src, HubSource)
            or src.revision is None
            or not hub.is_sha(src.revision)
            or (src.path is not None and has_glob(src.path))
        ):
            raise SourceError(
                f"folder_files({source!r}): give a Hub folder at a commit, "
                "hf://datasets/ORG/NAME@SHA[/FOLDER]"
            )
        access = self._access if self._access is not None else await find_access(None, None)
        call = _Call(access)
        who = await call.identity()
        folder = (src.path or "").strip("/")
        sha, endpoint = src.revision, access.endpoint

        async def build() -> Manifest:
            where = _Where(src.repo_id, sha, sha, endpoint)
            tree = await self._tree(where, folder, src.path, call, who)
            prefix = f"{folder}/" if folder else ""
            base = f"{endpoint}/datasets/{src.repo_id}/resolve/{sha}/"
            files = tuple(
                FileRef(url=base + quote(f.path), path=f.path, size=f.size, etag=f.etag)
                for f in tree
                if f.path.startswith(prefix)
            )
            return Manifest(files=files, repo_id=src.repo_id, commit=sha, endpoint=endpoint)

        # Kept as a manifest (a commit's files never change): a process that finds the
        # folder's manifests on disk finds this one there too, and lists nothing; with a
        # job folder (manifest_dir), one process of the job lists it for all.
        key = ("folder", who, endpoint, src.repo_id, sha, folder)
        jobdir = self._options.resolved_manifest_dir()
        listing = build if jobdir is None else job.shared_folder(jobdir, src, access, build)
        return await self._once(key, listing, _MANIFEST_CODEC, ttl=None, call=call)

    async def _build(
        self,
        src: HubSource,
        revision: str,
        pin: hub.Pin,
        config: str | None,
        split: str | None,
        data_files: dict[str, list[str]] | None,
        endpoint: str,
        call: _Call,
        who: str,
    ) -> Manifest:
        path = src.path
        if path is None:
            base = ""
        elif has_glob(path):
            base = _glob_base(path)
        else:
            base = posixpath.dirname(path)
        where = _Where(src.repo_id, revision, pin.sha, endpoint)
        tree = await self._tree(where, base, path, call, who)
        card = None
        if path is None:
            card = await self._once(
                ("card", who, endpoint, src.repo_id, pin.sha),
                functools.partial(hub.fetch_card, self._hub_get(call), where, pin, tree),
                _CARD_CODEC,
                ttl=None,
                call=call,
            )
        selection = await anyio.to_thread.run_sync(
            functools.partial(
                _select,
                tree,
                card,
                where,
                path=path,
                config=config,
                split=split,
                data_files=data_files,
            )
        )
        files = tuple(
            FileRef(
                url=f"{endpoint}/datasets/{src.repo_id}/resolve/{pin.sha}/{quote(f.path)}",
                path=f.path,
                size=f.size,
                etag=f.etag,
                split=file_split,
            )
            for file_split, f in selection.files
        )
        if pin.gated and files:
            await hub.check_access(self._hub_get(call), where, files[0].url)
        self._counts.resolutions += 1
        return Manifest(
            files=files,
            repo_id=src.repo_id,
            commit=pin.sha,
            endpoint=endpoint,
            config=selection.config,
            split=selection.split,
            configs=selection.configs,
            splits=selection.splits,
            format=selection.format,
        )

    def _hub_get(self, call: _Call) -> hub.Get:
        """This call's requests to the Hub (``stores.hub`` sends through it)."""
        return functools.partial(self._get, call=call)

    # -- HTTP -----------------------------------------------------------------------------

    async def _get(
        self,
        url: str,
        where: _Where,
        call: _Call,
        *,
        params: httpx2.QueryParams | None = None,
        method: str = "GET",
        missing: str | None = None,
        follow_redirects: bool = True,
        body: _BodyKind = "api",
        signer: RequestSigner | None = None,
        refused: Callable[[httpx2.Response, bytes, int], Exception] | None = None,
    ) -> Answer:
        """One request through the client (``HubClient.request``: gates, quotas, the
        token by origin, retries, redirects, deadlines), its body read with the cap of its
        kind; a final answer that is an error becomes the library's error.

        A request to an S3 store has a ``signer`` (and no Hub token) and a ``refused``
        that turns an error answer and its body (read for its code) into the error.
        """
        self._check_open()
        if self._client is None:
            raise UsageError(
                "a Resolver without client= reads through the event loop's shared client: "
                "use it as `async with Resolver(...) as resolver`, or pass client="
            )
        is_api = signer is not None or urlsplit(url).path.startswith("/api/")

        def sent() -> None:
            if is_api:
                self._counts.api_requests += 1
            else:
                self._counts.resolver_requests += 1

        with stage_network():  # a resolution is a read the consumer may wait on
            answer = await self._client.request(
                method,
                url,
                options=self._options,
                access=None if signer is not None else call.access,
                params=params,
                follow_redirects=follow_redirects,
                body=None if body is None else _body_cap(body),
                error_bodies=refused is not None,
                signer=signer,
                on_send=sent,
            )
        self._counts.retries += answer.attempts - 1
        status = answer.response.status_code
        if status < (300 if refused is not None else 400):
            return answer
        if refused is not None:
            raise refused(answer.response, answer.body, answer.attempts)
        raise hub.http_error(answer.response, where, missing, answer.attempts, call.access)

    # -- coalescing -----------------------------------------------------------------------

    async def _once(
        self,
        key_parts: tuple[Any, ...],
        compute: Callable[[], Awaitable[T]],
        codec: _Codec[T],
        *,
        ttl: float | None,
        call: _Call,
    ) -> T:
        """The value for a key: from memory, from a task computing it, from disk, or computed.

        Coordinating state is plain synchronous code: the dict of pending results is
        changed only between awaits. If the task computing a value is cancelled, its
        waiters wake up and the first one takes the work over.
        """
        key = _key(key_parts)
        memory = self._listings if codec.kind == "tree" else self._memory
        waited = False
        while True:
            hit, cached = memory.get(key)
            if hit:
                if not waited:
                    self._counts.memory_hits += 1
                return cast(T, cached)
            pending = self._pending.get(key)
            if pending is None:
                break
            waited = True
            if not call.waited:
                self._counts.coalesced_waits += 1
                call.waited = True
            await pending.event.wait()
            if pending.error is not None:
                raise pending.error
            if pending.done:
                return cast(T, pending.value)
            # The owner was cancelled: go round, and take over if nobody else has.

        pending = _Pending()
        self._pending[key] = pending
        try:
            age = 0.0
            if codec.encode is not None and codec.decode is not None and (ttl is None or ttl > 0):
                value, age = await self._disk_once(
                    key, key_parts, compute, codec.encode, codec.decode, ttl
                )
            else:
                value = await compute()
        except BaseException as exc:
            del self._pending[key]
            if isinstance(exc, Exception):
                pending.error = exc
            pending.event.set()
            raise
        memory.put(key, value, None if ttl is None else ttl - age, _weight(value))
        del self._pending[key]
        pending.value = value
        pending.done = True
        pending.event.set()
        return value

    async def _cache_folder(self) -> Path | None:
        """The ``resolutions`` folder, made private to this user (checked once per
        Resolver and folder); None when it cannot be used (logged)."""
        folder = self._options.resolved_cache_dir() / "resolutions"
        ready = self._folders.get(folder)
        if ready is None:
            try:
                await anyio.to_thread.run_sync(_prepare_folder, folder)
                ready = True
            except OSError as exc:
                logger.warning(
                    "resolution cache %s is not usable (%s): resolving uncached", folder, exc
                )
                ready = False
            self._folders[folder] = ready
        return folder if ready else None

    async def _disk_once(
        self,
        key: str,
        key_parts: tuple[Any, ...],
        compute: Callable[[], Awaitable[T]],
        encode: Callable[[T], Any],
        decode: Callable[[Any], T],
        ttl: float | None,
    ) -> tuple[T, float]:
        """The value from the on-disk cache, or computed under the key's file lock and
        stored there; and its age in seconds (a pin shared by another process is older)."""
        folder = await self._cache_folder()
        if folder is None:
            return await compute(), 0.0
        path = folder / f"{key}.json"
        stored = json.loads(json.dumps(key_parts))
        found = await anyio.to_thread.run_sync(_read_entry, path, stored, ttl, decode)
        if found is not None:
            self._counts.disk_hits += 1
            return found
        try:
            lock = filelock.FileLock(
                str(folder / f"{key}.lock"), mode=_FILE_MODE, thread_local=False
            )
            await _acquire(lock)
        except OSError as exc:
            logger.warning(
                "resolution cache %s is not usable (%s): resolving uncached", folder, exc
            )
            return await compute(), 0.0
        try:
            found = await anyio.to_thread.run_sync(_read_entry, path, stored, ttl, decode)
            if found is not None:
                self._counts.disk_hits += 1
                return found
            value = await compute()
            entry = {"key": stored, "created": time.time(), "value": encode(value)}
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_write_entry, path, entry)
            return value, 0.0
        finally:
            lock.release()


# --- helpers: environment, HTTP --------------------------------------------------------


#: Which cap a body is read with: "api" (``MAX_API_BODY``), "text" (``MAX_TEXT_BODY``),
#: or None: no body is read.
_BodyKind: TypeAlias = "Literal['api', 'text'] | None"


def _body_cap(kind: str) -> BodyCap:
    """The cap for a kind of body and the constant's name (read at call time)."""
    if kind == "text":
        return BodyCap(MAX_TEXT_BODY, "MAX_TEXT_BODY")
    return BodyCap(MAX_API_BODY, "MAX_API_BODY")


def _names_commit(sha: str, value: Any) -> bool:
    """Whether a pin cache entry's value names commit ``sha``."""
    return isinstance(value, dict) and value.get("sha") == sha


def _describe(src: Source) -> str:
    if isinstance(src, BucketSource):
        return src.uri
    if isinstance(src, UrlSource):
        return src.url
    if isinstance(src, LocalSource):
        return str(src.path)
    return src.uri


def _same_run(last: Source, src: Source) -> bool:
    """Whether ``src`` is resolved with ``last``: sources of one store together, the
    objects of one bucket together (one listing)."""
    if isinstance(last, BucketSource) and isinstance(src, BucketSource):
        return (last.scheme, last.bucket) == (src.scheme, src.bucket)
    return stores.for_source(last) is stores.for_source(src)


def _check_one_split(what: str, config: str | None, split: str | None) -> None:
    """Files, URLs and objects form one config ("default") with one split ("train")."""
    if config not in (None, "default"):
        raise ConfigNotFoundError(
            f"no config {config!r} in {what}: files, URLs and objects have one config, 'default'"
        )
    if split not in (None, "train"):
        raise SplitNotFoundError(
            f"no split {split!r} in {what}: files, URLs and objects form one split, 'train' "
            "(as in datasets); resolve each split's files separately"
        )


# --- helpers: the on-disk cache -------------------------------------------------------


class _StoreLister:
    """What a store lists a bucket with (``stores.Lister``): this resolver's requests
    (through the client), its coalescing and caches, its globs."""

    def __init__(self, resolver: Resolver, call: _Call) -> None:
        self._resolver = resolver
        self._call = call

    @property
    def options(self) -> StreamOptions:
        return self._resolver._options

    async def get(
        self,
        url: str,
        *,
        signer: RequestSigner,
        refused: Callable[[httpx2.Response, bytes, int], Exception],
    ) -> bytes:
        where = _Where(url.split("?", 1)[0], "", None, url)
        answer = await self._resolver._get(
            url, where, self._call, follow_redirects=False, signer=signer, refused=refused
        )
        return answer.body

    async def once(
        self,
        key: tuple[Any, ...],
        compute: Callable[[], Awaitable[T]],
        encode: Callable[[T], Any],
        decode: Callable[[Any], T],
    ) -> T:
        async def counted() -> T:
            value = await compute()
            self._resolver._counts.resolutions += 1
            return value

        codec = _Codec(str(key[0]), encode, decode)
        return await self._resolver._once(
            key, counted, codec, ttl=self._resolver._options.pin_ttl, call=self._call
        )

    def glob(self, pattern: str) -> Any:
        return _glob(pattern)
