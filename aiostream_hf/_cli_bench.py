"""``aiostream-hf bench``: stream a source to the end and say how fast, at what cost
in requests, and where the time went.

A LeRobot dataset is benched as its items, camera frames decoded
(``aiostream_hf.lerobot.stream``), unless rows only are asked for (``--rows``, or an
option that only rows have: columns, format, batches, Arrow). The progress bar shows,
live, the share of time spent waiting for data and on what (``Stalls``); the result
holds it too.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from collections.abc import Mapping
from typing import Any

from ._cli_run import lerobot_note
from ._describe import local_lerobot
from ._stalls import Stalls

__all__ = ["bench", "render", "waiting"]

#: How often the bar's figures are refreshed, in seconds.
_REFRESH_S = 0.25


async def bench(
    source: str,
    kwargs: dict[str, Any],
    limit: int | None,
    progress: bool,
    *,
    rows: bool,
) -> dict[str, Any]:
    """Stream ``source`` (``stream()``'s ``kwargs``) to the end or ``limit`` samples; a
    LeRobot dataset's items with their frames unless ``rows``. The result is JSON-able."""
    from ._stream import stream

    items = not rows and not _rows_only(kwargs)
    if items and local_lerobot(source) is not None:
        return await _bench_lerobot(source, kwargs, limit, progress)
    s = stream(source, **kwargs)
    result = await _run(s, source, kwargs, limit, progress, _count, stop_early=items)
    if result is None:  # a LeRobot dataset on the Hub: its items instead
        return await _bench_lerobot(source, kwargs, limit, progress)
    if rows:  # asked for: no note that only rows were read
        result["note"] = None
    return result


def _rows_only(kwargs: Mapping[str, Any]) -> bool:
    """Options only rows have were given: the rows are what is benched."""
    return bool(
        kwargs.get("columns")
        or kwargs.get("format")
        or kwargs.get("batch_size")
        or kwargs.get("output") == "arrow"
    )


async def _bench_lerobot(
    source: str, kwargs: dict[str, Any], limit: int | None, progress: bool
) -> dict[str, Any]:
    from . import lerobot

    s = lerobot.stream(
        source,
        split=kwargs.get("split"),
        options=kwargs.get("options"),
        token=kwargs.get("token"),
        endpoint=kwargs.get("endpoint"),
    )
    frames = 0

    def count(item: Any) -> int:
        nonlocal frames
        meta = s.metadata
        for key in meta.video_keys if meta is not None else ():
            value = item.get(key)
            shape: tuple[int, ...] = tuple(getattr(value, "shape", ()))
            frames += shape[0] if len(shape) == 4 else 1
        return 1

    result = await _run(s, source, kwargs, limit, progress, count, stop_early=False)
    assert result is not None
    result["kind"] = "lerobot items"
    result["frames"] = frames
    result["note"] = (
        "note: a LeRobot dataset: bench read its items, camera frames decoded "
        f"({frames:,} frames); pass --rows for its data rows only"
    )
    return result


async def _run(
    s: Any,
    source: str,
    kwargs: dict[str, Any],
    limit: int | None,
    progress: bool,
    count: Any,
    *,
    stop_early: bool,
) -> dict[str, Any] | None:
    """Iterate ``s`` and measure. With ``stop_early``, None once the first sample shows
    that the files are a LeRobot dataset's data rows (its items are benched instead)."""
    from tqdm import tqdm  # type: ignore[import-untyped]

    samples = 0
    started = time.perf_counter()
    bar: Any = None  # made at the first sample: bad input fails before any bar is drawn
    last = 0.0

    def rates(now: float) -> str:
        stats = s.statistics()
        elapsed = max(now - started, 1e-9)
        return (
            f"{elapsed:.1f} s, {samples / elapsed:,.0f} samples/s, "
            f"{stats.bytes_received / 1e6 / elapsed:.1f} MB/s, "
            f"{stats.requests['total']} requests, {waiting(stats.stalls)}"
        )

    try:
        async with s:
            async for item in s:
                if stop_early and bar is None and lerobot_note(s.manifest, "bench") is not None:
                    return None
                samples += count(item)
                now = time.perf_counter()
                if bar is None:
                    bar = tqdm(
                        total=limit,
                        initial=samples,
                        postfix=rates(now),
                        file=sys.stderr,
                        disable=not progress,
                        dynamic_ncols=True,
                        desc="bench",
                        bar_format="{desc}: {n:,} samples{postfix}",
                        mininterval=_REFRESH_S,
                    )
                    last = now
                elif now - last >= _REFRESH_S:
                    last = now
                    bar.set_postfix_str(rates(now), refresh=False)
                bar.update(samples - bar.n)
                if limit is not None and samples >= limit:
                    break
    finally:
        if bar is not None:
            bar.set_postfix_str(rates(time.perf_counter()), refresh=False)
            bar.close()
    seconds = time.perf_counter() - started
    stats = s.statistics()
    from .__version__ import __version__

    return {
        "source": source,
        "kind": "samples",
        "samples": samples,
        "seconds": seconds,
        "samples_per_s": samples / seconds if seconds > 0 else 0.0,
        "bytes_received": stats.bytes_received,
        "mb_per_s": stats.bytes_received / 1e6 / seconds if seconds > 0 else 0.0,
        "time_to_first_sample": _first(stats),
        "files": getattr(stats, "files", getattr(stats, "data_files", 0)),
        "requests": dict(stats.requests),
        "retries": int(stats.fetcher.get("retries", 0)) + int(stats.resolver.get("retries", 0)),
        "throttled": int(stats.fetcher.get("throttled", 0)),
        "stalls": {**dataclasses.asdict(stats.stalls), "input_bound": stats.stalls.input_bound},
        "note": lerobot_note(getattr(s, "manifest", None), "bench"),
        "options": {
            **{k: v for k, v in kwargs.items() if k not in ("options", "token")},
            # the endpoint used: --endpoint, else HF_ENDPOINT, else the Hub (None: no Hub)
            "endpoint": _endpoint_used(s, kwargs.get("endpoint")),
        },
        "environment": {
            "aiostream_hf": __version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
        },
    }


def _first(stats: Any) -> float | None:
    first = getattr(stats, "time_to_first_sample", None)
    return getattr(stats, "time_to_first_item", None) if first is None else first


def waiting(stalls: Stalls) -> str:
    """The live figure: the share of time spent waiting for data, and on what."""
    if stalls.bottleneck is None:
        return "waiting: -"
    share = round(100 * stalls.input_bound)
    if stalls.bottleneck == "consumer":
        return f"waiting for data {share}% (the input keeps up)"
    return f"waiting for data {share}%, mostly on {stalls.bottleneck}"


def render(result: Mapping[str, Any]) -> list[list[str]]:
    """The rows of bench's table."""
    from ._demo import human_bytes

    first = result["time_to_first_sample"]
    req = result["requests"]
    st = result["stalls"]
    seconds = st["seconds"] or 1e-9
    parts = ", ".join(
        f"{name} {100 * st[f'waited_{name}'] / seconds:.0f}%"
        for name in ("network", "decode", "engine")
    )
    rows = [
        ["samples" if result["kind"] == "samples" else "items", f"{result['samples']:,}"],
        *([["frames", f"{result['frames']:,}"]] if "frames" in result else []),
        ["seconds", f"{result['seconds']:.2f}"],
        [
            "samples/s" if result["kind"] == "samples" else "items/s",
            f"{result['samples_per_s']:,.0f}",
        ],
        ["MB/s", f"{result['mb_per_s']:.1f}"],
        ["bytes received", human_bytes(result["bytes_received"])],
        ["time to first sample", "-" if first is None else f"{first * 1000:.0f} ms"],
        ["files", str(result["files"])],
        ["requests: api", str(req["api"])],
        ["requests: resolvers", str(req["resolvers"])],
        ["requests: cdn", str(req["cdn"])],
        ["requests: total", str(req["total"])],
        ["retries", str(result["retries"])],
        ["429s", str(result["throttled"])],
        ["waited for data", f"{100 * st['input_bound']:.0f}% ({parts})"],
        ["bottleneck", _BOTTLENECK.get(st["bottleneck"], "-")],
    ]
    return rows


_BOTTLENECK = {
    "network": "network (reads: more prefetch or concurrency, a closer or faster store)",
    "decode": "decode (the decode threads: fewer columns, lighter decoding, more cores)",
    "engine": "engine (resolving and planning on the event loop)",
    "consumer": "consumer (the loop itself: the input keeps up)",
}


def _endpoint_used(s: Any, given: str | None) -> str | None:
    """The Hub endpoint a stream read from: its manifest's (the resolver's choice among
    ``--endpoint``, ``HF_ENDPOINT`` and the default), else the one given."""
    manifest = getattr(s, "manifest", None)
    if manifest is not None and manifest.endpoint is not None:
        return str(manifest.endpoint)
    return given


def _count(item: Any) -> int:
    """Samples in one item of a stream: a row (1), a RecordBatch or a dict-of-lists batch."""
    rows = getattr(item, "num_rows", None)
    if isinstance(rows, int):
        return rows
    if isinstance(item, Mapping) and item and all(isinstance(v, list) for v in item.values()):
        return len(next(iter(item.values())))
    return 1
