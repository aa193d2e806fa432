"""The ASGI app of the local Hub server: Hub API, resolver, CDN, control endpoints.

The contract is ../shared/hub-emulator.md: what the real ``huggingface_hub`` and
``datasets`` clients need from the Hub, plus faults and rate limits on demand.
One app serves two sockets: the Hub (``http://localhost:P``) and the CDN
(``http://127.0.0.1:Q``), told apart by the port a request came in on.
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
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode

import yaml

from ._faults import FaultDecision, FaultInjector, Faults, RateDecision, RateLimiter, RateLimits
from ._repos import RefSnapshot, RepoFile, RepoStore

__all__ = ["AccessRules", "DeliberateCut", "HubApp", "HubStats"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_CHUNK = 64 * 1024
_LFS_POINTER_SIZE = 134


class DeliberateCut(Exception):
    """Raised inside the app to close a connection mid-body (an injected fault)."""


@dataclass(frozen=True)
class HubStats:
    """Counts since start (or the last reset), read with ``HubServer.stats()``."""

    requests: int
    by_bucket: Mapping[str, int]
    by_endpoint: Mapping[str, int]
    by_status: Mapping[int, int]
    bytes_served: int
    peak_concurrent: int
    throttled: int
    faults: Mapping[str, int]
    connections: int = 0  # distinct client connections (peer address and port) seen

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_bucket": dict(self.by_bucket),
            "by_endpoint": dict(self.by_endpoint),
            "by_status": {str(k): v for k, v in self.by_status.items()},
            "bytes_served": self.bytes_served,
            "peak_concurrent": self.peak_concurrent,
            "throttled": self.throttled,
            "faults": dict(self.faults),
            "connections": self.connections,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HubStats:
        return cls(
            requests=data["requests"],
            by_bucket=data["by_bucket"],
            by_endpoint=data["by_endpoint"],
            by_status={int(k): v for k, v in data["by_status"].items()},
            bytes_served=data["bytes_served"],
            peak_concurrent=data["peak_concurrent"],
            throttled=data["throttled"],
            faults=data["faults"],
            connections=data.get("connections", 0),
        )


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


class _Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.by_bucket: dict[str, int] = {}
        self.by_endpoint: dict[str, int] = {}
        self.by_status: dict[int, int] = {}
        self.bytes_served = 0
        self.concurrent = 0
        self.peak_concurrent = 0
        self.throttled = 0
        self.faults: dict[str, int] = {}
        self.peers: set[tuple[str, int]] = set()  # bounded by the ports of one host

    def bump(self, table: dict[Any, int], key: Any, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n

    def snapshot(self) -> HubStats:
        with self.lock:
            return HubStats(
                self.requests,
                dict(self.by_bucket),
                dict(self.by_endpoint),
                dict(self.by_status),
                self.bytes_served,
                self.peak_concurrent,
                self.throttled,
                dict(self.faults),
                len(self.peers),
            )


@dataclass
class _Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    file: RepoFile | None = None  # body from disk: file[start:start+length]
    start: int = 0
    length: int = 0

    @property
    def body_length(self) -> int:
        return self.length if self.file is not None else len(self.body)


def _json(status: int, data: Any, headers: Mapping[str, str] | None = None) -> _Response:
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    return _Response(status, h, json.dumps(data).encode())


def _error(status: int, code: str | None, message: str, **headers: str) -> _Response:
    h = {"X-Error-Message": message, **headers}
    if code:
        h["X-Error-Code"] = code
    return _json(status, {"error": message}, h)


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
        self._bandwidth_lock = threading.Lock()
        self._bandwidth_next = 0.0

    # -- ASGI ----------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; websockets are not served
        raw_path = scope.get("raw_path") or scope["path"].encode()
        path = raw_path.decode("latin-1").split("?", 1)[0]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        method = scope["method"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}

        if path.startswith("/_emulator/"):
            body = await _read_body(receive)
            await self._send(send, method, self._control(method, path, body), FaultDecision())
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
            else:
                endpoint, response = self._route(method, path, query, headers, body, token, is_cdn)
            if rate is not None:
                response.headers["RateLimit"] = f'"{bucket}";r={rate.remaining};t={rate.reset_s}'
                response.headers["RateLimit-Policy"] = (
                    f'"fixed window";"{bucket}";q={rate.quota};w={rate.window_s}'
                )
            with c.lock:
                c.bump(c.by_endpoint, endpoint)
                c.bump(c.by_status, response.status)
            await self._send(send, method, response, decision)
        finally:
            with c.lock:
                c.concurrent -= 1

    def _count_fault(self, kind: str) -> None:
        with self.counters.lock:
            self.counters.bump(self.counters.faults, kind)

    async def _send(
        self, send: Send, method: str, response: _Response, decision: FaultDecision
    ) -> None:
        length = response.body_length
        headers = dict(response.headers)
        headers.setdefault("Content-Length", str(length))
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()],
            }
        )
        if method == "HEAD" or length == 0:
            await send({"type": "http.response.body", "body": b""})
            return
        faults = self.injector.faults
        if decision.slow_first_byte:
            self._count_fault("slow_first_byte")
            await asyncio.sleep(faults.slow_first_byte_ms / 1000)
        limit = int(length * faults.cut_fraction) if decision.cut else length
        started = time.monotonic()
        sent = 0
        for chunk in _chunks(response, limit):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            sent += len(chunk)
            with self.counters.lock:
                self.counters.bytes_served += len(chunk)
            await self._pace(len(chunk), sent, started, faults)
        if decision.cut:
            self._count_fault("cut")
            raise DeliberateCut(f"injected cut after {sent} of {length} bytes")
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

    def _control(self, method: str, path: str, body: bytes) -> _Response:
        if path == "/_emulator/stats" and method == "GET":
            return _json(200, self.counters.snapshot().to_json())
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

    def _entry(self, snap: RefSnapshot, item: RepoFile | str, expand: bool) -> dict[str, Any]:
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
        entries = snap.entries(sub, recursive=recursive)
        size = self.tree_page_size_expand if expand else self.tree_page_size
        cursor = query.get("cursor", [""])[-1]
        try:
            offset = int(base64.urlsafe_b64decode(cursor.encode()).decode()) if cursor else 0
        except ValueError:
            return _error(400, None, f"invalid cursor {cursor!r}")
        page = entries[offset : offset + size]
        headers: dict[str, str] = {}
        if offset + size < len(entries):
            next_cursor = base64.urlsafe_b64encode(str(offset + size).encode()).decode()
            params = {k: v[-1] for k, v in query.items() if k != "cursor"}
            params["cursor"] = next_cursor
            rev_q = quote(revision, safe="")
            sub_q = "/" + quote(sub, safe="") if sub else ""
            url = f"{self.hub_url}/api/datasets/{repo_id}/tree/{rev_q}{sub_q}?{urlencode(params)}"
            headers["Link"] = f'<{url}>; rel="next"'
        return _json(200, [self._entry(snap, e, expand) for e in page], headers)

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
        for p in paths:
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
            return _Response(
                302,
                {
                    **commit,
                    "Location": self.sign_cdn_url(snap, f),
                    "X-Linked-Etag": f'"{f.sha256}"',
                    "X-Linked-Size": str(f.size),
                    "ETag": f'"{f.sha256}"',
                    "Accept-Ranges": "bytes",
                },
            )
        return _serve_file(f, headers, {**commit, "ETag": f'"{f.oid}"'})

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
        etag = f'"{f.sha256}"'
        if_match = headers.get("if-match")
        if if_match is not None and not _etag_matches(if_match, f.sha256):
            return _Response(412, {"ETag": etag}, b"<Error>PreconditionFailed</Error>")
        if f.sha256 != parts[4]:
            # The signed blob was replaced: a content-addressed CDN would not have it.
            return _Response(410, {"ETag": etag}, b"<Error>BlobGone</Error>")
        return _serve_file(f, headers, {"ETag": etag})


def _serve_file(f: RepoFile, headers: Mapping[str, str], extra: Mapping[str, str]) -> _Response:
    base = {**extra, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
    if_range = headers.get("if-range")
    range_header = headers.get("range")
    if range_header is not None and (
        if_range is None or _etag_matches(if_range, extra["ETag"].strip('"'))
    ):
        r = _parse_range(range_header, f.size)
        if r == "unsatisfiable":
            return _Response(416, {**base, "Content-Range": f"bytes */{f.size}"})
        if isinstance(r, tuple):
            start, end = r
            return _Response(
                206,
                {**base, "Content-Range": f"bytes {start}-{end - 1}/{f.size}"},
                file=f,
                start=start,
                length=end - start,
            )
    return _Response(200, base, file=f, start=0, length=f.size)


def _etag_matches(header: str, etag: str) -> bool:
    candidates = [c.strip().removeprefix("W/").strip('"') for c in header.split(",")]
    return "*" in candidates or etag in candidates


def _chunks(response: _Response, limit: int) -> Any:
    if response.file is None:
        if limit > 0:
            yield response.body[:limit]
        return
    with response.file.disk_path.open("rb") as fh:
        fh.seek(response.start)
        remaining = limit
        while remaining > 0:
            chunk = fh.read(min(_CHUNK, remaining))
            if not chunk:
                raise DeliberateCut("file shrank on disk while it was served")
            remaining -= len(chunk)
            yield chunk


def _split_revision(parts: Sequence[str]) -> tuple[str, list[str]]:
    """The revision (quoted or not; refs/convert/X and refs/pr/N span 3 parts) and the rest."""
    first = unquote(parts[0])
    if first == "refs" and len(parts) >= 3 and parts[1] in ("convert", "pr", "tags", "heads"):
        rev = f"refs/{unquote(parts[1])}/{unquote(parts[2])}"
        rest = list(parts[3:])
    else:
        rev, rest = first, list(parts[1:])
    return rev.removeprefix("refs/heads/"), rest


def _bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization", "")
    if value.lower().startswith("bearer "):
        return value[7:].strip() or None
    return None


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "anonymous"


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > 16 * 1024 * 1024:
            raise ValueError("request body over 16 MiB")  # bounded: no API body is this large
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
