"""Elastic epochs: one order per (dataset, seed, epoch), shared by any number of consumers,
and states that merge into one job state which a job of any size loads.

    opts = ash.StreamOptions(elastic=True)
    # each consumer (rank x DataLoader worker) of a job of 2 x 2 saves its state ...
    job = ash.merge_states([s0, s1, s2, s3])
    # ... and every consumer of a job of 3 x 1 loads the same job state:
    s = ash.stream(src, options=opts, rank=r, world_size=3); s.load_state_dict(job)

The model:

- The epoch's **units** (a Parquet file's slices of ``slice_bytes``, each holding the row
  groups that start in it; a TAR shard; a LeRobot episode) are listed from what is known
  before any read (the manifest's sizes, the episode table), and put in one **global
  order**: a permutation by (seed, epoch) with ``shuffle``, else as listed. Rows within a
  unit are permuted by (seed, epoch, unit) too. Nothing of it depends on the layout.
- A **base** says what of the epoch is left: every unit before ``frontier`` is done, and
  so are those in ``done``; those in ``partial`` are under way at a position (within the
  unit: a row group and row, a TAR byte offset, a frame); ``buffer`` holds samples taken
  out of their units into shuffle buffers and not yet delivered. A fresh epoch's base is
  empty (frontier 0).
- The **remaining sequence** of a base is its partial units, then every unit from the
  frontier on that is neither done nor partial, in the global order. Consumer ``j`` of
  ``n`` takes the items ``j, j + n, j + 2n, ...`` of it (and the ``j``-th n-th of the
  buffer): shares are disjoint, and together they are all that is left.
- A consumer's state is its base, its place (``rank``/``world_size``), and its cursor in
  its share: the items before the cursor are done, the one at it is at a position. So a
  state is small: its size does not grow with the dataset (the base's ``done`` holds
  only units past the frontier, which the consumers' unequal progress leaves; its
  ``partial`` at most one unit per consumer; its ``buffer`` at most the shuffle buffers).
- ``merge_states`` turns the states of *all* consumers of a job (the same base, every
  rank of one ``world_size``) into the next base: the units each consumer finished are
  done, the unit each has under way is partial at its position, the buffers are joined.
  A job of any size loads it and goes on: a partial unit resumes at its position (no
  sample skipped over, no byte before it read), a done unit is not opened again.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard
from urllib.parse import urlsplit

from ._exceptions import SourceError
from ._models import FileRef

__all__ = [
    "INTERLEAVED",
    "JOB_KIND",
    "Base",
    "Progress",
    "StreamShare",
    "check_stream_state",
    "elastic_field",
    "job_to_consumer",
    "merge_job",
    "merge_states",
    "remaining",
    "share",
    "share_for",
    "start_of",
    "stream_units",
    "unit_order",
]

JOB_KIND = "job"
INTERLEAVED = "interleaved"  # the kind of a stream with StreamOptions(shuffle_units > 1)


@dataclass(frozen=True)
class Base:
    """What of an epoch is left: see the module docstring."""

    frontier: int = 0
    done: tuple[int, ...] = ()
    partial: tuple[tuple[int, Mapping[str, Any]], ...] = ()
    buffer: tuple[Any, ...] = field(default=(), compare=False)

    def to_state(self) -> dict[str, Any]:
        return {
            "frontier": self.frontier,
            "done": list(self.done),
            "partial": [[g, dict(pos)] for g, pos in self.partial],
            "buffer": list(self.buffer),
        }

    def key(self) -> str:
        """A short name of this base (without its buffer), the same in every process."""
        text = json.dumps(
            [self.frontier, list(self.done), [[g, dict(p)] for g, p in self.partial]],
            sort_keys=True,
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def from_state(cls, state: object, units: int, where: str) -> Base:
        """A base from a state's ``elastic['base']``, every field checked against ``units``."""
        if not isinstance(state, Mapping):
            raise SourceError(f"{where} is {_short(state)}, not a mapping: {_UNCHANGED}")
        frontier = state.get("frontier")
        if not _count(frontier) or frontier > units:
            raise SourceError(
                f"{where}['frontier'] is {_short(frontier)}, not a unit position from 0 to "
                f"{units}: {_UNCHANGED}"
            )
        done = state.get("done")
        if not isinstance(done, list) or not all(_count(g) and frontier < g < units for g in done):
            raise SourceError(
                f"{where}['done'] is {_short(done)}, not a list of unit positions past the "
                f"frontier and before {units}: {_UNCHANGED}"
            )
        partial = state.get("partial")
        pairs: list[tuple[int, Mapping[str, Any]]] = []
        if not isinstance(partial, list):
            raise SourceError(f"{where}['partial'] is {_short(partial)}, not a list: {_UNCHANGED}")
        for item in partial:
            ok = isinstance(item, (list, tuple)) and len(item) == 2
            if not ok or not _count(item[0]) or not isinstance(item[1], Mapping):
                raise SourceError(
                    f"{where}['partial'] holds {_short(item)}, not a [unit position, "
                    f"position in the unit] pair: {_UNCHANGED}"
                )
            g = item[0]
            if not frontier <= g < units or g in done:
                raise SourceError(
                    f"{where}['partial'] names unit {g}, which is done or not one of the "
                    f"{units} units: {_UNCHANGED}"
                )
            pairs.append((g, dict(item[1])))
        if len({g for g, _ in pairs}) < len(pairs):
            raise SourceError(f"{where}['partial'] names a unit twice: {_UNCHANGED}")
        buffer = state.get("buffer", [])
        if not isinstance(buffer, list):
            raise SourceError(f"{where}['buffer'] is {_short(buffer)}, not a list: {_UNCHANGED}")
        return cls(frontier, tuple(sorted(set(done))), tuple(sorted(pairs)), tuple(buffer))


