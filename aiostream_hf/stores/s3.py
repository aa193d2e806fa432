"""S3 and S3-compatible object stores (MinIO, Cloudflare R2, Ceph, a local moto server):
where a bucket is, who we are to it, what its listing says, and what its errors mean.

    s3://BUCKET/KEY-PREFIX-OR-GLOB  ->  one ListObjectsV2 listing (Resolver, cached)
                                    ->  FileRefs: each object's URL, size and ETag
                                    ->  signed range reads (RangeFetcher, over HubClient)

Everything else is the engine's: the resolver coalesces and caches the listing, the
fetcher reads the objects with its coalescing, splitting, retries and resumes, and every
request goes through the one ``HubClient``. This module gives them:

- ``S3Context``: the endpoint, region, addressing style and credentials of a stream,
  from ``StreamOptions.s3_*`` first, then the standard AWS chain as botocore (the ``s3``
  extra) reads it: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
  ``AWS_PROFILE`` and the shared config and credentials files (with their SSO, role and
  process providers), container and instance roles; ``AWS_ENDPOINT_URL_S3``,
  ``AWS_ENDPOINT_URL`` and the profile's ``endpoint_url``; ``AWS_REGION``,
  ``AWS_DEFAULT_REGION`` and the profile's ``region``. One per settings and environment,
  per process (``context``), made in a worker thread (botocore reads files, and an
  instance role is a network call).
- Signing. ``S3Context.sign`` is a ``RequestSigner``: ``HubClient.send`` calls it as each
  request leaves, after its waits for the host gate and a slot, so every attempt (a
  retry after backoff, a resume with its new ``Range``) gets a fresh SigV4 signature
  (botocore's ``S3SigV4Auth``; ``X-Amz-Date`` must be within 15 minutes of the store's
  clock, so a signature made before a long wait could expire). The signed headers are
  the ones that say what is read: ``Host``, ``Range``, ``If-Match``, ``If-Range`` (and
  the ``x-amz-*`` headers the signature adds); the payload of a GET is empty, its hash
  a constant. Signing ``Range`` rather than leaving it out of ``SignedHeaders`` costs
  nothing (the request is signed when it is sent anyway) and keeps a signature from
  being good for any other range of the object. Only requests to the endpoint's host
  (or a bucket's virtual host below it) are signed; anonymous contexts sign nothing.
- Listing (``list_objects``): ListObjectsV2 pages (``encoding-type=url``), followed by
  continuation token, bounded like a Hub tree listing: at most ``MAX_LIST_PAGES``
  pages, ``MAX_LIST_KEYS`` objects and ``MAX_LIST_BYTES`` bytes in all, a page body at
  most the resolver's ``MAX_API_BODY``; a repeated token, a key listed twice or outside
  the prefix, a truncated page without a token are errors. XML is parsed by expat (in
  whatever encoding the answer declares) into an ``ElementTree``, refusing any
  ``<!DOCTYPE`` (so no entity can be declared, hence none expand), at most
  ``MAX_XML_ELEMENTS`` elements and no more characters of text than the body has
  bytes; a page holds at most ``MAX_PAGE_KEYS`` objects; every field is type-checked.
- Errors: the store's ``<Error><Code>`` becomes an error of ``_exceptions`` that names
  the bucket (and key), the credentials used and the way out: ``NoSuchBucket`` ->
  ``RepoNotFoundError``; ``AccessDenied``, ``InvalidAccessKeyId``,
  ``SignatureDoesNotMatch``, expired tokens and a skewed clock -> ``AccessDeniedError``;
  a bucket in another region -> ``ResolutionError`` naming it; a missing key ->
  ``EntryNotFoundError`` (listing) or ``FileChangedError`` (removed after the listing).

An S3 listing has no commit: it is cached for ``StreamOptions.pin_ttl`` seconds (in
memory, and on disk for the other processes of the machine, keyed by the credentials'
identity), like a branch's pin, so that ranks starting together list once and a later
run sees new objects. A manifest keeps each object's ETag: the fetcher sends it as
``If-Match`` from the first read, so an object replaced since the listing is
``FileChangedError``, never a mix. DataLoader workers get the manifest from the
parent (``aiostream_hf.torch``) and list nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import xml.etree.ElementTree as ET
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit
from xml.parsers import expat

import anyio.to_thread
import httpx2

from .._access import origin
from .._exceptions import (
    AccessDeniedError,
    EntryNotFoundError,
    FetchError,
    RepoNotFoundError,
    ResolutionError,
    SourceError,
)
from .._exceptions import display_url as _display
from .._models import FileRef
from .._options import StreamOptions
from .._sources import BucketSource, has_glob
from ._refusal import Refusal

if TYPE_CHECKING:
    from .._hub_layout import Glob
    from . import Lister

__all__ = [
    "STORE",
    "MAX_LIST_BYTES",
    "MAX_LIST_KEYS",
    "MAX_LIST_PAGES",
    "MAX_PAGE_KEYS",
    "MAX_XML_ELEMENTS",
    "S3Context",
    "S3Object",
    "context",
    "is_s3",
    "list_objects",
    "listing_prefix",
    "read_error",
    "require_botocore",
    "select",
]

#: The most pages of one listing followed (S3 returns up to 1,000 keys a page).
MAX_LIST_PAGES = 10_000
#: The most objects one listing may hold.
MAX_LIST_KEYS = 1_000_000
#: The most bytes all the pages of one listing may add up to.
MAX_LIST_BYTES = 1024 * 1024 * 1024
#: The most objects one listing page may hold (S3 sends at most 1,000).
MAX_PAGE_KEYS = 10_000
#: The most elements one XML answer (a listing page, an error) may hold.
MAX_XML_ELEMENTS = 100_000
#: The most bytes of an error answer read for its ``<Code>``.
MAX_ERROR_BODY = 64 * 1024

S3_EXTRA = "pip install 'aiostream-hf[s3]'"
_MAX_SIZE = 2**63 - 1
_MAX_ETAG = 1024
_CONTEXTS_KEPT = 8
_SIGNED = frozenset({"host", "range", "if-match", "if-range"})
_WAY_IN = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or "
    "AWS_PROFILE, or pass StreamOptions(s3_credentials=...)"
)
_PUBLIC = "for a public bucket, StreamOptions(s3_anonymous=True) sends requests unsigned"
_REGION_CODES = frozenset(
    {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"}
)
_CREDENTIAL_CODES = {
    "InvalidAccessKeyId": "the store does not know this access key id",
    "SignatureDoesNotMatch": (
        "the signature does not match: the secret key is not this access key id's "
        "(or something between us and the store changed the request)"
    ),
    "ExpiredToken": "the session token has expired: get new credentials",
    "TokenRefreshRequired": "the session token has expired: get new credentials",
    "InvalidToken": "the session token is not valid for this store",
    "RequestTimeTooSkewed": "this machine's clock is off by more than 15 minutes: set it right",
    "AccountProblem": "the store reports a problem with the account",
}


def require_botocore() -> None:
    """The ``s3`` extra (botocore) is installed, else one line that names it."""
    try:
        import botocore  # noqa: F401
    except ImportError:
        raise SourceError(
            f"s3:// sources need botocore (request signing, AWS credentials), which is not "
            f"installed: {S3_EXTRA}"
        ) from None


def is_s3(file: FileRef) -> bool:
    """Whether ``file`` is an object of an S3 listing (its reads are signed)."""
    return file.path.startswith("s3://")


# -- who we are, and where the store is ----------------------------------------------------


class S3Context:
    """The endpoint, region, addressing and credentials that one stream reaches S3 with.

    A ``RequestSigner``: ``sign`` adds SigV4 headers to requests for its endpoint's host
    (and the buckets' virtual hosts below it), and leaves every other request as it is.
    """

    #: The way out when its endpoint cannot be reached (the client's UnreachableError).
    unreachable_hint = (
        "Set AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (StreamOptions.s3_endpoint_url in Python)"
    )

    def __init__(
        self,
        *,
        endpoint: str,
        region: str,
        addressing: str,
        credentials: Any,
        described: str,
    ) -> None:
        self.endpoint = endpoint  # scheme://host[:port][/path], no trailing "/"
        self.region = region
        self.addressing = addressing  # "auto", "path" or "virtual"
        self._credentials = credentials  # a botocore Credentials, or None (anonymous)
        self._frozen: Any = None
        self._lock = threading.Lock()
        self.described = described  # for messages: how requests are signed
        parts = urlsplit(endpoint)
        self._scheme = parts.scheme
        self._netloc = parts.netloc
        self._base_path = parts.path.rstrip("/")
        self._origin = origin(endpoint)
        self.identity = "anonymous"
        if credentials is not None:
            frozen = credentials.get_frozen_credentials()
            self._frozen = frozen
            text = f"{frozen.access_key}\0{frozen.secret_key}"
            self.identity = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]

    @property
    def anonymous(self) -> bool:
        return self._credentials is None

    # -- URLs ------------------------------------------------------------------------------

    def _virtual(self, bucket: str) -> bool:
        if self.addressing != "auto":
            return self.addressing == "virtual"
        host = self._origin[1]
        # Like botocore: virtual-hosted on AWS when the name can be a host name (and, over
        # TLS, has no dot a wildcard certificate cannot cover); path-style elsewhere.
        dns_safe = re.fullmatch(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]", bucket) is not None
        return host.endswith(".amazonaws.com") and dns_safe

    def bucket_url(self, bucket: str) -> str:
        """The URL of the bucket itself (listings), without a trailing "/"."""
        if self._virtual(bucket):
            return f"{self._scheme}://{bucket}.{self._netloc}{self._base_path}"
        return f"{self.endpoint}/{quote(bucket, safe='')}"

    def object_url(self, bucket: str, key: str) -> str:
        """The URL an object's bytes are read from (its key URI-encoded, "/" kept)."""
        return f"{self.bucket_url(bucket)}/{quote(key, safe='/~')}"

    def covers(self, url: str) -> bool:
        """Whether ``url`` is on this endpoint (or a bucket's virtual host below it)."""
        scheme, host, port = origin(url)
        own_scheme, own, own_port = self._origin
        same_host = host == own or host.endswith("." + own)
        return (scheme, port) == (own_scheme, own_port) and same_host

    # -- signing ---------------------------------------------------------------------------

    async def sign(self, request: httpx2.Request) -> None:
        """SigV4-sign ``request`` (if it is for this endpoint and we have credentials)."""
        if self._credentials is None or not self.covers(str(request.url)):
            return
        frozen = self._frozen
        if _refresh_needed(self._credentials):
            # A refresh (an STS or SSO call, a credential process) blocks: off the loop.
            frozen = await anyio.to_thread.run_sync(self._refresh)
        _sign(request, frozen, self.region)

    def _refresh(self) -> Any:
        import botocore.exceptions

        with self._lock:
            try:
                self._frozen = self._credentials.get_frozen_credentials()
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
                raise AccessDeniedError(
                    f"{self.endpoint}: the AWS credentials expired and cannot be refreshed "
                    f"({exc}): {_WAY_IN}"
                ) from exc
            return self._frozen


def _refresh_needed(credentials: Any) -> bool:
    check = getattr(credentials, "refresh_needed", None)
    return bool(check()) if check is not None else False


def _sign(request: httpx2.Request, frozen: Any, region: str) -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest

    headers = {k: v for k, v in request.headers.items() if k.lower() in _SIGNED}
    url = request.url  # signed as it goes on the wire: "/" for an empty path, query as is
    wire = f"{url.scheme}://{url.netloc.decode('ascii')}{url.raw_path.decode('ascii')}"
    aws = AWSRequest(method=request.method, url=wire, headers=headers)
    S3SigV4Auth(frozen, "s3", region).add_auth(aws)
    for name in ("Authorization", "X-Amz-Date", "X-Amz-Content-SHA256", "X-Amz-Security-Token"):
        value = aws.headers.get(name)
        if value is not None:
            request.headers[name] = value


_CONTEXTS: OrderedDict[str, S3Context] = OrderedDict()
_CONTEXTS_LOCK = threading.Lock()


async def context(options: StreamOptions, what: str) -> S3Context:
    """The S3 settings and credentials for ``options`` and the environment, made once per
    process (in a worker thread) and reused while neither changes. ``what`` (a source or
    an object) is named if no credentials are found."""
    require_botocore()
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))
    creds = sorted((options.s3_credentials or {}).items())
    fields = (
        options.s3_endpoint_url,
        options.s3_region,
        options.s3_anonymous,
        options.s3_addressing,
        creds,
        env,
    )
    key = hashlib.sha256(repr(fields).encode("utf-8", "surrogatepass")).hexdigest()
    with _CONTEXTS_LOCK:
        found = _CONTEXTS.get(key)
    if found is not None:
        return found
    return await anyio.to_thread.run_sync(_make_context, key, options, what)


