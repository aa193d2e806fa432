"""The I/O-free Parquet core: footer, planning, pruning and decode from fetched ranges only.

A fake fetcher serves slices of a file's bytes and records every range asked
for, exactly as the async layer would drive the decoder; every result is
compared with ``pq.read_table`` of the same file.
"""

from __future__ import annotations

import datetime
import decimal
import itertools
import json
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from aiostream_hf._decode_pool import decoding
from aiostream_hf._exceptions import DecodeError, SourceError
from aiostream_hf.formats import parquet
from aiostream_hf.formats.parquet import (
    TAIL_READ_SIZE,
    ParquetFooter,
    RowGroupPlan,
    _needs_parquet_816_padding,
    decode_row_group,
    footer_length,
    parse_footer,
    plan_row_groups,
    prune_row_groups,
    tail_range,
)

HF_METADATA = {"huggingface": json.dumps({"info": {"features": {"id": {"dtype": "int64"}}}})}
CODECS = [
    c
    for c in ("none", "snappy", "gzip", "brotli", "zstd", "lz4")
    if c == "none" or pa.Codec.is_available(c)
]


# -- the simulated fetcher and the driver the async layer will mirror --------------------


@dataclass
class FakeFetcher:
    data: bytes
    requests: list[tuple[int, int]] = field(default_factory=list)

    def read(self, start: int, end: int) -> memoryview:
        assert 0 <= start < end <= len(self.data), (start, end)
        self.requests.append((start, end))
        return memoryview(self.data)[start:end]

    @property
    def bytes_read(self) -> int:
        return sum(end - start for start, end in self.requests)


@dataclass
class Streamed:
    table: pa.Table
    footer: ParquetFooter
    plans: list[RowGroupPlan]
    fetcher: FakeFetcher
    tables: list[pa.Table]  # one per row group, as decoded


def open_footer(fetcher: FakeFetcher, name: str, tail_size: int = TAIL_READ_SIZE) -> ParquetFooter:
    size = len(fetcher.data)
    start, end = tail_range(size, tail_size)
    tail = bytes(fetcher.read(start, end))
    length = footer_length(tail, size, name)
    if length > len(tail):
        tail = bytes(fetcher.read(size - length, start)) + tail
    return parse_footer(tail, size, name)


def stream(
    path: Path,
    columns: Sequence[str] | None = None,
    *,
    filter: pc.Expression | None = None,
    tail_size: int = TAIL_READ_SIZE,
) -> Streamed:
    fetcher = FakeFetcher(path.read_bytes())
    footer = open_footer(fetcher, path.name, tail_size)
    plans = plan_row_groups(footer, columns, filter=filter)
    tables = []
    for plan in plans:
        buffers = {r: fetcher.read(*r) for r in plan.ranges}
        tables.append(decode_row_group(footer, plan, buffers, filter=filter))
    names = list(columns) if columns is not None else footer.schema.names
    empty = footer.schema.empty_table().select(names)
    table = pa.concat_tables(tables) if tables else empty
    return Streamed(table, footer, plans, fetcher, tables)


def _nan_safe(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, dict):
        return {k: _nan_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_safe(v) for v in value]
    return value


def assert_tables_equal(actual: pa.Table, expected: pa.Table) -> None:
    """Equal schemas (with metadata) and values; NaN equals NaN, chunking is ignored."""
    assert actual.schema.equals(expected.schema, check_metadata=True)
    assert actual.num_rows == expected.num_rows
    if not actual.equals(expected):
        assert _nan_safe(actual.to_pylist()) == _nan_safe(expected.to_pylist())


def assert_same_as_pyarrow(
    path: Path, columns: Sequence[str] | None = None, filter: pc.Expression | None = None
) -> Streamed:
    result = stream(path, columns, filter=filter)
    expected = pq.read_table(
        path, columns=None if columns is None else list(columns), filters=filter
    )
    assert_tables_equal(result.table, expected)
    # one tail read (+1 for a big footer), then exactly the planned ranges
    planned = [r for plan in result.plans for r in plan.ranges]
    requests = result.fetcher.requests
    footer_reads = len(requests) - len(planned)
    assert footer_reads in (1, 2)
    assert requests[0] == tail_range(len(result.fetcher.data))
    assert requests[footer_reads:] == planned
    return result


# -- a corpus of Parquet variants ---------------------------------------------------------


