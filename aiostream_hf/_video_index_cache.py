"""A video's parsed index, kept in the byte cache's store for every process of a machine.

    cache = IndexCache.of(fetcher, file)        # None: no byte cache, or no version known
    table = await cache.load()                  # the SampleTable, or None (then parse)
    await cache.store(table)                    # after a parse

Opening a video costs a resolution, the index read(s) and then the frames' reads, one
round trip each. A process that opens a file whose index this machine has already read
(another DataLoader worker, the next epoch, the next run) finds the parsed sample table
here instead: with the resolution from the resolver's cache on disk and the file's CDN
URL from here too, its first request is for the frames' bytes.

What is kept, and why the parsed table rather than the index's bytes: the table is the
product of the index (``parse_moov``); stored as the narrowest integers that hold each
column (offsets and timestamps as differences from sample to sample) and one bit per
flag, it is about the size of the ``moov`` box itself, a tenth of the whole 1 MiB blocks
that the index reads would keep (a head block and one or two tail blocks), and it is
read back without a parse (``benchmarks/video_index_cache.py`` measures both). The
index reads themselves then go past the blocks (``read_ranges(keep=False)``), in the
small concurrent parts an uncached open uses. It is keyed like a
block: the file's path, size and ETag (its version: another version never finds it),
the reader's credentials (``RangeFetcher``'s cache scope: a private file's index is
never served to another token), and the format version below. The file's CDN route
(the signed URL its ``/resolve/`` URL redirected to, until it expires) is kept beside
it under the same key, so a warm open's first read goes straight to the CDN; an expired
or refused one is resolved again as usual and the new one kept.

Nothing read back is trusted: the store checks each entry's length against its file's
size before allocating and its CRC (``ByteCache.read_entry``), and ``decode`` checks the
format version, every count against the entry's length before an array is made, and
every value against the file (``MAX_SAMPLES``, samples inside the file, known codecs,
sane sizes). A damaged entry is deleted and the index read from the network again.
"""

from __future__ import annotations

import json
import math
import struct
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

from ._mp4 import CODECS, MAX_SAMPLES, SampleTable

if TYPE_CHECKING:
    from ._fetcher import RangeFetcher
    from ._models import FileRef

__all__ = ["FORMAT", "IndexCache", "decode", "encode"]

FORMAT = 1
"""The entries' format: a version not this one is never read (and never found: it is in
the key)."""

_INDEX = f"video-index/v{FORMAT}"
_ROUTE = "video-route/v1"
_MAGIC = b"ASHVIDX\0"
_HEAD = struct.Struct("<8sIQI")  # magic, format, samples, length of the JSON metadata
_MAX_META = 64 * 1024  # the metadata: a few numbers and names, and the array types
_MAX_EXTRADATA = 1 << 20  # a codec configuration box is tens of bytes
_MAX_ROUTE = 16 * 1024
_INT_TYPES = ("<i2", "<i4", "<i8")  # how an integer column is stored: its narrowest that fits
_INT_COLUMNS = ("offset", "size", "dts", "pts", "cts", "duration")
#: Columns stored as the differences from one sample to the next (small numbers: a
#: sample's offset is near the last one's end, timestamps go up by a frame's duration).
_DELTA_COLUMNS = frozenset({"offset", "dts", "pts", "cts"})
_BOOL_COLUMNS = ("is_key", "shown")  # one bit per sample


class DamagedEntry(ValueError):
    """A cached entry that is not what this version writes: it is read again."""


