"""What ``video.open`` reads, as a ``FileRef``: an http(s), ``hf://``, ``s3://`` or
file:// URL, a local path, or a ``FileRef``. An ``hf://`` file gets its URL, size and ETag
from one HEAD of its ``/resolve/`` URL when the reader opens, an ``s3://`` object from
its listing (``_listed``)."""

from __future__ import annotations

import os
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from ._exceptions import SourceError
from ._models import FileRef
from ._sources import BucketSource, HubSource, has_glob, is_bucket_uri, parse_sources

if TYPE_CHECKING:
    from ._resolver import Resolver

VideoSource: TypeAlias = "str | os.PathLike[str] | FileRef"
"""What ``open`` reads: an http(s), ``s3://`` or file:// URL, a local path, or a FileRef."""


def check_source(source: str) -> None:
    """Raise ``SourceError`` now for an hf:// or s3:// URL that ``open`` would refuse
    (one that does not name one file); reads nothing."""
    if source.startswith("hf://") or is_bucket_uri(source):
        _file_ref(source)


def _file_ref(source: VideoSource) -> FileRef:
    if isinstance(source, FileRef):
        return source
    if isinstance(source, str):
        scheme = urllib.parse.urlsplit(source).scheme.lower()
        if scheme in ("http", "https"):
            return FileRef(source, source)
        if scheme == "hf":
            found = parse_sources(source)
            one = found[0] if len(found) == 1 else None
            if not isinstance(one, HubSource) or not one.path or has_glob(one.path):
                raise SourceError(
                    f"cannot open {source!r} as a video: name one file of a repo, "
                    "hf://datasets/ORG/NAME[@REVISION]/PATH/TO/VIDEO.mp4"
                )
            return FileRef(source, source)  # its URL, size and ETag: at aopen()
        if is_bucket_uri(source):
            found = parse_sources(source)
            src = found[0] if len(found) == 1 else None
            if not isinstance(src, BucketSource) or has_glob(src.key) or src.key.endswith("/"):
                raise SourceError(
                    f"cannot open {source!r} as a video: name one object, {scheme}://BUCKET/KEY"
                )
            return FileRef(src.uri, src.uri)  # its URL, size and ETag: at aopen()
        if scheme == "file":
            return _local_ref(Path(urllib.request.url2pathname(urllib.parse.urlsplit(source).path)))
        if len(scheme) > 1:
            raise SourceError(
                f"cannot open {source!r} as a video: give an http(s) or s3:// URL, "
                "a file:// URL, a local path or a FileRef"
            )
    elif not isinstance(source, os.PathLike):
        raise SourceError(
            f"cannot open {source!r} as a video: give an http(s) or s3:// URL, "
            "a file:// URL, a local path or a FileRef"
        )
    return _local_ref(Path(os.fspath(source)).expanduser())


async def _listed(uri: str, resolver: Resolver, source: object = None) -> FileRef:
    """The ``FileRef`` of one S3 object or Hub file (URL, size, ETag), from its listing.

    A Hub file: from one request, the HEAD of its ``/resolve/`` URL (``Resolver.file_head``:
    the commit, the size, the ETag, and the CDN URL it redirects to, which ``source``, a
    ``RangeFetcher``, then reads from: the index read is the open's second round trip);
    from the repo's listing when that answer lacks one of them."""
    (src,) = parse_sources(uri)
    if isinstance(src, HubSource):
        found = await resolver.file_head(src)
        if found is not None:
            file, location = found
            learn = getattr(source, "learn_route", None)
            if location is not None and callable(learn):
                from ._transfer import _reuse_until

                learn(file, location, _reuse_until(location))
            return file
    manifest = await resolver.resolve(uri)
    want = src.path if isinstance(src, HubSource) else uri
    if len(manifest.files) != 1 or manifest.files[0].path != want:
        raise SourceError(f"cannot open {uri!r} as a video: name one file, not a folder")
    return manifest.files[0]


def _local_ref(path: Path) -> FileRef:
    if not path.is_file():
        raise SourceError(f"no video file at {str(path)!r}: check the path")
    path = path.resolve()
    return FileRef(path.as_uri(), str(path), size=path.stat().st_size)
