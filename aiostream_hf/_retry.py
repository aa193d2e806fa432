"""Retry timing shared by every HTTP client of the package: backoff and Retry-After."""

from __future__ import annotations

import math
import random
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

__all__ = [
    "MAX_HEADER_DELAY_S",
    "NEVER_RETRIED_5XX",
    "backoff_delay",
    "clamp_delay",
    "retry_after",
    "retryable_status",
]

#: The longest delay a server's header is taken at (a year): beyond it, a server's
#: number (``Retry-After: 1e18``, ``t=99999999999999999999``) is read as this, so that
#: no clock or message overflows on it; every wait is bounded far below it anyway.
MAX_HEADER_DELAY_S = 365 * 24 * 3600.0


#: Server errors a retry cannot mend: the server does not do what was asked at all.
NEVER_RETRIED_5XX = frozenset({501, 505})


def retryable_status(status: int) -> bool:
    """The one retry rule of every request (the resolver's, the fetcher's, a store's):
    408 (request timeout), 429 (rate-limited: the host's pause is the wait) and the 5xx
    answers but 501 and 505, which a retry cannot mend."""
    return status in (408, 429) or (500 <= status <= 599 and status not in NEVER_RETRIED_5XX)


def backoff_delay(failures: int, base: float, cap: float, rng: random.Random) -> float:
    """Jittered exponential backoff: between half and all of base * 2**(failures-1), capped."""
    ceiling = min(cap, base * 2.0 ** min(failures - 1, 62))
    return ceiling * (0.5 + 0.5 * rng.random())


def clamp_delay(seconds: float) -> float | None:
    """A server's delay, in ``[0, MAX_HEADER_DELAY_S]``; None for one that is not a
    number (NaN): the caller then backs off as if none was given."""
    if math.isnan(seconds):
        return None
    return min(max(0.0, seconds), MAX_HEADER_DELAY_S)


def retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delay-seconds or an HTTP date), in
    ``[0, MAX_HEADER_DELAY_S]``; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return clamp_delay(float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return clamp_delay((when - datetime.now(timezone.utc)).total_seconds())