def rich_table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = np.arange(n, dtype=np.int64)
    base = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    maybe = [i % 7 != 3 for i in range(n)]
    columns: dict[str, pa.Array] = {
        "id": pa.array(ids),
        "flag": pa.array([i % 3 == 0 if maybe[i] else None for i in range(n)], pa.bool_()),
        "score": pa.array(rng.random(n), mask=~np.array(maybe)),
        "text": pa.array([f"row {i} " + "ab" * (i % 13) for i in range(n)]),
        "big_text": pa.array([("é" * (i % 5)) or None for i in range(n)], pa.large_string()),
        "blob": pa.array([bytes([i % 256]) * (i % 9) for i in range(n)], pa.large_binary()),
        "ts": pa.array(
            [base + datetime.timedelta(seconds=int(s)) for s in rng.integers(0, 10**8, n)],
            pa.timestamp("us", tz="Europe/Paris"),
        ),
        "ts_ns": pa.array(rng.integers(0, 2**60, n), pa.timestamp("ns", tz="UTC")),
        "price": pa.array([decimal.Decimal(i) / 100 for i in range(n)], pa.decimal128(12, 2)),
        "wide": pa.array([decimal.Decimal(i) * 10**20 for i in range(n)], pa.decimal256(45, 3)),
        "tags": pa.array(
            [None if i % 11 == 0 else [i, i + 1][: i % 3] for i in range(n)],
            pa.list_(pa.int32()),
        ),
        "point": pa.array(
            [{"x": float(i), "label": None if i % 4 == 0 else str(i)} for i in range(n)],
            pa.struct([("x", pa.float64()), ("label", pa.string())]),
        ),
        "attrs": pa.array(
            [[(f"k{j}", i * j) for j in range(i % 4)] for i in range(n)],
            pa.map_(pa.string(), pa.int64()),
        ),
        "deep": pa.array(
            [[{"vals": [i] * (i % 3), "name": "n"}] * (i % 2) for i in range(n)],
            pa.list_(pa.struct([("vals", pa.list_(pa.int16())), ("name", pa.string())])),
        ),
        "category": pa.array(
            [("red", "green", "blue")[i % 3] for i in range(n)]
        ).dictionary_encode(),
    }
    return pa.table(columns).replace_schema_metadata(HF_METADATA)


@pytest.fixture(scope="module")
def rich() -> pa.Table:
    return rich_table(1500)


@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("dictionary", [True, False])
@pytest.mark.parametrize("codec", CODECS)
def test_variants_decode_like_pyarrow(
    tmp_path: Path, rich: pa.Table, codec: str, dictionary: bool, version: str
) -> None:
    path = tmp_path / "variant.parquet"
    pq.write_table(
        rich,
        path,
        compression=codec,
        use_dictionary=dictionary,
        data_page_version=version,
        row_group_size=600,
        data_page_size=4096,
    )
    result = assert_same_as_pyarrow(path)
    assert [p.row_group for p in result.plans] == [0, 1, 2]
    assert result.table.schema.metadata[b"huggingface"] == HF_METADATA["huggingface"].encode()
    # all columns of a row group are one contiguous range
    assert all(len(p.ranges) == 1 for p in result.plans)


@pytest.mark.parametrize(
    "columns", [["tags", "id", "attrs"], ["deep"], ["point", "category"], ["big_text"]]
)
def test_column_subsets_decode_like_pyarrow(
    tmp_path: Path, rich: pa.Table, columns: list[str]
) -> None:
    path = tmp_path / "subset.parquet"
    pq.write_table(rich, path, row_group_size=500)
    result = assert_same_as_pyarrow(path, columns)
    assert result.table.column_names == columns
    assert result.fetcher.bytes_read < len(result.fetcher.data)


def test_subset_fetches_only_its_columns(tmp_path: Path) -> None:
    n = 20_000
    rng = np.random.default_rng(1)
    table = pa.table(
        {
            "label": pa.array(np.arange(n) % 10),
            "image": pa.array([rng.bytes(200) for _ in range(n)], pa.binary()),
            "caption": pa.array([f"caption {i}" for i in range(n)]),
        }
    )
    path = tmp_path / "images.parquet"
    pq.write_table(table, path, row_group_size=5000)
    result = assert_same_as_pyarrow(path, ["caption", "label"])
    size = len(result.fetcher.data)
    image_bytes = sum(
        result.footer.metadata.row_group(i).column(1).total_compressed_size for i in range(4)
    )
    assert result.fetcher.bytes_read < size - image_bytes + TAIL_READ_SIZE
    assert all(plan.column_indices == (0, 2) for plan in result.plans)
    # the label and caption chunks of a row group are not adjacent: two ranges each
    assert all(len(plan.ranges) == 2 for plan in result.plans)
    assert sum(p.nbytes for p in result.plans) < size // 10


