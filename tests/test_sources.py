from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import braceexpand
import huggingface_hub
import pytest
from huggingface_hub import HfFileSystem
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]

import aiostream_hf as ash
from aiostream_hf import _sources, lerobot, video
from aiostream_hf import webdataset as ashwds
from aiostream_hf._exceptions import SourceError
from aiostream_hf._sources import (
    MAX_BRACE_EXPANSION,
    BucketSource,
    HubSource,
    LocalSource,
    UrlSource,
    expand_braces,
    has_glob,
    parse_sources,
)
from aiostream_hf.testing import HubServer, make_repo

SHA = "0123456789abcdef0123456789abcdef01234567"
ACCEPTED = "Accepted sources: 'hf://datasets/ORG/NAME[@REVISION][/PATH-OR-GLOB]'"


def assert_source_error(source: object, problem: str) -> SourceError:
    """parse_sources(source) fails with ``problem``, naming the input and the accepted forms."""
    with pytest.raises(SourceError, match=problem) as info:
        parse_sources(source)  # type: ignore[arg-type]
    message = str(info.value)
    assert repr(source) in message
    assert ACCEPTED in message
    assert "https://HOST/PATH" in message
    assert "local file, directory or glob" in message
    return info.value


# --- hf:// ---------------------------------------------------------------------------------

HUB_CASES = [
    ("hf://datasets/org/name", HubSource("org/name", None, None)),
    ("hf://datasets/org/name/", HubSource("org/name", None, None)),
    (
        "hf://datasets/org/name/data/train.parquet",
        HubSource("org/name", None, "data/train.parquet"),
    ),
    ("hf://datasets/org/name@main", HubSource("org/name", "main", None)),
    ("hf://datasets/org/name@main/data/*.parquet", HubSource("org/name", "main", "data/*.parquet")),
    (
        "hf://datasets/org/name@main/**/train-*.parquet",
        HubSource("org/name", "main", "**/train-*.parquet"),
    ),
    ("hf://datasets/org/name@v1.0/a.csv", HubSource("org/name", "v1.0", "a.csv")),
    (f"hf://datasets/org/name@{SHA}", HubSource("org/name", SHA, None)),
    (f"hf://datasets/org/name@{SHA}/x/y.tar", HubSource("org/name", SHA, "x/y.tar")),
    (
        "hf://datasets/org/name@refs/convert/parquet",
        HubSource("org/name", "refs/convert/parquet", None),
    ),
    (
        "hf://datasets/org/name@refs/convert/parquet/default/train/0000.parquet",
        HubSource("org/name", "refs/convert/parquet", "default/train/0000.parquet"),
    ),
    (
        "hf://datasets/org/name@refs%2Fconvert%2Fparquet/default/train/0000.parquet",
        HubSource("org/name", "refs/convert/parquet", "default/train/0000.parquet"),
    ),
    (
        "hf://datasets/org/name@refs%2Fconvert%2Fparquet",
        HubSource("org/name", "refs/convert/parquet", None),
    ),
    (
        "hf://datasets/org/name@refs/convert/parquet/default/*/*.parquet",
        HubSource("org/name", "refs/convert/parquet", "default/*/*.parquet"),
    ),
    ("hf://datasets/org/name@refs/pr/12", HubSource("org/name", "refs/pr/12", None)),
    ("hf://datasets/org/name@refs/pr/12/a.json", HubSource("org/name", "refs/pr/12", "a.json")),
    # a revision with a '/' other than the special refs must be quoted
    ("hf://datasets/org/name@feature%2Fx/a.json", HubSource("org/name", "feature/x", "a.json")),
    ("hf://datasets/org/name@feature/x/a.json", HubSource("org/name", "feature", "x/a.json")),
    # an '@' below the repo id is part of the path
    ("hf://datasets/org/name/dir@1/a.json", HubSource("org/name", None, "dir@1/a.json")),
    ("hf://datasets/Org-1/Name_2.v3", HubSource("Org-1/Name_2.v3", None, None)),
]


