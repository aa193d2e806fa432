"""The I/O-free core of the Parquet decoder: footer, row-group range planning, decode.

Nothing here opens a file or a socket. Every function takes bytes that somebody
else fetched and returns data, so the same code runs in a worker thread under
``anyio.to_thread``, in tests and in plugins. The async layer drives it like
this, with the file size taken from the manifest (no HEAD request)::

    start, end = tail_range(size)
    tail = await fetch(start, end)                        # read 1: the tail
    n = footer_length(tail, size, name)
    if n > len(tail):                                     # read 2, only for big footers
        tail = await fetch(size - n, start) + tail
    footer = parse_footer(tail, size, name)
    for plan in plan_row_groups(footer, columns, filter=filter):
        buffers = {r: await fetch(*r) for r in plan.ranges}   # selected column chunks
        table = await to_thread(decode_row_group, footer, plan, buffers, filter=filter)

``plan.ranges`` are exact file byte ranges (adjacent chunks merged); the fetcher
may coalesce or split them further, and ``decode_row_group`` accepts any set of
buffers that covers them (for example the tail itself, for a small file).

No length or count in a file is trusted: the footer must fit in the file and in
``MAX_FOOTER_SIZE`` before it is read, no row group may say fewer than 0 rows (a
file total that disagrees with its row groups is only a warning, as pyarrow ignores
it), every column chunk planned must lie between the leading magic and the footer, a
decoded row group must have the rows its footer says, and page CRCs are verified
where the file has them (``verify_checksums``). Anything else is a ``DecodeError``
naming the file (and the row group).
"""

from __future__ import annotations

import logging
import re
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._exceptions import DecodeError, SourceError, display_url
from .._models import FileRef
from . import ByteSource, Decoder, ReadRequest, Unit
from ._range_file import BufferLike as BufferLike
from ._range_file import RangeFile
from ._split import usable_cpus
from ._thrift import chunk_values, row_group_count

logger = logging.getLogger("aiostream_hf")

__all__ = [
    "MAX_FOOTER_SIZE",
    "MAX_ROW_GROUPS",
    "BufferLike",
    "DecodeBudget",
    "Parallel",
    "ParquetDecoder",
    "ParquetFooter",
    "ParquetUnit",
    "RowGroupPlan",
    "TAIL_READ_SIZE",
    "check_fetched",
    "check_plans",
    "decode_row_group",
    "decode_units",
    "footer_length",
    "parallel_parts",
    "parse_footer",
    "plan_row_groups",
    "piece_buffers",
    "prune_row_groups",
    "read_footer",
    "readahead_budget",
    "tail_range",
]

TAIL_READ_SIZE = 64 * 1024
"""Bytes read from the end of a file first: enough for the footer of most files."""

MAX_FOOTER_SIZE = 128 * 1024 * 1024
"""Largest footer read (128 MiB, about a million column chunks); a file whose footer
says more raises ``DecodeError`` before it is read. Footers are usually kilobytes."""

MAX_ROW_GROUPS = 100_000
"""Most row groups a footer may list, counted before pyarrow parses it (into many times
its bytes) and before each is planned. Files have a few to a few thousand."""

_MAGIC = b"PAR1"
_MAGIC_ENCRYPTED = b"PARE"
_TRAILER = 8  # little-endian uint32 metadata length + magic
_MIN_FILE_SIZE = len(_MAGIC) + _TRAILER

# Files written by parquet-mr <= 1.2.8 leave the dictionary page header out of
# total_compressed_size; Arrow reads up to this many bytes more (PARQUET-816).
_PARQUET_816_PADDING = 100
# Row groups that decode to fewer bytes than this per thread are decoded on one thread.
_PARALLEL_MIN_BYTES = 4 * 1024 * 1024
# Rows asked of pyarrow at once: see _batch_rows.
_MIN_BATCH_ROWS = 1 << 20
_BATCH_ROWS_PER_BYTE = 64
_BATCH_BYTES = 4 * 1024 * 1024
_MIN_SPLIT_ROWS = 64