@pytest.mark.parametrize("columns", [None, ["attrs", "id", "deep", "text"]])
def test_columns_decoded_on_several_threads(
    tmp_path: Path, rich: pa.Table, monkeypatch: pytest.MonkeyPatch, columns: list[str] | None
) -> None:
    monkeypatch.setattr(parquet, "_PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(parquet, "usable_cpus", lambda: 3)
    path = tmp_path / "threads.parquet"
    pq.write_table(rich, path, row_group_size=700)
    with decoding():
        result = assert_same_as_pyarrow(path, columns, pc.field("score") > 0.3)
    groups = parquet._column_groups(result.footer, result.plans[0])
    assert len(groups) == 3
    assert sorted(c for g in groups for c in g) == sorted(result.plans[0].read_columns)


def test_column_groups_run_on_the_engines_threads_only_where_it_gives_them(
    tmp_path: Path, rich: pa.Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """formats/ owns no thread: a decode splits its columns only within the engine's
    decoding() (its pool's threads), else decodes them all at once on this thread."""
    monkeypatch.setattr(parquet, "_PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(parquet, "usable_cpus", lambda: 3)
    path = tmp_path / "where.parquet"
    pq.write_table(rich, path, row_group_size=len(rich))
    threads: list[tuple[str, int]] = []
    iter_batches = pq.ParquetFile.iter_batches

    def spy(self: pq.ParquetFile, batch_size: int, **kw: Any) -> Any:
        threads.append((threading.current_thread().name, len(kw["columns"])))
        return iter_batches(self, batch_size, **kw)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    assert_same_as_pyarrow(path)
    assert threads == [(threading.current_thread().name, len(rich.columns))]
    threads.clear()
    with decoding():
        assert_same_as_pyarrow(path)
    assert len(threads) == 3
    assert all(name.startswith("aiostream-parquet") for name, _ in threads), threads
    assert sum(n for _, n in threads) == len(rich.columns)
    threads.clear()
    assert_same_as_pyarrow(path)  # the scope ended with its block
    assert len(threads) == 1


def test_a_row_group_decodes_in_even_batches_cut_alike_in_every_column(
    tmp_path: Path, rich: pa.Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parquet, "_PARALLEL_MIN_BYTES", 1)  # columns on several threads
    monkeypatch.setattr(parquet, "usable_cpus", lambda: 3)
    path = tmp_path / "batches.parquet"
    pq.write_table(rich, path, row_group_size=1000)
    plans = plan_row_groups(parse_footer(path.read_bytes(), path.stat().st_size, path.name))
    # about a fifth of the first row group per batch: five even batches of 200 rows
    monkeypatch.setattr(parquet, "_BATCH_BYTES", -(-plans[0].uncompressed // 5))
    monkeypatch.setattr(parquet, "_MIN_SPLIT_ROWS", 1)
    with decoding():
        result = assert_same_as_pyarrow(path)
    first = result.tables[0]
    assert len(parquet._column_groups(result.footer, result.plans[0])) == 3
    for column in first.columns:
        assert [len(chunk) for chunk in column.chunks] == [200] * 5
    # A floor of rows per batch: a row group is not cut into batches of a few rows.
    monkeypatch.setattr(parquet, "_MIN_SPLIT_ROWS", 400)
    with decoding():
        first = stream(path).tables[0]
    assert [len(chunk) for chunk in first.column("id").chunks] == [400, 400, 200]


def test_each_column_group_bounds_its_batch_by_its_own_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rows asked of pyarrow at once are bounded by the bytes of the columns a thread
    # decodes, not of the whole row group: a lying row count cannot make the thread of a
    # small column allocate for the rows a large column's bytes could hold.
    n = 2000
    table = pa.table(
        {
            "flag": pa.array([0] * n, pa.int8()),
            "text": pa.array([f"{i:08d}" * 40 for i in range(n)]),
        }
    )
    path = tmp_path / "groups.parquet"
    pq.write_table(table, path, row_group_size=n)
    monkeypatch.setattr(parquet, "_PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(parquet, "usable_cpus", lambda: 2)
    monkeypatch.setattr(parquet, "_MIN_BATCH_ROWS", 1)
    monkeypatch.setattr(parquet, "_BATCH_ROWS_PER_BYTE", 1)
    asked: dict[tuple[str, ...], int] = {}
    iter_batches = pq.ParquetFile.iter_batches

    def spy(self: pq.ParquetFile, batch_size: int, **kw: Any) -> Any:
        asked[tuple(kw["columns"])] = batch_size
        return iter_batches(self, batch_size, **kw)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    with decoding():
        result = assert_same_as_pyarrow(path)
    flag_bytes = result.footer.metadata.row_group(0).column(0).total_compressed_size
    assert flag_bytes < n  # a run-length encoded constant: fewer bytes than rows
    assert asked == {("flag",): flag_bytes, ("text",): n}


def test_no_columns_counts_rows_without_fetching(tmp_path: Path, rich: pa.Table) -> None:
    path = tmp_path / "count.parquet"
    pq.write_table(rich, path, row_group_size=400)
    fetcher = FakeFetcher(path.read_bytes())
    footer = open_footer(fetcher, path.name)
    plans = plan_row_groups(footer, [])
    assert [plan.ranges for plan in plans] == [()] * 4
    tables = [decode_row_group(footer, plan, {}) for plan in plans]
    assert [t.num_rows for t in tables] == [400, 400, 400, 300]
    assert all(t.num_columns == 0 for t in tables)
    assert len(fetcher.requests) == 1


def test_one_row_row_groups(tmp_path: Path) -> None:
    path = tmp_path / "tiny_groups.parquet"
    pq.write_table(rich_table(40, seed=2), path, row_group_size=1)
    result = assert_same_as_pyarrow(path)
    assert result.footer.num_row_groups == 40
    assert [p.num_rows for p in result.plans] == [1] * 40


def test_hundred_thousand_row_group(tmp_path: Path) -> None:
    n = 100_000
    table = pa.table(
        {
            "id": pa.array(np.arange(n)),
            "value": pa.array(np.random.default_rng(3).normal(size=n)),
            "text": pa.array([f"t{i % 977}" for i in range(n)]),
        }
    )
    path = tmp_path / "one_group.parquet"
    pq.write_table(table, path, row_group_size=n, compression="zstd")
    result = assert_same_as_pyarrow(path)
    assert [p.num_rows for p in result.plans] == [n]
    assert_same_as_pyarrow(path, ["text"])


def test_zero_row_file(tmp_path: Path, rich: pa.Table) -> None:
    path = tmp_path / "empty.parquet"
    pq.write_table(rich.slice(0, 0), path)
    result = assert_same_as_pyarrow(path, ["id", "tags"])
    assert result.plans == []
    assert result.footer.num_rows == 0
    assert result.table.num_rows == 0


def test_footer_larger_than_the_tail_read_takes_one_more_read(tmp_path: Path) -> None:
    n = 30
    table = pa.table({f"column_with_a_long_name_{i:04d}": pa.array(range(n)) for i in range(400)})
    path = tmp_path / "wide.parquet"
    pq.write_table(table, path, row_group_size=10)
    result = assert_same_as_pyarrow(path)
    size = len(result.fetcher.data)
    footer = footer_length(result.fetcher.data[-8:], size, path.name)
    assert footer > TAIL_READ_SIZE
    assert result.fetcher.requests[:2] == [
        (size - TAIL_READ_SIZE, size),
        (size - footer, size - TAIL_READ_SIZE),
    ]


def test_small_tail_read_and_footer_bytes_exactly(tmp_path: Path, rich: pa.Table) -> None:
    path = tmp_path / "small_tail.parquet"
    pq.write_table(rich, path, row_group_size=700)
    result = stream(path, ["id"], tail_size=16)
    assert result.table.equals(pq.read_table(path, columns=["id"]))
    data = result.fetcher.data
    size = len(data)
    length = footer_length(data[-8:], size, path.name)
    assert result.fetcher.requests[:2] == [(size - 16, size), (size - length, size - 16)]
    assert parse_footer(data[-length:], size, path.name).metadata.equals(pq.read_metadata(path))


def test_tail_of_a_small_file_is_enough_to_decode(tmp_path: Path) -> None:
    path = tmp_path / "small.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]}), path)
    data = path.read_bytes()
    assert tail_range(len(data)) == (0, len(data))
    footer = parse_footer(data, len(data), path.name)
    (plan,) = plan_row_groups(footer, ["b"])
    table = decode_row_group(footer, plan, {(0, len(data)): data})
    assert table.to_pylist() == [{"b": "x"}, {"b": "y"}, {"b": "z"}]


def test_buffers_may_be_cut_differently_from_the_plan(tmp_path: Path, rich: pa.Table) -> None:
    path = tmp_path / "cuts.parquet"
    pq.write_table(rich, path, row_group_size=1500)
    data = path.read_bytes()
    footer = parse_footer(data, len(data), path.name)
    (plan,) = plan_row_groups(footer)
    ((start, end),) = plan.ranges
    cuts = sorted({start, end, *random.Random(0).sample(range(start + 1, end), 20)})
    buffers: dict[tuple[int, int], Any] = {
        (a, b): pa.py_buffer(data[a:b]) for a, b in itertools.pairwise(cuts)
    }
    assert decode_row_group(footer, plan, buffers).equals(pq.read_table(path))


@pytest.mark.parametrize("codec", ["none", "snappy"])
def test_decoded_table_does_not_hold_the_fetched_buffers(rich: pa.Table, codec: str) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(rich, sink, compression=codec, use_dictionary=False, row_group_size=500)
    data = bytearray(sink.getvalue().to_pybytes())
    footer = parse_footer(bytes(data[-TAIL_READ_SIZE:]), len(data), "held.parquet")
    tables = []
    for plan in plan_row_groups(footer):
        views = {r: memoryview(data)[r[0] : r[1]] for r in plan.ranges}
        tables.append(decode_row_group(footer, plan, views))
        for view in views.values():
            view.release()
    data.append(0)  # a bytearray with a live export refuses to grow: BufferError
    assert pa.concat_tables(tables).num_rows == rich.num_rows


def test_columns_of_a_plan(tmp_path: Path, rich: pa.Table) -> None:
    path = tmp_path / "plan.parquet"
    pq.write_table(rich, path, row_group_size=1000)
    data = path.read_bytes()
    footer = parse_footer(data[-TAIL_READ_SIZE:], len(data), path.name)
    assert footer.schema.equals(pq.read_schema(path), check_metadata=True)
    assert footer.leaf_columns["id"] == (0,)
    assert len(footer.leaf_columns["attrs"]) == 2  # key, value
    assert len(footer.leaf_columns["deep"]) == 2  # vals, name
    plans = plan_row_groups(footer, ["attrs", "id", "attrs"], row_groups=[1])
    assert [p.row_group for p in plans] == [1]
    assert plans[0].columns == ("attrs", "id")
    assert plans[0].column_indices == (0, *footer.leaf_columns["attrs"])
    assert plans[0].num_rows == 500
    for start, end in plans[0].ranges:
        assert 4 <= start < end <= len(data)


# -- filters and statistics-based pruning --------------------------------------------------


def prune_table(n: int = 400) -> pa.Table:
    rng = np.random.default_rng(5)
    floats = rng.normal(size=n)
    floats[rng.integers(0, n, 10)] = np.nan
    base = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    return pa.table(
        {
            "i": pa.array(np.arange(n)),
            "r": pa.array(rng.integers(-50, 50, n)),
            "f": pa.array(floats, mask=rng.random(n) < 0.1),
            "s": pa.array([f"{i // 7:04d}" for i in range(n)]),
            "n": pa.array(
                [None if i >= n // 2 or i % 5 == 0 else i % 30 for i in range(n)], pa.int32()
            ),
            "ts": pa.array(
                [base + datetime.timedelta(hours=i) for i in range(n)], pa.timestamp("ms", tz="UTC")
            ),
            "payload": pa.array([f"payload {i}" * 3 for i in range(n)]),
        }
    )


@pytest.fixture(scope="module")
def prune_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prune") / "prune.parquet"
    pq.write_table(prune_table(), path, row_group_size=25)
    return path


def _footer(path: Path) -> ParquetFooter:
    data = path.read_bytes()
    return parse_footer(data[-TAIL_READ_SIZE:], len(data), path.name)


def _groups_with_matches(path: Path, expr: pc.Expression) -> set[int]:
    table = pq.read_table(path)
    metadata = pq.read_metadata(path)
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    group = pa.array(np.repeat(np.arange(len(sizes)), sizes))
    matching = table.append_column("__group", group).filter(expr)
    return set(matching["__group"].to_pylist())


def test_prune_with_statistics(prune_file: Path) -> None:
    footer = _footer(prune_file)
    assert footer.num_row_groups == 16
    assert prune_row_groups(footer, pc.field("i") > 349) == [14, 15]
    assert prune_row_groups(footer, pc.field("i") == 30) == [1]
    assert prune_row_groups(footer, pc.field("i").isin([3, 399])) == [0, 15]
    assert prune_row_groups(footer, ~(pc.field("i") >= 50)) == [0, 1]
    assert prune_row_groups(footer, (pc.field("i") < 25) | (pc.field("s") == "0050")) == [0, 14]
    assert prune_row_groups(footer, pc.field("n") > 0) == list(range(8))
    assert prune_row_groups(footer, pc.field("n").is_valid()) == list(range(8))
    hour_384 = pa.scalar(
        datetime.datetime(2020, 1, 17, tzinfo=datetime.timezone.utc), pa.timestamp("ms", "UTC")
    )
    assert prune_row_groups(footer, pc.field("ts") >= hour_384) == [15]
    # what statistics cannot decide keeps the row group
    assert prune_row_groups(footer, pc.field("i") * 2 > 700) == list(range(16))
    assert prune_row_groups(footer, pc.field("i") != 3) == list(range(16))


def _random_filter(rng: random.Random, depth: int = 0) -> pc.Expression:
    if depth < 2 and rng.random() < 0.4:
        left, right = _random_filter(rng, depth + 1), _random_filter(rng, depth + 1)
        return rng.choice([left & right, left | right, ~left])
    column = rng.choice(["i", "r", "f", "s", "n", "ts"])
    if column in ("i", "n"):
        value: Any = rng.randint(-5, 410)
    elif column == "r":
        value = rng.randint(-60, 60)
    elif column == "f":
        value = rng.uniform(-3, 3)
    elif column == "s":
        value = f"{rng.randint(0, 60):04d}"
    else:
        value = pa.scalar(
            datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
            + datetime.timedelta(hours=rng.randint(-10, 410)),
            pa.timestamp("ms", tz="UTC"),
        )
    kind = rng.choice(["==", "!=", "<", "<=", ">", ">=", "isin", "is_null", "is_valid"])
    ref = pc.field(column)
    if kind == "isin":
        return ref.isin(pa.array([value, value]) if column != "ts" else pa.array([value]))
    if kind == "is_null":
        return ref.is_null()
    if kind == "is_valid":
        return ref.is_valid()
    comparisons = {
        "==": ref.__eq__,
        "!=": ref.__ne__,
        "<": ref.__lt__,
        "<=": ref.__le__,
        ">": ref.__gt__,
        ">=": ref.__ge__,
    }
    return comparisons[kind](value)  # type: ignore[no-any-return]


def test_pruning_never_drops_a_matching_row_group(prune_file: Path) -> None:
    footer = _footer(prune_file)
    rng = random.Random(7)
    dropped = 0
    for _ in range(300):
        expr = _random_filter(rng)
        kept = prune_row_groups(footer, expr)
        assert kept == sorted(set(kept))
        assert _groups_with_matches(prune_file, expr) <= set(kept), expr
        dropped += footer.num_row_groups - len(kept)
    assert dropped > 300  # the pruning is not vacuous


def test_filtered_stream_equals_pyarrow(prune_file: Path) -> None:
    rng = random.Random(11)
    for _ in range(25):
        expr = _random_filter(rng)
        assert_same_as_pyarrow(prune_file, None, expr)
        result = assert_same_as_pyarrow(prune_file, ["payload", "i"], expr)
        assert result.table.column_names == ["payload", "i"]


def test_filter_columns_are_read_but_not_returned(prune_file: Path) -> None:
    footer = _footer(prune_file)
    expr = (pc.field("s") > "0040") & pc.field("f").is_valid()
    plans = plan_row_groups(footer, ["payload"], filter=expr)
    assert [p.row_group for p in plans] == [11, 12, 13, 14, 15]
    assert plans[0].columns == ("payload",)
    assert set(plans[0].read_columns) == {"payload", "s", "f"}
    result = assert_same_as_pyarrow(prune_file, ["payload"], expr)
    assert result.table.column_names == ["payload"]
    assert 0 < result.table.num_rows < 125
    # pruning composes with an explicit row group selection
    assert [p.row_group for p in plan_row_groups(footer, None, [15, 2, 12], filter=expr)] == [
        15,
        12,
    ]


def test_filter_on_nested_field(tmp_path: Path, rich: pa.Table) -> None:
    path = tmp_path / "nested_filter.parquet"
    pq.write_table(rich, path, row_group_size=300)
    expr = pc.field("point", "x") >= 1234
    footer = _footer(path)
    plans = plan_row_groups(footer, ["id"], filter=expr)
    assert [p.row_group for p in plans] == [4]
    assert plans[0].read_columns == ("id", "point")
    assert_same_as_pyarrow(path, ["id"], expr)


def test_bad_filters_name_the_file(prune_file: Path) -> None:
    footer = _footer(prune_file)
    with pytest.raises(SourceError, match=r"prune\.parquet.*columns are i, r, f") as info:
        plan_row_groups(footer, ["i"], filter=pc.field("nope") > 3)
    assert isinstance(info.value, ValueError)
    with pytest.raises(SourceError, match=r"prune\.parquet"):
        prune_row_groups(footer, pc.field("s") > 3)
    (plan,) = plan_row_groups(footer, ["i"], [0])
    data = prune_file.read_bytes()
    buffers = {r: data[r[0] : r[1]] for r in plan.ranges}
    with pytest.raises(SourceError, match="same filter"):
        decode_row_group(footer, plan, buffers, filter=pc.field("r") > 0)


# -- errors ------------------------------------------------------------------------------


JPEG = bytes.fromhex("ffd8ffe000104a464946000101") + bytes(range(256)) * 40 + b"\xff\xd9"


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("photo.jpg", JPEG),
        ("notes.txt", b"this is not parquet\n" * 100),
        ("tiny.parquet", b"PAR1PAR1"),
        ("empty.parquet", b""),
        ("head_only.parquet", b"PAR1" + bytes(100)),
        ("encrypted.parquet", b"PAR1" + bytes(100) + b"\x10\x00\x00\x00PARE"),
        ("huge_footer.parquet", b"PAR1" + bytes(100) + b"\xff\xff\x00\x00PAR1"),
        ("no_head.parquet", b"JUNK" + bytes(100) + b"\x10\x00\x00\x00PAR1"),
    ],
)
def test_not_parquet_raises_decode_error_naming_the_file(name: str, data: bytes) -> None:
    start, end = tail_range(len(data))
    with pytest.raises(DecodeError, match=name.replace(".", r"\.")):
        parse_footer(data[start:end], len(data), name)


def test_truncated_file(tmp_path: Path, rich: pa.Table) -> None:
    path = tmp_path / "cut.parquet"
    pq.write_table(rich, path)
    data = path.read_bytes()
    for cut in (len(data) // 2, len(data) - 1, 100):
        truncated = data[:cut]
        with pytest.raises(DecodeError, match=r"cut\.parquet"):
            parse_footer(truncated[-TAIL_READ_SIZE:], len(truncated), "cut.parquet")
    # the footer survives but the data before it does not
    length = footer_length(data[-8:], len(data), "cut.parquet")
    shortened = b"PAR1" + data[-length:]
    footer = parse_footer(shortened, len(shortened), "cut.parquet")
    with pytest.raises(DecodeError, match=r"cut\.parquet is corrupt: column chunk 'id'"):
        plan_row_groups(footer)


def test_garbled_footer_and_data(tmp_path: Path, rich: pa.Table) -> None:
    path = tmp_path / "garbled.parquet"
    pq.write_table(rich, path, compression="snappy", row_group_size=1500)
    data = path.read_bytes()
    length = footer_length(data[-8:], len(data), path.name)
    garbled = data[:-length] + bytes([0xAB]) * (length - 8) + data[-8:]
    with pytest.raises(DecodeError, match=r"garbled\.parquet"):
        parse_footer(garbled[-TAIL_READ_SIZE:], len(garbled), path.name)

    footer = parse_footer(data[-TAIL_READ_SIZE:], len(data), path.name)
    (plan,) = plan_row_groups(footer, ["text"])
    ((start, end),) = plan.ranges
    with pytest.raises(DecodeError, match=r"row group 0 of garbled\.parquet"):
        decode_row_group(footer, plan, {(start, end): b"\xff" * (end - start)})


def test_unknown_column_lists_the_columns(prune_file: Path) -> None:
    footer = _footer(prune_file)
    with pytest.raises(SourceError, match=r"no column 'x' in prune\.parquet: columns are i, r"):
        plan_row_groups(footer, ["i", "x"])
    with pytest.raises(SourceError, match="not the string"):
        plan_row_groups(footer, "i")
    with pytest.raises(SourceError, match=r"no row group 16 in prune\.parquet: it has 16"):
        plan_row_groups(footer, None, [0, 16])


def test_missing_or_short_buffers_are_refused(prune_file: Path) -> None:
    footer = _footer(prune_file)
    (plan,) = plan_row_groups(footer, ["i", "payload"], [3])
    data = prune_file.read_bytes()
    first, second = plan.ranges
    with pytest.raises(ValueError, match=r"prune\.parquet, but no buffer given holds bytes"):
        decode_row_group(footer, plan, {first: data[first[0] : first[1]]})
    with pytest.raises(ValueError, match="holds 3 bytes"):
        decode_row_group(footer, plan, {first: b"abc"})


def test_tail_must_hold_the_footer(prune_file: Path) -> None:
    data = prune_file.read_bytes()
    with pytest.raises(ValueError, match=r"read bytes \["):
        parse_footer(data[-20:], len(data), prune_file.name)
    with pytest.raises(ValueError, match="tail bytes"):
        footer_length(data + data, len(data), prune_file.name)


@pytest.mark.parametrize(
    ("created_by", "padded"),
    [
        ("parquet-mr version 1.2.8", True),
        ("parquet-mr version 1.2.9", False),
        ("parquet-mr version 1.12.3 (build f8dced182c4c1fbdec6ccb3185537b5a01e6ed6b)", False),
        ("parquet-mr", True),
        ("parquet-cpp-arrow version 26.0.1", False),
        ("", False),
        (None, False),
    ],
)
def test_parquet_816_padding_for_old_parquet_mr(created_by: str | None, padded: bool) -> None:
    assert _needs_parquet_816_padding(created_by) is padded


# -- files written by other implementations (tests/data/parquet-testing) -----------------

PARQUET_TESTING = Path(__file__).parent.parent / "data" / "parquet-testing"


def test_a_footer_row_count_its_row_groups_contradict_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """parquet-rs 0.3.0 wrote num_rows 0 in the footer of a file whose one row group holds
    6 rows; pyarrow reads the 6 rows, and so do we, saying so in a warning."""
    path = PARQUET_TESTING / "repeated_no_annotation.parquet"
    assert pq.ParquetFile(path).metadata.num_rows == 0  # the file is as described
    with caplog.at_level("WARNING", logger="aiostream_hf"):
        result = assert_same_as_pyarrow(path)
    assert result.table.num_rows == 6
    assert result.footer.num_rows == 6  # the rows its row groups hold, which are read
    warned = [r for r in caplog.records if r.name == "aiostream_hf" and r.levelname == "WARNING"]
    assert [r.getMessage() for r in warned] == [
        "repeated_no_annotation.parquet: its footer says 0 rows, but its 1 row groups "
        "hold 6; reading the row groups' rows, as pyarrow does"
    ]


def test_a_whole_file_budget_bounds_its_row_groups_together(tmp_path: Path) -> None:
    """A table read whole (LeRobot's) holds all its row groups at once: DecodeBudget's
    whole_file sums them, where a stream's readahead bounds each alone; both before any
    decode, by the flat floor at the plan and with the list pages' values after fetching."""
    from aiostream_hf._models import FileRef
    from aiostream_hf.formats import ReadRequest
    from aiostream_hf.formats.parquet import DecodeBudget, ParquetDecoder, decode_units

    path = tmp_path / "four.parquet"
    table = pa.table({"x": pa.array(range(400), pa.int64()), "l": [[i] * 3 for i in range(400)]})
    pq.write_table(table, path, row_group_size=100)
    data = path.read_bytes()
    file = FileRef(url=path.as_uri(), path=path.name, size=len(data))
    footer = parse_footer(data, len(data), path.name)
    request = ReadRequest()
    each = ParquetDecoder().units(footer, file, request, None)
    fetched = [{(0, len(data)): data} for _ in each]
    assert [u.plan.least_decoded for u in each if u.plan] == [800] * 4  # 100 int64s each

    def budget(limit: int, whole: bool) -> DecodeBudget:
        return DecodeBudget(limit, lambda least: f"over {limit}", whole_file=whole)

    with pytest.raises(DecodeError, match=r"^four\.parquet decodes to at least 3,200 bytes \(400"):
        ParquetDecoder().units(footer, file, request, budget(3199, True))
    assert len(ParquetDecoder().units(footer, file, request, budget(800, False))) == 4
    # 400 rows x 3 int64 list values = 9,600 bytes more, announced by the pages
    units = ParquetDecoder().units(footer, file, request, budget(3200, True))
    with pytest.raises(DecodeError, match=r"at least 12,800 bytes \(9,600 bytes of them the val"):
        decode_units(footer, units, fetched, request, budget(12_799, True))
    assert decode_units(footer, units, fetched, request, budget(12_800, True)).equals(
        pq.read_table(path)
    )
