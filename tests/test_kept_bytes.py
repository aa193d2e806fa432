"""KeptBytes (``_kept_bytes``): fetched bytes kept in memory and cut from, and a shuffled
LeRobot epoch that thereby fetches each byte of its videos about once."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import aiostream_hf as ash
from aiostream_hf._kept_bytes import KeptBytes
from aiostream_hf._models import FileRef
from aiostream_hf.testing import HubServer, make_lerobot_dataset

pytestmark = pytest.mark.anyio

DATA = bytes(range(256)) * 40  # 10,240 bytes
FILE = FileRef(url="https://example.invalid/f.mp4", path="f.mp4", size=len(DATA), etag="v1")


class _Source:
    """A ByteSource over ``DATA`` that records every range it is asked for."""

    def __init__(self, streams: bool = True) -> None:
        self.asked: list[tuple[int, int]] = []
        self.closed = 0
        if not streams:
            self.iter_bytes = None  # type: ignore[assignment]

    async def read_tail(self, file: FileRef, n: int) -> tuple[bytes, int]:
        return DATA[-n:], len(DATA)

    async def read_buffers(
        self, file: FileRef, ranges: Sequence[tuple[int, int]]
    ) -> list[memoryview]:
        await anyio.lowlevel.checkpoint()
        self.asked.extend(ranges)
        return [memoryview(DATA[s:e]) for s, e in ranges]

    def iter_bytes(
        self,
        file: FileRef,
        start: int = 0,
        end: int | None = None,
        *,
        block_size: int | None = None,
    ) -> Any:
        source = self
        end = len(DATA) if end is None else end
        self.asked.append((start, end))

        async def blocks() -> AsyncIterator[bytes]:
            for at in range(start, end, 1000):
                await anyio.lowlevel.checkpoint()
                yield DATA[at : min(end, at + 1000)]

        class Blocks:
            def __init__(self) -> None:
                self._blocks = blocks()

            async def __aenter__(self) -> Blocks:
                return self

            async def __aexit__(self, *exc: object) -> None:
                await self._blocks.aclose()  # type: ignore[attr-defined]
                source.closed += 1

            def __aiter__(self) -> AsyncIterator[bytes]:
                return self._blocks

        return Blocks()


async def _streamed(kept: KeptBytes, file: FileRef, start: int, end: int) -> bytes:
    async with kept.iter_bytes(file, start, end, block_size=1000) as blocks:
        return b"".join([bytes(b) async for b in blocks])


@pytest.mark.parametrize("streams", [True, False])
async def test_only_what_is_not_kept_is_fetched(streams: bool) -> None:
    source = _Source(streams)
    kept = KeptBytes(source, limit=1 << 20)  # type: ignore[arg-type]
    assert await kept.read_ranges(FILE, [(100, 200)]) == [DATA[100:200]]
    assert await kept.read_ranges(FILE, [(120, 150), (100, 200)]) == [
        DATA[120:150],
        DATA[100:200],
    ]
    assert source.asked == [(100, 200)]  # the second call was cut from what was kept
    pieces = await kept.read_pieces(FILE, [(50, 300)])
    assert source.asked[1:] == [(50, 100), (200, 300)]
    assert [(at, len(v)) for at, v in pieces[0]] == [(50, 50), (100, 100), (200, 100)]
    assert b"".join(v for _, v in pieces[0]) == DATA[50:300]
    # streamed: the kept bytes, then the rest from the source, which is kept too
    assert await _streamed(kept, FILE, 0, 2500) == DATA[0:2500]
    assert source.asked[3:] == [(0, 50), (300, 2500)]
    assert await _streamed(kept, FILE, 10, 2400) == DATA[10:2400]
    assert len(source.asked) == 5
    assert kept.reused == 30 + 100 + 100 + 250 + 2390
    assert kept.held_bytes() == 2500


async def test_another_version_of_the_file_is_fetched_again() -> None:
    source = _Source()
    kept = KeptBytes(source, limit=1 << 20)  # type: ignore[arg-type]
    await kept.read_ranges(FILE, [(0, 100)])
    changed = dataclasses.replace(FILE, etag="v2")
    await kept.read_ranges(changed, [(0, 100)])
    await kept.read_ranges(dataclasses.replace(FILE, url=FILE.url + "?other"), [(0, 100)])
    assert source.asked == [(0, 100)] * 3


async def test_the_least_recently_used_parts_go_first_within_the_limit() -> None:
    source = _Source()
    kept = KeptBytes(source, limit=250)  # type: ignore[arg-type]
    for start in (0, 1000, 2000):
        await kept.read_ranges(FILE, [(start, start + 100)])
    assert kept.held_bytes() == 200  # the first went to keep the third within 250
    await kept.read_ranges(FILE, [(1000, 1100)])  # used: now the newest
    await kept.read_ranges(FILE, [(3000, 3100)])  # drops 2000, not 1000
    assert kept.held_bytes() == 200
    asked = len(source.asked)
    await kept.read_ranges(FILE, [(1000, 1100), (3000, 3100)])
    assert len(source.asked) == asked
    await kept.read_ranges(FILE, [(2000, 2100)])
    assert source.asked[-1] == (2000, 2100)
    # a part larger than the limit is read, not kept
    await kept.read_ranges(FILE, [(5000, 5300)])
    assert kept.held_bytes() <= 250
    await kept.read_ranges(FILE, [(5000, 5300)])
    assert source.asked[-2:] == [(5000, 5300)] * 2
    assert kept.dropped > 0


async def test_bytes_fetched_twice_at_once_are_kept_once() -> None:
    source = _Source()
    kept = KeptBytes(source, limit=1 << 20)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(kept.read_ranges, FILE, [(0, 500)])
    assert source.asked == [(0, 500)] * 2
    assert kept.held_bytes() == 500
    assert await kept.read_ranges(FILE, [(0, 500)]) == [DATA[:500]]


async def test_a_streamed_read_left_early_ends_the_source_read_and_keeps_nothing() -> None:
    source = _Source()
    kept = KeptBytes(source, limit=1 << 20)  # type: ignore[arg-type]
    async with kept.iter_bytes(FILE, 0, 5000) as blocks:
        async for block in blocks:
            assert bytes(block) == DATA[:1000]
            break
    assert source.closed == 1
    assert kept.held_bytes() == 0  # a part is kept only once whole


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="limit=-1"):
        KeptBytes(_Source(), limit=-1)  # type: ignore[arg-type]


# -- a shuffled LeRobot epoch ---------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    # videos over the 1 MiB a reader reads whole at open: frames are read by range
    make_lerobot_dataset(root, "org/robot", episodes=[40, 40, 40, 40], codec="h264", crf=15)
    return root


@pytest.fixture(scope="module")
def hub(root: Path) -> Iterator[HubServer]:
    with HubServer(root, lfs_threshold=0) as server:  # every byte counted at the CDN
        yield server


def _video_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "datasets/org/robot/videos").rglob("*.mp4"))


async def _epoch(hub: HubServer, tmp_path: Path, **options: Any) -> tuple[list[Any], int, Any]:
    before = hub.wait_idle().bytes_served
    async with ash.lerobot.stream(
        "hf://datasets/org/robot",
        endpoint=hub.endpoint,
        options=ash.StreamOptions(cache_dir=tmp_path, **options),
        shuffle=True,
        delta_timestamps={"observation.images.top": [-0.1, 0.0]},
    ) as s:
        items = [(int(x["index"]), int(x["observation.images.top"].sum())) async for x in s]
    return items, hub.wait_idle().bytes_served - before, s.statistics()


async def test_a_shuffled_epoch_fetches_its_videos_about_once(
    hub: HubServer, root: Path, tmp_path: Path
) -> None:
    items, served, stats = await _epoch(hub, tmp_path)
    assert sorted(i for i, _ in items) == list(range(160))
    videos = _video_bytes(root)
    assert served <= 1.2 * videos + 65_536, (served, videos)  # + data, metadata, API answers
    assert stats.video["bytes_reused"] > 0
    # with nothing kept, the same items, and each batch's joined reads fetched again
    again, served_again, stats_again = await _epoch(hub, tmp_path, kept_video_bytes=0)
    assert again == items
    assert served_again > 2 * served, (served, served_again, videos)
    assert "bytes_reused" not in stats_again.video