def _make_context(key: str, options: StreamOptions, what: str) -> S3Context:
    import botocore.credentials
    import botocore.exceptions
    import botocore.session
    from botocore.configprovider import ConfiguredEndpointProvider

    with _CONTEXTS_LOCK:
        found = _CONTEXTS.get(key)
    if found is not None:
        return found
    try:
        session = botocore.session.Session()
        scoped = session.get_scoped_config()
        region = (
            options.s3_region
            or os.environ.get("AWS_REGION")
            or session.get_config_variable("region")
            or "us-east-1"
        )
        endpoint = options.s3_endpoint_url
        if endpoint is None and not session.get_config_variable("ignore_configured_endpoint_urls"):
            endpoint = ConfiguredEndpointProvider(
                full_config=session.full_config, scoped_config=scoped, client_name="s3"
            ).provide()
        endpoint = _check_endpoint(endpoint or f"https://s3.{region}.amazonaws.com")
        addressing = options.s3_addressing
        if addressing == "auto":
            style = (scoped.get("s3") or {}).get("addressing_style", "auto")
            addressing = style if style in ("path", "virtual") else "auto"
        credentials: Any = None
        if options.s3_credentials is not None:
            given = options.s3_credentials
            credentials = botocore.credentials.Credentials(
                given["aws_access_key_id"],
                given["aws_secret_access_key"],
                given.get("aws_session_token"),
                method="StreamOptions.s3_credentials",
            )
        elif not options.s3_anonymous:
            credentials = session.get_credentials()
            if credentials is None:
                raise AccessDeniedError(f"{what}: no AWS credentials found: {_WAY_IN}; {_PUBLIC}")
        made = S3Context(
            endpoint=endpoint,
            region=region,
            addressing=addressing,
            credentials=credentials,
            described=_describe_credentials(credentials),
        )
    except botocore.exceptions.ProfileNotFound as exc:
        raise SourceError(
            f"{what}: {exc}: set AWS_PROFILE to a profile of the AWS config files, or unset it"
        ) from None
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise AccessDeniedError(f"{what}: the AWS credentials cannot be loaded: {exc}") from exc
    with _CONTEXTS_LOCK:
        _CONTEXTS[key] = made
        while len(_CONTEXTS) > _CONTEXTS_KEPT:
            _CONTEXTS.popitem(last=False)
    return made


