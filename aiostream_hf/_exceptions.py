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
"""

from __future__ import annotations

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


class AiostreamError(Exception):
    """The root of every error aiostream-hf raises on purpose."""


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
        self.url = url
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
