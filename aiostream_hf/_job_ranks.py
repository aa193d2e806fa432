"""One resolution per job under torch.distributed: rank 0 resolves, every rank gets its
manifest (``resolve_for_ranks``; the checks and the machine's cache: ``_job_manifest``).
Above ``_engine``, which resolves for a process's DataLoader workers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ._access import find_access
from ._bridge import portal
from ._engine import resolve_for_workers
from ._exceptions import ResolutionError, SourceError
from ._hub_layout import _bad_input, _sanitize_data_files, _short
from ._job_manifest import check_entry, make_entry, request_key, seed_machine_cache, shareable
from ._models import Manifest
from ._options import StreamOptions
from ._sources import Source, parse_sources

__all__ = ["Broadcast", "resolve_for_ranks"]


class Broadcast(Protocol):
    """How the ranks of a job talk: ``torch.distributed`` in ``aiostream_hf.torch``."""

    rank: int
    world: int

    def __call__(self, payload: Any) -> Any:
        """Rank 0's ``payload``, on every rank (rank 0 gives it, the others None)."""


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
    if broadcast.rank == 0:
        try:
            request = _request_of(source, stream_kwargs)
            if request is not None:
                manifest, read_kwargs = resolve_for_workers(source, stream_kwargs)
                payload: dict[str, Any] = make_entry(request[1], manifest)
                check_entry(payload, request[1], "made by rank 0")  # as the ranks will
            else:
                payload = {"skip": True}
        except Exception as exc:
            kind = "SourceError" if isinstance(exc, SourceError) else "ResolutionError"
            broadcast({"error": f"{type(exc).__name__}: {exc}", "kind": kind})
            raise
        broadcast(payload)
        if request is None:
            return resolve_for_workers(source, stream_kwargs)
        return manifest, read_kwargs
    received = broadcast(None)
    if isinstance(received, dict) and "error" in received:
        error = SourceError if received.get("kind") == "SourceError" else ResolutionError
        raise error(
            f"rank 0 could not resolve {_short(source)}, so no rank can: "
            f"{_short(received['error'], 2000)}"
        )
    if received == {"skip": True}:
        return resolve_for_workers(source, stream_kwargs)
    request = _request_of(source, stream_kwargs)
    if request is None:
        raise SourceError(
            f"rank 0 resolved Hub sources for the job, but this rank builds its dataset "
            f"from {_short(source)}: build the same dataset on every rank, in the same order"
        )
    sources, key, options = request
    way_out = (
        "build the same dataset (source, config, split, data_files, token, endpoint) "
        "on every rank, in the same order, and run the same aiostream-hf everywhere"
    )
    try:
        manifest = check_entry(received, key, "broadcast by rank 0", way_out)
    except ResolutionError as exc:
        raise SourceError(str(exc)) from None
    seed_machine_cache(options, sources, key, manifest)
    return resolve_for_workers(manifest, stream_kwargs)


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
