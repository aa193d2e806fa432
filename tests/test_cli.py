"""The ``aiostream-hf`` command line, every command run against the local Hub server.

Commands run in-process through click's ``CliRunner`` (``hub serve`` and ``demo`` in
a subprocess, as a user runs them). Every error path must end with exit code != 0,
no traceback, and, for bad input the library rejects, exactly one line: ``Error: ...``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import click
import contact_sheets
import httpx2
import numpy as np
import pytest
from click.testing import CliRunner, Result

from aiostream_hf import HubServerError, SourceError
from aiostream_hf._demo import human_bytes
from aiostream_hf._describe import TEXT_EXTENSIONS, payload_value
from aiostream_hf.cli import main, summarize
from aiostream_hf.testing import (
    Faults,
    HubServer,
    LeRobotLayout,
    RateLimits,
    make_image_parquet,
    make_lerobot_dataset,
    make_repo,
    make_repo_split_naming,
    make_repo_yaml_configs,
    make_text_parquet,
    make_webdataset_shards,
)

FPS, W, H = 10, 64, 48
CAMERAS = ("observation.images.front", "observation.images.wrist")
LEROBOT: dict[str, Any] = {
    "fps": FPS,
    "width": W,
    "height": H,
    "codec": "h264",
    "cameras": CAMERAS,
    "episodes_per_video_file": 2,
}


def _encode_mp4(path: Path, frames: int) -> None:
    """A small H.264 MP4: frame n is a flat grey of level 8n, pts n / FPS."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        s = container.add_stream("libx264", rate=FPS, options={"g": "5", "preset": "ultrafast"})
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        for n in range(frames):
            image = np.full((H, W, 3), 8 * n, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = n, Fraction(1, FPS)
            container.mux(s.encode(frame))
        container.mux(s.encode(None))


@dataclass(frozen=True)
class _Data:
    root: Path
    robots: dict[str, LeRobotLayout]  # repo id -> what make_lerobot_dataset wrote


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> _Data:
    root = tmp_path_factory.mktemp("hub")
    make_repo_yaml_configs(root)  # org/yaml-configs: en (train 2 files, test 1), fr (train 2)
    make_repo_split_naming(root)  # org/split-naming: train 100 rows, test 50
    images = make_repo(root, "org/images", {"README.md": "# images\n"})
    make_image_parquet(images / "data/train-00000-of-00001.parquet", rows=12)
    shards = make_repo(root, "org/shards", {"README.md": "# shards\n"})
    make_webdataset_shards(shards, shards=2, samples_per_shard=3)
    many = make_repo(root, "org/many-samples", {"README.md": "# many\n"})
    make_webdataset_shards(many, shards=1, samples_per_shard=40)
    uneven = make_repo(root, "org/uneven-shards", {"README.md": "# uneven\n"})
    make_webdataset_shards(uneven, shards=1, samples_per_shard=3, prefix="a")  # ~12 kB
    make_webdataset_shards(uneven, shards=1, samples_per_shard=300, prefix="b")  # ~1.2 MB
    robot = make_repo(root, "org/robot", {"README.md": "# robot\n"})
    _encode_mp4(robot / "videos/episode_000000.mp4", frames=30)
    robots = {
        # LeRobot v3.0 on the Hub: 3 episodes, 2 cameras, 2 episodes per video file
        "org/lerobot": make_lerobot_dataset(root, "org/lerobot", episodes=(12, 9, 10), **LEROBOT),
        # LeRobot v2.1, read as a local folder: one data file and one video per episode
        "org/lerobot-v21": make_lerobot_dataset(
            root, "org/lerobot-v21", version="v2.1", episodes=(8, 7), **LEROBOT
        ),
    }
    return _Data(root, robots)


@pytest.fixture(scope="module")
def hub(data: _Data) -> Iterator[HubServer]:
    with HubServer(data.root) as server:
        yield server


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIOSTREAM_HF_CACHE", str(tmp_path / "cache"))


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def one_line_error(result: Result, *needles: str) -> str:
    """Exit code 1, no traceback, and exactly one line of output: ``Error: ...``."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # not an uncaught exception
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("Error: "), lines
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


def usage_error(result: Result, *needles: str) -> None:
    """Bad options: click's usage error, exit code 2, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1
    for needle in needles:
        assert needle in errors[0]


def endpoint(hub: HubServer) -> Sequence[str]:
    return ["--endpoint", hub.endpoint]


# -- ls ---------------------------------------------------------------------------------


def test_ls_lists_configs_splits_files_and_sizes(hub: HubServer) -> None:
    out = ok(run("ls", "hf://datasets/org/yaml-configs", *endpoint(hub)))
    assert out.startswith("org/yaml-configs @ ")
    assert "format: parquet" in out
    lines = out.splitlines()
    splits = [line.split() for line in lines if line.startswith(("en ", "fr "))]
    assert [(s[0], s[-4], s[-3]) for s in splits] == [
        ("en", "train", "2"),
        ("en", "test", "1"),
        ("fr", "train", "2"),
    ]
    assert all(s[-1] == "kB" for s in splits)  # sizes, e.g. "14.7 kB"
    for path in ("en/train-0.parquet", "en/train-1.parquet", "en/test.parquet", "fr/b.parquet"):
        assert path in out


def test_ls_one_config_and_split(hub: HubServer) -> None:
    out = ok(
        run(
            "ls",
            "hf://datasets/org/yaml-configs",
            "--config",
            "fr",
            "--split",
            "train",
            *endpoint(hub),
        )
    )
    assert "fr/a.parquet" in out
    assert "fr/b.parquet" in out
    assert "en/" not in out


def _shard_keys(path: Path) -> dict[str, dict[str, bytes]]:
    """The samples of a TAR shard, read with tarfile: key -> extension -> payload."""
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for member in tar:
            key, _, ext = member.name.partition(".")
            body = tar.extractfile(member)
            assert body is not None
            samples.setdefault(key, {})[ext] = body.read()
    return samples


def _extensions_line(out: str) -> tuple[set[str], str]:
    (line,) = [line for line in out.splitlines() if line.startswith("extensions: ")]
    exts, _, where = line.removeprefix("extensions: ").partition("  ")
    return set(exts.split(", ")), where


def test_ls_webdataset_shows_shards_and_extensions(hub: HubServer) -> None:
    out = ok(run("ls", "hf://datasets/org/shards", *endpoint(hub)))
    assert out.startswith("org/shards @ ")
    assert "format: webdataset" in out
    shards = sorted((hub.root / "datasets/org/shards").glob("*.tar"))
    size = human_bytes(sum(p.stat().st_size for p in shards))
    (row,) = [line.split() for line in out.splitlines() if line.startswith("default ")]
    assert row == ["default", "train", "2", *size.split(), "train-000000.tar", "train-000001.tar"]
    exts, where = _extensions_line(out)
    assert exts == set(_shard_keys(shards[0])["sample00000000"]) == {"jpg", "json", "cls"}
    assert where == "(the first 3 samples of train-000000.tar)"  # the first shard only
    assert "files of config" not in out  # a shard summary, not every file


def test_ls_webdataset_reads_a_few_samples_of_a_big_shard(hub: HubServer) -> None:
    out = ok(run("ls", "hf://datasets/org/many-samples", *endpoint(hub)))
    exts, where = _extensions_line(out)
    assert exts == {"jpg", "json", "cls"}
    assert where == "(the first 5 samples of train-000000.tar)"  # of its 40


def test_ls_local_webdataset_files(hub: HubServer) -> None:
    local = hub.root / "datasets/org/shards/train-{000000..000001}.tar"
    out = ok(run("ls", str(local)))
    assert out.startswith(str(local))
    assert "format: webdataset" in out
    (row,) = [line.split() for line in out.splitlines() if line.startswith("default ")]
    assert row[:3] == ["default", "train", "2"]
    assert row[-2:] == ["train-000000.tar", "train-000001.tar"]
    assert _extensions_line(out)[0] == {"jpg", "json", "cls"}


def _size_of(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.parquet"))


def _camera_rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.startswith("observation.images.")]


def test_ls_recognises_a_lerobot_dataset_on_the_hub(hub: HubServer, data: _Data) -> None:
    robot = data.robots["org/lerobot"]
    out = ok(run("ls", "hf://datasets/org/lerobot", *endpoint(hub)))
    assert out.startswith("org/lerobot @ ")
    lines = out.splitlines()
    assert lines[1:11] == [
        "format: lerobot",
        "codebase version: v3.0",
        f"robot type: {robot.info['robot_type']}",
        "episodes: 3",
        f"total frames: {robot.total_frames}",
        f"fps: {FPS}",
        f"tasks: {len(robot.tasks)}",
        "splits: train 0:3",
        # 3 episodes, 2 per video file: 2 files per camera
        f"files: 1 data ({human_bytes(_size_of(robot.path / 'data'))}), 4 video",
        "",
    ]
    assert "format: parquet" not in out
    assert _camera_rows(out) == [[key, "h264", f"{W}x{H}", str(FPS), "yuv420p"] for key in CAMERAS]
    features = [line.split() for line in lines[lines.index("") + 1 :]]
    assert ["observation.state", "float32", "[6]"] in features
    assert ["task_index", "int64"] in features


def test_ls_recognises_a_local_lerobot_v21_folder(data: _Data) -> None:
    robot = data.robots["org/lerobot-v21"]
    out = ok(run("ls", str(robot.path)))
    lines = out.splitlines()
    assert lines[:3] == [str(robot.path), "format: lerobot", "codebase version: v2.1"]
    assert "episodes: 2" in lines
    assert f"total frames: {robot.total_frames}" in lines
    assert f"files: 2 data ({human_bytes(_size_of(robot.path / 'data'))}), 4 video" in lines
    assert _camera_rows(out) == [[key, "h264", f"{W}x{H}", str(FPS), "yuv420p"] for key in CAMERAS]


def test_ls_a_parquet_repo_is_not_lerobot(hub: HubServer) -> None:
    """A Parquet repo is not taken for LeRobot (it has no meta/info.json)."""
    out = ok(run("ls", "hf://datasets/org/split-naming", *endpoint(hub)))
    assert "format: parquet" in out
    assert "codebase version" not in out


def test_ls_a_lerobot_error_is_one_line(hub: HubServer, tmp_path: Path) -> None:
    folder = tmp_path / "robot"
    (folder / "meta").mkdir(parents=True)
    (folder / "meta/info.json").write_text('{"codebase_version": "v1.6"}')
    one_line_error(run("ls", str(folder)), "v1.6", "v3.0")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["hf://datasets/org/nope"], ["org/nope", "not found"]),
        (["hf://datasets/org/yaml-configs", "--split", "tain"], ["'tain'", "test, train"]),
        (["hf://datasets/org/yaml-configs", "--config", "de"], ["'de'", "en, fr"]),
        (["hf://datasets/x"], ["ORG/NAME"]),
        (["hf://datasets/org/yaml-configs@nobranch"], ["nobranch"]),
        (["/no/such/file.parquet"], ["does not exist"]),
    ],
)
def test_ls_bad_input_is_one_line(hub: HubServer, args: list[str], needles: list[str]) -> None:
    one_line_error(run("ls", *args, *endpoint(hub)), *needles)