def encode(table: SampleTable) -> bytes:
    """``table`` as an entry's payload (``decode`` reads it back)."""
    columns: dict[str, Any] = {}
    types: dict[str, str] = {}
    for name in _INT_COLUMNS:
        values = np.asarray(getattr(table, name), dtype=np.int64)
        if name in _DELTA_COLUMNS:
            values = np.diff(values, prepend=np.int64(0))
        lo, hi = (int(values.min()), int(values.max())) if len(values) else (0, 0)
        types[name] = next(
            t for t in _INT_TYPES if np.iinfo(np.dtype(t)).min <= lo and hi <= np.iinfo(t).max
        )
        columns[name] = np.ascontiguousarray(values, dtype=types[name])
    extradata = table.extradata
    meta = {
        "track_id": table.track_id,
        "timescale": table.timescale,
        "codec": table.codec,
        "fourcc": table.fourcc,
        "width": table.width,
        "height": table.height,
        "extradata": None if extradata is None else len(extradata),
        "types": types,
    }
    meta_bytes = json.dumps(meta, separators=(",", ":")).encode()
    parts = [_HEAD.pack(_MAGIC, FORMAT, table.sample_count, len(meta_bytes)), meta_bytes]
    if extradata is not None:
        parts.append(bytes(extradata))
    parts += [columns[name].tobytes() for name in _INT_COLUMNS]
    parts += [np.packbits(np.asarray(getattr(table, name), dtype=np.bool_)).tobytes()
              for name in _BOOL_COLUMNS]  # fmt: skip
    return b"".join(parts)


