"""The Hub as a store: a repo's revision pinned to its commit, its tree listed, its card
read, and what the Hub's answers (``X-Error-Code``) mean. Every request goes through the
resolver's ``get`` (``HubClient.request``: retries, redirects, the token to the Hub only);
the Hub's rules for which files a source means are ``_hub_layout``'s.

Bounded: a tree listing stops with ``ResolutionError`` past ``MAX_TREE_PAGES`` pages,
``MAX_TREE_FILES`` files or ``MAX_TREE_BYTES`` bytes, at a page that is empty yet
announces another, at a loop, and at a next page off the endpoint's origin.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import anyio.to_thread
import httpx2

from .._access import Access, origin
from .._answers import Answer
from .._exceptions import (
    EntryNotFoundError,
    FetchError,
    GatedRepoError,
    RepoNotFoundError,
    ResolutionError,
    RevisionNotFoundError,
)
from .._hub_layout import _OID, _File, _front_matter, _load_yaml, _short, _tree_file, _Where
from ._refusal import Refusal

__all__ = [
    "STORE",
    "HubStore",
    "MAX_TREE_BYTES",
    "MAX_TREE_FILES",
    "MAX_TREE_PAGES",
    "FileHead",
    "Get",
    "Pin",
    "check_access",
    "fetch_card",
    "fetch_file_head",
    "fetch_pin",
    "http_error",
    "is_sha",
    "json_body",
    "list_tree",
    "next_page",
]

#: The most pages of one tree listing followed (the Hub pages 1,000 entries at a time).
MAX_TREE_PAGES = 10_000
#: The most files one tree listing may hold.
MAX_TREE_FILES = 1_000_000
#: The most bytes all the pages of one tree listing may add up to (a listing of a
#: million files is about 200 MB).
MAX_TREE_BYTES = 1024 * (1024 * 1024)

_SHA = re.compile(r"^[0-9a-f]{40}$")


def is_sha(revision: str) -> bool:
    """Whether ``revision`` is a commit sha already (no pin request needed)."""
    return bool(_SHA.match(revision))


class Get(Protocol):
    """One request of the resolver, for the Hub at ``where`` (see ``Resolver._get``)."""

    def __call__(
        self,
        url: str,
        where: _Where,
        *,
        params: httpx2.QueryParams | None = None,
        method: str = "GET",
        missing: str | None = None,
        follow_redirects: bool = True,
        body: Any = "api",
    ) -> Awaitable[Answer]: ...


@dataclass(frozen=True, slots=True)
class Pin:
    """A revision pinned to a commit, with what the pin request told about the repo."""

    sha: str
    card: dict[str, Any] | None = None
    card_known: bool = False  # False when the revision was a sha and no request was made
    gated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "sha": self.sha,
            "card": self.card,
            "card_known": self.card_known,
            "gated": self.gated,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Pin:
        sha = data["sha"]
        if not isinstance(sha, str) or not _SHA.match(sha):
            raise ValueError(f"bad sha {sha!r}")
        card = data.get("card")
        return cls(
            sha=sha,
            card=card if isinstance(card, dict) else None,
            card_known=bool(data["card_known"]),
            gated=bool(data.get("gated")),
        )


async def fetch_pin(get: Get, endpoint: str, repo: str, revision: str) -> Pin:
    url = f"{endpoint}/api/datasets/{repo}/revision/{quote(revision, safe='')}"
    params = httpx2.QueryParams([("expand", "sha"), ("expand", "cardData"), ("expand", "gated")])
    where = _Where(repo, revision, None, endpoint)
    answer = await get(url, where, params=params)
    data = json_body(answer.body, url)
    if not isinstance(data, dict):
        raise ResolutionError(f"GET {url} answered {type(data).__name__}, not an object")
    sha = data.get("sha")
    if not isinstance(sha, str) or not _SHA.match(sha):
        raise ResolutionError(f"GET {url} answered no commit sha (got {_short(sha)})")
    card = data.get("cardData")
    gated = data.get("gated")
    if gated is not None and not isinstance(gated, (bool, str)):
        raise ResolutionError(f"GET {url} answered gated={_short(gated)}: not a bool or a str")
    return Pin(
        sha=sha,
        card=card if isinstance(card, dict) else None,
        card_known=True,
        gated=bool(gated),
    )


@dataclass(frozen=True)
class FileHead:
    """One file of a repo at a revision, as its ``/resolve/`` URL's answer tells it: the
    commit the revision names, the file's size and ETag."""

    sha: str
    size: int
    etag: str

    def to_json(self) -> dict[str, Any]:
        return {"sha": self.sha, "size": self.size, "etag": self.etag}

    @classmethod
    def from_json(cls, data: Any) -> FileHead:
        """From a cache entry, checked (an entry on disk is not trusted)."""
        if not isinstance(data, dict):
            raise ValueError(f"a file entry is {type(data).__name__}, not an object")
        sha, size, etag = data.get("sha"), data.get("size"), data.get("etag")
        if not isinstance(sha, str) or not _SHA.match(sha):
            raise ValueError(f"a file entry's sha is {_short(sha)}")
        if type(size) is not int or size < 0 or not isinstance(etag, str) or not etag:
            raise ValueError(f"a file entry's size {_short(size)} or etag {_short(etag)}")
        return cls(sha, size, etag)


