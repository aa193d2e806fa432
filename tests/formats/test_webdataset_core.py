"""The I/O-free WebDataset core: incremental TAR reading, sample grouping, planning.

Shards are written with ``webdataset.TarWriter`` and with ``tarfile`` in every
format; each is fed to ``TarReader`` + ``SampleGrouper`` in blocks of many
sizes, exactly as the async layer feeds the blocks of one long GET, and the
samples are compared with what ``webdataset.WebDataset`` yields for the same
file. Differences we keep on purpose: no ``__local_path__`` (webdataset adds
it for local files only), and ``__url__`` is the URL the reader was given (the
tests give the same string webdataset was given, so it compares equal).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import gzip
import io
import json
import random
import struct
import tarfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pytest
import webdataset

from aiostream_hf import formats
from aiostream_hf._exceptions import ClosedResourceError, DecodeError, SourceError
from aiostream_hf._models import FileRef
from aiostream_hf.formats import ReadRequest, decoder_for
from aiostream_hf.formats.webdataset import (
    SampleGrouper,
    TarMember,
    TarReader,
    WebDatasetDecoder,
    base_plus_ext,
    iter_samples,
    samples_to_table,
)
from aiostream_hf.testing import make_webdataset_shards

BLOCK_SIZES = [1, 7, 512, 513, 65536, None, "random"]  # None: the whole shard at once

Sample = dict[str, Any]


# -- helpers -------------------------------------------------------------------------------


def reference(urls: str | Sequence[str]) -> list[Sample]:
    """What ``webdataset.WebDataset`` yields, without ``__local_path__``."""
    failure: str | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset 1.0.2 leaks file handles
        dataset = webdataset.WebDataset(urls, shardshuffle=False, empty_check=False)
        try:
            samples = list(dataset)
        except ValueError as exc:
            # Not re-raised from here: its traceback would keep webdataset's open file
            # alive past this block, and its ResourceWarning would fail a later test.
            failure = str(exc)
        finally:
            del dataset
        gc.collect()
    if failure is not None:
        raise ValueError(failure)
    for sample in samples:
        assert sample.pop("__local_path__") == sample["__url__"]
    return samples


def blocks(data: bytes, size: int | str | None, seed: int = 0) -> Iterator[memoryview]:
    """``data`` cut into blocks of ``size`` bytes, or of random sizes (1 B to 70 KiB)."""
    view = memoryview(data)
    if size is None:
        yield view
        return
    rng = random.Random(seed)
    pos = 0
    while pos < len(view):
        step = size if isinstance(size, int) else rng.choice([1, 2, 100, 511, 512, 4096, 70000])
        yield view[pos : pos + step]
        pos += step


def read_members(
    url: str, data: bytes, size: int | str | None = None, **kw: Any
) -> list[TarMember]:
    reader = TarReader(url, **kw)
    members = [m for block in blocks(data, size) for m in reader.feed(block)]
    reader.close()
    return members


def feed_all(
    reader: TarReader, data: bytes, size: int | None, into: list[TarMember], close: bool = False
) -> None:
    for block in blocks(data, size):
        into += reader.feed(block)
    if close:
        reader.close()


def push_all(grouper: SampleGrouper, members: Sequence[TarMember]) -> None:
    for member in members:
        grouper.push(member)


def ours(url: str, data: bytes, size: int | str | None = None) -> list[Sample]:
    return list(iter_samples(url, blocks(data, size)))


def add(tar: tarfile.TarFile, name: str, data: bytes = b"", **attrs: Any) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_700_000_000
    for key, value in attrs.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if info.isreg() or data else None)


def write_tar(path: Path, fill: Callable[[tarfile.TarFile], None], **kw: Any) -> Path:
    with tarfile.open(path, kw.pop("mode", "w"), **kw) as tar:
        fill(tar)
    return path


def mixed_members(tar: tarfile.TarFile) -> None:
    """Everything a shard may hold: long names, dots, case, meta files, non-regular entries."""
    long_dir = "d" * 60 + "/" + "e" * 60  # 121 chars: a ustar prefix, or a long name
    add(tar, "images", type=tarfile.DIRTYPE, mode=0o755)
    add(tar, "images/a.b.c.jpg", b"jpeg a")
    add(tar, "images/a.TXT", b"caption a")
    add(tar, "images/a.Json", b'{"a": 1}')
    add(tar, "__meta__", b"meta file")
    add(tar, "__index__/shard.json", b"meta folder")
    add(tar, "README", b"no dot")
    add(tar, "link.jpg", type=tarfile.SYMTYPE, linkname="images/a.b.c.jpg")
    add(tar, "hard.jpg", type=tarfile.LNKTYPE, linkname="images/a.b.c.jpg")
    add(tar, "fifo.jpg", type=tarfile.FIFOTYPE)
    add(tar, "b.jpg", b"")  # an empty member
    add(tar, "b.cls", b"7")
    add(tar, "__x__.jpg", b"a key that looks like a meta name")
    add(tar, f"{long_dir}/c.jpg", b"c" * 1000)
    add(tar, f"{long_dir}/c.PNG", b"C" * 513)
    add(tar, "f" * 150 + ".jpg", b"long name")
    add(tar, "g" * 300 + ".tar.gz", bytes(range(256)) * 3)
    add(tar, "x" * 120 + ".lnk", type=tarfile.SYMTYPE, linkname="y" * 200)
    add(tar, "dir.with.dots/h.jpg", b"h")
    add(tar, "dir.with.dots/noext", b"skipped")
    add(tar, "dir/.hidden.jpg", b"dot file: key 'dir/'")
    add(tar, "caf\u00e9.jpg", b"non-ASCII")
    add(tar, "i.jpg", b"i1")
    add(tar, "j.jpg", b"j")
    add(tar, "i.png", b"i2")  # key i again, not consecutive: a new sample


def ustar_members(tar: tarfile.TarFile) -> None:
    add(tar, "top", type=tarfile.DIRTYPE)
    add(tar, "p" * 90 + "/" + "q" * 90 + ".jpg", b"prefix and name")
    add(tar, "p" * 90 + "/" + "q" * 90 + ".txt", b"same key")
    add(tar, "r.jpg", b"r" * 100_000)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shards")
    made = {
        "gnu": write_tar(root / "gnu.tar", mixed_members, format=tarfile.GNU_FORMAT),
        "pax": write_tar(root / "pax.tar", mixed_members, format=tarfile.PAX_FORMAT),
        "ustar": write_tar(root / "ustar.tar", ustar_members, format=tarfile.USTAR_FORMAT),
        "gnu-gz": write_tar(
            root / "gnu.tar.gz", mixed_members, mode="w:gz", format=tarfile.GNU_FORMAT
        ),
        "pax-tgz": write_tar(root / "pax.tgz", mixed_members, mode="w:gz"),
        # gzip told by its magic bytes, not by the name
        "gz-as-tar": write_tar(root / "gz-as.tar", ustar_members, mode="w:gz"),
        "pax-global": write_tar(
            root / "global.tar",
            mixed_members,
            format=tarfile.PAX_FORMAT,
            pax_headers={"comment": "a global header, as git archive writes"},
        ),
    }
    (made["webdataset"],) = make_webdataset_shards(root, shards=1, samples_per_shard=12)
    with webdataset.TarWriter(str(root / "writer.tar.gz"), encoder=False) as writer:
        for i in range(5):
            writer.write({"__key__": f"k{i}", "txt": b"t" * i, "Bin": bytes([i]) * 700})
    made["writer-gz"] = root / "writer.tar.gz"
    return made


# -- samples equal webdataset's ------------------------------------------------------------


@pytest.mark.parametrize("size", BLOCK_SIZES)
@pytest.mark.parametrize(
    "kind",
    [
        "gnu",
        "pax",
        "ustar",
        "gnu-gz",
        "pax-tgz",
        "gz-as-tar",
        "pax-global",
        "webdataset",
        "writer-gz",
    ],
)
def test_samples_equal_webdataset(
    shards: dict[str, Path], kind: str, size: int | str | None
) -> None:
    path = shards[kind]
    expected = reference(str(path))
    assert expected  # the shard holds samples
    assert ours(str(path), path.read_bytes(), size) == expected


def _random_name(rng: random.Random) -> str:
    segments = [
        "".join(rng.choices("abcXY._", k=rng.choice([1, 2, 5, 40, 130])))
        for _ in range(rng.choice([1, 1, 2, 3]))
    ]
    name = "/".join(segments)
    if rng.random() < 0.1:
        name = "__" + name
    if rng.random() < 0.1:
        name += "__"
    return name


def _random_shard(rng: random.Random, path: Path) -> None:
    """Members of a few keys in random order: dots, case, meta names, links, duplicates."""
    keys = [_random_name(rng) for _ in range(6)]
    fmt = rng.choice([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
    mode: Literal["w", "w:gz"] = rng.choice(["w", "w", "w:gz"])
    with tarfile.open(path, mode, format=fmt) as tar:
        for _ in range(rng.randint(0, 25)):
            name = rng.choice(keys) + rng.choice(
                ["", ".jpg", ".JPG", ".a.b", "." + _random_name(rng)]
            )
            if rng.random() < 0.1:
                kind = rng.choice([tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE])
                attrs = {"type": kind, "linkname": _random_name(rng)}
                data = b""
            else:
                attrs = {}
                data = rng.randbytes(rng.choice([0, 1, 511, 512, 513, 3000]))
            with contextlib.suppress(ValueError):  # a name ustar cannot hold
                add(tar, name, data, **attrs)


def _outcome(run: Callable[[], list[Sample]]) -> list[Sample] | str:
    """The samples, or the message of a duplicate (the one error these shards can have)."""
    try:
        return run()
    except (ValueError, DecodeError) as exc:
        return "duplicate file name" if "duplicate file name" in str(exc) else repr(exc)


@pytest.mark.parametrize("seed", range(40))
def test_random_shards_equal_webdataset(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "random.tar"
    _random_shard(rng, path)
    size = rng.choice(BLOCK_SIZES)
    expected = _outcome(lambda: reference(str(path)))
    assert _outcome(lambda: ours(str(path), path.read_bytes(), size)) == expected


def test_grouping_rules_match_webdataset(shards: dict[str, Path]) -> None:
    """Spell out what the comparison above covers, so a webdataset change shows here."""
    samples = reference(str(shards["pax"]))
    keys = [s["__key__"] for s in samples]
    assert keys[0] == "images/a"
    assert set(samples[0]) == {"__key__", "__url__", "b.c.jpg", "txt", "json"}  # lower-cased
    assert {"b", "__x__", "dir.with.dots/h", "dir/", "caf\u00e9"} <= set(keys)
    assert samples[keys.index("b")] == {
        "__key__": "b",
        "__url__": str(shards["pax"]),
        "jpg": b"",
        "cls": b"7",
    }
    assert keys[-3:] == ["i", "j", "i"]  # a key seen again later starts a new sample
    assert not any(
        key.startswith(("__meta", "__index", "README", "link", "hard", "fifo")) for key in keys
    )
    assert base_plus_ext("a/b.c.d.JPG") == ("a/b", "c.d.JPG")
    assert base_plus_ext("x.y/z") == (None, None)


def test_samples_do_not_straddle_shards(tmp_path: Path) -> None:
    def first(tar: tarfile.TarFile) -> None:
        add(tar, "a.jpg", b"1")
        add(tar, "k.jpg", b"2")

    def second(tar: tarfile.TarFile) -> None:
        add(tar, "k.txt", b"3")  # the same key as the last sample of the first shard

    urls = [str(write_tar(tmp_path / "0.tar", first)), str(write_tar(tmp_path / "1.tar", second))]
    expected = reference(urls)
    got = [s for url in urls for s in ours(url, Path(url).read_bytes(), 513)]
    assert got == expected
    assert [s["__key__"] for s in got] == ["a", "k", "k"]


def test_pax_extended_headers(tmp_path: Path) -> None:
    def fill(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo("short.bin")
        info.size = 5
        info.pax_headers = {"path": "renamed/by.pax.jpg", "size": "5", "comment": "x"}
        tar.addfile(info, io.BytesIO(b"12345"))
        add(tar, "renamed/by.txt", b"same sample")

    path = write_tar(tmp_path / "x.tar", fill, format=tarfile.PAX_FORMAT)
    expected = reference(str(path))
    assert [s["__key__"] for s in expected] == ["renamed/by"]
    for size in BLOCK_SIZES:
        assert ours(str(path), path.read_bytes(), size) == expected


def test_unknown_entry_types_are_skipped_with_their_body(tmp_path: Path) -> None:
    def fill(tar: tarfile.TarFile) -> None:
        add(tar, "a.jpg", b"a")
        info = tarfile.TarInfo("volume.jpg")
        info.type = b"V"  # not a type tarfile knows: it skips the body, webdataset the entry
        info.size = 1300
        tar.addfile(info, io.BytesIO(b"v" * 1300))
        add(tar, "old-style-dir/", type=tarfile.AREGTYPE)  # V7: a trailing slash is a folder
        add(tar, "b.jpg", b"b")

    path = write_tar(tmp_path / "u.tar", fill, format=tarfile.GNU_FORMAT)
    expected = reference(str(path))
    assert [s["__key__"] for s in expected] == ["a", "b"]
    for size in BLOCK_SIZES:
        assert ours(str(path), path.read_bytes(), size) == expected


def _patch_header(data: bytearray, at: int, **fields: bytes) -> None:
    """Overwrite header fields at ``at`` and store a fresh (signed or unsigned) checksum."""
    spans = {"size": (124, 12), "type": (156, 1), "name": (0, 100)}
    signed = fields.pop("signed", b"") == b"yes"
    for key, value in fields.items():
        start, length = spans[key]
        data[at + start : at + start + length] = value.ljust(length, b"\0")
    header = bytes(data[at : at + 512])
    fmt = "148b8x356b" if signed else "148B8x356B"
    checksum = 256 + sum(struct.unpack_from(fmt, header))
    data[at + 148 : at + 156] = b"%06o\0 " % (checksum & 0o777777)


def test_base256_size_and_signed_checksum(tmp_path: Path) -> None:
    """GNU base-256 numbers and the signed checksums of old Sun tars, as tarfile reads them."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        add(tar, "big.jpg", b"z" * 600)
        add(tar, "high.jpg", b"h")
    data = bytearray(buffer.getvalue())
    _patch_header(data, 0, size=b"\x80" + (600).to_bytes(11, "big"))
    _patch_header(data, 1536, name="h\u00e9igh.jpg".encode("latin-1"), signed=b"yes")
    path = tmp_path / "b.tar"
    path.write_bytes(bytes(data))
    expected = reference(str(path))
    assert [s["__key__"] for s in expected] == ["big", "h\udce9igh"]
    for size in BLOCK_SIZES:
        assert ours(str(path), bytes(data), size) == expected


