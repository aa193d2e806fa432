from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

# Nothing in the test suite may reach the internet. huggingface_hub and datasets
# read these at import; tests that need the Hub point them at the local server.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"  # discard port: a stray real-Hub call fails


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``torch`` skip without torch, and fail in CI (AIOSTREAM_REQUIRE_TORCH=1)."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        reason = f"needs torch ({exc}); install with pip install torch==2.13.0"
        required = os.environ.get("AIOSTREAM_REQUIRE_TORCH") == "1"
        needing = [item for item in items if item.get_closest_marker("torch") is not None]
        if needing and required:
            raise pytest.UsageError(f"{len(needing)} tests {reason}, and CI requires them") from exc
        for item in needing:
            item.add_marker(pytest.mark.skip(reason=reason))


# anyio means asyncio and trio: every async test runs on both. AIOSTREAM_ANYIO_BACKENDS
# (comma-separated) narrows it for a quick local run; CI leaves it unset.
_BACKENDS = os.environ.get("AIOSTREAM_ANYIO_BACKENDS", "asyncio,trio").split(",")


@pytest.fixture(params=_BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def _no_internet(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail any connection to a non-loopback address."""
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> object:
        host = address[0] if isinstance(address, tuple) else None
        if isinstance(host, str) and not (host.startswith("127.") or host in ("localhost", "::1")):
            raise OSError(f"test tried to reach {address!r}: tests stay on loopback")
        return real_connect(self, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", guarded)
    return