def test_a_bad_endpoint_is_one_line() -> None:
    one_line_error(run("ls", "hf://datasets/org/x", "--endpoint", "ftp://nowhere"), "ftp://")


# -- head -------------------------------------------------------------------------------


def test_head_summarises_binary_fields(hub: HubServer) -> None:
    out = ok(run("head", "hf://datasets/org/images", "-n", "2", *endpoint(hub)))
    assert "[0]" in out
    assert "[1]" in out
    assert "[2]" not in out
    assert "image    {bytes: <bytes: " in out
    assert "path: 'image_00000000.jpg'" in out
    assert "caption  'a picture of" in out


def test_head_columns_split_and_width(hub: HubServer) -> None:
    args = ["--columns", "id,text", "--split", "test", "--width", "20", "-n", "3"]
    out = ok(run("head", "hf://datasets/org/split-naming", *args, *endpoint(hub)))
    keys = {line.split()[0] for line in out.splitlines() if line.startswith("  ")}
    assert keys == {"id", "text"}
    assert "  id    100" in out  # the test split's ids follow the train split's 100 rows
    assert "chars)" in out  # long text is cut


def test_head_webdataset_samples(hub: HubServer) -> None:
    out = ok(run("head", "hf://datasets/org/shards", "-n", "2", *endpoint(hub)))
    shard = _shard_keys(hub.root / "datasets/org/shards/train-000000.tar")
    first, second = out.split("\n\n")
    for text, key in ((first, "sample00000000"), (second, "sample00000001")):
        sample = shard[key]
        assert f"__key__  '{key}'" in text
        assert f"jpg      <bytes: {len(sample['jpg'])} B>" in text  # binary: its size
        assert f"cls      {int(sample['cls'])}\n" in text  # text-like: its value
        meta = json.loads(sample["json"])
        (line,) = [line for line in text.splitlines() if line.startswith("  json ")]
        assert line.startswith(f"  json     {{caption: {meta['caption'][:20]!r}"[:-1])
        assert line.endswith(f", index: {meta['index']}, seed: {meta['seed']}}}")


