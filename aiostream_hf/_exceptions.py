"""The one error hierarchy of aiostream-hf.

Every error the library raises on purpose derives from ``AiostreamError``::

    AiostreamError
    ├── SourceError             a source string or option that cannot be used
    ├── ResolutionError         turning a source into a manifest of files failed
    │   ├── RepoNotFoundError       unknown repo (or bucket), or private without a valid token
    │   ├── AccessDeniedError       credentials that cannot read an S3 bucket, or none found
    │   ├── GatedRepoError          gated repo the token has no access to
    │   ├── RevisionNotFoundError   unknown branch, tag or commit
    │   ├── EntryNotFoundError      unknown file or path in a repo
    │   ├── ConfigNotFoundError     no such config (the message lists them)
    │   └── SplitNotFoundError      no such split (the message lists them)
    ├── FetchError              an HTTP read that did not give the bytes asked for
    │   ├── RetriesExhaustedError   gave up after max_retries (URL, status, attempts)
    │   ├── RangeMismatchError      a 206 that is not the range asked for
    │   ├── FileChangedError        the file's version changed while it was read
    │   ├── RateLimitedError        the server asks for a longer wait than allowed
    │   └── UnreachableError        the endpoint cannot be reached (refused, no DNS)
    ├── DecodeError             bytes that the format decoder cannot turn into samples
    │   └── FrameTimestampError     no frame within tolerance of a requested timestamp
    ├── ClosedResourceError     a closed stream, fetcher or server used again
    ├── UsageError              an object used outside the scope it needs (``async with``)
    └── HubServerError          the local Hub server cannot start as configured

Errors from third-party libraries are converted at the boundary with
``raise NewError(...) from exc``, keeping the URL, status and attempt count.

No message shows a credential: every URL in one (and ``FetchError.url``) goes through
``display_url``, which hides a URL's user and password and drops a signed query.
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = [
    "AccessDeniedError",
    "AiostreamError",
    "ClosedResourceError",
    "ConfigNotFoundError",
    "DecodeError",
    "EntryNotFoundError",
    "FetchError",
    "FileChangedError",
    "FrameTimestampError",
    "GatedRepoError",
    "HubServerError",
    "RangeMismatchError",
    "RateLimitedError",
    "RepoNotFoundError",
    "ResolutionError",
    "RetriesExhaustedError",
    "RevisionNotFoundError",
    "SourceError",
    "SplitNotFoundError",
    "UnreachableError",
    "UsageError",
]


#: Query keys that carry a credential (S3/GCS/CloudFront/Azure signed URLs, tokens):
#: a URL with one is shown without its query.
_SECRET_KEYS = ("sig", "credential", "token", "key-pair-id", "policy", "secret", "password")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def display_url(url: str) -> str:
    """``url`` as messages and log lines show it: ``user:password@`` becomes ``***@``, and
    a query holding a signature or credential (``X-Amz-Signature``, ``Signature``,
    ``sig``, ``X-Amz-Credential``, a token) is dropped. The one place URLs are redacted."""
    try:
        parts = urllib.parse.urlsplit(url)
        netloc, query = parts.netloc, parts.query
    except ValueError:  # not a URL urllib can split (a bad IPv6 host): redact by hand
        head, sep, tail = url.partition("://")
        rest = tail.split("/", 1)
        if "@" in rest[0]:
            rest[0] = "***@" + rest[0].rpartition("@")[2]
        return head + sep + "/".join(rest).split("?", 1)[0] if sep else url
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    keys = [k.lower() for k, _ in urllib.parse.parse_qsl(query, keep_blank_values=True)]
    if any(secret in key for key in keys for secret in _SECRET_KEYS):
        query = ""
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return parts._replace(netloc=netloc, query=query, fragment="").geturl()


def redact_urls(text: str) -> str:
    """``text`` with every URL in it shown by ``display_url``."""
    return _URL.sub(lambda m: display_url(m.group()), text) if "://" in text else text


class AiostreamError(Exception):
    """The root of every error aiostream-hf raises on purpose; URLs in its message are
    shown without credentials (``display_url``)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact_urls(a) if isinstance(a, str) else a for a in args))


class SourceError(AiostreamError, ValueError):
    """A source string, or an option, that cannot be used as given."""


class ResolutionError(AiostreamError):
    """Turning a source into a manifest of files failed."""


class RepoNotFoundError(ResolutionError):
    """The repo (or S3 bucket) does not exist, or is private and the token cannot read it."""


class AccessDeniedError(ResolutionError):
    """An S3 store refused the credentials (AccessDenied, InvalidAccessKeyId,
    SignatureDoesNotMatch, an expired token), or no credentials were found; the message
    names the bucket, the credentials used and the way out."""


class GatedRepoError(ResolutionError):
    """The repo is gated and the token has not been granted access."""


class RevisionNotFoundError(ResolutionError):
    """The branch, tag or commit does not exist in the repo."""


class EntryNotFoundError(ResolutionError):
    """The file or path does not exist in the repo at that revision."""


class ConfigNotFoundError(ResolutionError, ValueError):
    """The config name is not one of the dataset's configs."""


class SplitNotFoundError(ResolutionError, ValueError):
    """The split name is not one of the config's splits."""


class FetchError(AiostreamError):
    """An HTTP read that did not give the bytes asked for.

    ``url``, ``status`` (None for a network error) and ``attempts`` say what
    was tried.
    """

    def __init__(
        self, message: str, *, url: str = "", status: int | None = None, attempts: int = 1
    ) -> None:
        super().__init__(message)
        self.url = display_url(url)
        self.status = status
        self.attempts = attempts


class RetriesExhaustedError(FetchError):
    """Every retry of a read failed; the last status and the attempt count are kept."""


class RangeMismatchError(FetchError):
    """The server answered a range other than the one asked for."""


class FileChangedError(FetchError):
    """The file changed (its validator differs from the one pinned at first contact)."""


class RateLimitedError(FetchError):
    """A host asked us to wait (429, ``Retry-After``, ``RateLimit``) past the options'
    ``max_rate_limit_wait``; ``resume_at`` is when the server said it would serve again
    (seconds since the epoch)."""

    def __init__(
        self,
        message: str,
        *,
        url: str = "",
        status: int | None = None,
        attempts: int = 1,
        resume_at: float | None = None,
    ) -> None:
        super().__init__(message, url=url, status=status, attempts=attempts)
        self.resume_at = resume_at


class UnreachableError(FetchError):
    """A host that never answered refuses connections or has no DNS name: fails fast
    (one quick retry), naming the endpoint and how to set another."""


class DecodeError(AiostreamError):
    """Bytes that a format decoder cannot turn into samples; the message names the file."""


class FrameTimestampError(DecodeError):
    """No frame lies within the tolerance of a requested timestamp."""


class ClosedResourceError(AiostreamError):
    """A stream, fetcher or server was used after it was closed."""


class UsageError(AiostreamError, RuntimeError):
    """An object used outside the scope it needs: a stream iterated with ``async for``
    but not inside ``async with`` (its background tasks need a scope to live in)."""


class HubServerError(AiostreamError):
    """The local Hub server cannot start as configured (root, port, repo folder)."""
