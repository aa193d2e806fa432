"""The ``aiostream-hf`` command line.

    aiostream-hf ls hf://datasets/ORG/NAME                 files, configs, splits, sizes
    aiostream-hf head hf://datasets/ORG/NAME -n 3          the first samples, pretty
    aiostream-hf bench hf://datasets/ORG/NAME --json       samples/s, MB/s, requests
    aiostream-hf frames URL --at 1.0,2.5 --out sheet.png   a contact sheet of video frames
    aiostream-hf hub serve ROOT                            the local Hub-compatible server
    aiostream-hf demo                                      all of it, offline, in a minute

Every command that reads data takes ``--endpoint`` (default ``HF_ENDPOINT``, then
https://huggingface.co) and ``--token`` (default ``HF_TOKEN``, then the login stored
by ``hf auth login``); ``s3://`` sources are reached with the AWS variables and config
files (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``...), or unsigned with
``--no-sign-request`` (a public bucket); ``--timeout`` and ``--retries`` set their
patience. Bad input and network failures end with ``Error: ...`` (for a network
failure, a second line with the way out) and exit code 1, never a traceback; the
library's warnings come on stderr, one line each; Ctrl-C ends a command within a
second, with one line on stderr and exit code 130.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ._cli_run import (
    PORT,
    FiniteFloat,
    Group,
    check_writable,
    explained,
    lerobot_note,
    plural,
    report_absent,
    repos_under,
    run,
    served_repos,
    write_or_fail,
)
from ._exceptions import AiostreamError

if TYPE_CHECKING:
    from ._describe import LeRobotSummary, Names, WebDatasetSummary
    from ._engine import Readers
    from ._models import Manifest
    from ._options import StreamOptions
    from ._resolver import Resolver

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


@click.group(cls=Group)
@click.version_option(package_name="aiostream-hf")
def main() -> None:
    """Stream datasets from the Hugging Face Hub and HTTP object stores."""


#: The CLI's patience, as huggingface_hub's own (HF_HUB_DOWNLOAD_TIMEOUT's 10 s, its
#: http_backoff's 5 retries), shorter than a stream's defaults: an endpoint that accepts
#: connections and never answers fails ``ls`` in about a minute, with a warning per retry.
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_RETRIES = 5


def _hub_options(command: F) -> F:
    """--endpoint, --token, --no-sign-request, --timeout and --retries, for every command
    that reads data; a library error it ends with says how to get past it."""

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        try:
            return command(**kwargs)
        except AiostreamError as exc:
            raise click.ClickException(explained(exc, kwargs)) from exc

    wrapped: Any = run
    wrapped = click.option(
        "--retries",
        type=click.IntRange(min=0),
        default=DEFAULT_RETRIES,
        show_default=True,
        help="Retries of a request that fails (network errors, timeouts, 408/429/5xx).",
    )(wrapped)
    wrapped = click.option(
        "--timeout",
        type=FiniteFloat(min=0, min_open=True),
        default=DEFAULT_TIMEOUT_S,
        show_default=True,
        metavar="SECONDS",
        help="Seconds without an answer (or progress) before a request is retried.",
    )(wrapped)
    wrapped = click.option(
        "--no-sign-request",
        is_flag=True,
        help="s3:// sources: send requests unsigned (a public bucket); else the AWS "
        "credentials of the environment and config files sign them.",
    )(wrapped)
    wrapped = click.option(
        "--token",
        metavar="TOKEN",
        help="Hub token (default: HF_TOKEN, then the login stored by `hf auth login`).",
    )(wrapped)
    wrapped = click.option(
        "--endpoint",
        metavar="URL",
        help="Hub endpoint (default: HF_ENDPOINT, then https://huggingface.co).",
    )(wrapped)
    return wrapped  # type: ignore[no-any-return]


def _options(no_sign_request: bool, timeout: float, retries: int, **fields: Any) -> StreamOptions:
    """The StreamOptions of a command: ``fields``, the CLI's patience (--timeout,
    --retries), and s3_anonymous for --no-sign-request."""
    from ._options import StreamOptions

    return StreamOptions(
        **fields, timeout=timeout, max_retries=retries, s3_anonymous=no_sign_request
    )


def _split_columns(values: Sequence[str]) -> list[str] | None:
    """--columns a,b --columns c -> [a, b, c]; nothing given -> None (every column)."""
    columns = [c.strip() for value in values for c in value.split(",") if c.strip()]
    return columns or None


_columns_option = click.option(
    "--columns",
    multiple=True,
    metavar="A,B",
    help="Read only these columns (comma-separated, or the option repeated).",
)
_format_option = click.option(
    "--format",
    "format_",
    metavar="FORMAT",
    help="The files' format when their names do not tell it (parquet, webdataset, ...).",
)


# -- ls -------------------------------------------------------------------------------


@main.command("ls")
@click.argument("source")
@click.option("--config", help="Show only this config (default: every config).")
@click.option("--split", help="Show only this split.")
@_hub_options
def ls(
    source: str,
    config: str | None,
    split: str | None,
    endpoint: str | None,
    token: str | None,
    no_sign_request: bool,
    timeout: float,
    retries: int,
) -> None:
    """List the files, configs and splits of SOURCE, with their sizes.

    SOURCE is hf://datasets/ORG/NAME[@REV][/PATH-OR-GLOB], an http(s) URL (braces
    expand: shard-{000..009}.tar), s3://BUCKET/PREFIX-OR-GLOB, or a local path or
    glob. A LeRobot dataset (it has meta/info.json) shows its episodes, frames, fps and
    cameras; WebDataset shards show their count, size and the extensions of their first
    samples. Each file a brace pattern or URL names is checked: those not there are
    listed as missing, and ls exits with code 1.
    """
    from ._demo import human_bytes, render_table

    listing = run(
        _ls, source, config, split, endpoint, token, _options(no_sign_request, timeout, retries)
    )
    manifests, meta, shards = listing.manifests, listing.lerobot, listing.webdataset
    first = manifests[0] if manifests else None
    if first is not None and first.repo_id is not None:
        where = f"{first.repo_id} @ {(first.commit or '?')[:12]}"
        click.echo(f"{where}  ({first.endpoint})")
    else:
        click.echo(source)
    if meta is not None:
        _echo_lerobot(meta)
        return
    if first is None:  # none of the files the pattern names is there
        report_absent(source, listing.names)
        return
    if first.format:
        click.echo(f"format: {first.format}")
    click.echo()
    if shards is not None:
        _echo_webdataset(shards, default=first.config if config is None else None)
        report_absent(source, listing.names)
        return
    rows = []
    for m in manifests:
        for split_name in m.splits:
            files = [f for f in m.files if f.split == split_name]
            rows.append(
                [_config_label(m, first, config), split_name, str(len(files)), _size(files)]
            )
    click.echo(render_table(["config", "split", "files", "size"], rows, right=(2, 3)))
    click.echo()
    for m in manifests:
        click.echo(f"files of config {m.config!r}:")
        listing_rows = [
            [f.split or "", human_bytes(f.size) if f.size is not None else "?", f.path]
            for f in m.files
        ]
        click.echo(render_table(["split", "size", "path"], listing_rows, right=(1,)))
    report_absent(source, listing.names)


def _config_label(m: Manifest, first: Manifest, config: str | None) -> str:
    if m is first and config is None and len(first.configs) > 1:
        return f"{m.config} (default)"
    return str(m.config)


def _size(files: Sequence[Any]) -> str:
    from ._demo import human_bytes

    sizes = [f.size for f in files]
    known = [s for s in sizes if s is not None]
    return human_bytes(sum(known)) if len(known) == len(sizes) else "?"


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _echo_lerobot(summary: LeRobotSummary) -> None:
    from ._demo import human_bytes, render_table

    data = f"{summary.data_files} data"
    if summary.data_bytes is not None:
        data += f" ({human_bytes(summary.data_bytes)})"
    lines = [
        ("format", "lerobot"),
        ("codebase version", summary.version),
        ("robot type", summary.robot_type or "-"),
        ("episodes", f"{summary.episodes:,}"),
        ("total frames", f"{summary.frames:,}"),
        ("fps", _number(summary.fps)),
        ("tasks", f"{summary.tasks:,}"),
        ("splits", ", ".join(f"{k} {v}" for k, v in summary.splits.items()) or "-"),
        ("files", f"{data}, {summary.video_files} video"),
    ]
    for label, value in lines:
        click.echo(f"{label}: {value}")
    click.echo()
    if summary.cameras:
        rows = [
            [
                c.key,
                c.codec or "?",
                c.resolution or "?",
                "?" if c.fps is None else _number(c.fps),
                c.pix_fmt or "?",
            ]
            for c in summary.cameras
        ]
        click.echo(render_table(["camera", "codec", "resolution", "fps", "pix_fmt"], rows))
    else:
        click.echo("cameras: none")
    if summary.features:
        click.echo()
        rows = [[key, kind] for key, kind in summary.features.items()]
        click.echo(render_table(["feature", "type"], rows))


def _echo_webdataset(summary: WebDatasetSummary, default: str | None) -> None:
    from ._demo import human_bytes, render_table

    several = len({g.config for g in summary.groups}) > 1
    rows = [
        [
            f"{g.config} (default)" if several and g.config == default else str(g.config),
            str(g.split),
            f"{g.count:,}",
            "?" if g.size is None else human_bytes(g.size),
            g.first,
            g.last,
        ]
        for g in summary.groups
    ]
    headers = ["config", "split", "shards", "size", "first", "last"]
    click.echo(render_table(headers, rows, right=(2, 3)))
    click.echo()
    if summary.sampled_from is None:
        click.echo("samples: none (no shard)")
    elif not summary.sampled:
        click.echo(f"samples: none in {summary.sampled_from}")
    else:
        exts = ", ".join(summary.extensions) or "(none)"
        n = summary.sampled
        click.echo(
            f"extensions: {exts}  (the first {n} sample{'s' if n != 1 else ''} "
            f"of {summary.sampled_from})"
        )


@dataclass(frozen=True)
class _Listing:
    manifests: list[Manifest]
    lerobot: LeRobotSummary | None = None
    webdataset: WebDatasetSummary | None = None
    names: Names | None = None  # the files a brace pattern or URL names, checked


async def _ls(
    source: str,
    config: str | None,
    split: str | None,
    endpoint: str | None,
    token: str | None,
    options: StreamOptions,
) -> _Listing:
    """What ``ls`` shows: the manifests, and what a LeRobot or WebDataset dataset adds.

    Read with one set of readers (``open_readers``: one access, the loop's client)."""
    from . import _describe
    from ._engine import open_readers

    async def listing(readers: Readers) -> _Listing:
        folder = _describe.local_lerobot(source)
        if folder is not None:
            meta = await _describe.load_lerobot(str(folder), readers, options=options)
            return _Listing([], lerobot=_describe.LeRobotSummary.from_metadata(meta))
        names = await _describe.check_names(source, readers)  # which files are there
        if names is not None and not names.present:
            return _Listing([], names=names)
        there = source if names is None else list(names.present)
        manifests = await _resolve_all(there, config, split, readers.resolver)
        manifests = [m if names is None else names.sized(m) for m in manifests]
        found = await _describe.find_lerobot(source, manifests[0], readers, options=options)
        if found is not None:
            return _Listing(manifests, lerobot=_describe.LeRobotSummary.from_metadata(found))
        if manifests[0].format == "webdataset":
            shards = await _describe.webdataset_summary(manifests, readers, options=options)
            return _Listing(manifests, webdataset=shards, names=names)
        return _Listing(manifests, names=names)

    async with open_readers(options, token=token, endpoint=endpoint) as readers:
        # A pin shared by an earlier run that the Hub no longer knows: once more, afresh.
        return await readers.resolver.with_fresh_pin(functools.partial(listing, readers))


async def _resolve_all(
    source: str | list[str], config: str | None, split: str | None, resolver: Resolver
) -> list[Manifest]:
    """The manifest of the selected (or default) config, then those of the other configs.

    The Resolver keeps the pin, tree and card in memory: the other configs cost no request.
    """
    first = await resolver.resolve(source, config=config, split=split)
    manifests = [first]
    if config is None:
        for other in first.configs:
            if other != first.config:
                manifests.append(await resolver.resolve(source, config=other, split=split))
    return manifests


# -- head -----------------------------------------------------------------------------


@main.command("head")
@click.argument("source")
@click.option(
    "-n",
    "--num",
    "n",
    default=5,
    show_default=True,
    type=click.IntRange(min=1),
    help="How many samples (rows, or WebDataset samples) to print.",
)
@_columns_option
@_format_option
@click.option("--split", help="The split to read (default: every split, in order).")
@click.option("--config", help="The config to read (default: the dataset's default).")
@click.option(
    "--width",
    default=100,
    show_default=True,
    type=click.IntRange(min=1),
    help="Cut values longer than this.",
)
@_hub_options
def head(
    source: str,
    n: int,
    columns: tuple[str, ...],
    format_: str | None,
    split: str | None,
    config: str | None,
    width: int,
    endpoint: str | None,
    token: str | None,
    no_sign_request: bool,
    timeout: float,
    retries: int,
) -> None:
    """Print the first N samples of SOURCE; binary fields show as <bytes: 1234 B>.

    WebDataset payloads of text-like extensions (.txt, .cls, .json...) show as their
    value, decoded as webdataset's default decoders do. Only what those samples need
    is read (for Parquet, the first row group of the columns asked for).
    """
    options = _options(no_sign_request, timeout, retries)
    what = {"columns": _split_columns(columns), "split": split, "config": config}
    samples, note = run(_head, source, n, what, format_, endpoint, token, options)
    if note is not None:
        click.echo(note, err=True)
    if not samples:
        click.echo("(no samples)")
    for i, sample in enumerate(samples):
        if i:
            click.echo()
        click.echo(f"[{i}]")
        keys = list(sample) if isinstance(sample, Mapping) else ["value"]
        values = sample if isinstance(sample, Mapping) else {"value": sample}
        pad = max(len(str(k)) for k in keys) if keys else 0
        for key in keys:
            click.echo(f"  {str(key).ljust(pad)}  {summarize(values[key], width)}")


async def _head(
    source: str,
    n: int,
    what: dict[str, Any],
    format_: str | None,
    endpoint: str | None,
    token: str | None,
    options: StreamOptions,
) -> tuple[list[Any], str | None]:
    from ._stream import stream

    samples: list[Any] = []
    s = stream(source, format=format_, endpoint=endpoint, token=token, options=options, **what)
    async with s:
        async for sample in s:
            samples.append(sample)
            if len(samples) >= n:
                break
    manifest = s.manifest
    if manifest is not None and manifest.format == "webdataset":
        from ._describe import payload_value

        # Text-like payloads (.cls, .txt, .json...) as webdataset's default decoders
        # give them; images and other binary payloads stay bytes.
        samples = [
            {k: v if k.startswith("__") else payload_value(k, v) for k, v in sample.items()}
            for sample in samples
        ]
    return samples, lerobot_note(manifest, "head")


def summarize(value: Any, width: int = 100) -> str:
    """A one-line view of a sample value: bytes as ``<bytes: 1234 B>``, long text cut."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<bytes: {len(value)} B>"
    if isinstance(value, str):
        if len(value) <= width:
            return repr(value)
        return f"{value[:width]!r}... ({len(value):,} chars)"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{k}: {summarize(v, max(20, width // 2))}" for k, v in value.items())
        return "{" + inner + "}"
    if isinstance(value, (list, tuple)):
        shown = [summarize(v, max(20, width // 4)) for v in value[:8]]
        more = f", ... ({len(value):,} items)" if len(value) > 8 else ""
        return "[" + ", ".join(shown) + more + "]"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"<array {dtype} {tuple(shape)}>"
    text = repr(value)
    return text if len(text) <= width else text[:width] + "..."


# -- bench ----------------------------------------------------------------------------


@main.command("bench")
@click.argument("source")
@click.option("--split", help="The split to read (default: every split).")
@click.option("--config", help="The config to read (default: the dataset's default).")
@_columns_option
@_format_option
@click.option("--limit", type=click.IntRange(min=1), help="Stop after this many samples.")
@click.option("--batch-size", type=click.IntRange(min=1), help="Count batches of this many rows.")
@click.option("--arrow", is_flag=True, help="Read pyarrow RecordBatches (no Python rows).")
@click.option(
    "--rows",
    is_flag=True,
    help="On a LeRobot dataset, read its data rows only (default: items, frames decoded).",
)
@click.option(
    "--max-concurrency", type=click.IntRange(min=1), help="StreamOptions.max_concurrency."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the result as JSON instead of a table."
)
@click.option(
    "--progress/--no-progress", default=True, show_default=True, help="The bar on stderr."
)
@_hub_options
def bench(
    source: str,
    split: str | None,
    config: str | None,
    columns: tuple[str, ...],
    format_: str | None,
    limit: int | None,
    batch_size: int | None,
    arrow: bool,
    rows: bool,
    max_concurrency: int | None,
    as_json: bool,
    progress: bool,
    endpoint: str | None,
    token: str | None,
    no_sign_request: bool,
    timeout: float,
    retries: int,
) -> None:
    """Stream SOURCE to the end (or --limit) and report samples/s, MB/s, requests, and
    where the time went.

    A progress bar on stderr shows the rates while it runs, and the share of the time
    spent waiting for data and on what: the network, decoding, or the engine (the
    bottleneck is "consumer" when the data keeps up). Requests are the ones this client
    made: "api" (repo info and tree listings), "resolvers" (a file's /resolve/ URL,
    once per file) and "cdn" (the range reads). A LeRobot dataset is benched as its
    items, camera frames decoded (--rows: its data rows only).
    """
    from ._cli_bench import bench as run_bench
    from ._cli_bench import render

    limits = {} if max_concurrency is None else {"max_concurrency": max_concurrency}
    options = _options(no_sign_request, timeout, retries, **limits)
    kwargs: dict[str, Any] = {
        "split": split,
        "config": config,
        "columns": _split_columns(columns),
        "format": format_,
        "batch_size": batch_size,
        "output": "arrow" if arrow else "python",
        "options": options,
        "endpoint": endpoint,
        "token": token,
    }
    result = run(functools.partial(run_bench, rows=rows), source, kwargs, limit, progress)
    if result["note"] is not None:
        click.echo(result["note"], err=True)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    from ._demo import render_table

    click.echo(render_table(["bench", source], render(result), right=(1,)))


# -- frames ---------------------------------------------------------------------------


def _timestamps(ctx: click.Context, param: click.Parameter, value: str) -> list[float]:
    try:
        times = [float(t) for t in value.split(",") if t.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: give seconds separated by commas, e.g. 1.0,2.5"
        ) from None
    if not times or any(not (math.isfinite(t) and t >= 0) for t in times):
        raise click.BadParameter(f"{value!r}: give seconds >= 0 separated by commas, e.g. 1.0,2.5")
    return times


@main.command("frames")
@click.argument("url")
@click.option(
    "--at",
    "at",
    required=True,
    callback=_timestamps,
    metavar="T1,T2,...",
    help="Seconds, comma-separated.",
)
@click.option(
    "--out",
    default="frames.png",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The contact sheet PNG to write.",
)
@click.option(
    "--cols", type=click.IntRange(min=1), help="Frames per row of the sheet (default: up to 4)."
)
@click.option(
    "--tolerance",
    type=FiniteFloat(min=0),
    help="Take the nearest frame within these seconds (default: the frame on screen).",
)
@_hub_options
def frames(
    url: str,
    at: list[float],
    out: Path,
    cols: int | None,
    tolerance: float | None,
    endpoint: str | None,
    token: str | None,
    no_sign_request: bool,
    timeout: float,
    retries: int,
) -> None:
    """Sample the frames of a video at given times and write them as a contact sheet.

    URL is an http(s) URL, a local path, hf://datasets/ORG/NAME[@REV]/PATH.mp4 or
    s3://BUCKET/KEY.mp4.
    Only the video's index and the bytes of the frames asked for are fetched.
    """
    from ._demo import contact_sheet, human_bytes, write_png
    from ._exceptions import SourceError
    from .video import check_source

    try:
        check_source(url)  # a URL that cannot name one video is a usage error, at once
    except SourceError as exc:
        raise click.BadParameter(str(exc), param_hint="URL") from exc
    check_writable(out, "the contact sheet")
    # Frames far apart are read as separate concurrent ranges, not one span with holes.
    options = _options(no_sign_request, timeout, retries, coalesce_gap=64 * 1024)
    result = run(_frames, url, at, tolerance, endpoint, token, options)
    sheet = contact_sheet(result["data"], columns=cols)
    write_or_fail(out, "the contact sheet", lambda: write_png(out, sheet))
    click.echo(
        f"wrote {out}: {plural(len(result['pts']), 'frame')} of "
        f"{result['width']}x{result['height']} "
        f"{result['codec']} at {', '.join(f'{t:.3f}' for t in result['pts'])} s"
    )
    size = result["size"]
    share = f" of {human_bytes(size)} ({100 * result['bytes'] / size:.0f}%)" if size else ""
    requests = plural(result["requests"], "request")
    click.echo(f"fetched {human_bytes(result['bytes'])}{share} in {requests}")


async def _frames(
    url: str,
    at: list[float],
    tolerance: float | None,
    endpoint: str | None,
    token: str | None,
    options: StreamOptions,
) -> dict[str, Any]:
    from . import video
    from ._engine import open_readers

    # The readers every entry point uses: an hf:// file is resolved like any source (its
    # commit pinned, its path checked against the repo's listing), with the same access.
    async with open_readers(options, token=token, endpoint=endpoint) as readers:
        fetcher = readers.fetcher
        async with video.open(url, fetcher=fetcher, options=options) as reader:
            got = await reader.frames_at(at, tolerance_s=tolerance)  # None: the frame on screen
            info = {"width": reader.width, "height": reader.height, "codec": reader.codec}
            size = reader.file.size
        stats = fetcher.statistics()
    return {
        **info,
        "data": got.data,
        "pts": [float(t) for t in got.pts],
        "bytes": stats.bytes_received,
        "requests": stats.total_requests,
        "size": size,
    }


# -- demo -----------------------------------------------------------------------------


@main.command("demo")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the data and the contact sheet go (default: a new temporary folder, kept).",
)
@click.option("--quick", is_flag=True, help="Smaller datasets: a few seconds.")
@click.option(
    "--datasets/--no-datasets",
    "compare",
    default=True,
    show_default=True,
    help="Stream the text Parquet with `datasets` too, when it is installed.",
)
@click.option(
    "--json",
    "as_json",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the results to this JSON file.",
)
def demo(out: Path | None, quick: bool, compare: bool, as_json: Path | None) -> None:
    """Build small datasets of every kind, serve them like the Hub, stream and measure.

    Offline: the local Hub server adds 20 ms to every request, as a network would.
    Prints a table of samples/s, MB/s, time to first sample and requests by bucket
    (counted by the server), and writes a contact sheet of sampled video frames.
    """
    from ._demo import run_demo

    if out is not None:
        check_writable(out, "the demo's data", folder=True)
    if as_json is not None:
        check_writable(as_json, "the JSON results")
    report = run_demo(
        out, quick=quick, compare=compare, log=lambda line: click.echo(line, err=True)
    )
    click.echo(report.table())
    click.echo()
    for note in report.notes:
        click.echo(f"- {note}")
    click.echo(f"- contact sheet: {report.contact_sheet}")
    hub = report.out / "hub"
    click.echo(f"- data: {hub}")
    repos = repos_under(hub)
    click.echo(f"- repos: {', '.join(repos)}")
    first = "demo/text" if "demo/text" in repos else repos[0]
    click.echo(
        f"- next: `aiostream-hf hub serve {hub}` serves them; with HF_ENDPOINT set to the "
        f"endpoint it prints, `aiostream-hf ls hf://datasets/{first}` lists one"
    )
    if as_json is not None:
        text = json.dumps(report.to_json(), indent=2)
        write_or_fail(as_json, "the JSON results", lambda: as_json.write_text(text))


# -- hub ------------------------------------------------------------------------------


@main.group(cls=Group)
def hub() -> None:
    """The local Hub-compatible server (for tests, demos and offline work)."""


def _grant(values: tuple[str, ...], option: str) -> dict[str, list[str]]:
    grants: dict[str, list[str]] = {}
    for value in values:
        repo, sep, token = value.partition("=")
        if not sep or repo.count("/") != 1 or not token:
            raise click.BadParameter(f"{value!r}: expected ORG/NAME=TOKEN", param_hint=option)
        grants.setdefault(repo, []).append(token)
    return grants


@hub.command("serve")
@click.argument("root", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=PORT, default=0, show_default=True, help="Hub port (0: a free one).")
@click.option(
    "--cdn-port", type=PORT, default=0, show_default=True, help="CDN port (0: a free one)."
)
@click.option(
    "--latency-ms",
    type=FiniteFloat(min=0),
    default=0.0,
    show_default=True,
    help="Added to every request.",
)
@click.option(
    "--bandwidth-per-connection",
    type=FiniteFloat(min=0, min_open=True),
    help="Bytes/s cap per connection.",
)
@click.option(
    "--bandwidth-total",
    type=FiniteFloat(min=0, min_open=True),
    help="Bytes/s cap for the whole server.",
)
@click.option(
    "--error-rate",
    type=FiniteFloat(0, 1),
    default=0.0,
    show_default=True,
    help="Share of 503 answers.",
)
@click.option(
    "--cut-rate",
    type=FiniteFloat(0, 1),
    default=0.0,
    show_default=True,
    help="Share of bodies cut mid-way.",
)
@click.option(
    "--slow-first-byte-rate",
    type=FiniteFloat(0, 1),
    default=0.0,
    show_default=True,
    help="Share of answers whose first byte waits --slow-first-byte-ms.",
)
@click.option(
    "--slow-first-byte-ms",
    type=FiniteFloat(min=0),
    default=1000.0,
    show_default=True,
    help="How long a slow first byte waits.",
)
@click.option("--api-quota", type=click.IntRange(min=0), help="API requests per client per window.")
@click.option(
    "--resolvers-quota",
    type=click.IntRange(min=0),
    help="Resolver requests per client per window.",
)
@click.option(
    "--window-s",
    type=FiniteFloat(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Rate-limit window.",
)
@click.option("--private", multiple=True, metavar="ORG/NAME=TOKEN", help="A private repo.")
@click.option("--gated", multiple=True, metavar="ORG/NAME=TOKEN", help="A gated repo.")
def hub_serve(
    root: Path,
    host: str,
    port: int,
    cdn_port: int,
    latency_ms: float,
    bandwidth_per_connection: float | None,
    bandwidth_total: float | None,
    error_rate: float,
    cut_rate: float,
    slow_first_byte_rate: float,
    slow_first_byte_ms: float,
    api_quota: int | None,
    resolvers_quota: int | None,
    window_s: float,
    private: tuple[str, ...],
    gated: tuple[str, ...],
) -> None:
    """Serve the dataset repos under ROOT/datasets/ORG/NAME like the Hub.

    Prints one JSON line with the endpoints when ready; runs until Ctrl-C.
    """
    from .testing._hub_server import serve_forever

    serve_forever(
        {
            "root": str(root),
            "host": host,
            "port": port,
            "cdn_port": cdn_port,
            "faults": {
                "latency_ms": latency_ms,
                "bandwidth_per_connection": bandwidth_per_connection,
                "bandwidth_total": bandwidth_total,
                "error_rate": error_rate,
                "cut_rate": cut_rate,
                "slow_first_byte_rate": slow_first_byte_rate,
                "slow_first_byte_ms": slow_first_byte_ms,
            },
            "rate_limits": {"api": api_quota, "resolvers": resolvers_quota, "window_s": window_s},
            "private": _grant(private, "--private"),
            "gated": _grant(gated, "--gated"),
        },
        ready=sys.stdout,
        started=lambda: click.echo(served_repos(root), err=True),
    )


if __name__ == "__main__":
    main()
