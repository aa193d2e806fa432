"""Several processes, one rate-limit quota, against the real local Hub server.

Three worker processes (on asyncio, then on trio) each stream a third of a 24-file
repo through a resolver quota of 8 per 2-second window: 24 resolutions need 3 windows.
Each process sees only its own answers' ``RateLimit`` headers; the count they share in
the cache folder keeps them, together, within the quota: the server refuses nothing and
every row arrives exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aiostream_hf.testing import HubServer, RateLimits, make_text_parquet

HERE = Path(__file__).resolve().parent
FILES, ROWS, WORKERS = 24, 5, 3


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_worker_processes_share_a_resolver_quota_without_a_429(
    tmp_path: Path, backend: str
) -> None:
    root = tmp_path / "hub"
    data = root / "datasets" / "org" / "quota" / "data"
    for i in range(FILES):
        make_text_parquet(
            data / f"train-{i:05d}-of-{FILES:05d}.parquet",
            rows=ROWS,
            min_text=5,
            max_text=10,
            seed=i,
            start_id=i * ROWS,
        )
    limits = RateLimits(resolvers=8, window_s=2)
    with HubServer(root, rate_limits=limits) as hub:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "quota_script.py"),
                    hub.endpoint,
                    str(tmp_path / "cache"),
                    str(rank),
                    str(WORKERS),
                    str(tmp_path / f"out-{rank}.json"),
                    backend,
                ],
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(WORKERS)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
        stats = hub.stats()
    outs = [json.loads((tmp_path / f"out-{rank}.json").read_text()) for rank in range(WORKERS)]
    ids = sorted(i for out in outs for i in out["ids"])
    assert ids == list(range(FILES * ROWS))  # every row exactly once
    assert stats.throttled == 0  # the server refused nothing
    assert [out["throttled"] for out in outs] == [0] * WORKERS
    assert sum(out["paced"] for out in outs) > 0  # the quota was spent, and waited out
    assert stats.by_bucket["resolvers"] == FILES  # each file resolved once, no retry
