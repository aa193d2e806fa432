"""The incremental TAR reader of WebDataset shards: bytes in blocks of any size, members out.

``TarReader`` understands ustar, GNU long names and links (``L``/``K``), pax
extended and global headers (``x``/``g``) and gzip-compressed shards (detected
by their magic bytes). It validates every header checksum, holds at most one
member's body plus one header block, and records offsets so a stream can resume
at a member boundary: ``TarMember.offset`` is where a reader can start reading
the member (its first extended header, if any) and ``TarMember.end`` is just past
its padded body, both in the uncompressed TAR stream. For an uncompressed shard,
resuming after a member is ``iter_bytes(file, start=member.end)`` fed to
``TarReader(url, start_offset=member.end)``; a gzip shard restarts from byte 0.

Synchronous and free of I/O: the bytes come from whoever feeds it. Public through
``aiostream_hf.formats.webdataset``.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Literal

from .._exceptions import ClosedResourceError, DecodeError

__all__ = ["DEFAULT_MAX_MEMBER_SIZE", "MAX_EXTENDED_HEADER_SIZE", "TarMember", "TarReader"]

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
