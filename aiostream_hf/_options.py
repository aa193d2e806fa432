"""StreamOptions: the knobs that set concurrency, memory and patience."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ._exceptions import SourceError
from ._quota import Pacing

__all__ = ["StreamOptions"]

_MiB = 1024 * 1024
_S3_ADDRESSING = ("auto", "path", "virtual")
_S3_CREDENTIAL_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
#: The options that count (bytes, requests, retries), and the least each may be.
_COUNTS = {
    "max_concurrency": 1,
    "block_size": 1,
    "max_range_size": 1,
    "prefetch_bytes": 1,
    "prefetch_count": 1,
    "max_whole_video_bytes": 1,
    "kept_video_bytes": 0,
    "coalesce_gap": 0,
    "max_retries": 0,
    "rate_limit_reserve": 0,
    "byte_cache_bytes": 0,
    "slice_bytes": 1,
    "shuffle_units": 1,
}
#: The options in seconds (or bytes per second): "> 0" or ">= 0", and finite.
_SECONDS = {
    "timeout": ">",
    "backoff_max": ">",
    "backoff_base": ">=",
    "min_throughput": ">=",
    "max_rate_limit_wait": ">=",
    "pin_ttl": ">=",
}


@dataclass(frozen=True)
class StreamOptions:
    """How a stream reads: every bound on memory and requests lives here.

    max_concurrency: HTTP requests in flight at once, per event loop.
    block_size: the unit of sequential reads (TAR shards, readahead), in bytes.
    max_range_size: a larger range read is split into concurrent parts of this size.
    coalesce_gap: ranges of one file closer than this are fetched as one request.
    prefetch_bytes / prefetch_count: readahead of decoded units, bounded by both.
    max_retries: retries of one request on 408/429/5xx (but 501/505) and network errors.
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
    rate_limit_reserve: requests of each rate-limit window (per bucket: "api",
        "resolvers") left unused. Every request takes one from its bucket's quota, a
        count that the processes of the machine sharing ``cache_dir`` keep together
        (DataLoader workers, several jobs) from the servers' ``RateLimit`` headers; a
        spent quota waits for the window's reset instead of running into 429s. Raise it
        when other programs spend the same quota (``huggingface_hub`` downloads, jobs
        with another cache folder, other machines behind the same address).
    cache_dir: the on-disk resolution cache; default AIOSTREAM_HF_CACHE or the
        user cache dir (~/.cache/aiostream-hf).
    pin_ttl: seconds a resolution of something that can change is shared between the
        processes of a machine (and reused in one): a branch's commit, an S3 listing.
    manifest_dir: a folder every node of a job sees (a network filesystem whose file
        locks work across machines: NFSv4, Lustre mounted with ``flock``), where the job
        resolves each Hub source once: the first process to take its lock resolves and
        writes the manifest there (commit sha, files, sizes, ETags), and every other
        process, on any node, reads it and makes no API request. Its manifests never
        expire: they pin the job, restarts included, to one commit; a new job (or one that
        should see a new commit) takes a new folder. Default ``AIOSTREAM_HF_MANIFEST_DIR``;
        None: resolutions are shared per machine only (``cache_dir``). Under
        torch.distributed, ``aiostream_hf.torch`` datasets need no folder: rank 0 resolves
        and broadcasts. See docs/dataloader-training.md.
    byte_cache_bytes: keep the bytes read on disk, up to this many, for every process
        of the machine and the next epoch (0: off). Files whose version is known before
        they are read (Hub files, S3 objects) are kept in 1 MiB blocks, each fetched once
        per machine, the least recently used evicted; see ``_byte_cache``.
    byte_cache_dir: where those blocks live; default ``{cache_dir}/bytes``. A local
        disk: the cache is read at its speed.
    verify_checksums: verify the CRC of every Parquet page that carries one (files
        written with ``write_page_checksum=True``): a page whose bytes changed raises
        ``DecodeError`` naming the file and row group instead of giving wrong rows.
        Pages without a CRC are read as before. False skips the check.
    max_whole_video_bytes: for a video without an MP4 index read by range
        (Matroska/WebM, fragmented MP4, an edit list or codec the index reader does not
        take), which FFmpeg demuxes: the largest read whole and held for the reader's
        life. A larger one is read by range in bounded blocks, each pass of FFmpeg over
        it fetching at most this many bytes, else ``DecodeError`` naming the file.
    kept_video_bytes: a LeRobot stream keeps the video bytes it fetched, up to this
        many (the least recently used dropped first), and cuts later reads of them from
        there: a shuffled epoch's items want the bytes that earlier batches' joined
        reads brought (0: off). See ``_kept_bytes``.
    elastic: the epoch's order is a function of (dataset, seed, epoch) only, and the
        consumers (rank x DataLoader worker) take every n-th unit of it: Parquet slices,
        TAR shards, LeRobot episodes. The states of all consumers merge into one job
        state (``aiostream_hf.merge_states``) that a job of any size loads: each sample
        once over the epoch, none read again. See docs/elastic-resume.md.
    slice_bytes: with ``elastic``, a Parquet file is cut into slices of this many bytes,
        each a unit holding the row groups that start in it, so that one large file is
        shared by row group across consumers.
    shuffle_units: with ``shuffle`` (rows, no ``batch_size``), the units (row groups or
        slices, TAR shards) read side by side, each sample drawn from one of them at
        random, in shuffle buffers of ``shuffle / shuffle_units`` samples and readaheads
        of ``prefetch_bytes / shuffle_units``; 1 reads one unit after another. See
        ``aiostream_hf._interleave``.

    How ``s3://`` sources are reached (the ``s3`` extra; see docs/object-stores.md). Each
    defaults to the standard AWS variables and config files, as boto3 reads them:
    s3_endpoint_url: the store's URL (MinIO, R2, a local server); default
        ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the profile's ``endpoint_url``,
        else AWS's ``https://s3.{region}.amazonaws.com``.
    s3_region: the region requests are signed for; default ``AWS_REGION``,
        ``AWS_DEFAULT_REGION``, the profile's ``region``, else ``us-east-1``.
    s3_anonymous: send requests unsigned (a public bucket): no credentials are looked up.
    s3_credentials: ``{"aws_access_key_id": ..., "aws_secret_access_key": ...,
        "aws_session_token": ...}`` (the token optional); default the AWS credential chain
        (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
        ``AWS_PROFILE`` and the shared files, SSO, container and instance roles).
    s3_addressing: "path" (``ENDPOINT/BUCKET/KEY``), "virtual" (``BUCKET.HOST/KEY``) or
        "auto" (the profile's ``s3.addressing_style``, else virtual on AWS, path elsewhere).
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
    rate_limit_reserve: int = 0
    cache_dir: Path | None = None
    pin_ttl: float = 10.0
    manifest_dir: Path | None = None
    byte_cache_bytes: int = 0
    byte_cache_dir: Path | None = None
    verify_checksums: bool = True
    max_whole_video_bytes: int = 1024 * _MiB
    kept_video_bytes: int = 64 * _MiB
    elastic: bool = False
    slice_bytes: int = 64 * _MiB
    shuffle_units: int = 1
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_anonymous: bool = False
    s3_credentials: Mapping[str, str] | None = field(default=None, repr=False, hash=False)
    s3_addressing: str = "auto"

    def __post_init__(self) -> None:
        for name, least in _COUNTS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise SourceError(f"StreamOptions.{name}={value!r}: give a whole number >= {least}")
        for name, bound in _SECONDS.items():
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or not (value > 0 if bound == ">" else value >= 0)
            ):
                raise SourceError(f"StreamOptions.{name}={value!r}: give a finite number {bound} 0")
        for name in ("verify_checksums", "s3_anonymous", "elastic"):
            if not isinstance(getattr(self, name), bool):
                raise SourceError(
                    f"StreamOptions.{name}={getattr(self, name)!r}: give True or False"
                )
        for name in ("s3_endpoint_url", "s3_region"):
            if not isinstance(getattr(self, name), (str, type(None))):
                raise SourceError(
                    f"StreamOptions.{name}={getattr(self, name)!r}: give a string, or None "
                    "for the AWS default"
                )
        for name in ("cache_dir", "byte_cache_dir", "manifest_dir"):
            folder = getattr(self, name)
            if folder is not None and not isinstance(folder, (str, os.PathLike)):
                raise SourceError(
                    f"StreamOptions.{name}={folder!r}: give a folder path (a str or "
                    "pathlib.Path), or None for the default"
                )
        if self.s3_addressing not in _S3_ADDRESSING:
            raise SourceError(
                f"StreamOptions.s3_addressing={self.s3_addressing!r}: use one of "
                f"{', '.join(map(repr, _S3_ADDRESSING))}"
            )
        creds = self.s3_credentials
        if creds is not None:
            if (
                not isinstance(creds, Mapping)
                or not set(creds) <= set(_S3_CREDENTIAL_KEYS)
                or not all(isinstance(v, str) for v in creds.values())
                or not (creds.get("aws_access_key_id") and creds.get("aws_secret_access_key"))
            ):
                raise SourceError(
                    "StreamOptions.s3_credentials: give a mapping of 'aws_access_key_id' and "
                    "'aws_secret_access_key' (and 'aws_session_token' if any) to strings"
                )
            if self.s3_anonymous:
                raise SourceError(
                    "StreamOptions: s3_anonymous=True sends requests unsigned; drop "
                    "s3_credentials, or s3_anonymous"
                )

    def pacing(self) -> Pacing:
        """How these options spend rate-limit quotas: counts shared in the cache folder."""
        return Pacing(self.resolved_cache_dir(), self.rate_limit_reserve)

    def resolved_byte_cache_dir(self) -> Path:
        """byte_cache_dir, else ``bytes/`` in the resolved cache_dir."""
        if self.byte_cache_dir is not None:
            return Path(self.byte_cache_dir)
        return self.resolved_cache_dir() / "bytes"

    def resolved_manifest_dir(self) -> Path | None:
        """manifest_dir, else $AIOSTREAM_HF_MANIFEST_DIR, else None (no job folder)."""
        if self.manifest_dir is not None:
            return Path(self.manifest_dir)
        env = os.environ.get("AIOSTREAM_HF_MANIFEST_DIR")
        return Path(env) if env else None

    def resolved_cache_dir(self) -> Path:
        """cache_dir, else $AIOSTREAM_HF_CACHE, else the user cache dir."""
        if self.cache_dir is not None:
            return Path(self.cache_dir)
        env = os.environ.get("AIOSTREAM_HF_CACHE")
        if env:
            return Path(env)
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "aiostream-hf"
