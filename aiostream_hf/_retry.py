"""Retry timing shared by every HTTP client of the package: backoff and Retry-After."""

from __future__ import annotations

import random
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

__all__ = ["backoff_delay", "retry_after"]


def backoff_delay(failures: int, base: float, cap: float, rng: random.Random) -> float:
    """Jittered exponential backoff: between half and all of base * 2**(failures-1), capped."""
    ceiling = min(cap, base * 2.0 ** min(failures - 1, 62))
    return ceiling * (0.5 + 0.5 * rng.random())


def retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delay-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())