def test_payload_value_decodes_text_like_extensions_only() -> None:
    assert payload_value("cls", b"7") == 7
    assert payload_value("cls2", b" 12\n") == 12
    assert payload_value("txt", "héllo".encode()) == "héllo"
    assert payload_value("seg.txt", b"a") == "a"  # the last extension counts
    assert payload_value("json", b'{"a": [1, 2]}') == {"a": [1, 2]}
    assert payload_value("jpg", b"\xff\xd8") == b"\xff\xd8"
    assert payload_value("cls", b"\xff") == b"\xff"  # not a number: stays bytes
    assert payload_value("txt", b"\xff\xfe") == b"\xff\xfe"  # not UTF-8: stays bytes
    pickled = pickle.dumps({"x": 1})
    assert payload_value("pickle", pickled) == pickled  # never unpickled
    assert payload_value("npy", b"\x93NUMPY") == b"\x93NUMPY"
    assert payload_value("cls", 3) == 3


def test_head_errors(hub: HubServer) -> None:
    one_line_error(
        run("head", "hf://datasets/org/split-naming", "--split", "validation", *endpoint(hub)),
        "validation",
    )
    one_line_error(
        run("head", "hf://datasets/org/images", "--columns", "nope", *endpoint(hub)), "nope"
    )
    usage_error(run("head", "hf://datasets/org/images", "-n", "0", *endpoint(hub)), "-n")


def test_summarize() -> None:
    assert summarize(b"\x00" * 1234) == "<bytes: 1234 B>"
    assert summarize({"bytes": b"ab", "path": "x.jpg"}) == "{bytes: <bytes: 2 B>, path: 'x.jpg'}"
    assert summarize("a" * 30, width=10) == "'aaaaaaaaaa'... (30 chars)"
    assert summarize(list(range(20))).endswith(", ... (20 items)]")
    assert summarize(np.zeros((2, 3), np.uint8)) == "<array uint8 (2, 3)>"
    assert summarize(0.5) == "0.5"


# -- bench ------------------------------------------------------------------------------


def test_bench_json(hub: HubServer) -> None:
    args = ["--json", "--no-progress", "--split", "train"]
    out = ok(run("bench", "hf://datasets/org/split-naming", *args, *endpoint(hub)))
    result = json.loads(out)
    assert result["samples"] == 100
    assert result["files"] == 2
    assert result["bytes_received"] > 0
    assert result["mb_per_s"] > 0
    assert result["time_to_first_sample"] > 0
    assert result["options"]["endpoint"] == hub.endpoint
    requests = result["requests"]
    # pin + tree listing, one /resolve/ per file, footer + row groups on the CDN
    assert requests["api"] == 2
    assert requests["resolvers"] == 2
    assert requests["cdn"] >= 2
    assert requests["total"] == requests["api"] + requests["resolvers"] + requests["cdn"]