Item = tuple[int, Mapping[str, Any] | None]  # (global position, where to start in it)


def remaining(base: Base, units: int) -> list[Item]:
    """The remaining sequence of ``base``: its partial units, then the units from the
    frontier on that are neither done nor partial."""
    skip = set(base.done) | {g for g, _ in base.partial}
    head: list[Item] = [(g, pos) for g, pos in base.partial]
    return head + [(g, None) for g in range(base.frontier, units) if g not in skip]


def share(base: Base, units: int, consumer: int, consumers: int) -> list[Item]:
    """Consumer ``consumer`` of ``consumers``: every ``consumers``-th item of what is left."""
    return remaining(base, units)[consumer::consumers]


def unit_order(count: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The global order of an epoch's ``count`` units: global position -> unit number."""
    order = list(range(count))
    if shuffle:
        random.Random(f"{seed}:{epoch}:elastic-units").shuffle(order)
    return order


def stream_units(
    files: Sequence[FileRef], *, slice_bytes: int, sliced: bool
) -> list[tuple[int, int, int]]:
    """The units of a stream's files, in manifest order: (file number, slice, slices). A
    file of known size is cut into slices of ``slice_bytes`` when ``sliced`` (Parquet);
    else (TAR, unknown size) it is one unit."""
    out: list[tuple[int, int, int]] = []
    for i, f in enumerate(files):
        n = 1
        if sliced and f.size is not None and f.size > slice_bytes:
            n = -(-f.size // slice_bytes)
        out += [(i, s, n) for s in range(n)]
    return out


def dataset_digest(identity: object) -> str:
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- a Parquet/TAR stream's share ------------------------------------------------------


@dataclass(frozen=True)
class StreamShare:
    """One consumer's share of a Parquet/TAR stream's epoch: the files of its items in
    order (a file once per slice of it), where each item starts, and each item's slice."""

    files: list[FileRef]
    starts: dict[int, Mapping[str, Any]]
    slices: list[tuple[int, int, int]]  # (slice, slices, slice_bytes) of each item
    elastic: dict[str, Any]  # the state's "elastic" field
    seed: str  # the shuffle buffer's seed: differs per consumer and per base

    def keeps(self, pos: int, unit: Any) -> bool:
        """Whether ``unit`` (a planned unit of item ``pos``'s file) lies in its slice: a
        Parquet row group belongs to the slice its first byte read lies in."""
        s, n, size = self.slices[pos]
        if n == 1:
            return True
        ranges = getattr(getattr(unit, "plan", None), "ranges", None)
        start = ranges[0][0] if ranges else 0
        return min(start // size, n - 1) == s

    def start(self, pos: int, cursor: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """Where item ``pos`` starts: the consumer's cursor when it is in that item and
        has taken from it, else the position the base gives the item (None: its start)."""
        if cursor is not None and cursor["file"] == pos and (cursor["row"] or cursor["done"]):
            return cursor
        return self.starts.get(pos)


def stream_share(
    files: Sequence[FileRef],
    *,
    stream: str,
    base: Base | None,
    seed: int,
    epoch: int,
    shuffle: bool,
    slice_bytes: int,
    sliced: bool,
    consumer: int,
    consumers: int,
) -> StreamShare:
    """The share of consumer ``consumer`` of ``consumers`` of a stream over ``files``
    (the manifest's, in its order), from ``base`` (None: the epoch's start)."""
    units = stream_units(files, slice_bytes=slice_bytes, sliced=sliced)
    dataset = dataset_digest(
        [[urlsplit(f.url).path, f.size] for f in files] + [slice_bytes if sliced else None]
    )
    if base is None:
        base = Base()
    order = unit_order(len(units), seed=seed, epoch=epoch, shuffle=shuffle)
    mine = share(base, len(units), consumer, consumers)
    out_files: list[FileRef] = []
    starts: dict[int, Mapping[str, Any]] = {}
    slices: list[tuple[int, int, int]] = []
    for pos, (g, start) in enumerate(mine):
        f, s, n = units[order[g]]
        out_files.append(files[f])
        slices.append((s, n, slice_bytes))
        if start is not None:
            starts[pos] = start
    elastic = {"stream": stream, "dataset": dataset, "units": len(units), "base": base.to_state()}
    return StreamShare(
        out_files, starts, slices, elastic, f"{seed}:{epoch}:samples:{base.key()}:{consumer}"
    )


def stream_progress(state: Mapping[str, Any]) -> Progress:
    """A Parquet/TAR consumer state's place in its share (checked by ``check_cursor``)."""
    cursor, files = state.get("cursor"), state.get("files") or 0
    buffer = list(state.get("buffer") or [])
    samples = int(state.get("samples") or 0)
    if cursor is None:
        return Progress(0, None, buffer, samples)
    i = cursor["file"]
    if i >= files:
        return Progress(files, None, buffer, samples)
    if "offset" in cursor and cursor["done"]:  # a TAR shard's last sample: the shard is done
        return Progress(i + 1, None, buffer, samples)
    if cursor["row"] or cursor["done"]:
        keys = ("unit", "row", "done", "offset", "skip")
        return Progress(i, {k: cursor[k] for k in keys if k in cursor}, buffer, samples)
    return Progress(i, None, buffer, samples)


def lerobot_progress(state: Mapping[str, Any]) -> Progress:
    """A LeRobot consumer state's place in its share (its cursor is settled: skip 0)."""
    cursor = state.get("cursor")
    items = state.get("items") or 0
    if cursor is None:
        return Progress(0, None, [], items)
    if not isinstance(cursor, Mapping) or cursor.get("skip") or cursor.get("episode"):
        raise SourceError(
            f"state['cursor'] is {cursor!r}, not a settled cursor of an elastic LeRobot "
            "stream: load the states the streams saved, unchanged"
        )
    g, f = cursor.get("group"), cursor.get("frame")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (g, f)):
        raise SourceError(f"state['cursor'] is {cursor!r}: load the states the streams saved")
    assert isinstance(g, int)
    assert isinstance(f, int)
    buffer = [list(x) for x in cursor.get("buffer") or ()]
    return Progress(g, {"frame": f} if f else None, buffer, int(items))


def share_length(base: Base, units: int, consumer: int, consumers: int) -> int:
    """The items of a consumer's share, counted without listing them."""
    left = units - base.frontier - len(base.done)  # the partial ones are among them
    return max(0, -(-(left - consumer) // consumers))


# -- merging ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """What one consumer's state says: the items of its share it finished, the position
    in the next one (None: not started), its buffered samples and samples delivered."""

    finished: int
    position: Mapping[str, Any] | None
    buffer: list[Any]
    samples: int


def merge_job(
    states: Sequence[Mapping[str, Any]],
    progress: Callable[[Mapping[str, Any]], Progress],
    what: str,
) -> dict[str, Any]:
    """The job state of ``states``: one per consumer of a job, each an elastic state of
    one kind. ``progress`` reads a consumer's place in its share."""
    if not states:
        raise SourceError("merge_states([]): give the state of every consumer of the job")
    first = states[0]
    # A consumer that has not planned yet (never iterated, its source not resolved) has
    # no 'elastic' field; it is at the start of its share.
    planned = [i for i, s in enumerate(states) if not _unplanned(s)]
    elastic = _elastic_of(states[planned[0]], planned[0]) if planned else None
    world = first.get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise SourceError(f"states[0]['world_size'] is {_short(world)}, not a count >= 1")
    ranks: dict[int, int] = {}
    for i, s in enumerate(states):
        mine = elastic if _unplanned(s) else _elastic_of(s, i)
        for key in ("version", "kind", "epoch", "seed", "world_size"):
            if s.get(key) != first.get(key):
                raise SourceError(
                    f"states[{i}][{key!r}] is {_short(s.get(key))} but states[0]'s is "
                    f"{_short(first.get(key))}: merge the states of one job, taken at one "
                    "step (every consumer of the same stream, epoch and layout)"
                )
        for key in ("stream", "dataset", "units", "base"):
            if mine is not None and elastic is not None and mine.get(key) != elastic.get(key):
                raise SourceError(
                    f"states[{i}]['elastic'][{key!r}] differs from states[0]'s: the states are "
                    f"of different {what} (or of jobs resumed from different states); merge "
                    "the states of one job"
                )
        rank = s.get("rank")
        if rank in ranks:
            raise SourceError(
                f"states[{ranks[rank]}] and states[{i}] are both of consumer {rank}: give each "
                "consumer's state once"
            )
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise SourceError(f"states[{i}]['rank'] is {_short(rank)}, not a consumer number")
        ranks[rank] = i
    missing = sorted(set(range(world)) - set(ranks))
    if missing or len(ranks) != world:
        raise SourceError(
            f"the states are of consumers {sorted(ranks)} of a job of {world}: consumers "
            f"{missing} are missing, and their samples would be lost or read twice; give the "
            "state of every consumer (rank x DataLoader worker), taken at the same step"
        )
    if elastic is None:  # no consumer has begun: the job is at the epoch's start
        return {
            "version": first.get("version"),
            "kind": JOB_KIND,
            "of": first.get("kind"),
            "epoch": first.get("epoch"),
            "seed": first.get("seed"),
            "samples": 0,
            "elastic": None,
        }
    units = elastic["units"]
    if not _count(units):
        raise SourceError(f"states[0]['elastic']['units'] is {_short(units)}: {_UNCHANGED}")
    base = Base.from_state(elastic["base"], units, "states[0]['elastic']['base']")
    left = remaining(base, units)
    done = set(base.done)
    partial = dict(base.partial)
    buffer: list[Any] = []
    samples = 0
    for rank in range(world):
        i = ranks[rank]
        p = progress(states[i])
        items = left[rank::world]
        if p.finished > len(items) or (p.finished == len(items) and p.position is not None):
            raise SourceError(
                f"states[{i}]'s cursor is past the {len(items)} units of its share: {_UNCHANGED}"
            )
        for g, _ in items[: p.finished]:
            done.add(g)
            partial.pop(g, None)
        if p.position is not None:
            partial[items[p.finished][0]] = dict(p.position)
        buffer += p.buffer
        samples += p.samples
    frontier = base.frontier
    while frontier in done:
        done.discard(frontier)
        frontier += 1
    merged = Base(
        frontier,
        tuple(sorted(g for g in done if g > frontier)),
        tuple(sorted(partial.items())),
        tuple(buffer),
    )
    return {
        "version": first.get("version"),
        "kind": JOB_KIND,
        "of": first.get("kind"),
        "epoch": first.get("epoch"),
        "seed": first.get("seed"),
        "samples": samples,
        "elastic": {**elastic, "base": merged.to_state()},
    }


def consumer_state(
    job: Mapping[str, Any], kind: str | None, same: Mapping[str, Any]
) -> tuple[Base, dict[str, Any]]:
    """A job state checked for a stream (``same``: name -> this stream's value): its base
    and its ``elastic`` field."""
    if job.get("of") != kind:
        raise SourceError(
            f"the job state is of {_short(job.get('of'))} streams, not of this one's kind "
            f"({kind!r}): load it into the kind of stream that saved it"
        )
    for key, mine in same.items():
        if job.get(key) != mine:
            raise SourceError(
                f"the job state was saved with {key}={job.get(key)!r} but this stream has "
                f"{key}={mine!r}: resume with the same arguments"
            )
    elastic = job.get("elastic")
    if elastic is not None and not isinstance(elastic, Mapping):
        raise SourceError(f"state['elastic'] is {_short(elastic)}: {_UNCHANGED}")
    if not isinstance(elastic, Mapping) or "units" not in elastic:  # checked kind and args only
        return Base(), {}
    units = elastic.get("units")
    if not _count(units):
        raise SourceError(f"state['elastic']['units'] is {_short(units)}: {_UNCHANGED}")
    base = Base.from_state(elastic.get("base"), units, "state['elastic']['base']")
    return base, dict(elastic)


def check_elastic(
    state: Mapping[str, Any], stream: str, consumer: int, consumers: int
) -> tuple[Base, int]:
    """A consumer state's ``elastic`` field: the same stream; its base and unit count."""
    elastic = _elastic_of(state, None)
    if elastic.get("stream") != stream:
        raise SourceError(
            "state['elastic']['stream'] is not this stream's: the state is of another source, "
            "split, format, columns, filter, shuffle or slice_bytes; resume with the same "
            "arguments"
        )
    units = elastic.get("units")
    if not _count(units):
        raise SourceError(f"state['elastic']['units'] is {_short(units)}: {_UNCHANGED}")
    return Base.from_state(elastic.get("base"), units, "state['elastic']['base']"), units


def _unplanned(state: Mapping[str, Any]) -> bool:
    """A state without an 'elastic' field that is at its start: a consumer that had not
    planned its share when it was saved."""
    return (
        isinstance(state, Mapping)
        and state.get("elastic") is None
        and state.get("cursor") is None
        and not state.get("buffer")
    )


def _elastic_of(state: Mapping[str, Any], i: int | None) -> Mapping[str, Any]:
    where = "state" if i is None else f"states[{i}]"
    if not isinstance(state, Mapping):
        raise SourceError(f"{where} is a {type(state).__name__}, not a state_dict() (a dict)")
    elastic = state.get("elastic")
    if not isinstance(elastic, Mapping):
        raise SourceError(
            f"{where} has no 'elastic' field: it was saved by a stream without "
            "StreamOptions(elastic=True), whose order depends on its layout; only elastic "
            "streams' states merge and load into a job of another size"
        )
    return elastic


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_UNCHANGED = "load the states saved by the streams (or merge_states()), unchanged"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- the glue of a Parquet/TAR Stream ---------------------------------------------------


def share_for(stream: Any, manifest: Any, resume: Mapping[str, Any] | None) -> StreamShare:
    """The share of a ``Stream`` (elastic) over ``manifest``, from the loaded state's base
    if any; a state over other files is refused."""
    from .formats import SequentialDecoder, decoder_for

    files = list(manifest.files)
    decoder = decoder_for(files[0], stream._format) if files else None
    if isinstance(decoder, SequentialDecoder) and decoder.resampled:
        raise SourceError(
            "resampled=True draws shards at random, so an epoch has no order to share: "
            "drop StreamOptions(elastic=True), or resampled"
        )
    saved = resume.get("elastic") if resume is not None else None
    base = None
    if saved is not None:
        base = Base.from_state(saved["base"], saved["units"], "state['elastic']['base']")
    out = stream_share(
        files,
        stream=stream._identity(),
        base=base,
        seed=stream._seed,
        epoch=stream._epoch,
        shuffle=bool(stream._shuffle_buffer),
        slice_bytes=stream._options.slice_bytes,
        sliced=decoder is not None and decoder.name == "parquet",
        consumer=stream._rank,
        consumers=stream._world_size,
    )
    if saved is not None and (
        saved.get("dataset") != out.elastic["dataset"] or saved.get("units") != len_units(out)
    ):
        raise SourceError(
            f"state was saved over other files ({saved.get('units')} units, dataset "
            f"{saved.get('dataset')}) than this stream reads ({len_units(out)} units, dataset "
            f"{out.elastic['dataset']}): the dataset or slice_bytes changed; resume with the "
            "same files (pin the revision) and options, or start a new epoch"
        )
    if saved is not None:  # as loaded, so that it equals the base of the job's other states
        out.elastic["base"] = dict(saved["base"])
    return out


def len_units(share: StreamShare) -> int:
    return int(share.elastic["units"])


def elastic_field(stream: Any) -> dict[str, Any] | None:
    """A Stream's ``elastic`` state field: its share's, else (not yet planned) the one it
    will have, when its files are known (a ``Manifest`` source), else None."""
    if stream._elastic is not None:
        return dict(stream._elastic)
    manifest = stream._manifest or getattr(stream._source, "files", None) and stream._source
    if manifest is None:
        return None
    return share_for(stream, manifest, None).elastic


def check_stream_state(state: Mapping[str, Any], stream: Any) -> int:
    """A Parquet/TAR state's ``elastic`` field against ``stream``; returns the samples its
    buffer may hold beyond the shuffle buffer (its share of a merged job's buffers)."""
    saved = state.get("elastic")
    if not stream._options.elastic:
        if saved is not None:
            raise SourceError(
                "state was saved by a stream with StreamOptions(elastic=True): load it into "
                "one with the same options"
            )
        return 0
    if saved is None:
        if state.get("cursor") is None and not state.get("buffer"):
            return 0  # saved before the stream planned: at the start
        raise SourceError(
            "state has no 'elastic' field: it was saved by a stream without "
            "StreamOptions(elastic=True); resume with the options it was saved with"
        )
    base, _ = check_elastic(state, stream._identity(), stream._rank, stream._world_size)
    for g, position in base.partial:
        _check_position(g, position)
    buffered = state["elastic"]["base"].get("buffered") or len(base.buffer)
    if not _count(buffered):
        raise SourceError(f"state['elastic']['base']['buffered'] is {buffered!r}: {_UNCHANGED}")
    return -(-buffered // int(stream._world_size))


def _check_position(g: int, position: Mapping[str, Any]) -> None:
    """A Parquet/TAR unit's position in a base: (unit, row, done), and a TAR shard's
    offset or skip."""
    ok = all(_count(position.get(k)) for k in ("unit", "row"))
    ok = ok and isinstance(position.get("done"), bool)
    ok = ok and all(position.get(k) is None or _count(position.get(k)) for k in ("offset", "skip"))
    if not ok:
        raise SourceError(
            f"state['elastic']['base']['partial'] holds {_short(dict(position))} for unit "
            f"{g}, not a position of a Parquet or TAR unit: {_UNCHANGED}"
        )


def job_to_consumer(
    job: Mapping[str, Any], kind: str | None, stream: Any, version: int
) -> dict[str, Any]:
    """A job state (``merge_states``) as the state of ``stream``, one consumer of a job of
    any size: nothing of its share taken, its share of the job's buffered samples."""
    if not stream._options.elastic:
        raise SourceError(
            "a job state (merge_states) loads into streams with StreamOptions(elastic=True) "
            "only: set it, as the streams that saved the states had it"
        )
    rank, world = stream._rank, stream._world_size
    if job.get("elastic", 0) is None:  # merged before any consumer began
        consumer_state(job, kind, {"seed": stream._seed})  # the kind and seed
        return {
            "version": version,
            "epoch": job.get("epoch"),
            "seed": stream._seed,
            "rank": rank,
            "world_size": world,
            "files": None,
            "cursor": None,
            "buffer": [],
            "rng": None,
            "samples": 0,
        }
    base, elastic = consumer_state(job, kind, {"seed": stream._seed})
    if elastic.get("stream") != stream._identity():
        raise SourceError(
            "the job state is of another stream (source, split, format, columns, filter, "
            "batch_size, output or shuffle differ): resume with the same arguments"
        )
    buffer = list(base.buffer[rank::world])
    seed = f"{stream._seed}:{job.get('epoch')}:samples:{base.key()}:{rank}"
    # The consumer keeps its share of the job's buffered samples in its own 'buffer'; its
    # base names what is left without them (else every consumer's state held them all).
    # ('buffered': how many the job held, which bounds the consumer's buffer on a resume.)
    held = {"buffer": [], "buffered": len(base.buffer)}
    elastic = {**elastic, "base": {**base.to_state(), **held}}
    return {
        "version": version,
        "epoch": job.get("epoch"),
        "seed": stream._seed,
        "rank": rank,
        "world_size": world,
        "files": share_length(base, int(elastic["units"]), rank, world),
        "cursor": None,
        "buffer": buffer,
        "rng": random.Random(seed).getstate() if buffer else None,
        "samples": 0,
        "elastic": elastic,
    }


def start_of(
    share: StreamShare | None, pos: int, cursor: Mapping[str, Any] | None
) -> Mapping[str, Any] | None:
    """Where item (file) ``pos`` of a stream starts: see ``StreamShare.start``; without a
    share, the cursor when it is in that file."""
    if share is not None:
        return share.start(pos, cursor)
    return cursor if cursor is not None and cursor["file"] == pos else None


# -- merge_states ------------------------------------------------------------------------


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One job state from the states of every consumer of a job, taken at one step.

    ``states``: the ``state_dict()`` of each consumer (each rank's stream; each DataLoader
    worker's, see ``aiostream_hf.torch.dataset_states``) of streams made with
    ``StreamOptions(elastic=True)``: Parquet/TAR streams, LeRobot streams, or mixtures
    of them (``stop="all_exhausted"``). The result is small and JSON-able; load it with
    ``load_state_dict`` into every consumer of a job of any size (any ``rank`` and
    ``world_size``, any number of DataLoader workers): together they deliver every sample
    of the epoch that the old job had not delivered, exactly once, and read no unit the
    old job finished. A state missing, given twice, or of another job is refused.
    """
    if isinstance(states, Mapping) or not isinstance(states, Sequence) or not states:
        raise SourceError(
            f"merge_states({_short(states)}): give a list of the state_dict() of every "
            "consumer of the job"
        )
    for i, s in enumerate(states):
        if not isinstance(s, Mapping):
            raise SourceError(f"states[{i}] is a {type(s).__name__}, not a state_dict() (a dict)")
    kind = states[0].get("kind")
    if kind == JOB_KIND:
        raise SourceError(
            "states[0] is a job state already (merge_states' result): load it into the "
            "streams of the new job; merge the states they save"
        )
    if kind == "mix":
        return _merge_mixtures(states)
    if kind == INTERLEAVED:  # StreamOptions(shuffle_units=K): K lanes per consumer
        return _merge_interleaved(states)
    if kind == "lerobot":
        return merge_job(states, lerobot_progress, "LeRobot streams")
    if kind is not None:
        raise SourceError(f"states[0]['kind'] is {kind!r}: not a state this version merges")
    for i, s in enumerate(states):
        if s.get("cursor") is not None and not isinstance(s.get("cursor"), Mapping):
            raise SourceError(f"states[{i}]['cursor'] is {_short(s.get('cursor'))}: {_UNCHANGED}")
    return merge_job(states, stream_progress, "streams")


def _merge_mixtures(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mixtures' states: each member's states merged; the draws start afresh in the new
    job (they pick members, not samples: with ``all_exhausted`` no sample depends on them)."""
    first = states[0]
    for i, s in enumerate(states):
        for key in ("kind", "version", "epoch", "seed", "stop", "weights", "streams"):
            if s.get(key) != first.get(key):
                raise SourceError(
                    f"states[{i}][{key!r}] is {_short(s.get(key))} but states[0]'s is "
                    f"{_short(first.get(key))}: merge the states of one mixture's consumers"
                )
        if not isinstance(s.get("members"), list):
            raise SourceError(f"states[{i}]['members'] is {_short(s.get('members'))}: {_UNCHANGED}")
    if first.get("stop") != "all_exhausted":
        raise SourceError(
            f"the mixtures stop at {first.get('stop')!r}: each consumer's epoch ends where its "
            "own first member ends, so a job of another size cannot go on with the same "
            "samples; mix with stop='all_exhausted' (every sample once) to resume elastically"
        )
    count = len(first["members"])
    if any(len(s["members"]) != count for s in states):
        raise SourceError(f"the states hold different numbers of members: {_UNCHANGED}")
    members = [merge_states([s["members"][m] for s in states]) for m in range(count)]
    return {
        "version": first.get("version"),
        "kind": JOB_KIND,
        "of": "mix",
        "epoch": first.get("epoch"),
        "seed": first.get("seed"),
        "stop": first.get("stop"),
        "weights": first.get("weights"),
        "streams": first.get("streams"),
        "samples": sum(int(s.get("samples") or 0) for s in states),
        "members": members,
    }


def _merge_interleaved(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The job state of consumers with ``shuffle_units``: their lanes' states merged as
    the states of one job of ``n * K`` consumers (``aiostream_hf._interleave``)."""
    first = states[0]
    units = first.get("shuffle_units")
    lanes: list[Any] = []
    for i, s in enumerate(states):
        for key in ("kind", "version", "epoch", "seed", "shuffle_units", "world_size"):
            if s.get(key) != first.get(key):
                raise SourceError(
                    f"states[{i}][{key!r}] is {s.get(key)!r} but states[0]'s is "
                    f"{first.get(key)!r}: merge the states of one job's consumers"
                )
        members = s.get("lanes", {}).get("members") if isinstance(s.get("lanes"), Mapping) else None
        if not isinstance(members, list) or len(members) != units:
            raise SourceError(
                f"states[{i}]['lanes'] does not hold {units} lanes' states: load the states "
                "the streams saved, unchanged"
            )
        lanes += members
    job = merge_states(lanes)
    return {
        "version": first.get("version"),
        "kind": JOB_KIND,
        "of": INTERLEAVED,
        "epoch": first.get("epoch"),
        "seed": first.get("seed"),
        "shuffle_units": units,
        "samples": job.get("samples", 0),
        "lanes": job,
    }