@pytest.mark.parametrize(("source", "expected"), HUB_CASES)
def test_hub_sources(source: str, expected: HubSource) -> None:
    assert parse_sources(source) == [expected]


@pytest.mark.parametrize(("source", "expected"), HUB_CASES)
def test_hub_uri_round_trips(source: str, expected: HubSource) -> None:
    assert parse_sources(expected.uri) == [expected]


@pytest.mark.parametrize(("source", "expected"), HUB_CASES)
def test_hub_parsing_matches_huggingface_hub_parse_hf_uri(source: str, expected: HubSource) -> None:
    parse_hf_uri = getattr(huggingface_hub, "parse_hf_uri", None)
    if parse_hf_uri is None:
        pytest.skip("huggingface_hub has no parse_hf_uri")
    uri = parse_hf_uri(source)
    assert (uri.type, uri.id, uri.revision, uri.path_in_repo) == (
        "dataset",
        expected.repo_id,
        expected.revision,
        expected.path or "",
    )


@pytest.mark.parametrize(("source", "expected"), HUB_CASES)
def test_hub_parsing_matches_hf_file_system_resolve_path(
    source: str, expected: HubSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = HfFileSystem(skip_instance_cache=True)
    if not hasattr(fs, "_repo_and_revision_exist"):
        pytest.skip("HfFileSystem has no _repo_and_revision_exist to stub")
    # resolve_path asks the Hub whether the repo and revision exist: answer yes, offline.
    monkeypatch.setattr(fs, "_repo_and_revision_exist", lambda *args, **kwargs: (True, None))
    # Any: the result class is named differently across huggingface_hub versions.
    resolved: Any = fs.resolve_path(source)
    assert (resolved.repo_type, resolved.repo_id, resolved.revision, resolved.path_in_repo) == (
        "dataset",
        expected.repo_id,
        expected.revision or "main",
        expected.path or "",
    )


def test_hub_path_with_braces_expands_to_several_sources() -> None:
    assert parse_sources("hf://datasets/org/name@main/data/train-{00..02}-of-03.parquet") == [
        HubSource("org/name", "main", f"data/train-{i:02d}-of-03.parquet") for i in range(3)
    ]


def test_hub_uri_quotes_a_revision_with_a_slash() -> None:
    assert HubSource("org/name", "feature/x", "a.json").uri == (
        "hf://datasets/org/name@feature%2Fx/a.json"
    )
    assert HubSource("org/name", "refs/convert/parquet", None).uri == (
        "hf://datasets/org/name@refs/convert/parquet"
    )


def test_hub_source_is_frozen() -> None:
    source = HubSource("org/name", None, None)
    with pytest.raises(AttributeError):
        source.repo_id = "other/name"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("source", "suggestion"),
    [
        ("hf://org/name", "hf://datasets/org/name"),
        ("hf://models/org/name", "hf://datasets/org/name"),
        ("hf://spaces/org/name", "hf://datasets/org/name"),
        ("hf://kernels/org/name", "hf://datasets/org/name"),
        ("hf://buckets/org/name", "hf://datasets/org/name"),
        ("hf://dataset/org/name", "hf://datasets/org/name"),
        ("hf://org/name@main/file.txt", "hf://datasets/org/name@main/file.txt"),
    ],
)
def test_hub_non_dataset_repos_fail(source: str, suggestion: str) -> None:
    error = assert_source_error(source, "only dataset repos are supported")
    assert "hf://datasets/ORG/NAME" in str(error)
    assert f"did you mean '{suggestion}'?" in str(error)


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("hf://", "names no repo"),
        ("hf://datasets", "names no repo"),
        ("hf://datasets/", "names no repo"),
        ("hf://datasets/org", "the repo id must be 'ORG/NAME'"),
        ("hf://datasets/org@main", "the repo id must be 'ORG/NAME'"),
        ("hf://datasets/org/name@", "empty revision"),
        ("hf://datasets/org/name@/a.json", "empty revision"),
        ("hf://datasets/org/name//a.json", "empty segment"),
        ("hf://datasets/org/name/a//b.json", "empty segment"),
        ("hf://datasets/org/na--me", "invalid repo id 'org/na--me'"),
        ("hf://datasets/org/na..me", "invalid repo id"),
        ("hf://datasets/org/-name", "invalid repo id"),
        ("hf://datasets/org/name.git", "invalid repo id"),
        ("hf://datasets/org/na%20me", "invalid repo id"),
        ("hf://datasets/org/caf\u00e9", "invalid repo id"),
        (f"hf://datasets/org/{'n' * 97}", "invalid repo id"),
    ],
)
def test_hub_malformed_fails(source: str, problem: str) -> None:
    assert_source_error(source, re.escape(problem))


