"""The request counters of the local Hub server and their record, ``HubStats``.

``HubApp`` bumps the counters under their lock as it serves; ``HubServer.stats()``
reads a snapshot (over ``/_emulator/stats`` when the server is a subprocess).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_PATHS_KEPT", "HubStats"]

#: How many request lines ``HubStats.paths`` keeps (the latest).
MAX_PATHS_KEPT = 10_000


@dataclass(frozen=True)
class HubStats:
    """Counts since start (or the last reset), read with ``HubServer.stats()``."""

    requests: int
    by_bucket: Mapping[str, int]
    by_endpoint: Mapping[str, int]
    by_status: Mapping[int, int]
    bytes_served: int
    peak_concurrent: int
    throttled: int
    faults: Mapping[str, int]
    connections: int = 0  # distinct client connections (peer address and port) seen
    # requests to the CDN that carried an Authorization header (a token must never go there)
    cdn_authorized: int = 0
    # "hub GET /raw/path" or "cdn GET /raw/path" (as sent, query cut) of the latest
    # MAX_PATHS_KEPT requests, oldest first: where a client went
    paths: tuple[str, ...] = ()
    # requests under way at the snapshot, and requests the server holds but has not begun
    # (bytes unread on a connection, a connection not yet accepted): a response's last
    # bytes are counted once its client may already have read them, and a request a client
    # sent just before it closed is served after (``HubServer.wait_idle`` waits for 0)
    in_flight: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_bucket": dict(self.by_bucket),
            "by_endpoint": dict(self.by_endpoint),
            "by_status": {str(k): v for k, v in self.by_status.items()},
            "bytes_served": self.bytes_served,
            "peak_concurrent": self.peak_concurrent,
            "throttled": self.throttled,
            "faults": dict(self.faults),
            "connections": self.connections,
            "cdn_authorized": self.cdn_authorized,
            "paths": list(self.paths),
            "in_flight": self.in_flight,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HubStats:
        return cls(
            requests=data["requests"],
            by_bucket=data["by_bucket"],
            by_endpoint=data["by_endpoint"],
            by_status={int(k): v for k, v in data["by_status"].items()},
            bytes_served=data["bytes_served"],
            peak_concurrent=data["peak_concurrent"],
            throttled=data["throttled"],
            faults=data["faults"],
            connections=data.get("connections", 0),
            cdn_authorized=data.get("cdn_authorized", 0),
            paths=tuple(data.get("paths", ())),
            in_flight=data.get("in_flight", 0),
        )


class _Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.by_bucket: dict[str, int] = {}
        self.by_endpoint: dict[str, int] = {}
        self.by_status: dict[int, int] = {}
        self.bytes_served = 0
        # requests under way are a state, not a count: a reset keeps them (it would go
        # negative as they end)
        self.concurrent = getattr(self, "concurrent", 0)
        self.peak_concurrent = self.concurrent
        self.throttled = 0
        self.faults: dict[str, int] = {}
        self.peers: set[tuple[str, int]] = set()  # bounded by the ports of one host
        self.cdn_authorized = 0
        self.paths: deque[str] = deque(maxlen=MAX_PATHS_KEPT)

    def bump(self, table: dict[Any, int], key: Any, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n

    def snapshot(self, waiting: int = 0) -> HubStats:
        """The counts; ``waiting``: requests the server holds but has not begun to serve,
        counted in ``in_flight``."""
        with self.lock:
            return HubStats(
                self.requests,
                dict(self.by_bucket),
                dict(self.by_endpoint),
                dict(self.by_status),
                self.bytes_served,
                self.peak_concurrent,
                self.throttled,
                dict(self.faults),
                len(self.peers),
                self.cdn_authorized,
                tuple(self.paths),
                self.concurrent + waiting,
            )
