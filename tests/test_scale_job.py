"""Many consumers of one job under the Hub's real quotas (issue 32, line 7), at CI size:
32 consumers (4 processes x 8 streams, on asyncio and on trio) against the local Hub
server with ``RateLimits.hub_anonymous()``, every consumer on one client address (one
quota for the whole job): no answer 429, every row delivered exactly once, every
consumer with rows to read, one resolution for the job.

benchmarks/scale_bench.py runs the same job at 256 consumers (16 processes x 16) and
records its memory. The processes are forked by tests/job_rank_script.py ("shared"
mode): two simulated nodes of two processes, each node with its own cache folder, one
``manifest_dir`` for the job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiostream_hf.testing import HubServer, RateLimits, make_repo, make_text_parquet

HERE = Path(__file__).parent
REPO = "org/scale"
SOURCE = f"hf://datasets/{REPO}"
FILES, ROWS = 4, 64  # rows per file, in row groups of 2: 128 row groups, 4 per consumer
PROCESSES, PER_NODE, CONSUMERS = 4, 2, 8  # 32 consumers


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    folder = make_repo(root, REPO, {})
    for i in range(FILES):
        make_text_parquet(
            folder / "data" / f"train-{i:05d}-of-{FILES:05d}.parquet",
            rows=ROWS,
            row_group_size=2,
            start_id=i * ROWS,
            seed=i,
            min_text=5,
            max_text=20,
        )
    return root


@pytest.fixture
def hub(root: Path) -> Iterator[HubServer]:
    with HubServer(root, rate_limits=RateLimits.hub_anonymous()) as server:
        yield server


def _run_job(hub: HubServer, tmp_path: Path, **extra: Any) -> list[dict[str, Any]]:
    config = {
        "mode": "shared",
        "endpoint": hub.endpoint,
        "source": SOURCE,
        "splits": ["train"] * PROCESSES,
        "ranks": PROCESSES,
        "per_node": PER_NODE,
        "workers": CONSUMERS,
        "tmp": str(tmp_path),
        **extra,
    }
    launcher = subprocess.Popen(
        [sys.executable, str(HERE / "job_rank_script.py"), json.dumps(config)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the launcher and its forked ranks: one group to end
    )
    try:
        output, _ = launcher.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.communicate()
        raise
    assert launcher.returncode == 0, output[-3000:]
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(PROCESSES)]


@pytest.mark.parametrize(
    "plan",
    [{}, {"slice_bytes": 512}],
    ids=["row-groups", "elastic"],
)
def test_32_consumers_under_the_hubs_anonymous_quotas_read_every_row_once(
    hub: HubServer, tmp_path: Path, anyio_backend: str, plan: dict[str, Any]
) -> None:
    results = _run_job(hub, tmp_path, backend=anyio_backend, **plan)
    stats = hub.wait_idle()
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors  # a rank whose client saw a 429 fails with it
    assert stats.throttled == 0, stats.by_status
    assert 429 not in stats.by_status
    ids = [i for r in results for i in r["ids"]]
    assert len(ids) == FILES * ROWS  # nothing twice...
    assert sorted(ids) == list(range(FILES * ROWS))  # ...nothing lost
    per_consumer = [n for r in results for n in r["per_consumer"]]
    assert len(per_consumer) == PROCESSES * CONSUMERS
    assert all(per_consumer), per_consumer  # no consumer idle
    assert stats.by_bucket.get("api", 0) == 2  # the pin and the listing: once per job
    print("requests of the job:", dict(stats.by_bucket))
