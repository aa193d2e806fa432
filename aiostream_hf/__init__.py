"""aiostream-hf: asyncio-first streaming of datasets from the Hugging Face Hub and HTTP stores."""

from .__version__ import __version__ as __version__
from ._exceptions import AiostreamError as AiostreamError

__all__ = ["AiostreamError", "__version__"]