@pytest.mark.parametrize(
    "repo_id",
    ["org/name", "org/na--me", "org/na..me", "org/-name", "org/name.git", "org/caf\u00e9", "o/n"],
)
def test_repo_id_validation_agrees_with_huggingface_hub(repo_id: str) -> None:
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        hub_valid = False
    else:
        hub_valid = True
    try:
        parse_sources(f"hf://datasets/{repo_id}")
    except SourceError:
        valid = False
    else:
        valid = True
    assert valid == hub_valid


# --- http(s):// ----------------------------------------------------------------------------


def test_url_sources() -> None:
    assert parse_sources("https://example.com/data/a.tar") == [
        UrlSource("https://example.com/data/a.tar")
    ]
    assert parse_sources("http://localhost:8080/a.parquet?x=1") == [
        UrlSource("http://localhost:8080/a.parquet?x=1")
    ]


def test_url_brace_range_is_zero_padded() -> None:
    assert parse_sources("https://host/shards/train-{000..099}.tar") == [
        UrlSource(f"https://host/shards/train-{i:03d}.tar") for i in range(100)
    ]


def test_url_brace_alternatives_and_several_groups() -> None:
    assert parse_sources("https://host/{train,val}/part-{0..1}.tar") == [
        UrlSource("https://host/train/part-0.tar"),
        UrlSource("https://host/train/part-1.tar"),
        UrlSource("https://host/val/part-0.tar"),
        UrlSource("https://host/val/part-1.tar"),
    ]


def test_url_glob_characters_are_not_expanded() -> None:
    assert parse_sources("https://host/a?b=*") == [UrlSource("https://host/a?b=*")]


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("https:///path", "has no host"),
        ("http://", "has no host"),
        ("http://[::1/a", "is malformed"),
    ],
)
def test_url_malformed_fails(source: str, problem: str) -> None:
    assert_source_error(source, problem)


# --- brace expansion -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("plain", ["plain"]),
        ("a-{1..3}", ["a-1", "a-2", "a-3"]),
        ("{000..003}", ["000", "001", "002", "003"]),
        ("{8..10}", ["8", "9", "10"]),  # no leading zero: no padding
        ("{08..10}", ["08", "09", "10"]),
        ("{0..10..5}", ["0", "5", "10"]),
        ("{3..1}", ["3", "2", "1"]),
        ("{a,b,c}", ["a", "b", "c"]),
        ("{a..c}", ["a", "b", "c"]),
        ("x.tar{,.gz}", ["x.tar", "x.tar.gz"]),
        ("{a,b}{1..2}", ["a1", "a2", "b1", "b2"]),
        ("py{2.{6,7},3.{10..11}}", ["py2.6", "py2.7", "py3.10", "py3.11"]),
        (r"lit\{1,2\}", ["lit{1,2}"]),
        (r"{a\,b,c}", ["a,b", "c"]),
        (r"C:\data\x.tar", [r"C:\data\x.tar"]),  # no braces: used exactly as given
    ],
)
def test_expand_braces(pattern: str, expected: list[str]) -> None:
    assert expand_braces(pattern) == expected


