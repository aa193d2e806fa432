"""Reading a contact sheet back (tests/test_demo.py, the demo's test in tests/test_cli.py):
where its tiles are, found from the background between them, and the caption under each,
read glyph by glyph against the font it was drawn with.

The reader assumes what the sheets it reads hold: frames with no row or column all of
the background colour, and captions with ink in the font's top and bottom rows (a digit
has both), so that the ink's height gives the scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from aiostream_hf._demo import SHEET_BACKGROUND
from aiostream_hf._glyphs import ALPHABET, GLYPH_HEIGHT, GLYPH_WIDTH, glyph

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Tile:
    top: int
    left: int
    height: int
    width: int
    caption: str  # "" when the tile has none


def _runs(flags: Array) -> list[tuple[int, int]]:
    """The (start, end exclusive) of each run of True in a 1-D bool array."""
    padded = np.concatenate([[False], flags, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def read_text(band: Array) -> str:
    """The text drawn in ``band`` (H x W bool, True: ink) from its left edge, at the scale
    its ink's height tells; a cell that matches no glyph reads as ``\\ufffd``."""
    rows = np.flatnonzero(band.any(axis=1))
    if len(rows) == 0:
        return ""
    top, height = int(rows[0]), int(rows[-1]) - int(rows[0]) + 1
    scale, rest = divmod(height, GLYPH_HEIGHT)
    assert rest == 0, f"ink {height} px high is no whole scale of the font"
    assert scale >= 1, f"ink {height} px high is less than the font's"
    text = band[top : top + height]
    glyphs = {char: glyph(char) for char in ALPHABET}
    advance = (GLYPH_WIDTH + 1) * scale
    chars = []
    for left in range(0, text.shape[1] - GLYPH_WIDTH * scale + 1, advance):
        cell = text[:, left : left + GLYPH_WIDTH * scale][::scale, ::scale]
        chars.append(next((c for c, g in glyphs.items() if np.array_equal(g, cell)), "\ufffd"))
    return "".join(chars).rstrip()


def tiles(sheet: Array) -> list[Tile]:
    """The tiles of ``sheet`` (H x W x 3), left to right, top to bottom, each with the
    caption read under it (between its bottom and the next row's top)."""
    ink = (sheet != SHEET_BACKGROUND).any(axis=2)
    columns = _runs(ink.any(axis=0))
    row_runs = _runs(ink.any(axis=1))
    height = max(b - a for a, b in row_runs)
    images = [(a, b) for a, b in row_runs if b - a == height]  # the rest are captions
    found = []
    for i, (top, bottom) in enumerate(images):
        below = images[i + 1][0] if i + 1 < len(images) else sheet.shape[0]
        for left, right in columns:
            if not ink[top:bottom, left:right].any():
                continue  # an empty cell of the last row
            caption = read_text(ink[bottom:below, left:right])
            found.append(Tile(top, left, bottom - top, right - left, caption))
    return found
