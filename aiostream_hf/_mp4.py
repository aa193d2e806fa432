"""The I/O-free MP4 (ISO-BMFF) core: find ``moov``, parse a video track's sample table.

Nothing here reads a file. The async layer (``aiostream_hf.video``) reads
the head and the tail of a file at once, walks the top-level boxes with
``read_box_header`` and jumps from box to box until it holds the whole ``moov``::

    head, tail = await fetch([(0, HEAD_READ_SIZE), (size - TAIL_READ_SIZE, size)])
    pos = 0
    while pos < size:  # for at most MAX_TOP_LEVEL_BOXES boxes
        box = read_box_header(bytes_at(pos, 16), pos, size, name)  # one read per hop, at most
        if box.type == "moov":
            index = parse_moov(bytes_at(box.start, box.end), name)
            break
        pos = box.end

In the usual moov-at-end file (``ftyp``, ``mdat``, ``moov``) the head holds the
``mdat`` header, whose size says where ``moov`` starts, and the tail holds ``moov``
(a larger one takes one more read); a faststart file has ``moov`` in its head.

``parse_moov`` returns a ``SampleTable`` (one row per sample, in decode order) for
the first video track, or ``NoIndex`` when the file has no index that this module
can use (fragmented MP4, edit lists other than the usual shapes, codecs without a
known decoder): the caller then decodes the file with a demuxer instead.

No count or size read from the file is trusted: before anything is allocated, a
table's entry count times its entry size must fit in the box that holds it, every
box must fit in its parent (and the file), the tables must agree on the number of
samples, every sample must lie inside the file (when its size is known) and no two
samples may overlap (so the samples' bytes add up to no more than the file), and where
nothing else bounds a value there is a documented limit (``MAX_SAMPLES``,
``MAX_BOX_DEPTH``). A file that breaks one of these raises ``DecodeError`` naming
the file, the box and the values, so a few bytes cannot make this module allocate
gigabytes.

Timestamps follow FFmpeg's mov demuxer, so they equal PyAV's ``frame.pts``: with an
edit list of empty edits (a start delay) followed by one edit at ``media_time``,
the frames whose composition time lies outside the edit are decoded but never
shown, and the first shown frame is at the empty edits' total duration.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ._exceptions import DecodeError

__all__ = [
    "BOX_HEADER_MAX",
    "CODECS",
    "HEAD_READ_SIZE",
    "MAX_BOX_DEPTH",
    "MAX_EDITS",
    "MAX_SAMPLES",
    "MAX_TOP_LEVEL_BOXES",
    "TAIL_READ_SIZE",
    "BoxHeader",
    "NoIndex",
    "SampleTable",
    "container_kind",
    "moov_in_tail",
    "parse_moov",
    "read_box_header",
]

HEAD_READ_SIZE = 64 * 1024
"""Bytes read from the start of a file first, and at each hop towards ``moov``."""

TAIL_READ_SIZE = 1024 * 1024
"""Bytes read from the end of a file, with the head, at most: where ``moov`` usually is."""

BOX_HEADER_MAX = 16
"""Bytes that always hold a box header (size, type, 64-bit largesize)."""

MAX_SAMPLES = 1 << 23
"""Most samples a video track's index may have (8,388,608: 77 hours at 30 fps, 39 at
60). A table of sample sizes that all share one value (``stsz`` with a uniform size)
takes 20 bytes whatever its count, so only this limit, and the file's size, bound it;
an index of this many samples takes about 0.5 GiB. A track with more raises
``DecodeError``."""

MAX_BOX_DEPTH = 32
"""Deepest nesting of container boxes read (a real file nests 6 deep: moov, trak,
mdia, minf, stbl, and a sample entry)."""

MAX_TOP_LEVEL_BOXES = 10_000
"""Most top-level boxes walked from the start of a file to find ``moov`` (a real file
has a handful: ftyp, free, mdat, moov, perhaps a few more). Without a bound, a file of
millions of tiny boxes (8-byte ``free`` boxes) makes the walk take minutes; a file with
more raises ``DecodeError``."""

MAX_EDITS = 1024
"""Most edit list entries read from the index; a longer edit list (only a few entries
have the shape this module maps) is left to the demuxer (``NoIndex``)."""

#: Sample entry type -> FFmpeg codec name, for the codecs decoded from the index.
CODECS: dict[str, str] = {
    "avc1": "h264",
    "avc3": "h264",
    "hev1": "hevc",
    "hvc1": "hevc",
    "av01": "av1",
    "vp09": "vp9",
    "vp08": "vp8",
}
#: The configuration box whose payload FFmpeg hands to the decoder as extradata.
_CONFIG_BOXES = {"avcC", "hvcC", "av1C"}

# Types a top-level box of an ISO-BMFF file may have; the first box must be one of them.
_TOP_LEVEL = frozenset(
    {"ftyp", "styp", "moov", "mdat", "free", "skip", "wide", "pdin", "uuid", "meta", "moof",
     "mfra", "sidx", "ssix", "prft", "emsg", "pnot", "junk", "jP  ", "bloc"}
)  # fmt: skip
_CONTAINERS = frozenset({"moov", "trak", "mdia", "minf", "stbl", "edts", "dinf"})
_VISUAL_SAMPLE_ENTRY = 78  # bytes of a VisualSampleEntry after its box header
_ENCRYPTED = frozenset({"encv", "resv"})
_REORDER_WINDOW = 64  # frames: how far back the reorder depth of a stream is measured
_MAX_TICKS = 1 << 62  # timestamps past this would overflow int64 arithmetic

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class BoxHeader:
    """One box: its type and absolute byte span ``[start, end)``, header included."""

    type: str
    start: int
    end: int
    header_size: int

    @property
    def payload_start(self) -> int:
        return self.start + self.header_size


@dataclass(frozen=True, slots=True)
class NoIndex:
    """The file is an MP4 without an index this module can use, and why.

    ``codec`` is the sample entry type (fourcc) when it is the codec that is not mapped.
    """

    reason: str
    codec: str | None = None


@dataclass(frozen=True, eq=False)
class SampleTable:
    """The samples of one video track, in decode order, with FFmpeg's timestamps.

    offset, size: where each sample's bytes lie in the file.
    dts, pts: decode and presentation timestamps, in ``timescale`` ticks, as FFmpeg's
        mov demuxer gives them (edit list applied).
    cts: composition times before the edit list (``stts`` + ``ctts``), unique per
        sample: what a decoder is fed, to tell its output frames apart.
    is_key: sync samples (``stss``; every sample when the track has none).
    shown: samples that are presented; False for those an edit list hides, which are
        decoded (other frames may refer to them) but never output.
    duration: each sample's ``stts`` duration, in ticks.
    """

    name: str
    track_id: int
    timescale: int
    codec: str
    """FFmpeg's name for the codec: h264, hevc, av1, vp9, vp8."""
    fourcc: str
    """The sample entry type: avc1, avc3, hev1, hvc1, av01, vp09, vp08."""
    width: int
    height: int
    extradata: bytes | None = field(repr=False)
    """The payload of the codec configuration box (avcC, hvcC, av1C), as FFmpeg passes it."""
    offset: Int64Array = field(repr=False)
    size: Int64Array = field(repr=False)
    dts: Int64Array = field(repr=False)
    pts: Int64Array = field(repr=False)
    cts: Int64Array = field(repr=False)
    duration: Int64Array = field(repr=False)
    is_key: BoolArray = field(repr=False)
    shown: BoolArray = field(repr=False)

    @property
    def sample_count(self) -> int:
        return len(self.offset)

    @property
    def frame_count(self) -> int:
        """Frames presented (samples an edit list hides are not counted)."""
        return int(np.count_nonzero(self.shown))

    @property
    def keyframe_count(self) -> int:
        return int(np.count_nonzero(self.is_key))

    @property
    def end_pts(self) -> int:
        """The end of the last presented frame, in ticks (its pts plus its duration)."""
        shown = np.flatnonzero(self.shown)
        if len(shown) == 0:
            return 0
        last = shown[np.argmax(self.pts[shown])]
        return int(self.pts[last] + self.duration[last])

    @property
    def duration_s(self) -> float:
        """Seconds from 0 to the end of the last presented frame."""
        return self.end_pts / self.timescale

    @property
    def fps(self) -> float:
        """Average frames per second over the presented span."""
        shown = self.pts[self.shown]
        if len(shown) == 0:
            return 0.0
        span = self.end_pts - int(shown.min())
        return self.frame_count * self.timescale / span if span > 0 else 0.0

    def reorder_depth(self) -> int:
        """The most frames decoded before a frame and presented after it (0 without B-frames)."""
        pts = self.cts
        depth = np.zeros(len(pts), dtype=np.int64)
        for d in range(1, min(_REORDER_WINDOW, len(pts))):
            depth[d:] += pts[:-d] > pts[d:]
        return int(depth.max()) if len(depth) else 0


