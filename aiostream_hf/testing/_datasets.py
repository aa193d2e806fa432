"""Deterministic synthetic datasets for tests, benchmarks and the demo.

Every maker draws all its randomness from ``numpy.random.default_rng(seed)``:
the same arguments give byte-identical files. Images are real JPEGs encoded
with PyAV's ``mjpeg`` encoder (no Pillow).

Repo layout makers write ``ROOT/datasets/ORG/NAME/`` (the tree the local Hub
server serves) and return ``{config: {split: table}}``: the rows of each split
in sorted file order, which is the order ``datasets`` reads them in.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import re
import shutil
from collections.abc import Mapping, Sequence
from typing import TypeAlias

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import webdataset
from numpy.typing import NDArray

__all__ = [
    "make_image_parquet",
    "make_repo",
    "make_repo_split_folders",
    "make_repo_split_naming",
    "make_repo_yaml_configs",
    "make_text_parquet",
    "make_webdataset_shards",
]

StrPath: TypeAlias = "str | os.PathLike[str]"
Layout: TypeAlias = "dict[str, dict[str, pa.Table]]"

_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
_TAR_MTIME = 1_700_000_000  # fixed member mtime, so shards are reproducible
_TEXT_BLOCK_BYTES = 1 << 30  # keep each string chunk well below int32 offsets
_PHRASES_PER_CHUNK = 1 << 20

_TEXT_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("url", pa.string()),
        pa.field("text", pa.string()),
        pa.field("score", pa.float64()),
    ]
)
_IMAGE_STRUCT = pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])
_IMAGE_FEATURES = {
    "info": {
        "features": {
            "image": {"_type": "Image"},
            "caption": {"dtype": "string", "_type": "Value"},
            "label": {"dtype": "int64", "_type": "Value"},
        }
    }
}
_IMAGE_SCHEMA = pa.schema(
    [
        pa.field("image", _IMAGE_STRUCT),
        pa.field("caption", pa.string()),
        pa.field("label", pa.int64()),
    ],
    metadata={b"huggingface": json.dumps(_IMAGE_FEATURES).encode()},
)


# -- argument checks ---------------------------------------------------------


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_name(name: str, value: str) -> None:
    if not _NAME_RE.fullmatch(value) or value in (".", ".."):
        raise ValueError(f"{name} must be a name made of [A-Za-z0-9._-], got {value!r}")


def _check_repo_id(repo_id: str) -> tuple[str, str]:
    parts = repo_id.split("/") if isinstance(repo_id, str) else []
    if len(parts) != 2 or not all(
        _NAME_RE.fullmatch(part) and part not in (".", "..") for part in parts
    ):
        raise ValueError(
            f"repo_id must be 'org/name' with both parts made of [A-Za-z0-9._-], got {repo_id!r}"
        )
    return parts[0], parts[1]


def _relative_path(name: str) -> pathlib.PurePosixPath:
    path = pathlib.PurePosixPath(name)
    if not name or path.is_absolute() or any(part in ("", ".", "..") for part in path.parts):
        raise ValueError(
            f"files keys must be relative POSIX paths inside the repo like 'data/a.parquet', "
            f"got {name!r}"
        )
    return path


# -- text --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Vocabulary:
    words: list[str]
    phrases: list[bytes]  # runs of 8-20 Zipf-distributed words, the unit texts are built from
    mean_phrase: float


@functools.lru_cache(maxsize=1)
def _vocabulary() -> _Vocabulary:
    """4096 fixed pseudo-words and 32768 fixed phrases made of them (seed-independent)."""
    rng = np.random.default_rng(0x5EED)
    onsets = [*"bcdfghklmnprstvw", "st", "tr", "pl", "ch", "sh", "th", "gr", "br"]
    vowels = [*"aeiouy", "ai", "ea", "ou"]
    codas = ["", "", "", *"nrstlm", "nd", "st", "ng"]
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < 4096:
        word = "".join(
            onsets[int(rng.integers(len(onsets)))]
            + vowels[int(rng.integers(len(vowels)))]
            + codas[int(rng.integers(len(codas)))]
            for _ in range(int(rng.integers(1, 4)))
        )
        if word not in seen:
            seen.add(word)
            words.append(word)
    # Tokens are words with a separator; a few end a clause or a sentence.
    separators = rng.choice([" ", ", ", ". "], size=len(words), p=[0.9, 0.06, 0.04])
    tokens = [
        (word + str(sep)).encode("ascii") for word, sep in zip(words, separators, strict=True)
    ]
    weights = 1.0 / np.arange(1, len(tokens) + 1, dtype=np.float64)
    cdf = np.cumsum(weights / weights.sum())
    cdf[-1] = 1.0
    words_per_phrase = rng.integers(8, 21, size=32768)
    token_ids = np.searchsorted(cdf, rng.random(int(words_per_phrase.sum())), side="right")
    pool = b"".join(map(tokens.__getitem__, token_ids.tolist()))
    lengths = np.array([len(token) for token in tokens], dtype=np.int64)[token_ids]
    token_ends = np.cumsum(lengths)
    phrase_ends = token_ends[np.cumsum(words_per_phrase) - 1].tolist()
    phrases = [
        pool[start:end] for start, end in zip([0, *phrase_ends[:-1]], phrase_ends, strict=True)
    ]
    return _Vocabulary(words=words, phrases=phrases, mean_phrase=len(pool) / len(phrases))


def _text_bytes(rng: np.random.Generator, nbytes: int) -> bytes:
    """At least ``nbytes`` of pseudo-word text: random fixed phrases, joined."""
    vocab = _vocabulary()
    chunks: list[bytes] = []
    filled = 0
    while filled < nbytes:
        count = min(int((nbytes - filled) / vocab.mean_phrase * 1.05) + 16, _PHRASES_PER_CHUNK)
        chunk = b"".join(
            map(vocab.phrases.__getitem__, rng.integers(len(vocab.phrases), size=count).tolist())
        )
        chunks.append(chunk)
        filled += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _string_array(data: bytes, lengths: NDArray[np.int64]) -> pa.ChunkedArray:
    """Zero-copy string column over ``data`` cut at ``lengths``."""
    buffer = pa.py_buffer(data)
    ends = np.cumsum(lengths)
    chunks = []
    start_row, start_byte = 0, 0
    while start_row < lengths.size:
        stop_row = int(np.searchsorted(ends, start_byte + _TEXT_BLOCK_BYTES, side="right"))
        stop_row = max(stop_row, start_row + 1)
        stop_byte = int(ends[stop_row - 1])
        offsets = np.concatenate([[0], ends[start_row:stop_row] - start_byte]).astype(np.int32)
        chunks.append(
            pa.StringArray.from_buffers(
                stop_row - start_row,
                pa.py_buffer(offsets),
                buffer.slice(start_byte, stop_byte - start_byte),
            )
        )
        start_row, start_byte = stop_row, stop_byte
    return pa.chunked_array(chunks, type=pa.string())


def _words(rng: np.random.Generator, count: int) -> list[str]:
    words = _vocabulary().words
    return [words[i] for i in rng.integers(len(words), size=count)]


def make_text_parquet(
    path: StrPath,
    *,
    rows: int = 1000,
    row_group_size: int = 100_000,
    seed: int = 0,
    min_text: int = 1000,
    max_text: int = 10_000,
    compression: str | None = "snappy",
    start_id: int = 0,
) -> pa.Table:
    """Write web-text rows (id, url, text, score) to a Parquet file; return the table."""
    _check_int("rows", rows, 0)
    _check_int("row_group_size", row_group_size, 1)
    _check_int("seed", seed, 0)
    _check_int("min_text", min_text, 0)
    _check_int("max_text", max_text, min_text)
    _check_int("start_id", start_id, 0)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_text, max_text + 1, size=rows, dtype=np.int64)
    text = _string_array(_text_bytes(rng, int(lengths.sum())), lengths)
    ids = np.arange(start_id, start_id + rows, dtype=np.int64)
    slugs = _words(rng, 2 * rows)
    urls = [
        f"https://example.com/{slugs[2 * i]}-{slugs[2 * i + 1]}/{row_id}"
        for i, row_id in enumerate(ids.tolist())
    ]
    scores = rng.random(rows)
    table = pa.Table.from_arrays(
        [pa.array(ids), pa.array(urls, type=pa.string()), text, pa.array(scores)],
        schema=_TEXT_SCHEMA,
    )
    _write_parquet(table, path, row_group_size=row_group_size, compression=compression)
    return table


def _write_parquet(
    table: pa.Table, path: StrPath, *, row_group_size: int, compression: str | None
) -> None:
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, target, row_group_size=row_group_size, compression=compression)


# -- images ------------------------------------------------------------------


def _random_image(rng: np.random.Generator, width: int, height: int) -> NDArray[np.uint8]:
    """An RGB picture: a random gradient, a few rectangles and some noise."""
    y = np.linspace(0.0, 1.0, height)[:, None, None]
    x = np.linspace(0.0, 1.0, width)[None, :, None]
    base, dx, dy = rng.uniform(0, 255, 3), rng.uniform(-128, 128, 3), rng.uniform(-128, 128, 3)
    image = base + dx * x + dy * y
    for _ in range(3):
        top, bottom = np.sort(rng.integers(0, height + 1, size=2))
        left, right = np.sort(rng.integers(0, width + 1, size=2))
        image[top:bottom, left:right] = rng.uniform(0, 255, 3)
    image += rng.normal(0.0, 6.0, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def _encode_jpeg(rgb: NDArray[np.uint8]) -> bytes:
    """Encode an (height, width, 3) uint8 RGB array as one baseline JPEG."""
    height, width, _ = rgb.shape
    codec = av.CodecContext.create("mjpeg", "w")
    codec.width = width
    codec.height = height
    codec.pix_fmt = "yuvj420p"
    codec.thread_count = 1
    frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuvj420p")
    packets = [*codec.encode(frame), *codec.encode(None)]
    return b"".join(bytes(packet) for packet in packets)


def _caption(rng: np.random.Generator) -> str:
    words = _words(rng, int(rng.integers(3, 9)))
    return "a picture of " + " ".join(words)


def make_image_parquet(
    path: StrPath,
    *,
    rows: int = 100,
    width: int = 64,
    height: int = 48,
    seed: int = 0,
    row_group_size: int = 1000,
) -> pa.Table:
    """Write rows (image {bytes, path} of real JPEGs, caption, label) with HF Image features."""
    _check_int("rows", rows, 0)
    _check_int("width", width, 1)
    _check_int("height", height, 1)
    _check_int("seed", seed, 0)
    _check_int("row_group_size", row_group_size, 1)
    rng = np.random.default_rng(seed)
    images, captions, labels = [], [], []
    for index in range(rows):
        jpeg = _encode_jpeg(_random_image(rng, width, height))
        images.append({"bytes": jpeg, "path": f"image_{index:08d}.jpg"})
        captions.append(_caption(rng))
        labels.append(int(rng.integers(10)))
    table = pa.Table.from_pydict(
        {"image": images, "caption": captions, "label": labels}, schema=_IMAGE_SCHEMA
    )
    _write_parquet(table, path, row_group_size=row_group_size, compression="snappy")
    return table


def make_webdataset_shards(
    folder: StrPath,
    *,
    shards: int = 4,
    samples_per_shard: int = 100,
    seed: int = 0,
    prefix: str = "train",
    width: int = 64,
    height: int = 48,
) -> list[pathlib.Path]:
    """Write ``{prefix}-000000.tar``... shards of jpg + json + cls samples; return their paths."""
    _check_int("shards", shards, 1)
    _check_int("samples_per_shard", samples_per_shard, 0)
    _check_int("seed", seed, 0)
    _check_int("width", width, 1)
    _check_int("height", height, 1)
    _check_name("prefix", prefix)
    target = pathlib.Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for shard in range(shards):
        path = target / f"{prefix}-{shard:06d}.tar"
        with (
            path.open("wb") as stream,
            webdataset.TarWriter(stream, encoder=False, mtime=_TAR_MTIME) as writer,
        ):
            for offset in range(samples_per_shard):
                index = shard * samples_per_shard + offset
                jpeg = _encode_jpeg(_random_image(rng, width, height))
                meta = {"caption": _caption(rng), "index": index, "seed": seed}
                writer.write(
                    {
                        "__key__": f"sample{index:08d}",
                        "jpg": jpeg,
                        "json": json.dumps(meta, sort_keys=True).encode(),
                        "cls": str(int(rng.integers(10))).encode(),
                    }
                )
        paths.append(path)
    return paths


# -- repo layouts ------------------------------------------------------------


def make_repo(
    root: StrPath, repo_id: str, files: Mapping[str, bytes | str | os.PathLike[str]]
) -> pathlib.Path:
    """Write ``files`` (bytes, text, or a file to copy) into ``root/datasets/ORG/NAME/``.

    Files already in the repo folder are kept. Returns the repo folder.
    """
    org, name = _check_repo_id(repo_id)
    repo = pathlib.Path(root) / "datasets" / org / name
    relative = {_relative_path(key): value for key, value in files.items()}
    repo.mkdir(parents=True, exist_ok=True)
    for key, value in relative.items():
        target = repo.joinpath(*key.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(value, bytes):
            target.write_bytes(value)
        elif isinstance(value, str):
            target.write_text(value, encoding="utf-8")
        else:
            shutil.copyfile(value, target)
    return repo


def _derive_seed(seed: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint32)[0])


def _text_repo(
    root: StrPath,
    repo_id: str,
    readme: str,
    files: Sequence[tuple[str, str, str]],
    *,
    rows_per_file: int,
    seed: int,
) -> Layout:
    """Write small text Parquet files given as (config, split, path); ids unique in the repo."""
    _check_int("rows_per_file", rows_per_file, 1)
    _check_int("seed", seed, 0)
    repo = make_repo(root, repo_id, {"README.md": readme})
    written: dict[str, dict[str, list[tuple[str, pa.Table]]]] = {}
    for index, (config, split, relpath) in enumerate(files):
        table = make_text_parquet(
            repo / relpath,
            rows=rows_per_file,
            seed=_derive_seed(seed, index),
            min_text=20,
            max_text=200,
            start_id=index * rows_per_file,
        )
        written.setdefault(config, {}).setdefault(split, []).append((relpath, table))
    return {
        config: {
            split: pa.concat_tables([table for _, table in sorted(tables, key=lambda t: t[0])])
            for split, tables in splits.items()
        }
        for config, splits in written.items()
    }


def make_repo_split_naming(
    root: StrPath, repo_id: str = "org/split-naming", *, rows_per_file: int = 50, seed: int = 0
) -> Layout:
    """Splits from file names: ``data/train-00000-of-00002.parquet`` and so on."""
    _check_repo_id(repo_id)
    return _text_repo(
        root,
        repo_id,
        f"# {repo_id.split('/')[1]}\n",
        [
            ("default", "train", "data/train-00000-of-00002.parquet"),
            ("default", "train", "data/train-00001-of-00002.parquet"),
            ("default", "test", "data/test-00000-of-00001.parquet"),
        ],
        rows_per_file=rows_per_file,
        seed=seed,
    )


def make_repo_split_folders(
    root: StrPath, repo_id: str = "org/split-folders", *, rows_per_file: int = 50, seed: int = 0
) -> Layout:
    """Splits from folder names: ``train/part-0.parquet``, ``test/part-0.parquet``."""
    _check_repo_id(repo_id)
    return _text_repo(
        root,
        repo_id,
        f"# {repo_id.split('/')[1]}\n",
        [
            ("default", "train", "train/part-0.parquet"),
            ("default", "train", "train/part-1.parquet"),
            ("default", "test", "test/part-0.parquet"),
        ],
        rows_per_file=rows_per_file,
        seed=seed,
    )


_YAML_CONFIGS_README = """\
---
configs:
- config_name: en
  default: true
  data_files:
  - split: train
    path: en/train-*.parquet
  - split: test
    path: en/test.parquet
- config_name: fr
  data_files:
  - split: train
    path: fr/*.parquet
---
# {name}

Two configs declared in the YAML front matter: `en` (default; train, test) and `fr` (train).
"""


def make_repo_yaml_configs(
    root: StrPath, repo_id: str = "org/yaml-configs", *, rows_per_file: int = 50, seed: int = 0
) -> Layout:
    """Configs ``en`` (default; train, test) and ``fr`` (train) declared in README YAML."""
    _check_repo_id(repo_id)
    return _text_repo(
        root,
        repo_id,
        _YAML_CONFIGS_README.format(name=repo_id.split("/")[1]),
        [
            ("en", "train", "en/train-0.parquet"),
            ("en", "train", "en/train-1.parquet"),
            ("en", "test", "en/test.parquet"),
            ("fr", "train", "fr/a.parquet"),
            ("fr", "train", "fr/b.parquet"),
        ],
        rows_per_file=rows_per_file,
        seed=seed,
    )
