"""s3:// sources against a hostile S3 endpoint: a loopback HTTP server answering the XML
a test gives it (a listing or an error), recording every request.

No DTD is parsed, in any encoding: an entity could turn into a key (and the stream would
read the object it names) or expand a small answer into gigabytes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import aiostream_hf as ash
from aiostream_hf.stores import s3 as _s3

pytestmark = pytest.mark.anyio

NS = "http://s3.amazonaws.com/doc/2006-03-01/"


@dataclass
class _Endpoint:
    url: str
    status: int = 200
    body: bytes = b""
    paths: list[str] = field(default_factory=list)


@pytest.fixture
def endpoint() -> Iterator[_Endpoint]:
    """A store that answers every listing with ``status`` and ``body``, and every object
    read with ten bytes."""
    state = _Endpoint(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            state.paths.append(self.path)
            listing = "list-type=2" in self.path
            status, body = (state.status, state.body) if listing else (200, b"0123456789")
            self.send_response(status)
            self.send_header("Content-Type", "application/xml" if listing else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _options(endpoint: _Endpoint) -> ash.StreamOptions:
    return ash.StreamOptions(s3_endpoint_url=endpoint.url, s3_anonymous=True, max_retries=0)


async def _collect(s: ash.Stream) -> list[Any]:
    async with s:
        return [x async for x in s]


def _entity_listing(declaration: str, references: int = 1) -> str:
    """A listing whose one key is ``p/`` followed by entity ``a`` (``secret``) repeated, then
    ``.parquet``: a key the stream would read."""
    return (
        f"{declaration}<!DOCTYPE ListBucketResult [<!ENTITY a 'secret'>]>"
        f'<ListBucketResult xmlns="{NS}"><IsTruncated>false</IsTruncated>'
        f'<Contents><Key>p/{"&a;" * references}.parquet</Key><Size>10</Size><ETag>"e"</ETag>'
        "</Contents></ListBucketResult>"
    )


_UTF16 = '<?xml version="1.0" encoding="UTF-16"?>'


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_entity_listing("").encode("utf-8"), id="utf-8"),
        pytest.param(_entity_listing(_UTF16).encode("utf-16-le"), id="utf-16-le-declared"),
        pytest.param(_entity_listing(_UTF16).encode("utf-16-be"), id="utf-16-be-declared"),
        pytest.param(b"\xff\xfe" + _entity_listing("").encode("utf-16-le"), id="utf-16-le-bom"),
        pytest.param(b"\xfe\xff" + _entity_listing("").encode("utf-16-be"), id="utf-16-be-bom"),
        pytest.param(
            _entity_listing('<?xml version="1.0" encoding="UTF-32"?>').encode("utf-32"),
            id="utf-32",
        ),
        # 12 bytes of reference per 6 characters of text: 12 MB would expand to 1.1 GB
        # with a 500-character entity; this one is smaller but just as refused.
        pytest.param(_entity_listing(_UTF16, references=20_000).encode("utf-16"), id="utf-16-bomb"),
    ],
)
async def test_a_listing_with_a_dtd_in_any_encoding_is_refused(
    endpoint: _Endpoint, body: bytes
) -> None:
    endpoint.body = body
    with pytest.raises(ash.ResolutionError) as info:
        await _collect(ash.stream("s3://bkt/p/", options=_options(endpoint)))
    message = str(info.value)
    assert f"GET {endpoint.url}/bkt" in message
    assert " answered " in message
    assert "<!DOCTYPE>" in message or "malformed XML" in message
    assert "secret" not in message
    assert all("list-type=2" in p for p in endpoint.paths)  # no object was read


async def test_an_error_answer_with_a_dtd_says_nothing_it_declares(endpoint: _Endpoint) -> None:
    """An entity in an error answer could make a 403 read as any error: the code is not
    believed, the status is."""
    endpoint.status = 403
    endpoint.body = (
        f"{_UTF16}<!DOCTYPE Error [<!ENTITY c 'NoSuchBucket'>]>"
        "<Error><Code>&c;</Code><Message>&c;</Message></Error>"
    ).encode("utf-16")
    with pytest.raises(ash.AccessDeniedError, match="access denied, HTTP 403") as info:
        await _collect(ash.stream("s3://bkt/p/", options=_options(endpoint)))
    assert "NoSuchBucket" not in str(info.value)
    assert _s3.error_code(endpoint.body) == ("", "", "")
    # Without the DTD, the same answer in UTF-16 is read.
    plain = f"{_UTF16}<Error><Code>NoSuchBucket</Code></Error>".encode("utf-16")
    assert _s3.error_code(plain) == ("NoSuchBucket", "", "")


async def test_a_glob_that_backtracks_as_a_regex_chooses_among_long_keys(
    endpoint: _Endpoint,
) -> None:
    """Keys of 1,000 '-' and a glob of four stars: a backtracking regex would try every
    way to place the stars, in a worker thread nothing can cancel."""
    dashes = "-" * 1000
    keys = [f"data/{dashes}{i}.txt" for i in range(100)] + [f"data/{dashes}.parquet"]
    contents = "".join(
        f"<Contents><Key>{k}</Key><Size>10</Size><ETag>e{i}</ETag></Contents>"
        for i, k in enumerate(sorted(keys))
    )
    endpoint.body = f"<ListBucketResult>{contents}</ListBucketResult>".encode()
    with pytest.raises(ash.DecodeError, match="is not a Parquet file"):
        await _collect(ash.stream("s3://bkt/data/*-*-*-*.parquet", options=_options(endpoint)))
    assert [p for p in endpoint.paths if "list-type=2" not in p] == [f"/bkt/data/{dashes}.parquet"]


def _get(body: bytes) -> Any:
    async def get(url: str) -> bytes:
        return body

    return get


_CTX = _s3.S3Context(
    endpoint="http://store:9000",
    region="us-east-1",
    addressing="path",
    credentials=None,
    described="unsigned",
)


async def test_a_utf16_listing_without_a_dtd_is_read() -> None:
    body = (
        f'{_UTF16}<ListBucketResult xmlns="{NS}"><IsTruncated>false</IsTruncated>'
        '<Contents><Key>p/a.txt</Key><Size>10</Size><ETag>"e"</ETag></Contents>'
        "</ListBucketResult>"
    ).encode("utf-16")
    objects = await _s3.list_objects(_get(body), _CTX, "bkt", "p/")
    assert objects == (_s3.S3Object("p/a.txt", 10, "e"),)


def _page(keys: int) -> bytes:
    contents = "".join(
        f"<Contents><Key>p/{i}</Key><Size>1</Size><ETag>e</ETag></Contents>" for i in range(keys)
    )
    return f"<ListBucketResult>{contents}</ListBucketResult>".encode()


async def test_a_page_is_bounded_in_objects_and_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_s3, "MAX_PAGE_KEYS", 3)
    assert len(await _s3.list_objects(_get(_page(3)), _CTX, "bkt", "p/")) == 3
    with pytest.raises(ash.ResolutionError, match=r"more than 3 objects \(MAX_PAGE_KEYS\)"):
        await _s3.list_objects(_get(_page(4)), _CTX, "bkt", "p/")
    monkeypatch.setattr(_s3, "MAX_XML_ELEMENTS", 12)
    with pytest.raises(ash.ResolutionError, match=r"more than 12 elements \(MAX_XML_ELEMENTS\)"):
        await _s3.list_objects(_get(_page(3)), _CTX, "bkt", "p/")
    assert _s3.error_code(b"<Error>" + b"<x/>" * 20 + b"</Error>") == ("", "", "")


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.anyio
async def test_an_unreachable_s3_endpoint_names_the_aws_settings_not_hf_endpoint() -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    options = ash.StreamOptions(s3_endpoint_url=endpoint, s3_anonymous=True, max_retries=1)
    with pytest.raises(ash.UnreachableError) as caught:
        async with ash.stream("s3://bucket/data/", options=options) as s:
            async for _ in s:
                pass
    message = str(caught.value)
    assert "AWS_ENDPOINT_URL" in message
    assert "HF_ENDPOINT" not in message
