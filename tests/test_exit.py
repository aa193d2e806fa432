"""A script that ends with an iterator half-read exits at once, printing nothing.

The common "train N steps, then exit" script: ``it = iter(stream); next(it)`` a few
times, and the script ends with the iterator, its producer on the bridge thread and
its sockets still alive. Each case runs tests/exit_script.py in a fresh interpreter
against the local Hub server; a hang fails at the subprocess timeout, anything on
stderr (an "Exception ignored ..." from a finaliser) fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import exit_script
import pytest

import aiostream_hf as ash
from aiostream_hf.testing import Faults, HubServer

SCRIPT = Path(__file__).with_name("exit_script.py")
TIMEOUT = 60  # seconds: only a hang takes this long


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp("hub")
    exit_script.make_repos(r)
    return r


@pytest.fixture(scope="module")
def hub(root: Path) -> Iterator[HubServer]:
    with HubServer(root, subprocess=True) as server:
        yield server


def _exit(case: str, hub: HubServer, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run one case; its output once it has ended (a hang raises TimeoutExpired)."""
    # The script imports the package under test, wherever it lies.
    package = str(Path(ash.__file__).parents[1])
    path = os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), case, hub.endpoint, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("left "), done.stdout  # it got as far as its last line
    return done


@pytest.mark.parametrize("case", ["parquet", "tar", "mix", "lerobot", "gopen"])
def test_a_half_read_iterator_left_at_exit(case: str, hub: HubServer, tmp_path: Path) -> None:
    done = _exit(case, hub, tmp_path)
    assert done.stderr == ""


@pytest.mark.torch
def test_a_half_read_dataloader_left_at_exit(hub: HubServer, tmp_path: Path) -> None:
    done = _exit("torch", hub, tmp_path)
    assert done.stderr == ""


def test_a_producer_blocked_in_a_read_of_a_stalled_server(root: Path, tmp_path: Path) -> None:
    # Every shard's GET sends its first 64 KiB, then nothing for ten minutes: the
    # script's first samples arrive, and its producer waits in a read at exit.
    stall = Faults(
        trickle_rate=1.0, trickle_bytes=64 * 1024, trickle_interval_ms=600_000, targets=("cdn",)
    )
    with HubServer(root, lfs_threshold=1, faults=stall, subprocess=True) as stalled:
        done = _exit("stalled", stalled, tmp_path)
        assert stalled.stats().faults.get("trickle", 0) >= 1
    assert done.stderr == ""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("what", ["stream", "mix"])
def test_an_async_for_left_half_read(
    backend: str, what: str, hub: HubServer, tmp_path: Path
) -> None:
    case = f"async_{backend}" + ("_mix" if what == "mix" else "")
    done = _exit(case, hub, tmp_path)
    assert done.stderr == ""
