"""The engine every stream runs on: lifecycle, iteration, order, rank share, shuffle, state.

A stream (``Stream`` for Parquet and TAR, ``LeRobotStream`` for LeRobot items) is an
``Engine`` that says two things: how to load its units in the background
(``_loaded_units``: an async generator, run in a task of its own) and how a loaded
unit becomes samples on the consumer's side (``_shape_unit``, then ``_shape_end``),
moving its cursor as each sample is taken, so that ``state_dict()`` is exact. The
engine does the rest, once for every stream:

- ``async with stream:`` owns the task group the producer runs in; ``async for``
  reads loaded units from a bounded channel (``_Iteration``), so no cancel scope,
  task group or lock is held across the consumer's code; a bare ``async for``
  raises ``UsageError`` at once;
- ``for sample in stream`` runs the same producer on the bridge thread and shapes
  samples on the consumer's thread;
- the order of an epoch (``epoch_order``), a rank's share (``rank_share``), the
  shuffle buffer (``ShuffleBuffer``) and the checks of a loaded state
  (``check_state``).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import random
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Any, Generic, TypeVar

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._access import Access, check_token, find_access, normalize_endpoint
from ._bridge import SyncIterator
from ._client import HubClient, use_client
from ._exceptions import ClosedResourceError, SourceError, UsageError
from ._fetcher import RangeFetcher
from ._models import Manifest
from ._options import StreamOptions
from ._prefetch import Job, Prefetcher, PrefetchStatistics, Ramp
from ._ranks import loader_workers, rank_and_world
from ._resolver import Resolver
from ._stalls import StageClock, Stalls, metered

__all__ = [
    "Engine",
    "EngineStatistics",
    "Readers",
    "ShuffleBuffer",
    "as_rng_state",
    "check_state",
    "digest",
    "epoch_order",
    "open_readers",
    "rank_share",
    "running_message",
    "shuffle_buffer_size",
    "state_int",
]

T = TypeVar("T")
R = TypeVar("R")
_E = TypeVar("_E", bound="Engine[Any]")

_DEFAULT_SHUFFLE_BUFFER = 1000
# a state's "kind", in messages
_KIND_NAMES = {None: "Parquet or TAR", "lerobot": "LeRobot", "mix": "mixture"}
_CHANNEL_UNITS = 1  # loaded units between the producer and the consumer, past the readahead


# -- order, share, shuffle, state -----------------------------------------------------------


def shuffle_buffer_size(shuffle: object, default: int = _DEFAULT_SHUFFLE_BUFFER) -> int:
    """The shuffle buffer for ``shuffle=``: True (``default``), False/None (0), or a size."""
    if isinstance(shuffle, bool) or shuffle is None:
        return default if shuffle else 0
    if isinstance(shuffle, int) and shuffle >= 1:
        return shuffle
    raise SourceError(f"shuffle={shuffle!r}: use True, False, or a buffer size >= 1")


def epoch_order(items: Sequence[T], *, seed: int, epoch: int, shuffle: bool, what: str) -> list[T]:
    """``items`` in the order of one epoch: as given, or shuffled by (seed, epoch), the
    same on every rank and worker (so that their shares are disjoint)."""
    order = list(items)
    if shuffle:
        random.Random(f"{seed}:{epoch}:{what}").shuffle(order)
    return order


def rank_share(items: Sequence[T], rank: int, world_size: int) -> tuple[list[T], bool]:
    """A rank's share of ``items`` (files, episodes): every ``world_size``-th from
    ``rank`` when there are enough for every rank; else all of them, and the flag says
    that the rank must keep every ``world_size``-th unit of what they hold instead.
    All ranks together read everything once."""
    if len(items) >= world_size:
        return list(items[rank::world_size]), False
    return list(items), True


class ShuffleBuffer(Generic[T]):
    """A bounded shuffle buffer, deterministic for a seed, resumable exactly.

    ``push(item)`` holds items until ``size`` are held, then swaps each new item with
    a random held one and returns that; ``pop()`` takes a random held item (one draw
    per item, so a state taken mid-drain resumes the same order). Every item comes out
    exactly once and at most ``size`` are held. webdataset's ``shuffle(bufsize,
    initial)`` instead starts emitting once ``initial`` items are held and pops a
    random item per arrival.
    """

    def __init__(self, size: int, seed: int | str = 0) -> None:
        if size < 1:
            raise SourceError(f"shuffle buffer size={size!r}: must be >= 1")
        self.size = size
        self.rng = random.Random(seed)
        self.items: list[T] = []

    def __len__(self) -> int:
        return len(self.items)

    def push(self, item: T) -> T | None:
        """Hold ``item``; once the buffer is full, return a random held item (never None)."""
        if item is None:
            raise ValueError("ShuffleBuffer.push(None): None cannot be told from 'no item'")
        items = self.items
        if len(items) < self.size:
            items.append(item)
            return None
        i = self.rng.randrange(len(items))
        out, items[i] = items[i], item
        return out

    def pop(self) -> T:
        """A random held item (the buffer must not be empty)."""
        items = self.items
        i = self.rng.randrange(len(items))
        items[i], items[-1] = items[-1], items[i]
        return items.pop()

    def drain(self) -> Iterator[T]:
        """The held items in random order, each taken as it is yielded."""
        while self.items:
            yield self.pop()

    def state(self) -> tuple[list[T], tuple[Any, ...]]:
        """(held items, RNG state): with ``restore``, the buffer exactly as it is now."""
        return list(self.items), self.rng.getstate()

    def restore(self, items: Sequence[T], rng_state: Any) -> None:
        self.items = list(items)
        if rng_state is not None:
            self.rng.setstate(as_rng_state(rng_state))


def as_rng_state(state: Any) -> tuple[Any, ...]:
    """random.Random state, also after a JSON round trip (lists instead of tuples);
    anything else (a tampered or truncated state) is a ``SourceError``."""
    try:
        version, internal, gauss = state
        rng_state = (version, tuple(internal), gauss)
        random.Random().setstate(rng_state)  # checks every field
    except (TypeError, ValueError, OverflowError) as exc:
        raise SourceError(
            f"state's shuffle RNG state is not one random.Random gave ({type(exc).__name__}: "
            f"{exc}): load a state_dict() saved by this kind of stream"
        ) from exc
    return rng_state


def state_int(
    state: Mapping[str, Any], key: str, *, where: str = "state", optional: bool = False
) -> int | None:
    """``state[key]`` as an int >= 0 (None when ``optional`` and missing or None), else
    a ``SourceError`` naming the field."""
    value = state.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SourceError(
            f"{where}[{key!r}] is {value!r}, not a whole number >= 0: load a state_dict() "
            "saved by this kind of stream, unchanged"
        )
    return value


def check_state(
    state: Mapping[str, Any], *, version: int, kind: str | None, same: Mapping[str, Any]
) -> None:
    """Refuse a ``state_dict`` saved by another version, another kind of stream, or with
    other arguments (``same``: name -> this stream's value)."""
    if state.get("version") != version:
        raise SourceError(
            f"state version {state.get('version')!r} is not {version}: "
            "it was saved by another version of aiostream-hf"
        )
    if state.get("kind") != kind:
        raise SourceError(
            f"state is not a {_KIND_NAMES.get(kind, kind)} stream's (its 'kind' is "
            f"{state.get('kind')!r}): load it into the kind of stream that saved it"
        )
    for key, mine in same.items():
        if state.get(key) != mine:
            raise SourceError(
                f"state was saved with {key}={state.get(key)!r} but this stream has "
                f"{key}={mine!r}: resume with the same arguments"
            )
    state_int(state, "epoch")


def digest(identity: object) -> str:
    """A short name for what a stream reads, the same in every process and after JSON:
    the hash of ``identity`` (its arguments) as JSON."""
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- what a stream reads with --------------------------------------------------------------


@dataclass(frozen=True)
class Readers:
    """The client, resolver and fetcher one iteration of a stream reads with."""

    client: HubClient
    resolver: Resolver
    fetcher: RangeFetcher
    access: Access


@contextlib.asynccontextmanager
async def open_readers(
    options: StreamOptions,
    *,
    token: str | bool | None,
    endpoint: str | None,
    client: HubClient | None = None,
    access: Access | None = None,
) -> AsyncIterator[Readers]:
    """A resolver and a fetcher over ``client`` (else the event loop's shared one), both
    with one ``Access``: ``access`` if given, else found now from ``token``/``endpoint``
    and the environment (``find_access``). Every entry point gets its readers here, or,
    to keep them past one ``async with``, from ``make_readers``."""
    if access is None:
        access = await find_access(token, endpoint)
    async with use_client(client) as hub:
        readers = make_readers(options, access, hub)
        async with readers.resolver, readers.fetcher:
            yield readers


def make_readers(options: StreamOptions, access: Access, client: HubClient) -> Readers:
    """A resolver and a fetcher over ``client`` with ``access``, not yet entered: what
    ``open_readers`` enters, and what an owner that keeps them past one ``async with``
    (webdataset's gopen hook, per process) closes itself (``fetcher.aclose()``, then
    ``resolver.aclose()``)."""
    resolver = Resolver(options=options, client=client, access=access)
    return Readers(client, resolver, RangeFetcher(options, access=access, client=client), access)


#: The ``stream()`` arguments that resolution takes (the rest are the reading's).
RESOLVE_KEYS = ("config", "split", "data_files", "token", "endpoint")
_ACCESS_KEYS = ("token", "endpoint")  # of those, the ones the access is found from


def resolve_for_workers(
    source: Any, stream_kwargs: Mapping[str, Any]
) -> tuple[Manifest, dict[str, Any]]:
    """How a torch Dataset or a Ray datasource resolves once, in the process that builds
    it, for the workers or tasks that read: ``source`` resolved with the resolution
    arguments of ``stream_kwargs`` (through the sync bridge; a ``Manifest`` is kept as it
    is), and the arguments a worker's ``stream(manifest, ...)`` takes (the rest, with the
    token and endpoint, which the reads need too)."""
    from ._bridge import portal

    # The access is found once, here (from the arguments, else this process's
    # environment now), and handed to the workers as it is: a worker (a forked DataLoader
    # worker, a Ray task on another machine) reads with what the listing used, and looks
    # nothing up again (token False: none, on purpose).
    access = portal().call(find_access, stream_kwargs.get("token"), stream_kwargs.get("endpoint"))
    read_kwargs = {k: v for k, v in stream_kwargs.items() if k not in RESOLVE_KEYS}
    read_kwargs["token"] = access.token or False
    read_kwargs["endpoint"] = access.endpoint
    if isinstance(source, Manifest):
        if stream_kwargs.get("endpoint") is None and source.endpoint is not None:
            read_kwargs["endpoint"] = source.endpoint  # the Hub it was resolved at
        return source, read_kwargs
    options = stream_kwargs.get("options") or StreamOptions()
    resolve_kwargs = {
        k: stream_kwargs[k] for k in RESOLVE_KEYS if k in stream_kwargs and k not in _ACCESS_KEYS
    }
    return portal().call(_resolve_once, source, options, resolve_kwargs, access), read_kwargs


async def _resolve_once(
    source: Any, options: StreamOptions, kwargs: Mapping[str, Any], access: Access
) -> Manifest:
    async with open_readers(options, token=None, endpoint=None, access=access) as readers:
        return await readers.resolver.resolve(source, access=access, **kwargs)


@dataclass(frozen=True, kw_only=True)
class EngineStatistics:
    """What every stream reports of its reading (see each stream's own fields too).

    fetcher / resolver / client: the ``statistics()`` of the fetcher, resolver and
        client of the last iteration, as dicts (empty before the first).
    max_prefetched / max_prefetched_bytes: the most units, and bytes, held read ahead
        (Parquet row groups under ``block_size`` count as their share of a unit against
        ``prefetch_count``: up to four times as many of them).
    prefetch_window: the units that may be read ahead now: the readahead starts one
        unit (one file) ahead and grows by one per unit delivered, up to
        ``StreamOptions.prefetch_count`` (0 before the first iteration); in one of a
        DataLoader's N workers, it grows once N units are delivered.
    requests: this stream's requests by the Hub's rate-limit bucket: "api" (repo info,
        tree listings; an S3 listing), "resolvers" (a file's ``/resolve/`` URL, once
        per file) and "cdn" (the range reads and streamed bodies), and their "total".
    bytes_received: body bytes its reads received.
    stalls: where the time of the last iteration went (``Stalls``): how long the
        consumer waited for data, and on what (network, decode, the engine), or
        whether the consumer itself was the slower side (``Stalls.bottleneck``).
    """

    fetcher: Mapping[str, Any] = field(default_factory=dict)
    resolver: Mapping[str, Any] = field(default_factory=dict)
    client: Mapping[str, Any] = field(default_factory=dict)
    max_prefetched: int = 0
    max_prefetched_bytes: int = 0
    prefetch_window: int = 0
    requests: Mapping[str, int] = field(default_factory=lambda: bucket_requests({}, {}))
    bytes_received: int = 0
    stalls: Stalls = field(default_factory=Stalls)


def bucket_requests(fetcher: Mapping[str, Any], resolver: Mapping[str, Any]) -> dict[str, int]:
    """Requests by the Hub's rate-limit bucket, from a fetcher's and a resolver's
    statistics (as dicts): "api", "resolvers", "cdn" and their "total"."""
    kinds = fetcher.get("requests", {})
    api = int(resolver.get("api_requests", 0))
    resolvers = int(resolver.get("resolver_requests", 0)) + int(kinds.get("resolve", 0))
    cdn = int(kinds.get("range", 0)) + int(kinds.get("stream", 0))
    return {"api": api, "resolvers": resolvers, "cdn": cdn, "total": api + resolvers + cdn}


# -- the engine -----------------------------------------------------------------------------


class Engine(ABC, Generic[T]):
    """A lazy stream's life and iteration; subclasses give the units and their shaping.

    ``T`` is what ``_loaded_units`` yields (a loaded unit with where it sits).
    """

    _kind = "stream"  # for messages: "a Stream", "a LeRobot stream"
    _again = "make a new one"  # how to get a stream like it once it is closed

    def __init__(
        self,
        *,
        shuffle_buffer: int,
        seed: int,
        rank: int | None,
        world_size: int | None,
        options: StreamOptions | None,
        token: str | bool | None,
        endpoint: str | None,
        client: HubClient | None,
    ) -> None:
        """What every stream is given: its shuffle buffer (from ``shuffle_buffer_size``),
        seed, rank share (default: RANK/WORLD_SIZE), options, and how it reaches its
        source (token, endpoint, client)."""
        self._shuffle_buffer = shuffle_buffer
        self._seed = seed
        self._rank, self._world_size = rank_and_world(rank, world_size)
        self._options = options or StreamOptions()
        # Explicit values are checked now; the environment is read when an iteration
        # opens its readers (``open_readers``), so a later HF_TOKEN or HF_ENDPOINT counts.
        if token is not None and not isinstance(token, bool):
            check_token(token)
        self._token = token
        self._endpoint = None if endpoint is None else normalize_endpoint(endpoint)
        self._client = client
        self._epoch = 0
        self._closed = False
        self._tg: TaskGroup | None = None
        # The iterations not yet over, held weakly: a loop left (``break``) lets its
        # iteration go, and a new one may start; one still referenced is running.
        self._iterations: weakref.WeakSet[_Iteration[T]] = weakref.WeakSet()
        self._sync_loops: weakref.WeakSet[Generator[Any, None, None]] = weakref.WeakSet()
        self._sync_iterators: list[SyncIterator[Any]] = []
        self._started = 0.0
        self._first_sample: float | None = None
        self._clock: StageClock | None = None  # the running (or last) iteration's
        self._readers: Readers | None = None
        self._prefetch: Any = None  # the readahead of the running iteration
        self._left = 0  # samples of the unit being taken still to come (see _holds_more)

    # -- what a stream says ---------------------------------------------------------------

    @abstractmethod
    def _begin(self) -> Any:
        """An iteration starts (on the consumer's side): what its producer needs."""

    @abstractmethod
    def _loaded_units(self, begun: Any) -> AsyncGenerator[T, None]:
        """Resolve, plan, fetch and decode: loaded units in order (the producer's task)."""

    async def _attempts(self, begun: Any) -> AsyncGenerator[T, None]:
        """``_loaded_units(begun)``; run once more when it failed before loading a unit
        because the Hub no longer knows the commit of a pin shared through the resolution
        cache (``Resolver.forget_stale_pin``: a server restarted over a changed folder, a
        rewritten branch), so that the second run pins afresh. Once a unit is loaded an
        error stands: no iteration mixes two commits."""
        for last in (False, True):
            before = self._readers
            units = self._loaded_units(begun)
            loaded = False
            try:
                async for item in units:
                    loaded = True
                    yield item
                return
            except Exception as exc:
                readers = self._readers
                if last or loaded or readers is None or readers is before:
                    raise
                if not await readers.resolver.forget_stale_pin(exc):
                    raise
            finally:
                await units.aclose()  # on this task, which holds its scopes

    @abstractmethod
    def _shape_unit(self, loaded: T) -> Iterator[Any]:
        """The samples of one loaded unit; the cursor moves as each one is taken."""

    @abstractmethod
    def statistics(self) -> EngineStatistics:
        """What this stream did so far (a frozen record)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The exact position of this stream, as of the samples delivered (JSON-able)."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue, on the next iteration, exactly where ``state`` was taken."""

    def _shape_end(self) -> Iterator[Any]:
        """What is held when the units end (a last batch, a shuffle buffer)."""
        return iter(())

    def _holds_more(self) -> bool:
        """True when the running iteration holds at least one more sample to give (one of
        the unit being taken, ``_left``, which ``_shape_unit`` keeps), so that a
        mixture knows this stream has not ended without reading ahead of it. False
        when it cannot tell without reading."""
        return self._left > 0

    def _sample_shape(self) -> str | None:
        """None when each sample is one dict; else what one is (for a mixture's message)."""
        return None

    def _identity(self) -> str:
        """What this stream reads (``digest`` of its arguments), which a mixture's state
        names its members by. Subclasses add their source; this names the kind only."""
        return digest({"kind": type(self).__name__, "seed": self._seed})

    def _state_ended(self, state: Mapping[str, Any]) -> bool | None:
        """Whether ``state`` (loaded, checked) is of a stream at its end; None: unknown."""
        return None

    # -- reading --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _reading(
        self,
        options: StreamOptions,
        *,
        token: str | bool | None,
        endpoint: str | None,
        client: HubClient | None,
    ) -> AsyncIterator[Readers]:
        """The readers of one iteration; their statistics stay readable after it."""
        async with open_readers(options, token=token, endpoint=endpoint, client=client) as r:
            self._readers = r
            yield r

    @staticmethod
    def _ramp(bound: int) -> Ramp:
        """The readahead ramp of one iteration, to ``bound``: shared with the other
        DataLoader workers of this process's loader, if it is one (``Ramp``'s share)."""
        return Ramp(bound, share=loader_workers())

    async def _read_ahead(
        self,
        jobs: AsyncIterator[Job[R]],
        options: StreamOptions,
        ramp: Ramp | None = None,
        *,
        unit_bytes: int | None = None,
    ) -> AsyncGenerator[R, None]:
        """The results of ``jobs``, in order, run ahead within the options' budgets; the
        count ramps up from one (``ramp``, else a ramp of its own to ``prefetch_count``).
        ``unit_bytes``: a job costing less counts as its share of one (``Prefetcher``)."""
        ahead: Prefetcher[R] = Prefetcher(
            jobs,
            max_count=options.prefetch_count,
            max_bytes=options.prefetch_bytes,
            ramp=ramp if ramp is not None else self._ramp(options.prefetch_count),
            unit_bytes=unit_bytes,
        )
        self._prefetch = ahead
        async with ahead:
            async for result in ahead:
                yield result

    def _engine_statistics(self) -> dict[str, Any]:
        """The fields of ``EngineStatistics``, for a stream's ``statistics()``."""
        r = self._readers
        prefetch: PrefetchStatistics | None = (
            self._prefetch.statistics() if self._prefetch is not None else None
        )
        fetcher = asdict(r.fetcher.statistics()) if r is not None else {}
        resolver = asdict(r.resolver.statistics()) if r is not None else {}
        return {
            "fetcher": fetcher,
            "resolver": resolver,
            "client": asdict(r.client.statistics()) if r is not None else {},
            "max_prefetched": prefetch.max_held if prefetch else 0,
            "max_prefetched_bytes": prefetch.max_held_bytes if prefetch else 0,
            "prefetch_window": prefetch.window if prefetch else 0,
            "requests": bucket_requests(fetcher, resolver),
            "bytes_received": int(fetcher.get("bytes_received", 0)),
            "stalls": self._clock.stalls() if self._clock is not None else Stalls(),
        }

    # -- lifecycle ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError(f"this {self._kind} is closed: {self._again}")

    async def __aenter__(self: _E) -> _E:
        """Open the scope the stream's background tasks live in (``async with``)."""
        self._check_open()
        if self._tg is not None:
            raise UsageError(f"this {self._kind} is already open: enter `async with` once")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        await self.aclose()
        tg, self._tg = self._tg, None
        if tg is None:
            return None
        tg.cancel_scope.cancel()
        # The background tasks raise nothing (their errors reach the consumer through
        # the channel), so the user's own error leaves as it is, not in an ExceptionGroup.
        if e is None or isinstance(e, anyio.get_cancelled_exc_class()):
            return await tg.__aexit__(et, e, tb)
        await tg.__aexit__(None, None, None)
        return None

    async def aclose(self) -> None:
        """Stop every iteration of this stream; ``async with`` then waits for its tasks."""
        self._closed = True
        iterations, self._iterations = list(self._iterations), weakref.WeakSet()
        for it in iterations:
            it.close()

    def __aiter__(self) -> AsyncIterator[Any]:
        self._check_open()
        if self._tg is None:
            raise UsageError(
                f"a {self._kind} is iterated inside `async with`, which owns its background "
                "tasks: write `async with stream as s: async for sample in s: ...` "
                "(or iterate it synchronously with `for sample in s`)"
            )
        self._check_one_iteration()
        it: _Iteration[T] = _Iteration(self, self._tg)
        self._iterations.add(it)
        return it

    def __iter__(self) -> Iterator[Any]:
        """Sync iteration: the producer runs on the process's bridge thread; samples are
        shaped on the consumer's thread, so ``state_dict()`` is exact at every one."""
        self._check_open()
        self._check_one_iteration()
        loop = self._iterate_sync()
        self._sync_loops.add(loop)
        return loop

    def _check_one_iteration(self) -> None:
        """One iteration at a time: the position (cursor, shuffle buffer) is the stream's,
        so a second loop over it while the first runs would take samples from under it."""
        running = any(not it._closed for it in self._iterations) or any(
            inspect.getgeneratorstate(loop) != inspect.GEN_CLOSED for loop in self._sync_loops
        )
        if running:
            raise UsageError(running_message(f"this {self._kind}", self._again))

    def _iterate_sync(self) -> Generator[Any, None, None]:
        self._check_open()
        begun = self._begin()
        self._started = time.monotonic()
        self._left = 0
        clock = self._clock = StageClock()
        it: SyncIterator[T] = SyncIterator(lambda: metered(self._attempts(begun), clock), buffer=2)
        self._sync_iterators.append(it)
        try:
            while True:
                with clock.consumer_waiting():
                    loaded = next(it, _END)
                if loaded is _END:
                    break
                yield from self._shape_unit(loaded)
            yield from self._shape_end()
        finally:
            clock.end()
            it.close()
            if it in self._sync_iterators:
                self._sync_iterators.remove(it)

    def close(self) -> None:
        """Sync ``aclose()``: stop every sync iteration of this stream."""
        self._closed = True
        iterators, self._sync_iterators = self._sync_iterators, []
        for it in iterators:
            it.close()

    def __enter__(self: _E) -> _E:
        self._check_open()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def set_epoch(self, epoch: int) -> None:
        """Shuffle orders depend on (seed, epoch): call before each epoch's iteration."""
        self._epoch = epoch

    def _emit(self, sample: Any) -> Any:
        if self._first_sample is None:
            self._first_sample = time.monotonic() - self._started
        return sample


