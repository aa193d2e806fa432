from __future__ import annotations

import gc
import io
import json
import pathlib
import warnings
from collections.abc import Callable
from typing import Any

import av
import datasets
import huggingface_hub.constants
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset

from aiostream_hf.testing import (
    make_image_parquet,
    make_repo,
    make_repo_split_folders,
    make_repo_split_naming,
    make_repo_yaml_configs,
    make_text_parquet,
    make_webdataset_shards,
)


def _files(folder: pathlib.Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _decode_jpeg(data: bytes) -> tuple[int, int]:
    assert data[:2] == b"\xff\xd8"
    assert data[-2:] == b"\xff\xd9"
    with av.open(io.BytesIO(data)) as container:
        frame = next(container.decode(video=0))
        assert frame.to_ndarray(format="rgb24").shape == (frame.height, frame.width, 3)
        return frame.width, frame.height


# -- text Parquet ------------------------------------------------------------


def test_text_parquet_same_seed_same_bytes(tmp_path: pathlib.Path) -> None:
    first = make_text_parquet(tmp_path / "a.parquet", rows=300, seed=1)
    second = make_text_parquet(tmp_path / "b.parquet", rows=300, seed=1)
    other = make_text_parquet(tmp_path / "c.parquet", rows=300, seed=2)

    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert (tmp_path / "a.parquet").read_bytes() != (tmp_path / "c.parquet").read_bytes()
    assert first.equals(second)
    assert first.column("text") != other.column("text")


def test_text_parquet_rows_schema_and_row_groups(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "nested" / "text.parquet"
    table = make_text_parquet(
        path, rows=250, row_group_size=100, min_text=30, max_text=60, start_id=1000
    )

    assert pq.read_table(path).equals(table)
    assert table.schema == pa.schema(
        [("id", pa.int64()), ("url", pa.string()), ("text", pa.string()), ("score", pa.float64())]
    )
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    assert table.column("id").to_pylist() == list(range(1000, 1250))
    texts = table.column("text").to_pylist()
    assert all(30 <= len(text.encode()) <= 60 and text.isascii() for text in texts)
    assert len(set(texts)) == len(texts)
    urls = table.column("url").to_pylist()
    assert all(url.startswith("https://example.com/") for url in urls)
    assert len(set(urls)) == len(urls)
    assert all(0.0 <= score < 1.0 for score in table.column("score").to_pylist())


def test_text_parquet_default_text_lengths(tmp_path: pathlib.Path) -> None:
    table = make_text_parquet(tmp_path / "t.parquet", rows=200)

    lengths = [len(text.encode()) for text in table.column("text").to_pylist()]
    assert min(lengths) >= 1000
    assert max(lengths) <= 10_000
    assert max(lengths) - min(lengths) > 5000  # the range is used, not one fixed length


@pytest.mark.parametrize(("compression", "codec"), [("zstd", "ZSTD"), (None, "UNCOMPRESSED")])
def test_text_parquet_compression(
    tmp_path: pathlib.Path, compression: str | None, codec: str
) -> None:
    make_text_parquet(tmp_path / "t.parquet", rows=10, compression=compression)

    metadata = pq.ParquetFile(tmp_path / "t.parquet").metadata
    assert metadata.row_group(0).column(2).compression == codec


def test_text_parquet_zero_rows(tmp_path: pathlib.Path) -> None:
    table = make_text_parquet(tmp_path / "empty.parquet", rows=0)

    assert table.num_rows == 0
    assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0


# -- image Parquet -----------------------------------------------------------


def test_image_parquet_holds_real_jpegs(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "images.parquet"
    table = make_image_parquet(path, rows=6, width=41, height=29, row_group_size=4)

    assert pq.read_table(path).equals(table)
    assert pq.ParquetFile(path).metadata.num_row_groups == 2
    images = table.column("image").to_pylist()
    assert [_decode_jpeg(image["bytes"]) for image in images] == [(41, 29)] * 6
    assert len({image["bytes"] for image in images}) == 6
    assert [image["path"] for image in images] == [f"image_{i:08d}.jpg" for i in range(6)]
    assert all(caption for caption in table.column("caption").to_pylist())
    assert all(0 <= label < 10 for label in table.column("label").to_pylist())


def test_image_parquet_has_datasets_image_feature(tmp_path: pathlib.Path) -> None:
    make_image_parquet(tmp_path / "images.parquet", rows=2)

    schema = pq.read_schema(tmp_path / "images.parquet")
    features = datasets.Features.from_arrow_schema(schema)
    assert isinstance(features["image"], datasets.Image)
    assert features["caption"] == datasets.Value("string")
    assert features["label"] == datasets.Value("int64")


def test_image_parquet_same_seed_same_bytes(tmp_path: pathlib.Path) -> None:
    for name, seed in [("a", 3), ("b", 3), ("c", 4)]:
        make_image_parquet(tmp_path / f"{name}.parquet", rows=4, seed=seed)

    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert (tmp_path / "a.parquet").read_bytes() != (tmp_path / "c.parquet").read_bytes()


# -- WebDataset --------------------------------------------------------------


def _read_shards(url: str) -> list[dict[str, Any]]:
    # webdataset 1.0.2 never closes the local shard files it opens (webdataset#311),
    # which is a ResourceWarning when the file is collected: keep it inside this block.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        samples = list(webdataset.WebDataset(url, shardshuffle=False))
        gc.collect()
    return samples


def test_webdataset_shards_read_back(tmp_path: pathlib.Path) -> None:
    paths = make_webdataset_shards(
        tmp_path / "shards", shards=3, samples_per_shard=4, seed=7, width=32, height=24
    )

    assert paths == [tmp_path / "shards" / f"train-{i:06d}.tar" for i in range(3)]
    samples = _read_shards(str(tmp_path / "shards" / "train-{000000..000002}.tar"))
    assert [sample["__key__"] for sample in samples] == [f"sample{i:08d}" for i in range(12)]
    for index, sample in enumerate(samples):
        assert {"jpg", "json", "cls"} <= sample.keys()
        assert not {key for key in sample if not key.startswith("__")} - {"jpg", "json", "cls"}
        assert _decode_jpeg(sample["jpg"]) == (32, 24)
        meta = json.loads(sample["json"])
        assert meta["index"] == index
        assert meta["seed"] == 7
        assert meta["caption"]
        assert 0 <= int(sample["cls"].decode()) < 10


def test_webdataset_single_shard_and_prefix(tmp_path: pathlib.Path) -> None:
    (path,) = make_webdataset_shards(tmp_path, shards=1, samples_per_shard=2, prefix="valid")

    assert path.name == "valid-000000.tar"
    assert [s["__key__"] for s in _read_shards(str(path))] == ["sample00000000", "sample00000001"]


def test_webdataset_same_seed_same_bytes(tmp_path: pathlib.Path) -> None:
    a = make_webdataset_shards(tmp_path / "a", shards=2, samples_per_shard=3, seed=1)
    b = make_webdataset_shards(tmp_path / "b", shards=2, samples_per_shard=3, seed=1)
    c = make_webdataset_shards(tmp_path / "c", shards=2, samples_per_shard=3, seed=2)

    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert a[0].read_bytes() != c[0].read_bytes()


# -- repo layouts ------------------------------------------------------------


def test_make_repo_writes_bytes_text_and_copies(tmp_path: pathlib.Path) -> None:
    source = tmp_path / "source.bin"
    source.write_bytes(b"\x00\x01")

    repo = make_repo(
        tmp_path / "root",
        "org/name",
        {"a.bin": b"\xff", "sub/dir/b.txt": "héllo", "c.bin": source},
    )

    assert repo == tmp_path / "root" / "datasets" / "org" / "name"
    assert _files(repo) == ["a.bin", "c.bin", "sub/dir/b.txt"]
    assert (repo / "a.bin").read_bytes() == b"\xff"
    assert (repo / "sub" / "dir" / "b.txt").read_text(encoding="utf-8") == "héllo"
    assert (repo / "c.bin").read_bytes() == b"\x00\x01"


@pytest.mark.parametrize("key", ["", "/abs.txt", "../x.txt", "a/../../x.txt", "a/.."])
def test_make_repo_rejects_paths_outside_the_repo(tmp_path: pathlib.Path, key: str) -> None:
    with pytest.raises(ValueError, match="files keys must be relative"):
        make_repo(tmp_path, "org/name", {key: b""})
    assert not (tmp_path / "datasets").exists()


LAYOUTS: dict[str, tuple[Callable[..., dict[str, dict[str, pa.Table]]], str, list[str]]] = {
    "split-naming": (
        make_repo_split_naming,
        "org/split-naming",
        [
            "README.md",
            "data/test-00000-of-00001.parquet",
            "data/train-00000-of-00002.parquet",
            "data/train-00001-of-00002.parquet",
        ],
    ),
    "split-folders": (
        make_repo_split_folders,
        "org/split-folders",
        ["README.md", "test/part-0.parquet", "train/part-0.parquet", "train/part-1.parquet"],
    ),
    "yaml-configs": (
        make_repo_yaml_configs,
        "org/yaml-configs",
        [
            "README.md",
            "en/test.parquet",
            "en/train-0.parquet",
            "en/train-1.parquet",
            "fr/a.parquet",
            "fr/b.parquet",
        ],
    ),
}
EXPECTED_SPLITS = {
    "split-naming": {"default": {"train": 2, "test": 1}},
    "split-folders": {"default": {"train": 2, "test": 1}},
    "yaml-configs": {"en": {"train": 2, "test": 1}, "fr": {"train": 2}},
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layout_files_and_tables(tmp_path: pathlib.Path, layout: str) -> None:
    maker, repo_id, files = LAYOUTS[layout]

    expected = maker(tmp_path, rows_per_file=7, seed=5)

    repo = tmp_path / "datasets" / repo_id
    assert _files(repo) == files
    assert {
        config: {split: table.num_rows // 7 for split, table in splits.items()}
        for config, splits in expected.items()
    } == EXPECTED_SPLITS[layout]
    ids = [i for splits in expected.values() for t in splits.values() for i in t["id"].to_pylist()]
    assert sorted(ids) == list(range(len(ids)))
    texts = [t for splits in expected.values() for tb in splits.values() for t in tb["text"]]
    assert all(20 <= len(text.as_py().encode()) <= 200 for text in texts)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layout_same_seed_same_bytes(tmp_path: pathlib.Path, layout: str) -> None:
    maker, repo_id, files = LAYOUTS[layout]
    for name, seed in [("a", 0), ("b", 0), ("c", 1)]:
        maker(tmp_path / name, rows_per_file=3, seed=seed)

    def contents(name: str) -> list[bytes]:
        repo = tmp_path / name / "datasets" / repo_id
        return [(repo / file).read_bytes() for file in files]

    assert contents("a") == contents("b")
    assert contents("a") != contents("c")


def test_layout_custom_repo_id(tmp_path: pathlib.Path) -> None:
    make_repo_split_naming(tmp_path, "me/My_Data.v2", rows_per_file=1)

    repo = tmp_path / "datasets" / "me" / "My_Data.v2"
    assert (repo / "README.md").read_text() == "# My_Data.v2\n"


@pytest.fixture
def offline_hf(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """Keep ``datasets`` off the network and out of the user's cache."""
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")
    monkeypatch.setattr(datasets.config, "HF_MODULES_CACHE", home / "modules")
    return home / "datasets"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layout_matches_datasets(offline_hf: pathlib.Path, layout: str) -> None:
    """``datasets`` infers the same configs, splits and rows from each layout."""
    maker, repo_id, _ = LAYOUTS[layout]
    root = offline_hf.parent.parent / "root"
    expected = maker(root, rows_per_file=5, seed=2)
    repo = str(root / "datasets" / repo_id)

    assert datasets.get_dataset_config_names(repo) == list(expected)
    for config, splits in expected.items():
        name = None if config == "default" else config
        assert sorted(datasets.get_dataset_split_names(repo, name)) == sorted(splits)
        for split, table in splits.items():
            loaded = datasets.load_dataset(
                repo, name, split=split, streaming=True, cache_dir=str(offline_hf)
            )
            assert list(loaded) == table.to_pylist(), (config, split)


def test_yaml_layout_default_config_is_en(offline_hf: pathlib.Path) -> None:
    root = offline_hf.parent.parent / "root"
    expected = make_repo_yaml_configs(root, rows_per_file=3)

    loaded = datasets.load_dataset(
        str(root / "datasets" / "org" / "yaml-configs"),
        split="train",
        streaming=True,
        cache_dir=str(offline_hf),
    )
    assert list(loaded) == expected["en"]["train"].to_pylist()


# -- argument checks ---------------------------------------------------------


@pytest.mark.parametrize(
    "repo_id", ["name", "org/name/extra", "org/na me", "../name", "org/..", "/name", "", "org/"]
)
def test_bad_repo_id(tmp_path: pathlib.Path, repo_id: str) -> None:
    with pytest.raises(ValueError, match="repo_id must be 'org/name'"):
        make_repo(tmp_path, repo_id, {})
    with pytest.raises(ValueError, match="repo_id must be 'org/name'"):
        make_repo_split_naming(tmp_path, repo_id)
    assert not (tmp_path / "datasets").exists()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: make_text_parquet(p / "t.parquet", rows=-1), "rows must be an integer >= 0"),
        (lambda p: make_text_parquet(p / "t.parquet", row_group_size=0), "row_group_size"),
        (lambda p: make_text_parquet(p / "t.parquet", min_text=10, max_text=5), "max_text"),
        (lambda p: make_text_parquet(p / "t.parquet", seed=-1), "seed must be"),
        (lambda p: make_image_parquet(p / "i.parquet", rows=-5), "rows must be"),
        (lambda p: make_image_parquet(p / "i.parquet", width=0), "width must be"),
        (lambda p: make_webdataset_shards(p, shards=0), "shards must be an integer >= 1"),
        (lambda p: make_webdataset_shards(p, samples_per_shard=-1), "samples_per_shard"),
        (lambda p: make_webdataset_shards(p, prefix="a/b"), "prefix must be"),
        (lambda p: make_repo_split_folders(p, rows_per_file=0), "rows_per_file"),
    ],
)
def test_bad_arguments(
    tmp_path: pathlib.Path, call: Callable[[pathlib.Path], object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        call(tmp_path)
    assert list(tmp_path.iterdir()) == []
