"""The ASGI app of the local Hub server: Hub API, resolver, CDN, control endpoints.

The contract is ../shared/hub-emulator.md: what the real ``huggingface_hub`` and
``datasets`` clients need from the Hub, plus faults and rate limits on demand.
One app serves two sockets: the Hub (``http://localhost:P``) and the CDN
(``http://127.0.0.1:Q``), told apart by the port a request came in on.

Beside it: ``_hub_stats`` (the request counters, ``HubStats``), ``_hub_content``
(a file's served bytes: variants, ranges, conditions) and ``_hub_http`` (the ASGI
plumbing: the response record, JSON and error answers, reading a request).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode

import yaml

from ._faults import (
    ByteBucket,
    FaultDecision,
    FaultInjector,
    Faults,
    RateDecision,
    RateLimiter,
    RateLimits,
)
from ._hub_content import (
    _CHUNK,
    _CHUNK_UNPACED,
    DeliberateCut,
    _Content,
    _if_match,
    _mtime,
    _parse_range,
    _strong_match,
)
from ._hub_http import (
    Receive,
    Scope,
    Send,
    _bearer,
    _chunks,
    _client,
    _client_gone,
    _error,
    _json,
    _read_body,
    _Response,
    _split,
)
from ._hub_stats import HubStats, _Counters
from ._repos import RefSnapshot, RepoFile, RepoStore

__all__ = ["STARTED", "AccessRules", "DeliberateCut", "HubApp", "HubStats"]

#: The scope key HubApp sets as it begins a request (``HubServer`` looks for it).
STARTED = "aiostream_hf.started"

_LFS_POINTER_SIZE = 134


@dataclass(frozen=True)
class AccessRules:
    """Which tokens may read which private or gated repos."""

    private: Mapping[str, Sequence[str]] = field(default_factory=dict)
    gated: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def can_see(self, repo_id: str, token: str | None) -> bool:
        allowed = self.private.get(repo_id)
        return allowed is None or (token is not None and token in allowed)

    def can_read(self, repo_id: str, token: str | None) -> bool:
        allowed = self.gated.get(repo_id)
        return self.can_see(repo_id, token) and (
            allowed is None or (token is not None and token in allowed)
        )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _card_data(snap: RefSnapshot) -> dict[str, Any] | None:
    readme = snap.files.get("README.md")
    if readme is None:
        return None
    text = readme.disk_path.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return None
    end = text.find("\n---", 3)
    if end < 0:
        return None
    try:
        data = yaml.safe_load(text[3:end])
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


class HubApp:
    """The Hub and CDN as one ASGI app over a RepoStore."""

    def __init__(
        self,
        store: RepoStore,
        *,
        hub_url: str,
        cdn_url: str,
        cdn_port: int,
        faults: Faults,
        rate_limits: RateLimits,
        access: AccessRules,
        tree_page_size: int = 1000,
        tree_page_size_expand: int = 50,
        cdn_url_ttl_s: float = 3600.0,
        secret: bytes | None = None,
    ) -> None:
        self.store = store
        self.hub_url = hub_url
        self.cdn_url = cdn_url
        self.cdn_port = cdn_port
        self.injector = FaultInjector(faults)
        self.limiter = RateLimiter(rate_limits)
        self.access = access
        self.tree_page_size = tree_page_size
        self.tree_page_size_expand = tree_page_size_expand
        self.cdn_url_ttl_s = cdn_url_ttl_s
        self.secret = secret or os.urandom(16)
        self.counters = _Counters()
        # requests the server holds but has not begun to serve (HubServer sets it)
        self.waiting: Callable[[], int] = lambda: 0
        self._variant_lock = threading.Lock()
        self._variant_hashes: dict[tuple[str, str, int], tuple[str, str]] = {}
        self._bandwidth_lock = threading.Lock()
        self._bandwidth_next = 0.0

    # -- ASGI ----------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; websockets are not served
        scope[STARTED] = True  # this request is begun: ``waiting`` no longer counts it
        raw_path = scope.get("raw_path") or scope["path"].encode()
        path = raw_path.decode("latin-1").split("?", 1)[0]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        method = scope["method"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}

        if path.startswith("/_emulator/"):
            body = await _read_body(receive)
            response = self._control(method, path, body)
            await _send_uncounted(send, response)  # the control channel is not traffic
            return

        is_cdn = scope["server"] is not None and scope["server"][1] == self.cdn_port
        bucket = (
            "cdn"
            if is_cdn
            else "api"
            if path.startswith("/api/")
            else ("resolvers" if "/resolve/" in path else "pages")
        )
        c = self.counters
        with c.lock:
            c.requests += 1
            c.bump(c.by_bucket, bucket)
            c.concurrent += 1
            c.peak_concurrent = max(c.peak_concurrent, c.concurrent)
            if is_cdn and "authorization" in headers:
                c.cdn_authorized += 1
            c.paths.append(f"{'cdn' if is_cdn else 'hub'} {method} {path}")
            if scope.get("client"):
                host, port = scope["client"]
                c.peers.add((str(host), int(port)))
        try:
            faults = self.injector.faults
            if faults.latency_ms > 0:
                await asyncio.sleep(faults.latency_ms / 1000)
                self._count_fault("latency")
            body = await _read_body(receive)
            token = _bearer(headers)
            rate: RateDecision | None = None
            if not is_cdn:
                rate = self.limiter.check(token or _client(scope), bucket)
            decision = self.injector.decide(bucket, has_body=method == "GET")
            if rate is not None and not rate.allowed:
                response = _error(429, None, f"You have exceeded the rate limit for {bucket}.")
                response.headers["Retry-After"] = str(rate.reset_s)
                with c.lock:
                    c.throttled += 1
                endpoint = "rate_limited"
            elif decision.error:
                response = _error(
                    faults.error_status, None, "Injected server error (aiostream-hf emulator)"
                )
                self._count_fault("error")
                endpoint = "injected_error"
            elif decision.redirect_loop:
                query_string = scope.get("query_string", b"").decode("latin-1")
                here = f"{self.cdn_url if is_cdn else self.hub_url}{path}"
                response = _Response(
                    302, {"Location": f"{here}?{query_string}" if query_string else here}
                )
                self._count_fault("redirect_loop")
                endpoint = "redirect_loop"
            else:
                endpoint, response = self._route(method, path, query, headers, body, token, is_cdn)
                self._pad_api(bucket, endpoint, response)
            if rate is not None:
                response.headers["RateLimit"] = f'"{bucket}";r={rate.remaining};t={rate.reset_s}'
                response.headers["RateLimit-Policy"] = (
                    f'"fixed window";"{bucket}";q={rate.quota};w={rate.window_s}'
                )
            with c.lock:
                c.bump(c.by_endpoint, endpoint)
                c.bump(c.by_status, response.status)
            await self._send(send, receive, method, response, decision)
        finally:
            with c.lock:
                c.concurrent -= 1

    def _count_fault(self, kind: str) -> None:
        with self.counters.lock:
            self.counters.bump(self.counters.faults, kind)

    def _pad_api(self, bucket: str, endpoint: str, response: _Response) -> None:
        """Oversized API answers: trailing spaces (valid JSON) up to ``pad_api_bytes``."""
        faults = self.injector.faults
        target = faults.pad_api_bytes
        if (
            target is None
            or bucket != "api"
            or response.status != 200
            or endpoint not in faults.pad_api_endpoints
            or len(response.body) >= target
        ):
            return
        response.body += b" " * (target - len(response.body))
        self._count_fault("padded_api")

    async def _send(
        self,
        send: Send,
        receive: Receive,
        method: str,
        response: _Response,
        decision: FaultDecision,
    ) -> None:
        faults = self.injector.faults
        length = response.body_length
        announced = length
        if decision.length_lie:
            announced = max(0, length + faults.length_lie_bytes)
            self._count_fault("length_lie")
        headers = dict(response.headers)
        headers.setdefault("Content-Length", str(announced))
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()],
            }
        )
        if method == "HEAD" or announced == 0:
            await send({"type": "http.response.body", "body": b""})
            return
        if decision.slow_first_byte:
            self._count_fault("slow_first_byte")
            await asyncio.sleep(faults.slow_first_byte_ms / 1000)
        full = min(length, announced)  # an under-announcing lie sends what it announced
        limit = int(full * faults.cut_fraction) if decision.cut else full
        piece = faults.trickle_bytes if decision.trickle else 0
        if piece:
            self._count_fault("trickle")
        started = time.monotonic()
        sent = 0
        paced = faults.bandwidth_per_connection or faults.bandwidth_total
        for chunk in _chunks(response, limit, _CHUNK if paced else _CHUNK_UNPACED):
            for part in _split(chunk, piece):
                await send({"type": "http.response.body", "body": part, "more_body": True})
                sent += len(part)
                with self.counters.lock:
                    self.counters.bytes_served += len(part)
                if not piece:
                    await self._pace(len(part), sent, started, faults)
                elif await _client_gone(receive, faults.trickle_interval_ms / 1000):
                    return  # a trickle lasts as long as its client waits
        if decision.cut:
            self._count_fault("cut")
            raise DeliberateCut(f"injected cut after {sent} of {length} bytes")
        if sent < announced:
            raise DeliberateCut(f"Content-Length said {announced}: closed after {sent} bytes")
        await send({"type": "http.response.body", "body": b""})

    async def _pace(self, n: int, sent: int, started: float, faults: Faults) -> None:
        delay = 0.0
        now = time.monotonic()
        if faults.bandwidth_per_connection:
            delay = max(delay, started + sent / faults.bandwidth_per_connection - now)
        if faults.bandwidth_total:
            with self._bandwidth_lock:
                slot = max(now, self._bandwidth_next) + n / faults.bandwidth_total
                self._bandwidth_next = slot
            delay = max(delay, slot - now)
        if delay > 0:
            await asyncio.sleep(delay)

    # -- control -------------------------------------------------------------

    def stats(self) -> HubStats:
        return self.counters.snapshot(self.waiting())

    def _control(self, method: str, path: str, body: bytes) -> _Response:
        if path == "/_emulator/stats" and method == "GET":
            return _json(200, self.stats().to_json())
        if path == "/_emulator/reset" and method == "POST":
            with self.counters.lock:
                self.counters.reset()
            return _json(200, {"ok": True})
        if path == "/_emulator/faults" and method in ("POST", "PUT"):
            try:
                self.injector.replace(Faults.from_json(json.loads(body or b"{}")))
            except Exception as exc:  # bad control input: answer 400, keep serving
                return _error(400, None, str(exc))
            return _json(200, self.injector.faults.to_json())
        if path == "/_emulator/rate-limits" and method in ("POST", "PUT"):
            try:
                self.limiter.replace(RateLimits(**json.loads(body or b"{}")))
            except Exception as exc:
                return _error(400, None, str(exc))
            return _json(200, {"ok": True})
        return _error(404, None, f"unknown emulator endpoint {method} {path}")

    # -- routing -------------------------------------------------------------

    def _route(
        self,
        method: str,
        path: str,
        query: Mapping[str, list[str]],
        headers: Mapping[str, str],
        body: bytes,
        token: str | None,
        is_cdn: bool,
    ) -> tuple[str, _Response]:
        parts = path.strip("/").split("/")
        if is_cdn:
            return "cdn", self._cdn(method, parts, query, headers)
        if len(parts) >= 4 and parts[:2] == ["api", "datasets"]:
            repo_id = f"{unquote(parts[2])}/{unquote(parts[3])}"
            rest = parts[4:]
            if not rest and method == "GET":
                return "dataset_info", self._info(repo_id, "main", query, token)
            if rest[:1] == ["revision"] and len(rest) >= 2 and method == "GET":
                rev, _ = _split_revision(rest[1:])
                return "dataset_info", self._info(repo_id, rev, query, token)
            if rest[:1] == ["tree"] and len(rest) >= 2 and method == "GET":
                rev, tail = _split_revision(rest[1:])
                sub = unquote("/".join(tail)).strip("/")
                return "tree", self._tree(repo_id, rev, sub, query, token)
            if rest[:1] == ["paths-info"] and len(rest) >= 2 and method == "POST":
                rev, _ = _split_revision(rest[1:])
                return "paths_info", self._paths_info(repo_id, rev, headers, body, token)
            if rest == ["refs"] and method == "GET":
                return "refs", self._refs(repo_id, token)
        if (
            len(parts) >= 6
            and parts[0] == "datasets"
            and parts[3] == "resolve"
            and method in ("GET", "HEAD")
        ):
            repo_id = f"{unquote(parts[1])}/{unquote(parts[2])}"
            rev, tail = _split_revision(parts[4:])
            return "resolve", self._resolve(repo_id, rev, unquote("/".join(tail)), headers, token)
        return "not_found", _error(404, None, f"Sorry, we can't find the page {path}.")

    def _check_repo(
        self, repo_id: str, revision: str, token: str | None, *, path: str | None = None
    ) -> RefSnapshot | _Response:
        if self.store.refs(repo_id) is None or not self.access.can_see(repo_id, token):
            status = 401 if token is None else 404
            return _error(status, "RepoNotFound", "Repository not found")
        snap = self.store.resolve(repo_id, revision, path=path)
        if snap is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return snap

    def _info(
        self, repo_id: str, revision: str, query: Mapping[str, list[str]], token: str | None
    ) -> _Response:
        snap = self._check_repo(repo_id, revision, token)
        if isinstance(snap, _Response):
            return snap
        blobs = query.get("blobs", ["false"])[-1].lower() == "true"
        siblings = []
        for f in snap.files.values():
            entry: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                entry.update(size=f.size, blobId=f.oid)
                if f.lfs:
                    entry["lfs"] = {
                        "sha256": f.sha256,
                        "size": f.size,
                        "pointerSize": _LFS_POINTER_SIZE,
                    }
            siblings.append(entry)
        for hostile in self._hostile_entries():
            entry = {"rfilename": hostile["path"]}
            if blobs:
                entry.update(size=hostile["size"], blobId=hostile["oid"])
            siblings.append(entry)
        org = repo_id.split("/")[0]
        data: dict[str, Any] = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "author": org,
            "sha": snap.commit,
            "lastModified": _iso(snap.mtime),
            "createdAt": _iso(snap.mtime),
            "private": repo_id in self.access.private,
            "gated": "manual" if repo_id in self.access.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "usedStorage": sum(f.size for f in snap.files.values()),
        }
        card = _card_data(snap)
        if card is not None:
            data["cardData"] = card
        return _json(200, data)

    def _hostile_entries(self) -> list[dict[str, Any]]:
        """Tree entries with the hostile paths of ``Faults.hostile_tree_paths``."""
        return [_made_up_entry(p) for p in self.injector.faults.hostile_tree_paths]

    def _entry(
        self, snap: RefSnapshot, item: RepoFile | str | dict[str, Any], expand: bool
    ) -> dict[str, Any]:
        if isinstance(item, dict):
            return item
        if isinstance(item, str):
            entry: dict[str, Any] = {
                "type": "directory",
                "oid": snap.tree_oid(item),
                "size": 0,
                "path": item,
            }
        else:
            entry = {"type": "file", "oid": item.oid, "size": item.size, "path": item.path}
            if item.lfs:
                entry["lfs"] = {
                    "oid": item.sha256,
                    "size": item.size,
                    "pointerSize": _LFS_POINTER_SIZE,
                }
        if expand:
            entry["lastCommit"] = {
                "id": snap.commit,
                "title": "Upload files",
                "date": _iso(snap.mtime),
            }
        return entry

    def _tree(
        self,
        repo_id: str,
        revision: str,
        sub: str,
        query: Mapping[str, list[str]],
        token: str | None,
    ) -> _Response:
        snap = self._check_repo(repo_id, revision, token)
        if isinstance(snap, _Response):
            return snap
        if sub and sub not in snap.directories:
            return _error(
                404,
                "EntryNotFound",
                f"{sub} does not exist on {revision}",
                **{"X-Repo-Commit": snap.commit},
            )
        recursive = query.get("recursive", ["false"])[-1].lower() == "true"
        expand = query.get("expand", ["false"])[-1].lower() == "true"
        entries: list[RepoFile | str | dict[str, Any]] = [
            *snap.entries(sub, recursive=recursive),
            *self._hostile_entries(),
        ]
        size = self.tree_page_size_expand if expand else self.tree_page_size
        cursor = query.get("cursor", [""])[-1]
        try:
            offset = int(base64.urlsafe_b64decode(cursor.encode()).decode()) if cursor else 0
        except ValueError:
            return _error(400, None, f"invalid cursor {cursor!r}")
        if offset < 0:
            return _error(400, None, f"invalid cursor {cursor!r}")
        endless = self.injector.faults.endless_pages
        if offset < len(entries) or endless is None:
            page = [self._entry(snap, e, expand) for e in entries[offset : offset + size]]
        else:
            page = self._endless_page(snap, entries, offset, size, sub, expand)
        headers: dict[str, str] = {}
        if offset + size < len(entries) or endless is not None:
            next_cursor = base64.urlsafe_b64encode(str(offset + size).encode()).decode()
            params = {k: v[-1] for k, v in query.items() if k != "cursor"}
            params["cursor"] = next_cursor
            rev_q = quote(revision, safe="")
            sub_q = "/" + quote(sub, safe="") if sub else ""
            url = f"{self.hub_url}/api/datasets/{repo_id}/tree/{rev_q}{sub_q}?{urlencode(params)}"
            headers["Link"] = f'<{url}>; rel="next"'
        return _json(200, page, headers)

    def _endless_page(
        self,
        snap: RefSnapshot,
        entries: Sequence[RepoFile | str | dict[str, Any]],
        offset: int,
        size: int,
        sub: str,
        expand: bool,
    ) -> list[dict[str, Any]]:
        """A page past the end of a listing that never ends (``Faults.endless_pages``)."""
        self._count_fault("endless_page")
        mode = self.injector.faults.endless_pages
        if mode == "fresh":
            prefix = f"{sub}/" if sub else ""
            return [_made_up_entry(f"{prefix}endless-{offset + i:09d}.txt") for i in range(size)]
        if mode == "empty" or not entries:
            return []
        # "repeat": the pages start over from the first one.
        real_end = -(-len(entries) // size) * size
        start = (offset - real_end) % real_end
        return [self._entry(snap, e, expand) for e in entries[start : start + size]]

    def _paths_info(
        self,
        repo_id: str,
        revision: str,
        headers: Mapping[str, str],
        body: bytes,
        token: str | None,
    ) -> _Response:
        snap = self._check_repo(repo_id, revision, token)
        if isinstance(snap, _Response):
            return snap
        content_type = headers.get("content-type", "")
        try:
            if "json" in content_type:
                data = json.loads(body or b"{}")
                paths, expand = list(data.get("paths", [])), bool(data.get("expand", False))
            else:
                form = parse_qs(body.decode(), keep_blank_values=True)
                paths = form.get("paths", [])
                expand = form.get("expand", ["false"])[-1].lower() == "true"
        except (ValueError, AttributeError) as exc:
            return _error(400, None, f"paths-info: malformed body: {exc}")
        found: list[dict[str, Any]] = []
        hostile = {e["path"]: e for e in self._hostile_entries()}
        for p in paths:
            if p in hostile:
                found.append(hostile[p])
                continue
            p = p.strip("/")
            if p in snap.files:
                found.append(self._entry(snap, snap.files[p], expand))
            elif p in snap.directories:
                found.append(self._entry(snap, p, expand))
        return _json(200, found)

    def _refs(self, repo_id: str, token: str | None) -> _Response:
        snap = self._check_repo(repo_id, "main", token)
        if isinstance(snap, _Response):
            return snap
        refs = self.store.refs(repo_id) or {}
        out: dict[str, list[dict[str, str]]] = {"branches": [], "converts": [], "tags": []}
        for ref in sorted(refs):
            s = self.store.snapshot(repo_id, ref)
            if s is None:
                continue
            if ref.startswith("refs/convert/"):
                kind, name, full = "converts", ref.removeprefix("refs/convert/"), ref
            elif ref.startswith("refs/tags/"):
                kind, name, full = "tags", ref.removeprefix("refs/tags/"), ref
            else:
                kind, name, full = "branches", ref, f"refs/heads/{ref}"
            out[kind].append({"name": name, "ref": full, "targetCommit": s.commit})
        return _json(200, out)

    def _resolve(
        self,
        repo_id: str,
        revision: str,
        path: str,
        headers: Mapping[str, str],
        token: str | None,
    ) -> _Response:
        snap = self._check_repo(repo_id, revision, token, path=path)
        if isinstance(snap, _Response):
            return snap
        commit = {"X-Repo-Commit": snap.commit}
        if not self.access.can_read(repo_id, token):
            status = 401 if token is None else 403
            return _error(
                status, "GatedRepo", f"Access to dataset {repo_id} is restricted.", **commit
            )
        f = snap.files.get(path)
        if f is None:
            return _error(404, "EntryNotFound", f"Entry not found: {path}", **commit)
        if f.lfs:
            # The Hub describes what the CDN serves next (a replaced file, say).
            linked = self._content(repo_id, f, count=False)
            etag = self._etag(linked)
            return _Response(
                302,
                {
                    **commit,
                    "Location": self.sign_cdn_url(snap, f),
                    "X-Linked-Etag": f'"{etag}"',
                    "X-Linked-Size": str(linked.size),
                    "ETag": f'"{etag}"',
                    "Accept-Ranges": "bytes",
                },
            )
        content = self._content(repo_id, f, count=True)
        return self._serve("resolvers", content, headers, commit)

    # -- the bytes of a file -------------------------------------------------

    def _content(self, repo_id: str, f: RepoFile, *, count: bool) -> _Content:
        """What is served for a file now; ``count``: this request serves it."""
        faults = self.injector.faults
        if self.injector.replaced(repo_id, f.path, count=count):
            if count:
                self._count_fault("replaced")
            size = f.size if faults.replace_size is None else faults.replace_size
            return _Content(f, size, "replaced")
        pad = faults.pad_text_bytes
        if (
            pad is not None
            and f.size < pad
            and f.path in {p.strip("/") for p in faults.pad_text_paths}
        ):
            if count:
                self._count_fault("padded_text")
            return _Content(f, pad, "padded")
        return _Content(f, f.size)

    def _etag(self, content: _Content) -> str:
        """The ETag value of what is served: sha256 for LFS files, git oid otherwise."""
        f = content.file
        if content.kind == "disk" or (
            content.kind == "replaced" and self.injector.faults.replace_keeps_etag
        ):
            return f.etag  # a lying CDN: other bytes under the old ETag
        key = (f.oid, content.kind, content.size)
        with self._variant_lock:
            found = self._variant_hashes.get(key)
        if found is None:
            git = hashlib.sha1(f"blob {content.size}\0".encode())
            sha = hashlib.sha256()
            for chunk in content.chunks(0, content.size):
                git.update(chunk)
                sha.update(chunk)
            found = (git.hexdigest(), sha.hexdigest())
            with self._variant_lock:
                if len(self._variant_hashes) >= 256:  # bounded
                    self._variant_hashes.clear()
                self._variant_hashes[key] = found
        return found[1] if f.lfs else found[0]

    def _serve(
        self,
        bucket: ByteBucket,
        content: _Content,
        headers: Mapping[str, str],
        extra: Mapping[str, str],
        *,
        gone: bool = False,
    ) -> _Response:
        """An answer with a file's bytes: validators, If-Match, If-Range and Range."""
        faults = self.injector.faults
        style = faults.etag_style if bucket in faults.etag_targets else "strong"
        etag = self._etag(content)
        validators: dict[str, str] = {}
        if style == "strong":
            validators["ETag"] = f'"{etag}"'
        elif style == "weak":
            validators["ETag"] = f'W/"{etag}"'
        if faults.last_modified or bucket not in faults.etag_targets:
            validators["Last-Modified"] = formatdate(_mtime(content), usegmt=True)
        strong = etag if style == "strong" else None
        conditional = style != "none"  # a server without validators ignores conditions
        if_match = headers.get("if-match")
        if (
            if_match is not None
            and conditional
            and bucket not in faults.ignore_if_match
            and not _if_match(if_match, strong)
        ):
            return _Response(412, {**extra, **validators}, b"<Error>PreconditionFailed</Error>")
        if gone:
            # The signed blob was replaced on disk: a content-addressed CDN would not have it.
            return _Response(410, {**extra, **validators}, b"<Error>BlobGone</Error>")
        base = {
            **extra,
            **validators,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if_range = headers.get("if-range")
        range_header = headers.get("range")
        if range_header is not None and (
            if_range is None or not conditional or _strong_match(if_range, strong)
        ):
            r = _parse_range(range_header, content.size)
            if r == "unsatisfiable":
                return _Response(416, {**base, "Content-Range": f"bytes */{content.size}"})
            if isinstance(r, tuple):
                start, end = r
                return _Response(
                    206,
                    {**base, "Content-Range": f"bytes {start}-{end - 1}/{content.size}"},
                    content=content,
                    start=start,
                    length=end - start,
                )
        return _Response(200, base, content=content, start=0, length=content.size)

    # -- CDN -----------------------------------------------------------------

    def sign_cdn_url(self, snap: RefSnapshot, f: RepoFile) -> str:
        expires = int(time.time() + self.cdn_url_ttl_s)
        path = f"/lfs/datasets/{snap.repo_id}/{f.sha256}"
        params = {"ref": snap.ref, "path": f.path, "expires": str(expires)}
        params["sig"] = self._signature(path, params)
        return f"{self.cdn_url}{path}?{urlencode(params)}"

    def _signature(self, path: str, params: Mapping[str, str]) -> str:
        msg = f"{path}|{params['ref']}|{params['path']}|{params['expires']}".encode()
        return hmac.new(self.secret, msg, hashlib.sha256).hexdigest()

    def _cdn(
        self,
        method: str,
        parts: list[str],
        query: Mapping[str, list[str]],
        headers: Mapping[str, str],
    ) -> _Response:
        denied = _Response(403, {"Content-Type": "application/xml"}, b"<Error>AccessDenied</Error>")
        if method not in ("GET", "HEAD") or len(parts) != 5 or parts[:2] != ["lfs", "datasets"]:
            return denied
        params = {k: v[-1] for k, v in query.items()}
        if not {"ref", "path", "expires", "sig"} <= params.keys():
            return denied
        path = "/" + "/".join(parts)
        if not hmac.compare_digest(self._signature(path, params), params["sig"]):
            return denied
        try:
            if int(params["expires"]) < time.time():
                return _Response(
                    403, {"Content-Type": "application/xml"}, b"<Error>Expired</Error>"
                )
        except ValueError:
            return denied
        repo_id = f"{parts[2]}/{parts[3]}"
        snap = self.store.snapshot(repo_id, params["ref"], path=params["path"])
        f = snap.files.get(params["path"]) if snap is not None else None
        if f is None:
            return _Response(404, {"Content-Type": "application/xml"}, b"<Error>NoSuchKey</Error>")
        content = self._content(repo_id, f, count=True)
        return self._serve("cdn", content, headers, {}, gone=f.sha256 != parts[4])


def _made_up_entry(path: str) -> dict[str, Any]:
    """A tree entry of a file that is not in the repo (hostile or endless listings)."""
    return {
        "type": "file",
        "oid": hashlib.sha1(path.encode()).hexdigest(),
        "size": 1,
        "path": path,
    }


def _split_revision(parts: Sequence[str]) -> tuple[str, list[str]]:
    """The revision (quoted or not; refs/convert/X and refs/pr/N span 3 parts) and the rest."""
    first = unquote(parts[0])
    if first == "refs" and len(parts) >= 3 and parts[1] in ("convert", "pr", "tags", "heads"):
        rev = f"refs/{unquote(parts[1])}/{unquote(parts[2])}"
        rest = list(parts[3:])
    else:
        rev, rest = first, list(parts[1:])
    return rev.removeprefix("refs/heads/"), rest


async def _send_uncounted(send: Send, response: _Response) -> None:
    headers = {**response.headers, "Content-Length": str(len(response.body))}
    await send(
        {
            "type": "http.response.start",
            "status": response.status,
            "headers": [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()],
        }
    )
    await send({"type": "http.response.body", "body": response.body})