def _check_endpoint(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise SourceError(
            f"S3 endpoint {endpoint!r} is not an http(s) URL like "
            "https://s3.us-east-1.amazonaws.com (from StreamOptions.s3_endpoint_url, "
            "AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or the AWS config file)"
        )
    return endpoint.rstrip("/")


def _describe_credentials(credentials: Any) -> str:
    if credentials is None:
        return "sent unsigned (StreamOptions.s3_anonymous=True)"
    frozen = credentials.get_frozen_credentials()
    method = getattr(credentials, "method", None) or "the AWS credential chain"
    return f"signed with access key id {frozen.access_key} (from {method})"


# -- the listing -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class S3Object:
    """One object of a listing: its key, size and (opaque, unquoted) ETag."""

    key: str
    size: int
    etag: str


def listing_prefix(keys: Sequence[str]) -> str:
    """The longest key prefix every one of ``keys`` (exact keys, folders or globs) lies
    under: what one listing must cover for all of them."""
    literal = [re.split(r"[*?[]", k, maxsplit=1)[0] for k in keys]
    return os.path.commonprefix(literal) if literal else ""


def listing_url(ctx: S3Context, bucket: str, prefix: str, token: str | None) -> str:
    """A ListObjectsV2 page URL, its query encoded as SigV4 canonicalises it (RFC 3986,
    sorted), so that the query signed is the query sent."""
    params = [("encoding-type", "url"), ("list-type", "2"), ("prefix", prefix)]
    if token is not None:
        params.append(("continuation-token", token))
    query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params))
    return f"{ctx.bucket_url(bucket)}?{query}"


