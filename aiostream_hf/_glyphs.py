"""A 5 x 7 bitmap font and text drawn with it into numpy images: the captions of a
contact sheet (``_demo.contact_sheet``), without Pillow or a font file.

Each glyph is 7 rows of 5 pixels, written as 7 hex bytes, one per row, the top row
first, bit 4 the leftmost pixel (``"0e11131519110e"`` is a zero). Text advances one
glyph plus one blank column per character; ``scale`` repeats every pixel ``scale``
times across and down. The alphabet is small on purpose: digits, lowercase letters,
space and ``. , : ; = + - _ / # ( ) % |``; any other character is refused, named.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["ALPHABET", "GLYPH_HEIGHT", "GLYPH_WIDTH", "draw_text", "glyph", "text_mask"]

GLYPH_WIDTH = 5
GLYPH_HEIGHT = 7
_ADVANCE = GLYPH_WIDTH + 1  # one blank column between characters

_ROWS = {
    " ": "00000000000000",
    "0": "0e11131519110e",
    "1": "040c040404040e",
    "2": "0e11010204081f",
    "3": "1f02040201110e",
    "4": "02060a121f0202",
    "5": "1f101e0101110e",
    "6": "0608101e11110e",
    "7": "1f010204080808",
    "8": "0e11110e11110e",
    "9": "0e11110f01020c",
    "a": "00000e010f110f",
    "b": "1010161911111e",
    "c": "00000e1010110e",
    "d": "01010d1311110f",
    "e": "00000e111f100e",
    "f": "0609081c080808",
    "g": "00000f110f010e",
    "h": "10101619111111",
    "i": "04000c0404040e",
    "j": "0200060202120c",
    "k": "10101214181412",
    "l": "0c04040404040e",
    "m": "00001a15151111",
    "n": "00001619111111",
    "o": "00000e1111110e",
    "p": "00001e111e1010",
    "q": "00000d130f0101",
    "r": "00001619101010",
    "s": "00000e100e011e",
    "t": "08081c08080906",
    "u": "0000111111130d",
    "v": "00001111110a04",
    "w": "0000111115150a",
    "x": "0000110a040a11",
    "y": "000011110f010e",
    "z": "00001f0204081f",
    ".": "00000000000c0c",
    ",": "000000000c0408",
    ":": "000c0c000c0c00",
    ";": "000c0c000c0408",
    "=": "00001f001f0000",
    "+": "0004041f040400",
    "-": "0000001f000000",
    "_": "0000000000001f",
    "/": "00010204081000",
    "#": "0a0a1f0a1f0a0a",
    "(": "02040808080402",
    ")": "08040202020408",
    "%": "18190204081303",
    "|": "04040404040404",
}

#: The characters the font draws.
ALPHABET = "".join(sorted(_ROWS))


def _bitmap(rows: str) -> npt.NDArray[np.bool_]:
    values = bytes.fromhex(rows)
    assert len(values) == GLYPH_HEIGHT, rows
    bits = [[bool(v >> (GLYPH_WIDTH - 1 - x) & 1) for x in range(GLYPH_WIDTH)] for v in values]
    return np.array(bits, dtype=bool)


_GLYPHS = {char: _bitmap(rows) for char, rows in _ROWS.items()}


def glyph(char: str) -> npt.NDArray[np.bool_]:
    """The 7 x 5 pixels of ``char`` (True: ink), a copy."""
    bitmap = _GLYPHS.get(char)
    if bitmap is None:
        raise ValueError(f"the caption font has no glyph for {char!r}: it draws {ALPHABET!r}")
    copied: npt.NDArray[np.bool_] = bitmap.copy()
    return copied


def text_mask(text: str, scale: int = 1) -> npt.NDArray[np.bool_]:
    """The pixels of ``text``, ``7 * scale`` high and ``(6 * len(text) - 1) * scale`` wide
    (no blank column after the last character); True where there is ink."""
    if scale < 1:
        raise ValueError(f"text_mask(scale={scale!r}): the scale is a whole number >= 1")
    width = max(0, _ADVANCE * len(text) - 1)
    mask = np.zeros((GLYPH_HEIGHT, width), dtype=bool)
    for i, char in enumerate(text):
        mask[:, i * _ADVANCE : i * _ADVANCE + GLYPH_WIDTH] = glyph(char)
    big: npt.NDArray[np.bool_] = mask.repeat(scale, axis=0).repeat(scale, axis=1)
    return big


def draw_text(
    image: npt.NDArray[np.uint8],
    text: str,
    top: int,
    left: int,
    *,
    scale: int = 1,
    color: Sequence[int] = (255, 255, 255),
) -> None:
    """Draw ``text`` into the H x W x 3 ``image`` in place, its top left corner at
    (``top``, ``left``), in ``color``; what falls outside the image is cut off."""
    mask = text_mask(text, scale)
    height, width = image.shape[:2]
    bottom, right = min(height, top + mask.shape[0]), min(width, left + mask.shape[1])
    if bottom <= max(top, 0) or right <= max(left, 0):
        return
    cut = mask[max(0, -top) : bottom - top, max(0, -left) : right - left]
    region = image[max(top, 0) : bottom, max(left, 0) : right]
    region[cut] = np.asarray(color, dtype=np.uint8)