_PARQUET_MR_VERSION = re.compile(r"^parquet-mr\s+version\s+(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True, eq=False)
class ParquetFooter:
    """The parsed footer of one Parquet file: everything needed to plan and decode it."""

    name: str
    """The file's URL or name, used in error messages."""
    file_size: int
    metadata: pq.FileMetaData
    """Row groups, column chunks and their statistics."""
    schema: pa.Schema
    """The Arrow schema, with the file's key-value metadata (``pandas``, ``huggingface``)."""
    leaf_columns: Mapping[str, tuple[int, ...]] = field(repr=False)
    """The leaf column indices (column chunks) of each top-level column, in file order."""
    metadata_file: pa.Buffer = field(repr=False)
    """The footer as a standalone ``_metadata`` file: ``PAR1`` + footer."""
    num_rows: int
    """The rows its row groups hold, which are what is read. The footer's own total
    (``metadata.num_rows``) sizes nothing: some writers got it wrong (parquet-rs 0.3.0
    wrote 0), and a file whose total disagrees is read as pyarrow reads it, with a
    warning (``parse_footer``)."""

    @property
    def num_row_groups(self) -> int:
        return int(self.metadata.num_row_groups)


@dataclass(frozen=True)
class RowGroupPlan:
    """What to fetch and decode for one row group."""

    row_group: int
    num_rows: int
    columns: tuple[str, ...]
    """The columns the decoded table holds, in the order asked for."""
    read_columns: tuple[str, ...]
    """The columns decoded: ``columns`` and those that only the filter needs."""
    column_indices: tuple[int, ...]
    """The leaf columns (column chunks) of ``read_columns``, in file order."""
    ranges: tuple[tuple[int, int], ...]
    """File byte ranges ``(start, end)``, end exclusive, sorted; adjacent chunks merged."""
    uncompressed: int = 0
    """The uncompressed bytes of the column chunks read: about what the table will hold."""
    least_decoded: int = 0
    """Bytes the decoded table holds at the least, whatever the pages say: its rows times
    the widths of its flat fixed-width columns (and 4-byte offsets of its flat strings).
    Encodings (RLE, dictionaries) make it far more than ``uncompressed`` at times."""

    @property
    def nbytes(self) -> int:
        """The bytes to fetch for this row group."""
        return sum(end - start for start, end in self.ranges)


def tail_range(file_size: int, tail_size: int = TAIL_READ_SIZE) -> tuple[int, int]:
    """The byte range of the first read of a file: its last ``tail_size`` bytes."""
    if file_size < 0 or tail_size <= 0:
        raise ValueError(f"file_size must be >= 0 and tail_size > 0: {file_size}, {tail_size}")
    return max(0, file_size - tail_size), file_size


def footer_length(tail: BufferLike, file_size: int, name: str) -> int:
    """The length of the footer (metadata + 8 bytes) of a file, from the end of its bytes.

    ``tail`` is the last ``len(tail)`` bytes of the file (at least 8). When the
    result exceeds ``len(tail)`` the caller reads the missing bytes before it and
    prepends them. Raises ``DecodeError`` naming ``name`` if the bytes are not
    Parquet.
    """
    view = memoryview(tail).cast("B")
    if len(view) > file_size:
        raise ValueError(f"{len(view)} tail bytes given for {name} of {file_size} bytes")
    if file_size < _MIN_FILE_SIZE:
        raise DecodeError(
            f"{name} is not a Parquet file: {file_size} bytes is shorter than "
            f"the {_MIN_FILE_SIZE} of the smallest one"
        )
    if len(view) < _TRAILER:
        raise ValueError(f"at least the last {_TRAILER} bytes of {name} are needed")
    magic = bytes(view[-4:])
    if magic == _MAGIC_ENCRYPTED:
        raise DecodeError(f"{name} is an encrypted Parquet file, which is not supported")
    if magic != _MAGIC:
        raise DecodeError(
            f"{name} is not a Parquet file, or is truncated: it does not end with "
            f"{_MAGIC!r} (last bytes {magic!r})"
        )
    (metadata_length,) = struct.unpack("<I", view[-8:-4])
    length = int(metadata_length) + _TRAILER
    if length + len(_MAGIC) > file_size:
        raise DecodeError(
            f"{name} is corrupt or truncated: its footer says {length} bytes "
            f"but the file has {file_size}"
        )
    if length > MAX_FOOTER_SIZE:
        raise DecodeError(
            f"{name} is corrupt or unusual: its footer says {length} bytes, over "
            f"MAX_FOOTER_SIZE={MAX_FOOTER_SIZE} (aiostream_hf.formats.parquet)"
        )
    if len(view) == file_size and bytes(view[:4]) != _MAGIC:
        raise DecodeError(f"{name} is not a Parquet file: it does not start with {_MAGIC!r}")
    return length


def parse_footer(tail: BufferLike, file_size: int, name: str) -> ParquetFooter:
    """Parse the footer of a file from its last bytes, which must hold the whole footer."""
    length = footer_length(tail, file_size, name)
    view = memoryview(tail).cast("B")
    if length > len(view):
        raise ValueError(
            f"the footer of {name} is {length} bytes but only the last {len(view)} "
            f"were given: read bytes [{file_size - length}, {file_size - len(view)}) too"
        )
    groups = row_group_count(view[len(view) - length : len(view) - _TRAILER], name)
    if groups is not None and groups > MAX_ROW_GROUPS:
        raise DecodeError(
            f"{name}: its footer lists {groups:,} row groups, over MAX_ROW_GROUPS="
            f"{MAX_ROW_GROUPS:,} (a footer is parsed whole, into many times its "
            f"{length:,} bytes): rewrite the file with larger row groups"
        )
    metadata_file = pa.py_buffer(_MAGIC + view[len(view) - length :])
    try:
        with pq.ParquetFile(pa.BufferReader(metadata_file)) as pf:
            metadata = pf.metadata
            schema = pf.schema_arrow
            paths: list[list[str]] = pf.reader.column_paths
    except (pa.ArrowException, OSError) as exc:
        raise DecodeError(f"cannot read the Parquet footer of {name}: {exc}") from exc
    rows = _row_group_rows(metadata, name)
    leaves: dict[str, list[int]] = {}
    for index, path in enumerate(paths):
        leaves.setdefault(path[0], []).append(index)
    return ParquetFooter(
        name=name,
        file_size=file_size,
        metadata=metadata,
        schema=schema,
        leaf_columns={column: tuple(indices) for column, indices in leaves.items()},
        metadata_file=metadata_file,
        num_rows=rows,
    )


def _row_group_rows(metadata: pq.FileMetaData, name: str) -> int:
    """The rows the footer's row groups hold, none of them negative.

    A file total that disagrees is a warning, not an error: pyarrow reads the row
    groups and ignores it, and so does every reader here (nothing is sized by it). Each
    row group's count is still checked where it matters: it bounds the least its
    decode holds (``RowGroupPlan.least_decoded``, against ``prefetch_bytes``), and a
    row group that decodes to other rows than it says is a ``DecodeError``.
    """
    counts = [int(metadata.row_group(i).num_rows) for i in range(metadata.num_row_groups)]
    bad = next((i for i, count in enumerate(counts) if count < 0), None)
    if bad is not None:
        raise DecodeError(
            f"{name} is corrupt: row group {bad} of its footer says {counts[bad]} rows"
        )
    total, rows = int(metadata.num_rows), sum(counts)
    if total != rows:
        logger.warning(
            "%s: its footer says %s rows, but its %s row groups hold %s; reading the row "
            "groups' rows, as pyarrow does",
            display_url(name),
            f"{total:,}",
            f"{len(counts):,}",
            f"{rows:,}",
        )
    return rows


def prune_row_groups(footer: ParquetFooter, filter: pc.Expression) -> list[int]:
    """The row groups that may hold rows matching ``filter``, judged by column statistics.

    Conservative: a row group is dropped only when its statistics prove that no
    row matches; anything the statistics cannot decide keeps it. Raises
    ``SourceError`` if ``filter`` does not apply to the file's schema.
    """
    import pyarrow.dataset as ds  # here, not at the top: it costs ~0.2 s to import

    fragment = ds.ParquetFileFormat().make_fragment(footer.metadata_file)
    try:
        kept = fragment.subset(filter).row_groups
    except pa.ArrowException as exc:
        raise _filter_error(footer, filter, exc) from exc
    return [int(row_group.id) for row_group in kept]


def plan_row_groups(
    footer: ParquetFooter,
    columns: Sequence[str] | None = None,
    row_groups: Sequence[int] | None = None,
    *,
    filter: pc.Expression | None = None,
) -> list[RowGroupPlan]:
    """Plan the reads of the given row groups (default: all), skipping those without rows.

    ``columns`` are top-level column names (default: all of them); a nested
    column brings all its leaves. With a ``filter``, the columns it needs are
    read too, and row groups whose statistics rule out a match are left out.
    """
    names = _resolve_columns(footer, columns)
    read_columns = names
    if filter is not None:
        extra = [c for c in _filter_columns(footer, filter) if c not in names]
        read_columns = names + tuple(extra)
    indices = tuple(sorted(i for c in read_columns for i in footer.leaf_columns[c]))

    count = footer.num_row_groups
    if row_groups is None:
        selected = list(range(count))
    else:
        selected = [int(i) for i in row_groups]
        bad = [i for i in selected if not 0 <= i < count]
        if bad:
            raise SourceError(f"no row group {bad[0]} in {footer.name}: it has {count}")
    if filter is not None:
        may_match = set(prune_row_groups(footer, filter))
        selected = [i for i in selected if i in may_match]

    padding = _PARQUET_816_PADDING if _needs_parquet_816_padding(footer.metadata.created_by) else 0
    row_bytes = _least_row_bytes(footer, indices)
    plans = []
    for i in selected:
        row_group = footer.metadata.row_group(i)
        if row_group.num_rows == 0:
            continue
        chunks = [_chunk_range(footer, i, row_group.column(j), padding) for j in indices]
        plans.append(
            RowGroupPlan(
                row_group=i,
                num_rows=int(row_group.num_rows),
                columns=names,
                read_columns=read_columns,
                column_indices=indices,
                ranges=_merge(chunks),
                uncompressed=sum(row_group.column(j).total_uncompressed_size for j in indices),
                least_decoded=int(row_group.num_rows) * row_bytes,
            )
        )
    return plans


# Bytes per value a flat (not repeated) leaf column decodes to, at the least, by its
# physical type: fixed widths; a string's or binary's 4-byte offset; booleans as bits
# (counted as none).
_LEAST_VALUE_BYTES = {"INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 8, "BYTE_ARRAY": 4}


def _value_bytes(column: Any) -> int:
    """The least bytes one value of leaf ``column`` (a schema column) decodes to."""
    if column.physical_type == "FIXED_LEN_BYTE_ARRAY":
        return max(0, int(column.length or 0))
    return _LEAST_VALUE_BYTES.get(column.physical_type, 0)


def least_list_bytes(
    footer: ParquetFooter, plan: RowGroupPlan, buffers: Mapping[tuple[int, int], BufferLike]
) -> int:
    """The least bytes the repeated (list) leaves of ``plan`` decode to, by the values
    their data pages' headers announce (``_thrift.chunk_values``): what the footer's row
    count cannot bound (one row may hold any number of values). ``buffers`` as for
    ``decode_row_group``."""
    schema = footer.metadata.schema
    lists = [
        (i, width)
        for i in plan.column_indices
        if schema.column(i).max_repetition_level > 0 and (width := _value_bytes(schema.column(i)))
    ]
    if not lists:
        return 0
    row_group = footer.metadata.row_group(plan.row_group)
    file = RangeFile(footer.name, footer.file_size, buffers)

    def read(offset: int, n: int) -> bytes:
        file.seek(offset)
        return bytes(file.read(n))

    total = 0
    for i, width in lists:
        start, _ = _chunk_range(footer, plan.row_group, row_group.column(i), 0)
        end = start + int(row_group.column(i).total_compressed_size)
        total += width * chunk_values(read, start, end, footer.name)
    return total


@dataclass(frozen=True)
class DecodeBudget:
    """The most bytes decoded row groups may hold, checked before anything is decoded
    (``check_plans``, ``check_fetched``): each row group alone (a stream's readahead,
    ``readahead_budget``), or, ``whole_file``, all those of a file read together (a
    table read whole, ``decode_units``). ``explain(least)`` ends the refusal: what the
    bound is and the way out."""

    limit: int
    explain: Callable[[int], str]
    whole_file: bool = False


def readahead_budget(request: ReadRequest) -> DecodeBudget | None:
    """The stream's bound on one row group: ``request.max_unit_bytes`` (prefetch_bytes)."""
    limit = request.max_unit_bytes
    if limit is None:
        return None
    return DecodeBudget(
        limit,
        lambda least: (
            f"more than the readahead may hold (StreamOptions.prefetch_bytes={limit:,}); a "
            f"row group is decoded whole: raise prefetch_bytes to at least {least:,} to read it"
        ),
    )


def check_plans(file: FileRef, plans: Sequence[RowGroupPlan], budget: DecodeBudget | None) -> None:
    """A ``DecodeError`` if the rows of ``plans`` surely decode past ``budget`` (by their
    flat floor, ``RowGroupPlan.least_decoded``): at the plan, before any byte is read."""
    if budget is None:
        return
    for group in [plans] if budget.whole_file else [[p] for p in plans]:
        least = sum(p.least_decoded for p in group)
        if least > budget.limit:
            rows = sum(p.num_rows for p in group)
            raise _over_budget(file, group, least, f"{rows:,} rows", budget)


def check_fetched(
    file: FileRef,
    footer: ParquetFooter,
    plans: Sequence[RowGroupPlan],
    fetched: Sequence[Mapping[tuple[int, int], BufferLike]],
    budget: DecodeBudget | None,
) -> None:
    """A ``DecodeError`` if ``plans`` (with their fetched buffers, as ``decode_row_group``
    takes them) surely decode past ``budget``: their flat floor plus the values their list
    columns' pages announce (``least_list_bytes``), before they are decoded."""
    if budget is None:
        return
    pairs = list(zip(plans, fetched, strict=True))
    for group in [pairs] if budget.whole_file else [[pair] for pair in pairs]:
        lists = sum(least_list_bytes(footer, p, buffers) for p, buffers in group)
        least = sum(p.least_decoded for p, _ in group) + lists
        if least > budget.limit:
            why = f"{lists:,} bytes of them the values its list columns' pages announce"
            raise _over_budget(file, [p for p, _ in group], least, why, budget)


def _over_budget(
    file: FileRef, plans: Sequence[RowGroupPlan], least: int, why: str, budget: DecodeBudget
) -> DecodeError:
    """The error of row groups that surely decode to more than ``budget``."""
    what = file.path if budget.whole_file else f"{file.path}: row group {plans[0].row_group}"
    return DecodeError(
        f"{what} decodes to at least {least:,} bytes ({why}), {budget.explain(least)} ({file.url})"
    )


def _least_row_bytes(footer: ParquetFooter, indices: Sequence[int]) -> int:
    """Bytes each row of the leaf columns ``indices`` decodes to, at the least."""
    schema = footer.metadata.schema
    total = 0
    for i in indices:
        column = schema.column(i)
        if column.max_repetition_level > 0:  # a list may be empty: no bound per row
            continue
        total += _value_bytes(column)
    return total


_T = TypeVar("_T")


class Parallel(Protocol):
    """Runs independent calls side by side and returns their results in order: how a
    decode may spread one row group's column groups over threads. The engine gives its
    decode threads (``aiostream_hf._decode_pool.run_all``); nothing in ``formats`` owns
    a thread. An exception of a call is raised (after the others end)."""

    def __call__(self, calls: Sequence[Callable[[], _T]], /) -> list[_T]: ...


_PARALLEL: ContextVar[Parallel | None] = ContextVar("aiostream_hf_parquet_parallel", default=None)


@contextmanager
def parallel_parts(run: Parallel | None) -> Iterator[None]:
    """Within this block (on this thread, in this context), ``decode_row_group`` (and so
    ``ParquetDecoder.decode``) decodes a large row group's column groups through ``run``;
    outside, or with None, all its columns on the calling thread at once."""
    token = _PARALLEL.set(run)
    try:
        yield
    finally:
        _PARALLEL.reset(token)


def decode_row_group(
    footer: ParquetFooter,
    plan: RowGroupPlan,
    buffers: Mapping[tuple[int, int], BufferLike],
    *,
    filter: pc.Expression | None = None,
    verify_checksums: bool = True,
) -> pa.Table:
    """Decode one planned row group from fetched buffers; CPU-bound, run it in a thread.

    ``buffers`` maps file byte ranges ``(start, end)`` to their bytes and must
    cover ``plan.ranges`` (the ranges themselves, or any larger or differently
    cut ones). They are read in place, never copied, and the table does not
    refer to them: they can be freed once this returns. ``filter`` must be the
    one given to ``plan_row_groups``. The table keeps the schema's key-value
    metadata. Within ``parallel_parts(run)``, a large row group is decoded in column
    groups through ``run`` (the engine's threads), joined before this returns; else on
    the calling thread. ``verify_checksums``: check the CRC of every page that has one;
    a mismatch (the bytes changed since they were written) is a ``DecodeError``.
    """
    run = _PARALLEL.get()
    groups = _column_groups(footer, plan) if run is not None else [list(plan.read_columns)]
    read = partial(
        _read_columns,
        footer,
        plan.row_group,
        batch=_batch_rows(footer, plan),
        buffers=buffers,
        verify_checksums=verify_checksums,
    )
    try:
        if len(groups) == 1:
            table = read(groups[0])
        else:
            assert run is not None
            parts = run([partial(read, group) for group in groups])
            fields = {field.name: (part, field) for part in parts for field in part.schema}
            table = pa.Table.from_arrays(
                [fields[name][0].column(name) for name in plan.read_columns],
                schema=pa.schema(
                    [fields[name][1] for name in plan.read_columns],
                    metadata=parts[0].schema.metadata,
                ),
            )
    except (pa.ArrowException, OSError) as exc:
        raise DecodeError(
            f"cannot decode row group {plan.row_group} of {footer.name}: {exc}"
        ) from exc
    if table.num_rows != plan.num_rows:
        raise DecodeError(
            f"{footer.name} is corrupt: row group {plan.row_group} decoded to "
            f"{table.num_rows} rows, but its footer says {plan.num_rows}"
        )
    if filter is not None:
        try:
            table = table.filter(filter)
        except pa.ArrowException as exc:
            raise SourceError(
                f"filter {filter} cannot be applied to row group {plan.row_group} of "
                f"{footer.name} ({exc}); plan the row groups with the same filter"
            ) from exc
    if table.column_names != list(plan.columns):
        table = table.select(list(plan.columns))
    return table


# -- helpers ---------------------------------------------------------------------------


def _batch_rows(footer: ParquetFooter, plan: RowGroupPlan) -> int:
    """The rows pyarrow is asked for at once when it decodes ``plan``'s row group
    (``_read_columns`` bounds it further for the columns each thread decodes).

    A row group is cut into equal batches of about ``_BATCH_BYTES`` decoded (by the
    footer's uncompressed sizes; at least ``_MIN_SPLIT_ROWS`` rows): Arrow grows a
    column's buffers as it decodes, and buffers of a few MiB are grown in memory the
    allocator has at hand, where one buffer of a whole row group is grown into fresh
    pages and copied as it grows. The batches of every column group are cut at the
    same rows.
    """
    rows = int(footer.metadata.row_group(plan.row_group).num_rows)
    parts = max(1, -(-plan.uncompressed // _BATCH_BYTES))
    return max(1, min(rows, max(_MIN_SPLIT_ROWS, -(-rows // parts))))


def _read_columns(
    footer: ParquetFooter,
    row_group: int,
    columns: Sequence[str],
    *,
    batch: int,
    buffers: Mapping[tuple[int, int], BufferLike],
    verify_checksums: bool,
) -> pa.Table:
    """Decode some columns of a row group on this thread, ``batch`` rows at a time
    (``_batch_rows``) at the most; the table has a chunk per batch.

    pyarrow wraps what a Python file returns in buffers that take the GIL when
    they are freed; with ``use_threads=True`` Arrow's own worker threads free
    them after the read returns, and one that does so while the interpreter
    exits aborts the process. So pyarrow decodes on the calling thread, and
    ``decode_row_group`` spreads columns over Python threads that it joins.

    pyarrow sizes its buffers by the rows it is asked for, so asking for the
    footer's row count at once lets a footer that says 2**40 rows over a few pages
    allocate terabytes. A batch is at most ``_BATCH_ROWS_PER_BYTE`` rows per byte of
    these columns' chunks (at least ``_MIN_BATCH_ROWS``), and a lying count ends
    with the rows the pages hold (``decode_row_group`` then refuses them).
    """
    meta = footer.metadata.row_group(row_group)
    chunk_bytes = sum(
        meta.column(i).total_compressed_size for c in columns for i in footer.leaf_columns[c]
    )
    batch = min(batch, max(_MIN_BATCH_ROWS, _BATCH_ROWS_PER_BYTE * chunk_bytes))
    native = pa.PythonFile(RangeFile(footer.name, footer.file_size, buffers), mode="r")
    try:
        with pq.ParquetFile(
            native,
            metadata=footer.metadata,
            pre_buffer=False,
            page_checksum_verification=verify_checksums,
        ) as pf:
            names = list(columns)
            batches = list(
                pf.iter_batches(batch, row_groups=[row_group], columns=names, use_threads=False)
            )
            if not batches:
                return pf.schema_arrow.empty_table().select(names)
            return pa.Table.from_batches(batches)
    finally:
        native.close()


def _column_groups(footer: ParquetFooter, plan: RowGroupPlan) -> list[list[str]]:
    """Split the columns to read into groups of similar decoded size, one per thread
    (as many as the cores this process may use, each of at least _PARALLEL_MIN_BYTES)."""
    row_group = footer.metadata.row_group(plan.row_group)
    sizes = {
        name: sum(row_group.column(i).total_uncompressed_size for i in footer.leaf_columns[name])
        for name in plan.read_columns
    }
    total = sum(sizes.values())
    count = min(usable_cpus(), len(sizes), total // _PARALLEL_MIN_BYTES)
    if count <= 1:
        return [list(plan.read_columns)]
    groups: list[list[str]] = [[] for _ in range(count)]
    loads = [0] * count
    for name in sorted(sizes, key=sizes.__getitem__, reverse=True):
        lightest = loads.index(min(loads))
        groups[lightest].append(name)
        loads[lightest] += sizes[name]
    return [group for group in groups if group]


def _resolve_columns(footer: ParquetFooter, columns: Sequence[str] | None) -> tuple[str, ...]:
    available = footer.schema.names
    if columns is None:
        return tuple(available)
    if isinstance(columns, str):
        raise SourceError(f"columns must be a sequence of names, not the string {columns!r}")
    unknown = [c for c in columns if c not in footer.leaf_columns]
    if unknown:
        raise SourceError(
            f"no column {unknown[0]!r} in {footer.name}: columns are {', '.join(available)}"
        )
    return tuple(dict.fromkeys(columns))


def _filter_columns(footer: ParquetFooter, filter: pc.Expression) -> tuple[str, ...]:
    """The top-level columns ``filter`` refers to.

    pyarrow has no public walk over an Expression, so this asks which columns
    cannot be removed from an empty table of the schema without the filter
    failing to bind: a bisection, about 2k*log2(n) binds for k of n columns.
    """
    empty = footer.schema.empty_table()
    try:
        empty.filter(filter)
    except pa.ArrowException as exc:
        raise _filter_error(footer, filter, exc) from exc

    def binds_without(names: list[str]) -> bool:
        try:
            empty.drop_columns(names).filter(filter)
        except pa.ArrowException:
            return False
        return True

    def needed(names: list[str]) -> list[str]:
        if not names or binds_without(names):
            return []
        if len(names) == 1:
            return names
        middle = len(names) // 2
        return needed(names[:middle]) + needed(names[middle:])

    return tuple(needed(list(dict.fromkeys(empty.column_names))))


def _filter_error(footer: ParquetFooter, filter: pc.Expression, exc: Exception) -> SourceError:
    columns = ", ".join(footer.schema.names)
    return SourceError(
        f"filter {filter} cannot be applied to {footer.name} (columns are {columns}): {exc}"
    )


def _needs_parquet_816_padding(created_by: str | None) -> bool:
    """Whether Arrow pads column chunk reads of this writer (parquet-mr before 1.2.9)."""
    if not created_by or not created_by.startswith("parquet-mr"):
        return False
    match = _PARQUET_MR_VERSION.match(created_by)
    if match is None:
        return True  # a parquet-mr version Arrow cannot order: pad, at worst 100 bytes more
    return tuple(int(part) for part in match.groups()) < (1, 2, 9)


def _chunk_range(
    footer: ParquetFooter, row_group: int, chunk: pq.ColumnChunkMetaData, padding: int
) -> tuple[int, int]:
    """The bytes pyarrow reads for one column chunk (as Arrow's ComputeColumnChunkRange)."""
    start = int(chunk.data_page_offset)
    dictionary = chunk.dictionary_page_offset
    if chunk.has_dictionary_page and dictionary is not None and 0 < dictionary < start:
        start = int(dictionary)
    end = start + int(chunk.total_compressed_size)
    # Column chunks lie between the leading magic and the footer.
    data_end = footer.file_size - (len(footer.metadata_file) - len(_MAGIC))  # footer starts
    if start < len(_MAGIC) or end < start or end > data_end:
        raise DecodeError(
            f"{footer.name} is corrupt: column chunk {chunk.path_in_schema!r} of row group "
            f"{row_group} claims bytes [{start}, {end}) of a {footer.file_size}-byte file "
            f"whose column data lies in [{len(_MAGIC)}, {data_end})"
        )
    if chunk.total_uncompressed_size < 0 or chunk.num_values < 0:
        raise DecodeError(
            f"{footer.name} is corrupt: column chunk {chunk.path_in_schema!r} of row group "
            f"{row_group} says {chunk.total_uncompressed_size} bytes uncompressed and "
            f"{chunk.num_values} values"
        )
    return start, min(end + padding, footer.file_size)


def _merge(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


def piece_buffers(
    ranges: Sequence[tuple[int, int]], pieces: Sequence[Sequence[tuple[int, BufferLike]]]
) -> dict[tuple[int, int], BufferLike]:
    """The buffers of ``decode_row_group`` from ``ByteSource.read_pieces``: each piece
    ``(offset, bytes)`` of each range, keyed by the bytes it holds."""
    out: dict[tuple[int, int], BufferLike] = {}
    for (_, end), parts in zip(ranges, pieces, strict=True):
        for k, (start, data) in enumerate(parts):
            out[(start, parts[k + 1][0] if k + 1 < len(parts) else end)] = data
    return out


async def read_footer(
    source: ByteSource, file: FileRef, name: str
) -> tuple[ParquetFooter, bytes, int]:
    """A file's footer from one tail read (and one more read when the footer is longer):
    (footer, the bytes read from the end of the file, the file's size). ``name`` names
    the file in errors."""
    tail, size = await source.read_tail(file, TAIL_READ_SIZE)
    needed = footer_length(tail, size, name)
    if needed > len(tail):
        (head,) = await source.read_ranges(file, [(size - needed, size - len(tail))])
        tail = head + tail
    return parse_footer(tail, size, name), tail, size


@dataclass(frozen=True)
class ParquetUnit(Unit):
    """One row group of one file, with the footer it was planned from."""

    footer: ParquetFooter | None = None
    plan: RowGroupPlan | None = None


class ParquetDecoder(Decoder[ParquetUnit]):
    """Parquet: one tail read for the footer, then the selected column chunks per row group."""

    name = "parquet"
    extensions = (".parquet", ".parq")
    joins_units = True

    def head_range(self, file: FileRef, limit: int) -> tuple[int, int] | None:
        """The column chunks start after the 4-byte magic: from there up to ``limit``
        bytes, ending before the tail read (which holds the footer). None for a limit
        below the tail read's size: a request for so few bytes saves nothing."""
        if file.size is None or limit < TAIL_READ_SIZE:
            return None
        end = min(len(_MAGIC) + limit, file.size - TAIL_READ_SIZE)
        return (len(_MAGIC), end) if end > len(_MAGIC) else None

    async def plan(
        self, file: FileRef, source: ByteSource, request: ReadRequest
    ) -> list[ParquetUnit]:
        footer, _, _ = await read_footer(source, file, file.url)
        return self.units(footer, file, request, readahead_budget(request))

    def units(
        self,
        footer: ParquetFooter,
        file: FileRef,
        request: ReadRequest,
        budget: DecodeBudget | None,
    ) -> list[ParquetUnit]:
        """The units of a file whose footer is read: its row groups planned for
        ``request``, refused if they surely decode past ``budget`` (``check_plans``)."""
        plans = plan_row_groups(footer, request.columns, filter=request.filter)
        check_plans(file, plans, budget)
        return [
            ParquetUnit(
                file,
                p.row_group,
                p.nbytes,
                p.num_rows,
                decoded=max(p.uncompressed, p.least_decoded),
                footer=footer,
                plan=p,
            )
            for p in plans
        ]

    async def fetch(
        self, unit: ParquetUnit, source: ByteSource
    ) -> dict[tuple[int, int], BufferLike]:
        (fetched,) = await self.fetch_many([unit], source)
        return fetched

    async def fetch_many(
        self, units: Sequence[ParquetUnit], source: ByteSource
    ) -> list[dict[tuple[int, int], BufferLike]]:
        """The column chunks of ``units`` (of one file) in one ``read_pieces`` call: the
        fetcher asks for ranges side by side in one request. A range whose bytes a
        stream already holds in part (its tail read, with the footer; a head) comes in
        pieces, the decode reading them as one (joining a range cut in two on its own
        thread), so that no byte is fetched twice."""
        ranges: list[tuple[int, tuple[int, int]]] = []  # (unit's place, range)
        for i, unit in enumerate(units):
            assert unit.plan is not None
            ranges += [(i, r) for r in unit.plan.ranges]
        out: list[dict[tuple[int, int], BufferLike]] = [{} for _ in units]
        if ranges:
            got = await source.read_pieces(units[0].file, [r for _, r in ranges])
            for (i, r), pieces in zip(ranges, got, strict=True):
                out[i].update(piece_buffers([r], [pieces]))
        return out

    def decode(
        self,
        unit: ParquetUnit,
        fetched: Mapping[tuple[int, int], BufferLike],
        request: ReadRequest,
    ) -> pa.Table:
        assert unit.footer is not None
        assert unit.plan is not None
        check_fetched(unit.file, unit.footer, [unit.plan], [fetched], readahead_budget(request))
        return decode_row_group(
            unit.footer,
            unit.plan,
            fetched,
            filter=request.filter,
            verify_checksums=request.verify_checksums,
        )


def decode_units(
    footer: ParquetFooter,
    units: Sequence[ParquetUnit],
    fetched: Sequence[Mapping[tuple[int, int], BufferLike]],
    request: ReadRequest,
    budget: DecodeBudget | None,
) -> pa.Table:
    """A table read whole: ``units`` (``ParquetDecoder.units`` of one file, fetched by
    ``fetch_many``) checked against ``budget`` together (``check_fetched``), then decoded
    and joined; with no unit, an empty table of the columns asked for."""
    plans = [unit.plan for unit in units if unit.plan is not None]
    if not plans:
        names = list(request.columns) if request.columns is not None else footer.schema.names
        return pa.schema([footer.schema.field(n) for n in names]).empty_table()
    check_fetched(units[0].file, footer, plans, fetched, budget)
    tables = [
        decode_row_group(
            footer, plan, buffers, filter=request.filter, verify_checksums=request.verify_checksums
        )
        for plan, buffers in zip(plans, fetched, strict=True)
    ]
    return pa.concat_tables(tables)