@pytest.mark.parametrize(
    "pattern",
    [
        "shard-{000000..000999}.tar",
        "{a,b}{1..2}{x,y,z}",
        "{a,{b,c}d}",
        "{,a}",
        "{,}",
        "{1..10..3}",
        "{5..1}",
        "{-01..2}",
        "{-3..3..2}",
        "{00..3}",
        "{0..3}",
        "{Y..c}",
        "{z..A..5}",
        "pre{a,b{1..3},c}post{x,y}",
        r"a\{b\}",
        r"a\,b{1,2}",
        r"{1\{2,3}",
    ],
)
def test_expand_braces_agrees_with_braceexpand(pattern: str) -> None:
    """webdataset expands shard lists with braceexpand: valid patterns expand identically."""
    assert expand_braces(pattern) == list(braceexpand.braceexpand(pattern))


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("x{1..}", "brace group '{1..}' is neither a list nor a range"),
        ("x{..3}", "brace group '{..3}' is neither a list nor a range"),
        ("x{a}", "brace group '{a}' is neither a list nor a range"),
        ("x{}", "brace group '{}' is neither a list nor a range"),
        ("{{a,b}}", "brace group '{{a,b}}' is neither a list nor a range"),
        ("x{1..3", "unbalanced '{' at position 1"),
        ("x}1", "unbalanced '}' at position 1"),
        ("{a,b}}", "unbalanced '}' at position 5"),
        (f"{{1..{'9' * 5000}}}", "has a number that is too large"),
    ],
)
def test_expand_braces_malformed_fails(pattern: str, problem: str) -> None:
    with pytest.raises(SourceError, match=re.escape(problem)) as info:
        expand_braces(pattern)
    assert repr(pattern) in str(info.value)
    assert "'{a,b,c}'" in str(info.value)
    assert "'{000..099}'" in str(info.value)


@pytest.mark.parametrize(
    "source",
    [
        "https://host/x-{1..}.tar",
        "https://host/x-{000..009.tar",
        "hf://datasets/org/name/x-{a}.parquet",
        "data/x-{1..2}}.tar",
    ],
)
def test_malformed_braces_in_sources_fail(source: str) -> None:
    error = assert_source_error(source, "brace group|unbalanced")
    assert "'{000..099}'" in str(error)


def test_expansion_at_the_limit_is_allowed() -> None:
    assert len(expand_braces(f"{{1..{MAX_BRACE_EXPANSION}}}")) == MAX_BRACE_EXPANSION


@pytest.mark.parametrize(
    "pattern",
    [
        f"{{0..{MAX_BRACE_EXPANSION}}}",
        "{0..999}{0..999}{0..9}",
        "{0..99999999999999999999999999999}",
        "{x,{0..999}{0..999}{0..999}}",
    ],
)
def test_expansion_over_the_limit_fails_before_generating(pattern: str) -> None:
    with pytest.raises(SourceError, match="more than 1,000,000 items") as info:
        expand_braces(pattern)
    assert repr(pattern) in str(info.value)


def test_expansion_over_the_limit_in_a_source_fails() -> None:
    assert_source_error("https://host/{0..999}/{0..9999}.tar", "more than 1,000,000 items")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("data/*.parquet", True),
        ("data/x?.tar", True),
        ("data/[ab].tar", True),
        ("data/**/x.tar", True),
        ("data/x.tar", False),
        ("data/{a,b}.tar", False),
    ],
)
def test_has_glob(path: str, expected: bool) -> None:
    assert has_glob(path) is expected


# --- local paths -----------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in [
        "a.parquet",
        "b.parquet",
        "c.tar",
        "sub/d.parquet",
        "sub/deeper/e.parquet",
        "shard-000.tar",
        "shard-001.tar",
        ".hidden/f.parquet",
    ]:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    return tmp_path


def local(*paths: Path) -> list[LocalSource]:
    return [LocalSource(path) for path in paths]


def test_local_absolute_path(tree: Path) -> None:
    assert parse_sources(str(tree / "a.parquet")) == local(tree / "a.parquet")


def test_local_pathlike(tree: Path) -> None:
    assert parse_sources(tree / "a.parquet") == local(tree / "a.parquet")