def decode(payload: bytes, name: str, file_size: int) -> SampleTable:
    """The ``SampleTable`` of an entry of a file of ``file_size`` bytes; ``DamagedEntry``
    when the entry is not one this version wrote for such a file."""
    if len(payload) < _HEAD.size:
        raise DamagedEntry("shorter than its header")
    magic, version, n, meta_len = _HEAD.unpack_from(payload)
    if magic != _MAGIC or version != FORMAT:
        raise DamagedEntry(f"magic {magic!r}, format {version}")
    if n > MAX_SAMPLES or meta_len > _MAX_META:
        raise DamagedEntry(f"{n} samples, {meta_len} bytes of metadata")
    pos = _HEAD.size
    try:
        meta = json.loads(payload[pos : pos + meta_len])
    except (UnicodeDecodeError, ValueError) as exc:
        raise DamagedEntry(f"metadata: {exc}") from None
    pos += meta_len
    if not isinstance(meta, dict):
        raise DamagedEntry("metadata is not an object")
    ints: dict[str, int] = {}
    for key in ("track_id", "timescale", "width", "height"):
        value = meta.get(key)
        if type(value) is not int:
            raise DamagedEntry(f"metadata {key}={value!r}")
        ints[key] = value
    codec, fourcc, extra = meta.get("codec"), meta.get("fourcc"), meta.get("extradata")
    types = meta.get("types")
    if not isinstance(codec, str) or not isinstance(fourcc, str) or CODECS.get(fourcc) != codec:
        raise DamagedEntry(f"codec {codec!r}, sample entry {fourcc!r}")
    if extra is not None and (type(extra) is not int or not 0 <= extra <= _MAX_EXTRADATA):
        raise DamagedEntry(f"extradata of {extra!r} bytes")
    if not isinstance(types, dict) or set(types) != set(_INT_COLUMNS):
        raise DamagedEntry(f"column types {types!r}")
    if any(types[c] not in _INT_TYPES for c in _INT_COLUMNS):
        raise DamagedEntry(f"column types {types!r}")
    widths = [np.dtype(types[c]).itemsize for c in _INT_COLUMNS]
    # Every count against the entry's length before an array is made.
    expected = pos + (extra or 0) + n * sum(widths) + len(_BOOL_COLUMNS) * ((n + 7) // 8)
    if expected != len(payload):
        raise DamagedEntry(f"{len(payload)} bytes where {n} samples take {expected}")
    sides = (ints["width"], ints["height"])
    if ints["timescale"] <= 0 or not all(0 < side <= 1 << 16 for side in sides):
        raise DamagedEntry(f"metadata {ints}")
    extradata = None
    if extra is not None:
        extradata = bytes(payload[pos : pos + extra])
        pos += extra
    arrays: dict[str, Any] = {}
    for column, width in zip(_INT_COLUMNS, widths, strict=True):
        raw = np.frombuffer(payload, dtype=types[column], count=n, offset=pos)
        values = raw.astype(np.int64)
        if column in _DELTA_COLUMNS:  # (a sum that wraps is caught by the checks below)
            values = np.cumsum(values, dtype=np.int64)
        arrays[column] = values
        pos += n * width
    for column in _BOOL_COLUMNS:
        bits: npt.NDArray[np.uint8] = np.frombuffer(
            payload, dtype=np.uint8, count=(n + 7) // 8, offset=pos
        )
        arrays[column] = np.unpackbits(bits, count=n).astype(np.bool_)
        pos += (n + 7) // 8
    offset, size = arrays["offset"], arrays["size"]
    if n and (
        int(offset.min()) < 0 or int(size.min()) < 0 or int((offset + size).max()) > file_size
    ):
        raise DamagedEntry(f"samples outside the file's {file_size} bytes")
    if n and (int(arrays["duration"].min()) < 0 or int(np.abs(arrays["pts"]).max()) >= 1 << 62):
        raise DamagedEntry("timestamps out of range")
    return SampleTable(
        name=name,
        track_id=ints["track_id"],
        timescale=ints["timescale"],
        codec=codec,
        fourcc=fourcc,
        width=ints["width"],
        height=ints["height"],
        extradata=extradata,
        **arrays,
    )


def _route_payload(url: str, reuse_until: float | None) -> bytes:
    return json.dumps({"url": url, "reuse_until": reuse_until}).encode()


def _route_of(payload: bytes | None) -> tuple[str, float | None] | None:
    """The (URL, reuse until) of a route entry, or None when it is damaged."""
    if payload is None or len(payload) > _MAX_ROUTE:
        return None
    try:
        found = json.loads(payload)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(found, dict):
        return None
    url, until = found.get("url"), found.get("reuse_until")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
        return None
    if until is not None and (not isinstance(until, int | float) or not math.isfinite(until)):
        return None
    return url, None if until is None else float(until)


class IndexCache:
    """The cached index (and CDN route) of one file, read through one fetcher."""

    def __init__(self, fetcher: RangeFetcher, file: FileRef) -> None:
        self.fetcher = fetcher
        self.file = file
        self._route: tuple[str, float | None] | None = None  # the one kept, when loaded

    @classmethod
    def of(cls, source: object, file: FileRef) -> IndexCache | None:
        """The index cache of ``file`` read through ``source``: a ``RangeFetcher`` whose
        byte cache holds it (its version known); else None."""
        from ._fetcher import RangeFetcher

        if isinstance(source, RangeFetcher) and source.caches(file):
            return cls(source, file)
        return None

    async def load(self) -> SampleTable | None:
        """The file's table from the store (None: not there, or damaged: then deleted and
        counted), and its kept CDN route handed to the fetcher when still valid."""
        from ._stalls import run_decode

        payload = await self.fetcher.read_entry(self.file, _INDEX)
        if payload is None:
            return None
        assert self.file.size is not None
        try:
            table = await run_decode(decode, payload, self.file.path, self.file.size)
        except DamagedEntry as exc:
            await self.fetcher.drop_entry(self.file, _INDEX, str(exc))
            return None
        route = _route_of(await self.fetcher.read_entry(self.file, _ROUTE))
        if route is not None and (route[1] is None or route[1] > time.time()):
            self._route = route
            self.fetcher.learn_route(self.file, *route)
        return table

    async def store(self, table: SampleTable) -> None:
        """Keep ``table`` (and the file's CDN route, if the fetcher learned one)."""
        from ._stalls import run_decode

        payload = await run_decode(encode, table)
        await self.fetcher.write_entry(self.file, _INDEX, payload)
        await self.store_route()

    async def store_route(self) -> None:
        """Keep the file's CDN route, if the fetcher holds one other than the one kept."""
        route = self.fetcher.known_route(self.file)
        if route is None or route == self._route:
            return
        self._route = route
        await self.fetcher.write_entry(self.file, _ROUTE, _route_payload(*route))
