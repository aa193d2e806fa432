"""``aiostream-hf demo``: every kind of dataset, served like the Hub, streamed and measured.

The demo needs no network and no account. It

1. writes small synthetic datasets with ``aiostream_hf.testing`` (text and image
   Parquet, WebDataset shards, a LeRobot v3.0 dataset) under ``OUT/hub``;
2. serves them from the local Hub server in its own process, with 20 ms added to
   every request (``Faults(latency_ms=20)``: loopback without latency hides the
   round trips this project exists to save);
3. streams each through the public API: ``stream()`` for Parquet and WebDataset,
   ``lerobot.stream()`` for LeRobot items (with a window of camera frames
   each), and, to show how few bytes sparse frames cost, the episodes table with
   ``stream()`` and a few windows of frames with ``video.open``; each run with a
   fresh resolution cache, so resolution requests are counted too;
4. streams the same text Parquet with ``datasets`` (``streaming=True``, in a
   subprocess with ``HF_ENDPOINT`` pointing at the local server) when it is
   installed;
5. writes a contact sheet of the sampled video frames, each captioned with its item,
   episode and time, and returns a table of samples/s, MB/s, time to first sample and
   requests by bucket, as the server counted them.

It also holds the small helpers the CLI shares with it: a text table, byte
sizes for humans, the contact sheet and a PNG writer (PyAV's ``png`` encoder:
no Pillow).

``python -m aiostream_hf._demo FILE`` runs the full demo and records what it
prints in FILE, headed by the date, the machine and the command
(``record_text``): the README's demo table is ``docs/demo-output.txt``, made so.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import av
import numpy as np
import numpy.typing as npt

from . import video
from ._glyphs import GLYPH_HEIGHT, draw_text
from ._options import StreamOptions
from ._stream import Stream, stream

__all__ = [
    "CAPTION_INK",
    "DemoReport",
    "DemoRow",
    "SHEET_BACKGROUND",
    "caption_scale",
    "contact_sheet",
    "human_bytes",
    "png_bytes",
    "record_text",
    "render_table",
    "run_demo",
    "write_png",
]

_MB = 1e6
_BUCKETS = ("api", "resolvers", "cdn")


# -- presentation helpers (shared with the CLI) ------------------------------------------


def human_bytes(n: float) -> str:
    """``1234567`` -> ``'1.2 MB'`` (decimal units, as network rates are counted)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def render_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[int] = ()
) -> str:
    """A plain-text table; the columns whose index is in ``right`` align right."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        out = [
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


#: The sheet's background, and the colour of its captions.
SHEET_BACKGROUND = 24
CAPTION_INK = (230, 230, 230)


def caption_scale(captions: Sequence[str], width: int) -> int:
    """The size the captions are drawn at under tiles ``width`` pixels wide: twice the
    font's when the longest fits, else its own (a longer caption is cut at the edge)."""
    longest = max((len(c) for c in captions), default=0)
    return 2 if (6 * longest - 1) * 2 <= width else 1


