"""Every example runs, against its own local Hub server and against a repo it is given;
the README keeps its promises (two set-up commands, valid snippets, working links).

Examples run as users run them, ``python examples/NAME.py [SOURCE]``, in a
subprocess. "Given a repo" is tested offline: the test serves the repo from the
local Hub server and points ``HF_ENDPOINT`` at it, as a user would at the Hub.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiostream_hf.testing import (
    HubServer,
    make_lerobot_dataset,
    make_repo,
    make_text_parquet,
    make_webdataset_shards,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    # Quiet as users run them, on this machine's cores: no warning from us, torch,
    # torchdata or the DataLoader's worker-count check.
    assert "Warning" not in proc.stderr, proc.stderr
    assert "warn" not in proc.stderr.lower(), proc.stderr
    return proc.stdout


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIOSTREAM_HF_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    """Repos that stand in for "a real Hub repo given as an argument"."""
    root = tmp_path_factory.mktemp("hub")
    text = make_repo(root, "someone/text", {"README.md": "# text\n"})
    for i in range(2):
        make_text_parquet(text / f"data/train-{i:05d}-of-00002.parquet", rows=150, seed=i)
    shards = make_repo(root, "someone/shards", {"README.md": "# shards\n"})
    make_webdataset_shards(shards, shards=2, samples_per_shard=30)
    make_lerobot_dataset(
        root, "someone/robot", episodes=(20, 25), width=64, height=48, codec="h264"
    )
    with HubServer(root) as server:
        yield server


def cores() -> int:
    """The cores this process may use, as torch's DataLoader counts them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def given(hub: HubServer) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.endpoint}


# -- async service ----------------------------------------------------------------------


def test_async_service_local() -> None:
    out = run_example("async_service.py", "--limit", "300")
    assert out.startswith("local Hub server at http://localhost:")
    assert re.search(r"^scored 300 rows in [\d.]+ s", out, re.M)
    assert "the stream kept only the rows where (score > 0.5) (filter=)" in out  # not hidden
    assert "longest event-loop stall:" in out
    assert re.search(r"^requests: 2 api, \d resolvers, \d+ range reads", out, re.M)


def test_async_service_given_a_repo(hub: HubServer) -> None:
    out = run_example(
        "async_service.py", "hf://datasets/someone/text", "--limit", "0", env=given(hub)
    )
    assert re.search(r"^scored 300 rows in ", out, re.M)  # every row of both files
    assert "filter" not in out


# -- DataLoader training ----------------------------------------------------------------


@pytest.mark.torch
def test_dataloader_training_local() -> None:
    out = run_example("dataloader_training.py", "--steps", "20")
    assert "resolved 4 files in this process; workers make no API call" in out
    # One worker per core, at most 4 (2 on a 2-core machine): no more workers than cores.
    workers = re.findall(r"^trained 20 steps on 640 rows with (\d+) workers", out, re.M)
    assert workers == [str(max(1, min(4, cores())))]
    first, last = map(float, re.findall(r"loss: first ([\d.]+), last ([\d.]+)", out)[0])
    assert last < first
    assert "resumed from the checkpoint at step 10: next batch identical: True" in out


@pytest.mark.torch
def test_dataloader_training_given_a_repo(hub: HubServer) -> None:
    args = ["hf://datasets/someone/text", "--steps", "6", "--batch-size", "16", "--shuffle", "64"]
    out = run_example("dataloader_training.py", *args, env=given(hub))
    assert "resolved 2 files in this process" in out
    assert "next batch identical: True" in out


