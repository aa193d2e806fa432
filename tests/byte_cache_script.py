"""A process reading org/text through the byte cache (tests/test_byte_cache.py).

python byte_cache_script.py read ENDPOINT CACHE_DIR    # prints ids and cache counts
python byte_cache_script.py stall ENDPOINT CACHE_DIR   # hangs half-way through a write
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import aiostream_hf as ash
from aiostream_hf._byte_cache import ByteCache


def main() -> None:
    mode, endpoint, cache_dir = sys.argv[1:4]
    if mode == "stall":

        def stall(f: Any, data: bytes) -> None:
            f.write(data[: len(data) // 2])
            f.flush()
            print("writing", flush=True)
            time.sleep(3600)  # killed here

        ByteCache._write = staticmethod(stall)  # type: ignore[method-assign]
    options = ash.StreamOptions(cache_dir=cache_dir, byte_cache_bytes=1 << 30)
    s = ash.stream("hf://datasets/org/text", endpoint=endpoint, options=options)
    with s:
        ids = [row["id"] for row in s]
    cache = s.statistics().fetcher["byte_cache"]
    print(json.dumps({"ids": ids, **cache}))


if __name__ == "__main__":
    main()