def contact_sheet(
    images: npt.NDArray[np.uint8],
    *,
    columns: int | None = None,
    pad: int = 4,
    captions: Sequence[str] | None = None,
) -> npt.NDArray[np.uint8]:
    """Tile T x H x W x 3 frames into one RGB image, left to right, top to bottom.

    With ``captions`` (one per frame), each tile has its caption in a band below it,
    ``pad`` pixels under the frame, drawn with the built-in 5 x 7 font (``_glyphs``) at
    ``caption_scale``; the band is the text's height plus ``pad``."""
    if images.ndim != 4 or images.shape[-1] != 3 or len(images) == 0:
        raise ValueError(f"contact_sheet needs T x H x W x 3 frames, got shape {images.shape}")
    count, height, width, _ = images.shape
    if captions is not None and len(captions) != count:
        raise ValueError(f"contact_sheet got {len(captions)} captions for {count} frames")
    scale = caption_scale(captions or (), width)
    band = 0 if captions is None else GLYPH_HEIGHT * scale + pad
    cols = max(1, min(columns or min(count, 4), count))
    rows = -(-count // cols)
    cell = height + band
    sheet = np.full(
        (rows * cell + (rows + 1) * pad, cols * width + (cols + 1) * pad, 3),
        SHEET_BACKGROUND,
        np.uint8,
    )
    for i, image in enumerate(images):
        r, c = divmod(i, cols)
        top, left = pad + r * (cell + pad), pad + c * (width + pad)
        sheet[top : top + height, left : left + width] = image
        if captions is not None:  # drawn into the band below the tile, cut at its edges
            under = sheet[top + height + pad : top + cell, left : left + width]
            draw_text(under, captions[i], 0, 0, scale=scale, color=CAPTION_INK)
    return sheet


def png_bytes(rgb: npt.NDArray[np.uint8]) -> bytes:
    """Encode an H x W x 3 uint8 RGB image as PNG with PyAV's ``png`` encoder."""
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"png_bytes needs an H x W x 3 image, got shape {rgb.shape}")
    codec = av.CodecContext.create("png", "w")
    codec.width, codec.height = rgb.shape[1], rgb.shape[0]
    codec.pix_fmt = "rgb24"
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
    return b"".join(bytes(p) for p in [*codec.encode(frame), *codec.encode(None)])


