"""mix(): streams interleaved by weight, deterministic by (seed, epoch), resumable exactly.

    web = ash.stream("hf://datasets/org/web", split="train")
    code = ash.stream("hf://datasets/org/code", split="train")
    async with ash.mix([web, code], [0.7, 0.3], seed=0) as m:
        async for sample in m:
            ...

Each sample comes from a member drawn at random with the given probabilities, drawn
as ``datasets.interleave_datasets(probabilities=..., seed=...)`` draws them: numpy's
``default_rng(seed)``, 1000 draws at a time (``choice(n, 1000, p=...)``, or
``integers(0, n, 1000)`` without weights). So at epoch 0 a mixture of members that
yield the same samples as ``datasets``' ones gives the same sequence (tested against
``datasets``). Other epochs, and each DataLoader worker's mixture, draw from
``default_rng([seed, epoch, worker + 1])``.

The stops:

- ``"first_exhausted"`` is ``datasets``' own: the mixture ends right after the last
  sample of the first member to end.
- ``"all_exhausted"`` delivers every sample of every member exactly once: a member that
  ends leaves the draw, and the others' weights are renormalized. ``datasets``'
  ``"all_exhausted"`` means something else: it oversamples, restarting members that
  ended until every member has ended once, so that samples repeat; that is not
  offered. ``datasets``' ``"all_exhausted_without_replacement"`` means ours, and
  draws the same until the first member ends; it then redraws when an ended member
  comes up, where we draw anew over the members left (the same probabilities, and no
  run of wasted draws when the members left have small weights).

Knowing, under ``"first_exhausted"``, that the member just drawn from has ended takes
knowing whether it has more. A stream knows it while rows of its current unit are left
or its shuffle buffer holds samples (``Engine._holds_more``); otherwise the mixture
reads one sample ahead of it, having saved its ``state_dict()`` first. So
``state_dict()`` is exact at every sample: each member's position is that of the
samples the mixture delivered, never of one it holds, nor of the members' readahead
(a stream's cursor moves only as its samples are taken).

Structured concurrency as for a stream: ``async with mix`` enters every member's
``async with`` (which own their background tasks); ``async for`` draws from the
members' iterations, which hold nothing across the consumer's code. ``for`` iterates
the members synchronously, each through the bridge.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import weakref
from collections.abc import AsyncIterator, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from types import TracebackType
from typing import Any, Literal, Protocol

import anyio
import numpy as np

from ._elastic import JOB_KIND
from ._engine import Engine, check_state, digest, running_message, state_int
from ._exceptions import ClosedResourceError, SourceError, UsageError

__all__ = ["Mix", "MixStatistics", "mix"]

Stop = Literal["first_exhausted", "all_exhausted"]
_STOPS = ("first_exhausted", "all_exhausted")
_BATCH = 1000  # draws per call of the generator, as datasets makes them
# 2: a state names its members (``streams``), so that it loads only into a mixture of the
# same streams in the same order; a state of version 1 does not, and is refused.
_STATE_VERSION = 2
_END = object()  # a member ended (what a pull gives instead of a sample)
_STOP = object()  # the mixture ended


class _Member(Protocol):
    """What a mixture needs of a member: a ``Stream``, a ``LeRobotStream``, a ``Mix``."""

    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool | None: ...

    def __aiter__(self) -> AsyncIterator[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...

    async def aclose(self) -> None: ...

    def close(self) -> None: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def statistics(self) -> Any: ...

    def _holds_more(self) -> bool: ...

    def _sample_shape(self) -> str | None: ...

    def _identity(self) -> str: ...

    def _state_ended(self, state: Mapping[str, Any]) -> bool | None: ...


# The mixture each stream (or mixture) is a member of, while that mixture lives: a stream
# read by two mixtures would have its position moved by both, and give samples twice.
_MIXTURE_OF: weakref.WeakKeyDictionary[Any, weakref.ref[Mix]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class MixStatistics:
    """What a mixture did so far.

    samples: the samples it delivered. drawn: how many came from each member (in the
    order of ``streams``). exhausted: the members that ended. members: each member's
    own ``statistics()`` (requests, bytes, samples read). A member's ``stalls`` see the
    mixture as its consumer: the time the mixture spent on the other members counts as
    that consumer's own.
    """

    samples: int
    drawn: tuple[int, ...]
    exhausted: tuple[bool, ...]
    members: tuple[Any, ...]


def mix(
    streams: Sequence[Any],
    weights: Sequence[float] | None = None,
    *,
    seed: int = 0,
    stop: Stop = "first_exhausted",
) -> Mix:
    """The samples of ``streams``, each drawn from a member picked with probability
    ``weights[i] / sum(weights)`` (equal without weights), deterministic by ``seed`` and
    the epoch (``set_epoch(n)`` reaches every member).

    ``streams``: streams made by ``stream()`` or ``lerobot.stream()`` (or mixtures),
    each yielding one dict per sample (no ``batch_size``), of any format. ``stop``:
    ``"first_exhausted"`` ends right after the last sample of the first member to end
    (as ``datasets.interleave_datasets``); ``"all_exhausted"`` delivers every sample of
    every member exactly once, renormalizing the weights as members end (``datasets``'
    ``"all_exhausted"`` oversamples instead; see the module docstring).

    Like a stream: ``async with`` then ``async for``, or ``for``; ``statistics()``,
    ``state_dict()`` / ``load_state_dict()`` (the draws and every member's position,
    JSON-able), ``set_epoch()``.
    """
    return Mix(streams, weights, seed=seed, stop=stop)


class Mix:
    """A weighted mixture of streams: async-iterable, sync-iterable, closable, resumable,
    observable. See :func:`mix`.

    ``consumer`` (a DataLoader consumer's number, from ``aiostream_hf.torch.MixDataset``)
    gives the consumer draws of its own; ``what`` names the members in messages.
    """

    def __init__(
        self,
        streams: Sequence[Any],
        weights: Sequence[float] | None = None,
        *,
        seed: int = 0,
        stop: Stop = "first_exhausted",
        consumer: int | None = None,
        what: str = "streams",
    ) -> None:
        if stop not in _STOPS:
            raise SourceError(_stop_message(stop))
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise SourceError(f"seed={seed!r}: give a whole number >= 0")
        self._members: list[_Member] = _check_members(streams, what)
        self._weights = _check_weights(weights, len(self._members), stop, what)
        for m in self._members:
            _MIXTURE_OF[m] = weakref.ref(self)
        self._seed = seed
        self._stop: Stop = stop
        self._consumer = consumer
        self._epoch = 0
        self._closed = False
        self._stack: contextlib.AsyncExitStack | None = None
        # The running ``async for``, held weakly: a loop left (``break``) lets it go.
        self._iteration: weakref.ref[_MixIteration] | None = None
        self._sync_loops: weakref.WeakSet[Generator[Any, None, None]] = weakref.WeakSet()
        self._generation = 0  # of the running iteration: a new one stops the old
        self._resume: dict[str, Any] | None = None
        self._fresh()

    def _fresh(self) -> None:
        """The draws and counts of an iteration from the start of the epoch."""
        n = len(self._members)
        rng = _generator(self._seed, self._epoch, self._consumer)
        self._draws = _Draws(self._weights, rng, n)
        self._exhausted = [False] * n
        self._drawn = [0] * n
        self._samples = 0
        self._last: int | None = None  # the member of the last sample delivered
        self._ended = False
        # A sample read ahead of a member (first_exhausted), with the member's state before it.
        self._pending: list[tuple[dict[str, Any], Any] | None] = [None] * n

    # -- what a member is -----------------------------------------------------------------

    def _holds_more(self) -> bool:
        return False  # a mixture within a mixture is read ahead when it is drawn again

    def _sample_shape(self) -> str | None:
        return None

    def _identity(self) -> str:
        """What this mixture is: its members' identities, weights, seed and stop."""
        return digest(
            {
                "mix": [m._identity() for m in self._members],
                "weights": list(self._weights) if self._weights is not None else None,
                "seed": self._seed,
                "stop": self._stop,
            }
        )

    def _state_ended(self, state: Mapping[str, Any]) -> bool | None:
        """Whether ``state`` (checked) is of a mixture that has ended."""
        return bool(state.get("ended"))

    # -- observing and resuming -----------------------------------------------------------

    def statistics(self) -> MixStatistics:
        return MixStatistics(
            samples=self._samples,
            drawn=tuple(self._drawn),
            exhausted=tuple(self._exhausted),
            members=tuple(m.statistics() for m in self._members),
        )

    def state_dict(self) -> dict[str, Any]:
        """The exact position of this mixture: its draws, and each member's state as of
        the samples delivered (a sample read ahead of a member is not in it). JSON-able
        when the members' states are. Load it into a new mixture of the same members."""
        if self._resume is not None:  # loaded, not yet taken up by an iteration
            return {
                **self._resume,
                "members": [m.state_dict() for m in self._members],
            }
        draws = self._draws
        return {
            "version": _STATE_VERSION,
            "kind": "mix",
            "epoch": self._epoch,
            "seed": self._seed,
            "stop": self._stop,
            "weights": list(self._weights) if self._weights is not None else None,
            "consumer": self._consumer,
            "streams": [m._identity() for m in self._members],
            "rng": draws.start,
            "offset": draws.offset,
            "exhausted": list(self._exhausted),
            "last": self._last,
            "ended": self._ended,
            "drawn": list(self._drawn),
            "samples": self._samples,
            "members": [
                held[0] if held is not None else m.state_dict()
                for m, held in zip(self._members, self._pending, strict=True)
            ],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue, on the next iteration, exactly where ``state`` was taken: the same
        draws, every member at its position. A state of another mixture (other seed,
        stop, weights, or other members or the same in another order), of another version,
        or a changed one is a ``SourceError`` naming the field."""
        if not isinstance(state, Mapping):
            raise SourceError(f"state is a {type(state).__name__}, not a state_dict() (a dict)")
        if state.get("kind") == JOB_KIND:  # merge_states() of a job's mixtures
            self._load_job(state)
            return
        n = len(self._members)
        check_state(
            state,
            version=_STATE_VERSION,
            kind="mix",
            same={
                "seed": self._seed,
                "stop": self._stop,
                "weights": list(self._weights) if self._weights is not None else None,
                "consumer": self._consumer,
            },
        )
        members = state.get("members")
        if not isinstance(members, list) or len(members) != n:
            raise SourceError(
                f"state['members'] is {_short(members)}, not a list of {n} states (one per "
                "member): load a state_dict() of a mixture of as many streams"
            )
        _check_streams(state.get("streams"), [m._identity() for m in self._members])
        _check_draws_state(state, n, self._stop)
        for i, member_state in enumerate(members):
            if not isinstance(member_state, Mapping):
                raise SourceError(
                    f"state['members'][{i}] is a {type(member_state).__name__}, "
                    "not a stream's state_dict()"
                )
        before = [m.state_dict() for m in self._members]
        try:
            for i, (m, member_state) in enumerate(zip(self._members, members, strict=True)):
                m.load_state_dict(member_state)
                ended = m._state_ended(member_state)
                if state["exhausted"][i] and ended is False:
                    raise SourceError(
                        f"state['exhausted'][{i}] is True but state['members'][{i}] is not "
                        "at its end: its samples left would be lost; load a state_dict() of "
                        "this mixture, unchanged"
                    )
        except BaseException:
            for m, old in zip(self._members, before, strict=True):
                with contextlib.suppress(SourceError):
                    m.load_state_dict(old)
            raise
        self._epoch = int(state["epoch"])
        self._resume = {k: v for k, v in state.items() if k != "members"}

    def _load_job(self, job: Mapping[str, Any]) -> None:
        """A job state: each member loads its merged state (its share of what the old job
        left, in this consumer's layout); the draws start afresh (they choose members, not
        samples: with ``all_exhausted`` every sample left comes once whatever they are)."""
        if job.get("of") != "mix":
            raise SourceError(
                f"the job state is of {job.get('of')!r} streams, not of mixtures: load it into "
                "the kind of stream that saved it"
            )
        mine = {
            "seed": self._seed,
            "stop": self._stop,
            "weights": list(self._weights) if self._weights is not None else None,
        }
        for key, value in mine.items():
            if job.get(key) != value:
                raise SourceError(
                    f"the job state was saved with {key}={job.get(key)!r} but this mixture has "
                    f"{key}={value!r}: resume with the same arguments"
                )
        _check_streams(job.get("streams"), [m._identity() for m in self._members])
        members = job.get("members")
        if not isinstance(members, list) or len(members) != len(self._members):
            raise SourceError(
                f"the job state's 'members' is {_short(members)}, not one state per member"
            )
        self._load_members(members, int(job.get("epoch") or 0))

    def _load_members(self, members: Sequence[Mapping[str, Any]], epoch: int) -> None:
        """Load a job state's part for each member, all or none (a refusal puts back what
        the members held), and start the draws of ``epoch`` afresh."""
        before = [m.state_dict() for m in self._members]
        try:
            for m, member_job in zip(self._members, members, strict=True):
                m.load_state_dict(member_job)
        except BaseException:
            for m, old in zip(self._members, before, strict=True):
                with contextlib.suppress(SourceError):
                    m.load_state_dict(old)
            raise
        self._epoch = epoch
        self._resume = None
        self._fresh()

    def set_epoch(self, epoch: int) -> None:
        """The draws, and every member's order, depend on (seed, epoch): call before each
        epoch's iteration."""
        self._epoch = epoch
        for m in self._members:
            m.set_epoch(epoch)

    def _begin(self) -> int:
        """An iteration starts: from the loaded state, else from the epoch's start. Returns
        its number: an iteration whose number is no longer the mixture's stops."""
        self._generation += 1
        resume, self._resume = self._resume, None
        self._fresh()
        if resume is None:
            return self._generation
        self._draws.restore(resume["rng"], resume["offset"], resume["exhausted"])
        self._exhausted = list(resume["exhausted"])
        self._drawn = list(resume["drawn"])
        self._samples = int(resume["samples"])
        self._last = resume["last"]
        self._ended = bool(resume["ended"])
        return self._generation

    # -- the draw -------------------------------------------------------------------------

    def _step(self) -> Generator[int, Any, Any]:
        """The next sample (or ``_STOP``): yields the member to read one sample from and is
        sent what it gave (a sample, or ``_END``). Nothing of the draw is kept before the
        sample is returned, so an iteration cancelled while reading loses nothing; a
        sample read ahead is kept with the member's state before it."""
        if self._ended:
            return _STOP
        draws = self._draws
        first = self._stop == "first_exhausted"
        while True:
            j = draws.next()
            last = self._last
            if first and last is not None and last != j and self._pending[last] is None:
                # Has the member of the last sample ended? Then the mixture ends here.
                member = self._members[last]
                if not member._holds_more():
                    before = member.state_dict()
                    ahead = yield last
                    if ahead is _END:
                        self._exhausted[last] = self._ended = True
                        return _STOP
                    self._pending[last] = (before, ahead)
            held = self._pending[j]
            if held is not None:
                self._pending[j] = None
                sample = held[1]
            else:
                sample = yield j
                if sample is _END:
                    self._exhausted[j] = True
                    if first or all(self._exhausted):
                        self._ended = True
                        return _STOP
                    draws.drop(j)
                    continue
            draws.take()
            self._drawn[j] += 1
            self._samples += 1
            self._last = j
            return sample

    # -- lifecycle ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError("this mixture is closed: call mix(...) again")

    async def __aenter__(self) -> Mix:
        """Enter every member's ``async with`` (their background tasks live there)."""
        self._check_open()
        if self._stack is not None:
            raise UsageError("this mixture is already open: enter `async with` once")
        async with contextlib.AsyncExitStack() as stack:
            for m in self._members:
                await stack.enter_async_context(m)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        await self.aclose()
        stack, self._stack = self._stack, None
        if stack is None:
            return None
        return await stack.__aexit__(et, e, tb)

    async def aclose(self) -> None:
        """Stop this mixture's iteration and every member; ``async with`` then waits for
        their tasks."""
        self._closed = True
        running = self._running()
        if running is not None:
            running.close()
        self._iteration = None
        for m in self._members:
            await m.aclose()

    def close(self) -> None:
        """Sync ``aclose()``: stop every member's sync iteration."""
        self._closed = True
        for m in self._members:
            m.close()

    def __enter__(self) -> Mix:
        self._check_open()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __aiter__(self) -> AsyncIterator[Any]:
        self._check_open()
        if self._stack is None:
            raise UsageError(
                "a mixture is iterated inside `async with`, which opens its members: write "
                "`async with ash.mix(...) as m: async for sample in m: ...` (or iterate it "
                "synchronously with `for sample in m`)"
            )
        self._check_one_iteration()
        iteration = _MixIteration(self, [aiter(m) for m in self._members])
        self._iteration = weakref.ref(iteration)
        return iteration

    def __iter__(self) -> Iterator[Any]:
        """Sync iteration: each member runs on the bridge thread; the draws are made on the
        consumer's thread, so ``state_dict()`` is exact at every sample."""
        self._check_open()
        self._check_one_iteration()
        loop = self._iterate_sync()
        self._sync_loops.add(loop)
        return loop

    def _running(self) -> _MixIteration | None:
        it = self._iteration() if self._iteration is not None else None
        return it if it is not None and not it._closed else None

    def _check_one_iteration(self) -> None:
        """One iteration at a time: the draws and the members' positions are the
        mixture's, so a second loop while the first runs would take samples from it."""
        if self._running() is not None or any(
            inspect.getgeneratorstate(loop) != inspect.GEN_CLOSED for loop in self._sync_loops
        ):
            raise UsageError(running_message("this mixture", "call mix(...) again"))

    def _iterate_sync(self) -> Generator[Any, None, None]:
        generation = self._begin()
        members = [iter(m) for m in self._members]
        try:
            while not self._closed and self._generation == generation:
                steps = self._step()
                try:
                    want = next(steps)
                    while True:
                        want = steps.send(next(members[want], _END))
                except StopIteration as done:
                    sample = done.value
                finally:
                    steps.close()
                if sample is _STOP:
                    return
                yield sample
        finally:
            for it in members:
                close = getattr(it, "close", None)
                if close is not None:
                    close()


class _MixIteration:
    """One ``async for`` over a mixture: each ``__anext__`` draws a member and awaits its
    next sample; nothing is held between samples but the members' iterations."""

    def __init__(self, mix: Mix, members: list[AsyncIterator[Any]]) -> None:
        self._mix = mix
        self._members = members
        self._generation: int | None = None
        self._closed = False

    def __aiter__(self) -> _MixIteration:
        return self

    async def __anext__(self) -> Any:
        mix = self._mix
        if self._generation is None and not self._closed:
            self._generation = mix._begin()
        if self._closed or mix._generation != self._generation:
            self.close()
            raise StopAsyncIteration
        steps = mix._step()
        try:
            want = next(steps)
            while True:
                try:
                    got = await anext(self._members[want])
                except StopAsyncIteration:
                    got = _END
                want = steps.send(got)
        except StopIteration as done:
            sample = done.value
        except anyio.get_cancelled_exc_class():
            raise  # nothing was taken: asking again goes on where this left off
        except Exception:
            # A member failed: this iteration ends here, rather than go on as if the
            # member had ended (its samples after the error would be lost silently).
            self.close()
            raise
        finally:
            steps.close()
        if sample is _STOP:
            self.close()
            raise StopAsyncIteration
        return sample

    def close(self) -> None:
        """Stop this iteration and the members' iterations it reads."""
        if self._closed:
            return
        self._closed = True
        for it in self._members:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    async def aclose(self) -> None:
        self.close()


class _Draws:
    """The members drawn, 1000 at a time from a numpy generator, as ``datasets`` draws.

    ``start`` is the generator's state before the current batch and ``offset`` the draws
    of it taken: with them (and the members that ended) the draws go on exactly. When a
    member ends (all_exhausted), the rest of the batch is dropped and a new one drawn
    over the members left, their weights renormalized.
    """

    def __init__(
        self, weights: tuple[float, ...] | None, rng: np.random.Generator, members: int
    ) -> None:
        self._weights = weights
        self._rng = rng
        self._live = [True] * members
        self.start: Mapping[str, Any] = rng.bit_generator.state
        self.offset = 0
        self._batch: list[int] = []

    def next(self) -> int:
        """The member of the next draw (taken by ``take()``)."""
        if self.offset >= len(self._batch):
            self._new_batch()
        return self._batch[self.offset]

    def take(self) -> None:
        self.offset += 1

    def drop(self, member: int) -> None:
        """``member`` ended: draw anew over the others, from the generator's state now."""
        self._live[member] = False
        self._new_batch()

    def restore(self, rng: Any, offset: int, exhausted: Sequence[bool]) -> None:
        """The draws of a saved state: the batch it was in, at its offset."""
        self._live = [not e for e in exhausted]
        self._rng.bit_generator.state = rng
        self.start = self._rng.bit_generator.state
        self._batch = self._draw()
        self.offset = offset

    def _new_batch(self) -> None:
        self.start = self._rng.bit_generator.state
        self.offset = 0
        self._batch = self._draw()

    def _draw(self) -> list[int]:
        n = len(self._live)
        if self._weights is None and all(self._live):
            return self._rng.integers(0, n, size=_BATCH).tolist()  # type: ignore[no-any-return]
        weights = self._weights or (1.0,) * n
        w = np.array([x if live else 0.0 for x, live in zip(weights, self._live, strict=True)])
        return self._rng.choice(n, size=_BATCH, p=w / w.sum()).tolist()  # type: ignore[no-any-return]


def _generator(seed: int, epoch: int, consumer: int | None) -> np.random.Generator:
    """The generator of an epoch: ``default_rng(seed)`` at epoch 0 (as ``datasets``), else
    (and in each DataLoader consumer) one of its own for (seed, epoch, consumer)."""
    if epoch == 0 and consumer is None:
        return np.random.default_rng(seed)
    return np.random.default_rng([seed, epoch, 0 if consumer is None else consumer + 1])


# -- checks -------------------------------------------------------------------------------


def _stop_message(stop: object) -> str:
    message = f"stop={stop!r}: use 'first_exhausted' or 'all_exhausted'"
    if stop == "all_exhausted_without_replacement":
        message += " (which delivers every sample exactly once, as datasets' name says)"
    return message


def _check_members(streams: object, what: str) -> list[_Member]:
    if isinstance(streams, (Engine, Mix)):
        raise SourceError(f"{what} is one stream: give a list of them, e.g. mix([a, b], ...)")
    if isinstance(streams, (str, bytes, Mapping)) or not isinstance(streams, Sequence):
        raise SourceError(
            f"{what} is a {type(streams).__name__}: give a list of streams made by "
            "aiostream_hf.stream(...) or aiostream_hf.lerobot.stream(...)"
        )
    members: list[_Member] = []
    for i, m in enumerate(streams):
        if not isinstance(m, (Engine, Mix)):
            raise SourceError(
                f"{what}[{i}] is a {type(m).__name__}, not a stream: give streams made by "
                "aiostream_hf.stream(...) or aiostream_hf.lerobot.stream(...)"
            )
        shape = m._sample_shape()
        if shape is not None:
            raise SourceError(
                f"{what}[{i}] yields {shape}: a mixture draws single samples; give members "
                "that yield one dict per sample and batch the mixture (e.g. with a "
                "DataLoader's batch_size)"
            )
        for j, other in enumerate(members):
            if other is m:
                raise SourceError(
                    f"{what}[{i}] is {what}[{j}]: each member must be a stream of its own "
                    "(make another with the same arguments)"
                )
            if m in _tree(other) or other in _tree(m):
                inner, outer = (i, j) if m in _tree(other) else (j, i)
                raise SourceError(
                    f"{what}[{inner}] is also inside {what}[{outer}] (a mixture): a stream "
                    "is read by one mixture only, else its samples come twice; make another "
                    "with the same arguments"
                )
        owner = _MIXTURE_OF.get(m)
        mixture = owner() if owner is not None else None
        if mixture is not None and not mixture._closed:
            raise SourceError(
                f"{what}[{i}] is already a member of another mixture: a stream is read by "
                "one mixture only (both would move its position, and samples would come "
                "twice or never); make another stream with the same arguments"
            )
        members.append(m)
    if not members:
        raise SourceError(f"{what} is empty: a mixture needs at least one stream")
    return members


def _tree(member: object) -> list[object]:
    """Every stream and mixture inside ``member`` (a mixture), at any depth."""
    if not isinstance(member, Mix):
        return []
    found: list[object] = []
    for m in member._members:
        found += [m, *_tree(m)]
    return found


def _check_streams(saved: object, mine: list[str]) -> None:
    """The members a state was saved over are this mixture's, in the same order."""
    if not isinstance(saved, list) or len(saved) != len(mine):
        raise SourceError(
            f"state['streams'] is {_short(saved)}, not the {len(mine)} members' identities "
            "a mixture saves: load a state_dict() of this mixture, unchanged"
        )
    for i, (theirs, ours) in enumerate(zip(saved, mine, strict=True)):
        if theirs != ours:
            where = f" (it is this mixture's member {mine.index(theirs)})" if theirs in mine else ""
            raise SourceError(
                f"state['streams'][{i}] is {theirs!r}, not this mixture's member {i} "
                f"({ours!r}){where}: the state is of another mixture; load it into a mixture "
                "of the same streams, with the same arguments, in the same order"
            )


def _check_weights(weights: object, count: int, stop: str, what: str) -> tuple[float, ...] | None:
    if weights is None:
        return None
    if isinstance(weights, (str, bytes, Mapping)) or not isinstance(
        weights, (Sequence, np.ndarray)
    ):
        raise SourceError(f"weights={weights!r}: give a list of numbers, one per stream")
    values = list(weights)
    if len(values) != count:
        raise SourceError(
            f"weights has {len(values)} values for {count} {what}: give one weight per stream"
        )
    checked: list[float] = []
    for i, w in enumerate(values):
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, Real):
            raise SourceError(f"weights[{i}] is {w!r}, not a number")
        try:
            value = float(w)
        except OverflowError:
            raise SourceError(
                f"weights[{i}] is too large for a float (over 1.8e308): scale the weights down"
            ) from None
        if not math.isfinite(value):
            raise SourceError(f"weights[{i}] is {value!r}: give finite weights")
        if value < 0:
            raise SourceError(f"weights[{i}] is {value!r}: weights must be >= 0")
        if value == 0 and stop == "all_exhausted":
            raise SourceError(
                f"weights[{i}] is 0 with stop='all_exhausted', which delivers every sample "
                f"of every member: {what}[{i}] would never be drawn; give it a weight > 0, "
                "or leave it out"
            )
        checked.append(value)
    total = sum(checked)
    if total == 0:
        raise SourceError(f"weights={values!r} are all 0: give at least one weight > 0")
    if not math.isfinite(total):
        raise SourceError(f"weights={values!r} sum to {total}: scale them down")
    return tuple(checked)


