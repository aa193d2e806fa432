"""No byte from a server or a file is trusted: crafted MP4, Parquet and TAR inputs.

Each case starts from a valid file made by an ``aiostream_hf.testing`` maker and
patches a few bytes: a count or size that would make a reader allocate gigabytes,
one that points outside the file, tables that disagree, a page whose CRC no longer
matches, values Python cannot hold. Each must raise ``DecodeError`` naming the file
and the value, at once and without allocating: the bombs also run in a subprocess
whose address space is capped at 1 GiB above what it uses when it starts.
"""

from __future__ import annotations

import io
import json
import logging
import os
import struct
import subprocess
import sys
import tarfile
import textwrap
import tracemalloc
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset

import aiostream_hf as ash
import aiostream_hf.webdataset as ashwds
from aiostream_hf import _mp4, video
from aiostream_hf._exceptions import DecodeError
from aiostream_hf.formats import _tar as tar_module
from aiostream_hf.formats.parquet import (
    MAX_FOOTER_SIZE,
    TAIL_READ_SIZE,
    decode_row_group,
    footer_length,
    parse_footer,
    plan_row_groups,
)
from aiostream_hf.formats.webdataset import (
    MAX_EXTENDED_HEADER_SIZE,
    SampleGrouper,
    TarReader,
    iter_samples,
)
from aiostream_hf.testing import (
    HubServer,
    make_repo,
    make_text_parquet,
    make_video,
    make_webdataset_shards,
)

FAST = dict(backoff_base=0.001, backoff_max=0.01)
U32_MAX = 2**32 - 1


def _options(tmp_path: Path, **kw: Any) -> ash.StreamOptions:
    return ash.StreamOptions(cache_dir=tmp_path / "cache", **{**FAST, **kw})


# -- MP4 -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mp4(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A small faststart H.264 MP4 (moov first) with B-frames: ctts, stss and elst."""
    path = tmp_path_factory.mktemp("mp4") / "valid.mp4"
    make_video(
        path,
        frames=30,
        width=64,
        height=48,
        options={"g": "10", "bf": "2"},
        container_options={"movflags": "faststart"},
    )
    data = path.read_bytes()
    for box in (b"stsz", b"stts", b"stsc", b"stco", b"stss", b"ctts", b"elst", b"moov"):
        assert box in data, box
    return data


def _box(data: bytes | bytearray, kind: bytes) -> int:
    """The offset of the (only) box of this type (its size field)."""
    at = data.index(kind) - 4
    assert data.count(kind) == 1, kind
    return at


def _moov(data: bytes | bytearray) -> tuple[bytes, int]:
    """The moov box's bytes, and the file's size."""
    at = _box(data, b"moov")
    (size,) = struct.unpack_from(">I", data, at)
    return bytes(data[at : at + size]), len(data)


def _parse(data: bytes | bytearray, name: str = "bomb.mp4") -> Any:
    moov, size = _moov(data)
    return _mp4.parse_moov(moov, name, size)


def _patched(data: bytes, kind: bytes, offset: int, fmt: str, *values: int) -> bytearray:
    """``data`` with ``values`` packed at ``offset`` bytes into the box of this type."""
    out = bytearray(data)
    struct.pack_into(fmt, out, _box(out, kind) + offset, *values)
    return out


