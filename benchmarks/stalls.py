"""Does ``statistics().stalls`` name the right bottleneck? Runs whose bottleneck is known.

    .venv/bin/python benchmarks/stalls.py [--rounds 3] [--out results/checks/stalls.json]
        [--chart ../docs/img/stalls.png]

One Parquet dataset (text rows) on a local Hub server in its own process, read to the
end four ways, each with one bottleneck made on purpose:

- network: the server sends at most 4 MB/s in all (``Faults.bandwidth_total``);
- decode: a decoder that spends 50 ms of CPU per row group beyond Parquet's own work
  (a ParquetDecoder whose ``decode`` also burns CPU), the server unthrottled;
- consumer: the loop body sleeps 1 ms per 10 rows (a model step), nothing else slow;
- none: nothing slowed (reported, not judged: its bottleneck is whatever is slowest).

Each run records the ``Stalls`` the stream reports and the bottleneck named, beside the
one made. Then a DataLoader (2 workers, batches of 32 rows: 250 steps) over the same
dataset is timed with ``aiostream_hf.torch.TimedLoader``, once under the network cap
and once with a 20 ms model step: the share of the steps spent waiting for data, over
the run (the workers' start included) and over its last 100 steps. Rounds alternate the
runs. The chart (``--chart``) shows the consumer's time of each run by part.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _harness  # noqa: E402

import aiostream_hf as ash  # noqa: E402
from aiostream_hf.formats.parquet import ParquetDecoder  # noqa: E402
from aiostream_hf.testing import Faults, HubServer, make_repo, make_text_parquet  # noqa: E402

REPO = "bench/stalls"
FILES = 4
ROWS = 2_000  # per file: ~22 MB in all
GROUP = 250
NETWORK_CAP = 4e6  # bytes/s
DECODE_BURN_S = 0.05  # per row group
CONSUMER_SLEEP_S = 0.001  # per 10 rows
STEP_S = 0.02  # the model step of the DataLoader run
RUNS = ("network", "decode", "consumer", "none")


class _SlowDecoder(ParquetDecoder):
    """Parquet, plus ``DECODE_BURN_S`` of CPU per row group: a decoder known to be slow."""

    def decode(self, unit: Any, fetched: Any, request: Any) -> Any:
        table = super().decode(unit, fetched, request)
        until = time.thread_time() + DECODE_BURN_S
        while time.thread_time() < until:
            pass
        return table


def _dataset(root: Path) -> None:
    folder = make_repo(root, REPO, {})
    for i in range(FILES):
        make_text_parquet(
            folder / "data" / f"train-{i:05d}.parquet",
            rows=ROWS,
            row_group_size=GROUP,
            seed=i,
            start_id=i * ROWS,
        )


def _stream_run(run: str, endpoint: str, capped: str) -> dict[str, Any]:
    options = ash.StreamOptions(prefetch_count=4)
    kwargs: dict[str, Any] = {"split": "train", "options": options}
    if run == "decode":
        kwargs["format"] = _SlowDecoder()
    s = ash.stream(
        f"hf://datasets/{REPO}", endpoint=capped if run == "network" else endpoint, **kwargs
    )
    rows = 0
    started = time.perf_counter()
    with s:
        for _ in s:
            rows += 1
            if run == "consumer" and rows % 10 == 0:
                time.sleep(CONSUMER_SLEEP_S)
    seconds = time.perf_counter() - started
    st = s.statistics().stalls
    return {
        "run": run,
        "rows": rows,
        "seconds": seconds,
        "stalls": {**asdict(st), "input_bound": st.input_bound},
        "named": st.bottleneck,
        "made": None if run == "none" else run,
    }


def _torch_run(run: str, endpoint: str, capped: str) -> dict[str, Any]:
    import torch.utils.data

    from aiostream_hf.torch import StreamDataset, TimedLoader

    source = f"hf://datasets/{REPO}"
    ds = StreamDataset(source, split="train", endpoint=capped if run == "network" else endpoint)
    loader = TimedLoader(
        torch.utils.data.DataLoader(ds, batch_size=32, num_workers=2, prefetch_factor=2)
    )
    rows = 0
    for batch in loader:
        rows += len(batch["id"])
        if run == "consumer":
            time.sleep(STEP_S)
    st = loader.statistics()
    return {"run": f"torch-{run}", "rows": rows, **asdict(st)}


def _share(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


BEGIN, END = "<!-- stalls.py: begin -->", "<!-- stalls.py: end -->"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def table(record: dict[str, Any]) -> str:
    """The markdown table of a recorded run (``docs/where-time-goes.md`` holds it)."""
    summary = record["summary"]
    lines = [
        "| bottleneck made | named (each round) | waited for data, median (min-max) "
        "| network | decode | engine | own | rows/s, median |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in RUNS:
        r = summary[run]
        ib, parts = r["input_bound"], r["parts"]
        lines.append(
            f"| {r['made'] or 'none (nothing slowed)'} | {', '.join(r['named_every_round'])} "
            f"| {_pct(ib['median'])} ({_pct(ib['min'])}-{_pct(ib['max'])}) "
            f"| {_pct(parts['waited_network'])} | {_pct(parts['waited_decode'])} "
            f"| {_pct(parts['waited_engine'])} | {_pct(parts['own'])} "
            f"| {r['rows_per_s']['median']:,.0f} |"
        )
    torch_rows = [k for k in ("torch-network", "torch-consumer") if k in summary]
    if torch_rows:
        lines += [
            "",
            "| DataLoader, 2 workers | wait share of the steps, median (min-max) "
            "| last 100 steps, median (min-max) |",
            "|---|---|---|",
        ]
        for key in torch_rows:
            w, recent = summary[key]["wait_share"], summary[key]["recent_wait_share"]
            what = "network cap" if key == "torch-network" else "20 ms model step"
            lines.append(
                f"| {what} | {_pct(w['median'])} ({_pct(w['min'])}-{_pct(w['max'])}) "
                f"| {_pct(recent['median'])} ({_pct(recent['min'])}-{_pct(recent['max'])}) |"
            )
    env = record["environment"]
    lines += [
        "",
        f"Recorded {env['date'][:16].replace('T', ' ')} UTC on {env['platform']}, "
        f"{env['cpu_count']} CPUs, {record['setup']['rounds']} rounds "
        "(benchmarks/results/checks/stalls.json).",
    ]
    return "\n".join(lines)


def write_docs(record: dict[str, Any], docs: Path) -> None:
    """Put ``table(record)`` between the markers of ``docs``."""
    text = docs.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    docs.write_text(text[:start] + "\n" + table(record) + "\n" + text[end:])


def _chart(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [
        ("own", "the consumer's own time", "#4c72b0"),
        ("waited_network", "waiting: network", "#dd8452"),
        ("waited_decode", "waiting: decode", "#c44e52"),
        ("waited_engine", "waiting: engine", "#8c8c8c"),
    ]
    runs = list(RUNS)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    left = [0.0] * len(runs)
    for key, label, color in parts:
        widths = [100 * summary[r]["parts"][key] for r in runs]
        ax.barh(runs, widths, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, r in enumerate(runs):
        ax.text(101, i, f"named: {summary[r]['named']}", va="center", fontsize=9)
    ax.set_xlim(0, 130)
    ax.set_xlabel("% of the stream's wall time (median of rounds)")
    ax.invert_yaxis()
    ax.set_title("Where a stream's time went, by the bottleneck made (benchmarks/stalls.py)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=HERE / "results" / "checks" / "stalls.json")
    p.add_argument("--chart", type=Path, default=HERE.parent / "docs" / "img" / "stalls.png")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument(
        "--docs",
        type=Path,
        default=HERE.parent / "docs" / "where-time-goes.md",
        help="the page whose table is rewritten (between its markers)",
    )
    args = p.parse_args(argv)

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "hub"
        _dataset(root)
        with (
            HubServer(root, subprocess=True) as hub,
            HubServer(root, subprocess=True, faults=Faults(bandwidth_total=NETWORK_CAP)) as capped,
        ):
            for r in range(args.rounds):
                order = list(RUNS) if r % 2 == 0 else list(reversed(RUNS))
                for run in order:
                    got = _stream_run(run, hub.endpoint, capped.endpoint)
                    got["round"] = r
                    results.append(got)
                    print(
                        f"round {r} {run:9s} {got['rows']:,} rows {got['seconds']:.2f} s "
                        f"waited {100 * got['stalls']['input_bound']:.0f}% named {got['named']}",
                        flush=True,
                    )
                if not args.no_torch:
                    for run in ("network", "consumer"):
                        got = _torch_run(run, hub.endpoint, capped.endpoint)
                        got["round"] = r
                        results.append(got)
                        print(
                            f"round {r} torch-{run} {got['rows']:,} rows, "
                            f"wait share {got['wait_share']:.2f}, "
                            f"last 100 steps {got['recent_wait_share']:.2f}",
                            flush=True,
                        )

    summary: dict[str, Any] = {}
    for run in RUNS:
        mine = [x for x in results if x["run"] == run]
        named = [x["named"] for x in mine]
        parts: dict[str, float] = {}
        for key in ("waited_network", "waited_decode", "waited_engine"):
            parts[key] = statistics.median(x["stalls"][key] / x["stalls"]["seconds"] for x in mine)
        parts["own"] = statistics.median(1 - x["stalls"]["input_bound"] for x in mine)
        summary[run] = {
            "made": None if run == "none" else run,
            "named": max(set(named), key=named.count),
            "named_every_round": named,
            "right_every_round": run == "none" or all(n == run for n in named),
            "input_bound": _share([x["stalls"]["input_bound"] for x in mine]),
            "rows_per_s": _share([x["rows"] / x["seconds"] for x in mine]),
            "parts": parts,
        }
    for run in ("network", "consumer"):
        mine = [x for x in results if x["run"] == f"torch-{run}"]
        if mine:
            summary[f"torch-{run}"] = {
                "wait_share": _share([x["wait_share"] for x in mine]),
                "recent_wait_share": _share([x["recent_wait_share"] for x in mine]),
            }
    record = {
        "environment": _harness.environment(["aiostream-hf", "pyarrow", "torch"]),
        "setup": {
            "files": FILES,
            "rows_per_file": ROWS,
            "row_group_size": GROUP,
            "network_cap_bytes_per_s": NETWORK_CAP,
            "decode_burn_s_per_row_group": DECODE_BURN_S,
            "consumer_sleep_s_per_10_rows": CONSUMER_SLEEP_S,
            "torch_step_s": STEP_S,
            "rounds": args.rounds,
        },
        "summary": summary,
        "runs": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    _chart(summary, args.chart)
    print(f"wrote {args.chart}")
    write_docs(record, args.docs)
    print(f"wrote {args.docs}")
    wrong = [r for r in RUNS if not summary[r]["right_every_round"]]
    if wrong:
        print(f"named wrong in some round: {', '.join(wrong)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
