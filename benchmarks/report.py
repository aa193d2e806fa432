"""Write docs/benchmarks.md and its charts from the committed benchmarks/results/*.json.

    .venv/bin/python benchmarks/report.py              # docs/benchmarks.md, docs/img/bench-*.png
    .venv/bin/python benchmarks/report.py --no-charts  # the tables only (no matplotlib needed)
    .venv/bin/python benchmarks/report.py --quick      # *-quick.json -> benchmarks/.data/

Every figure is a ratio measured side by side in one run (see each JSON for
the rounds, the environment and the parameters). The charts need matplotlib
(the ``bench`` extra); everything they show is first extracted by
``chart_data()``, a pure function of the JSON, so it can be checked without it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:  # run as a script it is; loaded from a file (tests), not
    sys.path.insert(0, str(HERE))
import shortfalls  # noqa: E402  (benchmarks/shortfalls.py)

SCRIPTS = {
    "parquet": "benchmarks/parquet_bench.py",
    "parquet-pinned": "benchmarks/parquet_bench.py --pin",
    "webdataset": "benchmarks/webdataset_bench.py",
    "video": "benchmarks/video_bench.py",
    "lerobot": "benchmarks/lerobot_bench.py",
    "startup": "benchmarks/startup_bench.py",
    "ray": "benchmarks/ray_bench.py",
    "s3": "benchmarks/s3_bench.py",
    "quota": "benchmarks/quota_bench.py",
    "byte-cache": "benchmarks/byte_cache_check.py",
    "lerobot-bytes": "benchmarks/lerobot_shuffled_bytes.py",
    "scale": "benchmarks/scale_bench.py",
    "shuffle-quality": "benchmarks/shuffle_quality.py",
}
DEFAULT_DOCS = ROOT / "docs" / "benchmarks.md"
DEFAULT_IMG_DIR = ROOT / "docs" / "img"
QUICK_OUT = HERE / ".data" / "report-quick"

# The first of these that a workload's summary holds is its chart's metric:
# key -> (axis label, higher is better).
METRICS: dict[str, tuple[str, bool]] = {
    "rows_per_s": ("rows/s", True),
    "samples_per_s": ("samples/s", True),
    "items_per_s": ("items/s", True),
    "epoch_seconds": ("seconds for one epoch", False),
    "time_to_first_batch": ("seconds to the first batch", False),
    "seconds": ("seconds", False),
}
ROLES = ("project", "peer", "limit")  # bar order and colour in the charts


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Bar:
    """One contender's median (and min-max over the rounds, when known)."""

    contender: str
    role: str  # "project" (aiostream*), "peer", or "limit" (local disk / physical limit)
    median: float
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class Panel:
    """One workload's contenders side by side on one metric."""

    workload: str
    metric: str
    title: str
    unit: str
    higher_is_better: bool
    bars: tuple[Bar, ...]


@dataclass(frozen=True)
class RatioPoint:
    """One ratio of the JSON: median, min-max over the rounds, target and verdict."""

    label: str
    median: float
    low: float
    high: float
    target: float
    direction: str | None  # ">=", "<=", or None when the JSON does not tell
    met: bool


@dataclass(frozen=True)
class ChartData:
    benchmark: str
    panels: tuple[Panel, ...]
    ratios: tuple[RatioPoint, ...]


def load_results(results_dir: Path, suffix: str = "") -> dict[str, dict[str, Any]]:
    """``{name: results}`` for each benchmark whose ``<name><suffix>.json`` exists."""
    out = {}
    for name in SCRIPTS:
        path = results_dir / f"{name}{suffix}.json"
        if path.exists():
            out[name] = json.loads(path.read_text())
    return out


def ratio_label(r: Mapping[str, Any]) -> str:
    """The ratio's name as the table and the chart show it."""
    workload = r.get("workload")
    if "ratio" in r:
        return f"{workload}: {r['ratio']}" if workload else str(r["ratio"])
    return f"{workload or ''}: {r['numerator']} / {r['denominator']}"


