"""Parsing of the source strings passed to ``stream(source, ...)``.

Everything here is a pure function of its input, with one exception: local
paths and local globs are checked against (and expanded from) the filesystem,
so that a typo fails at once, naming the path.

Accepted sources:

- ``hf://datasets/ORG/NAME[@REVISION][/PATH-OR-GLOB]``: a dataset repo on the
  Hub. ``REVISION`` is a branch, tag, commit sha, ``refs/convert/parquet`` or
  ``refs/pr/N``, URL-quoted or not. The revision/path split follows
  huggingface_hub's rule (``HfFileSystem.resolve_path``, ``parse_hf_uri``):
  ``refs/convert/NAME`` and ``refs/pr/N`` are matched first, otherwise the
  revision ends at the first ``/``. The path may hold glob characters; it is
  matched against the repo tree later, by the resolver. The path and the revision
  must stay inside the repo (``repo_path_problem``): no ``.``, ``..`` or empty segment,
  no backslash, no control character, nothing percent-encoded that decodes to one of
  these or to a ``/`` (``%2e%2e``, ``%2f``).
- ``https://...`` and ``http://...`` URLs.
- ``SCHEME://BUCKET[/KEY-PREFIX-OR-GLOB]`` for the scheme of an object store
  (``s3://``: ``aiostream_hf.stores`` registers the schemes): objects of a bucket. A key
  names one object, or the folder of that name (a trailing ``/`` says folder); glob
  characters match keys as they match Hub paths. The bucket is listed later, by its
  store; the store's extra must be installed (checked here).
- local paths (absolute, relative, ``~``), ``file://`` URLs and local globs
  (``*``, ``?``, ``[...]``, ``**``). A directory stands for the files below it.
- a list or tuple of these, flattened in order.

Every string form first goes through bash-style brace expansion, with the
semantics of the ``braceexpand`` package that ``webdataset`` uses for shard
lists: ``{000..099}`` (zero padded when a bound has a leading zero, to the
width of the longer bound), ``{a,b,c}``, ``{a..e}``, ``{0..10..2}``, several
groups (cartesian product, first group slowest) and nested groups. Unlike
``braceexpand``, a group that is neither a list nor a range (``{1..}``,
``{a}``, ``{}``) is an error rather than literal text, and the number of
results is computed and capped *before* anything is generated. In a pattern
that has braces, ``\\{``, ``\\}``, ``\\,`` and ``\\\\`` stand for the literal
characters; a string without braces is used exactly as given.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TypeAlias
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

from huggingface_hub.errors import HFValidationError

# huggingface_hub.utils is a lazy facade whose __all__ is built at runtime: mypy cannot see
# that validate_repo_id (documented there) is exported.
from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]

from ._exceptions import SourceError

__all__ = [
    "MAX_BRACE_EXPANSION",
    "HubSource",
    "LocalSource",
    "BucketSource",
    "is_bucket_uri",
    "register_bucket_scheme",
    "unregister_bucket_scheme",
    "Source",
    "UrlSource",
    "expand_braces",
    "has_glob",
    "parse_sources",
    "repo_path_problem",
]

#: The most strings one brace pattern may expand to.
MAX_BRACE_EXPANSION = 1_000_000


@dataclass(frozen=True, slots=True)
class HubSource:
    """A dataset repo on the Hub, optionally pinned and narrowed to a path or glob.

    ``revision`` is unquoted (``"refs/convert/parquet"``) and ``None`` when the
    source names none. ``path`` is relative to the repo root, may contain glob
    characters, and is ``None`` for the whole repo.
    """

    repo_id: str
    revision: str | None
    path: str | None

    @property
    def uri(self) -> str:
        """The canonical ``hf://datasets/...`` form, which parses back to this source."""
        uri = f"hf://datasets/{self.repo_id}"
        if self.revision is not None:
            revision = self.revision
            if "/" in revision and not _SPECIAL_REFS.fullmatch(revision):
                revision = revision.replace("/", "%2F")
            uri += f"@{revision}"
        if self.path:
            uri += f"/{self.path}"
        return uri


@dataclass(frozen=True, slots=True)
class UrlSource:
    """One ``http(s)://`` URL, after brace expansion."""

    url: str


