"""What a repo's files mean, by the rules of ``datasets``: configs and splits from the
README's YAML ``configs:`` and from file names, globs as fsspec matches them, and the
checks every tree entry passes before it is trusted. Pure functions, no I/O: the
resolver lists a tree and a card, then asks ``select`` which files a source means.

Reproduced from ``datasets/data_files.py``, ``load.py`` and ``utils/metadata.py``
(``datasets`` is a test oracle, never imported): README YAML ``configs:``, then
``data/{split}-NNNNN-of-NNNNN.*`` shard names, then ``*.eval`` logs and harbor tasks,
then split-named folders, then split-named files, else everything is ``train``.
Only files of a format this project streams count (``DATA_FILE_EXTENSIONS``, from the
formats registry); a file named on its own is taken whatever its format.
"""

from __future__ import annotations

import functools
import posixpath
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from . import formats
from ._exceptions import (
    ConfigNotFoundError,
    EntryNotFoundError,
    ResolutionError,
    SourceError,
    SplitNotFoundError,
)
from ._sources import has_glob

#: Data file extensions this project streams, and the format (decoder) of each. A file
#: counts when any of its suffixes is listed (``a.tar.gz`` counts as ``.tar``, as in
#: ``datasets``). Derived from the decoders' own ``extensions`` (the formats registry).
DATA_FILE_EXTENSIONS: dict[str, str] = formats.data_file_extensions()
#: The longest path a tree entry may have, in characters.
MAX_PATH_LENGTH = 4096
#: The most nodes a YAML document (README front matter, ``.huggingface.yaml``) may
#: expand to, aliases counted as the size of what they point to (billion laughs).
MAX_YAML_NODES = 100_000
#: The largest ``README.md`` or ``.huggingface.yaml`` read, in bytes; also the largest
#: YAML text parsed.
MAX_TEXT_BODY = 16 * 1024 * 1024
_OID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_MAX_FILE_SIZE = 2**63 - 1


def _short(value: object, limit: int = 200) -> str:
    """``repr(value)``, cut for a message (a server chooses what it sends)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


@dataclass(frozen=True, slots=True)
class _File:
    """One file of a repo tree."""

    path: str
    size: int
    etag: str


@dataclass(frozen=True, slots=True)
class _Where:
    """A repo at a revision, for URLs and messages."""

    repo: str
    revision: str
    sha: str | None
    endpoint: str

    @property
    def label(self) -> str:
        if self.sha is None or self.sha == self.revision:
            return f"{self.repo}@{self.revision}"
        return f"{self.repo}@{self.revision} ({self.sha[:12]})"


def _path_problem(path: object) -> str | None:
    """Why ``path`` is not a clean relative POSIX path, or None when it is one."""
    if not isinstance(path, str):
        return f"is not a string but {type(path).__name__}"
    if not path:
        return "is empty"
    if len(path) > MAX_PATH_LENGTH:
        return f"is longer than {MAX_PATH_LENGTH} characters (MAX_PATH_LENGTH)"
    if path.startswith("/"):
        return "is absolute"
    if "\\" in path:
        return "has a backslash"
    if any(c < " " or c == "\x7f" for c in path):
        return "has a NUL or control character"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "has an empty, '.' or '..' segment"
    return None


def _tree_file(entry: Mapping[str, Any], url: str, where: _Where, base: str) -> _File:
    """A file entry of a tree listing, every field checked: its path a clean relative
    POSIX path below ``base``, its size an int >= 0, its etag a hex object id."""
    path = entry.get("path")
    problem = _path_problem(path)
    if problem is None and base and not str(path).startswith(f"{base}/"):
        problem = f"is outside the folder {base!r} that was listed"
    if problem is not None:
        raise ResolutionError(
            f"GET {url}: the tree of {where.label} lists a file {_short(path)} that "
            f"{problem}: refusing it"
        )
    assert isinstance(path, str)
    size = entry.get("size")
    if type(size) is not int or not 0 <= size <= _MAX_FILE_SIZE:
        raise ResolutionError(
            f"GET {url}: {path!r} in {where.label} has size {_short(size)}, "
            "not a whole number of bytes >= 0"
        )
    lfs = entry.get("lfs")
    if lfs is not None and not isinstance(lfs, dict):
        raise ResolutionError(
            f"GET {url}: {path!r} in {where.label} has lfs={_short(lfs)}, not an object"
        )
    etag = lfs.get("oid") if lfs else None
    if not etag:
        etag = entry.get("oid")
    if not isinstance(etag, str) or not _OID.match(etag):
        raise ResolutionError(
            f"GET {url}: {path!r} in {where.label} has oid {_short(etag)}, "
            "not a hex object id (40 or 64 hex digits)"
        )
    return _File(path, size, etag)


def _front_matter(text: str, what: str) -> dict[str, Any] | None:
    """The YAML block of a repo card, found as huggingface_hub's RepoCard finds it."""
    from huggingface_hub.repocard import REGEX_YAML_BLOCK  # imports hf_api: only when needed

    match = REGEX_YAML_BLOCK.search(text)
    if match is None:
        return None
    data = _load_yaml(match.group(2), what)
    return data if isinstance(data, dict) else None


