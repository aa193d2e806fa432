"""``python -m aiostream_hf.testing._hub_main CONFIG_JSON``: HubServer(subprocess=True)'s child."""

from __future__ import annotations

import json
import sys

from ._hub_server import serve_forever

if __name__ == "__main__":
    serve_forever(json.loads(sys.argv[1]))
