"""WebDataset TAR shards: an incremental TAR reader, webdataset's sample grouping, planning,
and ``WebDatasetDecoder``, the sequential format that ``stream()`` drives.

Nothing here opens a file or a socket: bytes come from the stream's fetcher.
``WebDatasetDecoder.iter_chunks`` reads a shard with one long GET and feeds the
blocks, of any size, as they arrive (in worker threads), in essence::

    reader = TarReader(file.url)
    grouper = SampleGrouper(file.url)
    async with fetcher.iter_bytes(file) as blocks:      # one seamless byte stream
        async for block in blocks:
            for member in reader.feed(block):
                if (sample := grouper.push(member)) is not None:
                    yield sample
    reader.close()                                      # DecodeError if truncated
    if (sample := grouper.flush()) is not None:
        yield sample

``TarReader`` understands ustar, GNU long names and links (``L``/``K``), pax
extended and global headers (``x``/``g``) and gzip-compressed shards (detected
by their magic bytes). It validates every header checksum, holds at most one
member's body plus one header block, and records offsets so a stream can resume
at a member boundary: ``TarMember.offset`` is where a reader can start reading
the member (its first extended header, if any) and ``TarMember.end`` is just past
its padded body, both in the uncompressed TAR stream. For an uncompressed shard,
resuming after a member is ``iter_bytes(file, start=member.end)`` fed to
``TarReader(url, start_offset=member.end)``; a gzip shard restarts from byte 0.

``SampleGrouper`` groups members into samples exactly as ``webdataset`` does
(``tar_file_iterator`` + ``group_by_keys``): meta files ``__*__`` and names
without an extension are skipped, the key is the directory plus the basename up
to its first dot, the extension is the rest (lower-cased), consecutive members
with one key form a sample ``{"__key__": key, "__url__": url, ext: bytes}``.

Differences from ``webdataset.WebDataset`` (1.0.2, reading through ``tarfile``),
all on purpose:

- no ``__local_path__``: webdataset adds it for local files only; ``__url__`` is
  the URL the reader was given (webdataset keeps the string it was given too).
- damage is an error, never a silent end: ``tarfile`` in stream mode stops
  quietly at a corrupt header or a header cut short after the first member (the
  rest of the shard is lost); we raise ``DecodeError`` naming the shard and offset,
  after delivering every member before the damage. Both accept a stream that
  stops at a member boundary without the end-of-archive blocks, and both refuse
  a 0-byte shard.
- a duplicate extension raises ``DecodeError`` (webdataset: ``ValueError``).
- GNU sparse members are refused with ``DecodeError`` (``tarfile`` expands them);
  no known WebDataset writer produces them.
- names are decoded as UTF-8 with ``surrogateescape`` whatever the locale
  (``tarfile`` uses the file-system encoding, UTF-8 on every usual system).
- a global pax header is not replayed when a stream resumes past it (it only
  matters if it sets ``path``, which no writer does).
- ``columns=`` is webdataset's ``to_tuple``: a sample without one of the columns
  is an error (``SourceError`` naming the sample, the shard, the column and the
  extensions it has), unless ``missing_is_error=False`` (None there), as
  ``to_tuple(..., missing_is_error=False)``; samples a ``filter=`` drops are not
  checked, so ``filter=pc.field("png").is_valid()`` keeps only those with a png.
- an image ``decode=`` without Pillow fails when the stream is made (``SourceError``
  naming the ``image`` extra), not at the first image.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import re
import struct
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import anyio.to_thread
import pyarrow as pa

from .._exceptions import ClosedResourceError, DecodeError, FetchError, SourceError
from .._models import FileRef
from . import (
    ByteSource,
    Chunk,
    Emit,
    Position,
    ReadRequest,
    SequentialDecoder,
    StreamSource,
    Unit,
)

__all__ = [
    "DEFAULT_MAX_MEMBER_SIZE",
    "MAX_EXTENDED_HEADER_SIZE",
    "SampleGrouper",
    "SkippedShardWarning",
    "TarMember",
    "TarReader",
    "WebDatasetDecoder",
    "base_plus_ext",
    "iter_samples",
    "sample_decoder",
    "samples_to_table",
]

DEFAULT_MAX_MEMBER_SIZE = 2 << 30
"""Largest member body a reader holds (2 GiB); a larger one is a ``DecodeError``."""

MAX_EXTENDED_HEADER_SIZE = 1 << 20
"""Largest pax or GNU long-name/long-link record read (1 MiB; real ones hold a path and
a few times); a larger one is a ``DecodeError``, whatever ``max_member_size`` is."""

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_GZIP_MAGIC = b"\x1f\x8b"
_INFLATE_CHUNK = 1 << 20  # decompressed bytes produced per step: bounds memory per feed

# Entry types (POSIX ustar, GNU, pax), as tarfile names them.
_REGULAR = frozenset((b"0", b"\0", b"7"))  # REGTYPE, AREGTYPE, CONTTYPE
_NO_BODY = frozenset((b"1", b"2", b"3", b"4", b"5", b"6"))  # links, devices, dirs, fifos
_EXTENDED = frozenset((b"L", b"K", b"x", b"X", b"g"))
_SPARSE = b"S"

_PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")

# webdataset.tariterators: base_plus_ext and tar_file_iterator's skip_meta.
_BASE_PLUS_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_SKIP_META = re.compile(r"__[^/]*__($|/)")

Sample = dict[str, Any]


# -- the TAR reader ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TarMember:
    """One regular file of a TAR stream.

    ``offset`` is where its headers start (the first ``L``/``K``/``x`` header
    that belongs to it, else its own header) and ``end`` is just past its padded
    body, both in the uncompressed TAR stream: a reader started at ``end``
    reads the next member.
    """

    name: str
    data: bytes
    offset: int
    end: int


def _nts(field: bytes) -> str:
    """A NUL-terminated header string (tarfile's ``nts`` with UTF-8, surrogateescape)."""
    end = field.find(b"\0")
    if end != -1:
        field = field[:end]
    return field.decode("utf-8", "surrogateescape")


def _number(field: bytes) -> int:
    """A numeric header field: octal text or GNU base-256 (tarfile's ``nti``)."""
    first = field[0]
    if first == 0o200 or first == 0o377:
        n = int.from_bytes(field[1:], "big")
        return n - (1 << (8 * (len(field) - 1))) if first == 0o377 else n
    end = field.find(b"\0")
    if end != -1:
        field = field[:end]
    return int(field.strip() or b"0", 8)  # ValueError on anything else


def _parse_pax(body: bytes, into: dict[str, str]) -> None:
    """Records ``"%d %s=%s\\n"`` of a pax header into ``into`` (as tarfile parses them)."""
    pos = 0
    while True:
        match = _PAX_RECORD.match(body, pos)
        if match is None:
            return
        length = int(match.group(1))
        if length == 0:
            raise ValueError("a pax record of length 0")
        keyword = match.group(2).decode("utf-8", "surrogateescape")
        value = body[match.end(2) + 1 : match.start(1) + length - 1]
        into[keyword] = value.decode("utf-8", "surrogateescape")
        pos += length


def _has_sparse(headers: dict[str, str]) -> bool:
    return any(key.startswith("GNU.sparse.") for key in headers)


class TarReader:
    """Parses a TAR (or gzip-compressed TAR) byte stream fed in blocks of any size.

    ``feed(block)`` returns the regular members completed by the block, in
    order; directories, links, devices and fifos are skipped, and everything
    after the end-of-archive block is ignored. ``close()`` raises
    ``DecodeError`` if the stream ended inside a header, a body or its padding
    (a truncated shard). Like ``tarfile``, a stream that ends at a member
    boundary without the end-of-archive blocks is accepted (``ended`` says
    whether they were seen); an empty stream is an error.

    ``compression``: ``"auto"`` (gzip when the stream starts with the gzip magic
    bytes ``1f 8b``, whatever the URL says), ``"gzip"`` or ``"none"``.
    ``start_offset``: the TAR offset of the first byte fed, to resume an
    uncompressed shard at a member boundary (a ``TarMember.end``).
    ``size``: the shard's size in bytes, when known: in an uncompressed shard, a
    header whose size field reaches past it is corrupt at once (a damaged size
    field is refused before any of its "body" is collected).

    No size field is trusted: a body larger than ``max_member_size``, a pax or GNU
    long-name record larger than ``MAX_EXTENDED_HEADER_SIZE``, or a body past the
    end of the shard raises ``DecodeError`` naming the shard, the offset and the size.
    A run of extended headers before a member keeps only what takes effect (as in
    ``tarfile``, the outermost long name or pax key wins), and global pax headers only
    the keys a member uses: memory and the work per member do not grow with their number.
    """

    def __init__(
        self,
        url: str,
        *,
        max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
        compression: Literal["auto", "gzip", "none"] = "auto",
        start_offset: int = 0,
        size: int | None = None,
    ) -> None:
        if max_member_size < 0:
            raise ValueError(f"max_member_size={max_member_size!r}: must be >= 0")
        if start_offset < 0 or start_offset % _BLOCK:
            raise ValueError(
                f"start_offset={start_offset!r} for {url}: must be a member boundary "
                f"(a multiple of {_BLOCK}, such as a TarMember.end)"
            )
        if compression not in ("auto", "gzip", "none"):
            raise ValueError(f"compression={compression!r}: use 'auto', 'gzip' or 'none'")
        if start_offset and compression == "gzip":
            raise ValueError(
                f"{url}: a gzip-compressed shard cannot resume mid-stream "
                f"(start_offset={start_offset}); read it again from byte 0"
            )
        self.url = url
        self.max_member_size = max_member_size
        self.size = size
        self._gzip: bool | None = None if compression == "auto" else compression == "gzip"
        if start_offset:
            self._gzip = False  # mid-stream: nothing to sniff, and gzip cannot resume
        self._inflate: Any = None  # zlib decompress object, for a gzip shard
        self._sniff = b""  # the first byte of an 'auto' stream, until the second arrives
        self._fed = start_offset  # input bytes consumed (compressed, for a gzip shard)
        self._pos = start_offset  # TAR stream offset of the next byte to parse
        self._hdr = bytearray()  # a header block arriving in pieces
        self._want = 0  # body bytes still to collect
        self._chunks: list[bytes] = []  # body bytes collected so far
        self._have = 0
        self._skip = 0  # bytes to pass over: padding, bodies of skipped entries
        self._ext: bytes | None = None  # the type of the extended header being collected
        self._name = ""  # the member being collected
        self._offset = 0
        self._end = 0
        self._chain_start: int | None = None  # offset of pending L/K/x headers
        # What the pending L/K/x headers do to their member, taken from each as it is read,
        # not the headers themselves (a hostile shard repeats them without end). tarfile
        # applies the first one read (the outermost) last, so the first to set a field wins.
        self._chain_name: str | None = None  # from the first 'L', or 'x' with a path
        self._chain_size: int | None = None  # from the first 'x' with a size
        self._chain_sparse = False  # an 'x' with GNU.sparse.* keys
        # Global pax headers ('g'), reduced when read to what a member needs: the work per
        # member does not grow with the number of global keys.
        self._global_path: str | None = None
        self._global_size: str | None = None
        self._global_sparse = False
        self._ended = False
        self._closed = False
        self._error: DecodeError | None = None
        self._open_member: str | None = None  # the regular member whose padded body is read

    # -- public state ---------------------------------------------------------------------

    @property
    def offset(self) -> int:
        """``start_offset`` plus the input bytes fed (compressed bytes for a gzip shard)."""
        return self._fed

    @property
    def tar_offset(self) -> int:
        """Offset in the uncompressed TAR stream of the next byte to parse."""
        return self._pos

    @property
    def buffered(self) -> int:
        """Bytes held between feeds: a partial header and the body collected so far."""
        return len(self._hdr) + self._have + len(self._sniff)

    @property
    def ended(self) -> bool:
        """Whether the end-of-archive block was seen (later input is ignored)."""
        return self._ended

    @property
    def compressed(self) -> bool | None:
        """Whether the stream is gzip-compressed (None until its first two bytes arrive)."""
        return self._gzip

    @property
    def broken_member(self) -> str | None:
        """The name of the regular member the stream is inside (its header was read, its
        padded body not all of it), or was refused at (oversized): after damage or a
        cut, the member that is lost. None between members."""
        return self._open_member

    # -- feeding --------------------------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview) -> list[TarMember]:
        """Parse the next block of the stream; return the members it completes.

        Damage (a corrupt header or gzip stream, an oversized member) raises
        ``DecodeError``; when the same block completed members before it, they
        are returned first and the error is raised by the next ``feed`` or
        ``close``, so every good member is delivered.
        """
        if self._closed:
            raise ClosedResourceError(f"TarReader for {self.url} is closed")
        if self._error is not None:
            raise DecodeError(str(self._error))
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        if not view:
            return []
        self._fed += len(view)
        out: list[TarMember] = []
        try:
            if self._gzip is None:
                view = self._detect(view)
                if self._gzip is None:
                    return out
            if self._gzip:
                self._feed_gzip(view, out)
            elif not self._ended:
                self._parse(view, out)
        except DecodeError as exc:
            self._error = exc
            if not out:
                raise
        return out

    def close(self) -> None:
        """End the stream: ``DecodeError`` if it stopped inside a member (truncated shard)."""
        if self._closed:
            return
        self._closed = True
        if self._error is not None:
            raise DecodeError(str(self._error))
        if self._sniff:  # a one-byte stream
            self._gzip = False
            self._parse(memoryview(self._sniff), [])
            self._sniff = b""
        if self._ended:
            return
        if self._fed == 0:
            raise DecodeError(f"{self.url}: empty shard: no TAR header (0 bytes)")
        where = f"{self.url}: truncated TAR shard: the stream ended at TAR offset {self._pos}"
        if self._gzip:
            where += f" (byte {self._fed} of the gzip stream)"
        if self._want:
            what = "extended header" if self._ext is not None else f"member {self._name!r}"
            raise DecodeError(
                f"{where} inside the body of {what} (headers at offset {self._offset}; "
                f"{self._have} of {self._have + self._want} bytes)"
            )
        if self._hdr:
            raise DecodeError(
                f"{where} inside the header at offset {self._pos - len(self._hdr)} "
                f"({len(self._hdr)} of {_BLOCK} bytes)"
            )
        if self._skip:
            raise DecodeError(f"{where}, {self._skip} bytes before the next header")
        if self._chain_start is not None:
            raise DecodeError(
                f"{where}: the extended header at offset {self._chain_start} has no member"
            )
        if self._gzip and self._inflate is not None and not self._inflate.eof:
            raise DecodeError(f"{where}: the gzip stream is cut short (no gzip trailer)")

    # -- internals ------------------------------------------------------------------------

    def _detect(self, view: memoryview) -> memoryview:
        """Decide gzip or not from the first two bytes of the stream."""
        head = self._sniff + view[: 2 - len(self._sniff)].tobytes()
        if len(head) < 2:
            self._sniff = head
            return view[len(view) :]
        self._gzip = head == _GZIP_MAGIC
        if self._sniff:
            view = memoryview(self._sniff + view.tobytes())
            self._sniff = b""
        return view

    def _feed_gzip(self, view: memoryview, out: list[TarMember]) -> None:
        data: bytes | memoryview = view
        while not self._ended:
            inflate = self._inflate
            if inflate is None or inflate.eof:
                if not data:
                    return
                inflate = self._inflate = zlib.decompressobj(wbits=31)  # next gzip member
            try:
                chunk = inflate.decompress(data, _INFLATE_CHUNK)
            except zlib.error as exc:
                raise DecodeError(
                    f"{self.url}: corrupt gzip stream near byte {self._fed} "
                    f"(TAR offset {self._pos}): {exc}"
                ) from exc
            if chunk:
                self._parse(memoryview(chunk), out)
            if inflate.eof:
                data = inflate.unused_data
            elif inflate.unconsumed_tail:
                data = inflate.unconsumed_tail
            elif len(chunk) == _INFLATE_CHUNK:
                data = b""  # output may still be pending inside zlib: ask again
            else:
                return

    def _parse(self, view: memoryview, out: list[TarMember]) -> None:
        """Consume uncompressed TAR bytes."""
        n = len(view)
        pos = 0
        base = self._pos
        try:
            while pos < n:
                if self._skip:
                    k = min(self._skip, n - pos)
                    self._skip -= k
                    pos += k
                    if not self._skip:
                        self._open_member = None  # its padding is read: the member is whole
                elif self._want:
                    want = self._want
                    k = n - pos
                    if k >= want and not self._chunks:  # the whole body is here: one copy
                        data = view[pos : pos + want].tobytes()
                        pos += want
                    elif k < want:
                        self._chunks.append(view[pos:n].tobytes())
                        self._have += k
                        self._want -= k
                        pos = n
                        continue
                    else:
                        self._chunks.append(view[pos : pos + want].tobytes())
                        pos += want
                        data = b"".join(self._chunks)
                        self._chunks = []
                        self._have = 0
                    self._want = 0
                    self._complete(data, out)
                elif self._ended:
                    pos = n
                elif self._hdr or n - pos < _BLOCK:
                    k = min(_BLOCK - len(self._hdr), n - pos)
                    self._hdr += view[pos : pos + k]
                    pos += k
                    if len(self._hdr) == _BLOCK:
                        header = bytes(self._hdr)
                        self._hdr.clear()
                        self._header(header, base + pos - _BLOCK, out)
                else:
                    pos += _BLOCK
                    self._header(view[pos - _BLOCK : pos].tobytes(), base + pos - _BLOCK, out)
        finally:
            self._pos = base + pos

    def _corrupt(self, at: int, why: str) -> DecodeError:
        where = " of the uncompressed stream" if self._gzip else ""
        return DecodeError(
            f"{self.url}: corrupt TAR header at offset {at}{where}: {why} "
            "(the shard is damaged or is not a TAR file)"
        )

    def _body_fits(self, at: int, size: int, what: str) -> None:
        """A body of ``size`` bytes after the header at ``at`` ends inside the shard."""
        if self.size is not None and self._gzip is False and at + _BLOCK + size > self.size:
            raise self._corrupt(
                at,
                f"{what} says {size} bytes, past the end of the {self.size}-byte shard "
                f"({self.size - at - _BLOCK} bytes follow the header)",
            )

    def _header(self, buf: bytes, at: int, out: list[TarMember]) -> None:
        self._open_member = None  # a header starts: the member before it is whole
        if buf == _ZERO_BLOCK:
            if self._chain_start is not None:
                raise self._corrupt(at, "end-of-archive block right after an extended header")
            self._ended = True
            return
        try:
            stored = _number(buf[148:156])
            size = _number(buf[124:136])
        except ValueError:
            raise self._corrupt(at, "a size or checksum field is not a number") from None
        unsigned = 256 + sum(buf) - sum(buf[148:156])
        if stored != unsigned and stored != 256 + sum(struct.unpack_from("148b8x356b", buf)):
            raise self._corrupt(at, f"checksum {stored} does not match {unsigned}")
        if size < 0:
            raise self._corrupt(at, f"negative size {size}")
        kind = buf[156:157]
        data_at = at + _BLOCK
        pad = -size % _BLOCK

        if kind in _EXTENDED:
            if self._chain_start is None and kind != b"g":
                self._chain_start = at
            limit = min(self.max_member_size, MAX_EXTENDED_HEADER_SIZE)
            if size > limit:
                raise DecodeError(
                    f"{self.url}: the extended header ({kind.decode('latin-1')!r}) at offset "
                    f"{at} has {size} bytes, over "
                    + (
                        f"MAX_EXTENDED_HEADER_SIZE={MAX_EXTENDED_HEADER_SIZE}"
                        if limit == MAX_EXTENDED_HEADER_SIZE
                        else f"max_member_size={self.max_member_size}"
                    )
                    + " (the shard is damaged, or not a TAR file)"
                )
            self._body_fits(at, size, "the extended header")
            self._ext = kind
            self._name = f"<{kind.decode('latin-1')} header>"
            self._offset = at
            self._end = data_at + size + pad
            self._collect(size, out)
            return
        if kind == _SPARSE:
            raise DecodeError(
                f"{self.url}: member {_nts(buf[:100])!r} at offset {at} is a GNU sparse "
                "file, which streaming does not support"
            )

        name = _nts(buf[:100])
        if buf[345]:
            prefix = _nts(buf[345:500])
            if prefix:
                name = prefix + "/" + name
        if kind == b"\0" and name.endswith("/"):
            kind = b"5"  # old V7 tar: a directory is a regular file with a trailing slash
        if self._global_path is not None:
            name = self._global_path.rstrip("/")
        if self._chain_name is not None:
            name = self._chain_name
        if self._chain_size is not None:
            size = self._chain_size
            pad = -size % _BLOCK
        if self._global_sparse or self._chain_sparse:
            raise DecodeError(
                f"{self.url}: member {name!r} at offset {at} is a GNU sparse file "
                "(pax GNU.sparse.* keys), which streaming does not support"
            )
        offset = at if self._chain_start is None else self._chain_start
        self._chain_start = None
        self._chain_name = None
        self._chain_size = None

        if kind in _NO_BODY:
            return  # tarfile reads no body for these, whatever the size field says
        if kind not in _REGULAR:
            self._body_fits(at, size, f"entry {name!r} of type {kind!r}")
            self._skip = size + pad  # an unknown type: tarfile skips its body
            return
        self._open_member = name
        if size > self.max_member_size:
            raise DecodeError(
                f"{self.url}: member {name!r} at offset {offset} has {size} bytes, "
                f"over max_member_size={self.max_member_size}"
            )
        self._body_fits(at, size, f"member {name!r}")
        self._ext = None
        self._name = name
        self._offset = offset
        self._end = data_at + size + pad
        self._collect(size, out)

    def _collect(self, size: int, out: list[TarMember]) -> None:
        if size:
            self._want = size
        else:
            self._complete(b"", out)

    def _complete(self, data: bytes, out: list[TarMember]) -> None:
        """A body is complete: emit the member, or take in the extended header."""
        self._skip = -len(data) % _BLOCK
        ext = self._ext
        if ext is None:
            if not self._skip:
                self._open_member = None  # no padding to read: the member is whole
            out.append(TarMember(self._name, data, self._offset, self._end))
            return
        self._ext = None
        if ext == b"L":
            if self._chain_name is None:  # an inner long name is overridden: not kept
                self._chain_name = _nts(data)
            return
        if ext == b"K":
            return  # a long link target: links are skipped
        headers: dict[str, str] = {}
        try:
            _parse_pax(data, headers)
        except ValueError as exc:
            raise self._corrupt(self._offset, f"bad pax header: {exc}") from None
        sparse = _has_sparse(headers)  # this header's keys only, once
        if ext == b"g":  # tarfile updates its global dict: later keys replace earlier ones
            self._global_path = headers.get("path", self._global_path)
            self._global_size = headers.get("size", self._global_size)
            self._global_sparse = self._global_sparse or sparse
            return
        # tarfile gives an 'x' header a copy of the global dict, updated with its own keys.
        self._chain_sparse = self._chain_sparse or sparse
        path = headers.get("path", self._global_path)
        if path is not None and self._chain_name is None:
            self._chain_name = path.rstrip("/")
        text = headers.get("size", self._global_size)
        if text is not None:
            try:
                size = int(text)
            except ValueError:
                size = 0  # as tarfile: a size that is not a number is 0
            if size < 0:
                raise self._corrupt(self._offset, f"negative pax size {size}")
            if self._chain_size is None:
                self._chain_size = size


# -- grouping into samples ----------------------------------------------------------------


def base_plus_ext(path: str) -> tuple[str, str] | tuple[None, None]:
    """webdataset's split of a name into key and extensions: ``a/b.c.d`` -> (``a/b``, ``c.d``)."""
    match = _BASE_PLUS_EXT.match(path)
    if not match:
        return None, None
    return match.group(1), match.group(2)


def _is_meta(name: str) -> bool:
    """webdataset's ``tar_file_iterator`` skips these: ``__*__`` files and folders."""
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return True
    return _SKIP_META.match(name) is not None


class SampleGrouper:
    """Groups the members of one shard into samples, exactly as webdataset does.

    ``push(member)`` returns the sample that the member completes (the previous
    one, when the key changes) or None; ``flush()`` returns the last sample at
    the end of the shard: samples never straddle shards. ``last_end`` is the TAR
    offset just past the last member of the most recently returned sample: a
    reader resumed there yields the samples that follow it.
    """

    def __init__(self, url: str, *, lcase: bool = True) -> None:
        self.url = url
        self.lcase = lcase
        self._sample: Sample | None = None
        self._sample_end = 0
        self._last_end = 0

    @property
    def last_end(self) -> int:
        return self._last_end

    def push(self, member: TarMember) -> Sample | None:
        name = member.name
        if _is_meta(name):
            return None
        match = _BASE_PLUS_EXT.match(name)
        if match is None:
            return None
        key, ext = match.group(1), match.group(2)
        if self.lcase:
            ext = ext.lower()
        done = None
        sample = self._sample
        if sample is None or sample["__key__"] != key:
            if sample is not None:
                done = sample
                self._last_end = self._sample_end
            sample = self._sample = {"__key__": key, "__url__": self.url}
        if ext in sample:
            raise DecodeError(
                f"{self.url}: duplicate file name {name!r} at offset {member.offset}: "
                f"sample {key!r} already has {ext!r}"
            )
        sample[ext] = member.data
        self._sample_end = member.end
        return done

    def key_of(self, name: str) -> str | None:
        """The key of the sample a member named ``name`` belongs to (None: not grouped)."""
        if _is_meta(name):
            return None
        match = _BASE_PLUS_EXT.match(name)
        return None if match is None else match.group(1)

    def flush(self) -> Sample | None:
        """The last sample of the shard (call at its end)."""
        sample, self._sample = self._sample, None
        if sample is not None:
            self._last_end = self._sample_end
        return sample


def iter_samples(
    url: str, blocks: Iterable[bytes | bytearray | memoryview], **kwargs: Any
) -> Iterator[Sample]:
    """The samples of one shard given as blocks of bytes (``kwargs`` go to ``TarReader``).

    A damaged shard yields every whole sample before the damage (the one being grouped
    too, as webdataset does, unless the damage is inside one of its members), then
    raises ``DecodeError``."""
    reader = TarReader(url, **kwargs)
    grouper = SampleGrouper(url)
    for block in blocks:
        try:
            members = reader.feed(block)
        except DecodeError:
            if (held := _held_sample(reader, grouper)) is not None:
                yield held
            raise
        for member in members:
            sample = grouper.push(member)
            if sample is not None:
                yield sample
    try:
        reader.close()
    except DecodeError:
        if (held := _held_sample(reader, grouper)) is not None:
            yield held
        raise
    sample = grouper.flush()
    if sample is not None:
        yield sample


def _held_sample(reader: TarReader, grouper: SampleGrouper) -> Sample | None:
    """After the stream broke off: the sample being grouped, unless the break is inside
    one of its members (then it is incomplete)."""
    sample = grouper.flush()
    if sample is None:
        return None
    broken = reader.broken_member
    if broken is not None and grouper.key_of(broken) == sample["__key__"]:
        return None
    return sample


def samples_to_table(samples: Sequence[Sample], columns: Sequence[str] | None = None) -> pa.Table:
    """Samples as a table: ``__key__``, ``__url__`` and one ``large_binary`` per extension.

    Extensions come in the order first seen (or ``columns``' order, with a
    missing one all null); a sample without an extension has a null there
    (``WebDatasetDecoder`` checks ``columns`` first, see ``missing_is_error``).
    """
    if columns is None:
        names: dict[str, None] = {}
        for sample in samples:
            names.update(dict.fromkeys(sample))
        wanted = [name for name in names if name not in ("__key__", "__url__")]
        wanted = ["__key__", "__url__", *wanted]
    else:
        wanted = list(columns)
    arrays = []
    for name in wanted:
        values = [sample.get(name) for sample in samples]
        if name not in ("__key__", "__url__"):
            arrays.append(pa.array(values, type=pa.large_binary()))
            continue
        try:
            arrays.append(pa.array(values, type=pa.string()))
        except UnicodeEncodeError:
            bad = next(v for v in values if isinstance(v, str) and not _is_utf8(v))
            raise DecodeError(
                f"{samples[0].get('__url__')}: {name} {bad!r} is not valid UTF-8 (a member "
                "name in another encoding), which a string column cannot hold"
            ) from None
    return pa.Table.from_arrays(arrays, names=wanted)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- the decoder --------------------------------------------------------------------------

OnError = Literal["raise", "warn", "skip_shard"]
_ON_ERROR = ("raise", "warn", "skip_shard")
_SAMPLE_OVERHEAD = 256  # bytes a sample costs beyond its members' bodies (dict, key, url)

_log = logging.getLogger("aiostream_hf.webdataset")


class SkippedShardWarning(UserWarning):
    """Part of a shard was skipped under ``on_error="warn"``; the message says where and why."""


_EXTRAS = {"PIL": ("Pillow", "image"), "torch": ("torch", "torch")}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or blocked in sys.modules
        return False


def _require(module: str, spec: str) -> None:
    """An image spec's library is there, or a ``SourceError`` naming the extra that brings it."""
    if not _installed(module):
        name, extra = _EXTRAS[module]
        raise SourceError(
            f"decode={spec!r} decodes images with {name}, which is not installed: "
            f"pip install 'aiostream-hf[{extra}]'"
        )


def _require_image_libraries(spec: str) -> None:
    from webdataset import autodecode

    _require("PIL", spec)  # every image spec reads the image with Pillow
    kind = autodecode.imagespecs.get(spec, ("",))[0]
    if kind == "torch":
        _require("torch", spec)


def sample_decoder(decode: Any) -> Callable[[Sample], Sample] | None:
    """webdataset's ``autodecode.Decoder`` for ``decode``, as ``wds.decode(*specs)`` builds it.

    ``decode``: None (bytes as stored), an image spec (``"pil"``, ``"rgb8"``,
    ``"torchrgb"``, ... see ``webdataset.autodecode.imagespecs``), a handler
    callable ``(key, data) -> value``, or a list of those; the default handlers
    (text, json, cls, npy, ...) come after them, as in webdataset. Image specs
    (and webdataset's ``ImageHandler``) need Pillow, the ``image`` extra: without
    it this raises ``SourceError`` at once, naming the extra.
    """
    if decode is None:
        return None
    from webdataset import autodecode

    specs = list(decode) if isinstance(decode, (list, tuple)) else [decode]
    handlers = []
    for spec in specs:
        if isinstance(spec, str):
            if spec not in autodecode.imagespecs:
                raise SourceError(
                    f"decode={spec!r}: not an image spec; use one of "
                    f"{', '.join(sorted(autodecode.imagespecs))}, a handler, or None"
                )
            _require_image_libraries(spec)
            handlers.append(autodecode.imagehandler(spec))
        elif callable(spec):
            if isinstance(spec, autodecode.ImageHandler):
                _require_image_libraries(spec.imagespec)
            handlers.append(spec)
        else:
            raise SourceError(f"decode={spec!r}: give an image spec string or a handler callable")
    decoder: Callable[[Sample], Sample] = autodecode.Decoder(handlers)
    return decoder


def _check_columns(samples: Iterable[Sample], columns: Sequence[str], url: str) -> None:
    """``SourceError`` for the first sample that lacks one of ``columns`` (webdataset's
    ``to_tuple`` raises for a missing key too), naming the sample, shard, column and
    the extensions the sample has, and the two ways out."""
    for sample in samples:
        missing = [name for name in columns if name not in sample]
        if not missing:
            continue
        has = [name for name in sample if name not in ("__key__", "__url__")]
        raise SourceError(
            f"{url}: sample {sample.get('__key__')!r} has no {missing[0]!r} (its extensions: "
            f"{', '.join(has) or 'none'}), which columns={list(columns)!r} asks for: "
            "pass missing_is_error=False (aiostream_hf.webdataset.stream or "
            "WebDatasetDecoder) for None where a sample lacks a column, or "
            f"filter=pyarrow.compute.field({missing[0]!r}).is_valid() to skip such samples"
        )


def _weight(sample: Sample) -> int:
    """Roughly the bytes a sample holds (bodies, decoded arrays and images)."""
    total = _SAMPLE_OVERHEAD
    for value in sample.values():
        if isinstance(value, (bytes, bytearray, str)):
            total += len(value)
            continue
        nbytes = getattr(value, "nbytes", None)
        if isinstance(nbytes, int):
            total += nbytes
        elif hasattr(value, "getbands") and hasattr(value, "size"):  # a PIL image
            width, height = value.size
            total += width * height * len(value.getbands())
    return total


class _Shard:
    """The parse state of one shard between blocks. Its methods run in worker threads,
    one call at a time; the async side only hands blocks over and yields chunks."""

    def __init__(
        self,
        decoder: WebDatasetDecoder,
        url: str,
        start: Position,
        request: ReadRequest,
        size: int | None = None,
    ) -> None:
        offset = start.offset
        self.url = url
        self.policy = decoder.on_error
        self.decode = decoder.sample_decoder
        self.missing_is_error = decoder.missing_is_error
        self.request = request
        self.reader = TarReader(
            url,
            max_member_size=decoder.max_member_size,
            compression="none" if offset else "auto",
            start_offset=offset or 0,
            size=size,
        )
        self.torn = False  # the TAR stream broke off (damage, a cut): see salvage()
        self.skipped = 0  # samples skipped under on_error since the last chunk
        self.grouper = SampleGrouper(url)
        self.skip = start.skip if offset is None else 0  # samples to pass (a resumed gzip)
        self.passed = 0  # samples parsed from where the reading started (for skip counts)
        self.row = start.row  # rows of the shard delivered before the next chunk
        self.mark_offset = offset or 0  # resume offset after the samples passed so far
        self.problems: list[str] = []  # decode failures skipped, reported by the async side

    @property
    def by_offset(self) -> bool:
        return not self.reader.compressed

    def _mark(self) -> int:
        return self.mark_offset if self.by_offset else self.passed

    def feed(self, block: bytes) -> Chunk | None:
        samples = []
        grouper = self.grouper
        try:
            members = self.reader.feed(block)
        except DecodeError:
            self.torn = True
            raise
        for member in members:
            sample = grouper.push(member)
            if sample is not None:
                samples.append((sample, grouper.last_end))
        return self._counted(self._chunk(samples, final=False)) if samples else None

    def finish(self) -> Chunk:
        try:
            self.reader.close()
        except DecodeError:
            self.torn = True
            raise
        sample = self.grouper.flush()
        done = [(sample, self.grouper.last_end)] if sample is not None else []
        return self._counted(self._chunk(done, final=True))

    def salvage(self, exc: Exception) -> Chunk | None:
        """After the TAR stream broke off (a corrupt header, a cut, a failed read): the
        sample being grouped, as webdataset delivers it, unless the break is inside one
        of its members (then it is incomplete, and dropped)."""
        if not (self.torn or isinstance(exc, FetchError)):
            return None  # not damage to the stream (a sample decode= failed on, ...)
        sample = _held_sample(self.reader, self.grouper)
        if sample is None:
            return None
        columns = self.request.columns
        if columns is not None and any(c not in sample for c in columns):
            return None  # the members it lacks may lie past the damage: not known whole
        return self._counted(self._chunk([(sample, self.grouper.last_end)], final=False))

    def abandon(self) -> Chunk:
        """The final, empty chunk after damage (the rest of the shard is skipped)."""
        skipped, self.skipped = self.skipped, 0
        return Chunk(
            [] if self.request.rows else samples_to_table([]),
            (self._mark(),),
            self.row,
            True,
            _SAMPLE_OVERHEAD,
            self.by_offset,
            skipped=skipped,
            damaged=True,
        )

    def _counted(self, chunk: Chunk) -> Chunk:
        """The chunk, with the samples skipped since the last one counted in it."""
        skipped, self.skipped = self.skipped, 0
        return dataclasses.replace(chunk, skipped=skipped) if skipped else chunk

    def _chunk(self, samples: list[tuple[Sample, int]], *, final: bool) -> Chunk:
        """Samples (each with the TAR offset just past it) as the next chunk."""
        request = self.request
        kept: list[Sample] = []
        positions = [self._mark()]
        for sample, end in samples:
            self.passed += 1
            self.mark_offset = end  # after this sample (and the skipped members before it)
            if self.skip:
                self.skip -= 1
                positions[0] = self._mark()
                continue
            kept.append(sample)
            positions.append(self._mark())
        if request.filter is not None:
            table = samples_to_table(kept, request.columns)
            index = pa.array(range(len(kept)), pa.int64())
            picked = table.append_column("__row__", index).filter(request.filter)
            chosen = picked.column("__row__").to_pylist()
            kept = [kept[i] for i in chosen]
            positions = [positions[0], *(positions[i + 1] for i in chosen)]
        if request.columns is not None and self.missing_is_error:
            _check_columns(kept, request.columns, self.url)
        if request.columns is not None and request.rows:
            kept = [{name: s.get(name) for name in request.columns} for s in kept]
        if self.decode is not None:
            kept, positions = self._decode(kept, positions)
        rows: pa.Table | list[Sample]
        if request.rows:
            rows = kept
            nbytes = sum(_weight(s) for s in kept)
        else:
            rows = samples_to_table(kept, request.columns)
            nbytes = rows.nbytes + _SAMPLE_OVERHEAD
        first, self.row = self.row, self.row + len(kept)
        return Chunk(rows, tuple(positions), first, final, nbytes, self.by_offset)

    def _decode(
        self, samples: list[Sample], positions: list[int]
    ) -> tuple[list[Sample], list[int]]:
        assert self.decode is not None
        out: list[Sample] = []
        kept = [positions[0]]
        for sample, position in zip(samples, positions[1:], strict=True):
            try:
                decoded = self.decode(sample)
            except Exception as exc:  # webdataset's handlers raise anything; this is its channel
                cause = exc.__cause__ or exc
                message = (
                    f"{self.url}: cannot decode sample {sample.get('__key__')!r} "
                    f"({type(cause).__name__}: {cause})"
                )
                if self.policy == "raise":
                    raise DecodeError(message) from exc
                self.problems.append(message + "; the sample is skipped")
                self.skipped += 1
                if not out:
                    kept[0] = position
                continue
            out.append(decoded)
            kept.append(position)
        return out, kept


class WebDatasetDecoder(SequentialDecoder[Unit]):
    """WebDataset TAR shards (``.tar``, ``.tar.gz``, ``.tgz``), read block by block.

    A stream reads each shard with one long GET (``iter_bytes``) and parses
    the blocks as they arrive (``TarReader`` + ``SampleGrouper`` in worker
    threads), yielding one chunk of samples per block: memory is set by the
    block size and the stream's readahead budget, not by shard sizes.

    ``decode``: None (bytes), or webdataset's decoders (see ``sample_decoder``).
    ``on_error``: what a damaged shard (corrupt, truncated, unreadable) does:
    ``"raise"`` a ``DecodeError``/``FetchError`` naming the shard and offset,
    after every sample before the damage; ``"warn"``: a ``SkippedShardWarning``
    naming them and the rest of the shard is skipped; ``"skip_shard"``: the
    same, logged on the ``aiostream_hf.webdataset`` logger instead of warned.
    A sample that ``decode`` fails on is raised, or skipped with the same report.
    ``readahead``: shards read ahead of the one being consumed (open GETs).
    ``resampled``: draw shards with replacement, endlessly (by seed and rank).
    ``missing_is_error`` (webdataset's ``to_tuple`` argument): a sample without
    one of the stream's ``columns`` raises ``SourceError`` (True, the default;
    whatever ``on_error`` says: it is a question of the request, not damage) or
    has None there (False).

    ``plan``/``fetch``/``decode`` remain for code that drives decoders by
    units: one unit per shard, the whole shard in one read.
    """

    name = "webdataset"
    extensions = (".tar", ".tar.gz", ".tgz")

    def __init__(
        self,
        *,
        decode: Any = None,
        on_error: OnError = "raise",
        readahead: int = 2,
        resampled: bool = False,
        max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
        missing_is_error: bool = True,
    ) -> None:
        if on_error not in _ON_ERROR:
            raise SourceError(f"on_error={on_error!r}: use 'raise', 'warn' or 'skip_shard'")
        if isinstance(readahead, bool) or not isinstance(readahead, int) or readahead < 0:
            raise SourceError(f"readahead={readahead!r}: shards read ahead, an int >= 0")
        self.decode_spec = decode
        self.sample_decoder = sample_decoder(decode)
        self.on_error: OnError = on_error
        self.readahead = readahead
        self.resampled = bool(resampled)
        self.max_member_size = max_member_size
        self.missing_is_error = bool(missing_is_error)

    def __repr__(self) -> str:
        return (
            f"WebDatasetDecoder(decode={self.decode_spec!r}, on_error={self.on_error!r}, "
            f"readahead={self.readahead}, resampled={self.resampled}, "
            f"missing_is_error={self.missing_is_error})"
        )

    # -- streaming ------------------------------------------------------------------------

    async def read_chunks(
        self,
        file: FileRef,
        source: StreamSource,
        request: ReadRequest,
        start: Position,
        emit: Emit,
    ) -> None:
        """One long GET; while a block is parsed (in a worker thread) the next one is read."""
        url = file.url
        if self.sample_decoder is not None and not request.rows:
            raise SourceError(
                f"decode={self.decode_spec!r} gives Python objects, which output='arrow' "
                "and batch_size= cannot hold: take dict rows (batch in your DataLoader)"
            )
        shard = _Shard(self, url, start, request, size=file.size)
        # A rendezvous: the reader holds one block ready while the parser works on the last.
        send, receive = anyio.create_memory_object_stream[bytes](0)
        failed: list[Exception] = []
        # Cancelled at the end-of-archive blocks: what a server sends after them (the
        # record's padding, or an endless body) is not read.
        reading = anyio.CancelScope()

        async def read() -> None:
            with reading:
                async with send:
                    try:
                        async with source.iter_bytes(file, start=start.offset or 0) as blocks:
                            async for block in blocks:
                                await send.send(block)
                    except anyio.get_cancelled_exc_class():
                        raise
                    except Exception as exc:  # handed to the parser, after the blocks before it
                        failed.append(exc)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                try:
                    async with receive:
                        async for block in receive:
                            chunk = await anyio.to_thread.run_sync(shard.feed, block)
                            self._report(shard)
                            if chunk is not None:
                                await emit(chunk)
                            if shard.reader.ended:
                                reading.cancel()
                                break
                    if failed:
                        raise failed[0]
                    last = await anyio.to_thread.run_sync(shard.finish)
                    self._report(shard)
                except anyio.get_cancelled_exc_class():
                    raise
                except Exception as exc:  # raised below, outside the task group (unwrapped)
                    failed[:] = [exc]
                    tg.cancel_scope.cancel()
            if failed:
                raise failed[0]
        except (DecodeError, FetchError) as exc:
            # The sample being grouped when the stream broke off, if it is whole, comes
            # first (webdataset delivers it too); then the error, or the skip.
            salvaged = await anyio.to_thread.run_sync(shard.salvage, exc)
            if salvaged is not None:
                self._report(shard)
                await emit(salvaged)
            if self.on_error == "raise":
                raise
            at = shard.reader.offset
            shard.problems.append(
                f"{url}: skipping the rest of the shard from byte {at}"
                f"{'' if shard.by_offset else ' of the gzip stream'} "
                f"({shard.row} samples delivered from it): {exc}"
            )
            self._report(shard)
            last = shard.abandon()
        await emit(last)

    def _report(self, shard: _Shard) -> None:
        problems, shard.problems = shard.problems, []
        for message in problems:
            if self.on_error == "warn":
                warnings.warn(message, SkippedShardWarning, stacklevel=2)
            else:
                _log.warning("%s", message)

    # -- one unit per shard (the plan/fetch/decode model) -----------------------------------

    async def plan(self, file: FileRef, source: ByteSource, request: ReadRequest) -> list[Unit]:
        size = file.size
        if size is None:
            _, size = await source.read_tail(file, 1)
            file = dataclasses.replace(file, size=size)
        return [Unit(file, 0, size)]

    async def fetch(self, unit: Unit, source: ByteSource) -> bytes:
        size = unit.file.size
        if not size:
            return b""
        (data,) = await source.read_ranges(unit.file, [(0, size)])
        return data

    def decode(self, unit: Unit, fetched: Any, request: ReadRequest) -> pa.Table:
        url = unit.file.url
        samples = list(iter_samples(url, [fetched]))
        table = samples_to_table(samples, request.columns)
        if request.filter is not None:
            keep = table.append_column("__row__", pa.array(range(len(samples)), pa.int64()))
            chosen = keep.filter(request.filter).column("__row__").to_pylist()
            table = table.take(pa.array(chosen, pa.int64()))
            samples = [samples[i] for i in chosen]
        if request.columns is not None and self.missing_is_error:
            _check_columns(samples, request.columns, url)
        return table