def _load_yaml(text: str, what: str) -> Any:
    """``yaml.safe_load(text)``, refused (ResolutionError naming ``what``) when the text
    is over ``MAX_TEXT_BODY`` characters or its document expands past ``MAX_YAML_NODES``
    nodes, aliases counted as the size of what they point to: the count is made while the
    node graph is composed, before any Python object is constructed."""
    if len(text) > MAX_TEXT_BODY:
        raise ResolutionError(
            f"{what}: {len(text)} characters of YAML, over the {MAX_TEXT_BODY} "
            "(MAX_TEXT_BODY) the resolver parses: refusing it"
        )
    loader = _BoundedLoader(text, MAX_YAML_NODES, what)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise ResolutionError(f"{what} is not valid YAML: {exc}") from exc
    except (ValueError, OverflowError, RecursionError) as exc:  # an int too long, a date...
        raise ResolutionError(
            f"{what}: YAML that cannot be read ({type(exc).__name__}: {exc})"
        ) from exc
    finally:
        loader.dispose()


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader, counting the nodes of the document as it composes it: a node
    counts 1 plus its children, an alias the count of the node it points to (memoised,
    so a DAG of aliases costs its size once), and composition stops past ``limit``."""

    def __init__(self, text: str, limit: int, what: str) -> None:
        super().__init__(text)
        self._limit = limit
        self._what = what
        self._count = 0
        self._sizes: dict[int, int] = {}  # id(node) -> its expanded count

    def _add(self, n: int) -> None:
        self._count += n
        if self._count > self._limit:
            raise ResolutionError(
                f"{self._what}: its YAML expands to more than {self._limit} nodes "
                "(MAX_YAML_NODES; an alias counts as the size of what it points to): "
                "refusing it"
            )

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event: yaml.AliasEvent = self.peek_event()  # type: ignore[no-untyped-call]
            anchor = event.anchor
            target = self.anchors.get(anchor) if anchor is not None else None
            if target is not None:
                size = self._sizes.get(id(target))
                if size is None:  # the anchor's node is still being composed
                    raise ResolutionError(
                        f"{self._what}: the YAML alias *{anchor} points into itself "
                        "(recursive YAML): refusing it"
                    )
                self._add(size)
            return super().compose_node(parent, index)  # an unknown alias: ComposerError
        before = self._count
        self._add(1)
        node = super().compose_node(parent, index)
        if node is not None:
            self._sizes[id(node)] = self._count - before
        return node


# --- selection: the rules of `datasets` ------------------------------------------------

_SPLIT_KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_DEFAULT_SPLITS = ("train", "validation", "test")
_SEP = "-._ 0-9"
_FILENAME_PATTERNS = ("**/{keyword}[{sep}]*", "**/*[{sep}]{keyword}[{sep}]*")
_DIRNAME_PATTERNS = (
    "**/{keyword}/**",
    "**/{keyword}[{sep}]*/**",
    "**/*[{sep}]{keyword}/**",
    "**/*[{sep}]{keyword}[{sep}]*/**",
)


def _keyword_patterns(bases: Sequence[str]) -> dict[str, list[str]]:
    return {
        split: [p.format(keyword=k, sep=_SEP) for k in keywords for p in bases]
        for split, keywords in _SPLIT_KEYWORDS.items()
    }


_SHARDED = "data/{split}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*"
_SHARDED_NAME = re.compile(
    re.sub(r"{(.+?)}", r"(?P<_\1>.+)", posixpath.basename(_SHARDED))  # string_to_dict's regex
)
_DEFAULT_PATTERN_GROUPS: tuple[dict[str, list[str]], ...] = (
    {"logs": ["**/*.eval"]},
    {"test": ["**/task.toml", "**/instruction.md"]},
    _keyword_patterns(_DIRNAME_PATTERNS),
    _keyword_patterns(_FILENAME_PATTERNS),
    {"train": ["**"]},
)
_FILES_TO_IGNORE = frozenset(
    {
        "README.md",
        "config.json",
        "dataset_info.json",
        "dataset_infos.json",
        "dummy_data.zip",
        "dataset_dict.json",
    }
)
_SPLIT_NAME = re.compile(r"^\w+(\.\w+)*$")
_STREAMABLE = ", ".join(sorted({*DATA_FILE_EXTENSIONS, ".tar.gz"}))


class _NoDataFiles(Exception):
    pass


@dataclass(frozen=True, slots=True)
class _Selection:
    files: list[tuple[str, _File]]
    config: str
    split: str | None
    configs: tuple[str, ...]
    splits: dict[str, int]
    format: str | None


def _bad_input(message: str) -> Exception:
    return SourceError(message)


def _bad_card(message: str) -> Exception:
    return ResolutionError(message)


def _sanitize_data_files(
    data_files: object, error: Callable[[str], Exception]
) -> dict[str, list[str]]:
    """``datasets.data_files.sanitize_patterns``: split -> list of patterns."""
    forms = (
        "data_files is a pattern, a list of patterns, a mapping split -> pattern(s), "
        "or a list of {'split': ..., 'path': ...}"
    )

    def strings(value: object, where: str) -> list[str]:
        if isinstance(value, str):
            return [value]
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
            return list(value)
        raise error(f"{where}: expected a pattern or a non-empty list of patterns, got {value!r}")

    if isinstance(data_files, str):
        return {"train": [data_files]}
    if isinstance(data_files, Mapping):
        if not data_files:
            raise error(f"data_files={data_files!r} is empty: {forms}")
        return {str(k): strings(v, f"data_files[{k!r}]") for k, v in data_files.items()}
    if isinstance(data_files, (list, tuple)) and data_files:
        if any(isinstance(item, Mapping) for item in data_files):
            out: dict[str, list[str]] = {}
            for item in data_files:
                if not (isinstance(item, Mapping) and set(item) == {"split", "path"}):
                    raise error(f"data_files entry {item!r}: {forms}")
                name = str(item["split"])
                if name in out:
                    raise error(f"split {name!r} appears twice in data_files")
                out[name] = strings(item["path"], f"data_files split {name!r}")
            return out
        return {"train": strings(list(data_files), "data_files")}
    raise error(f"data_files={data_files!r}: {forms}")


def _metadata_configs(card: Mapping[str, Any] | None, repo: str) -> dict[str, dict[str, Any]]:
    """``MetadataConfigs.from_dataset_card_data``: config name -> params, in YAML order."""
    raw = card.get("configs") if card else None
    if not raw:
        return {}
    if not isinstance(raw, list):
        raise ResolutionError(f"{repo}: README.md YAML 'configs' must be a list, got {raw!r}")
    out: dict[str, dict[str, Any]] = {}
    for item in raw:
        if not isinstance(item, dict) or "config_name" not in item:
            raise ResolutionError(
                f"{repo}: each README.md YAML config needs a 'config_name', got {item!r}"
            )
        files = item.get("data_files")
        if files is not None:
            _sanitize_data_files(files, lambda m: _bad_card(f"{repo}: README.md YAML: {m}"))
            if isinstance(files, list):
                for entry in files:
                    if isinstance(entry, dict) and not _SPLIT_NAME.match(str(entry["split"])):
                        raise ResolutionError(
                            f"{repo}: README.md YAML split name {entry['split']!r} must match "
                            f"{_SPLIT_NAME.pattern}"
                        )
        out[str(item["config_name"])] = {k: v for k, v in item.items() if k != "config_name"}
    return out


def _default_config(configs: Mapping[str, Mapping[str, Any]], repo: str) -> str | None:
    """``MetadataConfigs.get_default_config_name``."""
    found: str | None = None
    for name, params in configs.items():
        if len(configs) == 1 or name == "default" or params.get("default"):
            if found is not None:
                raise ResolutionError(
                    f"{repo}: README.md YAML marks several default configs: {found!r} and {name!r}"
                )
            found = name
    return found


@functools.lru_cache(maxsize=1024)
def _glob(pattern: str) -> Glob:
    """The matcher of ``pattern`` (cached)."""
    return Glob(pattern)


class Glob:
    """A glob over ``/``-separated paths, matched as fsspec's ``glob`` matches them (the
    regex of ``fsspec.utils.glob_translate``), in time at most the path's length times the
    pattern's, never by backtracking.

    ``*`` and ``?`` stay in one path segment, ``*`` as a whole segment is one non-empty
    segment, ``**`` as a whole segment crosses any number of them, ``[...]`` is a
    character class (``[!...]`` negated). One difference with fsspec: a class never
    matches ``/`` (fsspec's ``[!a]`` does), as in a shell.

    Segment by segment: a segment pattern is fixed-length pieces between its stars; the
    first piece must match at the start, the last at the end, and each piece between at
    the earliest place after the one before (taking the earliest never loses a match).
    """

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        parts = pattern.split("/")
        for part in parts:
            if "**" in part and part != "**":
                raise SourceError(
                    f"pattern {pattern!r}: '**' must be a whole path segment, as in "
                    "'data/**/*.parquet'"
                )
        try:
            self._parts = [p if p in ("*", "**") else _Segment(p) for p in parts]
        except re.error as exc:
            raise SourceError(f"pattern {pattern!r} is not a valid glob: {exc}") from None

    def __repr__(self) -> str:
        return f"Glob({self.pattern!r})"

    def match(self, path: str) -> bool:
        segments = path.split("/")
        n = len(segments)
        reach = {0}  # where the next part may start: an index into segments
        last = len(self._parts) - 1
        for i, part in enumerate(self._parts):
            if part == "**" and i == last:  # the rest, whatever it is (fsspec: '.*')
                return any(r < n for r in reach)
            if part == "**":  # none, or segments whose text is not empty (fsspec: '(?:.+/)?')
                first = min(reach)
                more = set(range(first + 2, n))
                if first + 1 < n and segments[first]:
                    more.add(first + 1)
                reach |= more
            elif part == "*":
                reach = {r + 1 for r in reach if r < n and segments[r]}
            else:
                assert isinstance(part, _Segment)
                reach = {r + 1 for r in reach if r < n and part.match(segments[r])}
            if not reach:
                return False
        return n in reach


class _Segment:
    """One segment's pattern: the fixed-length pieces between its stars, each a regex of
    single-character atoms (a literal, ``?``, a class)."""

    def __init__(self, part: str) -> None:
        pieces: list[list[str]] = [[]]
        i, n = 0, len(part)
        while i < n:
            c = part[i]
            i += 1
            if c == "*":
                pieces.append([])
            elif c == "?":
                pieces[-1].append("[^/]")
            elif c == "[":
                j = i
                if j < n and part[j] == "!":
                    j += 1
                if j < n and part[j] == "]":
                    j += 1
                while j < n and part[j] != "]":
                    j += 1
                if j >= n:
                    pieces[-1].append(re.escape(c))
                    continue
                pieces[-1].append(_char_class(part[i:j]))
                i = j + 1
            else:
                pieces[-1].append(re.escape(c))
        self.pieces = [re.compile(f"(?s:{''.join(atoms)})") for atoms in pieces]
        self.lengths = [len(atoms) for atoms in pieces]

    def match(self, text: str) -> bool:
        pieces, lengths = self.pieces, self.lengths
        if len(pieces) == 1:
            return len(text) == lengths[0] and pieces[0].match(text) is not None
        end = len(text) - lengths[-1]  # where the last piece starts
        if end < lengths[0] or pieces[0].match(text) is None or pieces[-1].match(text, end) is None:
            return False
        at = lengths[0]
        for piece in pieces[1:-1]:
            found = piece.search(text, at, end)
            if found is None:
                return False
            at = found.end()
        return True


def _char_class(stuff: str) -> str:
    if "-" not in stuff:
        stuff = stuff.replace("\\", r"\\")
    else:
        chunks: list[str] = []
        start = 0
        k = 2 if stuff.startswith("!") else 1
        while True:
            k = stuff.find("-", k)
            if k < 0:
                break
            chunks.append(stuff[start:k])
            start = k + 1
            k = k + 3
        tail = stuff[start:]
        if tail:
            chunks.append(tail)
        else:
            chunks[-1] += "-"
        for k in range(len(chunks) - 1, 0, -1):  # drop empty ranges like 'z-a'
            if chunks[k - 1][-1] > chunks[k][0]:
                chunks[k - 1] = chunks[k - 1][:-1] + chunks[k][1:]
                del chunks[k]
        stuff = "-".join(s.replace("\\", r"\\").replace("-", r"\-") for s in chunks)
    stuff = re.sub(r"([&~|])", r"\\\1", stuff)
    if not stuff:
        return "(?!)"
    if stuff == "!":
        return "."
    if stuff[0] == "!":
        stuff = "^" + stuff[1:]
    elif stuff[0] in ("^", "["):
        stuff = "\\" + stuff
    return f"[{stuff}]"


@functools.lru_cache(maxsize=1024)
def _literal_hint(pattern: str) -> str:
    """A substring every match of ``pattern`` contains (to skip most paths cheaply)."""
    if "[]" in pattern or "[!]" in pattern:
        return ""
    pieces = re.split(r"\*|\?|\[[^\]]*\]|/", pattern)
    return max(pieces, key=len, default="") if "[" not in "".join(pieces) else ""


def _glob_base(pattern: str) -> str:
    """The folder above the first glob character: the tree a glob needs listed."""
    head = re.split(r"[*?[]", pattern, maxsplit=1)[0]
    return head.rsplit("/", 1)[0] if "/" in head else ""


def _special_dirs(parts: Sequence[str]) -> int:
    """Folders named ``__like_this__`` (datasets skips them unless a pattern names them)."""
    return sum(p.startswith("__") for p in parts[:-1])


def _hidden_parts(parts: Sequence[str]) -> int:
    """Hidden files and folders (datasets skips them unless a pattern names them)."""
    return sum(p.startswith(".") and set(p) != {"."} for p in parts)


class _Tree:
    """The files below a folder, sorted, matched by relative path as datasets does."""

    def __init__(self, files: Sequence[_File], base: str) -> None:
        prefix = f"{base}/" if base else ""
        self.base = base
        self.items = [(f.path[len(prefix) :], f) for f in files if f.path.startswith(prefix)]

    def glob(self, pattern: str) -> list[_File]:
        """``datasets.data_files.resolve_pattern`` without the extension filter."""
        return list(self._matches(pattern))

    def exists(self, pattern: str) -> bool:
        return next(self._matches(pattern), None) is not None

    def _matches(self, pattern: str) -> Iterator[_File]:
        matcher = _glob(pattern)
        hint = _literal_hint(pattern)
        ignore = _FILES_TO_IGNORE - {posixpath.basename(pattern)}
        pat_parts = [p for p in pattern.split("/") if p not in ("", ".")]
        pat_special = _special_dirs(pat_parts)
        pat_hidden = _hidden_parts(pat_parts)
        for rel, f in self.items:
            if hint and hint not in rel:
                continue
            if not matcher.match(rel):
                continue
            if rel.rpartition("/")[2] in ignore:
                continue
            # Counting parts is slow: do it only for paths that may have such parts.
            maybe_special = pat_special or "__" in rel
            if maybe_special and _special_dirs(rel.split("/")) != pat_special:
                continue
            maybe_hidden = pat_hidden or rel.startswith(".") or "/." in rel
            if maybe_hidden and _hidden_parts(rel.split("/")) != pat_hidden:
                continue
            yield f


def _infer_patterns(tree: _Tree) -> dict[str, list[str]]:
    """``datasets.data_files._get_data_files_patterns``."""
    sharded = tree.glob(_SHARDED.replace("{split}", "*"))
    if sharded:
        found: set[str] = set()
        for f in sharded:
            match = _SHARDED_NAME.search(posixpath.basename(f.path))
            assert match is not None
            found.add(match.group(1))
        bad = sorted(s for s in found if not _SPLIT_NAME.match(s))
        if bad:
            raise ResolutionError(
                f"shard names in data/ give split names {bad} that do not match "
                f"{_SPLIT_NAME.pattern}: rename the files or declare configs in README.md"
            )
        ordered = [s for s in _DEFAULT_SPLITS if s in found] + sorted(found - {*_DEFAULT_SPLITS})
        return {s: [_SHARDED.format(split=s)] for s in ordered}
    for group in _DEFAULT_PATTERN_GROUPS:
        splits = {s: patterns for s, patterns in group.items() if any(map(tree.exists, patterns))}
        if splits:
            return splits
    raise _NoDataFiles


def _is_streamable(path: str) -> bool:
    return any(f".{s}" in DATA_FILE_EXTENSIONS for s in posixpath.basename(path).split(".")[1:])


def _format_of(paths: Sequence[str]) -> str | None:
    """``datasets.load.infer_module_for_data_files_list`` over our formats."""
    counts = Counter(f".{s.lower()}" for p in paths for s in posixpath.basename(p).split(".")[1:])
    ranked = sorted(
        counts.items(), key=lambda kv: (kv[1], kv[0] == ".parquet", kv[0]), reverse=True
    )
    for ext, _ in ranked:
        if ext in DATA_FILE_EXTENSIONS:
            return DATA_FILE_EXTENSIONS[ext]
    return None


def _common_format(paths: Sequence[str]) -> str | None:
    streamable = [p for p in paths if _is_streamable(p)]
    fmt = _format_of(streamable)
    if fmt is None or any(_format_of([p]) != fmt for p in paths):
        return None
    return fmt


def _in_format(path: str, fmt: str) -> bool:
    return any(
        DATA_FILE_EXTENSIONS.get(f".{s}") == fmt for s in posixpath.basename(path).split(".")[1:]
    )


def _select(
    tree_files: Sequence[_File],
    card: Mapping[str, Any] | None,
    where: _Where,
    *,
    path: str | None,
    config: str | None,
    split: str | None,
    data_files: dict[str, list[str]] | None,
) -> _Selection:
    """Which files of the tree a (path, config, split, data_files) means."""
    repo = where.repo
    inferred = False
    configs: tuple[str, ...] = ("default",)
    if path is not None and (has_glob(path) or any(f.path == path for f in tree_files)):
        # A glob or one file: all in "train", as load_dataset("parquet", data_files=...) does.
        if data_files is not None:
            raise SourceError(
                f"data_files= cannot narrow {where.label}/{path}, which names files already: "
                "put the pattern in one of them only"
            )
        if config not in (None, "default"):
            raise ConfigNotFoundError(
                f"no config {config!r} in {where.label}/{path}: a path has one config, 'default'"
            )
        name = "default"
        tree = _Tree(tree_files, "")
        patterns = {"train": [path]}
    elif path is not None:
        # A folder: like load_dataset(repo, data_dir=path).
        if not any(f.path.startswith(f"{path}/") for f in tree_files):
            raise EntryNotFoundError(f"{path!r} not found in {where.label}")
        if config not in (None, "default"):
            raise ConfigNotFoundError(
                f"no config {config!r} in {where.label}/{path}: a folder has one config, 'default'"
            )
        name = "default"
        tree = _Tree(tree_files, path)
        patterns = data_files or {}
        inferred = data_files is None
    else:
        metadata = _metadata_configs(card, repo)
        if metadata:
            configs = tuple(metadata)
        if config is not None and config not in configs:
            raise ConfigNotFoundError(
                f"no config {config!r} in {repo}: configs are {', '.join(sorted(configs))}"
            )
        default = _default_config(metadata, repo) if metadata else "default"
        if config is None and default is None:
            raise ConfigNotFoundError(
                f"{repo} has several configs and none is the default: pass config= one of "
                f"{', '.join(sorted(configs))}"
            )
        name = config or default or "default"
        params = metadata.get(name, {})
        data_dir = str(params.get("data_dir") or "").strip("/")
        if data_files is not None:
            tree = _Tree(tree_files, "")
            patterns = data_files
        else:
            tree = _Tree(tree_files, data_dir)
            if params.get("data_files") is not None:
                patterns = _sanitize_data_files(params["data_files"], _bad_card)
            else:
                inferred = True
                patterns = {}
    if inferred:
        try:
            patterns = _infer_patterns(tree)
        except _NoDataFiles:
            raise ResolutionError(
                f"no data files in {where.label}" + (f"/{tree.base}" if tree.base else "")
            ) from None

    matched: dict[str, list[_File]] = {}
    for split_name, split_patterns in patterns.items():
        seen: set[str] = set()
        files: list[_File] = []
        for pattern in split_patterns:
            found = tree.glob(pattern)
            if not found and not has_glob(pattern):
                raise EntryNotFoundError(
                    f"{_join(tree.base, pattern)!r} not found in {where.label}"
                )
            for f in found:
                if f.path not in seen:  # datasets would read a file twice; we read it once
                    seen.add(f.path)
                    files.append(f)
        matched[split_name] = files

    if path is not None and not has_glob(path) and patterns == {"train": [path]}:
        # One file named: it is what was asked for, of whatever format (a video for
        # video.open, a file of a format given with format=); the reader judges it.
        if split not in (None, "train"):
            raise SplitNotFoundError(f"no split {split!r} in {repo}/{path}: splits are train")
        return _Selection(
            files=[("train", f) for f in matched["train"]],
            config=name,
            split="train",
            configs=configs,
            splits={"train": 1},
            format=_format_of([path]),
        )
    candidates = {s: [f for f in fs if _is_streamable(f.path)] for s, fs in matched.items()}
    formats = {s: _format_of([f.path for f in fs]) for s, fs in candidates.items() if fs}
    if len(set(formats.values())) > 1:
        described = ", ".join(f"{s}: {fmt}" for s, fmt in formats.items())
        raise ResolutionError(
            f"the splits of {repo} (config {name!r}) hold different formats ({described}): "
            "choose files with data_files="
        )
    fmt = next(iter(formats.values()), None)
    chosen = {
        s: [f for f in fs if fmt is not None and _in_format(f.path, fmt)]
        for s, fs in candidates.items()
    }
    if inferred:
        chosen = {s: fs for s, fs in chosen.items() if fs}
        if not chosen:
            found_any = [f.path for fs in matched.values() for f in fs][:3]
            raise ResolutionError(
                f"no data files that aiostream-hf streams ({_STREAMABLE}) in {where.label}"
                + (f"/{tree.base}" if tree.base else "")
                + (f"; it has {', '.join(found_any)}" if found_any else "")
            )

    if split is not None and split not in chosen:
        where_config = "" if name == "default" else f" (config {name!r})"
        raise SplitNotFoundError(
            f"no split {split!r} in {repo}{where_config}: splits are {', '.join(sorted(chosen))}"
        )
    selected = [split] if split is not None else list(chosen)
    for s in selected:
        if not chosen[s]:
            if not matched[s]:
                shown = ", ".join(repr(_join(tree.base, p)) for p in patterns[s])
                raise EntryNotFoundError(f"no file in {where.label} matches {shown}")
            raise ResolutionError(
                f"split {s!r} of {repo} matches {len(matched[s])} files but none that "
                f"aiostream-hf streams ({_STREAMABLE}), e.g. {matched[s][0].path!r}"
            )
    return _Selection(
        files=[(s, f) for s in selected for f in chosen[s]],
        config=name,
        split=selected[0] if len(selected) == 1 else None,
        configs=configs,
        splits={s: len(fs) for s, fs in chosen.items()},
        format=fmt,
    )


def _join(base: str, pattern: str) -> str:
    return f"{base}/{pattern}" if base else pattern
