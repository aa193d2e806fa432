"""A bucket store of one module, as docs/design.md's "Adding a store" describes:
``tiny://BUCKET/KEY`` objects served over HTTP by ``TinyServer`` (a listing as JSON, ranges
of objects), every request signed with a shared secret. tests/test_stores.py registers it
and streams from it; nothing else in the library changes."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2

from aiostream_hf import AccessDeniedError, EntryNotFoundError, FetchError, SourceError, stores
from aiostream_hf._models import FileRef
from aiostream_hf._options import StreamOptions
from aiostream_hf._sources import BucketSource
from aiostream_hf.stores import Lister

SECRET = "tiny-secret"


class TinyContext:
    """Where the store is and the secret: signs the requests to it, and no other."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.signed = 0

    async def sign(self, request: httpx2.Request) -> None:
        if str(request.url).startswith(self.endpoint + "/"):
            request.headers["X-Tiny-Signature"] = SECRET
            self.signed += 1


class TinyStore:
    name = "tiny"
    scheme = "tiny"

    def __init__(self) -> None:
        self.contexts: list[TinyContext] = []

    def check_available(self) -> None:
        if not os.environ.get("TINY_ENDPOINT"):
            raise SourceError("tiny:// sources need TINY_ENDPOINT set to the store's URL")

    async def context(self, options: StreamOptions, what: str) -> TinyContext:
        ctx = TinyContext(os.environ["TINY_ENDPOINT"])
        self.contexts.append(ctx)
        return ctx

    async def resolve(self, sources: Sequence[BucketSource], lister: Lister) -> tuple[FileRef, ...]:
        ctx = await self.context(lister.options, sources[0].uri)
        bucket = sources[0].bucket

        def refused(response: httpx2.Response, body: bytes, attempts: int) -> Exception:
            if response.status_code == 404:
                return EntryNotFoundError(f"tiny://{bucket}: no such bucket")
            return AccessDeniedError(f"tiny://{bucket}: HTTP {response.status_code}")

        async def listed() -> list[list[Any]]:
            body = await lister.get(f"{ctx.endpoint}/{bucket}/", signer=ctx, refused=refused)
            return [[o["key"], o["size"], o["etag"]] for o in json.loads(body)]

        objects = await lister.once(("tiny", ctx.endpoint, bucket), listed, list, list)
        files = []
        for src in sources:
            pattern = lister.glob(src.key) if src.key else None
            for key, size, etag in objects:
                if pattern is None or pattern.match(key):
                    url = f"{ctx.endpoint}/{bucket}/{key}"
                    files.append(FileRef(url, f"tiny://{bucket}/{key}", size=size, etag=etag))
        return tuple(files)

    async def error_body(self, response: httpx2.Response) -> bytes:
        return (await response.aread())[:1024]

    def read_error(self, refusal: stores.Refusal) -> FetchError:
        why = refusal.body.decode(errors="replace")
        return refusal.error(f"the tiny store refused it: HTTP {refusal.status} ({why})")


STORE = TinyStore()


class TinyServer:
    """Serves ``root/BUCKET/KEY`` files: ``GET /BUCKET/`` lists them as JSON, ``GET
    /BUCKET/KEY`` with a Range gives the bytes; an unsigned request is a 403."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[tuple[str, bool]] = []  # (path, signed)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                signed = self.headers.get("X-Tiny-Signature") == SECRET
                server.requests.append((self.path, signed))
                if not signed:
                    return self._send(403, b"SignatureMissing", {})
                bucket, _, key = self.path.lstrip("/").partition("/")
                folder = server.root / bucket
                if not folder.is_dir():
                    return self._send(404, b"NoSuchBucket", {})
                if not key:
                    listing = [
                        {"key": p.name, "size": p.stat().st_size, "etag": _etag(p)}
                        for p in sorted(folder.iterdir())
                    ]
                    return self._send(200, json.dumps(listing).encode(), {})
                path = folder / key
                data = path.read_bytes()
                first, _, last = self.headers["Range"].removeprefix("bytes=").partition("-")
                if first:
                    start, end = int(first), min(int(last or len(data) - 1), len(data) - 1)
                else:
                    start, end = max(0, len(data) - int(last)), len(data) - 1
                headers = {
                    "Content-Range": f"bytes {start}-{end}/{len(data)}",
                    "ETag": f'"{_etag(path)}"',
                }
                return self._send(206, data[start : end + 1], headers)

            def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _etag(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()  # noqa: S324 - an ETag, as S3's