async def list_objects(
    get: Callable[[str], Awaitable[bytes]], ctx: S3Context, bucket: str, prefix: str
) -> tuple[S3Object, ...]:
    """Every object of ``bucket`` whose key starts with ``prefix``, in key order, from the
    pages ``get`` fetches (the resolver's requests), within the listing bounds."""
    where = f"s3://{bucket}/{prefix}"
    objects: list[S3Object] = []
    keys: set[str] = set()
    tokens: set[str] = set()
    received = 0
    token: str | None = None
    for page in range(MAX_LIST_PAGES + 1):
        if page == MAX_LIST_PAGES:
            raise ResolutionError(
                f"the listing of {where} goes on past {MAX_LIST_PAGES} pages (MAX_LIST_PAGES): "
                "name a narrower prefix or glob"
            )
        url = listing_url(ctx, bucket, prefix, token)
        body = await get(url)
        received += len(body)
        if received > MAX_LIST_BYTES:
            raise ResolutionError(
                f"the listing of {where} is over {MAX_LIST_BYTES} bytes (MAX_LIST_BYTES) after "
                f"{page + 1} pages: name a narrower prefix or glob"
            )
        found, token = await anyio.to_thread.run_sync(_parse_page, body, url, prefix)
        for obj in found:
            if obj.key in keys:
                raise ResolutionError(f"the listing of {where} lists {obj.key!r} twice ({url})")
            if len(objects) >= MAX_LIST_KEYS:
                raise ResolutionError(
                    f"the listing of {where} holds more than {MAX_LIST_KEYS} objects "
                    "(MAX_LIST_KEYS): name a narrower prefix or glob"
                )
            keys.add(obj.key)
            objects.append(obj)
        if token is None:
            break
        if token in tokens:
            raise ResolutionError(f"the listing of {where} loops: continuation token repeated")
        tokens.add(token)
    objects.sort(key=lambda o: o.key.encode("utf-8", "surrogatepass"))
    return tuple(objects)