# (box, offset into the box, format, value, what the message says)
MP4_BOMBS = [
    # stsz with a uniform size: 20 bytes whatever the count, np.full(count) was 32 GiB
    pytest.param(b"stsz", 12, ">II", (1, U32_MAX), r"'stsz'.* 4294967295 samples, over MAX_SAMPLES",
                 id="stsz-uniform-2**32"),
    pytest.param(b"stsz", 12, ">II", (1000, 1_000_000),
                 r"'stsz'.* 1000000 samples of 1000 bytes \(1000000000 bytes\), but the file has",
                 id="stsz-uniform-past-file"),
    pytest.param(b"stsz", 16, ">I", (10**9,), r"'stsz'.* 1000000000 samples, over MAX_SAMPLES",
                 id="stsz-count-1e9"),
    pytest.param(b"stsz", 16, ">I", (_mp4.MAX_SAMPLES,),
                 r"'stsz'.* says 8388608 samples of 4 bytes \(33554432 bytes\), but holds",
                 id="stsz-count-past-box"),
    # stts: the entry count, then one run's sample count (np.repeat was 7.5-32 GiB)
    pytest.param(b"stts", 12, ">I", (10**9,), r"'stts'.* says 1000000000 entries of 8 bytes",
                 id="stts-entries-1e9"),
    pytest.param(b"stts", 16, ">I", (U32_MAX,), r"'stts'.* describes 429496\d{4} samples, but the "
                 r"video track has 30", id="stts-run-2**32"),
    pytest.param(b"ctts", 12, ">I", (U32_MAX,), r"'ctts'.* says 4294967295 entries of 8 bytes",
                 id="ctts-entries-2**32"),
    pytest.param(b"ctts", 16, ">I", (U32_MAX,), r"'ctts'.* describes 429496\d{4} samples",
                 id="ctts-run-2**32"),
    pytest.param(b"stco", 12, ">I", (U32_MAX,), r"'stco'.* says 4294967295 entries of 4 bytes",
                 id="stco-entries-2**32"),
    pytest.param(b"stsc", 12, ">I", (10**9,), r"'stsc'.* says 1000000000 entries of 12 bytes",
                 id="stsc-entries-1e9"),
    pytest.param(b"stss", 12, ">I", (U32_MAX,), r"'stss'.* says 4294967295 entries of 4 bytes",
                 id="stss-entries-2**32"),
    pytest.param(b"elst", 12, ">I", (U32_MAX,), r"'elst'.* says 4294967295 entries of 12 bytes",
                 id="elst-entries-2**32"),
    # a box larger than its parent
    pytest.param(b"stts", 0, ">I", (10**9,), r"box 'stts' at byte \d+ has size 1000000000",
                 id="box-past-parent"),
    # a chunk offset past the end of the file: the samples lie outside it
    pytest.param(b"stco", 16, ">I", (2**31,), r"sample 0 of the video track lies at bytes "
                 r"\[2147483648, \d+\), but the file has \d+ bytes", id="chunk-past-file"),
]  # fmt: skip


@pytest.mark.parametrize(("box", "offset", "fmt", "values", "match"), MP4_BOMBS)
def test_mp4_counts_and_sizes_are_checked(
    mp4: bytes, box: bytes, offset: int, fmt: str, values: tuple[int, ...], match: str
) -> None:
    data = _patched(mp4, box, offset, fmt, *values)
    with pytest.raises(DecodeError, match=rf"^bomb\.mp4: .*{match}"):
        _parse(data)


def test_mp4_valid_file_parses(mp4: bytes) -> None:
    table = _parse(mp4, "valid.mp4")
    assert isinstance(table, _mp4.SampleTable)
    assert table.sample_count == 30


def test_mp4_a_huge_samples_per_chunk_is_trimmed_without_allocating(mp4: bytes) -> None:
    """stsc's samples-per-chunk of 2**32-1 puts every sample in the first chunk: the
    table is cut to the samples stsz has, nothing larger is made."""
    data = _patched(mp4, b"stsc", 16 + 4, ">I", U32_MAX)  # entry 0: samples per chunk
    result = _parse(data)  # one track, its samples back to back: the same offsets
    assert isinstance(result, _mp4.SampleTable)
    assert result.sample_count == 30
    assert list(result.offset) == list(_parse(mp4).offset)


def test_mp4_stz2_count_past_its_box(mp4: bytes) -> None:
    """stsz turned into a 16-bit stz2 whose count is past its box: a DecodeError, not
    numpy's ValueError."""
    data = bytearray(mp4)
    at = _box(data, b"stsz")
    data[at + 4 : at + 8] = b"stz2"
    struct.pack_into(">II", data, at + 12, 16, _mp4.MAX_SAMPLES)  # field size, count
    with pytest.raises(
        DecodeError, match=r"^bomb\.mp4: .*'stz2'.* says 8388608 samples of 2 bytes \(16777216 "
    ):
        _parse(data)