async def fetch_file_head(get: Get, where: _Where, path: str) -> tuple[FileHead | None, str | None]:
    """``path``'s commit, size and ETag, and the URL it redirects to, from ONE request: a
    HEAD of its ``/resolve/`` URL, not followed (the Hub's 302 to its CDN carries
    ``X-Repo-Commit``, ``X-Linked-Size`` and ``X-Linked-Etag``; a file served directly,
    ``Content-Length`` and ``ETag``). (None, None) when the answer lacks one of them:
    the caller lists the repo instead. Errors as the Hub's codes say (``http_error``)."""
    url = f"{where.endpoint}/datasets/{where.repo}/resolve/{quote(where.revision, safe='')}/"
    url += quote(path)
    answer = await get(url, where, method="HEAD", follow_redirects=False, body=None, missing=path)
    headers = answer.response.headers
    redirected = answer.response.is_redirect
    sha = headers.get("x-repo-commit", "")
    size = headers.get("x-linked-size" if redirected else "content-length", "")
    etag = headers.get("x-linked-etag" if redirected else "etag", "").strip()
    etag = etag.removeprefix("W/").strip('"')
    location = headers.get("location") if redirected else None
    if not _SHA.match(sha) or not size.isdigit() or not _OID.match(etag):
        return None, None
    if redirected and not location:
        return None, None
    target = None if location is None else str(answer.response.url.join(location))
    return FileHead(sha, int(size), etag), target


async def fetch_card(
    get: Get, where: _Where, pin: Pin, tree: Sequence[_File]
) -> dict[str, Any] | None:
    """The repo card's YAML: from the pin request, else README.md (only if present)."""
    card = pin.card
    paths = {f.path for f in tree if "/" not in f.path}
    if not pin.card_known and "README.md" in paths:
        text = await fetch_text(get, where, "README.md")
        card = await anyio.to_thread.run_sync(_front_matter, text, f"{where.label}: README.md")
    if ".huggingface.yaml" in paths:
        # datasets merges the standalone YAML over the README's (load.py).
        text = await fetch_text(get, where, ".huggingface.yaml")
        extra = await anyio.to_thread.run_sync(
            _load_yaml, text, f"{where.label}: .huggingface.yaml"
        )
        if isinstance(extra, dict):
            card = {**(card or {}), **extra}
    return card


async def list_tree(get: Get, where: _Where, base: str, path: str | None) -> tuple[_File, ...]:
    """Every file below ``base``, from the pages of the recursive tree listing,
    bounded by ``MAX_TREE_PAGES``, ``MAX_TREE_FILES`` and ``MAX_TREE_BYTES``."""
    assert where.sha is not None
    url: str | None = f"{where.endpoint}/api/datasets/{where.repo}/tree/{where.sha}"
    if base:
        url = f"{url}/{quote(base, safe='')}"
    params: httpx2.QueryParams | None = httpx2.QueryParams(
        [("recursive", "true"), ("expand", "false")]
    )
    files: list[_File] = []
    paths: set[str] = set()
    seen: set[str] = set()
    received = 0
    while url is not None:
        if url in seen:
            raise ResolutionError(f"the tree listing of {where.label} loops at {url}")
        if len(seen) >= MAX_TREE_PAGES:
            raise ResolutionError(
                f"the tree listing of {where.label} goes on past {MAX_TREE_PAGES} pages "
                f"(MAX_TREE_PAGES), at {url}: refusing to follow it further"
            )
        seen.add(url)
        answer = await get(url, where, params=params, missing=path)
        params = None  # the next-page URL carries the query
        received += len(answer.body)
        if received > MAX_TREE_BYTES:
            raise ResolutionError(
                f"the tree listing of {where.label} is over {MAX_TREE_BYTES} bytes "
                f"(MAX_TREE_BYTES) after {len(seen)} pages: refusing to read more"
            )
        entries = json_body(answer.body, url)
        if not isinstance(entries, list):
            raise ResolutionError(f"GET {url} answered {type(entries).__name__}, not a list")
        following = next_page(answer.response, where, url)
        if not entries and following is not None:
            raise ResolutionError(
                f"GET {url}: a page of the tree listing of {where.label} is empty yet "
                "announces another: refusing to follow it"
            )
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
                raise ResolutionError(
                    f"GET {url}: malformed tree entry {_short(entry)} in {where.label}"
                )
            if entry["type"] != "file":
                continue  # folders, and kinds of entry a dataset has no use for
            f = _tree_file(entry, url, where, base)
            if f.path in paths:
                raise ResolutionError(
                    f"GET {url}: the tree listing of {where.label} lists {f.path!r} twice"
                )
            if len(files) >= MAX_TREE_FILES:
                raise ResolutionError(
                    f"the tree listing of {where.label} holds more than {MAX_TREE_FILES} "
                    "files (MAX_TREE_FILES): name a folder or a glob to list less"
                )
            paths.add(f.path)
            files.append(f)
        url = following
    files.sort(key=lambda f: f.path)
    return tuple(files)


