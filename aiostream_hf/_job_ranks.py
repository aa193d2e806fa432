"""One resolution per job under torch.distributed: rank 0 resolves, every rank gets its
manifest (``resolve_for_ranks``; the checks and the machine's cache: ``_job_manifest``),
or a LeRobot dataset's metadata (``metadata_for_ranks``). Above ``_engine``, which
resolves for a process's DataLoader workers, and ``lerobot``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

from ._access import find_access
from ._bridge import portal
from ._engine import resolve_for_workers
from ._exceptions import ResolutionError, SourceError
from ._hub_layout import _bad_input, _sanitize_data_files, _short
from ._job_manifest import check_entry, make_entry, request_key, seed_machine_cache, shareable
from ._models import Manifest
from ._options import StreamOptions
from ._sources import HubSource, Source, parse_sources
from .lerobot import LeRobotMetadata, LeRobotStream

__all__ = ["Broadcast", "metadata_for_ranks", "resolve_for_ranks"]


class Broadcast(Protocol):
    """How the ranks of a job talk: ``torch.distributed`` in ``aiostream_hf.torch``."""

    rank: int
    world: int

    def __call__(self, payload: Any) -> Any:
        """Rank 0's ``payload``, on every rank (rank 0 gives it, the others None)."""


def _from_rank_0(broadcast: Broadcast, compute: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any]:
    """On rank 0: ``compute()`` gives (payload, value); the payload is broadcast, and an
    error broadcast (then raised) in its place. On the other ranks: (rank 0's payload,
    None), or rank 0's error raised, of the same kind (``SourceError`` for bad input)."""
    if broadcast.rank == 0:
        try:
            payload, value = compute()
        except Exception as exc:
            kind = "SourceError" if isinstance(exc, SourceError) else "ResolutionError"
            broadcast({"error": f"{type(exc).__name__}: {exc}", "kind": kind})
            raise
        broadcast(payload)
        return payload, value
    received = broadcast(None)
    if isinstance(received, dict) and "error" in received:
        error = SourceError if received.get("kind") == "SourceError" else ResolutionError
        raise error(f"rank 0 could not resolve, so no rank can: {_short(received['error'], 2000)}")
    return received, None


_SKIP = {"skip": True}  # rank 0: this source is not shared; every rank resolves its own
_SAME = (
    "build the same dataset (source, config, split, data_files, token, endpoint) "
    "on every rank, in the same order, and run the same aiostream-hf everywhere"
)


def resolve_for_ranks(
    source: Any, stream_kwargs: Mapping[str, Any], broadcast: Broadcast | None
) -> tuple[Manifest, dict[str, Any]]:
    """``_engine.resolve_for_workers`` once per job: rank 0 resolves and ``broadcast``
    hands its manifest to every other rank, which checks it against its own request
    (every rank must build the same dataset, in the same order, as for any collective)
    and keeps it in its machine's cache. A rank 0 that fails sends its error, which every
    rank raises. Without ``broadcast`` (no process group, or one rank) each process
    resolves as before. Sources that are not shared (``shareable``) are resolved by each
    rank, after the broadcast has said so."""
    if broadcast is None or broadcast.world <= 1:
        return resolve_for_workers(source, stream_kwargs)

    def resolve() -> tuple[Any, Any]:
        request = _request_of(source, stream_kwargs)
        if request is None:
            return _SKIP, None
        resolved = resolve_for_workers(source, stream_kwargs)
        payload = make_entry(request[1], resolved[0])
        check_entry(payload, request[1], "made by rank 0", _SAME)  # as the ranks will
        return payload, resolved

    received, resolved = _from_rank_0(broadcast, resolve)
    if received == _SKIP:
        return resolve_for_workers(source, stream_kwargs)
    if resolved is not None:  # rank 0
        return cast("tuple[Manifest, dict[str, Any]]", resolved)
    request = _request_of(source, stream_kwargs)
    if request is None:
        raise SourceError(
            f"rank 0 resolved Hub sources for the job, but this rank builds its dataset "
            f"from {_short(source)}: {_SAME}"
        )
    sources, key, options = request
    try:
        manifest = check_entry(received, key, "broadcast by rank 0", _SAME)
    except ResolutionError as exc:
        raise SourceError(str(exc)) from None
    seed_machine_cache(options, sources, key, manifest)
    return resolve_for_workers(manifest, stream_kwargs)


def metadata_for_ranks(probe: LeRobotStream, broadcast: Broadcast | None) -> LeRobotMetadata:
    """A LeRobot dataset's metadata (``meta/``), read once per job: by rank 0, then
    broadcast (a pickled ``LeRobotMetadata``: the ranks of a job trust each other, as
    torch.distributed does). A Hub dataset only; a local or S3 one is read by each rank.
    ``probe`` is the stream each rank made from the dataset's arguments: it gets the
    metadata too."""
    if broadcast is None or broadcast.world <= 1:
        return portal().call(probe.load_metadata)

    def load() -> tuple[Any, Any]:
        key = _lerobot_key(probe)
        if key is None:
            return _SKIP, None
        meta = portal().call(probe.load_metadata)
        return {"key": key, "metadata": meta}, meta

    received, meta = _from_rank_0(broadcast, load)
    if received == _SKIP:
        return portal().call(probe.load_metadata)
    if meta is not None:  # rank 0
        return cast(LeRobotMetadata, meta)
    key = _lerobot_key(probe)
    if (
        not isinstance(received, dict)
        or received.get("key") != key
        or not isinstance(received.get("metadata"), LeRobotMetadata)
    ):
        other = received.get("key") if isinstance(received, dict) else None
        raise SourceError(
            f"rank 0 read the metadata of {_short(other)}, but this rank asks for "
            f"{_short(key)}: {_SAME}"
        )
    probe._meta = received["metadata"]
    return probe._meta


def _lerobot_key(probe: LeRobotStream) -> dict[str, Any] | None:
    """What a LeRobot dataset's metadata answers (None when the job does not share it)."""
    source = probe._source
    if not isinstance(source, HubSource):
        return None
    access = portal().call(find_access, probe._token, probe._endpoint)
    return {"source": source.uri, "endpoint": access.endpoint, "identity": access.identity}


def _request_of(
    source: Any, stream_kwargs: Mapping[str, Any]
) -> tuple[Sequence[Source], dict[str, Any], StreamOptions] | None:
    """The sources, request key and options of a dataset's arguments; None when they are
    not shared by the job (a Manifest, files, URLs, buckets)."""
    if isinstance(source, Manifest):
        return None
    sources = parse_sources(source)
    if not shareable(sources):
        return None
    access = portal().call(find_access, stream_kwargs.get("token"), stream_kwargs.get("endpoint"))
    data_files = stream_kwargs.get("data_files")
    patterns = None if data_files is None else _sanitize_data_files(data_files, _bad_input)
    config, split = stream_kwargs.get("config"), stream_kwargs.get("split")
    key = request_key(sources, config, split, patterns, access)
    return sources, key, stream_kwargs.get("options") or StreamOptions()