def _parse_page(body: bytes, url: str, prefix: str) -> tuple[list[S3Object], str | None]:
    """The objects of one ListObjectsV2 page and the next page's token (None: the last)."""
    root = parse_xml(body, url)
    if _local(root.tag) != "ListBucketResult":
        raise ResolutionError(f"GET {_display(url)} answered <{_local(root.tag)}>, not a listing")
    fields = {_local(el.tag): (el.text or "") for el in root if _local(el.tag) != "Contents"}
    encoded = fields.get("EncodingType") == "url"
    objects: list[S3Object] = []
    for el in root:
        if _local(el.tag) != "Contents":
            continue
        if len(objects) >= MAX_PAGE_KEYS:
            raise ResolutionError(
                f"GET {_display(url)}: a page of more than {MAX_PAGE_KEYS} objects "
                "(MAX_PAGE_KEYS); S3 sends at most 1,000"
            )
        entry = {_local(child.tag): (child.text or "") for child in el}
        raw_key, size, etag = entry.get("Key"), entry.get("Size", ""), entry.get("ETag", "")
        key = unquote(raw_key) if encoded and raw_key is not None else raw_key
        if not key or not key.startswith(prefix):
            raise ResolutionError(
                f"GET {_display(url)}: a listed key {key!r} is not below the prefix {prefix!r}"
            )
        if not size.isdigit() or int(size) > _MAX_SIZE:
            raise ResolutionError(f"GET {_display(url)}: {key!r} has size {size[:40]!r}")
        tag = etag.strip().removeprefix("W/").strip('"')
        if not tag or len(tag) > _MAX_ETAG or not tag.isprintable():
            raise ResolutionError(f"GET {_display(url)}: {key!r} has ETag {etag[:80]!r}")
        objects.append(S3Object(key, int(size), tag))
    truncated = fields.get("IsTruncated", "false").strip().lower()
    if truncated not in ("true", "false"):
        raise ResolutionError(f"GET {_display(url)}: IsTruncated is {truncated[:20]!r}")
    token = fields.get("NextContinuationToken") or None
    if truncated == "true" and token is None:
        raise ResolutionError(
            f"GET {_display(url)}: the page says more follow but gives no NextContinuationToken"
        )
    return objects, token if truncated == "true" else None