def _box_bytes(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def test_mp4_nesting_is_bounded() -> None:
    inner = b""
    for _ in range(5000):
        inner = _box_bytes(b"trak", inner)
    with pytest.raises(DecodeError, match=r"^deep\.mp4: .*nested 33 deep, over MAX_BOX_DEPTH=32"):
        _mp4.parse_moov(_box_bytes(b"moov", inner), "deep.mp4")


def test_mp4_run_tables_must_agree_with_stsz(mp4: bytes) -> None:
    moov, size = _moov(mp4)
    stts = _box(moov, b"stts")
    (count,) = struct.unpack_from(">I", moov, stts + 16)
    data = _patched(mp4, b"stts", 16, ">I", count - 1)  # one sample less than stsz
    with pytest.raises(DecodeError, match=r"'stts' at byte \d+ describes 29 samples.* has 30"):
        _parse(data)


@pytest.mark.anyio
async def test_a_cut_local_mp4_is_a_decode_error(mp4: bytes, tmp_path: Path) -> None:
    """A faststart file cut in its mdat: the index is whole but its samples are not;
    the reader's own fetcher used to raise ValueError for the ranges past the end."""
    path = tmp_path / "cut.mp4"
    path.write_bytes(mp4[: len(mp4) * 2 // 3])
    with pytest.raises(DecodeError, match=r"cut\.mp4: truncated or corrupt MP4: sample \d+ "):
        async with video.open(path):
            pass


# -- the bombs, in a process that cannot allocate a gigabyte ---------------------------------

_CAPPED = textwrap.dedent(
    """
    import resource, sys
    from aiostream_hf import _mp4
    from aiostream_hf.formats.parquet import footer_length
    from aiostream_hf.formats.webdataset import TarReader
    from aiostream_hf._exceptions import DecodeError

    pages = int(open("/proc/self/statm").read().split()[0])
    cap = pages * resource.getpagesize() + (1 << 30)  # 1 GiB above what is mapped now
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    kind, path, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data = open(path, "rb").read()
    try:
        if kind == "mp4":
            _mp4.parse_moov(data, "bomb.mp4", size)
        elif kind == "parquet":
            footer_length(data, size, "bomb.parquet")
        else:
            TarReader("bomb.tar", size=size).feed(data)
    except DecodeError as exc:
        print("DecodeError", exc)
    except MemoryError:
        print("MemoryError")
    """
)


def _run_capped(tmp_path: Path, kind: str, data: bytes, size: int) -> str:
    path = tmp_path / f"input.{kind}"
    path.write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-c", _CAPPED, kind, str(path), str(size)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")
@pytest.mark.parametrize(
    ("box", "offset", "fmt", "values"),
    [
        (b"stsz", 12, ">II", (1, U32_MAX)),
        (b"stts", 16, ">I", (U32_MAX,)),
        (b"ctts", 16, ">I", (U32_MAX,)),
    ],
)
def test_mp4_bombs_allocate_nothing(
    mp4: bytes, tmp_path: Path, box: bytes, offset: int, fmt: str, values: tuple[int, ...]
) -> None:
    moov, size = _moov(_patched(mp4, box, offset, fmt, *values))
    out = _run_capped(tmp_path, "mp4", moov, size)
    assert out.startswith("DecodeError bomb.mp4"), out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")
def test_parquet_and_tar_bombs_allocate_nothing(tmp_path: Path) -> None:
    # A footer that says 4 GiB, in a file the server says is 1 TiB.
    tail = b"\xf0\xff\xff\xffPAR1"
    out = _run_capped(tmp_path, "parquet", tail, 1 << 40)
    assert out.startswith("DecodeError bomb.parquet"), out
    assert "MAX_FOOTER_SIZE" in out
    # A pax header that says 1.5 GiB.
    header = _tar_header("./PaxHeaders/x", 3 << 29, b"x")
    out = _run_capped(tmp_path, "tar", header, 1 << 40)
    assert out.startswith("DecodeError bomb.tar"), out
    assert "1610612736 bytes" in out


# -- Parquet ---------------------------------------------------------------------------------


def test_parquet_footer_over_the_limit(tmp_path: Path) -> None:
    tail = b"\xf0\xff\xff\xffPAR1"
    with pytest.raises(DecodeError, match=r"^big\.parquet .* footer says 4294967288 bytes, over "):
        footer_length(tail, 1 << 40, "big.parquet")
    assert MAX_FOOTER_SIZE < 4294967288


# The Thrift compact protocol, enough to find and rewrite the integers of a footer.
_I16, _I32, _I64, _BYTE, _DOUBLE, _BINARY = 4, 5, 6, 3, 7, 8
_LIST, _SET, _MAP, _STRUCT = 9, 10, 11, 12


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _zigzag(value: int) -> bytes:
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _thrift_ints(data: bytes) -> dict[tuple[int, ...], tuple[int, int]]:
    """(field path, list indices included) -> (start, end) of every integer of a struct."""
    found: dict[tuple[int, ...], tuple[int, int]] = {}

    def value(kind: int, pos: int, path: tuple[int, ...]) -> int:
        if kind in (1, 2):
            return pos
        if kind == _BYTE:
            return pos + 1
        if kind in (_I16, _I32, _I64):
            _, end = _varint(data, pos)
            found[path] = (pos, end)
            return end
        if kind == _DOUBLE:
            return pos + 8
        if kind == _BINARY:
            length, pos = _varint(data, pos)
            return pos + length
        if kind in (_LIST, _SET):
            head = data[pos]
            pos += 1
            size, element = head >> 4, head & 0x0F
            if size == 15:
                size, pos = _varint(data, pos)
            for i in range(size):
                pos = value(element, pos, (*path, i)) if element not in (1, 2) else pos + 1
            return pos
        if kind == _MAP:
            size, pos = _varint(data, pos)
            if size:
                types = data[pos]
                pos += 1
                for i in range(size):
                    pos = value(types >> 4, pos, (*path, i, 0))
                    pos = value(types & 0x0F, pos, (*path, i, 1))
            return pos
        assert kind == _STRUCT, kind
        field = 0
        while True:
            head = data[pos]
            pos += 1
            if head == 0:
                return pos
            delta, kind_ = head >> 4, head & 0x0F
            if delta:
                field += delta
            else:
                raw, pos = _varint(data, pos)
                field = (raw >> 1) ^ -(raw & 1)
            pos = value(kind_, pos, (*path, field))

    value(_STRUCT, 0, ())
    return found


# FileMetaData: 3 num_rows, 4 row_groups; RowGroup: 1 columns, 3 num_rows; ColumnChunk:
# 3 meta_data; ColumnMetaData: 6 total_uncompressed_size, 7 total_compressed_size,
# 9 data_page_offset.
FILE_ROWS = (3,)
GROUP_ROWS = (4, 0, 3)
CHUNK = (4, 0, 1, 0, 3)  # row group 0, column 0 (id)


def _with_footer_int(data: bytes, path: tuple[int, ...], new: int) -> bytes:
    """The file with one integer of its footer rewritten (the footer length follows)."""
    length = footer_length(data[-8:], len(data), "x") - 8
    start = len(data) - 8 - length
    meta = data[start:-8]
    at, end = _thrift_ints(meta)[path]
    meta = meta[:at] + _zigzag(new) + meta[end:]
    return data[:start] + meta + struct.pack("<I", len(meta)) + b"PAR1"


@pytest.fixture(scope="module")
def text_parquet(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, pa.Table]:
    path = tmp_path_factory.mktemp("parquet") / "text.parquet"
    table = make_text_parquet(path, rows=200, min_text=10, max_text=50, compression=None)
    return path.read_bytes(), table


def _footer(data: bytes, name: str) -> Any:
    return parse_footer(data[-TAIL_READ_SIZE:], len(data), name)


def _decode_all(data: bytes, name: str, **kw: Any) -> pa.Table:
    footer = _footer(data, name)
    whole = {(0, len(data)): data}
    tables = [decode_row_group(footer, p, whole, **kw) for p in plan_row_groups(footer)]
    return pa.concat_tables(tables)


def test_parquet_footer_parser_reads_the_real_footer(text_parquet: tuple[bytes, pa.Table]) -> None:
    data, table = text_parquet
    assert _with_footer_int(data, FILE_ROWS, 200) == data  # the walker finds num_rows
    assert _decode_all(data, "text.parquet").equals(table)


DATA_PAGE, DICTIONARY_PAGE = (*CHUNK, 9), (*CHUNK, 11)


@pytest.mark.parametrize(
    ("patches", "match"),
    [
        ({GROUP_ROWS: -5}, r"row group 0 of its footer says -5 rows"),
        ({DATA_PAGE: 1 << 40, DICTIONARY_PAGE: 1 << 40},
         r"column chunk 'id' of row group 0 claims bytes \[1099511627776, "),
        ({(*CHUNK, 7): 1 << 40},
         r"column chunk 'id' of row group 0 claims bytes \[4, 1099511627780"),
        ({DATA_PAGE: 0, DICTIONARY_PAGE: 0},
         r"column chunk 'id' of row group 0 claims bytes \[0, "),
        ({(*CHUNK, 6): -1}, r"column chunk 'id' of row group 0 says -1 bytes uncompressed"),
    ],
)  # fmt: skip
def test_parquet_footer_values_are_checked(
    text_parquet: tuple[bytes, pa.Table], patches: dict[tuple[int, ...], int], match: str
) -> None:
    data = text_parquet[0]
    for path, value in patches.items():
        data = _with_footer_int(data, path, value)
    with pytest.raises(DecodeError, match=rf"^lying\.parquet.*{match}"):
        footer = _footer(data, "lying.parquet")
        plan_row_groups(footer)


@pytest.mark.parametrize("total", [10**12, 2**63 - 1, -(2**63), -5, 0])
def test_parquet_file_total_that_its_row_groups_contradict_is_a_warning(
    text_parquet: tuple[bytes, pa.Table], total: int, caplog: pytest.LogCaptureFixture
) -> None:
    """pyarrow ignores the footer's total rows; so does the decode (it sizes nothing:
    each row group's own count bounds its decode, and is checked against its pages)."""
    data, table = text_parquet
    data = _with_footer_int(data, FILE_ROWS, total)
    with caplog.at_level("WARNING", logger="aiostream_hf"):
        footer = _footer(data, "lying.parquet")
        assert footer.num_rows == 200
        assert _decode_all(data, "lying.parquet").equals(table)
    assert [r.getMessage() for r in caplog.records] == [
        f"lying.parquet: its footer says {total:,} rows, but its 1 row groups hold 200; "
        "reading the row groups' rows, as pyarrow does"
    ] * 2


def test_parquet_chunk_inside_the_footer(text_parquet: tuple[bytes, pa.Table]) -> None:
    data = text_parquet[0]
    near_end = len(data) - 20  # inside the footer, where no column chunk may lie
    for path in (DATA_PAGE, DICTIONARY_PAGE):
        data = _with_footer_int(data, path, near_end)
    with pytest.raises(
        DecodeError,
        match=rf"lying\.parquet is corrupt: column chunk 'id' of row group 0 claims bytes "
        rf"\[{near_end}, \d+\) of a {len(data)}-byte file whose column data lies in \[4, \d+\)",
    ):
        plan_row_groups(_footer(data, "lying.parquet"))


def test_parquet_row_group_with_more_rows_than_its_pages(
    text_parquet: tuple[bytes, pa.Table],
) -> None:
    data = _with_footer_int(text_parquet[0], FILE_ROWS, 1 << 40)
    data = _with_footer_int(data, GROUP_ROWS, 1 << 40)
    with pytest.raises(
        DecodeError,
        match=r"^lying\.parquet is corrupt: row group 0 decoded to 200 rows, but its footer "
        r"says 1099511627776",
    ):
        _decode_all(data, "lying.parquet")


def _checksummed(table: pa.Table, path: Path, *, checksum: bool) -> bytes:
    pq.write_table(
        table,
        path,
        compression="none",
        use_dictionary=False,
        write_page_checksum=checksum,
        write_statistics=False,  # a value in a page header's min/max would be found first
        row_group_size=100,
    )
    return path.read_bytes()


def _flip_in_text(data: bytes, table: pa.Table, row: int) -> bytes:
    """The file with one letter of one text value changed (its page's bytes differ)."""
    value = table.column("text")[row].as_py().encode()
    at = data.index(value)
    flipped = bytearray(data)
    flipped[at] = ord("Q") if flipped[at] != ord("Q") else ord("R")
    return bytes(flipped)


@pytest.mark.parametrize("checksum", [True, False])
def test_parquet_page_checksums(
    text_parquet: tuple[bytes, pa.Table], tmp_path: Path, checksum: bool
) -> None:
    table = text_parquet[1]
    data = _flip_in_text(
        _checksummed(table, tmp_path / "crc.parquet", checksum=checksum), table, 150
    )
    unchecked = _decode_all(data, "crc.parquet", verify_checksums=False)
    assert unchecked.column("text")[150] != table.column("text")[150]  # wrong rows, silently
    if not checksum:  # nothing to verify: nothing changes
        assert _decode_all(data, "crc.parquet").equals(unchecked)
        return
    with pytest.raises(DecodeError, match=r"row group 1 of crc\.parquet: .*(CRC|checksum)"):
        _decode_all(data, "crc.parquet")


@pytest.mark.anyio
async def test_stream_verifies_page_checksums(
    text_parquet: tuple[bytes, pa.Table], tmp_path: Path
) -> None:
    table = text_parquet[1]
    data = _flip_in_text(_checksummed(table, tmp_path / "crc.parquet", checksum=True), table, 150)
    root = tmp_path / "hub"
    make_repo(root, "org/crc", {"data/train.parquet": data})
    with HubServer(root) as hub:
        source = "hf://datasets/org/crc/data/train.parquet"
        s = ash.stream(source, endpoint=hub.endpoint, options=_options(tmp_path))
        with pytest.raises(ash.DecodeError, match=r"row group 1 of .*train\.parquet"):
            async with s:
                async for _ in s:
                    pass
        off = _options(tmp_path, verify_checksums=False)
        async with ash.stream(source, endpoint=hub.endpoint, options=off) as s:
            rows = [row async for row in s]
    assert len(rows) == 200
    assert rows[150]["text"] != table.column("text")[150].as_py()


def _ts_parquet(tmp_path: Path) -> bytes:
    """A text file made by the maker, with a timestamp column one row of which is far
    outside Python's datetime range (year ~146000)."""
    table = make_text_parquet(tmp_path / "base.parquet", rows=50, min_text=5, max_text=10)
    stamps = pa.array([i * 1_000_000 for i in range(49)] + [2**62], pa.timestamp("us"))
    path = tmp_path / "ts.parquet"
    pq.write_table(table.append_column("ts", stamps), path, row_group_size=20)
    return path.read_bytes()


def _bad_utf8_parquet(tmp_path: Path) -> tuple[bytes, int]:
    """A text file made by the maker with one url's bytes patched into invalid UTF-8."""
    table = make_text_parquet(tmp_path / "base.parquet", rows=50, min_text=5, max_text=10)
    path = tmp_path / "utf8.parquet"
    pq.write_table(
        table,
        path,
        compression="none",
        use_dictionary=False,
        write_statistics=False,
        row_group_size=20,
    )
    data = bytearray(path.read_bytes())
    url = table.column("url")[45].as_py().encode()
    at = data.index(url)
    data[at + len(url) - 3] = 0xFF  # in the row id at its end
    return bytes(data), 45


@pytest.mark.anyio
@pytest.mark.parametrize("case", ["timestamp", "utf8"])
async def test_values_python_cannot_hold_are_decode_errors(tmp_path: Path, case: str) -> None:
    if case == "timestamp":
        data, row = _ts_parquet(tmp_path), 49
    else:
        data, row = _bad_utf8_parquet(tmp_path)
    root = tmp_path / "hub"
    make_repo(root, "org/odd", {"data/train.parquet": data})
    with HubServer(root) as hub:
        source = "hf://datasets/org/odd/data/train.parquet"
        opts = _options(tmp_path)
        rows: list[Any] = []
        with pytest.raises(ash.DecodeError, match=r"train\.parquet, row group 2") as caught:
            async with ash.stream(source, endpoint=hub.endpoint, options=opts) as s:
                async for item in s:
                    rows.append(item)
        assert isinstance(caught.value.__cause__, (ValueError, OverflowError))
        assert "output='arrow'" in str(caught.value)
        assert len(rows) == 40  # the row groups before it, whole
        with pytest.raises(ash.DecodeError, match=r"train\.parquet, row group 2"):
            async with ash.stream(source, endpoint=hub.endpoint, options=opts, batch_size=7) as s:
                async for _ in s:
                    pass
        async with ash.stream(source, endpoint=hub.endpoint, options=opts, output="arrow") as s:
            batches = [b async for b in s]
    assert sum(b.num_rows for b in batches) == 50
    assert row >= 40


# -- TAR -------------------------------------------------------------------------------------


def _tar_header(name: str, size: int, kind: bytes = b"0") -> bytes:
    """A ustar header with a valid checksum and any size (base-256 when octal is too small)."""
    buf = bytearray(512)
    buf[0 : len(name)] = name.encode()
    buf[100:108] = b"0000644\0"
    buf[108:116] = b"0000000\0"
    buf[116:124] = b"0000000\0"
    if size < 8**11:
        buf[124:136] = f"{size:011o}\0".encode()
    else:
        buf[124:136] = b"\x80" + size.to_bytes(11, "big")
    buf[136:148] = b"00000000000\0"
    buf[156:157] = kind
    buf[257:263] = b"ustar\0"
    buf[263:265] = b"00"
    buf[148:156] = b" " * 8
    buf[148:156] = f"{sum(buf):06o}\0 ".encode()
    return bytes(buf)


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    (path,) = make_webdataset_shards(tmp_path_factory.mktemp("wds"), shards=1, samples_per_shard=8)
    return path


def _members(data: bytes) -> list[tuple[str, int, int]]:
    """(name, header offset, end) of every member."""
    return [(m.name, m.offset, m.end) for m in TarReader("x").feed(data)]


def test_tar_size_past_the_shard(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    name, at, _ = _members(bytes(data))[5]
    data[at : at + 512] = _tar_header(name, 1 << 30)  # 1 GiB in a shard of some KiB
    reader = TarReader("lying.tar", size=len(data))
    got = reader.feed(bytes(data))  # the members before it are delivered, the error next
    assert [m.name for m in got] == [m[0] for m in _members(shard.read_bytes())[:5]]
    with pytest.raises(
        DecodeError,
        match=rf"^lying\.tar: corrupt TAR header at offset {at}: member {name!r} says "
        rf"1073741824 bytes, past the end of the {len(data)}-byte shard",
    ):
        reader.close()


@pytest.mark.parametrize("kind", [b"x", b"L", b"g"])
def test_tar_extended_header_over_the_limit(kind: bytes) -> None:
    size = MAX_EXTENDED_HEADER_SIZE + 1
    data = _tar_header("././@LongLink", size, kind) + bytes(4096)
    with pytest.raises(
        DecodeError,
        match=rf"^big\.tar: the extended header \({kind.decode()!r}\) at offset 0 has {size} "
        r"bytes, over MAX_EXTENDED_HEADER_SIZE=1048576",
    ):
        TarReader("big.tar").feed(data)


def test_tar_real_long_records_over_the_limit_are_refused() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a.txt")
        info.pax_headers = {"comment": "c" * (MAX_EXTENDED_HEADER_SIZE + 10)}
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(DecodeError, match=r"pax\.tar: the extended header \('x'\) at offset 0"):
        list(iter_samples("pax.tar", [buffer.getvalue()]))


def _tar_member(name: str, data: bytes, kind: bytes = b"0") -> bytes:
    return _tar_header(name, len(data), kind) + data + bytes(-len(data) % 512)


def _pax(**keys: str) -> bytes:
    """A pax header body: records ``"%d %s=%s\\n"`` whose length counts itself."""
    out = b""
    for key, value in keys.items():
        body = f" {key}={value}\n".encode()
        n = len(body)
        while len(str(n)) + len(body) != n:
            n = len(str(n)) + len(body)
        out += str(n).encode() + body
    return out


def _long_name(name: str) -> bytes:
    return _tar_member("././@LongLink", name.encode() + b"\0", b"L")


EXTENDED_CHAINS = {
    "outer L wins over inner L": [_long_name("a.first.txt"), _long_name("b.second.txt")],
    "outer x path wins over L": [_tar_member("p", _pax(path="p.x.txt"), b"x"), _long_name("l.txt")],
    "outer L wins over x path": [_long_name("l.txt"), _tar_member("p", _pax(path="p.txt"), b"x")],
    "outer x size wins": [
        _tar_member("p", _pax(size="3"), b"x"),
        _tar_member("p", _pax(size="700", comment="inner"), b"x"),
    ],
    "global path, then an L": [_tar_member("g", _pax(path="g/g.txt"), b"g"), _long_name("l.txt")],
    "an x copies the global path": [
        _tar_member("g", _pax(path="ga.txt"), b"g"),
        _tar_member("p", _pax(comment="no path"), b"x"),
        _tar_member("g", _pax(path="gb.txt"), b"g"),
    ],
    "a global header inside a chain": [
        _tar_member("p", _pax(comment="no path"), b"x"),
        _tar_member("g", _pax(path="g.txt"), b"g"),
        _tar_member("p", _pax(mtime="1"), b"x"),
    ],
}


@pytest.mark.parametrize("chain", EXTENDED_CHAINS.values(), ids=EXTENDED_CHAINS.keys())
def test_tar_extended_header_chains_name_members_as_tarfile(chain: list[bytes]) -> None:
    """Only what takes effect is kept of a run of L/x/g headers: the names, sizes and
    offsets must still be tarfile's (the outermost header wins)."""
    data = b"".join(chain) + _tar_member("short.txt", b"abc") + _tar_member("z.txt", b"z")
    data += bytes(1024)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
        expected = []
        for info in tar:
            body = tar.extractfile(info)
            assert body is not None
            expected.append((info.name, body.read()))
    got = TarReader("chain.tar").feed(data)
    assert [(m.name, m.data) for m in got] == expected
    assert got[1].offset == got[0].end


def test_tar_global_pax_keys_are_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A global header with many keys must not make each later member rescan (or copy)
    them: the keys looked at stay the global ones once plus each member's own."""
    scanned = 0
    has_sparse = tar_module._has_sparse

    def spy(headers: dict[str, str]) -> bool:
        nonlocal scanned
        scanned += len(headers)
        return has_sparse(headers)

    monkeypatch.setattr(tar_module, "_has_sparse", spy)
    keys = {f"k{i}": "" for i in range(2000)}
    members = 50
    data = _tar_member("g", _pax(**keys), b"g")
    for i in range(members):
        data += _tar_member("p", _pax(path=f"s{i}.txt"), b"x") + _tar_member("short", b"x")
    got = TarReader("global.tar").feed(data + bytes(1024))
    assert [m.name for m in got] == [f"s{i}.txt" for i in range(members)]
    assert scanned <= len(keys) + members


def test_tar_extended_header_chain_memory_is_one_record() -> None:
    """3,000 long-name headers of 1 MiB held 3 GiB: now a reader keeps the one that takes
    effect (the first read) while the run goes on, whatever its length."""
    record = 64 << 10
    names = [f"{i:03d}".ljust(record - 5, "n") + ".txt" for i in range(40)]
    chain = b"".join(_long_name(name) for name in names)
    comment = "c" * record
    chain += b"".join(_tar_member("p", _pax(comment=comment), b"x") for _ in range(40))
    reader = TarReader("chain.tar")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert reader.feed(chain) == []  # 5 MiB of headers, no member yet
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 4 * record  # the first name, not 80 records
    (member,) = reader.feed(_tar_member("short.txt", b"x") + bytes(1024))
    assert member.name == names[0]
    assert member.offset == 0


def _wds_reference(path: Path) -> list[dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        dataset = webdataset.WebDataset(str(path), shardshuffle=False, empty_check=False)
        samples = list(dataset)
    for sample in samples:
        sample.pop("__local_path__", None)
        sample.pop("__url__", None)
    return samples


def _corrupt_at_sample(shard: Path, tmp_path: Path, index: int) -> tuple[Path, bytes, int]:
    """The shard with a wrong checksum in the first header of sample ``index``: its
    path, bytes, and the offset of that header."""
    data = bytearray(shard.read_bytes())
    at = _sample_starts(bytes(data))[index]
    data[at + 148 : at + 156] = b"0000000\0"
    path = tmp_path / "corrupt.tar"
    path.write_bytes(bytes(data))
    return path, bytes(data), at


def _sample_starts(data: bytes) -> list[int]:
    grouper = SampleGrouper("x")
    starts: list[int] = []
    last = None
    for member in TarReader("x").feed(data):
        key = grouper.key_of(member.name)
        if not starts or key != last:
            starts.append(member.offset)
        last = key
    return starts


def _strip(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.items() if k != "__url__"} for s in samples]


@pytest.mark.parametrize("block", [511, 4096, None])
def test_tar_the_sample_before_a_corrupt_header_is_delivered(
    shard: Path, tmp_path: Path, block: int | None
) -> None:
    """As webdataset (whose tarfile stops at the corrupt header): samples 0-3 whole,
    the 4th included, then the error."""
    path, data, at = _corrupt_at_sample(shard, tmp_path, 4)
    blocks: Iterator[bytes] = (
        iter([data]) if block is None else (data[i : i + block] for i in range(0, len(data), block))
    )
    got: list[dict[str, Any]] = []
    with pytest.raises(DecodeError, match=rf"corrupt\.tar: corrupt TAR header at offset {at}"):
        for sample in iter_samples("corrupt.tar", blocks):
            got.append(sample)
    reference = _wds_reference(path)
    assert len(reference) == 4
    assert _strip(got) == reference


def test_tar_a_sample_cut_inside_its_member_is_not_delivered(shard: Path) -> None:
    data = shard.read_bytes()
    members = _members(data)
    name, at, _ = members[7]  # a member in the middle of sample 2 (3 members each)
    got: list[dict[str, Any]] = []
    with pytest.raises(DecodeError, match=r"truncated TAR shard"):
        for sample in iter_samples("cut.tar", [data[: at + 600]]):
            got.append(sample)
    key = SampleGrouper("x").key_of(name)
    assert [s["__key__"] for s in got] == [SampleGrouper("x").key_of(m[0]) for m in members[0:6:3]]
    assert key not in [s["__key__"] for s in got]


@pytest.mark.anyio
@pytest.mark.parametrize("policy", ["raise", "skip_shard"])
async def test_stream_delivers_the_held_sample_and_counts_the_skip(
    shard: Path, tmp_path: Path, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, data, at = _corrupt_at_sample(shard, tmp_path, 4)
    root = tmp_path / "hub"
    make_repo(root, "org/wds", {"a.tar": data, "b.tar": shard})
    with HubServer(root) as hub:
        urls = [hub.url("org/wds", "a.tar"), hub.url("org/wds", "b.tar")]
        s = ashwds.stream(urls, on_error=policy, options=_options(tmp_path))  # type: ignore[arg-type]
        got: list[dict[str, Any]] = []
        if policy == "raise":
            match = rf"a\.tar: corrupt TAR header at offset {at}"
            with pytest.raises(ash.DecodeError, match=match):
                async with s:
                    async for sample in s:
                        got.append(sample)
            assert len(got) == 4
            return
        with caplog.at_level(logging.WARNING, logger="aiostream_hf.webdataset"):
            async with s:
                got = [sample async for sample in s]
                stats = s.statistics()
    assert len(got) == 4 + 8
    assert stats.damaged_files == 1
    assert stats.skipped_samples == 0
    assert any("skipping the rest of the shard" in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
async def test_stream_counts_samples_skipped_by_decode(
    shard: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def fussy(key: str, data: bytes) -> Any:
        if key == ".json" and json.loads(data)["index"] % 3 == 0:
            raise ValueError("not this one")
        return None

    root = tmp_path / "hub"
    make_repo(root, "org/wds", {"a.tar": shard})
    with HubServer(root) as hub:
        url = hub.url("org/wds", "a.tar")
        s = ashwds.stream(url, decode=fussy, on_error="skip_shard", options=_options(tmp_path))
        with caplog.at_level(logging.WARNING, logger="aiostream_hf.webdataset"):
            async with s:
                got = [sample async for sample in s]
                stats = s.statistics()
    assert len(got) == 8 - 3  # indices 0, 3 and 6 fail
    assert stats.skipped_samples == 3
    assert stats.damaged_files == 0