def torchrun(nproc: int, *args: str, env: dict[str, str]) -> str:
    """``torchrun --standalone --nproc_per_node N examples/elastic_torchrun.py ARGS``, as
    a user runs it (``python -m torch.distributed.run`` is torchrun); its output."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", str(nproc), str(EXAMPLES / "elastic_torchrun.py"), *args]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env},
        cwd=ROOT,
        start_new_session=True,  # the agent, its ranks and their workers: one group to end
    )
    try:
        out, _ = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, out[-4000:]
    assert "Traceback" not in out, out
    assert "warn" not in out.lower(), out  # quiet: no warning from us, torch or torchdata
    return out


API_ANSWER = 4096  # bytes: the most an API answer about demo/elastic-text takes (791, 2203)


@pytest.mark.torch
@pytest.mark.skipif(sys.platform != "linux", reason="gloo on loopback")
def test_elastic_torchrun_2_ranks_x_1_worker_resume_as_1_rank_x_2_workers(
    tmp_path: Path,
) -> None:
    """The two torchrun jobs of docs/dataloader-training.md: every sample once over both,
    and the second job reads nothing the first one delivered (the server's byte count),
    with --coalesce-gap 0: by default the fetcher fetches nearby ranges of a file as one
    request, holes included, which can re-fetch a partial unit's delivered row groups,
    depending on which reads a worker makes together (seen in 2 of 6 runs)."""
    import torch
    from elastic_helpers import parquet_bound

    data = tmp_path / "hub"
    made = run_example("elastic_torchrun.py", "--make-data", str(data))
    assert "(2,000 rows)" in made
    slice_bytes, batch, stop = 100_000, 8, 20
    common = ["hf://datasets/demo/elastic-text", "--slice-bytes", str(slice_bytes)]
    common += ["--batch-size", str(batch), "--record", str(tmp_path / "seen")]
    common += ["--coalesce-gap", "0"]  # exact reads: no hole between two ranges fetched
    ckpt = tmp_path / "ckpt.pt"
    files = sorted((data / "datasets/demo/elastic-text/data").glob("*.parquet"))
    bound = parquet_bound(files, slice_bytes, seed=0, shuffle=True)
    with HubServer(data) as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        first = torchrun(2, *common, "--workers", "1", "--stop-after", str(stop),
                         "--checkpoint", str(ckpt), env=env)  # fmt: skip
        assert f"saved the job's state at step {stop} to {ckpt}" in first
        served = hub.wait_idle()
        # One resolution for the job: rank 0 resolved and broadcast (pin and listing).
        assert served.by_bucket.get("api", 0) <= 2, served.by_bucket
        job = torch.load(ckpt)["data"]
        assert job["kind"] == "job"
        base = job["elastic"]["base"]
        assert base["frontier"] > 0 or base["done"]  # the first job finished units
        assert bound(job) < bound(None)
        hub.reset_stats()
        rest = torchrun(1, *common, "--workers", "2", "--resume", str(ckpt), env=env)
        # Nothing delivered is read again: each unit left from the row group it stopped
        # in, and its footer read (and the API's answers: under 4 KiB each here).
        served = hub.wait_idle()
        assert served.bytes_served <= bound(job) + API_ANSWER * served.by_bucket.get("api", 0)
    assert "2,000 samples, each once: True" in rest
    records = {p.name: json.loads(p.read_text()) for p in (tmp_path / "seen").glob("*.json")}
    assert sorted(records) == [
        "from-step-0-rank-0.json",
        "from-step-0-rank-1.json",
        f"from-step-{stop}-rank-0.json",
    ]
    assert [len(records[f"from-step-0-rank-{r}.json"]) for r in (0, 1)] == [stop * batch] * 2
    ids = [i for got in records.values() for i in got]
    assert len(ids) == 2000  # nothing twice...
    assert sorted(ids) == list(range(2000))  # ...nothing lost
    # The job state carried positions mid-unit and the shuffle buffers' rows.
    assert job["elastic"]["base"]["partial"]
    assert job["elastic"]["base"]["buffer"]


def test_the_torchrun_page_shows_the_example_as_it_is() -> None:
    """docs/dataloader-training.md shows examples/elastic_torchrun.py whole: the file the
    test above runs, so the page and the file cannot drift apart."""
    page = (ROOT / "docs" / "dataloader-training.md").read_text(encoding="utf-8")
    marker = page.index("this very file, and checks that it is the one in examples/")
    start = page.index("```python\n", marker) + len("```python\n")
    shown = page[start : page.index("\n```\n", start) + 1]
    assert shown == (EXAMPLES / "elastic_torchrun.py").read_text(encoding="utf-8")
    for command in ("--nproc_per_node 2", "--nproc_per_node 3", "--resume /tmp/ckpt.pt"):
        assert command in page


# -- WebDataset -------------------------------------------------------------------------


def test_webdataset_training_local() -> None:
    out = run_example("webdataset_training.py", "--limit", "120")
    assert "/datasets/org/shards/resolve/main/train-{000000..000003}.tar" in out
    assert "120 samples (64x48 images) from 4 shards" in out
    assert re.search(r"^classes seen: \{0: \d+", out, re.M)
    assert re.search(r"^resumed after 120 samples: next keys \[.*\], as expected: True$", out, re.M)


def test_webdataset_training_given_urls(hub: HubServer) -> None:
    urls = f"{hub.endpoint}/datasets/someone/shards/resolve/main/train-{{000000..000001}}.tar"
    out = run_example("webdataset_training.py", urls, "--limit", "60", "--shuffle", "0")
    assert "60 samples (64x48 images) from 2 shards" in out
    assert "as expected: True" in out


# -- LeRobot frames ---------------------------------------------------------------------


def test_robot_frames_local() -> None:
    out = run_example("robot_frames.py", "--items", "12")
    assert "LeRobot v3.0, 3 episodes, 135 frames at 30 fps" in out
    assert "12 shuffled items in " in out
    assert "observation.images.top: uint8 (2, 480, 640, 3) at t[-0.033, 0.0] s" in out
    assert "observation.images.top_is_pad" in out
    assert re.search(r"frames_at\(\[.*\]\) -> \(3, 480, 640, 3\)", out)
    # Reads counted as reads: the index read of a small file holds it whole (was "0 frame
    # reads" beside its bytes).
    assert re.search(r"video bytes fetched: [\d,]+ in 1 read \(1 video file;", out)


def test_robot_frames_given_a_repo(hub: HubServer) -> None:
    args = ["hf://datasets/someone/robot", "--items", "5", "--window", "3"]
    out = run_example("robot_frames.py", *args, env=given(hub))
    assert "LeRobot v3.0, 2 episodes, 45 frames at 30 fps" in out
    assert "(3, 48, 64, 3) at t[-0.067, -0.033, 0.0] s" in out


# -- README and docs --------------------------------------------------------------------


def readme() -> str:
    return (ROOT / "README.md").read_text()


def test_readme_has_exactly_two_setup_commands() -> None:
    commands = [
        line.strip() for line in readme().splitlines() if line.startswith("    python3 -m venv ")
    ]
    assert len(commands) == 2, commands
    demo, tests = commands
    assert demo.endswith(".venv/bin/aiostream-hf demo")
    assert "'.[server]'" in demo  # the demo serves its datasets from the local Hub server
    # two processes: the suite fits the 10-minute budget on 2 cores
    assert tests.endswith(".venv/bin/python -m pytest -n 2")
    # .ci/run runs the first indented line under "## Run the tests": the test command.
    section = readme().split("## Run the tests", 1)[1]
    first = next(line for line in section.splitlines() if line.startswith("    "))
    assert first.strip() == tests


def test_readme_snippets_are_python() -> None:
    snippets = re.findall(r"```python\n(.*?)```", readme(), re.S)
    assert len(snippets) >= 4  # one per user family
    for snippet in snippets:
        ast.parse(snippet)


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]
)
def test_links_to_local_files_resolve(page: str) -> None:
    path = ROOT / page if page == "README.md" else ROOT / "docs" / page
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{page}: broken link {target}"
