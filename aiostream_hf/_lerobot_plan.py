"""The plan of a LeRobot stream: the selected episodes and LeRobot's rules (split,
``delta_timestamps``), batches of items as jobs, and positions in its order (checkpoints,
the saved cursor, the fingerprint of the dataset a state refers to)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from ._engine import as_rng_state
from ._exceptions import DecodeError, SourceError, SplitNotFoundError
from ._lerobot_items import _assemble
from ._lerobot_meta import _INFO, EpisodeInfo, LeRobotMetadata
from ._lerobot_readers import _ReaderPool
from ._lerobot_rows import _Row
from ._prefetch import Job

ImageFormat: TypeAlias = Literal["uint8", "float32"]
_SPLIT_RANGE = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")
_MAX_FRAME_SIDE = 1 << 16
"""The largest size of a camera's frame along one axis of its ``shape`` (codecs stop at
8K to 64K pixels); a frame has at most 4 axes."""


def _frame_values(shape: object, where: str, key: str) -> int:
    """The values of one frame of camera ``key``: the product of its ``shape`` in
    ``meta/info.json`` (480 x 640 x 3 when it gives none), whose sizes must be whole
    numbers from 1 to ``_MAX_FRAME_SIDE`` (a JSON 1e400 is infinity), else a DecodeError."""
    if shape is None:
        return 480 * 640 * 3
    sizes = shape if isinstance(shape, list) and 0 < len(shape) <= 4 else None
    if sizes is None or not all(
        not isinstance(v, bool)
        and isinstance(v, (int, float))
        and 1 <= v <= _MAX_FRAME_SIDE
        and float(v).is_integer()
        for v in sizes
    ):
        raise DecodeError(
            f"{where}: features[{key!r}].shape={shape!r} is not a frame shape (1 to 4 whole "
            f"numbers from 1 to {_MAX_FRAME_SIDE:,}, like [480, 640, 3]): fix it in {_INFO}"
        )
    return math.prod(int(v) for v in sizes)


# -- the plan: selection and the rules --------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """What to read and how: selected episodes, data columns, LeRobot's delta indices."""

    meta: LeRobotMetadata
    episodes: tuple[EpisodeInfo, ...]
    columns: tuple[str, ...]
    delta_indices: Mapping[str, npt.NDArray[np.int64]] | None
    tolerance_s: float
    image_format: ImageFormat
    frame_bytes: Mapping[str, int]  # estimated bytes of one frame per camera, as delivered

    @classmethod
    def build(
        cls,
        meta: LeRobotMetadata,
        *,
        deltas: Mapping[str, tuple[float, ...]] | None,
        tolerance_s: float,
        episodes: Sequence[int] | None,
        split: str | None,
        image_format: ImageFormat,
    ) -> _Plan:
        label = meta.source
        selected = list(meta.episodes)
        if split is not None:
            splits = meta.info.get("splits") or {}
            if split in splits:
                match = _SPLIT_RANGE.match(str(splits[split]))
                if match is None:
                    raise DecodeError(
                        f"{label} {_INFO}: split {split!r} is {splits[split]!r}, not 'start:end'"
                    )
                lo, hi = int(match.group(1)), int(match.group(2))
                selected = [e for e in selected if lo <= e.index < hi]
            elif splits or split != "train":
                names = ", ".join(sorted(splits)) or "train (every episode)"
                raise SplitNotFoundError(f"no split {split!r} in {label}: splits are {names}")
        if episodes is not None:
            by_index = {e.index: e for e in selected}
            missing = [e for e in episodes if e not in by_index]
            if missing:
                within = f" of split {split!r}" if split is not None else ""
                raise SourceError(
                    f"episodes {missing} are not episodes{within} of {label}: it has "
                    f"{_describe_indices(sorted(by_index))}"
                )
            wanted = set(episodes)
            selected = [e for e in selected if e.index in wanted]
        delta_indices: dict[str, npt.NDArray[np.int64]] | None = None
        if deltas is not None:
            unknown = [k for k in deltas if k not in meta.features]
            if unknown:
                raise SourceError(
                    f"delta_timestamps keys {unknown} are not features of {label}: features "
                    f"are {', '.join(meta.features)}"
                )
            fps = meta.fps
            off = {
                k: [d for d in v if abs(d * fps - round(d * fps)) / fps > tolerance_s]
                for k, v in deltas.items()
            }
            off = {k: v for k, v in off.items() if v}
            if off:
                raise SourceError(
                    f"delta_timestamps {off} are not multiples of 1/{fps:g} s within "
                    f"tolerance_s={tolerance_s} (LeRobot's check_delta_timestamps)"
                )
            delta_indices = {
                k: np.array([round(d * fps) for d in v], dtype=np.int64) for k, v in deltas.items()
            }
        frame_bytes = {}
        for key in meta.video_keys:
            n = _frame_values(meta.features[key].get("shape"), f"{label} {_INFO}", key)
            frame_bytes[key] = n * (4 if image_format == "float32" else 1)
        return cls(
            meta=meta,
            episodes=tuple(selected),
            columns=meta.data_keys,
            delta_indices=delta_indices,
            tolerance_s=tolerance_s,
            image_format=image_format,
            frame_bytes=frame_bytes,
        )

    def job(self, rows: list[_Row], pool: _ReaderPool) -> Job[list[dict[str, Any]]]:
        """A batch of items, assembled when the job runs; its cost is its frames' bytes."""
        windows = {k: len(v) for k, v in (self.delta_indices or {}).items()}
        cost = len(rows) * sum(n * windows.get(k, 1) for k, n in self.frame_bytes.items())
        batch = list(rows)

        async def run() -> list[dict[str, Any]]:
            return await _assemble(self, batch, pool)

        return Job(max(cost, 1), run)