def test_member_offsets_match_tarfile(shards: dict[str, Path]) -> None:
    for kind in ("gnu", "pax", "ustar", "pax-global", "gnu-gz"):
        data = shards[kind].read_bytes()
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            infos = [info for info in tar.getmembers() if info.isreg()]
        members = read_members(kind, data, 513)
        assert [m.name for m in members] == [info.name for info in infos]
        assert [m.offset for m in members] == [info.offset for info in infos]
        ends = [info.offset_data + -(-info.size // 512) * 512 for info in infos]
        assert [m.end for m in members] == ends
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            assert [m.data for m in members] == [tar.extractfile(i).read() for i in infos]  # type: ignore[union-attr]


def test_resume_at_every_member_boundary(shards: dict[str, Path]) -> None:
    data = shards["pax"].read_bytes()
    members = read_members("pax", data)
    for i, member in enumerate(members):
        rest = read_members("pax", data[member.end :], 7, start_offset=member.end)
        assert rest == members[i + 1 :]
    with pytest.raises(ValueError, match="member boundary"):
        TarReader("x.tar", start_offset=100)
    with pytest.raises(ValueError, match="cannot resume"):
        TarReader("x.tar.gz", start_offset=512, compression="gzip")


def test_grouper_last_end_is_a_sample_boundary(shards: dict[str, Path]) -> None:
    data = shards["webdataset"].read_bytes()
    url = str(shards["webdataset"])
    expected = ours(url, data)
    reader, grouper = TarReader(url), SampleGrouper(url)
    boundaries = []
    for member in reader.feed(data):
        if grouper.push(member) is not None:
            boundaries.append(grouper.last_end)
    reader.close()
    assert grouper.flush() is not None
    boundaries.append(grouper.last_end)
    assert len(boundaries) == len(expected)
    for i, end in enumerate(boundaries):
        resumed = list(iter_samples(url, [data[end:]], start_offset=end))
        assert resumed == expected[i + 1 :]


def test_gzip_variants() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        mixed_members(tar)
    plain = buffer.getvalue()
    expected = ours("x.tar.gz", plain)
    half = len(plain) // 2 + 3
    multi = gzip.compress(plain[:half]) + gzip.compress(plain[half:])  # like pigz --independent
    for size in (1, 513, None):
        assert ours("x.tar.gz", gzip.compress(plain), size) == expected
        assert ours("x.tar.gz", multi, size) == expected
    reader = TarReader("x.tar", compression="none")
    with pytest.raises(DecodeError, match="corrupt TAR header"):
        reader.feed(gzip.compress(plain))
    reader = TarReader("x.tar.gz")
    assert reader.compressed is None
    reader.feed(b"\x1f")
    assert reader.compressed is None
    reader.feed(gzip.compress(plain)[1:])
    assert reader.compressed is True
    assert reader.offset == len(gzip.compress(plain))
    reader.close()


def test_end_of_archive_and_trailing_bytes() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        add(tar, "a.jpg", b"a")
    data = buffer.getvalue()
    assert len(data) == 10240  # padded to a record with zero blocks
    reader = TarReader("x.tar")
    assert [m.name for m in reader.feed(data + b"garbage after the end is ignored")] == ["a.jpg"]
    assert reader.ended
    reader.close()
    # tarfile accepts a stream that stops at a member boundary without the zero blocks
    reader = TarReader("x.tar")
    assert len(reader.feed(data[:1024])) == 1
    assert not reader.ended
    reader.close()
    assert read_members("x.tar", bytes(10240)) == []  # an empty archive


# -- errors --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_shard() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(4):
            add(tar, f"s{i}.bin", bytes([i]) * 1000)  # headers at 0, 1536, 3072, 4608
    return buffer.getvalue()


URL = "https://example.com/shards/train-000003.tar"


@pytest.mark.parametrize(
    ("cut", "match"),
    [
        (
            3072 + 512 + 100,
            r"ended at TAR offset 3684 inside the body of member 's2.bin' "
            r"\(headers at offset 3072; 100 of 1000 bytes\)",
        ),
        (3072 + 100, r"ended at TAR offset 3172 inside the header at offset 3072"),
        (1536 + 512 + 1000 + 4, r"ended at TAR offset 3052, 20 bytes before the next header"),
        (1, r"ended at TAR offset 1 inside the header at offset 0"),
        (0, r"empty shard"),
    ],
)
@pytest.mark.parametrize("size", [7, 513, None])
def test_truncated_shard(plain_shard: bytes, cut: int, match: str, size: int | None) -> None:
    reader = TarReader(URL)
    for block in blocks(plain_shard[:cut], size):
        reader.feed(block)
    with pytest.raises(DecodeError, match=match) as caught:
        reader.close()
    assert URL in str(caught.value)


def test_truncated_after_extended_header() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        add(tar, "n" * 200 + ".jpg", b"x")
    data = buffer.getvalue()
    reader = TarReader(URL)
    assert reader.feed(data[:1024]) == []  # the L header and its body, no member header yet
    with pytest.raises(DecodeError, match="extended header at offset 0 has no member"):
        reader.close()


def test_truncated_gzip(plain_shard: bytes) -> None:
    compressed = gzip.compress(plain_shard)
    reader = TarReader(URL)
    reader.feed(compressed[: len(compressed) // 2])
    with pytest.raises(DecodeError, match=r"truncated TAR shard.*of the gzip stream") as caught:
        reader.close()
    assert URL in str(caught.value)
    # a gzip stream cut at a member boundary of the TAR inside it
    reader = TarReader(URL)
    inflater = gzip.compress(plain_shard[:1536])
    reader.feed(inflater[:-8])  # without the CRC trailer
    with pytest.raises(DecodeError, match="no gzip trailer"):
        reader.close()
    reader = TarReader(URL)
    with pytest.raises(DecodeError, match=r"corrupt gzip stream near byte \d+") as caught:
        reader.feed(compressed[:20] + bytes(200) + compressed[220:])
    assert URL in str(caught.value)


@pytest.mark.parametrize("size", [1, 512, None])
def test_corrupt_header_checksum(plain_shard: bytes, size: int | None) -> None:
    data = bytearray(plain_shard)
    data[3072 + 3] ^= 0x20  # the name of the third member
    reader = TarReader(URL)
    got: list[TarMember] = []
    with pytest.raises(DecodeError, match=r"corrupt TAR header at offset 3072: checksum") as caught:
        feed_all(reader, bytes(data), size, got, close=True)
    assert URL in str(caught.value)
    assert [m.name for m in got] == ["s0.bin", "s1.bin"]  # the members before it are delivered


def test_failed_reader_stays_failed(plain_shard: bytes) -> None:
    data = bytearray(plain_shard)
    data[1536 + 3] ^= 0x20
    reader = TarReader(URL)
    assert [m.name for m in reader.feed(bytes(data))] == ["s0.bin"]  # the error comes next
    with pytest.raises(DecodeError, match="corrupt TAR header at offset 1536"):
        reader.feed(b"more")
    with pytest.raises(DecodeError, match="corrupt TAR header at offset 1536"):
        reader.close()


def test_not_a_tar() -> None:
    with pytest.raises(DecodeError, match=r"corrupt TAR header at offset 0"):
        TarReader(URL).feed(b"<html>not found</html>" + bytes(600))
    data = bytearray(512)
    data[0:5] = b"a.jpg"
    data[124:136] = b"zz".ljust(12, b"\0")
    with pytest.raises(DecodeError, match="not a number"):
        TarReader(URL).feed(bytes(data))


def test_duplicate_extension() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        add(tar, "k.jpg", b"1")
        add(tar, "k.txt", b"2")
        add(tar, "k.JPG", b"3")  # lower-cased: a second jpg
    grouper = SampleGrouper(URL)
    with pytest.raises(
        DecodeError,
        match=r"duplicate file name 'k.JPG' at offset 2048: sample 'k' already has 'jpg'",
    ) as caught:
        push_all(grouper, read_members(URL, buffer.getvalue()))
    assert URL in str(caught.value)


def test_duplicate_extension_webdataset_agrees(tmp_path: Path) -> None:
    def fill(tar: tarfile.TarFile) -> None:
        add(tar, "k.jpg", b"1")
        add(tar, "k.JPG", b"2")

    path = write_tar(tmp_path / "dup.tar", fill)
    with pytest.raises(ValueError, match="duplicate file name"):
        reference(str(path))
    with pytest.raises(DecodeError, match="duplicate file name 'k.JPG'"):
        ours(str(path), path.read_bytes())


def test_member_over_max_size(plain_shard: bytes) -> None:
    reader = TarReader(URL, max_member_size=999)
    with pytest.raises(
        DecodeError, match=r"member 's0.bin' at offset 0 has 1000 bytes, over max_member_size=999"
    ):
        reader.feed(plain_shard)
    assert read_members(URL, plain_shard, max_member_size=1000)


def test_sparse_member_refused() -> None:
    data = bytearray(1024)
    data[0:5] = b"s.bin"
    data[124:136] = b"%011o\0" % 0
    _patch_header(data, 0, type=b"S")
    with pytest.raises(DecodeError, match="GNU sparse"):
        TarReader(URL).feed(bytes(data))


def test_closed_reader_refuses_input(plain_shard: bytes) -> None:
    reader = TarReader(URL)
    reader.feed(plain_shard)
    reader.close()
    reader.close()  # idempotent
    with pytest.raises(ClosedResourceError):
        reader.feed(b"x")


# -- memory --------------------------------------------------------------------------------


def test_100mb_shard_in_64k_blocks_stays_bounded() -> None:
    rng = random.Random(7)
    sizes = [rng.choice([0, 1, 511, 512, 513, 100_000, 1 << 20, 3 << 20]) for _ in range(120)]
    sizes += [(100 << 20) - sum(sizes)]  # ~100 MB in all, the last member the largest
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i, size in enumerate(sizes):
            add(tar, f"sample{i:04d}.bin", bytes([i % 251]) * size)
    data = buffer.getvalue()
    assert len(data) > 100 << 20
    reader = TarReader(URL)
    limit = max(sizes) + 64 * 1024
    peak = 0
    got: list[tuple[str, int, bool]] = []
    view = memoryview(data)
    for pos in range(0, len(data), 64 * 1024):
        for m in reader.feed(view[pos : pos + 64 * 1024]):
            got.append((m.name, len(m.data), m.data == bytes([len(got) % 251]) * len(m.data)))
        peak = max(peak, reader.buffered)
        assert reader.buffered <= limit
    reader.close()
    assert peak > 0
    assert got == [(f"sample{i:04d}.bin", size, True) for i, size in enumerate(sizes)]


# -- the decoder ---------------------------------------------------------------------------


@dataclasses.dataclass
class FakeSource:
    files: dict[str, bytes]
    reads: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)

    async def read_ranges(self, file: FileRef, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        data = self.files[file.url]
        self.reads += [(file.url, s, e) for s, e in ranges]
        return [data[s:e] for s, e in ranges]

    async def read_tail(self, file: FileRef, n: int) -> tuple[bytes, int]:
        data = self.files[file.url]
        self.reads.append((file.url, max(0, len(data) - n), len(data)))
        return data[-n:], len(data)


@pytest.mark.anyio
@pytest.mark.parametrize("known_size", [True, False])
async def test_decoder_one_unit_per_shard(
    shards: dict[str, Path], monkeypatch: pytest.MonkeyPatch, known_size: bool
) -> None:
    path = shards["webdataset"]
    data = path.read_bytes()
    url = str(path)
    file = FileRef(url, path.name, len(data) if known_size else None)
    source = FakeSource({url: data})
    decoder = WebDatasetDecoder()
    monkeypatch.setitem(formats._REGISTRY, "webdataset", decoder)  # noqa: SLF001
    for name in ("train-000000.tar", "x.tar.gz", "x.TGZ"):
        assert decoder_for(FileRef(name, name)) is decoder

    units = await decoder.plan(file, source, ReadRequest())
    assert [(u.index, u.cost, u.file.size) for u in units] == [(0, len(data), len(data))]
    fetched = await decoder.fetch(units[0], source)
    assert source.reads[-1] == (url, 0, len(data))
    table = decoder.decode(units[0], fetched, ReadRequest())
    assert table.column_names == ["__key__", "__url__", "cls", "jpg", "json"]
    assert table.schema.field("jpg").type == pa.large_binary()
    assert table.to_pylist() == reference(url)

    request = ReadRequest(columns=("__key__", "json", "missing"))
    with pytest.raises(SourceError, match=r"sample 'sample00000000' has no 'missing'"):
        decoder.decode(units[0], fetched, request)
    table = WebDatasetDecoder(missing_is_error=False).decode(units[0], fetched, request)
    assert table.column_names == ["__key__", "json", "missing"]
    assert table.column("missing").null_count == table.num_rows
    assert json.loads(table.column("json")[0].as_py())["index"] == 0


def test_samples_to_table_nulls_where_missing() -> None:
    samples = [
        {"__key__": "a", "__url__": "u", "jpg": b"1"},
        {"__key__": "b", "__url__": "u", "txt": b"2"},
    ]
    table = samples_to_table(samples)
    assert table.column_names == ["__key__", "__url__", "jpg", "txt"]
    assert table.to_pylist() == [
        {"__key__": "a", "__url__": "u", "jpg": b"1", "txt": None},
        {"__key__": "b", "__url__": "u", "jpg": None, "txt": b"2"},
    ]
    assert samples_to_table([]).column_names == ["__key__", "__url__"]
    with pytest.raises(DecodeError, match=r"u: __key__ 'h\\udce9' is not valid UTF-8"):
        samples_to_table([{"__key__": "h\udce9", "__url__": "u", "jpg": b""}])