def test_bench_json_reports_the_endpoint_of_hf_endpoint(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    args = ["--json", "--no-progress", "--split", "test"]
    result = json.loads(ok(run("bench", "hf://datasets/org/split-naming", *args)))
    assert result["samples"] == 50
    assert result["options"]["endpoint"] == hub.endpoint


def test_bench_json_of_local_files_has_no_endpoint(hub: HubServer) -> None:
    local = hub.root / "datasets/org/split-naming/data/test-00000-of-00001.parquet"
    result = json.loads(ok(run("bench", str(local), "--json", "--no-progress")))
    assert result["samples"] == 50
    assert result["options"]["endpoint"] is None  # no Hub was asked


def test_bench_table_and_progress_bar(hub: HubServer) -> None:
    result = run("bench", "hf://datasets/org/shards", "--limit", "4", *endpoint(hub))
    out = ok(result)
    assert "samples/s" in out
    assert "MB/s" in out
    assert "requests: total" in out
    assert out.splitlines()[2].split() == ["samples", "4"]
    assert "bench:" in result.stderr
    assert "samples" in result.stderr


def test_bench_arrow_batches(hub: HubServer) -> None:
    args = ["--arrow", "--batch-size", "40", "--json", "--no-progress"]
    out = ok(run("bench", "hf://datasets/org/split-naming", *args, *endpoint(hub)))
    assert json.loads(out)["samples"] == 150


def test_bench_errors(hub: HubServer) -> None:
    one_line_error(run("bench", "hf://datasets/org/nope", *endpoint(hub)), "org/nope")
    usage_error(run("bench", "hf://datasets/org/images", "--limit", "0", *endpoint(hub)))


# -- Ctrl-C -----------------------------------------------------------------------------


def _read_until(proc: subprocess.Popen[bytes], needle: bytes, timeout: float) -> bytes:
    """What ``proc`` wrote on stderr until ``needle`` appeared (or it ended, or timeout)."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    seen = b""
    while needle not in seen:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            break
        block = os.read(fd, 65536)
        if not block:
            break
        seen += block
    return seen


def test_ctrl_c_exits_130_with_one_line_and_no_traceback(hub: HubServer) -> None:
    """SIGINT while `bench` streams: the Hub server trickles every body at 20 kB/s, so
    the small first shard is read (the bar appears) while the big second one still goes."""
    # As an interactive shell starts it: SIGINT raises KeyboardInterrupt (a test runner
    # started in the background may pass SIGINT on as ignored).
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from aiostream_hf.cli import main; main()"
    )
    # A trickle ends as soon as its client has gone: the server closes at once.
    slow = Faults(trickle_rate=1.0, trickle_bytes=2048, trickle_interval_ms=100)
    with HubServer(hub.root, faults=slow) as server:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "bench", "hf://datasets/org/uneven-shards"]
            + ["--endpoint", server.endpoint],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            started = _read_until(proc, b"bench: ", timeout=60)  # the bar: samples arrive
            assert b"bench: " in started, started.decode()
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    stderr = (started + err).decode()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.splitlines()[-1] == "Interrupted (Ctrl-C)."
    assert "Aborted" not in stderr
    assert out == b""  # no result table for an interrupted run


# -- frames -----------------------------------------------------------------------------


def _read_png(path: Path) -> np.ndarray[Any, Any]:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with av.open(str(path)) as container:
        frame = next(container.decode(video=0))
        image: np.ndarray[Any, Any] = frame.to_ndarray(format="rgb24")
        return image


def test_frames_says_one_frame_in_the_singular(hub: HubServer, tmp_path: Path) -> None:
    out = tmp_path / "one.png"
    url = "hf://datasets/org/robot/videos/episode_000000.mp4"
    text = ok(run("frames", url, "--at", "0.5", "--out", str(out), *endpoint(hub)))
    assert f"wrote {out}: 1 frame of {W}x{H} h264 at 0.500 s" in text
    assert re.search(r"in \d+ requests?$", text.strip())


def test_frames_writes_a_contact_sheet(hub: HubServer, tmp_path: Path) -> None:
    out = tmp_path / "sheet.png"
    url = "hf://datasets/org/robot/videos/episode_000000.mp4"
    text = ok(run("frames", url, "--at", "0.5,1.0,2.5", "--out", str(out), *endpoint(hub)))
    assert f"wrote {out}: 3 frames of {W}x{H} h264 at 0.500, 1.000, 2.500 s" in text
    assert "fetched " in text
    # Its size known from the Hub (its /resolve/ URL's HEAD, which the resolver sends), a
    # small video is read once, whole, from the CDN: at most 100%, in one request.
    share = re.search(r"fetched .* \((\d+)%\) in (\d+) requests?", text)
    assert share is not None, text
    assert int(share.group(1)) <= 100
    assert int(share.group(2)) == 1
    sheet = _read_png(out)
    pad = 4
    assert sheet.shape == (H + 2 * pad, 3 * W + 4 * pad, 3)
    # frame n is grey level 8n: frames 5, 10 and 25, left to right
    for i, n in enumerate((5, 10, 25)):
        tile = sheet[pad : pad + H, pad + i * (W + pad) : pad + i * (W + pad) + W]
        assert abs(float(tile.mean()) - 8 * n) < 6


def test_frames_from_a_url_and_a_local_path(hub: HubServer, tmp_path: Path) -> None:
    url = hub.url("org/robot", "videos/episode_000000.mp4")
    ok(
        run(
            "frames",
            url,
            "--at",
            "0,0.1,0.2,0.3,0.4",
            "--cols",
            "2",
            "--out",
            str(tmp_path / "a.png"),
        )
    )
    assert _read_png(tmp_path / "a.png").shape == (3 * H + 4 * 4, 2 * W + 3 * 4, 3)
    local = hub.root / "datasets/org/robot/videos/episode_000000.mp4"
    ok(run("frames", str(local), "--at", "1.23", "--out", str(tmp_path / "b.png")))
    assert _read_png(tmp_path / "b.png").shape == (H + 8, W + 8, 3)


def test_frames_errors(hub: HubServer, tmp_path: Path) -> None:
    url = "hf://datasets/org/robot/videos/episode_000000.mp4"
    out = ["--out", str(tmp_path / "x.png"), *endpoint(hub)]
    one_line_error(run("frames", url, "--at", "9.0", *out), "9.0", "outside the video")
    one_line_error(run("frames", url, "--at", "1.05", "--tolerance", "0.001", *out), "1.05")
    one_line_error(run("frames", "hf://datasets/org/robot/README.md", "--at", "1", *out), "video")
    one_line_error(run("frames", "hf://datasets/org/robot/nope.mp4", "--at", "1", *out))
    usage_error(run("frames", url, "--at", "one", *out), "--at")
    usage_error(run("frames", url, *out), "--at")
    usage_error(run("frames", "hf://datasets/org/robot", "--at", "1", *out), "one file")
    assert not (tmp_path / "x.png").exists()


# -- paths that would leave the repo ------------------------------------------------------


def _inside_robot(line: str) -> bool:
    """Whether a request line of ``HubStats.paths`` stays under org/robot's URL prefixes."""
    where, _, path = line.split(" ", 2)
    if ".." in path or "%2e" in path.lower():
        return False
    if where == "cdn":
        return path.startswith("/lfs/datasets/org/robot/")
    return path == "/api/datasets/org/robot" or path.startswith(
        (
            "/api/datasets/org/robot/revision/",
            "/api/datasets/org/robot/tree/",
            "/datasets/org/robot/resolve/",
        )
    )


@pytest.mark.parametrize(
    "url",
    [
        "hf://datasets/org/robot/../../api/whoami-v2.mp4",
        "hf://datasets/org/robot/../x.mp4",
        "hf://datasets/org/robot/videos/../../../api/whoami-v2.mp4",
        "hf://datasets/org/robot/%2e%2e/%2e%2e/api/whoami-v2.mp4",
        "hf://datasets/org/robot/..%2f..%2fapi/whoami-v2.mp4",
        "hf://datasets/org/robot@../videos/episode_000000.mp4",
    ],
)
@pytest.mark.parametrize("command", ["frames", "ls", "head"])
def test_a_path_leaving_the_repo_is_refused_before_any_request(
    hub: HubServer, tmp_path: Path, command: str, url: str
) -> None:
    """The one rule of every hf:// parse (``repo_path_problem``), for the CLI's commands:
    the error names the path, and the server sees no request outside the repo."""
    args = [command, url, *endpoint(hub), "--token", "hf_secret", "--retries", "0"]
    if command == "frames":
        args += ["--at", "1", "--out", str(tmp_path / "x.png")]
    hub.reset_stats()
    result = run(*args)
    if command == "frames":  # frames checks its URL first: a usage error
        usage_error(result, "could leave the repo")
    else:
        one_line_error(result, "could leave the repo")
    assert "could leave the repo" in result.output
    assert [p for p in hub.stats().paths if not _inside_robot(p)] == []
    assert not (tmp_path / "x.png").exists()


def test_a_good_path_is_read_inside_the_repo(hub: HubServer, tmp_path: Path) -> None:
    """The check above is not vacuous: the server records frames' requests."""
    hub.reset_stats()
    url = "hf://datasets/org/robot/videos/episode_000000.mp4"
    ok(run("frames", url, "--at", "1", "--out", str(tmp_path / "x.png"), *endpoint(hub)))
    paths = hub.stats().paths
    assert any(p.startswith("cdn GET /lfs/datasets/org/robot/") for p in paths), paths
    assert [p for p in paths if not _inside_robot(p)] == []


# -- bad values, as a user sees them: a subprocess, one line, no traceback -----------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiostream_hf.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _refused(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    """A nonzero exit, no traceback, an ``Error:`` line naming ``needles``."""
    assert done.returncode != 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "a bug in aiostream-hf" not in done.stderr  # an expected failure, not a crash
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, done.stderr
    for needle in needles:
        assert needle in errors[0], done.stderr
    assert done.stdout == ""


def _out_cases(tmp_path: Path) -> list[tuple[Path, str]]:
    """Paths --out cannot write to, with what the error must say."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [
        (tmp_path, str(tmp_path)),  # a folder
        (tmp_path / "missing" / "sheet.png", "does not exist"),  # a missing parent
        (a_file / "sheet.png", "is not a folder"),  # a parent that is a file
    ]
    if Path("/proc/version").is_file():
        cases.append((Path("/proc/version"), "/proc/version"))  # takes no writes
    if os.geteuid() != 0:  # root writes anywhere
        read_only = tmp_path / "read-only"
        read_only.mkdir()
        read_only.chmod(0o555)
        cases.append((read_only / "sheet.png", "not writable"))
    return cases


def test_frames_out_that_cannot_be_written(hub: HubServer, tmp_path: Path) -> None:
    video = hub.root / "datasets/org/robot/videos/episode_000000.mp4"
    cases = _out_cases(tmp_path)
    for out, reason in cases:
        done = _cli("frames", str(video), "--at", "1", "--out", str(out))
        _refused(done, str(out), reason)
    assert not (tmp_path / "missing").exists()


def test_demo_outputs_that_cannot_be_written(tmp_path: Path) -> None:
    """Refused before the demo builds anything."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    _refused(_cli("demo", "--quick", "--json", str(tmp_path / "no" / "r.json")), "does not exist")
    _refused(_cli("demo", "--quick", "--json", str(tmp_path)), str(tmp_path), "directory")
    _refused(_cli("demo", "--quick", "--out", str(a_file / "sub")), "is not a folder")
    _refused(_cli("demo", "--quick", "--out", str(a_file)), str(a_file))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


#: Every number flag of `hub serve`, with values it must refuse.
_SERVE_BAD = [
    ("--port", "99999"),
    ("--port", "-1"),
    ("--cdn-port", "65536"),
    ("--api-quota", "-1"),
    ("--resolvers-quota", "-5"),
    ("--error-rate", "1.5"),
    *[
        (flag, value)
        for flag in (
            "--latency-ms",
            "--bandwidth-per-connection",
            "--bandwidth-total",
            "--error-rate",
            "--cut-rate",
            "--slow-first-byte-rate",
            "--slow-first-byte-ms",
            "--window-s",
        )
        for value in ("nan", "inf", "-inf")
    ],
]


@pytest.mark.parametrize(("flag", "value"), _SERVE_BAD)
def test_hub_serve_refuses_bad_numbers(tmp_path: Path, flag: str, value: str) -> None:
    done = _cli("hub", "serve", str(tmp_path), f"{flag}={value}")
    _refused(done, flag, value)
    assert done.returncode == 2  # a usage error: nothing was started


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_faults_and_rate_limits_refuse_nan_and_infinity(value: float) -> None:
    """The Python API of what `hub serve` builds (docs/errors.md, HubServerError)."""
    floats = [
        f.name
        for f in dataclasses.fields(Faults)
        if isinstance(getattr(Faults(), f.name), float) or f.name.startswith("bandwidth")
    ]
    assert {"latency_ms", "bandwidth_total", "cut_fraction", "trickle_interval_ms"} <= set(floats)
    for name in floats:
        with pytest.raises(HubServerError, match=re.escape(f"Faults.{name}=")):
            Faults(**{name: value})
    with pytest.raises(HubServerError, match="RateLimits.window_s="):
        RateLimits(window_s=value)


@pytest.mark.parametrize("port", [-1, 65536, 99999])
def test_hub_server_refuses_a_port_out_of_range(tmp_path: Path, port: int) -> None:
    with pytest.raises(HubServerError, match=f"port={port}"):
        HubServer(tmp_path, port=port)
    with pytest.raises(HubServerError, match=f"cdn_port={port}"):
        HubServer(tmp_path, cdn_port=port)


# -- hub serve and demo (subprocesses, as users run them) ----------------------------------


def test_hub_serve_prints_its_endpoints_and_serves(hub: HubServer) -> None:
    cmd = [sys.executable, "-m", "aiostream_hf.cli", "hub", "serve", str(hub.root)]
    proc = subprocess.Popen(
        [*cmd, "--latency-ms", "1"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        info = httpx2.get(f"{ready['endpoint']}/api/datasets/org/images")
        assert info.status_code == 200
        assert info.json()["id"] == "org/images"
        assert ready["cdn_endpoint"].startswith("http://127.0.0.1:")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        assert proc.stdout is not None
        proc.stdout.close()


def _serve_stderr(root: Path) -> str:
    """What `hub serve ROOT` writes on stderr before it is stopped."""
    cmd = [sys.executable, "-m", "aiostream_hf.cli", "hub", "serve", str(root)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        json.loads(proc.stdout.readline())  # ready
        line = proc.stderr.readline()  # written once the server runs
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    return line


def test_hub_serve_warns_when_it_finds_no_repo(tmp_path: Path) -> None:
    (tmp_path / "datasets" / "text").mkdir(parents=True)  # an ORG with no NAME under it
    err = _serve_stderr(tmp_path)
    assert "WARNING: no dataset repo under" in err
    assert f"{tmp_path / 'datasets'}/ORG/NAME/" in err


def test_hub_serve_names_the_repos_it_serves(hub: HubServer) -> None:
    err = _serve_stderr(hub.root)
    assert "WARNING" not in err
    assert err.startswith("serving ")
    assert "org/images" in err


def test_hub_serve_errors(tmp_path: Path) -> None:
    usage_error(run("hub", "serve", str(tmp_path), "--private", "org-only"), "ORG/NAME=TOKEN")
    one_line_error(run("hub", "serve", str(tmp_path / "missing")))


def test_demo_quick(tmp_path: Path) -> None:
    """The demo as the README runs it (quick sizes): a table, notes, a contact sheet."""
    script = Path(sys.executable).with_name("aiostream-hf")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "aiostream_hf.cli"]
    proc = subprocess.run(
        [*cmd, "demo", "--quick", "--out", str(tmp_path), "--json", str(tmp_path / "demo.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:6] == ["workload", "reader", "samples", "samples/s", "MB/s", "first"]
    assert lines[0].split()[-4:] == ["api", "resolvers", "cdn", "requests"]
    expected = [
        ("text Parquet", "aiostream-hf"),
        ("text Parquet", "datasets"),
        ("image Parquet", "aiostream-hf"),
        ("WebDataset", "aiostream-hf"),
        ("LeRobot items", "aiostream-hf"),
        ("sparse frames", "aiostream-hf"),
    ]
    table = lines[2 : 2 + len(expected)]
    for line, (workload, reader) in zip(table, expected, strict=True):
        assert re.match(rf"{workload} +{reader} ", line), line
    assert "Traceback" not in proc.stderr
    report = json.loads((tmp_path / "demo.json").read_text())
    rows = {(r["workload"], r["reader"]): r for r in report["rows"]}
    assert rows[("text Parquet", "aiostream-hf")]["samples"] == 2000
    assert rows[("text Parquet", "datasets")]["samples"] == 2000
    assert rows[("image Parquet", "aiostream-hf")]["samples"] == 100
    assert rows[("WebDataset", "aiostream-hf")]["samples"] == 100
    assert rows[("LeRobot items", "aiostream-hf")]["samples"] == 105  # every frame
    assert rows[("sparse frames", "aiostream-hf")]["samples"] == 8
    for row in report["rows"]:
        assert row["requests"]["api"] >= 1
        assert row["requests"]["cdn"] >= 1
    sheet = _read_png(tmp_path / "contact_sheet.png")
    assert sheet.shape[2] == 3
    assert sheet.shape[1] > sheet.shape[0]
    # It names what it made and the way on: the repos, then serving and listing them.
    hub = tmp_path / "hub"
    assert f"- data: {hub}" in lines
    assert "- repos: demo/images, demo/lerobot, demo/text, demo/webdataset" in lines
    (after,) = [line for line in lines if line.startswith("- next: ")]
    assert f"`aiostream-hf hub serve {hub}`" in after
    assert "`aiostream-hf ls hf://datasets/demo/text`" in after
    (robot,) = [line for line in lines if line.startswith("- LeRobot v3.0: ")]
    assert robot.endswith(
        "the contact sheet shows the 16 frames of 8 of them, each item's side by side, "
        "captioned with its index, episode and the frame's time"
    )
    # The sheet holds as many frames as the line says, each captioned, each item's two
    # frames side by side, 0.1 s apart (delta_timestamps -0.1 and 0).
    said = re.search(r"shows the (\d+) frames of (\d+) of them", robot)
    assert said is not None
    captions = [tile.caption for tile in contact_sheets.tiles(sheet)]
    assert len(captions) == int(said.group(1)) == 16
    read = [re.fullmatch(r"item (\d+) ep (\d+) t=(-?\d+\.\d\d) s( pad)?", c) for c in captions]
    assert all(read), captions
    items = [(m.group(1), m.group(2), float(m.group(3))) for m in read if m is not None]
    assert len({item for item, _, _ in items}) == int(said.group(2)) == 8
    for before, now in zip(items[::2], items[1::2], strict=True):
        assert before[:2] == now[:2]
        assert now[2] - before[2] == pytest.approx(0.1)
    assert captions[0] == "item 0 ep 0 t=-0.10 s pad"  # before the first frame: padding


def test_version() -> None:
    assert "version" in ok(run("--version"))


@pytest.mark.parametrize("command", ["ls", "head"])
def test_a_bare_repo_id_is_one_line_naming_its_uri(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    line = one_line_error(run(command, "demo/text"), "pass 'hf://datasets/demo/text'")
    assert len(line) < 200


def test_every_option_of_every_command_has_help() -> None:
    """`--help` explains each option (`head -n` had none)."""
    missing = []
    commands = [(name, cmd) for name, cmd in main.commands.items()]
    for name, cmd in list(commands):
        if isinstance(cmd, click.Group):
            commands += [(f"{name} {sub}", c) for sub, c in cmd.commands.items()]
    for name, cmd in commands:
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.help and not param.hidden:
                missing.append(f"{name} {param.opts[0]}")
    assert missing == []


def test_a_hint_names_the_flag_not_the_python_argument(tmp_path: Path) -> None:
    """A file whose name does not tell its format: the way out is --format, which works."""
    path = tmp_path / "rows.bin"
    make_text_parquet(path, rows=7, seed=3)
    line = one_line_error(run("head", str(path)), "pass --format (one of ")
    assert "format=" not in line
    assert "[6]" in ok(run("head", str(path), "--format", "parquet", "-n", "7"))
    bench = json.loads(
        ok(run("bench", str(path), "--format", "parquet", "--json", "--no-progress"))
    )
    assert bench["samples"] == 7
    one_line_error(run("head", str(path), "--format", "nope"), "unknown --format 'nope'")


def test_s3_hints_name_no_sign_request() -> None:
    from aiostream_hf._cli_run import explained

    exc = SourceError(
        "s3://b/k: access denied; for a public bucket, "
        "StreamOptions(s3_anonymous=True) sends requests unsigned"
    )
    assert explained(exc, {}).endswith(
        "for a public bucket, --no-sign-request sends requests unsigned"
    )


@pytest.mark.parametrize("version", ["org/lerobot", "org/lerobot-v21"])
def test_head_says_it_reads_a_lerobot_datasets_rows_only(version: str, hub: HubServer) -> None:
    source = f"hf://datasets/{version}"
    result = CliRunner().invoke(main, ["head", source, "-n", "1", *endpoint(hub)])
    assert result.exit_code == 0, result.output
    assert "note: these are a LeRobot dataset's data files" in result.stderr
    assert "not the camera frames" in result.stderr
    images = CliRunner().invoke(main, ["head", "hf://datasets/org/images", *endpoint(hub)])
    assert "LeRobot" not in images.stderr


@pytest.mark.parametrize("version", ["org/lerobot", "org/lerobot-v21"])
def test_bench_of_a_lerobot_dataset_reads_its_items_with_their_frames(
    version: str, hub: HubServer, data: _Data
) -> None:
    robot = data.robots[version]
    source = f"hf://datasets/{version}"
    args = ["--json", "--no-progress", *endpoint(hub)]
    result = CliRunner().invoke(main, ["bench", source, *args])
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)
    assert items["kind"] == "lerobot items"
    assert items["samples"] == robot.total_frames
    assert items["frames"] == robot.total_frames * len(robot.video_keys)
    assert "camera frames decoded" in result.stderr
    assert "--rows" in result.stderr
    rows = CliRunner().invoke(main, ["bench", source, "--rows", *args])
    assert rows.exit_code == 0, rows.output
    read = json.loads(rows.stdout)
    assert (read["kind"], read["samples"], read["note"]) == ("samples", robot.total_frames, None)
    assert "frames" not in read
    assert rows.stderr == ""
    # an option only rows have: rows, and the note says what was not read
    arrow = CliRunner().invoke(main, ["bench", source, "--arrow", *args])
    assert arrow.exit_code == 0, arrow.output
    assert json.loads(arrow.stdout)["kind"] == "samples"
    assert "not the camera frames" in arrow.stderr


def test_bench_of_a_local_lerobot_folder_reads_its_items(data: _Data) -> None:
    robot = data.robots["org/lerobot-v21"]
    result = CliRunner().invoke(main, ["bench", str(robot.path), "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["frames"] == robot.total_frames * len(robot.video_keys)


def test_bench_says_where_the_time_went(hub: HubServer) -> None:
    args = ["--json", "--no-progress", *endpoint(hub)]
    result = json.loads(ok(run("bench", "hf://datasets/org/split-naming", *args)))
    stalls = result["stalls"]
    assert stalls["bottleneck"] in ("network", "decode", "engine", "consumer")
    waited = stalls["waited_network"] + stalls["waited_decode"] + stalls["waited_engine"]
    assert stalls["waited"] == pytest.approx(waited)
    assert stalls["input_bound"] == pytest.approx(stalls["waited"] / stalls["seconds"])
    table = ok(run("bench", "hf://datasets/org/split-naming", "--no-progress", *endpoint(hub)))
    assert re.search(r"waited for data +\d+% \(network \d+%, decode \d+%, engine \d+%\)", table)
    assert re.search(r"bottleneck +(network|decode|engine|consumer) \(", table)
    bar = run("bench", "hf://datasets/org/split-naming", *endpoint(hub))
    ok(bar)
    assert "waiting for data" in bar.stderr  # live, on the bar


@pytest.mark.parametrize("extension", sorted(TEXT_EXTENSIONS))
@pytest.mark.parametrize(
    "payload", [b"7", b" 12\n", "h\u00e9llo".encode(), b'{"a": [1, 2]}', b"\xff", b"[" * 100_000]
)
def test_payload_value_decodes_as_webdatasets_handlers(extension: str, payload: bytes) -> None:
    """The oracle: webdataset's own basichandlers, where they decode; else the bytes."""
    from webdataset import autodecode

    try:
        expected = autodecode.basichandlers(extension, payload)
    except (ValueError, RecursionError):
        expected = payload
    assert payload_value(extension, payload) == expected


def test_head_of_webdataset_shards_does_not_import_torch(tmp_path: Path) -> None:
    make_webdataset_shards(tmp_path, shards=1, samples_per_shard=2)
    (shard,) = sorted(tmp_path.rglob("*.tar"))
    script = (
        "import sys\n"
        "from aiostream_hf.cli import main\n"
        f"main(['head', {str(shard)!r}, '-n', '2'], standalone_mode=False)\n"
        "print('torch' in sys.modules, 'webdataset' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "cls" in done.stdout
    assert done.stdout.splitlines()[-1] == "False False"


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path) -> None:
    """`aiostream-hf head ... | head -c 10`: the pipe closes under the command, which
    stops as the shell's tools do (128 + SIGPIPE), without a 'bug' line or a traceback."""
    path = tmp_path / "t.parquet"
    make_text_parquet(path, rows=300, row_group_size=300)
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiostream_hf.cli", "head", str(path), "-n", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert len(proc.stdout.read(10)) == 10
    proc.stdout.close()  # the reader goes away
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141
    assert err == b""