def ratio_target(r: Mapping[str, Any]) -> tuple[str | None, float]:
    """(direction, value) of a ratio's target.

    A string target carries its direction (``"<= 1.2"``). A bare number does
    not; the direction is the one that agrees with the recorded verdict
    (``met``), and when the median sits on the target either way would, so a
    ratio against a physical limit is read as ``<=`` and any other as ``>=``.
    """
    target = r["target"]
    if isinstance(target, str):
        m = re.fullmatch(r"\s*(<=|>=|<|>)?\s*([-+0-9.eE]+)\s*", target)
        if m is None:
            raise ValueError(f"cannot read the target {target!r} of {ratio_label(r)!r}")
        return m.group(1), float(m.group(2))
    value = float(target)
    median, met = float(r["median"]), bool(r["met"])
    if median > value:
        return (">=" if met else "<="), value
    if median < value:
        return ("<=" if met else ">="), value
    return ("<=" if "limit" in str(r.get("denominator", "")) else ">="), value


def _role(contender: str, limits: Iterable[str] = ()) -> str:
    """A contender's role: a limit when its workload lists it in ``limits`` (what a
    benchmark records), else by its name."""
    if contender.startswith("aiostream"):
        return "project"
    if contender in limits or "local" in contender or "limit" in contender:
        return "limit"
    return "peer"


def _stat(summary: Mapping[str, Any], key: str) -> tuple[float, float | None, float | None]:
    """(median, min, max) of ``key`` from ``{key: {median, min, max}}`` or ``key_median`` ..."""
    value = summary.get(key)
    if isinstance(value, Mapping):
        return float(value["median"]), value.get("min"), value.get("max")
    low, high = summary.get(f"{key}_min"), summary.get(f"{key}_max")
    return (
        float(summary[f"{key}_median"]),
        None if low is None else float(low),
        None if high is None else float(high),
    )


def _has(summary: Mapping[str, Any], key: str) -> bool:
    return isinstance(summary.get(key), Mapping) or f"{key}_median" in summary


def _workload_title(name: str, data: Mapping[str, Any], workload: str) -> str:
    w = data.get("workloads", {}).get(workload, {})
    cap = w.get("bandwidth_per_connection_mb_s")
    if cap is None:
        faults = data.get("parameters", {}).get("workloads", {}).get(workload, {}).get("faults", {})
        per_conn = faults.get("bandwidth_per_connection") if isinstance(faults, Mapping) else None
        cap = None if per_conn is None else per_conn / 1e6
    if cap is not None and f"{cap:g}MBps" not in workload:
        return f"{workload} ({cap:g} MB/s per connection)"
    return workload


def _metric_panel(name: str, data: Mapping[str, Any], workload: str, w: Mapping[str, Any]) -> Panel:
    summary = w["summary"]
    metric = next(
        (k for k in METRICS if all(_has(s, k) for s in summary.values())),
        None,
    )
    if metric is None:
        raise ValueError(f"{name}: no known metric in the summary of {workload!r}")
    unit, higher = METRICS[metric]
    if metric == "seconds" and "frames_per_round" in data.get("parameters", {}):
        unit = f"seconds for {data['parameters']['frames_per_round']} random frames"
    limits = w.get("limits", ())
    bars = [Bar(c, _role(c, limits), *_stat(s, metric)) for c, s in summary.items()]
    bars.sort(key=lambda b: ROLES.index(b.role))
    title = f"{_workload_title(name, data, workload)}: {unit}"
    return Panel(workload, metric, title, unit, higher, tuple(bars))


def _request_panels(data: Mapping[str, Any]) -> list[Panel]:
    """Startup: requests before the first batch, beside the physical limit."""
    limit = data.get("physical_limit")
    first = data.get("modes", {}).get("first")
    if not isinstance(limit, Mapping) or first is None:
        return []
    specs = [
        ("api_at_first_batch", "API requests before the first batch", limit["api_requests"]),
        (
            "api_resolver_at_first_batch",
            "API + resolver requests before the first batch",
            limit["api_requests"] + limit.get("resolver_requests_before_data", 0),
        ),
    ]
    panels = []
    for key, unit, bound in specs:
        bars = []
        for contender in first["summary"]:
            values = [r[contender][key] for r in first["rounds"] if key in r.get(contender, {})]
            if values:
                bars.append(
                    Bar(
                        contender,
                        _role(contender),
                        statistics.median(values),
                        min(values),
                        max(values),
                    )
                )
        if bars:
            bars.sort(key=lambda b: ROLES.index(b.role))
            bars.append(Bar("physical limit", "limit", float(bound)))
            panels.append(Panel("first", key, f"first: {unit}", unit, False, tuple(bars)))
    return panels