@dataclass(frozen=True, slots=True)
class LocalSource:
    """One existing local file, as an absolute, normalized path.

    Symlinks are not followed: a file in the Hugging Face cache is a symlink to a
    blob named by its hash, and its own name (with its extension) is what
    format detection needs.
    """

    path: Path


@dataclass(frozen=True, slots=True)
class BucketSource:
    """Objects of a bucket of an object store (``SCHEME://BUCKET/KEY``, a scheme a store
    of ``aiostream_hf.stores`` registered): one key, a folder of keys, or a glob over
    keys. ``key`` is "" for the whole bucket; a key ending in ``/`` is a folder; a key
    with glob characters is matched against the bucket's keys."""

    bucket: str
    key: str
    scheme: str = "s3"

    @property
    def uri(self) -> str:
        """The canonical ``SCHEME://BUCKET/KEY`` form, which parses back to this source."""
        return f"{self.scheme}://{self.bucket}/{self.key}"


#: The bucket schemes of the stores (``aiostream_hf.stores`` registers them), each with
#: the check that its store can be used (its extra installed), run when a source parses.
_BUCKET_SCHEMES: dict[str, Callable[[], None]] = {}


def is_bucket_uri(value: str) -> bool:
    """Whether ``value`` is a ``SCHEME://...`` of a registered bucket store."""
    scheme, sep, _ = value.partition("://")
    return bool(sep) and scheme.lower() in _BUCKET_SCHEMES


def unregister_bucket_scheme(scheme: str) -> None:
    """Parse ``scheme://`` no more (its store was taken away)."""
    _BUCKET_SCHEMES.pop(scheme, None)


def register_bucket_scheme(scheme: str, check: Callable[[], None]) -> None:
    """Parse ``scheme://BUCKET/KEY`` as a ``BucketSource``; ``check`` raises
    ``SourceError`` naming what is missing when its store cannot be used."""
    _BUCKET_SCHEMES[scheme] = check


Source: TypeAlias = HubSource | UrlSource | LocalSource | BucketSource

_ACCEPTED_FORMS = (
    "Accepted sources: 'hf://datasets/ORG/NAME[@REVISION][/PATH-OR-GLOB]'; "
    "'https://HOST/PATH' or 'http://HOST/PATH'; "
    "'s3://BUCKET/KEY-PREFIX-OR-GLOB'; "
    "a local file, directory or glob ('data/train.parquet', 'data/**/*.tar', "
    "'file:///abs/path'); or a list of these. "
    "Braces expand in all of them: 'shard-{000..099}.tar', 'data/{train,test}.parquet'."
)

_BRACE_FORMS = (
    "brace groups are lists like '{a,b,c}' or ranges like '{000..099}', '{a..e}', "
    "'{0..100..10}'; write '\\{' and '\\}' for literal braces"
)

# huggingface_hub's special refs (utils/_hf_uris.py, hf_file_system.py): revisions that
# contain '/' and take precedence when splitting '<revision>/<path>'.
_SPECIAL_REFS = re.compile(r"^refs/(?:convert/[\w.-]+|pr/\d+)")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_GLOB_MAGIC = re.compile(r"[*?[]")
_HF_REPO_TYPES = {"models": "model", "spaces": "space", "kernels": "kernel", "buckets": "bucket"}
_HF_SINGULAR = {"dataset", "model", "space", "kernel", "bucket"}
# A Hub repo id as datasets users write it ('org/name'): two names, the last without a
# file suffix ('data/train.parquet' that does not exist is a missing local file).
_REPO_ID = re.compile(r"[A-Za-z0-9][\w-]*(?:\.[\w-]+)*/[A-Za-z0-9][\w-]*")


def has_glob(path: str) -> bool:
    """Whether ``path`` contains glob characters (``*``, ``?`` or ``[``)."""
    return _GLOB_MAGIC.search(path) is not None


