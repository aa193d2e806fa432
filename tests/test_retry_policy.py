"""One retry rule for every request: the resolver's API calls and the fetcher's reads
answer each status the same way (``_retry.retryable_status``), and each retry is a
one-line WARNING (unit tests: ``httpx2.MockTransport``)."""

from __future__ import annotations

import logging
from typing import Any

import httpx2
import pytest

from aiostream_hf import FetchError, ResolutionError, StreamOptions
from aiostream_hf._client import HubClient
from aiostream_hf._fetcher import RangeFetcher
from aiostream_hf._models import FileRef
from aiostream_hf._resolver import Resolver
from aiostream_hf._retry import retryable_status

HUB = "https://hub.test"
RETRIES = 2
#: status -> retried? (408, 429 and the 5xx but 501/505, which a retry cannot mend)
TABLE = {
    400: False,
    404: False,
    408: True,
    429: True,
    500: True,
    501: False,
    502: True,
    503: True,
    504: True,
    505: False,
    520: True,
}


def _options(tmp_path: Any) -> StreamOptions:
    return StreamOptions(
        max_retries=RETRIES,
        backoff_base=0.001,
        backoff_max=0.002,
        cache_dir=tmp_path,
        max_rate_limit_wait=5,
    )


def _always(status: int, seen: list[str]) -> httpx2.MockTransport:
    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.url.path)
        headers = {"Retry-After": "0"} if status == 429 else {}
        return httpx2.Response(status, headers=headers)

    return httpx2.MockTransport(handler)


@pytest.mark.parametrize("status", sorted(TABLE))
def test_the_rule(status: int) -> None:
    assert retryable_status(status) is TABLE[status]


@pytest.mark.parametrize("status", sorted(TABLE))
@pytest.mark.anyio
async def test_resolver_and_fetcher_answer_a_status_alike(status: int, tmp_path: Any) -> None:
    attempts = 1 + RETRIES if TABLE[status] else 1
    options = _options(tmp_path)

    api: list[str] = []
    async with (
        HubClient(transport=_always(status, api)) as client,
        Resolver(options=options, client=client) as resolver,
    ):
        with pytest.raises(ResolutionError) as resolved:
            await resolver.resolve("hf://datasets/org/name", token=False, endpoint=HUB)
    assert len(api) == attempts
    assert str(status) in str(resolved.value)

    reads: list[str] = []
    async with (
        HubClient(transport=_always(status, reads)) as client,
        RangeFetcher(options, endpoint=HUB, client=client) as fetcher,
    ):
        url = f"{HUB}/datasets/org/name/resolve/main/data.parquet"
        with pytest.raises(FetchError) as fetched:
            await fetcher.read(FileRef(url, "data.parquet", size=100), 0, 10)
    assert len(reads) == attempts
    assert str(status) in str(fetched.value)
    if TABLE[status]:
        assert f"after {attempts} attempts" in str(resolved.value)
        assert f"gave up after {attempts} attempts" in str(fetched.value)


@pytest.mark.anyio
async def test_each_retry_is_a_warning_line(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aiostream_hf")
    seen: list[str] = []
    async with (
        HubClient(transport=_always(503, seen)) as client,
        Resolver(options=_options(tmp_path), client=client) as resolver,
    ):
        with pytest.raises(ResolutionError):
            await resolver.resolve("hf://datasets/org/name", token=False, endpoint=HUB)
    lines = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    # Two retries in quick succession to one host: the first is logged, the second is
    # counted into the next line (at most one line per host every 5 s).
    assert len(lines) == 1
    assert "HTTP 503; retry 1 of 2" in lines[0]
    assert "hub.test" in lines[0]
