"""Run datasets.load_dataset(..., streaming=True) and print the rows as one JSON line.

Usage: datasets_oracle.py REPO CONFIG:SPLIT [CONFIG:SPLIT ...] [--data-files JSON]
Run in a fresh process with HF_ENDPOINT pointing at the local Hub server.
"""

from __future__ import annotations

import json
import sys

import datasets


def main(argv: list[str]) -> None:
    data_files = None
    if "--data-files" in argv:
        i = argv.index("--data-files")
        data_files = json.loads(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    repo, specs = argv[0], argv[1:]
    out = {}
    for spec in specs:
        config, _, split = spec.partition(":")
        ds = datasets.load_dataset(
            repo,
            None if config == "default" else config,
            split=split,
            streaming=True,
            data_files=data_files,
        )
        out[spec] = list(ds)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