async def fetch_text(get: Get, where: _Where, name: str) -> str:
    assert where.sha is not None
    url = f"{where.endpoint}/datasets/{where.repo}/resolve/{where.sha}/{quote(name)}"
    answer = await get(url, where, missing=name, body="text")
    try:
        return answer.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ResolutionError(f"{where.label}: {name} ({url}) is not UTF-8: {exc}") from exc


async def check_access(get: Get, where: _Where, url: str) -> None:
    """Fail early, with GatedRepoError, when the token cannot read a gated repo."""
    await get(url, where, method="HEAD", follow_redirects=False, body=None)


def http_error(
    response: httpx2.Response,
    where: _Where,
    missing: str | None,
    attempts: int,
    access: Access | None = None,
) -> ResolutionError:
    code = response.headers.get("x-error-code", "")
    status = response.status_code
    url = str(response.request.url)
    if code == "RepoNotFound" or (status == 401 and not code):
        if access is not None and access.token:
            fix = (
                f"the token (from {access.token_source or 'token='}) cannot read it: check "
                "the repo id, or use a token of an account that can read it"
            )
        else:
            fix = (
                "no token was sent: if it is private, pass token=, set HF_TOKEN or log in "
                "with `hf auth login`"
            )
        return RepoNotFoundError(
            f"dataset repo {where.repo!r} not found at {where.endpoint} (HTTP {status}); {fix}"
        )
    if code == "GatedRepo":
        return GatedRepoError(
            f"dataset repo {where.repo!r} is gated (HTTP {status}): request access at "
            f"{where.endpoint}/datasets/{where.repo} and pass a token that has it "
            "(token=, HF_TOKEN or `hf auth login`)"
        )
    if code == "RevisionNotFound":
        if where.sha is not None and where.sha != where.revision:
            return RevisionNotFoundError(
                f"commit {where.sha} (where {where.revision!r} pointed) is gone from dataset "
                f"repo {where.repo!r} at {where.endpoint}: the repo changed while it was "
                "resolved (or the server restarted): resolve it again"
            )
        return RevisionNotFoundError(
            f"revision {where.revision!r} not found in dataset repo {where.repo!r}: "
            "use a branch, tag or commit sha that exists"
        )
    if code == "EntryNotFound" and missing is not None:
        return EntryNotFoundError(f"{missing!r} not found in {where.label}")
    message = response.headers.get("x-error-message", "")
    tried = f" after {attempts} attempts" if attempts > 1 else ""
    return ResolutionError(
        f"{response.request.method} {url} failed with HTTP {status}{tried}"
        + (f": {message}" if message else "")
    )


def next_page(response: httpx2.Response, where: _Where, url: str) -> str | None:
    """The next page of a tree listing (``Link: <...>; rel="next"``), on the endpoint's
    origin only, or None."""
    link = response.links.get("next")
    if link is None:
        return None
    raw = link.get("url")
    try:
        if not raw:
            raise httpx2.InvalidURL("empty")
        target = response.url.join(raw)
        same = origin(str(target)) == origin(where.endpoint)
    except httpx2.InvalidURL as exc:
        raise ResolutionError(
            f"GET {url}: the tree listing of {where.label} announces a next page at "
            f"{_short(raw)}, not a valid URL: {exc}"
        ) from exc
    if not same:
        raise ResolutionError(
            f"GET {url}: the tree listing of {where.label} announces a next page at "
            f"{_short(raw)}, off {where.endpoint}: refusing to follow it"
        )
    return str(target)


def json_body(body: bytes, url: str) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ResolutionError(f"GET {url} answered something that is not UTF-8: {exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise ResolutionError(f"GET {url} answered something that is not JSON: {exc}") from exc


# -- reads ------------------------------------------------------------------------------------


class HubStore:
    """The Hub's files: listed by the resolver (configs and splits: ``_hub_layout`` with
    the functions above), read by the fetcher through ``/resolve/`` (``_transfer``)."""

    name = "hub"

    def read_error(self, refusal: Refusal) -> FetchError:
        """A read the Hub (or the CDN it sent us to) refused."""
        r = refusal
        if r.status == 404 and r.headers.get("X-Error-Code") == "RevisionNotFound":
            return r.error(
                f"HTTP 404 from {r.where}{r.note}: the Hub no longer has the commit it was "
                "resolved at (the repo changed, or the server restarted): resolve the "
                "source again, at a revision that exists"
            )
        if r.status == 404:
            return r.error(f"not found: HTTP 404 from {r.where}{r.note}")
        if r.status in (401, 403) and origin(r.url) == origin(r.access.endpoint):
            fix = (
                f"the token (from {r.access.token_source or 'token='}) cannot read it: "
                "request access to the repo or use another token"
                if r.access.token
                else "no token was sent: pass token=, set HF_TOKEN or log in with "
                "`hf auth login`, with a token that can read the repo"
            )
            return r.error(f"HTTP {r.status} from {r.where}{r.note}: {fix}")
        return r.error(f"HTTP {r.status} from {r.where}{r.note}")


STORE = HubStore()