def parse_sources(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> list[Source]:
    """Turn what the user passed to ``stream()`` into a flat list of sources.

    Strings are brace-expanded, then parsed by scheme; local paths and globs are
    expanded to the existing files, sorted. Raises ``SourceError`` naming the
    input and the accepted forms for anything that cannot be used.
    """
    if isinstance(source, (list, tuple)):
        if not source:
            raise SourceError(f"empty list of sources: {source!r}. {_ACCEPTED_FORMS}")
        result: list[Source] = []
        for item in source:
            result.extend(_parse_one(item))
        return result
    return _parse_one(source)


def expand_braces(pattern: str) -> list[str]:
    """Bash-style brace expansion of ``pattern`` (see the module docstring).

    Raises ``SourceError`` for a malformed pattern or one that would expand to
    more than ``MAX_BRACE_EXPANSION`` strings.
    """
    try:
        return _expand_braces(pattern)
    except _BraceError as exc:
        raise SourceError(f"{exc.problem} in {pattern!r}: {_BRACE_FORMS}") from None


# --- one source ---------------------------------------------------------------------------


def _fail(problem: str, source: object) -> SourceError:
    """A SourceError that names the input (once) and the accepted forms."""
    if repr(source) not in problem:
        problem = f"{problem} (source {source!r})"
    return SourceError(f"{problem}. {_ACCEPTED_FORMS}")


def _parse_one(source: object) -> list[Source]:
    if isinstance(source, os.PathLike):
        path = os.fspath(source)
        if not isinstance(path, str):
            raise _fail("a bytes path is not a supported source", source)
        if not path:
            raise _fail("empty path", source)
        return _local_sources(_expand(path, source), source)
    if not isinstance(source, str):
        raise _fail(f"a source must be a string or a path, not {type(source).__name__}", source)
    if not source:
        raise _fail("empty source string", source)

    match = _SCHEME.match(source)
    if match is None:
        return _local_sources(_expand(source, source), source)
    scheme = match.group(1).lower()
    if scheme == "hf":
        return [_parse_hub(uri, source) for uri in _expand(source, source)]
    if scheme in ("http", "https"):
        return [_parse_url(url, source) for url in _expand(source, source)]
    if scheme in _BUCKET_SCHEMES:
        return [_parse_bucket(uri, scheme, source) for uri in _expand(source, source)]
    if scheme == "file":
        paths = [_file_url_path(url, source) for url in _expand(source, source)]
        return _local_sources(paths, source)
    raise _fail(f"unsupported scheme '{scheme}://'", source)


def _expand(pattern: str, source: object) -> list[str]:
    try:
        return _expand_braces(pattern)
    except _BraceError as exc:
        raise _fail(f"{exc.problem}: {_BRACE_FORMS}", source) from None


def _parse_url(url: str, source: object) -> UrlSource:
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed IPv6 '[' in the host
        raise _fail(f"URL {url!r} is malformed: {exc}", source) from None
    if not parts.netloc:
        raise _fail(f"URL {url!r} has no host", source)
    return UrlSource(url)


def _file_url_path(url: str, source: object) -> str:
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise _fail(f"file URL {url!r} is malformed: {exc}", source) from None
    if parts.netloc not in ("", "localhost"):
        raise _fail(
            f"file URL {url!r} names host {parts.netloc!r}; only local files are supported, "
            "as 'file:///abs/path'",
            source,
        )
    if not parts.path:
        raise _fail(f"file URL {url!r} has no path", source)
    return url2pathname(parts.path)


# --- buckets (s3:// and any store's scheme) ---------------------------------------------------

# Bucket names: 3-63 lowercase letters, digits, dots and hyphens, starting and ending with
# a letter or digit, widened as compatible stores and old buckets allow (uppercase letters,
# underscores, up to 255 characters).
_BUCKET = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,253}[A-Za-z0-9])?$")
_MAX_KEY_BYTES = 1024  # the longest key, in UTF-8 bytes


