"""A process that opens a Hub video through the byte cache (tests/test_video_index_cache.py).

python video_index_cache_script.py BACKEND ENDPOINT CACHE_DIR T1 [T2 ...]

Prints the reader's statistics, the fetcher's byte cache counts and a digest of the
frames at the given times, as JSON.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from typing import Any

import anyio

import aiostream_hf as ash
from aiostream_hf import video
from aiostream_hf._fetcher import RangeFetcher

URL = "hf://datasets/org/videos/clip.mp4"


async def main(endpoint: str, cache_dir: str, times: list[float]) -> dict[str, Any]:
    options = ash.StreamOptions(cache_dir=cache_dir, byte_cache_bytes=1 << 30, pin_ttl=3600)
    async with video.open(URL, options=options, endpoint=endpoint) as reader:
        frames = await reader.frames_at(times)
        source = reader._source
        assert isinstance(source, RangeFetcher)
        return {
            "video": dataclasses.asdict(reader.statistics()),
            "byte_cache": dict(source.statistics().byte_cache),
            "requests": source.statistics().total_requests,
            "digest": hashlib.sha256(frames.data.tobytes()).hexdigest(),
        }


if __name__ == "__main__":
    backend, endpoint, cache_dir, *times = sys.argv[1:]
    out = anyio.run(main, endpoint, cache_dir, [float(t) for t in times], backend=backend)
    print(json.dumps(out))