# -- box walking ----------------------------------------------------------------------


def container_kind(head: bytes) -> str | None:
    """What the first bytes of a file say it is: "mp4", "matroska", "video" or None.

    "video" is another container FFmpeg demuxes (AVI, MPEG-TS, FLV, Ogg, MPEG-PS);
    None is not a video at all.
    """
    if len(head) >= 8 and head[4:8].decode("latin-1") in _TOP_LEVEL:
        size = int.from_bytes(head[:4], "big")
        if size in (0, 1) or size >= 8:
            return "mp4"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if head[:4] == b"RIFF" and head[8:12] in (b"AVI ", b"AVIX"):
        return "video"
    if head[:3] == b"FLV" or head[:4] in (b"OggS", b"\x00\x00\x01\xba"):
        return "video"
    if len(head) >= 189 and head[0] == 0x47 and head[188] == 0x47:  # MPEG-TS packets
        return "video"
    return None


def read_box_header(data: bytes | memoryview, pos: int, limit: int, name: str) -> BoxHeader:
    """The header of the box at absolute position ``pos``.

    ``data`` holds the file's bytes from ``pos`` on (at least 16, or up to ``limit``);
    ``limit`` is where the enclosing box (the file, for a top-level box) ends.
    """
    view = memoryview(data)
    if limit - pos < 8 or len(view) < 8:
        raise DecodeError(f"{name}: truncated MP4 box header at byte {pos}")
    size, raw_type = struct.unpack_from(">I4s", view, 0)
    box_type = raw_type.decode("latin-1")
    header = 8
    if size == 1:
        if len(view) < 16 or limit - pos < 16:
            raise DecodeError(f"{name}: truncated MP4 box header at byte {pos}")
        (size,) = struct.unpack_from(">Q", view, 8)
        header = 16
    elif size == 0:
        size = limit - pos
    if box_type == "uuid":
        header += 16
    if size < header or pos + size > limit:
        raise DecodeError(
            f"{name}: corrupt or truncated MP4: box {box_type!r} at byte {pos} has size "
            f"{size}, but {limit - pos} bytes remain"
        )
    return BoxHeader(box_type, pos, pos + size, header)


