"""What a Parquet/TAR ``Stream``'s saved state may hold: every field checked before any
is used, so a tampered or foreign state is a ``SourceError`` naming the field, never an
IndexError or a lost sample later."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._engine import as_rng_state, state_int
from ._exceptions import SourceError
from ._models import FileRef
from .formats import Unit

__all__ = ["check_cursor", "check_unit"]


def check_cursor(state: Mapping[str, Any], shuffle_buffer: int) -> None:
    """Every field of a Parquet/TAR stream's state, checked before any is used: a
    tampered state is a ``SourceError`` naming the field, never an IndexError later."""
    state_int(state, "samples", optional=True)
    files = state_int(state, "files", optional=True)
    cursor = state.get("cursor")
    if cursor is not None:
        if not isinstance(cursor, Mapping):
            raise SourceError(f"state['cursor'] is {cursor!r}, not a mapping or None")
        where = "state['cursor']"
        for key in ("file", "unit", "row", "file_seq"):
            state_int(cursor, key, where=where)
        for key in ("offset", "skip"):
            state_int(cursor, key, where=where, optional=True)
        if not isinstance(cursor.get("done"), bool):
            raise SourceError(f"{where}['done'] is {cursor.get('done')!r}, not True or False")
        if files is not None and cursor["file"] > files:
            raise SourceError(
                f"{where}['file'] is {cursor['file']}, past the {files} files the state was "
                "saved over: load a state_dict() of this stream, unchanged"
            )
        if files is not None and cursor["file"] == files and (cursor["unit"] or cursor["row"]):
            raise SourceError(
                f"{where} is at the end of the {files} files but its 'unit' or 'row' is not "
                "0: load a state_dict() of this stream, unchanged"
            )
        if files is None:
            raise SourceError(
                "state['files'] is None but state['cursor'] is set: a stream saves the files "
                "it read with its cursor; load a state_dict() of this stream, unchanged"
            )
    buffer = state.get("buffer")
    if buffer is not None and not isinstance(buffer, list):
        raise SourceError(f"state['buffer'] is a {type(buffer).__name__}, not a list")
    if buffer and len(buffer) > shuffle_buffer:
        raise SourceError(
            f"state['buffer'] holds {len(buffer)} samples, more than this stream's shuffle "
            f"buffer ({shuffle_buffer}; none without shuffle=, or with batch_size= or "
            "output='arrow'): resume with the same arguments"
        )
    if buffer:
        _check_buffer(buffer)
        if state.get("rng") is None:
            raise SourceError(
                "state['rng'] is None but state['buffer'] holds samples: load a state_dict() "
                "of this stream, unchanged"
            )
    if state.get("rng") is not None:
        as_rng_state(state["rng"])


def _check_buffer(buffer: list[Any]) -> None:
    """The shuffle buffer's samples: dicts of names (columns, or a TAR sample's keys,
    which may differ from sample to sample)."""
    for i, row in enumerate(buffer):
        if not isinstance(row, dict) or not all(isinstance(k, str) for k in row):
            raise SourceError(
                f"state['buffer'][{i}] is {_short(row)}, not a sample (a dict of column "
                "names): load a state_dict() of this stream, unchanged"
            )


def check_unit(cursor: Mapping[str, Any], file: FileRef, units: Sequence[Unit]) -> None:
    """A resumed file's cursor against its plan: the unit it names is one of its units."""
    last = max((u.index for u in units), default=0)
    if cursor["unit"] > last:
        raise SourceError(
            f"state['cursor']['unit'] is {cursor['unit']}, past the last unit ({last}) of "
            f"{file.url}: the state is of another stream or was changed; load a "
            "state_dict() of this stream, unchanged"
        )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
