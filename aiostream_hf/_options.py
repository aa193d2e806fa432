"""StreamOptions: the knobs that set concurrency, memory and patience."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ._exceptions import SourceError

__all__ = ["StreamOptions"]

_MiB = 1024 * 1024


@dataclass(frozen=True)
class StreamOptions:
    """How a stream reads: every bound on memory and requests lives here.

    max_concurrency: HTTP requests in flight at once, per event loop.
    block_size: the unit of sequential reads (TAR shards, readahead), in bytes.
    max_range_size: a larger range read is split into concurrent parts of this size.
    coalesce_gap: ranges of one file closer than this are fetched as one request.
    prefetch_bytes / prefetch_count: readahead of decoded units, bounded by both.
    max_retries: retries of one request on 408/429/5xx and network errors.
    backoff_base / backoff_max: jittered exponential backoff between retries, seconds.
    timeout: seconds without progress on one request before it counts as failed.
    min_throughput: bytes per second a response body must keep up, measured over
        each ``timeout`` seconds: a slower one (a server trickling bytes) counts as
        stalled and is retried from the last byte received. 0 turns the check off.
    max_rate_limit_wait: the longest one request waits, in all, for hosts that
        rate-limited it (429, ``Retry-After``, ``RateLimit``). A server asking for a
        longer wait fails the request at once with ``RateLimitedError``, which says
        when the server will serve again. Pauses over a few seconds are logged
        (WARNING, logger ``aiostream_hf``).
    cache_dir: the on-disk resolution cache; default AIOSTREAM_HF_CACHE or the
        user cache dir (~/.cache/aiostream-hf).
    pin_ttl: seconds a branch-to-commit pin is shared between processes.
    verify_checksums: verify the CRC of every Parquet page that carries one (files
        written with ``write_page_checksum=True``): a page whose bytes changed raises
        ``DecodeError`` naming the file and row group instead of giving wrong rows.
        Pages without a CRC are read as before. False skips the check.
    """

    max_concurrency: int = 16
    block_size: int = 8 * _MiB
    max_range_size: int = 32 * _MiB
    coalesce_gap: int = 1 * _MiB
    prefetch_bytes: int = 512 * _MiB
    prefetch_count: int = 8
    max_retries: int = 8
    backoff_base: float = 0.25
    backoff_max: float = 30.0
    timeout: float = 60.0
    min_throughput: float = 1024.0
    max_rate_limit_wait: float = 600.0
    cache_dir: Path | None = None
    pin_ttl: float = 10.0
    verify_checksums: bool = True

    def __post_init__(self) -> None:
        positive = {
            "max_concurrency": self.max_concurrency,
            "block_size": self.block_size,
            "max_range_size": self.max_range_size,
            "prefetch_bytes": self.prefetch_bytes,
            "prefetch_count": self.prefetch_count,
            "timeout": self.timeout,
            "backoff_max": self.backoff_max,
        }
        for name, value in positive.items():
            if not value > 0:
                raise SourceError(f"StreamOptions.{name}={value!r}: must be > 0")
        for name, value in {
            "coalesce_gap": self.coalesce_gap,
            "max_retries": self.max_retries,
            "backoff_base": self.backoff_base,
            "pin_ttl": self.pin_ttl,
            "min_throughput": self.min_throughput,
            "max_rate_limit_wait": self.max_rate_limit_wait,
        }.items():
            if value < 0:
                raise SourceError(f"StreamOptions.{name}={value!r}: must be >= 0")

    def resolved_cache_dir(self) -> Path:
        """cache_dir, else $AIOSTREAM_HF_CACHE, else the user cache dir."""
        if self.cache_dir is not None:
            return Path(self.cache_dir)
        env = os.environ.get("AIOSTREAM_HF_CACHE")
        if env:
            return Path(env)
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "aiostream-hf"