def moov_in_tail(tail: bytes | memoryview, tail_start: int, size: int) -> BoxHeader | None:
    """The top-level ``moov`` box that the last bytes of a file hold whole, found without
    the head: a ``moov`` header whose box, and the top-level boxes after it (if any),
    end exactly at the end of the file. None when there is no such box.

    ``tail`` is bytes ``[tail_start, size)`` of a file of ``size`` bytes. A moov-at-end
    file (``ftyp``, ``mdat``, ``moov``) is read from one tail read this way, where
    walking the boxes from the start needs the head first (one more round trip). Eight
    bytes of ``mdat`` payload that look like such a header (a size that lands exactly on
    the end of the file, then ``moov``) are all that could mislead it; the caller parses
    the box, and walks from the head when that fails.
    """
    data = bytes(tail)
    if tail_start + len(data) != size:
        raise ValueError(f"moov_in_tail: {len(data)} bytes at {tail_start} do not end at {size}")
    at = data.find(b"moov", 4)
    while at != -1:
        try:
            box = read_box_header(
                data[at - 4 : at - 4 + BOX_HEADER_MAX], tail_start + at - 4, size, ""
            )
            end = box.end
            while end < size:  # boxes after moov (free, ...): each whole, up to the end
                rel = end - tail_start
                after = read_box_header(data[rel : rel + BOX_HEADER_MAX], end, size, "")
                if after.type not in _TOP_LEVEL or after.type == "moov":
                    break
                end = after.end
        except DecodeError:
            end = -1
        if end == size:
            return box
        at = data.find(b"moov", at + 1)
    return None