_END: Any = object()  # a sync iteration's units ended


class _Failure:
    """An error of the producer, handed to the consumer through the channel."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def running_message(what: str, again: str) -> str:
    """The error of a second loop started over a stream (or mixture) while one runs."""
    return (
        f"{what} is already being iterated: a second `async for` (or `for`) over it while "
        "the first has not ended would take samples from under the first. Iterate it one "
        "loop at a time (finish or leave the first loop, or close its iterator with "
        f"aclose()/close(), before starting another), or read it twice with two: {again}"
    )


async def _produce(
    engine: Engine[Any],
    send: MemoryObjectSendStream[Any],
    begun: Any,
    clock: StageClock,
    *,
    task_status: TaskStatus[anyio.CancelScope],
) -> None:
    """An iteration's producer: the loaded units of ``engine`` into ``send``, in order;
    an error is sent too, for the consumer to raise. ``clock`` times its stages."""
    with anyio.CancelScope() as scope:
        task_status.started(scope)
        async with send:
            units = metered(engine._attempts(begun), clock)
            try:
                try:
                    async for item in units:
                        await send.send(item)
                finally:
                    await units.aclose()  # on this task, which holds its scopes
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return  # the consumer is gone
            except Exception as exc:  # raised in the consumer, in order
                with contextlib.suppress(anyio.BrokenResourceError):
                    await send.send(_Failure(exc))


class _Iteration(Generic[T]):
    """One ``async for`` over a stream: a producer task in the stream's task group loads
    units into a bounded channel; ``__anext__`` shapes them into samples on the
    consumer's task. Nothing is held across the consumer's code but the channel: no
    cancel scope, task group or lock, so leaving the loop (``break``, an error in its
    body, a cancellation) at any point is clean; the stream's ``async with`` exit stops
    the producer and waits for its cleanup."""

    def __init__(self, engine: Engine[T], tg: TaskGroup) -> None:
        self._engine = engine
        self._tg = tg
        self._send: MemoryObjectSendStream[Any]
        self._receive: MemoryObjectReceiveStream[Any]
        self._send, self._receive = anyio.create_memory_object_stream[Any](_CHANNEL_UNITS)
        self._scope: anyio.CancelScope | None = None
        self._started = False
        self._closed = False
        self._samples: Iterator[Any] | None = None
        self._ended = False
        self._clock: StageClock | None = None

    def __aiter__(self) -> _Iteration[T]:
        return self

    async def __anext__(self) -> Any:
        engine = self._engine
        while True:
            if self._samples is not None:
                for sample in self._samples:
                    return sample
                self._samples = None
            if self._ended or self._closed:
                self.close()  # over: another iteration may start
                raise StopAsyncIteration
            if not self._started:
                self._started = True
                begun = engine._begin()
                engine._started = time.monotonic()
                engine._left = 0
                self._clock = engine._clock = StageClock()
                # Shielded: the producer reports its scope at once, before any wait; a
                # cancellation here would cancel it and end the iteration with nothing.
                # The producer holds the channel, not this iteration: a loop left
                # (``break``) lets it go at once, which closes the channel (``__del__``).
                with anyio.CancelScope(shield=True):
                    self._scope = await self._tg.start(
                        _produce, engine, self._send, begun, self._clock
                    )
            clock = self._clock
            assert clock is not None
            try:
                with clock.consumer_waiting():
                    item = await self._receive.receive()
            except anyio.EndOfStream:
                self._ended = True
                clock.end()
                self._samples = engine._shape_end()
                continue
            except anyio.ClosedResourceError:
                raise StopAsyncIteration from None
            if isinstance(item, _Failure):
                self.close()
                raise item.error
            self._samples = engine._shape_unit(item)

    def close(self) -> None:
        """Stop this iteration: its producer is cancelled, its channel closed."""
        if self._closed:
            return
        self._closed = True
        self._samples = None
        if self._clock is not None:
            self._clock.end()
        if self._scope is not None:
            self._scope.cancel()
        self._receive.close()
        if not self._started:
            self._send.close()

    async def aclose(self) -> None:
        self.close()

    def __del__(self) -> None:
        # Left without close() (``break`` out of the loop): the producer's next send
        # finds the channel closed and ends; the stream's exit waits for it.
        if not self._closed:
            self._closed = True
            if self._clock is not None:
                self._clock.end()
            self._receive.close()
            if not self._started:
                self._send.close()