def _check_draws_state(state: Mapping[str, Any], count: int, stop: str) -> None:
    """The mixture's own fields of a state, each checked before any is used."""
    offset = state_int(state, "offset")
    assert offset is not None
    if offset > _BATCH:
        raise SourceError(
            f"state['offset'] is {offset}, past the {_BATCH} draws of a batch: load a "
            "state_dict() of this mixture, unchanged"
        )
    state_int(state, "samples")
    for key in ("exhausted", "drawn"):
        values = state.get(key)
        if not isinstance(values, list) or len(values) != count:
            raise SourceError(f"state[{key!r}] is {_short(values)}, not a list of {count}")
    for i, e in enumerate(state["exhausted"]):
        if not isinstance(e, bool):
            raise SourceError(f"state['exhausted'][{i}] is {e!r}, not True or False")
    for i, d in enumerate(state["drawn"]):
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise SourceError(f"state['drawn'][{i}] is {d!r}, not a whole number >= 0")
    ended = state.get("ended")
    if not isinstance(ended, bool):
        raise SourceError(f"state['ended'] is {ended!r}, not True or False")
    over = all(state["exhausted"]) or (stop == "first_exhausted" and any(state["exhausted"]))
    if over and not ended:
        raise SourceError(
            "state['exhausted'] says the mixture has ended but state['ended'] does not: "
            "load a state_dict() of this mixture, unchanged"
        )
    if ended and not over:
        raise SourceError(
            f"state['ended'] is True but state['exhausted'] is {state['exhausted']!r}: the "
            "samples of the members left would be lost; load a state_dict() of this "
            "mixture, unchanged"
        )
    last = state.get("last")
    if last is not None and (
        isinstance(last, bool) or not isinstance(last, int) or not 0 <= last < count
    ):
        raise SourceError(f"state['last'] is {last!r}, not None or a member's number < {count}")
    _check_rng(state.get("rng"))


def _check_rng(rng: object) -> None:
    """A numpy PCG64 state, as ``bit_generator.state`` gives it (also after JSON)."""
    ok = False
    if isinstance(rng, Mapping) and rng.get("bit_generator") == "PCG64":
        fields = rng.get("state")
        ok = (
            isinstance(fields, Mapping)
            and all(type(fields.get(k)) is int for k in ("state", "inc"))
            and rng.get("has_uint32") in (0, 1)
            and type(rng.get("uinteger")) is int
        )
        if ok:
            try:
                np.random.PCG64().state = dict(rng)  # type: ignore[assignment]
            except (TypeError, ValueError, OverflowError):
                ok = False
    if not ok:
        raise SourceError(
            f"state['rng'] is {_short(rng)}, not a numpy PCG64 state as a mixture saves "
            "it: load a state_dict() of this mixture, unchanged"
        )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