def _children(data: memoryview, start: int, end: int, name: str) -> Iterator[BoxHeader]:
    """The boxes in ``data[start:end]`` (positions relative to ``data``)."""
    pos = start
    while end - pos >= 8:
        box = read_box_header(data[pos : pos + BOX_HEADER_MAX], pos, end, name)
        yield box
        pos = box.end


def _find(data: memoryview, parent: BoxHeader, box_type: str, name: str) -> BoxHeader | None:
    for box in _children(data, parent.payload_start, parent.end, name):
        if box.type == box_type:
            return box
    return None


# -- moov -----------------------------------------------------------------------------


@dataclass
class _Track:
    box: BoxHeader
    boxes: dict[str, BoxHeader] = field(default_factory=dict)


def parse_moov(
    moov: bytes | memoryview, name: str, file_size: int | None = None
) -> SampleTable | NoIndex:
    """The sample table of the first video track of a ``moov`` box (its bytes, header included).

    Raises ``DecodeError`` naming ``name`` for a corrupt box (counts and sizes that do
    not fit their box, tables that disagree on the number of samples, a sample outside
    the file's ``file_size`` bytes, when given, samples that overlap), a file without a
    video track or an encrypted one; returns ``NoIndex`` when the index cannot be used
    (fragmented MP4, complex edit lists, a codec this module does not map).
    """
    data = memoryview(moov)
    top = read_box_header(data[:BOX_HEADER_MAX], 0, len(data), name)
    if top.type != "moov":
        raise ValueError(f"parse_moov of {name}: the bytes start with {top.type!r}, not moov")
    movie_timescale = 0
    fragmented = False
    tracks: list[_Track] = []
    for box in _children(data, top.payload_start, top.end, name):
        if box.type == "mvhd":
            movie_timescale = _mvhd_timescale(data, box, name)
        elif box.type == "mvex":
            fragmented = True
        elif box.type == "trak":
            track = _Track(box)
            _collect(data, box, track.boxes, name)
            tracks.append(track)
    video = [t for t in tracks if _handler(data, t, name) == "vide"]
    if not video:
        raise DecodeError(f"{name} has no video track (it has {len(tracks)} track(s))")
    if fragmented:
        return NoIndex("fragmented MP4 (moov has mvex): samples are indexed in moof boxes")
    return _parse_track(data, video[0], movie_timescale, name, file_size)


def _collect(
    data: memoryview, parent: BoxHeader, out: dict[str, BoxHeader], name: str, depth: int = 2
) -> None:
    """Index the boxes under a trak by type (first of each), descending into containers."""
    if depth > MAX_BOX_DEPTH:
        raise DecodeError(
            f"{name}: corrupt MP4: box {parent.type!r} at byte {parent.start} is nested "
            f"{depth} deep, over MAX_BOX_DEPTH={MAX_BOX_DEPTH}"
        )
    for box in _children(data, parent.payload_start, parent.end, name):
        out.setdefault(box.type, box)
        if box.type in _CONTAINERS:
            _collect(data, box, out, name, depth + 1)


def _full_box(data: memoryview, box: BoxHeader, name: str, need: int = 0) -> tuple[int, int]:
    """(version, payload position after version and flags) of a FullBox."""
    pos = box.payload_start
    if box.end - pos < 4 + need:
        raise DecodeError(f"{name}: MP4 box {box.type!r} at byte {box.start} is too short")
    return data[pos], pos + 4


def _mvhd_timescale(data: memoryview, box: BoxHeader, name: str) -> int:
    version, pos = _full_box(data, box, name, 20)
    (timescale,) = struct.unpack_from(">I", data, pos + (16 if version == 1 else 8))
    return int(timescale)


def _handler(data: memoryview, track: _Track, name: str) -> str | None:
    hdlr = track.boxes.get("hdlr")
    if hdlr is None:
        return None
    _, pos = _full_box(data, hdlr, name, 8)
    return bytes(data[pos + 4 : pos + 8]).decode("latin-1")


def _u32(data: memoryview, box: BoxHeader, name: str, count_at: int = 0) -> tuple[int, int]:
    """(entry count, position of the first entry) of a table FullBox."""
    _, pos = _full_box(data, box, name, count_at + 4)
    (count,) = struct.unpack_from(">I", data, pos + count_at)
    return int(count), pos + count_at + 4