def test_local_relative_path_is_made_absolute(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree / "sub")
    assert parse_sources("d.parquet") == local(tree / "sub" / "d.parquet")
    assert parse_sources("../a.parquet") == local(tree / "a.parquet")
    assert parse_sources(Path("deeper/e.parquet")) == local(tree / "sub" / "deeper" / "e.parquet")


def test_local_home_is_expanded(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tree))
    assert parse_sources("~/a.parquet") == local(tree / "a.parquet")


def test_local_glob_is_expanded_sorted(tree: Path) -> None:
    assert parse_sources(str(tree / "*.parquet")) == local(tree / "a.parquet", tree / "b.parquet")
    assert parse_sources(str(tree / "shard-00?.tar")) == local(
        tree / "shard-000.tar", tree / "shard-001.tar"
    )
    assert parse_sources(str(tree / "[ac].*")) == local(tree / "a.parquet", tree / "c.tar")


def test_local_recursive_glob(tree: Path) -> None:
    assert parse_sources(str(tree / "**" / "*.parquet")) == local(
        tree / "a.parquet",
        tree / "b.parquet",
        tree / "sub" / "d.parquet",
        tree / "sub" / "deeper" / "e.parquet",
    )


def test_local_relative_glob(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree)
    assert parse_sources("sub/**/*.parquet") == local(
        tree / "sub" / "d.parquet", tree / "sub" / "deeper" / "e.parquet"
    )


def test_local_directory_stands_for_its_files(tree: Path) -> None:
    assert parse_sources(str(tree / "sub")) == local(
        tree / "sub" / "d.parquet", tree / "sub" / "deeper" / "e.parquet"
    )


def test_local_braces(tree: Path) -> None:
    assert parse_sources(str(tree / "shard-{000..001}.tar")) == local(
        tree / "shard-000.tar", tree / "shard-001.tar"
    )
    assert parse_sources(str(tree / "{b,a}.parquet")) == local(
        tree / "b.parquet", tree / "a.parquet"
    )


def test_local_file_url(tree: Path) -> None:
    assert parse_sources((tree / "a.parquet").as_uri()) == local(tree / "a.parquet")
    assert parse_sources(f"file://localhost{tree / 'c.tar'}") == local(tree / "c.tar")
    assert parse_sources(f"file://{tree}/shard-{{000..001}}.tar") == local(
        tree / "shard-000.tar", tree / "shard-001.tar"
    )
    assert parse_sources(f"file://{tree}/*.tar") == local(
        tree / "c.tar", tree / "shard-000.tar", tree / "shard-001.tar"
    )


def test_local_file_url_is_percent_decoded(tmp_path: Path) -> None:
    path = tmp_path / "with space.tar"
    path.write_bytes(b"x")
    assert parse_sources(path.as_uri()) == local(path)
    assert "%20" in path.as_uri()


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_local_symlink_keeps_its_own_name(tmp_path: Path) -> None:
    blob = tmp_path / "blobs" / "3f2a9c"
    blob.parent.mkdir()
    blob.write_bytes(b"x")
    link = tmp_path / "train-0000.parquet"
    link.symlink_to(blob)
    assert parse_sources(str(link)) == local(link)


def test_local_source_paths_are_absolute(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree)
    sources = parse_sources(["a.parquet", "sub/../b.parquet", "sub"])
    assert all(isinstance(s, LocalSource) and s.path.is_absolute() for s in sources)
    assert sources[1] == LocalSource(tree / "b.parquet")


def test_local_missing_path_fails(tree: Path) -> None:
    missing = str(tree / "nope.parquet")
    assert_source_error(missing, re.escape(f"local path {missing!r} does not exist"))


def test_local_missing_brace_item_fails_naming_it(tree: Path) -> None:
    source = str(tree / "shard-{000..002}.tar")
    missing = str(tree / "shard-002.tar")
    assert_source_error(source, re.escape(f"local path {missing!r} does not exist"))