def parse_xml(body: bytes, url: str) -> ET.Element:
    """An S3 XML answer, parsed without a DTD (so that nothing can expand) and within
    ``MAX_XML_ELEMENTS``."""
    try:
        return _parse_xml(body)
    except _Refused as exc:
        raise ResolutionError(f"GET {_display(url)} answered XML {exc}: refusing it") from None
    except expat.ExpatError as exc:
        raise ResolutionError(f"GET {_display(url)} answered malformed XML: {exc}") from None


class _Refused(Exception):
    """An XML answer that is well-formed, perhaps, but not one we parse."""


def _parse_xml(body: bytes) -> ET.Element:
    """``body`` as a tree, by expat in the encoding the document declares (its BOM or XML
    declaration), refusing a ``<!DOCTYPE`` in any encoding: without one no entity is
    declared, so the text is at most as long as the body, and that is checked too."""
    builder = ET.TreeBuilder()
    parser = expat.ParserCreate(namespace_separator="}")
    elements = 0
    chars = 0

    def doctype(*_: object) -> None:
        raise _Refused("with a <!DOCTYPE>")

    def start(tag: str, attrs: dict[str, str]) -> None:
        nonlocal elements
        elements += 1
        if elements > MAX_XML_ELEMENTS:
            raise _Refused(f"of more than {MAX_XML_ELEMENTS} elements (MAX_XML_ELEMENTS)")
        builder.start(tag, attrs)

    def data(text: str) -> None:
        nonlocal chars
        chars += len(text)
        if chars > len(body):
            raise _Refused(f"whose text is longer than its {len(body)} bytes")
        builder.data(text)

    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = doctype  # unreachable without a DTD; refused all the same
    parser.StartElementHandler = start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = data
    parser.Parse(body, True)
    return builder.close()


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


# -- choosing objects ----------------------------------------------------------------------


