"""The demo's contact sheet: captions drawn with the built-in 5 x 7 font (no Pillow),
under each tile, and read back from the PNG the demo writes. The demo's run itself is
tested in tests/test_cli.py (``test_demo_quick``), which reads its sheet the same way."""

from __future__ import annotations

from typing import Any

import av
import numpy as np
import pytest
from contact_sheets import read_text, tiles

from aiostream_hf._demo import (
    CAPTION_INK,
    SHEET_BACKGROUND,
    caption_scale,
    contact_sheet,
    item_captions,
    png_bytes,
)
from aiostream_hf._glyphs import ALPHABET, GLYPH_HEIGHT, draw_text, glyph, text_mask

Array = np.ndarray[Any, Any]


def _bits(*rows: str) -> Array:
    return np.array([[c == "#" for c in row] for row in rows], dtype=bool)


def test_the_font_draws_what_it_says() -> None:
    """A few glyphs against their pixels written out by hand."""
    assert np.array_equal(
        glyph("1"),
        _bits("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    )
    assert np.array_equal(
        glyph("t"),
        _bits(".#...", ".#...", "###..", ".#...", ".#...", ".#..#", "..##."),
    )
    assert np.array_equal(
        glyph("="),
        _bits(".....", ".....", "#####", ".....", "#####", ".....", "....."),
    )
    assert not glyph(" ").any()
    # Every glyph but the space has ink, and no two are alike (a caption reads one way).
    shapes = {glyph(c).tobytes() for c in ALPHABET}
    assert len(shapes) == len(ALPHABET)
    assert all(glyph(c).any() for c in ALPHABET if c != " ")


def test_text_is_its_glyphs_side_by_side_scaled() -> None:
    text, scale = "ep 3 t=1.20 s", 2
    mask = text_mask(text, scale)
    assert mask.shape == (GLYPH_HEIGHT * scale, (6 * len(text) - 1) * scale)
    for i, char in enumerate(text):
        left = 6 * scale * i
        cell = mask[:, left : left + 5 * scale]
        assert np.array_equal(cell, np.kron(glyph(char), np.ones((scale, scale), dtype=bool)))
        assert not mask[:, left + 5 * scale : left + 6 * scale].any()  # the blank column
    assert read_text(mask) == text


def test_a_character_the_font_lacks_is_named() -> None:
    with pytest.raises(ValueError, match="no glyph for 'É'"):
        text_mask("É")


def test_draw_text_cuts_what_falls_outside() -> None:
    image = np.zeros((10, 12, 3), np.uint8)
    draw_text(image, "88", 5, 3, color=(200, 0, 0))
    expected = np.zeros((10, 12), dtype=bool)
    expected[5:, 3:] = text_mask("88")[:5, :9]
    assert np.array_equal(image[..., 0] == 200, expected)
    assert not image[..., 1:].any()
    draw_text(image, "8", 20, 20)  # wholly outside: nothing, no error
    assert np.array_equal(image[..., 0] == 200, expected)


def _frames(count: int, height: int = 30, width: int = 90) -> Array:
    """Frames with no pixel of the sheet's background colour: each a flat level of its own."""
    levels = [60 + 40 * i for i in range(count)]
    assert SHEET_BACKGROUND not in levels
    return np.stack([np.full((height, width, 3), level, np.uint8) for level in levels])


def _decode_png(data: bytes, tmp_path: Any) -> Array:
    path = tmp_path / "sheet.png"
    path.write_bytes(data)
    with av.open(str(path)) as container:
        image: Array = next(container.decode(video=0)).to_ndarray(format="rgb24")
    return image


def test_each_tile_has_its_caption_under_it(tmp_path: Any) -> None:
    frames = _frames(5)
    captions = [f"ep {i} t={i / 10:.2f} s" for i in range(5)]
    assert caption_scale(captions, 90) == 1  # at twice its size, 13 characters need 154 px
    sheet = _decode_png(png_bytes(contact_sheet(frames, columns=3, captions=captions)), tmp_path)
    pad, band = 4, GLYPH_HEIGHT + 4
    assert sheet.shape == (2 * (30 + band) + 3 * pad, 3 * 90 + 4 * pad, 3)
    found = tiles(sheet)
    assert [t.caption for t in found] == captions
    for i, tile in enumerate(found):
        r, c = divmod(i, 3)
        assert (tile.top, tile.left) == (pad + r * (30 + band + pad), pad + c * (90 + pad))
        image = sheet[tile.top : tile.top + 30, tile.left : tile.left + 90]
        assert np.array_equal(image, frames[i])  # the caption is below the frame, not on it
        under = sheet[tile.top + 30 + pad : tile.top + 30 + band, tile.left : tile.left + 90]
        ink = (under == CAPTION_INK).all(axis=2)
        expected = np.zeros_like(ink)
        mask = text_mask(captions[i])
        expected[:, : mask.shape[1]] = mask
        assert np.array_equal(ink, expected)
        assert ((under == CAPTION_INK).all(axis=2) | (under == SHEET_BACKGROUND).all(axis=2)).all()
    # Tiles of different captions differ in their bands where the text does, only there.
    first, second = (sheet[t.top + 30 : t.top + 30 + band, t.left : t.left + 90] for t in found[:2])
    differ = {int(col) // 6 for col in np.flatnonzero((first != second).any(axis=(0, 2)))}
    assert differ == {i for i, (a, b) in enumerate(zip(*captions[:2], strict=True)) if a != b}


def test_captions_are_drawn_large_when_they_fit() -> None:
    captions = ["item 350 ep 3 t=2.97 s pad", "item 350 ep 3 t=3.07 s"]
    assert caption_scale(captions, 320) == 2
    sheet = contact_sheet(_frames(2, 24, 320), captions=captions)
    found = tiles(sheet)
    assert [t.caption for t in found] == captions
    assert sheet.shape[0] == 24 + 2 * GLYPH_HEIGHT + 3 * 4  # the band holds the text, twice


def test_a_caption_wider_than_its_tile_stops_at_its_edge() -> None:
    sheet = contact_sheet(_frames(2, 20, 40), captions=["item 123456789", "7"])
    gap = sheet[:, 4 + 40 : 4 + 40 + 4]  # between the two tiles
    assert (gap == SHEET_BACKGROUND).all()
    assert [t.caption for t in tiles(sheet)] == ["item 1", "7"]  # the whole glyphs that fit


def test_no_captions_no_band() -> None:
    sheet = contact_sheet(_frames(3, 30, 90))
    assert sheet.shape == (30 + 2 * 4, 3 * 90 + 4 * 4, 3)
    assert [t.caption for t in tiles(sheet)] == ["", "", ""]


def test_one_caption_per_frame() -> None:
    with pytest.raises(ValueError, match="2 captions for 3 frames"):
        contact_sheet(_frames(3), captions=["a", "b"])


def test_an_items_captions_name_it_and_each_frames_time() -> None:
    key = "observation.images.top"
    item = {"index": 52, "episode_index": 1, "timestamp": np.float32(7 / 30)}
    item[f"{key}_is_pad"] = np.array([False, False])
    assert item_captions(item, key) == ["item 52 ep 1 t=0.13 s", "item 52 ep 1 t=0.23 s"]
    first = {"index": 0, "episode_index": 0, "timestamp": np.float32(0.0)}
    first[f"{key}_is_pad"] = np.array([True, False])
    assert item_captions(first, key) == ["item 0 ep 0 t=-0.10 s pad", "item 0 ep 0 t=0.00 s"]
    # A time that rounds to zero from below is "0.00", never "-0.00".
    third = {"index": 3, "episode_index": 0, "timestamp": 0.1 - 1e-9}
    assert item_captions(third, key)[0] == "item 3 ep 0 t=0.00 s"