def test_local_glob_matching_nothing_fails(tree: Path) -> None:
    pattern = str(tree / "*.json")
    assert_source_error(pattern, re.escape(f"local glob {pattern!r} matches no file"))


def test_local_glob_matching_only_directories_fails(tree: Path) -> None:
    pattern = str(tree / "su*")
    assert_source_error(pattern, "matches no file")


def test_local_empty_directory_fails(tree: Path) -> None:
    assert_source_error(str(tree / "empty"), "has no files")


def test_local_missing_pathlike_fails(tmp_path: Path) -> None:
    assert_source_error(tmp_path / "nope", "does not exist")


def test_file_url_with_a_remote_host_fails() -> None:
    assert_source_error("file://server/share/a.tar", "only local files are supported")


# --- lists -------------------------------------------------------------------------------------


def test_list_is_flattened_in_order(tree: Path) -> None:
    sources = parse_sources(
        [
            "https://host/x-{0..1}.tar",
            "hf://datasets/org/name@main/a.parquet",
            tree / "c.tar",
            str(tree / "*.parquet"),
        ]
    )
    assert sources == [
        UrlSource("https://host/x-0.tar"),
        UrlSource("https://host/x-1.tar"),
        HubSource("org/name", "main", "a.parquet"),
        LocalSource(tree / "c.tar"),
        LocalSource(tree / "a.parquet"),
        LocalSource(tree / "b.parquet"),
    ]


def test_tuple_is_accepted() -> None:
    assert parse_sources(("https://h/a", "https://h/b")) == [
        UrlSource("https://h/a"),
        UrlSource("https://h/b"),
    ]


@pytest.mark.parametrize("source", [[], ()])
def test_empty_list_fails(source: list[str] | tuple[str, ...]) -> None:
    assert_source_error(source, "empty list of sources")


def test_bad_item_in_a_list_fails_naming_it() -> None:
    with pytest.raises(SourceError, match="unsupported scheme 'gs://'") as info:
        parse_sources(["https://h/a", "gs://bucket/key"])
    assert "'gs://bucket/key'" in str(info.value)
    assert ACCEPTED in str(info.value)


def test_nested_list_fails() -> None:
    with pytest.raises(SourceError, match="must be a string or a path, not list") as info:
        parse_sources([["https://h/a"]])  # type: ignore[list-item]
    assert "['https://h/a']" in str(info.value)
    assert ACCEPTED in str(info.value)


# --- anything else -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("gs://bucket/key", "unsupported scheme 'gs://'"),
        ("s3://", "names no bucket"),
        ("s3:///key", "names no bucket"),
        ("s3://-bucket/key", "is not a bucket name"),
        ("s3://bu cket/key", "is not a bucket name"),
        ("s3://bucket/a\nb", "the key has a control character"),
        ("s3://bucket/" + "k" * 1025, "longer than 1024 bytes"),
        ("ftp://host/file", "unsupported scheme 'ftp://'"),
        ("", "empty source string"),
        (None, "must be a string or a path, not NoneType"),
        (42, "must be a string or a path, not int"),
        (b"hf://datasets/org/name", "must be a string or a path, not bytes"),
        ({"https://h/a"}, "must be a string or a path, not set"),
    ],
)
def test_unsupported_sources_fail(source: object, problem: str) -> None:
    assert_source_error(source, re.escape(problem))


def test_s3_sources_keep_their_keys_as_written_and_expand_braces() -> None:
    assert parse_sources("s3://my-bucket") == [BucketSource("my-bucket", "")]
    assert parse_sources("s3://my-bucket/data/") == [BucketSource("my-bucket", "data/")]
    assert parse_sources("s3://b.k_1/a b/c%20d+e.tar") == [BucketSource("b.k_1", "a b/c%20d+e.tar")]
    assert parse_sources("s3://bkt/x/**/*.parquet") == [BucketSource("bkt", "x/**/*.parquet")]
    assert parse_sources("s3://bkt/train-{000..002}.tar") == [
        BucketSource("bkt", f"train-{i:03d}.tar") for i in range(3)
    ]
    assert BucketSource("bkt", "a/b.tar").uri == "s3://bkt/a/b.tar"