def select(
    ctx: S3Context,
    objects: Sequence[S3Object],
    sources: Sequence[BucketSource],
    match: Callable[[str], Glob],
) -> tuple[FileRef, ...]:
    """The files ``sources`` name among the listed ``objects`` (of one bucket), in the
    sources' order: an exact key, a folder's keys, or a glob's matches (key order).
    ``match`` turns a glob into its matcher (the resolver's, so globs match as on the Hub)."""
    by_key = {o.key: o for o in objects}
    files: list[FileRef] = []
    for src in sources:
        if has_glob(src.key):
            pattern = match(src.key)
            chosen = [o for o in objects if pattern.match(o.key)]
            if not chosen:
                raise EntryNotFoundError(f"{src.uri}: the glob matches no object in the bucket")
        elif src.key in by_key and not src.key.endswith("/"):
            chosen = [by_key[src.key]]
        else:
            folder = src.key if not src.key or src.key.endswith("/") else src.key + "/"
            chosen = [o for o in objects if o.key.startswith(folder)]
            if not chosen:
                parent = src.key.rstrip("/").rpartition("/")[0]
                raise EntryNotFoundError(
                    f"{src.uri}: no such key in bucket {src.bucket!r}, nor a folder of that "
                    f"name; `aiostream-hf ls s3://{src.bucket}/{parent + '/' if parent else ''}` "
                    "lists what is there"
                )
        for o in chosen:
            if o.key.endswith("/"):
                continue  # a folder marker (an empty object named "dir/")
            if any(part in (".", "..") for part in o.key.split("/")):
                raise SourceError(
                    f"s3://{src.bucket}/{o.key}: a key with a '.' or '..' segment cannot be read "
                    "over HTTP (URLs drop such segments): rename the object"
                )
            files.append(
                FileRef(
                    url=ctx.object_url(src.bucket, o.key),
                    path=f"s3://{src.bucket}/{o.key}",
                    size=o.size,
                    etag=o.etag,
                    split="train",
                )
            )
    return tuple(files)


def encode_listing(objects: tuple[S3Object, ...]) -> list[list[Any]]:
    return [[o.key, o.size, o.etag] for o in objects]


def decode_listing(data: Any) -> tuple[S3Object, ...]:
    if not isinstance(data, list):
        raise ValueError("not a list")
    out = []
    for item in data:
        key, size, etag = item
        if not (isinstance(key, str) and isinstance(size, int) and isinstance(etag, str)):
            raise ValueError(f"bad entry {item!r}")
        out.append(S3Object(key, size, etag))
    return tuple(out)


# -- what the store's errors mean ------------------------------------------------------------


def error_code(body: bytes) -> tuple[str, str, str]:
    """(Code, Message, Region) of an S3 ``<Error>`` body; empty strings when it is none."""
    try:
        root = _parse_xml(body)
    except (_Refused, expat.ExpatError):
        return "", "", ""
    if _local(root.tag) != "Error":
        return "", "", ""
    fields = {_local(el.tag): (el.text or "").strip() for el in root}
    return fields.get("Code", "")[:100], fields.get("Message", "")[:300], fields.get("Region", "")


def listing_error(
    ctx: S3Context, bucket: str, prefix: str, status: int, headers: Mapping[str, str], body: bytes
) -> Exception:
    """The error for a listing the store refused (after retries)."""
    code, message, region = error_code(body)
    what = f"s3://{bucket}/{prefix}"
    note = f" ({code}{': ' + message if message else ''})" if code else ""
    region = headers.get("x-amz-bucket-region") or region
    if code == "NoSuchBucket" or (status == 404 and not code):
        return RepoNotFoundError(
            f"{what}: bucket {bucket!r} does not exist at {ctx.endpoint}{note}: check its name "
            "and the endpoint (StreamOptions.s3_endpoint_url, AWS_ENDPOINT_URL_S3 or "
            "AWS_ENDPOINT_URL)"
        )
    if code in _REGION_CODES or status == 301 or (region and region != ctx.region):
        where = f"region {region!r}" if region else "another region"
        return ResolutionError(
            f"{what}: bucket {bucket!r} is in {where}, not {ctx.region!r}{note}: set "
            f"AWS_REGION={region or '...'} or StreamOptions(s3_region=...)"
        )
    return _access_error(ctx, what, status, code, note) or ResolutionError(
        f"{what}: listing failed with HTTP {status}{note} ({ctx.endpoint})"
    )