def _parse_bucket(uri: str, scheme: str, source: object) -> BucketSource:
    """Split ``SCHEME://BUCKET/KEY``; the key is kept as written (keys are not URL-quoted)."""
    bucket, _, key = uri[uri.index("://") + 3 :].partition("/")
    if not bucket:
        raise _fail(f"{uri!r} names no bucket: write '{scheme}://BUCKET/KEY-PREFIX'", source)
    if not _BUCKET.match(bucket):
        raise _fail(
            f"{uri!r}: {bucket!r} is not a bucket name (letters, digits, '.', '-' and '_'; "
            "it starts and ends with a letter or digit)",
            source,
        )
    if len(key.encode("utf-8", "surrogatepass")) > _MAX_KEY_BYTES:
        raise _fail(f"{uri!r}: the key is longer than {_MAX_KEY_BYTES} bytes", source)
    if any(ord(c) < 0x20 or c == "\x7f" for c in key):
        raise _fail(f"{uri!r}: the key has a control character", source)
    _BUCKET_SCHEMES[scheme]()
    return BucketSource(bucket=bucket, key=key, scheme=scheme)


# --- hf:// ----------------------------------------------------------------------------------


def _parse_hub(uri: str, source: object) -> HubSource:
    """Split ``hf://datasets/ORG/NAME[@REV][/PATH]`` as huggingface_hub does."""
    body = uri[uri.index("://") + 3 :]
    kind, _, location = body.partition("/")
    if kind != "datasets":
        raise _fail(_not_a_dataset(kind, body), source)

    location = location.strip("/")
    if not location:
        raise _fail(f"{uri!r} names no repo: write 'hf://datasets/ORG/NAME'", source)

    # '@' starts a revision only right after ORG/NAME; deeper in the path it is literal.
    at = location.find("@")
    revision: str | None
    if at == -1 or location[:at].count("/") > 1:
        revision = None
        parts = location.split("/", 2)
        if len(parts) < 2:
            raise _fail(
                f"{uri!r}: the repo id must be 'ORG/NAME', got {location!r}; "
                "write 'hf://datasets/ORG/NAME'",
                source,
            )
        repo_id = f"{parts[0]}/{parts[1]}"
        path = parts[2] if len(parts) > 2 else ""
    else:
        repo_id = location[:at]
        if repo_id.count("/") != 1:
            raise _fail(
                f"{uri!r}: the repo id must be 'ORG/NAME', got {repo_id!r}; "
                "write 'hf://datasets/ORG/NAME@REVISION'",
                source,
            )
        rev_and_path = location[at + 1 :]
        special = _SPECIAL_REFS.search(rev_and_path)
        if special is not None:
            raw_revision = special.group()
            path = rev_and_path[len(raw_revision) :].removeprefix("/")
        else:
            raw_revision, _, path = rev_and_path.partition("/")
        revision = unquote(raw_revision)
        if not revision:
            raise _fail(
                f"{uri!r} has an empty revision after '@'; "
                "write 'hf://datasets/ORG/NAME@REVISION' or drop the '@'",
                source,
            )

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise _fail(f"{uri!r}: invalid repo id {repo_id!r}: {exc}", source) from None
    for what, value in (("revision", revision), ("path", path)):
        problem = repo_path_problem(value, what) if value else None
        if problem is not None:
            raise _fail(f"{uri!r}: {problem}", source)
    return HubSource(repo_id=repo_id, revision=revision, path=path or None)


def repo_path_problem(path: str, what: str = "path") -> str | None:
    """Why ``path``, a path (or revision) inside a Hub repo, could leave the repo, with
    the way out; None when it stays inside.

    The one rule for every entry point that names a file of a repo (``stream``,
    ``video.open``, ``lerobot.stream``, the webdataset opener, the CLI): its
    ``/``-separated segments are not empty, ``.`` or ``..``; it has no backslash and no
    control character; and no segment percent-decodes (repeatedly: ``%252e`` too) to
    ``.``, ``..`` or to text with a ``/``, a backslash or a control character. A request
    built from such a path could leave the repo's URL prefixes (HTTP clients and proxies
    resolve dot segments), carrying the token with it.
    """
    problem = _segments_problem(path)
    if problem is None:
        return None
    fix = (
        "give a branch, tag or commit of the repo"
        if what == "revision"
        else "write the path from the repo root, as 'DIR/FILE', with no '.' or '..'"
    )
    return f"the {what} {path!r} {problem}, which could leave the repo: {fix}"