def write_png(path: str | os.PathLike[str], rgb: npt.NDArray[np.uint8]) -> Path:
    """Write ``rgb`` as a PNG file (its folder is created); return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(png_bytes(rgb))
    return target


# -- the demo ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoRow:
    """One measured run: who read what, how fast, with how many requests (server counts)."""

    workload: str
    reader: str
    samples: int
    unit: str
    seconds: float
    bytes_served: int
    first_sample: float | None
    requests: Mapping[str, int] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes_served / _MB / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "reader": self.reader,
            "samples": self.samples,
            "unit": self.unit,
            "seconds": self.seconds,
            "bytes_served": self.bytes_served,
            "samples_per_s": self.samples_per_s,
            "mb_per_s": self.mb_per_s,
            "time_to_first_sample": self.first_sample,
            "requests": dict(self.requests),
        }


@dataclass(frozen=True)
class DemoReport:
    """What the demo measured and wrote."""

    rows: tuple[DemoRow, ...]
    out: Path
    contact_sheet: Path
    notes: tuple[str, ...] = ()

    def table(self) -> str:
        headers = ["workload", "reader", "samples", "samples/s", "MB/s", "first sample"]
        headers += [*_BUCKETS, "requests"]
        cells = []
        for r in self.rows:
            first = "-" if r.first_sample is None else f"{r.first_sample * 1000:.0f} ms"
            cells.append(
                [
                    r.workload,
                    r.reader,
                    f"{r.samples:,} {r.unit}",
                    f"{r.samples_per_s:,.0f}",
                    f"{r.mb_per_s:.1f}",
                    first,
                    *(str(r.requests.get(b, 0)) for b in _BUCKETS),
                    str(sum(r.requests.values())),
                ]
            )
        return render_table(headers, cells, right=range(2, len(headers)))

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": [r.to_json() for r in self.rows],
            "out": str(self.out),
            "contact_sheet": str(self.contact_sheet),
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class _Sizes:
    text_files: int
    text_rows: int
    image_files: int
    image_rows: int
    shards: int
    samples_per_shard: int
    episodes: tuple[int, ...]  # LeRobot episode lengths, in frames at 30 fps
    items_per_episode: int  # training items sampled per episode (each a window of frames)


_FULL = _Sizes(4, 4000, 2, 400, 4, 250, (90, 120, 90, 100), 2)
_QUICK = _Sizes(2, 1000, 1, 100, 2, 50, (45, 60), 2)
#: Frames of one training item, relative to its timestamp (LeRobot's delta_timestamps).
_DELTAS = (-0.1, 0.0)
_CAMERA = "observation.images.top"
_SHEET_ITEMS = 8  # items whose frames the contact sheet shows
_README = (
    "---\nlicense: apache-2.0\n---\n# {name}\n\nSynthetic data written by `aiostream-hf demo`.\n"
)


def _build(root: Path, sizes: _Sizes, log: Callable[[str], None]) -> None:
    """Write the demo repos under ``root/datasets/demo/``."""
    from .testing import (
        make_image_parquet,
        make_lerobot_dataset,
        make_repo,
        make_text_parquet,
        make_webdataset_shards,
    )

    started = time.perf_counter()
    text = make_repo(root, "demo/text", {"README.md": _README.format(name="text")})
    n = sizes.text_files
    for i in range(n):
        make_text_parquet(
            text / f"data/train-{i:05d}-of-{n:05d}.parquet",
            rows=sizes.text_rows,
            seed=i,
            min_text=500,
            max_text=4000,
            start_id=i * sizes.text_rows,
        )
    images = make_repo(root, "demo/images", {"README.md": _README.format(name="images")})
    n = sizes.image_files
    for i in range(n):
        make_image_parquet(
            images / f"data/train-{i:05d}-of-{n:05d}.parquet",
            rows=sizes.image_rows,
            width=96,
            height=96,
            seed=i,
        )
    shards = make_repo(root, "demo/webdataset", {"README.md": _README.format(name="webdataset")})
    make_webdataset_shards(
        shards,
        shards=sizes.shards,
        samples_per_shard=sizes.samples_per_shard,
        width=96,
        height=96,
    )
    # H.264 rather than LeRobot's default AV1: as fast to encode here, and libsvtav1
    # prints its banner on stderr. The reader handles both (see docs/robot-frames.md).
    make_lerobot_dataset(
        root, "demo/lerobot", episodes=sizes.episodes, cameras=(_CAMERA,), codec="h264"
    )
    log(f"wrote the demo datasets under {root} in {time.perf_counter() - started:.1f} s")


def _requests(stats: Any) -> dict[str, int]:
    return {k: int(v) for k, v in stats.by_bucket.items() if v}


async def _measure_stream(
    hub: Any, workload: str, repo: str, unit: str, cache: Path, touch: Callable[[Any], int]
) -> DemoRow:
    """Stream ``repo`` whole through ``stream()``; the server counts requests and bytes."""
    hub.reset_stats()
    options = StreamOptions(cache_dir=cache)
    started = time.perf_counter()
    samples = touched = 0
    s = stream(f"hf://datasets/{repo}", split="train", endpoint=hub.endpoint, options=options)
    assert isinstance(s, Stream)  # not shuffled: one unit after another
    async with s:
        async for sample in s:
            samples += 1
            touched += touch(sample)
    seconds = time.perf_counter() - started
    stats = hub.stats()
    first = s.statistics().time_to_first_sample
    return DemoRow(
        workload,
        "aiostream-hf",
        samples,
        unit,
        seconds,
        stats.bytes_served,
        first,
        _requests(stats),
    )


@dataclass(frozen=True)
class _Frames:
    row: DemoRow
    images: npt.NDArray[np.uint8]
    video_size: int = 0
    items: int = 0
    captions: tuple[str, ...] = ()  # one per frame of ``images``, when they have them


def item_captions(item: Mapping[str, Any], key: str = _CAMERA) -> list[str]:
    """The captions of the frames of a LeRobot item (``item[key]``, one per delta of
    ``_DELTAS``): the item's index, its episode and the time of the frame in the episode,
    ``pad`` when that time is outside the episode (LeRobot repeated its nearest frame)."""
    pads = item.get(f"{key}_is_pad")
    t = float(item["timestamp"])
    captions = []
    for k, delta in enumerate(_DELTAS):
        at = round(t + delta, 2) + 0.0  # + 0.0: never "-0.00"
        text = f"item {int(item['index'])} ep {int(item['episode_index'])} t={at:.2f} s"
        captions.append(text + (" pad" if pads is not None and bool(pads[k]) else ""))
    return captions


async def _measure_lerobot_items(hub: Any, repo: str, stride: int, cache: Path) -> _Frames:
    """Every item of a LeRobot v3.0 dataset, each with a window of camera frames, through
    ``aiostream_hf.lerobot.stream``; keep the frames of every ``stride``-th
    item for the contact sheet."""
    from . import lerobot

    hub.reset_stats()
    started = time.perf_counter()
    s = lerobot.stream(
        f"hf://datasets/{repo}",
        delta_timestamps={_CAMERA: _DELTAS},
        endpoint=hub.endpoint,
        options=StreamOptions(cache_dir=cache),
    )
    kept: list[npt.NDArray[np.uint8]] = []
    captions: list[str] = []
    items = 0
    async with s:
        async for item in s:
            if item["index"] % stride == 0:
                kept.append(item[_CAMERA])
                captions += item_captions(item, _CAMERA)
            items += 1
    seconds = time.perf_counter() - started
    stats = hub.stats()
    first = s.statistics().time_to_first_item
    row = DemoRow(
        "LeRobot items",
        "aiostream-hf",
        items,
        "items",
        seconds,
        stats.bytes_served,
        first,
        _requests(stats),
    )
    return _Frames(row, np.concatenate(kept), captions=tuple(captions))


async def _measure_sparse_frames(hub: Any, repo: str, per_episode: int, cache: Path) -> _Frames:
    """A few windows of frames per episode from the same dataset, by hand: stream the
    episodes table (``meta/episodes/*/*.parquet``, five columns), then fetch the frames
    at ``timestamp + delta`` for each of ``_DELTAS`` from the file that holds the
    episode (v3.0 concatenates episodes: an episode starts at its ``from_timestamp``)
    with one ``frames_at`` call, which reads only those frames' bytes."""
    hub.reset_stats()
    options = StreamOptions(cache_dir=cache, coalesce_gap=64 * 1024)
    prefix = f"videos/{_CAMERA}"
    columns = [
        "length",
        f"{prefix}/from_timestamp",
        f"{prefix}/chunk_index",
        f"{prefix}/file_index",
    ]
    started = time.perf_counter()
    episodes = stream(
        f"hf://datasets/{repo}/meta/episodes/*/*.parquet",
        columns=columns,
        endpoint=hub.endpoint,
        options=options,
    )
    wanted: list[float] = []
    files: set[tuple[int, int]] = set()
    async with episodes:
        async for ep in episodes:
            files.add((ep[f"{prefix}/chunk_index"], ep[f"{prefix}/file_index"]))
            seconds = ep["length"] / 30
            for k in range(per_episode):
                t = round(seconds * (k + 1) / (per_episode + 1) * 30) / 30
                wanted += [ep[f"{prefix}/from_timestamp"] + t + d for d in _DELTAS]
    (chunk, file), *more = sorted(files)
    if more:  # the demo writes one video file per camera
        raise AssertionError(f"the demo dataset has {len(files)} video files; expected one")
    path = f"{prefix}/chunk-{chunk:03d}/file-{file:03d}.mp4"
    # Frames far apart in the file are fetched as separate, concurrent reads: with the
    # default coalesce_gap (1 MiB) the holes between them would be fetched too.
    async with video.open(hub.url(repo, path), options=options) as reader:
        got = await reader.frames_at(wanted, tolerance_s=0.5 / reader.fps)
    seconds = time.perf_counter() - started
    stats = hub.stats()
    row = DemoRow(
        "sparse frames",
        "aiostream-hf",
        len(got),
        "frames",
        seconds,
        stats.bytes_served,
        seconds,
        _requests(stats),
    )
    size = (hub.root / "datasets" / repo / path).stat().st_size
    return _Frames(row, got.data, size, len(wanted) // len(_DELTAS))


_DATASETS_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import datasets
    datasets.disable_progress_bars()
    started = time.perf_counter()
    first = None
    rows = touched = 0
    for row in datasets.load_dataset(sys.argv[1], split="train", streaming=True):
        if first is None:
            first = time.perf_counter() - started
        rows += 1
        touched += len(row["text"])
    print(json.dumps({"rows": rows, "seconds": time.perf_counter() - started, "first": first}))
    """
)


def _measure_datasets(hub: Any, repo: str, scratch: Path) -> DemoRow | str:
    """``datasets`` streaming the same repo in a subprocess (its import not timed)."""
    if importlib.util.find_spec("datasets") is None:
        return "datasets is not installed: `pip install datasets` to see it side by side"
    env = dict(os.environ)
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        env.pop(key, None)
    env.update(
        HF_ENDPOINT=hub.endpoint,
        HF_HOME=str(scratch / "hf-home"),
        HF_DATASETS_CACHE=str(scratch / "hf-datasets"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HUB_DISABLE_XET="1",
        PYTHONWARNINGS="ignore",
    )
    hub.reset_stats()
    proc = subprocess.run(
        [sys.executable, "-c", _DATASETS_SCRIPT, repo],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    stats = hub.stats()
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"datasets streaming failed ({tail}); its row is left out"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return DemoRow(
        "text Parquet",
        "datasets",
        result["rows"],
        "rows",
        result["seconds"],
        stats.bytes_served,
        result["first"],
        _requests(stats),
    )


def _text_len(row: Any) -> int:
    return len(row["text"])


def _image_len(row: Any) -> int:
    return len(row["image"]["bytes"])


def _sample_len(sample: Any) -> int:
    return sum(len(v) for v in sample.values() if isinstance(v, bytes))


def _half(images: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """Frames at half their width and height (2x2 means), for a sheet of sane size."""
    t, h, w, c = images.shape
    cut = images[:, : h - h % 2, : w - w % 2].astype(np.uint16)
    small: npt.NDArray[np.uint8] = (
        cut.reshape(t, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4)).round().astype(np.uint8)
    )
    return small


def run_demo(
    out: str | os.PathLike[str] | None = None,
    *,
    quick: bool = False,
    compare: bool = True,
    log: Callable[[str], None] = print,
) -> DemoReport:
    """Build, serve, stream and measure; see the module docstring.

    ``out`` defaults to a new temporary folder, which is kept: it holds the contact
    sheet. In an ``out`` given, only ``hub/``, ``cache/`` and ``contact_sheet.png`` are
    written (and replaced). ``compare=False`` leaves ``datasets`` out.
    """
    from .testing import Faults, HubServer

    sizes = _QUICK if quick else _FULL
    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="aiostream-hf-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    root, cache = folder / "hub", folder / "cache"
    for owned in (root, cache):  # only what the demo itself writes
        shutil.rmtree(owned, ignore_errors=True)
    _build(root, sizes, log)
    notes: list[str] = []
    rows: list[DemoRow] = []
    log("serving them with the local Hub server (+20 ms per request) and streaming each")
    with HubServer(root, faults=Faults(latency_ms=20), subprocess=True) as hub:

        async def measure() -> tuple[_Frames, _Frames]:
            runs = [
                ("text Parquet", "demo/text", "rows", _text_len),
                ("image Parquet", "demo/images", "rows", _image_len),
                ("WebDataset", "demo/webdataset", "samples", _sample_len),
            ]
            for i, (workload, repo, unit, touch) in enumerate(runs):
                rows.append(await _measure_stream(hub, workload, repo, unit, cache / str(i), touch))
                if i == 0 and compare:
                    with tempfile.TemporaryDirectory(prefix="aiostream-hf-demo-") as scratch:
                        theirs = await anyio.to_thread.run_sync(
                            _measure_datasets, hub, "demo/text", Path(scratch)
                        )
                    if isinstance(theirs, DemoRow):
                        rows.append(theirs)
                    else:
                        notes.append(theirs)
            stride = max(1, sum(sizes.episodes) // _SHEET_ITEMS)
            items = await _measure_lerobot_items(hub, "demo/lerobot", stride, cache / "lerobot")
            rows.append(items.row)
            sparse = await _measure_sparse_frames(
                hub, "demo/lerobot", sizes.items_per_episode, cache / "sparse"
            )
            rows.append(sparse.row)
            return items, sparse

        items, sparse = anyio.run(measure)
    shown = len(_DELTAS) * _SHEET_ITEMS  # each item's frames side by side, a caption each
    sheet_frames, captions = _half(items.images[:shown]), items.captions[:shown]
    sheet = write_png(folder / "contact_sheet.png", contact_sheet(sheet_frames, captions=captions))
    deltas = ", ".join(f"{d:+.1f}" for d in _DELTAS)
    notes.append(
        f"LeRobot v3.0: {items.row.samples} items, each with the camera frames at t{deltas} s "
        f"(delta_timestamps), from one {human_bytes(sparse.video_size)} video of "
        f"{len(sizes.episodes)} episodes; the contact sheet shows the {len(sheet_frames)} "
        f"frames of {len(sheet_frames) // len(_DELTAS)} of them, each item's side by side, "
        "captioned with its index, episode and the frame's time"
    )
    fetched = sparse.row.bytes_served
    notes.append(
        f"sparse frames: {sparse.items} such windows spread over the episodes fetched "
        f"{human_bytes(fetched)} ({100 * fetched / sparse.video_size:.0f}% of the video, "
        f"episodes table included) in {sum(sparse.row.requests.values())} requests"
    )
    ours = next(r for r in rows if r.workload == "text Parquet" and r.reader == "aiostream-hf")
    theirs_row = next((r for r in rows if r.reader == "datasets"), None)
    if theirs_row is not None:
        ratio = ours.samples_per_s / theirs_row.samples_per_s
        ours_n, theirs_n = sum(ours.requests.values()), sum(theirs_row.requests.values())
        notes.insert(
            0,
            f"text Parquet: aiostream-hf read {ratio:.1f}x the rows/s of datasets streaming, "
            f"with {ours_n} requests against {theirs_n} (one run, same data, same server)",
        )
    return DemoReport(tuple(rows), folder, sheet, tuple(notes))


# -- a recorded run ---------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _machine() -> str:
    load = ""
    if hasattr(os, "getloadavg"):
        load = f"; load average {os.getloadavg()[0]:.1f} at the start"
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({_cpu_model()}), "
        f"Python {platform.python_version()}{load}"
    )


def _code() -> str:
    """The commit the run's code is at, and the package files changed since (best effort)."""
    package = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        proc = subprocess.run(
            ["git", *args], cwd=package, capture_output=True, text=True, check=False
        )
        return proc.stdout.rstrip() if proc.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "not a git checkout"
    changed = [line[3:] for line in git("status", "--porcelain", "--", ".").splitlines()]
    return f"commit {commit}" + (
        f", with uncommitted changes to {', '.join(changed)}" if changed else ""
    )


def record_text(
    report: DemoReport,
    *,
    started: datetime.datetime,
    seconds: float,
    machine: str,
    command: str,
    code: str = "",
) -> str:
    """A recorded run: when, where and how, then the table and the notes the demo prints."""
    from .__version__ import __version__

    when = started.astimezone(datetime.timezone.utc)
    header = [
        f"aiostream-hf demo, recorded {when:%Y-%m-%d %H:%M} UTC",
        f"machine: {machine}",
        f"versions: aiostream-hf {__version__}, datasets {_version('datasets')}, "
        f"pyarrow {_version('pyarrow')}, av {_version('av')}",
        *([f"code: {code}"] if code else []),
        f"command: {command}",
        f"wall time: {seconds:.0f} s (writing the datasets included)",
    ]
    notes = [f"- {note}" for note in report.notes]
    return "\n".join([*header, "", report.table(), "", *notes]) + "\n"


def _record(argv: Sequence[str]) -> int:
    """``python -m aiostream_hf._demo FILE``: the full demo, its output recorded in FILE."""
    if len(argv) != 1:
        print("usage: python -m aiostream_hf._demo FILE (e.g. docs/demo-output.txt)")
        return 2
    target = Path(argv[0])
    machine = _machine()
    started = datetime.datetime.now(datetime.timezone.utc)
    clock = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="aiostream-hf-demo-") as out:
        report = run_demo(out, log=lambda line: print(line, file=sys.stderr))
    seconds = time.perf_counter() - clock
    command = f"python -m aiostream_hf._demo {argv[0]} (the full demo, as `aiostream-hf demo`)"
    text = record_text(
        report, started=started, seconds=seconds, machine=machine, command=command, code=_code()
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(_record(sys.argv[1:]))
