"""webdataset's grouping of TAR members into samples, and samples as a table.

``SampleGrouper`` groups members into samples exactly as ``webdataset`` does
(``tar_file_iterator`` + ``group_by_keys``): meta files ``__*__`` and names
without an extension are skipped, the key is the directory plus the basename up
to its first dot, the extension is the rest (lower-cased), consecutive members
with one key form a sample ``{"__key__": key, "__url__": url, ext: bytes}``.
``iter_samples`` runs a ``TarReader`` and a grouper over a shard's blocks;
``samples_to_table`` turns samples into a ``pyarrow.Table``.

Synchronous and free of I/O. Public through ``aiostream_hf.formats.webdataset``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from .._exceptions import DecodeError
from ._tar import TarMember, TarReader

__all__ = [
    "Sample",
    "SampleGrouper",
    "base_plus_ext",
    "held_sample",
    "iter_samples",
    "samples_to_table",
]

# webdataset.tariterators: base_plus_ext and tar_file_iterator's skip_meta.
_BASE_PLUS_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_SKIP_META = re.compile(r"__[^/]*__($|/)")

Sample = dict[str, Any]


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
            if (held := held_sample(reader, grouper)) is not None:
                yield held
            raise
        for member in members:
            sample = grouper.push(member)
            if sample is not None:
                yield sample
    try:
        reader.close()
    except DecodeError:
        if (held := held_sample(reader, grouper)) is not None:
            yield held
        raise
    sample = grouper.flush()
    if sample is not None:
        yield sample


def held_sample(reader: TarReader, grouper: SampleGrouper) -> Sample | None:
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