def _segments_problem(path: str) -> str | None:
    if "\\" in path:
        return "has a backslash"
    if any(c < " " or c == "\x7f" for c in path):
        return "has a NUL or control character"
    for segment in path.split("/"):
        if not segment:
            return "has an empty segment (a leading '/' or a '//')"
        if segment in (".", ".."):
            return f"has a {segment!r} segment"
        decoded = _fully_unquoted(segment)
        if decoded in (".", ".."):
            return f"has the segment {segment!r}, percent-encoded {decoded!r}"
        if "/" in decoded or "\\" in decoded:
            return f"has the segment {segment!r}, with a percent-encoded '/' or backslash"
        if any(c < " " or c == "\x7f" for c in decoded):
            return f"has the segment {segment!r}, with a percent-encoded control character"
    return None


def _fully_unquoted(text: str) -> str:
    """``text`` percent-decoded until it no longer changes (each pass shortens it)."""
    while True:
        decoded = unquote(text)
        if decoded == text:
            return text
        text = decoded


def _not_a_dataset(kind: str, body: str) -> str:
    only = "only dataset repos are supported, as 'hf://datasets/ORG/NAME[@REVISION][/PATH]'"
    if kind in _HF_REPO_TYPES:
        rest = body.partition("/")[2]
        return f"'hf://{body}' is a {_HF_REPO_TYPES[kind]} repo: {only}" + (
            f"; did you mean 'hf://datasets/{rest}'?" if rest else ""
        )
    if kind in _HF_SINGULAR:
        rest = body.partition("/")[2]
        return f"'hf://{body}': the repo type is written in the plural; {only}" + (
            f"; did you mean 'hf://datasets/{rest}'?" if rest else ""
        )
    if not body:
        return f"'hf://' names no repo: {only}"
    # huggingface_hub reads 'hf://ORG/NAME' (no type) as a model repo.
    return f"'hf://{body}' names a model repo: {only}; did you mean 'hf://datasets/{body}'?"


# --- local paths ----------------------------------------------------------------------------


def _local_sources(paths: list[str], source: object) -> list[Source]:
    result: list[Source] = []
    for raw in paths:
        path = os.path.expanduser(raw)
        if has_glob(path):
            files = _files(glob.glob(path, recursive=True))
            if not files:
                raise _fail(f"local glob {raw!r} matches no file", source)
        elif os.path.isfile(path):
            files = _files([path])
        elif os.path.isdir(path):
            files = _files(glob.glob(os.path.join(glob.escape(path), "**", "*"), recursive=True))
            if not files:
                raise _fail(f"local directory {raw!r} has no files", source)
        elif os.path.lexists(path):
            raise _fail(f"local path {raw!r} is not a regular file or directory", source)
        elif _REPO_ID.fullmatch(raw):
            # How datasets users name a repo ('org/name'): say which URI that is.
            raise SourceError(
                f"local path {raw!r} does not exist; for the Hub dataset {raw}, "
                f"pass 'hf://datasets/{raw}'"
            )
        else:
            raise _fail(f"local path {raw!r} does not exist", source)
        result.extend(LocalSource(file) for file in files)
    return result


def _files(paths: list[str]) -> list[Path]:
    """The regular files among ``paths``: absolute, normalized (symlinks kept), sorted."""
    files = {Path(os.path.abspath(path)) for path in paths if os.path.isfile(path)}
    return sorted(files, key=lambda path: path.parts)


# --- brace expansion ------------------------------------------------------------------------

_INT_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?")
_CHAR_RANGE = re.compile(r"([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?")
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_ESCAPABLE = frozenset("{},\\")


class _BraceError(Exception):
    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


@dataclass(frozen=True, slots=True)
class _Range:
    """A numeric or letter range; its values are formatted on demand."""

    indices: range
    width: int  # zero padding of a numeric range; -1 for a letter range

    def values(self) -> list[str]:
        if self.width < 0:
            return [_ALPHABET[i] for i in self.indices]
        return [f"{i:0{self.width}d}" for i in self.indices]


@dataclass(frozen=True, slots=True)
class _Choice:
    options: list[list[_Part]]


_Part: TypeAlias = str | _Range | _Choice