def _check_fits(box: BoxHeader, pos: int, count: int, entry: float, name: str, what: str) -> None:
    """``count`` entries of ``entry`` bytes from ``pos`` fit in ``box``, or DecodeError."""
    need = int(-(-count * entry // 1))  # a 4-bit entry is half a byte: round up
    if pos + need > box.end:
        raise DecodeError(
            f"{name}: corrupt MP4: box {box.type!r} at byte {box.start} says {count} {what} "
            f"of {entry:g} bytes ({need} bytes), but holds {box.end - pos} bytes of them"
        )


def _check_samples(box: BoxHeader, count: int, name: str) -> None:
    if count > MAX_SAMPLES:
        raise DecodeError(
            f"{name}: MP4 box {box.type!r} at byte {box.start} says the video track has "
            f"{count} samples, over MAX_SAMPLES={MAX_SAMPLES} (corrupt, or too long a "
            "track for an index read into memory)"
        )


def _table(
    data: memoryview, box: BoxHeader, name: str, columns: int, dtype: str = ">u4"
) -> npt.NDArray[np.int64]:
    """The entries of a table box as an int64 array of shape (count, columns)."""
    count, pos = _u32(data, box, name)
    item = np.dtype(dtype).itemsize
    _check_fits(box, pos, count, columns * item, name, "entries")
    raw = np.frombuffer(data, dtype=dtype, count=count * columns, offset=pos)
    return raw.astype(np.int64).reshape(count, columns)


def _runs(
    table: Int64Array, n: int, box: BoxHeader, name: str, what: str = "samples"
) -> Int64Array:
    """The values of a run-length table (rows of count, value) expanded to one per sample.

    The runs must cover exactly the track's ``n`` samples: their total is checked
    before anything is expanded, so a count of 2**32-1 allocates nothing.
    """
    total = int(table[:, 0].sum()) if len(table) else 0
    if total != n:
        raise DecodeError(
            f"{name}: corrupt MP4: box {box.type!r} at byte {box.start} describes {total} "
            f"{what}, but the video track has {n} (stsz)"
        )
    out: Int64Array = np.repeat(table[:, 1], table[:, 0])
    return out


def _parse_track(
    data: memoryview, track: _Track, movie_timescale: int, name: str, file_size: int | None
) -> SampleTable | NoIndex:
    boxes = track.boxes
    missing = [t for t in ("mdhd", "stsd", "stts", "stsc") if t not in boxes]
    if "stco" not in boxes and "co64" not in boxes:
        missing.append("stco")
    if "stsz" not in boxes and "stz2" not in boxes:
        missing.append("stsz")
    if missing:
        raise DecodeError(f"{name}: the video track lacks MP4 boxes {', '.join(missing)}")
    track_id = _track_id(data, boxes.get("tkhd"), name)
    timescale = _mdhd_timescale(data, boxes["mdhd"], name)
    if timescale <= 0:
        raise DecodeError(f"{name}: the video track has timescale {timescale}")
    fourcc, width, height, extradata = _sample_entry(data, boxes["stsd"], name)
    if fourcc in _ENCRYPTED:
        raise DecodeError(
            f"{name}: the video track is encrypted ({fourcc}), which is not supported"
        )
    codec = CODECS.get(fourcc)
    if codec is None:
        return NoIndex(f"codec {fourcc!r} is not decoded from the MP4 index", codec=fourcc)

    size_box = boxes.get("stsz") or boxes["stz2"]
    sizes = _sample_sizes(data, size_box, name, file_size)
    n = len(sizes)
    if n == 0:
        return NoIndex("the video track has no samples in moov")
    chunk_box = boxes.get("co64") or boxes["stco"]
    chunk_offsets = _table(data, chunk_box, name, 1, ">u8" if chunk_box.type == "co64" else ">u4")
    offsets = _sample_offsets(
        _table(data, boxes["stsc"], name, 3), chunk_offsets[:, 0], sizes, name
    )
    if len(offsets) < n:
        raise DecodeError(
            f"{name}: corrupt MP4: boxes 'stsc' and {chunk_box.type!r} place {len(offsets)} "
            f"samples in {len(chunk_offsets)} chunks, but the video track has {n} (stsz)"
        )
    _check_in_file(offsets, sizes, file_size, name)
    _check_disjoint(offsets[:n], sizes, name)
    deltas = _runs(_table(data, boxes["stts"], name, 2), n, boxes["stts"], name)
    dts = np.zeros(n, dtype=np.int64)
    np.cumsum(deltas[:-1], out=dts[1:])
    ctts = np.zeros(n, dtype=np.int64)
    if "ctts" in boxes:
        table = _table(data, boxes["ctts"], name, 2)
        # Offsets are signed in version 1 and, as FFmpeg reads them, in version 0 too.
        table[:, 1] = table[:, 1].astype(np.uint32).view(np.int32)
        ctts = _runs(table, n, boxes["ctts"], name)
    cts = dts + ctts
    if "stss" in boxes:
        is_key = np.zeros(n, dtype=np.bool_)
        numbers = _table(data, boxes["stss"], name, 1)[:, 0] - 1
        is_key[numbers[(numbers >= 0) & (numbers < n)]] = True
    else:
        is_key = np.ones(n, dtype=np.bool_)

    edits = _edit_list(data, boxes.get("elst"), name)
    if isinstance(edits, NoIndex):
        return edits
    placed = _apply_edits(edits, dts, cts, ctts, timescale, movie_timescale)
    if isinstance(placed, NoIndex):
        return placed
    new_dts, pts, shown = placed
    shown &= sizes > 0  # an empty sample holds no frame (FFmpeg drops it)
    return SampleTable(
        name=name,
        track_id=track_id,
        timescale=timescale,
        codec=codec,
        fourcc=fourcc,
        width=width,
        height=height,
        extradata=extradata,
        offset=offsets,
        size=sizes,
        dts=new_dts,
        pts=pts,
        cts=cts,
        duration=deltas,
        is_key=is_key,
        shown=shown,
    )


def _track_id(data: memoryview, tkhd: BoxHeader | None, name: str) -> int:
    if tkhd is None:
        return 0
    version, pos = _full_box(data, tkhd, name, 20)
    (track_id,) = struct.unpack_from(">I", data, pos + (16 if version == 1 else 8))
    return int(track_id)


def _mdhd_timescale(data: memoryview, mdhd: BoxHeader, name: str) -> int:
    version, pos = _full_box(data, mdhd, name, 20)
    (timescale,) = struct.unpack_from(">I", data, pos + (16 if version == 1 else 8))
    return int(timescale)


def _sample_entry(
    data: memoryview, stsd: BoxHeader, name: str
) -> tuple[str, int, int, bytes | None]:
    """(fourcc, width, height, extradata) of the first sample entry."""
    count, pos = _u32(data, stsd, name)
    if count < 1:
        raise DecodeError(f"{name}: the video track's stsd has no sample entry")
    entry = read_box_header(data[pos : pos + BOX_HEADER_MAX], pos, stsd.end, name)
    if entry.end - entry.payload_start < _VISUAL_SAMPLE_ENTRY:
        raise DecodeError(f"{name}: the video sample entry {entry.type!r} is too short")
    width, height = struct.unpack_from(">HH", data, entry.payload_start + 24)
    extradata = None
    for box in _children(data, entry.payload_start + _VISUAL_SAMPLE_ENTRY, entry.end, name):
        if box.type in _CONFIG_BOXES:
            extradata = bytes(data[box.payload_start : box.end])
            break
    return entry.type, int(width), int(height), extradata


def _sample_sizes(data: memoryview, box: BoxHeader, name: str, file_size: int | None) -> Int64Array:
    """Every sample's size, from ``stsz`` or ``stz2``; the count is checked first."""
    if box.type == "stsz":
        _, pos = _full_box(data, box, name, 8)
        uniform, count = struct.unpack_from(">II", data, pos)
        _check_samples(box, count, name)
        if uniform:
            if file_size is not None and count * uniform > file_size:
                raise DecodeError(
                    f"{name}: corrupt MP4: box 'stsz' at byte {box.start} says {count} "
                    f"samples of {uniform} bytes ({count * uniform} bytes), but the file "
                    f"has {file_size}"
                )
            return np.full(count, uniform, dtype=np.int64)
        _check_fits(box, pos + 8, count, 4, name, "samples")
        return np.frombuffer(data, dtype=">u4", count=count, offset=pos + 8).astype(np.int64)
    # stz2: compact sizes of 4, 8 or 16 bits
    _, pos = _full_box(data, box, name, 8)
    field_size = data[pos + 3]
    (count,) = struct.unpack_from(">I", data, pos + 4)
    start = pos + 8
    _check_samples(box, count, name)
    if field_size in (4, 8, 16):
        _check_fits(box, start, count, field_size / 8, name, "samples")
    if field_size == 16:
        raw = np.frombuffer(data, dtype=">u2", count=count, offset=start)
    elif field_size == 8:
        raw = np.frombuffer(data, dtype=np.uint8, count=count, offset=start)
    elif field_size == 4:
        packed = np.frombuffer(data, dtype=np.uint8, count=(count + 1) // 2, offset=start)
        raw = np.stack([packed >> 4, packed & 0x0F], axis=1).reshape(-1)[:count]
    else:
        raise DecodeError(f"{name}: MP4 box 'stz2' has field size {field_size}")
    return raw.astype(np.int64)


def _check_in_file(
    offsets: Int64Array, sizes: Int64Array, file_size: int | None, name: str
) -> None:
    """Every sample lies inside the file (a cut file's index points past its end)."""
    n = len(sizes)
    starts = offsets[:n]
    ends = starts + sizes
    limit = file_size if file_size is not None else np.iinfo(np.int64).max
    bad = np.flatnonzero((starts < 0) | (ends < starts) | (ends > limit))
    if len(bad):
        i = int(bad[0])
        where = f"the file has {file_size} bytes" if file_size is not None else "not a position"
        raise DecodeError(
            f"{name}: truncated or corrupt MP4: sample {i} of the video track lies at bytes "
            f"[{int(starts[i])}, {int(ends[i])}), but {where} ({len(bad)} of {n} samples "
            "lie outside the file)"
        )


def _check_disjoint(offsets: Int64Array, sizes: Int64Array, name: str) -> None:
    """No two samples share a byte (empty samples aside): encoders write each sample's
    bytes once. Samples that all point at the same region would make a small file feed
    the decoder its size times the number of samples."""
    held = np.flatnonzero(sizes > 0)
    starts = offsets[held]
    if np.any(starts[1:] < starts[:-1]):  # not in file order (rare): sort by offset
        order = np.argsort(starts, kind="stable")
        held, starts = held[order], starts[order]
    ends = starts + sizes[held]
    # Sorted by start, the samples are disjoint when each starts at or after the end of
    # the one before: then the ends increase too, so no later sample reaches back.
    bad = np.flatnonzero(starts[1:] < ends[:-1])
    if len(bad):
        first, second = int(held[bad[0]]), int(held[bad[0] + 1])
        raise DecodeError(
            f"{name}: corrupt MP4: samples {first} and {second} of the video track overlap "
            f"(bytes [{int(offsets[first])}, {int(offsets[first] + sizes[first])}) and "
            f"[{int(offsets[second])}, {int(offsets[second] + sizes[second])}); "
            f"{len(bad)} samples overlap the one before them in the file): each sample "
            "must have bytes of its own; re-encode the video from its source"
        )


def _sample_offsets(
    stsc: Int64Array, chunk_offsets: Int64Array, sizes: Int64Array, name: str
) -> Int64Array:
    """The file offset of every sample, from sample-to-chunk runs and chunk offsets."""
    n_chunks = len(chunk_offsets)
    if n_chunks == 0 or len(stsc) == 0:
        return np.zeros(0, dtype=np.int64)
    first = stsc[:, 0]
    if first[0] != 1 or np.any(np.diff(first) <= 0):
        raise DecodeError(f"{name}: MP4 box 'stsc' is not sorted by chunk from chunk 1")
    keep = first <= n_chunks
    first, per_chunk = first[keep], stsc[keep, 1]
    runs = np.diff(np.append(first, n_chunks + 1))
    samples_per_chunk = np.repeat(per_chunk, runs)
    total = int(samples_per_chunk.sum())
    if total > len(sizes):  # the last chunks claim more samples than stsz has: trim
        cumulative = np.cumsum(samples_per_chunk)
        over = int(np.searchsorted(cumulative, len(sizes)))
        samples_per_chunk = samples_per_chunk[: over + 1].copy()
        samples_per_chunk[-1] -= int(cumulative[over]) - len(sizes)
        total = len(sizes)
    chunk_of = np.repeat(np.arange(len(samples_per_chunk)), samples_per_chunk)
    sizes = sizes[:total]
    before = np.zeros(total, dtype=np.int64)  # bytes of the file's samples before each sample
    np.cumsum(sizes[:-1], out=before[1:])
    chunk_first = np.zeros(len(samples_per_chunk), dtype=np.int64)
    np.cumsum(samples_per_chunk[:-1], out=chunk_first[1:])
    starts = before[np.minimum(chunk_first, max(total - 1, 0))] if total else before
    offsets: Int64Array = chunk_offsets[chunk_of] + before - starts[chunk_of]
    return offsets


def _edit_list(
    data: memoryview, elst: BoxHeader | None, name: str
) -> list[tuple[int, int, int]] | NoIndex:
    """(segment duration in movie ticks, media time, rate * 65536) of each edit."""
    if elst is None:
        return []
    version, pos = _full_box(data, elst, name, 4)
    (count,) = struct.unpack_from(">I", data, pos)
    pos += 4
    entry = 20 if version == 1 else 12
    _check_fits(elst, pos, count, entry, name, "entries")
    if count > MAX_EDITS:
        return NoIndex(f"an edit list of {count} entries (over MAX_EDITS={MAX_EDITS})")
    edits = []
    for _ in range(count):
        if version == 1:
            duration, media_time, rate = struct.unpack_from(">Qqi", data, pos)
        else:
            duration, media_time, rate = struct.unpack_from(">Iii", data, pos)
        edits.append((int(duration), int(media_time), int(rate)))
        pos += entry
    return edits


def _rescale(value: int, num: int, den: int) -> int:
    """FFmpeg's ``av_rescale``: value * num / den rounded to nearest, halves away from 0."""
    product = value * num
    quotient = (abs(product) + den // 2) // den
    return quotient if product >= 0 else -quotient


def _apply_edits(
    edits: list[tuple[int, int, int]],
    dts: Int64Array,
    cts: Int64Array,
    ctts: Int64Array,
    timescale: int,
    movie_timescale: int,
) -> tuple[Int64Array, Int64Array, BoolArray] | NoIndex:
    """FFmpeg's timestamps for an edit list of empty edits and then one edit.

    This mirrors ``mov_fix_index`` in libavformat/mov.c for that shape: samples whose
    composition time lies outside ``[media_time, media_time + duration)`` are decoded
    but not shown, and shown frames start at the empty edits' total duration. Edit
    lists of other shapes are left to the demuxer (``NoIndex``).
    """
    n = len(dts)
    dts_shift = max(0, -int(ctts.min())) if n else 0
    if not edits:
        return dts - dts_shift, cts.copy(), np.ones(n, dtype=np.bool_)
    if movie_timescale <= 0:
        return NoIndex("an edit list with an mvhd timescale of 0")
    empty = 0
    media: list[tuple[int, int]] = []
    for duration, media_time, rate in edits:
        if media_time == -1:
            if not media:
                empty += _rescale(duration, timescale, movie_timescale)
            continue
        if media_time < 0 or rate != 0x10000:
            return NoIndex(f"an edit list entry (media time {media_time}, rate {rate / 65536})")
        media.append((_rescale(duration, timescale, movie_timescale), media_time))
    if len(media) != 1:
        return NoIndex(f"an edit list of {len(edits)} entries, {len(media)} of them non-empty")
    duration, media_time = media[0]
    if duration <= 0:
        return NoIndex("an edit list entry of duration 0")
    if max(empty, duration, media_time) >= _MAX_TICKS:
        return NoIndex(
            f"an edit list with times past 2**62 ticks (start delay {empty}, "
            f"media time {media_time}, duration {duration})"
        )
    shown = (cts >= media_time) & (cts < media_time + duration)
    if not shown.any():
        return NoIndex("an edit list that shows no frame")
    # mov_fix_index: dts counts from the first sample (in decode order) inside the edit;
    # then, for video, all timestamps shift so that the first shown pts is the start delay.
    first = int(np.argmax(shown))
    base = empty - dts_shift
    new_dts = dts - dts[first] + base
    new_dts[:first] = base
    pts = new_dts + ctts + dts_shift
    lowest = int(pts[shown].min())
    if lowest - empty > 0:
        new_dts -= lowest - empty
        pts -= lowest - empty
    return new_dts, pts, shown