def test_all_is_the_public_surface() -> None:
    assert set(_sources.__all__) == {
        "MAX_BRACE_EXPANSION",
        "HubSource",
        "LocalSource",
        "BucketSource",
        "Source",
        "UrlSource",
        "expand_braces",
        "has_glob",
        "is_bucket_uri",
        "register_bucket_scheme",
        "unregister_bucket_scheme",
        "parse_sources",
        "repo_path_problem",
    }
    assert all(hasattr(_sources, name) for name in _sources.__all__)


# --- paths that would leave the repo ---------------------------------------------------------

#: Paths (and revisions) inside an hf:// URI that name something outside the repo's
#: URL prefixes once an HTTP client or proxy resolves dot segments and encodings.
LEAVING = [
    ("hf://datasets/org/repo/../x.mp4", "'..' segment"),
    ("hf://datasets/org/repo/../../api/whoami-v2.mp4", "'..' segment"),
    ("hf://datasets/org/repo/data/../../../api/whoami-v2", "'..' segment"),
    ("hf://datasets/org/repo/./x.mp4", "'.' segment"),
    ("hf://datasets/org/repo/data/.", "'.' segment"),
    ("hf://datasets/org/repo/%2e%2e/x.mp4", "percent-encoded '..'"),
    ("hf://datasets/org/repo/.%2E/x.mp4", "percent-encoded '..'"),
    ("hf://datasets/org/repo/%252e%252e/x.mp4", "percent-encoded '..'"),
    ("hf://datasets/org/repo/%2e/x.mp4", "percent-encoded '.'"),
    ("hf://datasets/org/repo/..%2f..%2fapi/x.mp4", "percent-encoded '/'"),
    ("hf://datasets/org/repo/a%2Fb.mp4", "percent-encoded '/'"),
    ("hf://datasets/org/repo/a%5c..%5cb.mp4", "percent-encoded '/' or backslash"),
    ("hf://datasets/org/repo/a\\..\\..\\x.mp4", "backslash"),
    ("hf://datasets/org/repo/a%00.mp4", "control character"),
    ("hf://datasets/org/repo/a\nb.mp4", "control character"),
    ("hf://datasets/org/repo@../x.mp4", "the revision '..'"),
    ("hf://datasets/org/repo@./x.mp4", "the revision '.'"),
    ("hf://datasets/org/repo@%2e%2e/x.mp4", "the revision '..'"),
    ("hf://datasets/org/repo@feature%2F..%2F..%2Fx/x.mp4", "the revision 'feature/../../x'"),
]


@pytest.mark.parametrize(("source", "problem"), LEAVING)
def test_hub_path_leaving_the_repo_fails(source: str, problem: str) -> None:
    error = assert_source_error(source, re.escape(problem))
    assert "could leave the repo" in str(error)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("hf://datasets/org/repo/a..b/c...json", HubSource("org/repo", None, "a..b/c...json")),
        ("hf://datasets/org/repo/.hidden/x.json", HubSource("org/repo", None, ".hidden/x.json")),
        ("hf://datasets/org/repo/100%25.txt", HubSource("org/repo", None, "100%25.txt")),
        ("hf://datasets/org/repo/x%2ey.txt", HubSource("org/repo", None, "x%2ey.txt")),
        ("hf://datasets/org/repo/data/", HubSource("org/repo", None, "data")),
        ("hf://datasets/org/repo@v1..2/a", HubSource("org/repo", "v1..2", "a")),
    ],
)
def test_hub_path_with_dots_inside_names_is_kept(source: str, expected: HubSource) -> None:
    assert parse_sources(source) == [expected]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    root = tmp_path_factory.mktemp("hub")
    make_repo(root, "org/repo", {"README.md": "# repo\n", "data/a.json": '{"x": 1}\n'})
    with HubServer(root) as server:
        yield server