def _describe_indices(indices: Sequence[int]) -> str:
    if not indices:
        return "no episodes"
    if indices == list(range(indices[0], indices[-1] + 1)):
        return f"episodes {indices[0]}-{indices[-1]}"
    shown = ", ".join(map(str, indices[:20]))
    return f"episodes {shown}" + (", ..." if len(indices) > 20 else "")


# -- positions in the plan -------------------------------------------------------------


@dataclass(frozen=True)
class _Checkpoint:
    """Where the producer of items stands: the next frame to consider (data file group,
    episode, frame, in this rank's order), the items of the sequence before it, and
    the shuffle buffer with its RNG state."""

    group: int
    episode: int
    frame: int
    seq: int
    buffer: tuple[_Row, ...] = ()
    rng: tuple[Any, ...] | None = None

    def to_state(self, skip: int) -> dict[str, Any]:
        return {
            "group": self.group,
            "episode": self.episode,
            "frame": self.frame,
            "seq": self.seq,
            "skip": skip,
            "buffer": [[row.episode.info.index, row.pos] for row in self.buffer],
            "rng": self.rng,
        }


@dataclass(frozen=True)
class _Batch:
    """Assembled items, the checkpoint before them (``first`` items after it were dropped
    on a resume) and the one after them."""

    items: list[dict[str, Any]]
    start: _Checkpoint
    first: int
    end: _Checkpoint


def _following(
    order: Sequence[Sequence[EpisodeInfo]], g: int, e: int, f: int
) -> tuple[int, int, int]:
    """The position after frame ``f`` of episode ``e`` of group ``g`` (past empty episodes)."""
    f += 1
    while g < len(order):
        if e >= len(order[g]):
            g, e, f = g + 1, 0, 0
        elif f >= order[g][e].length:
            e, f = e + 1, 0
        else:
            return g, e, f
    return len(order), 0, 0


def _parse_cursor(
    cursor: Mapping[str, Any], order: Sequence[Sequence[EpisodeInfo]]
) -> tuple[int, int, int, int, int, list[tuple[int, int]], tuple[Any, ...] | None]:
    """A saved cursor, checked against this rank's order."""
    try:
        g, e, f, seq, skip = (int(cursor[k]) for k in ("group", "episode", "frame", "seq", "skip"))
        pending = [(int(ep), int(pos)) for ep, pos in cursor.get("buffer") or ()]
        saved_rng = cursor.get("rng")
        rng = None if saved_rng is None else as_rng_state(saved_rng)
    except (KeyError, TypeError, ValueError) as exc:
        raise SourceError(
            f"state's cursor is not a LeRobot stream's ({type(exc).__name__}: {exc}): load the "
            "state_dict() of a LeRobot stream"
        ) from exc
    inside = g < len(order) and 0 <= e < len(order[g]) and 0 <= f <= order[g][e].length
    if min(g, e, f, seq, skip) < 0 or not (inside or (g, e, f) == (len(order), 0, 0)):
        raise SourceError(
            f"state's cursor (data file group {g}, episode {e}, frame {f}) is not a position "
            "of this stream: resume with the same dataset and arguments"
        )
    return g, e, f, seq, skip, pending, rng


def _fingerprint(plan: _Plan) -> dict[str, Any]:
    """What a state's positions refer to: the episodes read, their rows and data files
    (the last two URL segments and the size), and the commit."""
    episodes = [
        [
            e.index,
            e.length,
            e.dataset_from_index,
            "/".join(e.data_file.url.rsplit("/", 2)[-2:]),
            e.data_file.size,
        ]
        for e in plan.episodes
    ]
    text = json.dumps([plan.meta.commit, episodes])
    return {
        "source": plan.meta.source,
        "commit": plan.meta.commit,
        "episodes": len(episodes),
        "frames": sum(e.length for e in plan.episodes),
        "digest": hashlib.sha256(text.encode()).hexdigest()[:16],
    }


def _check_dataset(mine: Mapping[str, Any], saved: Mapping[str, Any]) -> None:
    if saved.get("digest") == mine["digest"]:
        return

    def describe(fp: Mapping[str, Any]) -> str:
        at = f" at commit {fp.get('commit')}" if fp.get("commit") else ""
        return f"{fp.get('source')}{at} ({fp.get('episodes')} episodes, {fp.get('frames')} frames)"

    raise SourceError(
        f"state was saved over another dataset or selection: {describe(saved)}, but this "
        f"stream reads {describe(mine)}: resume with the same dataset, revision, split and "
        "episodes (pin the revision, hf://datasets/ORG/NAME@COMMIT, so that it cannot move)"
    )
