"""aiostream-hf: asyncio-first streaming of datasets from the Hugging Face Hub and HTTP stores."""

from typing import TYPE_CHECKING, Any

from . import webdataset as webdataset
from .__version__ import __version__ as __version__
from ._client import ClientStatistics as ClientStatistics
from ._client import HubClient as HubClient
from ._elastic import merge_states as merge_states
from ._exceptions import AccessDeniedError as AccessDeniedError
from ._exceptions import AiostreamError as AiostreamError
from ._exceptions import ClosedResourceError as ClosedResourceError
from ._exceptions import ConfigNotFoundError as ConfigNotFoundError
from ._exceptions import DecodeError as DecodeError
from ._exceptions import EntryNotFoundError as EntryNotFoundError
from ._exceptions import FetchError as FetchError
from ._exceptions import FileChangedError as FileChangedError
from ._exceptions import FrameTimestampError as FrameTimestampError
from ._exceptions import GatedRepoError as GatedRepoError
from ._exceptions import HubServerError as HubServerError
from ._exceptions import RangeMismatchError as RangeMismatchError
from ._exceptions import RateLimitedError as RateLimitedError
from ._exceptions import RepoNotFoundError as RepoNotFoundError
from ._exceptions import ResolutionError as ResolutionError
from ._exceptions import RetriesExhaustedError as RetriesExhaustedError
from ._exceptions import RevisionNotFoundError as RevisionNotFoundError
from ._exceptions import SourceError as SourceError
from ._exceptions import SplitNotFoundError as SplitNotFoundError
from ._exceptions import UnreachableError as UnreachableError
from ._exceptions import UsageError as UsageError
from ._interleave import Interleaved as Interleaved
from ._mix import Mix as Mix
from ._mix import MixStatistics as MixStatistics
from ._mix import mix as mix
from ._models import FileRef as FileRef
from ._models import Manifest as Manifest
from ._options import StreamOptions as StreamOptions
from ._stalls import Stalls as Stalls
from ._stream import Stream as Stream
from ._stream import StreamStatistics as StreamStatistics
from ._stream import stream as stream

__all__ = [
    "AccessDeniedError",
    "AiostreamError",
    "ClientStatistics",
    "ClosedResourceError",
    "ConfigNotFoundError",
    "DecodeError",
    "EntryNotFoundError",
    "FetchError",
    "FileChangedError",
    "FileRef",
    "FrameTimestampError",
    "GatedRepoError",
    "HubClient",
    "HubServerError",
    "Interleaved",
    "Manifest",
    "Mix",
    "MixStatistics",
    "RangeMismatchError",
    "RateLimitedError",
    "RepoNotFoundError",
    "ResolutionError",
    "RetriesExhaustedError",
    "RevisionNotFoundError",
    "SourceError",
    "SplitNotFoundError",
    "Stalls",
    "Stream",
    "StreamOptions",
    "StreamStatistics",
    "UnreachableError",
    "UsageError",
    "__version__",
    "lerobot",
    "merge_states",
    "mix",
    "stream",
    "video",
    "webdataset",
]

if TYPE_CHECKING:
    from . import lerobot as lerobot
    from . import video as video

_LAZY = {"lerobot": "aiostream_hf.lerobot", "video": "aiostream_hf.video"}


def __getattr__(name: str) -> Any:
    # video and lerobot load PyAV (~16 MiB, ~50 ms): only when first used.
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        globals()[name] = module
        return module
    raise AttributeError(f"module 'aiostream_hf' has no attribute {name!r}")
