"""Why a ratio missed its target, in figures read from the same results.

``report.py`` writes these under each benchmark's table in docs/benchmarks.md. An
explainer reads only the JSON it is given: every figure it states comes from the run
that measured the ratio, never typed in. A missed ratio that no explainer knows is
listed as not explained.

    lines = explain("video", json.loads(Path("benchmarks/results/video.json").read_text()))
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["explain"]

Results = Mapping[str, Any]
Ratio = Mapping[str, Any]
# (the benchmark's results, the missed ratio) -> the sentences that say why
Explainer = Callable[[Results, Ratio], str]

NOT_EXPLAINED = "not explained yet: the figures above are all this page knows."


def explain(name: str, data: Results) -> list[str]:
    """Markdown lines, one per missed ratio of benchmark ``name`` (none when all are met)."""
    lines: list[str] = []
    for r in data.get("ratios", []):
        if r.get("met", True):
            continue
        explainer = _explainer(name, r)
        try:
            why = explainer(data, r) if explainer is not None else NOT_EXPLAINED
        except (KeyError, TypeError, ValueError, ZeroDivisionError, statistics.StatisticsError):
            why = "not explained: its run did not record the figures the explanation reads."
        lines.append(f"- **{_label(r)}** (median {r['median']:.2f}, target {_target(r)}): {why}")
    return lines


def _label(r: Ratio) -> str:
    workload = r.get("workload")
    return f"{workload}: {r['ratio']}" if workload else str(r["ratio"])


def _target(r: Ratio) -> str:
    target = r["target"]
    return target if isinstance(target, str) else f"{target:g}"


def _explainer(name: str, r: Ratio) -> Explainer | None:
    label = _label(r)
    for bench, workload, ratio, explainer in _EXPLAINERS:
        if bench == name and label.startswith(workload) and label.endswith(ratio):
            return explainer
    for bench, workload, numerator, explainer in _BY_NUMERATOR:
        if bench == name and label.startswith(workload) and r.get("numerator") == numerator:
            return explainer
    return None


# -- figures ------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _per_round(rounds: Sequence[Mapping[str, Any]], contender: str, key: str) -> list[float]:
    return [float(r[contender][key]) for r in rounds if contender in r]


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.0f} ms"


# -- parquet ------------------------------------------------------------------------------


def _parquet_arrow_vs_local(data: Results, r: Ratio) -> str:
    workload = data["workloads"][r["workload"]]
    rounds = workload["rounds"]
    ours = _label(r).split(": ", 1)[-1].split(" / ")[0]  # aiostream-arrow, or -local
    limits = [c for c in workload["limits"] if any(c in x for x in rounds)]
    # The fastest local read of each round is the ratio's denominator.
    fastest = _median([min(float(x[c]["seconds"]) for c in limits if c in x) for x in rounds])
    by_name = {c: _median(_per_round(rounds, c, "seconds")) for c in limits}
    local = min(by_name, key=by_name.__getitem__)
    seconds = _median(_per_round(rounds, ours, "seconds"))
    cpu = _median([x[ours]["cpu_user"] + x[ours]["cpu_system"] for x in rounds])
    local_cpu = _median([x[local]["cpu_user"] + x[local]["cpu_system"] for x in rounds])
    server = _median(_per_round(rounds, ours, "server_cpu_seconds"))
    cpus = data["environment"]["cpu_count"]
    pinned = data.get("parameters", {}).get("pinned")
    where = (
        f"Each on CPU {pinned['contenders']} alone (the server on CPU {pinned['server']})"
        if pinned
        else f"On the same {cpus} CPUs"
    )
    budget = fastest / float(r["target"])
    text = (
        f"{ours} read the {workload['bytes'] / 1e6:,.0f} MB in {seconds:.2f} s, the "
        f"fastest local read ({local}) in {by_name[local]:.2f} s (medians). {where}, "
        f"{cpu:.2f} CPU-seconds went in {ours}'s process against "
        f"{local_cpu:.2f} in {local}'s (imports included in both), and the Hub server "
        f"spent {server:.2f} serving the bytes."
    )
    if "raw-gets" in workload["contenders"]:
        raw = _median(_per_round(rounds, "raw-gets", "seconds"))
        text += (
            f" At {float(r['target']):g}x the read would have {budget:.2f} s; fetching the "
            f"same bytes from the same server with plain parallel GETs, decoding nothing "
            f"(raw-gets), took {raw:.2f} s of that."
        )
    return text


# -- video --------------------------------------------------------------------------------


def _video_workload(data: Results, r: Ratio) -> tuple[str, Mapping[str, Any]]:
    workloads = data["workloads"]
    name = max((w for w in workloads if _label(r).startswith(w)), key=len)
    return name, workloads[name]


def _frames_vs_local(data: Results, r: Ratio) -> str:
    name, workload = _video_workload(data, r)
    rounds = workload["rounds"]
    leads = [x["aiostream"]["seconds"] - x["pyav-local"]["seconds"] for x in rounds]
    local = _median(_per_round(rounds, "pyav-local", "seconds"))
    latency = float(data["parameters"]["latency_ms"]) / 1000
    ours = [x["aiostream"] for x in rounds if "aiostream" in x]
    resolves = _median([x["fetcher_statistics"]["requests"]["resolve"] for x in ours])
    index_reads = _median([x["video_statistics"]["index_requests"] for x in ours])
    index_bytes = _median([x["video_statistics"]["index_bytes"] for x in ours])
    parts = _median([x["fetcher_statistics"]["requests"]["range"] for x in ours])
    gops = _median([x["video_statistics"]["frame_requests"] for x in ours])
    frames = int(data["parameters"]["frames_per_round"])
    allowed = (_ratio_bound(r) - 1) * local
    return (
        f"aiostream's lead over the local read is {_ms(_median(leads))} (median; per round "
        f"{_ms(min(leads))} to {_ms(max(leads))}). Its requests go out in three round trips, "
        f"one after the other, before the first frame's bytes arrive: the resolve "
        f"({resolves:g} request), the index ({index_reads:g} read of "
        f"{index_bytes / 2**20:.1f} MiB, in {parts:g} parts at once), then the frames' "
        f"GOPs ({gops:g} reads at once; medians): "
        f"{_ms(3 * latency)} of latency before any transfer. The local read took "
        f"{_ms(local)} (median), so {_target(r)} leaves {_ms(allowed)} for all of that; "
        f"the ratio moves with how long the {frames} frames of a round take to decode."
    )


def _frames_cached_vs_local(data: Results, r: Ratio) -> str:
    """aiostream-cold / aiostream-warm against the local read plus n round trips."""
    name, workload = _video_workload(data, r)
    rounds = workload["rounds"]
    ours = str(r["numerator"])
    runs = [x[ours] for x in rounds if ours in x]
    leads = [x[ours]["seconds"] - x["pyav-local"]["seconds"] for x in rounds if ours in x]
    local = _median(_per_round(rounds, "pyav-local", "seconds"))
    latency = float(data["parameters"]["latency_ms"]) / 1000
    trips = _trips(r)
    allowed = _ratio_bound(r) * (local + trips * latency) - local
    req = {b: _median([float(x["requests"][b]) for x in runs]) for b in ("api", "resolvers", "cdn")}
    served = _median([float(x["bytes_served"]) for x in runs])
    plain = [x["aiostream"] for x in rounds if "aiostream" in x]
    plain_served = _median([float(x["bytes_served"]) for x in plain]) if plain else float("nan")
    cached = sum(bool(x["video_statistics"].get("index_cached")) for x in runs)
    frame_bytes = _median([float(x["video_statistics"]["frame_bytes"]) for x in runs])
    api = req["api"]
    serial = (
        f" Its API requests ({api:g}: the branch's pin"
        + (", then the listing" if api > 1 else "")
        + f") come one after the other before the file's first read: {api:g} round "
        + ("trips" if api != 1 else "trip")
        + " the target does not count."
        if api
        else ""
    )
    return (
        f"{ours}'s lead over the local read is {_ms(_median(leads))} (median; per round "
        f"{_ms(min(leads))} to {_ms(max(leads))}), where {_target(r)} of the local read "
        f"({_ms(local)}) plus {trips} round trip{'s' if trips != 1 else ''} of "
        f"{_ms(latency)} leaves {_ms(allowed)}. "
        f"At the server it sent {req['api']:g} API, {req['resolvers']:g} resolver and "
        f"{req['cdn']:g} CDN requests (medians), and took its index from the byte cache in "
        f"{cached} of {len(runs)} rounds; it was served {served / 1e6:.1f} MB "
        f"(its frames' reads {frame_bytes / 1e6:.1f} MB), where aiostream without the "
        f"byte cache was served {plain_served / 1e6:.1f} MB: the cache fetches whole blocks "
        f"(a video's are 256 KiB).{serial}"
    )


def _trips(r: Ratio) -> int:
    """The round trips a cached-frames ratio adds to the local read (its denominator
    names them: "pyav-local + 3 x 20 ms")."""
    plus = str(r["denominator"]).split("+", 1)[1]
    return int(plus.split("x", 1)[0])


def _download_vs_frames(data: Results, r: Ratio) -> str:
    name, workload = _video_workload(data, r)
    rounds = workload["rounds"]
    total = _median(_per_round(rounds, "download-decode", "seconds"))
    download = _median(_per_round(rounds, "download-decode", "download_seconds"))
    local = _median(_per_round(rounds, "pyav-local", "seconds"))
    bound = _ratio_bound(r)
    return (
        f"without a bandwidth cap the whole file ({workload['bytes'] / 1e6:,.0f} MB) downloads "
        f"over loopback in {download:.2f} s, {total:.2f} s with the decode (medians). "
        f"{bound:g}x would need aiostream within {_ms(total / bound)}, where decoding the "
        f"same frames from the local file alone took {_ms(local)}."
    )


def _ratio_bound(r: Ratio) -> float:
    target = r["target"]
    return float(target.split()[-1]) if isinstance(target, str) else float(target)


# -- quota --------------------------------------------------------------------------------


def _quota_epoch(data: Results, r: Ratio) -> str:
    rounds = data["modes"]["epoch"]["rounds"]
    limits = data["parameters"]["rate_limits"]
    quota, window = int(limits["resolvers"]), float(limits["window_s"])
    files = int(data["parameters"]["data"]["files"])
    ours, theirs = rounds[0]["aiostream"], rounds[0]["datasets"]
    resolves = int(ours["requests_at_exit"]["resolvers"])
    windows = math.ceil(resolves / quota)
    floor = (windows - 1) * window
    early = int(theirs["requests_at_construction"]["resolvers"])
    return (
        f"both read the {files:,} files with one resolver request each ({resolves:,} for "
        f"aiostream, {int(theirs['requests_at_exit']['resolvers']):,} for datasets, "
        f"{int(theirs['http_429'])} of them answered 429), at {quota:,} per {window:.0f} s "
        f"window: {windows} windows, so an epoch ends at least {floor:.0f} s after the "
        f"window's first resolver request. datasets sent {early} while it was constructed "
        f"(in its first {theirs['construct_seconds']:.0f} s), which opened its first window "
        f"then; aiostream sent {int(ours['requests_at_construction']['resolvers'])} before "
        f"its workers started, and its first batch came {ours['time_to_first_batch']:.0f} s "
        f"in. Beyond those {floor:.0f} s, the epochs took {ours['seconds'] - floor:.0f} s "
        f"(aiostream) and {theirs['seconds'] - floor:.0f} s (datasets)."
    )


# -- byte-cache ---------------------------------------------------------------------------


def _byte_cache(data: Results, r: Ratio) -> str:
    name = r["workload"].split()[0]  # "parquet epoch 2" -> parquet
    ours, theirs = r["ratio"].split(" / ")
    rounds = data["rounds"]
    a = _median([float(x[f"{name}-{ours}"]) for x in rounds])
    b = _median([float(x[f"{name}-{theirs}"]) for x in rounds])
    unit = {"parquet": "rows", "lerobot": "items"}.get(name, "samples")
    per_round = ", ".join(f"{v:.2f}" for v in r["per_round"])
    served = sum(int(x[f"{name}-bytes-served"]) for x in rounds)
    return (
        f"through the cache {a:,.0f} {unit}/s, {theirs} {b:,.0f} (medians of {len(rounds)} "
        f"rounds); the ratio per round: {per_round}. Each contender read its epochs in a "
        f"fresh process (one unmeasured, then the measured one), in orders rotated by "
        f"round. The cached epochs made "
        f"{sum(int(x[f'{name}-cdn-requests']) for x in rounds)} CDN requests and "
        f"{sum(int(x[f'{name}-misses']) for x in rounds)} misses; the server served "
        f"{served:,} bytes, its API answers."
    )


# -- lerobot-bytes ------------------------------------------------------------------------


def _lerobot_bytes(data: Results, r: Ratio) -> str:
    longer = data["longer"]
    kept = int(r["workload"].split(", ")[-1].split(" MiB")[0]) << 20
    run, default = longer[f"kept_{kept}"], longer[f"kept_{data['kept_video_bytes_default']}"]
    return (
        f"a shuffle buffer's random draws leave items of episodes long past, whose reads "
        f"(joined up to coalesce_gap) were dropped from the {kept >> 20} MiB kept before "
        f"those items came: {run['cdn_requests']} CDN requests fetched "
        f"{run['bytes_served']:,} bytes of {longer['files_bytes']:,}, and "
        f"{run['bytes_reused']:,} bytes were cut from what was kept. With the default "
        f"{data['kept_video_bytes_default'] >> 20} MiB (more than the whole video) "
        f"{default['cdn_requests']} requests fetched each byte once; with nothing kept "
        f"{longer['kept_0']['cdn_requests']} fetched {longer['kept_0']['ratio_to_files']:.2f}x."
    )


# (benchmark, the label's start (its workload), the label's end (its ratio), explainer)
# -- lerobot ------------------------------------------------------------------------------


def _lerobot_vs_peer(data: Results, r: Ratio) -> str:
    ours, peer = str(r["numerator"]), str(r["denominator"])
    order = _label(r).split(":", 1)[0].split()[-1]
    workload = data["workloads"][f"lerobot-vs-torchcodec-{order}"]
    rounds = workload["rounds"]
    items = int(workload["items"])

    def med(contender: str, key: str) -> float:
        return _median(_per_round(rounds, contender, key))

    def after_first(contender: str) -> float:
        return _median(
            [
                (float(x[contender]["items"]) - 1)
                / (float(x[contender]["seconds"]) - float(x[contender]["time_to_first_item"]))
                for x in rounds
                if contender in x
            ]
        )

    text = (
        f"over {items} items ({order}), {ours} ran at {med(ours, 'items_per_s'):.1f} items/s "
        f"and {peer} at {med(peer, 'items_per_s'):.1f} (medians). {ours}'s first item came "
        f"after {med(ours, 'time_to_first_item'):.2f} s, {peer}'s after "
        f"{med(peer, 'time_to_first_item'):.2f} s; from there on {after_first(ours):.1f} "
        f"against {after_first(peer):.1f} items/s. CPU: {med(ours, 'cpu_seconds'):.1f} s in "
        f"{ours}'s process, {med(peer, 'cpu_seconds'):.1f} s in {peer}'s (imports and "
        f"hashing included in both) on {data['environment']['cpu_count']} CPUs."
    )
    cdn = _median([float(x[ours]["requests"]["cdn"]) for x in rounds if ours in x])
    if cdn:
        served = med(ours, "bytes_served")
        text += (
            f" Over the Hub ({float(data['parameters']['latency_ms']):g} ms per request) it "
            f"made {cdn:g} CDN requests for {served / 1e6:.1f} MB, "
            f"{served / float(workload['bytes']):.2f}x the dataset's files."
        )
    return text


_EXPLAINERS: list[tuple[str, str, str, Explainer]] = [
    ("parquet", "text:", "aiostream-arrow / fastest-local", _parquet_arrow_vs_local),
    ("parquet-pinned", "text:", "/ fastest-local", _parquet_arrow_vs_local),
    ("byte-cache", "parquet epoch 2", "", _byte_cache),
    ("byte-cache", "webdataset epoch 2", "", _byte_cache),
    ("byte-cache", "lerobot epoch 2", "", _byte_cache),
    ("video", "frames", "time aiostream / pyav-local", _frames_vs_local),
    ("video", "frames", "time download-decode / aiostream", _download_vs_frames),
    ("quota", "epoch:", "datasets / aiostream", _quota_epoch),
    ("lerobot", "lerobot ", "/ lerobot-torchcodec", _lerobot_vs_peer),
    ("lerobot-bytes", "shuffled LeRobot epoch", "bytes served / files' bytes", _lerobot_bytes),
]
# (benchmark, the label's start (its workload), the ratio's numerator, explainer)
_BY_NUMERATOR: list[tuple[str, str, str, Explainer]] = [
    ("video", "frames", "aiostream-cold", _frames_cached_vs_local),
    ("video", "frames", "aiostream-warm", _frames_cached_vs_local),
]