def chart_data(name: str, data: Mapping[str, Any]) -> ChartData:
    """What the charts of one benchmark show, straight from its JSON (no matplotlib)."""
    groups = data.get("workloads") or data.get("modes") or {}
    panels = [
        _metric_panel(name, data, workload, w)
        for workload, w in groups.items()
        if isinstance(w, Mapping) and w.get("summary")
    ]
    panels += _request_panels(data)
    ratios = []
    for r in data.get("ratios", []):
        direction, target = ratio_target(r)
        ratios.append(
            RatioPoint(
                ratio_label(r),
                float(r["median"]),
                float(r["min"]),
                float(r["max"]),
                target,
                direction,
                bool(r["met"]),
            )
        )
    return ChartData(name, tuple(panels), tuple(ratios))


# ----------------------------------------------------------------------- markdown


def _target_cell(r: Mapping[str, Any]) -> str:
    if isinstance(r["target"], str):
        return r["target"]
    direction, value = ratio_target(r)
    return f"{direction} {value:g}" if direction else f"{value:g}"


def _mib(value: float) -> str:
    return f"{value / 2**20:.0f} MiB" if value >= 10 * 2**20 else f"{value / 2**20:.1f} MiB"


def _jobs_table(data: Mapping[str, Any]) -> list[str]:
    """scale: one row per job run (its layout above the table): consumers, 429s, rows,
    requests by bucket from the server, memory per process and per consumer."""
    jobs = data.get("jobs")
    if not isinstance(jobs, Mapping) or not jobs:
        return []
    p = data.get("parameters", {})
    lines = [
        f"Layout: {p.get('layout', '?')}. A consumer: {p.get('consumer', '?')}. "
        f"Quotas: {p.get('rate_limits', {}).get('per', '?')}. Memory: {p.get('memory', '?')}. "
        f"Wall time: {p.get('wall_seconds', '?')}.",
        "",
        "| job | consumers | 429s | rows once (dup, missing) | idle consumers | api | "
        "resolvers | cdn | served / dataset bytes | peak RSS per process (min-max) | "
        "per consumer: peak / W, growth / W | job's RSS sum at peak | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, r in jobs.items():
        m, b = r["memory"], r["requests_by_bucket"]
        rss = m["process_peak_rss"]
        lines.append(
            f"| {mode} | {r['consumers']} | {r['http_429']} | "
            f"{'yes' if r['every_row_once'] else 'NO'} ({r['duplicate_rows']}, "
            f"{r['missing_rows']}) | {r['idle_consumers']} | {b['api']} | {b['resolvers']} | "
            f"{b['cdn']} | {r['bytes_served_over_dataset']:.1f}x | "
            f"{_mib(rss['median'])} ({_mib(rss['min'])}-{_mib(rss['max'])}) | "
            f"{_mib(m['per_consumer_peak_rss_share'])}, "
            f"{_mib(m['per_consumer_growth']['median'])} | "
            f"{m['job_peak_rss_sum'] / 2**30:.2f} GiB | {r['wall_seconds']:.0f} |"
        )
    lines.append("")
    probe = data.get("dataloader_probe")
    if isinstance(probe, Mapping):
        peak = probe["tree_peak"]
        lines += [
            f"Beside it, a real DataLoader: {probe['what']}. {probe['workers']} workers: "
            f"{_mib(probe['per_worker_pss'])} PSS per worker (the tree's PSS peaked at "
            f"{_mib(peak['pss'])}, its summed RSS at {_mib(peak['rss'])}); rows each once: "
            f"{'yes' if probe['every_row_once'] else 'NO'}, 429s: {probe['http_429']}.",
            "",
        ]
    return lines


def render_markdown(
    results: Mapping[str, Mapping[str, Any]],
    charts: Mapping[str, Sequence[str]] | None = None,
    *,
    reproduce_flags: str = "",
) -> str:
    """docs/benchmarks.md: per benchmark its date and machine, table, and chart links.

    ``charts`` maps a benchmark to image paths relative to the markdown file.
    """
    lines = [
        "# Benchmarks",
        "",
        "Ratios measured side by side in one run on the same data, against the local Hub",
        "server in its own process with 20 ms latency per request (and, where stated, a",
        "bandwidth cap). Median of the rounds after a warm-up, with the min-max of the",
        "per-round ratios. Machines here are shared 2-core VMs: read the spreads.",
        "",
        "Run them all, one after the other, and redraw this page: `benchmarks/run_all`",
        "(see `benchmarks/README.md`). Each chart is drawn from the JSON in",
        "`benchmarks/results/`: this project's contenders (blue) beside each peer (grey)",
        "and the local-disk or physical limit (orange), median with the min-max over the",
        "rounds; then each ratio's median and min-max on a log scale, with its target.",
        "",
    ]
    flags = f" {reproduce_flags}" if reproduce_flags else ""
    for name, data in results.items():
        env = data.get("environment", {})
        lines += [
            f"## {name}",
            "",
            f"Measured {env.get('date', '?')} on {env.get('platform', '?')}, "
            f"{env.get('cpu_count', '?')} CPUs. "
            f"Reproduce: `.venv/bin/python {SCRIPTS[name]}{flags}`.",
            "",
            "| ratio | target | median | min-max | met |",
            "|---|---|---|---|---|",
        ]
        for r in data.get("ratios", []):
            lines.append(
                f"| {ratio_label(r)} | {_target_cell(r)} | {r['median']:.2f} | "
                f"{r['min']:.2f}-{r['max']:.2f} | {'yes' if r['met'] else 'NO'} |"
            )
        rss = data.get("rss")
        for r in rss if isinstance(rss, list) else []:
            lines.append(
                f"| peak RSS {r.get('workload', '')} {r.get('contender', '')} | "
                f"<= {r['limit'] / 2**20:.0f} MiB | {r['peak_rss'] / 2**20:.0f} MiB | | "
                f"{'yes' if r['met'] else 'NO'} |"
            )
        lines.append("")
        lines += _jobs_table(data)
        lines += quality_table(data)
        missed = shortfalls.explain(name, data)
        if missed:
            lines += ["Missed, and why (every figure from the same run):", "", *missed, ""]
        for image in (charts or {}).get(name, ()):
            stem = Path(image).stem
            what = "ratios against their targets" if stem.endswith("-ratios") else "per contender"
            lines += [f"![{name}: {what}]({image})", ""]
    return "\n".join(lines)


def _span(summary: Mapping[str, Any], key: str, scale: float = 1.0, fmt: str = ".3f") -> str:
    """``median (min-max)`` of one figure over the seeds, or an empty cell."""
    value = summary.get(key)
    if not isinstance(value, Mapping) or not value:
        return ""
    med, low, high = (value[k] / scale + 0.0 for k in ("median", "min", "max"))
    text = [f"{v:{fmt}}".replace("-0", "0") if f"{v:{fmt}}" in ("-0", "-0.000") else f"{v:{fmt}}"
            for v in (med, low, high)]  # fmt: skip
    if text[1] == text[2]:
        return text[0]
    between = " to " if low < 0 else "-"
    return f"{text[0]} ({text[1]}{between}{text[2]})"


def quality_table(data: Mapping[str, Any]) -> list[str]:
    """A shuffle-quality run's table (its ``quality`` rows), under its ratios; none for
    the other benchmarks."""
    rows = data.get("quality")
    if not isinstance(rows, list) or not rows:
        return []
    params = data.get("parameters", {})
    lines = [
        "### Shuffle quality per contender",
        "",
        f"Parquet: {params.get('parquet_rows', '?')} rows in {params.get('files', '?')} files "
        f"of row groups of {params.get('group', '?')} rows; TAR: {params.get('tar_samples', '?')} "
        f"samples in {params.get('shards', '?')} shards. Median (min-max) over seeds "
        f"{params.get('seeds', '?')}. Same unit: adjacent pairs from one row group (Parquet) "
        "or shard (TAR); same file: from one Parquet file; |rho|: Spearman rank correlation "
        "of output against original position; displacement: mean |output - original| / n. "
        "Memory: peak RSS of the contender's process over the same reader's median peak "
        "without shuffling (aiostream: with the same elastic; the peers: a buffer of 1), in "
        "MiB, one peak per seed: read the spread as its noise. Buffer payload: computed, "
        "min(buffer, samples) x a sample's mean bytes.",
        "",
        "| data | contender | buffer | same unit | same file | abs rho | displacement | "
        "memory over unshuffled | buffer payload (computed) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        summary = row.get("summary", {})
        buffer = "" if row.get("buffer") is None else str(row["buffer"])
        held = row.get("buffer_payload_bytes")
        payload = "" if held is None else f"{held / 2**20:.1f} MiB"
        lines.append(
            f"| {row['format']} ({row['unit']}) | {row['contender']} | {buffer} | "
            f"{_span(summary, 'same_unit')} | {_span(summary, 'same_file')} | "
            f"{_span(summary, 'abs_rho')} | {_span(summary, 'displacement')} | "
            f"{_span(summary, 'rss_over_unshuffled', 2**20, '.0f')} | {payload} |"
        )
    return [*lines, ""]


# ------------------------------------------------------------------------- charts

COLORS = {"project": "#2166ac", "peer": "#969696", "limit": "#e08214"}
MET_COLOR, MISSED_COLOR = "#1a9850", "#d73027"


def chart_paths(name: str, img_dir: Path) -> list[Path]:
    """The PNGs drawn for one benchmark: throughput per contender, then the ratios."""
    return [img_dir / f"bench-{name}.png", img_dir / f"bench-{name}-ratios.png"]


def _fmt(value: float) -> str:
    """3 significant digits, thousands as k: 59.4k, 5.88k, 147, 0.477, 3."""
    if value >= 1000:
        return f"{value / 1000:.3g}k"
    return f"{value:.3g}"


def _save(fig: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # No "Software" (matplotlib version) chunk: the same JSON gives the same bytes.
    fig.savefig(path, dpi=100, metadata={"Software": None})


def _draw_panels(cd: ChartData, path: Path) -> None:
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    heights = [len(p.bars) * 0.42 + 0.9 for p in cd.panels]
    fig = Figure(figsize=(9, sum(heights) + 0.9), layout="constrained")
    axes = fig.subplots(len(cd.panels), 1, squeeze=False, height_ratios=heights)[:, 0]
    for ax, panel in zip(axes, cd.panels, strict=True):
        y = list(range(len(panel.bars)))
        medians = [b.median for b in panel.bars]
        ax.barh(
            y,
            medians,
            height=0.65,
            color=[COLORS[b.role] for b in panel.bars],
            zorder=2,
        )
        right = max(b.high if b.high is not None else b.median for b in panel.bars)
        for yi, b in zip(y, panel.bars, strict=True):
            if b.low is not None and b.high is not None and b.high > b.low:
                ax.errorbar(
                    b.median,
                    yi,
                    xerr=[[b.median - b.low], [b.high - b.median]],
                    fmt="none",
                    ecolor="black",
                    elinewidth=1,
                    capsize=3,
                    zorder=3,
                )
            end = b.high if b.high is not None else b.median
            ax.text(end + right * 0.015, yi, _fmt(b.median), va="center", fontsize=9)
        ax.set_yticks(y, [b.contender for b in panel.bars], fontsize=9)
        ax.invert_yaxis()
        ax.set_xlim(0, right * 1.15)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _fmt(x) if x else "0"))
        ax.tick_params(axis="x", labelsize=8)
        better = "higher" if panel.higher_is_better else "lower"
        ax.set_title(f"{panel.title} ({better} is better)", fontsize=10, loc="left")
        ax.grid(axis="x", color="#dddddd", zorder=0)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    roles = sorted({b.role for p in cd.panels for b in p.bars}, key=ROLES.index)
    names = {"project": "aiostream-hf", "peer": "peer", "limit": "local disk / physical limit"}
    fig.legend(
        handles=[Patch(color=COLORS[r], label=names[r]) for r in roles],
        loc="outside lower center",
        ncols=len(roles),
        fontsize=9,
        frameon=False,
    )
    fig.suptitle(
        f"{cd.benchmark}: median per contender, bars span the min-max over the rounds",
        fontsize=11,
        x=0.01,
        ha="left",
    )
    _save(fig, path)


def _draw_ratios(cd: ChartData, path: Path) -> None:
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullLocator

    labels = [textwrap.fill(r.label, 44, break_on_hyphens=False) for r in cd.ratios]
    rows = [max(0.5, 0.32 * label.count("\n") + 0.42) for label in labels]
    fig = Figure(figsize=(9, sum(rows) + 1.4), layout="constrained")
    ax = fig.subplots()
    y = list(range(len(cd.ratios)))
    # Counts whose target is 0 (429s, errors) cannot sit on a log scale: their zeros are
    # drawn at its left edge, the value written beside them as for every ratio.
    values = [v for r in cd.ratios for v in (r.low, r.high, r.target) if v > 0]
    lo, hi = min(values + [1.0]) / 1.6, max(values + [1.0]) * 1.6
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.axvline(1.0, color="#bbbbbb", linewidth=1, zorder=1)
    for yi, r in zip(y, cd.ratios, strict=True):
        color = MET_COLOR if r.met else MISSED_COLOR
        low, high, median, target = (max(v, lo) for v in (r.low, r.high, r.median, r.target))
        ax.plot([low, high], [yi, yi], color=color, linewidth=2, alpha=0.45, zorder=2)
        ax.plot([median], [yi], "o", color=color, markersize=8, zorder=4, clip_on=False)
        ax.plot([target] * 2, [yi - 0.35, yi + 0.35], color="black", linewidth=2, zorder=3)
        arrow = {">=": "\u2265 ", "<=": "\u2264 "}.get(r.direction or "", "")
        verdict = "met" if r.met else "MISSED"
        ax.annotate(
            f"{r.median:.2f}  (target {arrow}{r.target:g}, {verdict})",
            (1.0, yi),
            xycoords=("axes fraction", "data"),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=9,
            color=color,
            annotation_clip=False,
        )
    ax.set_yticks(y, labels, fontsize=8.5)
    ax.set_ylim(len(y) - 0.5, -0.5)
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if lo <= t <= hi]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{t:g}" for t in ticks], fontsize=8)
    ax.set_xlabel("ratio (log scale; grey line: parity)", fontsize=9)
    ax.grid(axis="x", color="#eeeeee", zorder=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.legend(
        handles=[
            Line2D([], [], marker="o", color=MET_COLOR, linestyle="", label="median, target met"),
            Line2D([], [], marker="o", color=MISSED_COLOR, linestyle="", label="median, missed"),
            Line2D([], [], color="#888888", linewidth=2, alpha=0.6, label="min-max over rounds"),
            Line2D([], [], color="black", linewidth=2, label="target"),
        ],
        loc="outside lower center",
        ncols=4,
        fontsize=8.5,
        frameon=False,
    )
    ax.set_title(f"{cd.benchmark}: ratios against their targets", fontsize=11, loc="left")
    _save(fig, path)


def draw_charts(cd: ChartData, img_dir: Path) -> list[Path]:
    """Draw the PNGs of ``chart_paths()`` (those with something to show); needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    panels_png, ratios_png = chart_paths(cd.benchmark, img_dir)
    drawn = []
    with matplotlib.rc_context(matplotlib.rcParamsDefault):
        if cd.panels:
            _draw_panels(cd, panels_png)
            drawn.append(panels_png)
        if cd.ratios:
            _draw_ratios(cd, ratios_png)
            drawn.append(ratios_png)
    return drawn


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"read the *-quick.json results; write under {QUICK_OUT.relative_to(ROOT)}/",
    )
    p.add_argument("--results-dir", type=Path, default=HERE / "results")
    p.add_argument("--docs", type=Path, default=None, help=f"markdown to write ({DEFAULT_DOCS})")
    p.add_argument("--img-dir", type=Path, default=None, help=f"PNG folder ({DEFAULT_IMG_DIR})")
    p.add_argument("--no-charts", action="store_true", help="tables only (no matplotlib needed)")
    args = p.parse_args(argv)

    suffix = "-quick" if args.quick else ""
    docs = args.docs or (QUICK_OUT / "benchmarks.md" if args.quick else DEFAULT_DOCS)
    img_dir = args.img_dir or (QUICK_OUT / "img" if args.quick else DEFAULT_IMG_DIR)
    results = load_results(args.results_dir, suffix)
    if not results:
        print(f"no {'*-quick' if args.quick else '*'}.json results in {args.results_dir}")
        return 1

    charts: dict[str, list[str]] = {}
    if not args.no_charts:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(
                "report.py: the charts need matplotlib: pip install -e '.[bench]' "
                "(or pass --no-charts for the tables only)",
                file=sys.stderr,
            )
            return 1
        for name, data in results.items():
            drawn = draw_charts(chart_data(name, data), img_dir)
            charts[name] = [Path(os.path.relpath(d, docs.parent)).as_posix() for d in drawn]
            for d in drawn:
                print(f"wrote {d}")

    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(
        render_markdown(results, charts, reproduce_flags="--quick" if args.quick else "")
    )
    print(f"wrote {docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
