"""Training on WebDataset TAR shards: brace-expanded URLs, a shuffle buffer, batches, resume.

    python examples/webdataset_training.py                # a local Hub server, synthetic shards
    python examples/webdataset_training.py "https://host/data/train-{000000..000099}.tar"
    python examples/webdataset_training.py hf://datasets/ORG/NAME --split train

Samples are grouped from the TAR members by key exactly as the ``webdataset``
library does: ``{"__key__": ..., "__url__": ..., "jpg": bytes, "cls": bytes, ...}``.
``shuffle=`` shuffles the shard order by (seed, epoch) and the samples through a
bounded buffer; ``rank``/``world_size`` (default: RANK/WORLD_SIZE) give each rank a
disjoint share of the shards. ``state_dict()`` is the exact position: a new stream
that loads it continues with the next sample.

JPEGs are decoded with PyAV (already a dependency), so no Pillow is needed.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import av
import numpy as np

import aiostream_hf as ash

SHARDS = 4


@contextlib.contextmanager
def local_hub() -> Iterator[str]:
    """A local Hub server with org/shards (train-000000.tar ...); yields the shard URLs."""
    from aiostream_hf.testing import Faults, HubServer, make_repo, make_webdataset_shards

    with tempfile.TemporaryDirectory() as root:
        repo = make_repo(root, "org/shards", {"README.md": "# shards\n"})
        make_webdataset_shards(repo, shards=SHARDS, samples_per_shard=100)
        with HubServer(root, faults=Faults(latency_ms=20)) as hub:
            # Plain https-style URLs with braces, as webdataset users write them.
            last = f"{SHARDS - 1:06d}"
            yield f"{hub.endpoint}/datasets/org/shards/resolve/main/train-{{000000..{last}}}.tar"


def decode_jpeg(data: bytes) -> np.ndarray[Any, Any]:
    """JPEG bytes -> H x W x 3 uint8, with FFmpeg's mjpeg decoder."""
    codec = av.CodecContext.create("mjpeg", "r")
    (frame,) = codec.decode(av.Packet(data))
    return frame.to_ndarray(format="rgb24")


def decode(sample: dict[str, Any]) -> tuple[np.ndarray[Any, Any], int]:
    image = decode_jpeg(sample["jpg"])
    label = int(sample["cls"]) if "cls" in sample else -1
    if "json" in sample:
        json.loads(sample["json"])  # the metadata, if a model wanted it
    return image, label


def batches(
    stream: ash.Stream, batch_size: int, limit: int
) -> Iterator[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    """Decoded samples grouped into (images, labels) batches; stops after ``limit`` samples."""
    images: list[np.ndarray[Any, Any]] = []
    labels: list[int] = []
    for n, sample in enumerate(stream, 1):
        image, label = decode(sample)
        images.append(image)
        labels.append(label)
        if len(images) == batch_size or n == limit:
            yield np.stack(images), np.array(labels)
            images, labels = [], []
        if n == limit:
            return
    if images:
        yield np.stack(images), np.array(labels)


def train(source: str, args: argparse.Namespace) -> None:
    kwargs: dict[str, Any] = {"split": args.split, "shuffle": args.shuffle or False, "seed": 0}
    started = time.perf_counter()
    s = ash.stream(source, **kwargs)
    seen = 0
    pixel_sum = 0.0
    classes: dict[int, int] = {}
    with s:
        for images, labels in batches(s, args.batch_size, args.limit):
            seen += len(images)
            pixel_sum += float(images.mean()) * len(images)  # the "training step"
            for label in labels.tolist():
                classes[label] = classes.get(label, 0) + 1
        state = s.state_dict()
        stats = s.statistics()
        shape = images.shape[1:]
    seconds = time.perf_counter() - started
    print(f"{seen:,} samples ({shape[1]}x{shape[0]} images) from {stats.files} shards")
    print(f"in {seconds:.2f} s: {seen / seconds:,.0f} samples/s, batches of {args.batch_size}")
    print(f"classes seen: {dict(sorted(classes.items()))}; mean pixel {pixel_sum / seen:.1f}")
    requests = stats.fetcher["requests"]
    print(
        f"requests: {stats.resolver.get('api_requests', 0)} api, {requests['resolve']} "
        f"resolvers, {requests['range'] + requests['stream']} shard reads"
    )
    # Resume: a new stream with the same arguments continues at the next sample.
    with ash.stream(source, **kwargs) as original:
        expected = [sample["__key__"] for sample in itertools.islice(original, seen, seen + 3)]
    resumed = ash.stream(source, **kwargs)
    resumed.load_state_dict(state)
    with resumed:
        got = [sample["__key__"] for sample in itertools.islice(resumed, 3)]
    print(f"resumed after {seen} samples: next keys {got}, as expected: {got == expected}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", nargs="?", help="shard URLs with {000..099}, or hf://...")
    parser.add_argument("--split", help="for hf:// sources (URLs and paths are one split)")
    parser.add_argument("--shuffle", type=int, default=100, help="shuffle buffer (0: off)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--limit", type=int, default=200, help="samples to train on")
    args = parser.parse_args()
    if args.source:
        train(args.source, args)
        return
    with local_hub() as urls:
        print(f"shards: {urls} (local Hub server, +20 ms per request)")
        train(urls, args)


if __name__ == "__main__":
    main()
