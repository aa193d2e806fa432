"""What the local Hub server does to requests on purpose: faults and rate limits.

Both are plain values (frozen dataclasses) that the server takes at start and
that can be replaced while it runs (``HubServer.set_faults``). Decisions are
made by a seeded RNG and per-target request counters, so a run is repeatable.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Literal

from .._exceptions import HubServerError

__all__ = [
    "API_ENDPOINTS",
    "BUCKETS",
    "FaultDecision",
    "FaultInjector",
    "Faults",
    "INVERT",
    "REPLACEMENT_FILL",
    "RateLimiter",
    "RateLimits",
]

Bucket = Literal["api", "resolvers", "pages", "cdn"]
ByteBucket = Literal["resolvers", "cdn"]  # the buckets whose answers serve file bytes
EtagStyle = Literal["strong", "weak", "none"]
EndlessPages = Literal["repeat", "empty", "fresh"]
BUCKETS: tuple[Bucket, ...] = ("api", "resolvers", "pages", "cdn")
API_ENDPOINTS: tuple[str, ...] = ("dataset_info", "paths_info", "refs", "tree")
_DEFAULT_TARGETS: tuple[Bucket, ...] = ("resolvers", "cdn")
_BYTE_BUCKETS: tuple[ByteBucket, ...] = ("resolvers", "cdn")
REPLACEMENT_FILL = b"\xa5"  # past the end of the original, a replaced file holds these
INVERT = bytes(range(255, -1, -1))  # bytes.translate table: every byte inverted (b ^ 0xFF)


@dataclass(frozen=True)
class Faults:
    """Faults to inject, all off by default. Each fault happens by rate (a
    probability per request) or by schedule (every Nth request of its targets,
    or the request numbers in ``*_at``, counted from 1 per target bucket), or
    all of these; the RNG is seeded (``seed``), so a run repeats.

    Transport faults, for requests whose bucket is in ``targets`` ("api",
    "resolvers", "pages", "cdn"):

    - ``latency_ms`` is added to every request (a round trip); bandwidth caps
      are in bytes per second, per connection and for the whole server.
    - ``error_*``: the answer is ``error_status`` (a 5xx).
    - ``cut_*``: the connection closes after ``cut_fraction`` of the body.
    - ``slow_first_byte_*``: the body starts after ``slow_first_byte_ms``.

    Hostile modes (docs/testing.md, "Hostile modes"):

    - ``trickle_*``: the body goes out ``trickle_bytes`` at a time, one piece
      every ``trickle_interval_ms``, until the client goes away: a client with
      only a per-read timeout waits forever.
    - ``length_lie_*``: ``Content-Length`` is off by ``length_lie_bytes``. Over
      (> 0): the true body is sent, then the connection closes; under (< 0):
      only the announced bytes are sent, in a complete, short answer.
    - ``redirect_loop_*``: the answer is a 302 to the request's own URL.
    - ``replace_after``: the server serves other bytes for a file after its
      Nth request (CDN requests for LFS files, /resolve/ requests for files the
      Hub serves itself; HEAD included; counted per repo and path, from 0 after
      ``set_faults``), for ``replace_path`` only or every path when it is None.
      The bytes are ``Faults.replacement(original)``: every byte inverted,
      cut or padded (0xA5) to ``replace_size`` (None: the same size). They
      carry a new ETag (their sha256 on the CDN, their git oid on the Hub),
      unless ``replace_keeps_etag`` (a lying CDN). The API (tree, paths-info,
      commit sha) keeps describing the file on disk.
    - ``ignore_if_match``: the buckets ("resolvers", "cdn") that never answer
      412; elsewhere ``If-Match`` with a stale ETag answers 412.
    - ``etag_style`` ("strong", "weak": ``W/"..."``, "none": no ETag) for the
      answers that serve bytes (a 200/206 from /resolve/, the CDN) of the
      buckets in ``etag_targets``; ``last_modified=False`` drops
      ``Last-Modified`` there too. With weak ETags, ``If-Match`` and
      ``If-Range`` use the strong comparison (RFC 9110), so they never match;
      with none, they are ignored.
    - ``endless_pages``: the tree listing announces a next page forever, with a
      new cursor each time; past its real end it serves "repeat" (the pages
      again from the first), "empty" (``[]``) or "fresh" (new entries
      ``endless-NNNNNNNNN.txt`` that do not exist).
    - ``pad_api_bytes``: 200 JSON answers of the API endpoints in
      ``pad_api_endpoints`` are padded with trailing spaces (still valid JSON)
      to that many bytes; ``pad_text_bytes``: the files in ``pad_text_paths``
      are served padded with newlines to that many bytes (with their new ETag).
    - ``hostile_tree_paths``: file entries with these paths are added to every
      tree listing, to paths-info (when asked) and to the siblings of the repo
      info; they do not resolve (404). ``Faults.HOSTILE_PATHS`` holds a
      ``..``, an absolute and a ``%2F..`` path.
    """

    HOSTILE_PATHS: ClassVar[tuple[str, ...]] = (
        "../outside.parquet",
        "/etc/absolute.parquet",
        "data/%2F..%2F..%2Fescaped.parquet",
    )

    latency_ms: float = 0.0
    bandwidth_per_connection: float | None = None
    bandwidth_total: float | None = None
    error_rate: float = 0.0
    error_every: int | None = None
    error_at: tuple[int, ...] = ()
    error_status: int = 503
    cut_rate: float = 0.0
    cut_every: int | None = None
    cut_at: tuple[int, ...] = ()
    cut_fraction: float = 0.5
    slow_first_byte_rate: float = 0.0
    slow_first_byte_every: int | None = None
    slow_first_byte_at: tuple[int, ...] = ()
    slow_first_byte_ms: float = 1000.0
    targets: tuple[Bucket, ...] = _DEFAULT_TARGETS
    seed: int = 0
    # -- hostile modes -------------------------------------------------------
    trickle_rate: float = 0.0
    trickle_every: int | None = None
    trickle_at: tuple[int, ...] = ()
    trickle_bytes: int = 1
    trickle_interval_ms: float = 500.0
    length_lie_rate: float = 0.0
    length_lie_every: int | None = None
    length_lie_at: tuple[int, ...] = ()
    length_lie_bytes: int = 1
    redirect_loop_rate: float = 0.0
    redirect_loop_every: int | None = None
    redirect_loop_at: tuple[int, ...] = ()
    replace_after: int | None = None
    replace_path: str | None = None
    replace_size: int | None = None
    replace_keeps_etag: bool = False
    ignore_if_match: tuple[ByteBucket, ...] = ()
    etag_style: EtagStyle = "strong"
    etag_targets: tuple[ByteBucket, ...] = _BYTE_BUCKETS
    last_modified: bool = True
    endless_pages: EndlessPages | None = None
    pad_api_bytes: int | None = None
    pad_api_endpoints: tuple[str, ...] = API_ENDPOINTS
    pad_text_bytes: int | None = None
    pad_text_paths: tuple[str, ...] = ("README.md", ".huggingface.yaml")
    hostile_tree_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_finite(self)
        for name in (
            "error_rate",
            "cut_rate",
            "slow_first_byte_rate",
            "trickle_rate",
            "length_lie_rate",
            "redirect_loop_rate",
        ):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise HubServerError(f"Faults.{name}={value!r}: a rate is between 0 and 1")
        for name in (
            "error_every",
            "cut_every",
            "slow_first_byte_every",
            "trickle_every",
            "length_lie_every",
            "redirect_loop_every",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise HubServerError(f"Faults.{name}={value!r}: must be None or >= 1")
        for name in (
            "error_at",
            "cut_at",
            "slow_first_byte_at",
            "trickle_at",
            "length_lie_at",
            "redirect_loop_at",
        ):
            bad = [n for n in getattr(self, name) if not isinstance(n, int) or n < 1]
            if bad:
                raise HubServerError(
                    f"Faults.{name}: {bad} are not request numbers (they count from 1)"
                )
        for name in ("bandwidth_per_connection", "bandwidth_total"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise HubServerError(f"Faults.{name}={value!r}: bytes/s must be > 0 or None")
        if self.latency_ms < 0 or self.slow_first_byte_ms < 0:
            raise HubServerError("Faults: latency_ms and slow_first_byte_ms must be >= 0")
        if not 0.0 <= self.cut_fraction < 1.0:
            raise HubServerError(f"Faults.cut_fraction={self.cut_fraction!r}: must be in [0, 1)")
        if not 500 <= self.error_status <= 599:
            raise HubServerError(f"Faults.error_status={self.error_status!r}: must be a 5xx")
        unknown = set(self.targets) - set(BUCKETS)
        if unknown:
            raise HubServerError(f"Faults.targets: unknown {sorted(unknown)}; use {BUCKETS}")
        self._check_hostile()

    def _check_hostile(self) -> None:
        if self.trickle_bytes < 1:
            raise HubServerError(
                f"Faults.trickle_bytes={self.trickle_bytes!r}: send at least 1 byte a time"
            )
        if not self.trickle_interval_ms > 0:
            raise HubServerError(
                f"Faults.trickle_interval_ms={self.trickle_interval_ms!r}: must be > 0"
            )
        if self.length_lie_bytes == 0:
            raise HubServerError(
                "Faults.length_lie_bytes=0 is no lie: use > 0 to announce more bytes than "
                "are sent, < 0 to announce (and send) fewer"
            )
        for name in ("replace_after", "replace_size", "pad_api_bytes", "pad_text_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise HubServerError(f"Faults.{name}={value!r}: must be None or an int >= 0")
        if self.replace_path is not None and not self.replace_path.strip("/"):
            raise HubServerError(
                f"Faults.replace_path={self.replace_path!r}: name a file of the repo "
                "(e.g. 'data/train.parquet'), or None for every file"
            )
        for name in ("ignore_if_match", "etag_targets"):
            unknown = set(getattr(self, name)) - set(_BYTE_BUCKETS)
            if unknown:
                raise HubServerError(
                    f"Faults.{name}: unknown {sorted(unknown)}; use {_BYTE_BUCKETS}"
                )
        if self.etag_style not in ("strong", "weak", "none"):
            raise HubServerError(
                f"Faults.etag_style={self.etag_style!r}: use 'strong', 'weak' or 'none'"
            )
        if self.endless_pages not in (None, "repeat", "empty", "fresh"):
            raise HubServerError(
                f"Faults.endless_pages={self.endless_pages!r}: use None, 'repeat', "
                "'empty' or 'fresh'"
            )
        unknown = set(self.pad_api_endpoints) - set(API_ENDPOINTS)
        if unknown:
            raise HubServerError(
                f"Faults.pad_api_endpoints: unknown {sorted(unknown)}; use {API_ENDPOINTS}"
            )
        for name in ("pad_text_paths", "hostile_tree_paths"):
            bad = [p for p in getattr(self, name) if not isinstance(p, str) or not p]
            if bad:
                raise HubServerError(f"Faults.{name}: {bad!r} are not paths (non-empty strings)")

    def replacement(self, original: bytes) -> bytes:
        """The bytes served for a file replaced by ``replace_after`` (what a test expects)."""
        size = len(original) if self.replace_size is None else self.replace_size
        inverted = original[:size].translate(INVERT)
        return inverted + REPLACEMENT_FILL * (size - len(inverted))

    def replaces(self, path: str) -> bool:
        """Whether ``replace_after`` applies to this path of a repo."""
        return self.replace_after is not None and (
            self.replace_path is None or self.replace_path.strip("/") == path
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Faults:
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise HubServerError(
                f"Faults: unknown fields {sorted(unknown)}; known: {sorted(names)}"
            )
        # JSON has no tuples: every list is one of the tuple fields.
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items()
        }
        return cls(**values)


@dataclass(frozen=True)
class RateLimits:
    """Quotas per client per fixed window, by bucket (None: unlimited).

    The Hub's published quotas per 5 minutes for anonymous users are api 500,
    resolvers 3,000; ``RateLimits.hub_anonymous()`` gives those.
    """

    api: int | None = None
    resolvers: int | None = None
    pages: int | None = None
    window_s: float = 300.0

    def __post_init__(self) -> None:
        _check_finite(self)
        if self.window_s <= 0:
            raise HubServerError(f"RateLimits.window_s={self.window_s!r}: must be > 0")
        for name in ("api", "resolvers", "pages"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise HubServerError(f"RateLimits.{name}={value!r}: must be >= 0 or None")

    @classmethod
    def hub_anonymous(cls) -> RateLimits:
        return cls(api=500, resolvers=3000, pages=100)

    def quota(self, bucket: str) -> int | None:
        return getattr(self, bucket, None) if bucket in ("api", "resolvers", "pages") else None


def _check_finite(value: Faults | RateLimits) -> None:
    """Refuse NaN and infinity in every float field of ``value`` (NaN compares false to
    every bound, so the range checks would let it through; an infinite latency or
    window never ends)."""
    for f in fields(value):
        number = getattr(value, f.name)
        if isinstance(number, float) and not math.isfinite(number):
            raise HubServerError(
                f"{type(value).__name__}.{f.name}={number!r}: must be a finite number"
            )


@dataclass(frozen=True)
class FaultDecision:
    """What happens to one request."""

    error: bool = False
    cut: bool = False
    slow_first_byte: bool = False
    redirect_loop: bool = False
    trickle: bool = False
    length_lie: bool = False


@dataclass
class FaultInjector:
    """Decides, per request, which faults apply (thread-safe, seeded)."""

    faults: Faults
    _rng: random.Random = field(init=False)
    _counts: dict[str, int] = field(init=False, default_factory=dict)
    _file_counts: dict[tuple[str, str], int] = field(init=False, default_factory=dict)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.faults.seed)

    def replace(self, faults: Faults) -> None:
        with self._lock:
            self.faults = faults
            self._rng = random.Random(faults.seed)
            self._counts.clear()
            self._file_counts.clear()

    def decide(self, bucket: str, *, has_body: bool) -> FaultDecision:
        f = self.faults
        if bucket not in f.targets:
            return FaultDecision()
        with self._lock:
            n = self._counts[bucket] = self._counts.get(bucket, 0) + 1

            def hit(rate: float, every: int | None, at: tuple[int, ...]) -> bool:
                scheduled = (every is not None and n % every == 0) or n in at
                drawn = rate > 0 and self._rng.random() < rate
                return scheduled or drawn

            # The draws of the first three come first, so adding modes keeps their runs.
            error = hit(f.error_rate, f.error_every, f.error_at)
            cut = has_body and not error and hit(f.cut_rate, f.cut_every, f.cut_at)
            slow = not error and hit(
                f.slow_first_byte_rate, f.slow_first_byte_every, f.slow_first_byte_at
            )
            loop = not error and hit(
                f.redirect_loop_rate, f.redirect_loop_every, f.redirect_loop_at
            )
            trickle = has_body and not error and hit(f.trickle_rate, f.trickle_every, f.trickle_at)
            lie = (
                has_body
                and not error
                and hit(f.length_lie_rate, f.length_lie_every, f.length_lie_at)
            )
        if loop:  # a 302 has no body to cut, slow down or lie about
            return FaultDecision(redirect_loop=True)
        return FaultDecision(
            error=error, cut=cut, slow_first_byte=slow, trickle=trickle, length_lie=lie and not cut
        )

    def replaced(self, repo_id: str, path: str, *, count: bool) -> bool:
        """Whether a file is served replaced now; ``count``: this request serves its bytes.

        Without ``count`` (a redirect to the CDN), the answer is what the file's
        next byte request would get.
        """
        f = self.faults
        if f.replace_after is None or not f.replaces(path):
            return False
        with self._lock:
            n = self._file_counts.get((repo_id, path), 0) + 1
            if count:
                self._file_counts[(repo_id, path)] = n
        return n > f.replace_after


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    remaining: int
    reset_s: int
    quota: int
    window_s: int


class RateLimiter:
    """Fixed-window request counters per (client, bucket)."""

    def __init__(self, limits: RateLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str], tuple[float, int]] = {}

    def replace(self, limits: RateLimits) -> None:
        with self._lock:
            self.limits = limits
            self._windows.clear()

    def check(self, client: str, bucket: str) -> RateDecision | None:
        """Count one request; None when the bucket has no quota."""
        quota = self.limits.quota(bucket)
        if quota is None:
            return None
        window = self.limits.window_s
        now = time.monotonic()
        with self._lock:
            start, used = self._windows.get((client, bucket), (now, 0))
            if now - start >= window:
                start, used = now, 0
            allowed = used < quota
            if allowed:
                used += 1
            self._windows[(client, bucket)] = (start, used)
            # Bounded: one entry per (client, bucket); forget windows that ended.
            if len(self._windows) > 4096:
                self._windows = {k: v for k, v in self._windows.items() if now - v[0] < window}
        reset = max(1, int(start + window - now + 0.999))
        return RateDecision(allowed, quota - used, reset, quota, int(window))