def _access_error(
    ctx: S3Context, what: str, status: int, code: str, note: str
) -> AccessDeniedError | None:
    if code in _CREDENTIAL_CODES:
        fix = f"{_CREDENTIAL_CODES[code]}; requests were {ctx.described}: {_WAY_IN}"
        return AccessDeniedError(f"{what}: HTTP {status}{note}: {fix}")
    if code in ("AccessDenied", "AllAccessDisabled") or status in (401, 403):
        if ctx.anonymous:
            fix = (
                "the bucket is not public: drop StreamOptions.s3_anonymous and give "
                f"credentials that can read it ({_WAY_IN})"
            )
        else:
            fix = (
                f"requests were {ctx.described}, which may not read it: use credentials "
                f"that can ({_WAY_IN}); {_PUBLIC}"
            )
        return AccessDeniedError(f"{what}: access denied, HTTP {status}{note}: {fix}")
    return None


async def error_body(response: httpx2.Response) -> bytes:
    """At most ``MAX_ERROR_BODY`` bytes of an error answer (its ``<Code>`` is early)."""
    pieces: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        pieces.append(chunk)
        size += len(chunk)
        if size >= MAX_ERROR_BODY:
            break
    return b"".join(pieces)[:MAX_ERROR_BODY]


def read_error(
    ctx: S3Context | None, file: FileRef, status: int, body: bytes, attempts: int
) -> FetchError:
    """The error for a read of a listed object that the store refused."""
    code, message, _ = error_code(body)
    note = f" ({code}{': ' + message if message else ''})" if code else ""
    problem = None
    if ctx is not None and not ctx.covers(file.url):
        problem = (
            f"{file.url} is not on the S3 endpoint {ctx.endpoint}, so it was sent unsigned: "
            "read it with the settings it was listed with"
        )
    elif ctx is not None:
        denied = _access_error(ctx, file.path, status, code, note)
        if denied is not None:
            problem = str(denied).removeprefix(f"{file.path}: ")
    return FetchError(
        f"{file.path}: {problem or f'HTTP {status}{note}'} ({file.url})",
        url=file.url,
        status=status,
        attempts=attempts,
    )


# -- the store ------------------------------------------------------------------------------


class S3Store:
    """The ``s3://`` store (``stores.BucketStore``): what the resolver and the fetcher
    ask of a bucket of objects, answered with S3's wire format."""

    name = "s3"
    scheme = "s3"

    def check_available(self) -> None:
        require_botocore()

    async def context(self, options: StreamOptions, what: str) -> S3Context:
        return await context(options, what)

    async def resolve(self, sources: Sequence[BucketSource], lister: Lister) -> tuple[FileRef, ...]:
        """The objects ``sources`` (of one bucket) name, from one listing of the prefix
        they share, cached for ``pin_ttl`` seconds: a listing has no commit."""
        bucket = sources[0].bucket
        ctx = await context(lister.options, sources[0].uri)
        prefix = listing_prefix([src.key for src in sources])

        async def listed() -> tuple[S3Object, ...]:
            def refused(response: httpx2.Response, body: bytes, attempts: int) -> Exception:
                return listing_error(
                    ctx, bucket, prefix, response.status_code, response.headers, body
                )

            async def page(url: str) -> bytes:
                return await lister.get(url, signer=ctx, refused=refused)

            return await list_objects(page, ctx, bucket, prefix)

        objects = await lister.once(
            ("s3-listing", ctx.identity, ctx.endpoint, bucket, prefix),
            listed,
            encode_listing,
            decode_listing,
        )
        return await anyio.to_thread.run_sync(select, ctx, objects, sources, lister.glob)

    async def error_body(self, response: httpx2.Response) -> bytes:
        return await error_body(response)

    def read_error(self, refusal: Refusal) -> FetchError:
        r = refusal
        ctx = r.context if isinstance(r.context, S3Context) else None
        return read_error(ctx, r.file, r.status, r.body, r.attempts)


STORE = S3Store()