def _expand_braces(pattern: str) -> list[str]:
    if "{" not in pattern and "}" not in pattern:
        return [pattern]
    closing = _match_braces(pattern)
    parts = _parse_pattern(pattern, 0, len(pattern), closing)
    count = _count_pattern(parts, MAX_BRACE_EXPANSION + 1)
    if count > MAX_BRACE_EXPANSION:
        raise _BraceError(f"brace expansion gives more than {MAX_BRACE_EXPANSION:,} items")
    return _expand_pattern(parts)


def _match_braces(pattern: str) -> dict[int, int]:
    """Map each unescaped '{' to its matching '}'."""
    closing: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern) and pattern[i + 1] in _ESCAPABLE:
            i += 2
            continue
        if char == "{":
            stack.append(i)
        elif char == "}":
            if not stack:
                raise _BraceError(f"unbalanced '}}' at position {i}")
            closing[stack.pop()] = i
        i += 1
    if stack:
        raise _BraceError(f"unbalanced '{{' at position {stack[-1]}")
    return closing


def _parse_pattern(pattern: str, start: int, end: int, closing: dict[int, int]) -> list[_Part]:
    parts: list[_Part] = []
    literal: list[str] = []
    i = start
    while i < end:
        char = pattern[i]
        if char == "\\" and i + 1 < end and pattern[i + 1] in _ESCAPABLE:
            literal.append(pattern[i + 1])
            i += 2
        elif char == "{":
            if literal:
                parts.append("".join(literal))
                literal = []
            close = closing[i]
            parts.append(_parse_group(pattern, i + 1, close, closing))
            i = close + 1
        else:
            literal.append(char)
            i += 1
    if literal:
        parts.append("".join(literal))
    return parts


def _parse_group(pattern: str, start: int, end: int, closing: dict[int, int]) -> _Part:
    body = pattern[start:end]
    try:
        if match := _INT_RANGE.fullmatch(body):
            return _int_range(*match.groups())
        if match := _CHAR_RANGE.fullmatch(body):
            return _char_range(*match.groups())
    except ValueError:  # a number too long for int()
        raise _BraceError(f"brace range '{{{body}}}' has a number that is too large") from None

    commas: list[int] = []
    i = start
    while i < end:
        char = pattern[i]
        if char == "\\" and i + 1 < end and pattern[i + 1] in _ESCAPABLE:
            i += 2
            continue
        if char == "{":
            i = closing[i]
        elif char == ",":
            commas.append(i)
        i += 1
    if not commas:
        raise _BraceError(f"brace group '{{{body}}}' is neither a list nor a range")
    bounds = [start - 1, *commas, end]
    return _Choice([_parse_pattern(pattern, a + 1, b, closing) for a, b in pairwise(bounds)])


def _int_range(first: str, last: str, step: str | None) -> _Range:
    # braceexpand's rule: pad when a bound other than 0 has a leading zero.
    padded = any(s.startswith(("0", "-0")) for s in (first, last) if s not in ("0", "-0"))
    width = max(len(first), len(last)) if padded else 0
    return _Range(_inclusive(int(first), int(last), int(step) if step else 1), width)


def _char_range(first: str, last: str, step: str | None) -> _Range:
    indices = _inclusive(_ALPHABET.index(first), _ALPHABET.index(last), int(step) if step else 1)
    return _Range(indices, -1)


def _inclusive(first: int, last: int, step: int) -> range:
    step = step or 1
    return range(first, last + 1, step) if first <= last else range(first, last - 1, -step)


def _count_pattern(parts: list[_Part], limit: int) -> int:
    """The number of strings ``parts`` expands to, saturating at ``limit``."""
    count = 1
    for part in parts:
        if isinstance(part, _Range):
            try:
                n = len(part.indices)
            except OverflowError:  # more than sys.maxsize values
                n = limit
        elif isinstance(part, _Choice):
            n = min(limit, sum(_count_pattern(option, limit) for option in part.options))
        else:
            n = 1
        count = min(limit, count * n)
    return count


def _expand_pattern(parts: list[_Part]) -> list[str]:
    results = [""]
    for part in parts:
        if isinstance(part, str):
            values = [part]
        elif isinstance(part, _Range):
            values = part.values()
        else:
            values = [value for option in part.options for value in _expand_pattern(option)]
        results = [prefix + value for prefix in results for value in values]
    return results
