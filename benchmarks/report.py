"""Write docs/benchmarks.md from the committed benchmarks/results/*.json.

    .venv/bin/python benchmarks/report.py

Every figure is a ratio measured side by side in one run (see each JSON for
the rounds, the environment and the parameters).
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
SCRIPTS = {
    "parquet": "benchmarks/parquet_bench.py",
    "webdataset": "benchmarks/webdataset_bench.py",
    "video": "benchmarks/video_bench.py",
    "startup": "benchmarks/startup_bench.py",
}


def _name(r: dict) -> str:
    if "ratio" in r:
        return str(r["ratio"])
    return f"{r.get('workload', '')}: {r['numerator']} / {r['denominator']}"


def main() -> None:
    lines = [
        "# Benchmarks",
        "",
        "Ratios measured side by side in one run on the same data, against the local Hub",
        "server in its own process with 20 ms latency per request (and, where stated, a",
        "bandwidth cap). Median of the rounds after a warm-up, with the min-max of the",
        "per-round ratios. Machines here are shared 2-core VMs: read the spreads.",
        "",
    ]
    for name, script in SCRIPTS.items():
        path = HERE / "results" / f"{name}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        env = data["environment"]
        lines += [
            f"## {name}",
            "",
            f"Measured {env.get('date', '?')} on {env.get('platform', '?')}, "
            f"{env.get('cpu_count', '?')} CPUs. Reproduce: `.venv/bin/python {script}`.",
            "",
            "| ratio | target | median | min-max | met |",
            "|---|---|---|---|---|",
        ]
        for r in data.get("ratios", []):
            workload = r.get("workload")
            label = _name(r) if "ratio" not in r or not workload else f"{workload}: {r['ratio']}"
            lines.append(
                f"| {label} | {r['target']} | {r['median']:.2f} | "
                f"{r['min']:.2f}-{r['max']:.2f} | {'yes' if r['met'] else 'NO'} |"
            )
        for r in data.get("rss", []) if isinstance(data.get("rss"), list) else []:
            lines.append(
                f"| peak RSS {r.get('workload', '')} {r.get('contender', '')} | "
                f"<= {r['limit'] / 2**20:.0f} MiB | {r['peak_rss'] / 2**20:.0f} MiB | | "
                f"{'yes' if r['met'] else 'NO'} |"
            )
        lines.append("")
    lines += [
        "Charts from these JSON files are not drawn yet; the tables are the record.",
        "",
    ]
    (HERE.parent / "docs" / "benchmarks.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
