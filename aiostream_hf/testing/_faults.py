"""What the local Hub server does to requests on purpose: faults and rate limits.

Both are plain values (frozen dataclasses) that the server takes at start and
that can be replaced while it runs (``HubServer.set_faults``). Decisions are
made by a seeded RNG and per-target request counters, so a run is repeatable.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from .._exceptions import HubServerError

__all__ = ["BUCKETS", "FaultDecision", "FaultInjector", "Faults", "RateLimiter", "RateLimits"]

Bucket = Literal["api", "resolvers", "pages", "cdn"]
BUCKETS: tuple[Bucket, ...] = ("api", "resolvers", "pages", "cdn")
_DEFAULT_TARGETS: tuple[Bucket, ...] = ("resolvers", "cdn")


@dataclass(frozen=True)
class Faults:
    """Faults to inject. Each fault happens by rate (a probability per request)
    or by schedule (every Nth request of its targets, or the request numbers
    in ``*_at``, counted from 1 per target bucket), or all of these.

    ``latency_ms`` is added to every request (a round trip); bandwidth caps
    are in bytes per second, per connection and for the whole server.
    Error, cut and slow-first-byte faults apply to requests whose bucket is in
    ``targets`` ("api", "resolvers", "pages", "cdn"); a cut closes the
    connection after ``cut_fraction`` of the body.
    """

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

    def __post_init__(self) -> None:
        for name in ("error_rate", "cut_rate", "slow_first_byte_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise HubServerError(f"Faults.{name}={value!r}: a rate is between 0 and 1")
        for name in ("error_every", "cut_every", "slow_first_byte_every"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise HubServerError(f"Faults.{name}={value!r}: must be None or >= 1")
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
        values = dict(data)
        for name in ("targets", "error_at", "cut_at", "slow_first_byte_at"):
            if name in values:
                values[name] = tuple(values[name])
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


@dataclass(frozen=True)
class FaultDecision:
    """What happens to one request."""

    error: bool = False
    cut: bool = False
    slow_first_byte: bool = False


@dataclass
class FaultInjector:
    """Decides, per request, which faults apply (thread-safe, seeded)."""

    faults: Faults
    _rng: random.Random = field(init=False)
    _counts: dict[str, int] = field(init=False, default_factory=dict)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.faults.seed)

    def replace(self, faults: Faults) -> None:
        with self._lock:
            self.faults = faults
            self._rng = random.Random(faults.seed)
            self._counts.clear()

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

            error = hit(f.error_rate, f.error_every, f.error_at)
            cut = has_body and not error and hit(f.cut_rate, f.cut_every, f.cut_at)
            slow = not error and hit(
                f.slow_first_byte_rate, f.slow_first_byte_every, f.slow_first_byte_at
            )
        return FaultDecision(error=error, cut=cut, slow_first_byte=slow)


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