def _inside_the_repo(line: str) -> bool:
    """Whether a request line of ``HubStats.paths`` stays under org/repo's URL prefixes."""
    where, _, path = line.split(" ", 2)
    if ".." in path or "%2e" in path.lower() or "/./" in path or path.endswith("/."):
        return False
    if where == "cdn":
        return path.startswith("/lfs/datasets/org/repo/")
    return path == "/api/datasets/org/repo" or path.startswith(
        (
            "/api/datasets/org/repo/revision/",
            "/api/datasets/org/repo/tree/",
            "/api/datasets/org/repo/paths-info/",
            "/datasets/org/repo/resolve/",
        )
    )


async def _via_stream(uri: str, hub: HubServer) -> None:
    async with ash.stream(uri, endpoint=hub.endpoint, token="hf_secret") as s:
        async for _ in s:
            pass


async def _via_video(uri: str, hub: HubServer) -> None:
    async with video.open(uri, endpoint=hub.endpoint, token="hf_secret") as reader:
        await reader.frames_at([0.0])


async def _via_lerobot(uri: str, hub: HubServer) -> None:
    async with lerobot.stream(uri, endpoint=hub.endpoint, token="hf_secret") as s:
        async for _ in s:
            pass


async def _via_webdataset(uri: str, hub: HubServer) -> None:
    def read() -> None:
        with ashwds.open_shard(uri, endpoint=hub.endpoint, token="hf_secret") as f:
            f.read()

    await anyio.to_thread.run_sync(read)


ENTRY_POINTS: dict[str, Callable[[str, HubServer], Awaitable[None]]] = {
    "stream": _via_stream,
    "video.open": _via_video,
    "lerobot.stream": _via_lerobot,
    "webdataset.open_shard": _via_webdataset,
}


@pytest.mark.anyio
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize(("source", "problem"), LEAVING[:3] + LEAVING[5:6] + LEAVING[15:16])
async def test_every_entry_point_refuses_a_path_leaving_the_repo(
    hub: HubServer, entry: str, source: str, problem: str
) -> None:
    hub.reset_stats()
    with pytest.raises(SourceError, match=re.escape(problem)) as info:
        await ENTRY_POINTS[entry](source, hub)
    assert "could leave the repo" in str(info.value)
    assert repr(source) in str(info.value)
    assert [p for p in hub.stats().paths if not _inside_the_repo(p)] == []


@pytest.mark.anyio
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
async def test_entry_points_request_only_inside_the_repo(hub: HubServer, entry: str) -> None:
    """The check above is not vacuous: the recorder sees a good path's requests, and
    each stays under the repo's prefixes."""
    hub.reset_stats()
    # stream and the webdataset opener read it; video and lerobot fail on its format
    with contextlib.suppress(ash.AiostreamError):
        await ENTRY_POINTS[entry]("hf://datasets/org/repo/data/a.json", hub)
    paths = hub.stats().paths
    assert any("/org/repo/" in p for p in paths)
    assert [p for p in paths if not _inside_the_repo(p)] == []


@pytest.mark.parametrize("repo", ["demo/text", "HuggingFaceFW/fineweb-edu", "allenai/c4"])
def test_a_bare_repo_id_is_pointed_to_its_hub_uri(
    repo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """How datasets users name a repo: not a local path here, so say the hf:// URI."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError, match=re.escape(f"pass 'hf://datasets/{repo}'")) as caught:
        parse_sources(repo)
    assert "Accepted sources" not in str(caught.value)  # no boilerplate after the way out


@pytest.mark.parametrize("path", ["data/train.parquet", "a/b/c", "./demo/text", "text"])
def test_a_missing_path_that_is_no_repo_id_lists_the_forms(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError, match="does not exist. Accepted sources") as caught:
        parse_sources(path)
    assert "hf://datasets/" + path not in str(caught.value)


def test_a_repo_id_that_exists_locally_is_read_as_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "demo" / "text").mkdir(parents=True)
    (tmp_path / "demo" / "text" / "a.parquet").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    (source,) = parse_sources("demo/text")
    assert isinstance(source, LocalSource)
