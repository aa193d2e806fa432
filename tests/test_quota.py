"""Rate-limit quotas shared by the processes of a machine (``_quota.SharedQuota``).

The count itself is plain synchronous code, tested with explicit clock values; two
``SharedQuota`` objects over one folder stand for two processes. The client is tested
with an ``httpx2.MockTransport`` server that keeps a fixed-window quota as the Hub does;
several worker processes against the real local Hub server are in
``test_quota_processes.py``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace

import anyio
import httpx2
import pytest

import aiostream_hf as ash
from aiostream_hf._fetcher import RangeFetcher
from aiostream_hf._models import FileRef
from aiostream_hf._quota import GO, LOCK_POLL_S, PROBE, Pacing, SharedQuota, bucket_of

HUB = "http://hub.test"
SHA = "a" * 40


def _key(tmp_path: Path, token: str | None = None) -> Path:
    return SharedQuota.key(Pacing(tmp_path), "hub.test:80", "resolvers", token)


def test_two_processes_spend_one_quota_exactly(tmp_path: Path) -> None:
    a, b = SharedQuota(), SharedQuota()
    key = _key(tmp_path)
    assert a.take(key, 0, 100.0) == (PROBE, 100.0)  # nothing known: one request goes first
    kind, _ = b.take(key, 0, 100.0)
    assert kind == "poll"  # the other process waits for its answer
    a.learn(key, remaining=5, reset=30, sent_at=100.0, now=100.1)
    kinds = [q.take(key, 0, 101.0)[0] for q in (a, b, a, b, a, b, a)]
    assert kinds == [GO] * 5 + ["wait", "wait"]
    assert b.take(key, 0, 101.0) == ("wait", 130.1)  # until the window's end
    a.close()
    b.close()


def test_an_answer_lowers_the_count_and_never_raises_it(tmp_path: Path) -> None:
    q = SharedQuota()
    key = _key(tmp_path)
    q.take(key, 0, 0.0)
    q.learn(key, remaining=10, reset=60, sent_at=0.0, now=0.1)
    for _ in range(4):
        assert q.take(key, 0, 1.0)[0] == GO  # 6 left here
    q.learn(key, remaining=8, reset=59, sent_at=0.5, now=1.1)  # sent before the 4: 6 stays
    q.learn(key, remaining=2, reset=59, sent_at=0.9, now=1.2)  # others spent some: 2
    assert [q.take(key, 0, 2.0)[0] for _ in range(3)] == [GO, GO, "wait"]


def test_the_reserve_is_left_unused(tmp_path: Path) -> None:
    q = SharedQuota()
    key = _key(tmp_path)
    q.take(key, 3, 0.0)
    q.learn(key, remaining=5, reset=60, sent_at=0.0, now=0.1)
    assert [q.take(key, 3, 1.0)[0] for _ in range(3)] == [GO, GO, "wait"]


def test_a_new_window_is_opened_by_one_probe_and_old_answers_are_ignored(
    tmp_path: Path,
) -> None:
    q = SharedQuota()
    key = _key(tmp_path)
    q.take(key, 0, 0.0)
    q.learn(key, remaining=1, reset=10, sent_at=0.0, now=0.1)
    assert q.take(key, 0, 5.0)[0] == GO  # the last one of the window, sent at 5.0
    assert q.take(key, 0, 20.0) == (PROBE, 20.0)  # the window ended
    assert q.take(key, 0, 20.0)[0] == "poll"
    q.learn(key, remaining=9, reset=10, sent_at=20.0, now=20.1)
    q.learn(key, remaining=0, reset=1, sent_at=5.0, now=20.2)  # late, from the old window
    assert [q.take(key, 0, 21.0)[0] for _ in range(10)] == [GO] * 9 + ["wait"]


def test_a_probe_that_learned_nothing_lets_the_next_request_probe(tmp_path: Path) -> None:
    q = SharedQuota()
    key = _key(tmp_path)
    assert q.take(key, 0, 0.0)[0] == PROBE
    assert q.take(key, 0, 0.0)[0] == "poll"
    q.probe_ended(key)
    assert q.take(key, 0, 0.0)[0] == PROBE
    q.unlimited(key, sent_at=0.0)  # answered without RateLimit: no quota
    assert {q.take(key, 0, 1.0)[0] for _ in range(100)} == {GO}


def test_a_count_file_locked_too_long_is_counted_in_this_process_from_its_last_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process stopped while holding the lock: the wait ends after
    LOCK_TIMEOUT_S with a warning, and this process goes on counting from the file's
    last count (the quota it knows is left), never waiting forever."""
    import fcntl

    import aiostream_hf._quota

    monkeypatch.setattr(aiostream_hf._quota, "LOCK_TIMEOUT_S", 0.05)
    clock = [100.0]
    monkeypatch.setattr(aiostream_hf._quota, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    a, b = SharedQuota(), SharedQuota()
    key = _key(tmp_path)
    assert a.take(key, 0, 0.0) == (PROBE, 0.0)
    a.learn(key, remaining=3, reset=60, sent_at=0.0, now=0.1)
    assert b.take(key, 0, 1.0)[0] == GO  # 2 left
    stuck = open(key, "rb")  # noqa: SIM115 - another process's descriptor, held locked
    fcntl.flock(stuck.fileno(), fcntl.LOCK_EX)
    try:
        with caplog.at_level("WARNING", logger="aiostream_hf"):
            # The lock is not waited for: "poll" (look again soon) until it has been
            # held LOCK_TIMEOUT_S, on the module's monotonic clock.
            assert b.take(key, 0, 2.0) == ("poll", 2.0 + LOCK_POLL_S)
            clock[0] += 0.04
            assert b.take(key, 0, 2.0)[0] == "poll"
            assert "locked" not in caplog.text
            clock[0] += 0.02
            kinds = [b.take(key, 0, 2.0)[0] for _ in range(3)]
        assert kinds == [GO, GO, "wait"]  # the file's 2, then the window's end
        assert "locked by another process" in caplog.text
        assert str(key) in caplog.text
        assert len([r for r in caplog.records if "locked" in r.getMessage()]) == 1
    finally:
        stuck.close()
    a.close()
    b.close()


def test_a_locked_count_is_never_waited_for_and_answers_are_applied_once_it_is_free(
    tmp_path: Path,
) -> None:
    """While another process holds the count file (for microseconds, normally), a
    request looks again later ("poll") instead of blocking the event loop, and what an
    answer taught meanwhile is applied at the next lock this process takes, first."""
    import fcntl

    a, b = SharedQuota(), SharedQuota()
    key = _key(tmp_path)
    assert a.take(key, 0, 0.0) == (PROBE, 0.0)
    other = open(key, "rb")  # noqa: SIM115 - another process's descriptor
    fcntl.flock(other.fileno(), fcntl.LOCK_EX)
    try:
        assert a.take(key, 0, 1.0)[0] == "poll"  # the default LOCK_TIMEOUT_S is 1 s
        a.learn(key, remaining=2, reset=60, sent_at=0.0, now=0.1)  # not written yet
        assert b.take(key, 0, 1.0)[0] == "poll"
    finally:
        fcntl.flock(other.fileno(), fcntl.LOCK_UN)
        other.close()
    # The answer reaches the file with a's next take, before that take's own decision.
    assert a.take(key, 0, 1.0)[0] == GO
    assert [b.take(key, 0, 1.0)[0] for _ in range(2)] == [GO, "wait"]
    a.close()
    b.close()


def test_an_answer_deferred_at_close_is_written_if_the_count_is_free(tmp_path: Path) -> None:
    import fcntl

    a, b = SharedQuota(), SharedQuota()
    key = _key(tmp_path)
    assert a.take(key, 0, 0.0) == (PROBE, 0.0)
    other = open(key, "rb")  # noqa: SIM115 - another process's descriptor
    fcntl.flock(other.fileno(), fcntl.LOCK_EX)
    a.learn(key, remaining=1, reset=60, sent_at=0.0, now=0.1)
    fcntl.flock(other.fileno(), fcntl.LOCK_UN)
    other.close()
    a.close()
    assert [b.take(key, 0, 1.0)[0] for _ in range(2)] == [GO, "wait"]
    b.close()


def test_quotas_are_kept_per_token_and_per_folder(tmp_path: Path) -> None:
    keys = {
        _key(tmp_path),
        _key(tmp_path, "hf_one"),
        _key(tmp_path, "hf_two"),
        _key(tmp_path / "other"),
        SharedQuota.key(Pacing(tmp_path), "hub.test:80", "api", None),
    }
    assert len(keys) == 5
    assert all("hf_" not in str(k) for k in keys)  # no token in a file name
    assert bucket_of("/api/datasets/org/name/tree/main") == "api"
    assert bucket_of(f"/datasets/org/name/resolve/{SHA}/a.parquet") == "resolvers"
    assert bucket_of("/cdn/a.parquet") == ""


# -- the client, against a server that keeps the Hub's fixed-window quota ---------------------


class _QuotaServer:
    """A fake Hub: ``quota`` /resolve/ requests per ``window`` seconds (counted from the
    window's first request, as the Hub does), RateLimit on every answer, a 429 past it."""

    def __init__(self, quota: int, window: float) -> None:
        self.quota, self.window = quota, window
        self.start = -math.inf
        self.used = 0
        self.served: list[str] = []
        self.refused = 0

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        await anyio.sleep(0.005)  # a round trip: requests of both clients overlap
        now = time.monotonic()
        if now - self.start >= self.window:
            self.start, self.used = now, 0
        reset = f"{self.start + self.window - now:.3f}"
        if self.used >= self.quota:
            self.refused += 1
            header = f'"resolvers";r=0;t={reset}'
            return httpx2.Response(429, headers={"RateLimit": header, "Retry-After": reset})
        self.used += 1
        self.served.append(request.url.path)
        header = f'"resolvers";r={self.quota - self.used};t={reset}'
        return httpx2.Response(
            206, content=b"data", headers={"Content-Range": "bytes 0-3/4", "RateLimit": header}
        )


def _ref(i: int) -> FileRef:
    return FileRef(url=f"{HUB}/datasets/org/name/resolve/{SHA}/f{i:03d}.bin", path=f"{i}", size=4)


@pytest.mark.anyio
async def test_two_clients_sharing_a_folder_stay_within_the_quota(tmp_path: Path) -> None:
    """Two fetchers with their own clients (two processes' worth) read 24 files, 8 at a
    time each, through a quota of 5 per 0.3 s: no 429, every file read once."""
    server = _QuotaServer(quota=5, window=0.3)
    options = ash.StreamOptions(cache_dir=tmp_path, max_concurrency=8, backoff_base=0.001)
    got: dict[int, bytes] = {}

    async def reader(files: range) -> None:
        async with RangeFetcher(
            options, endpoint=HUB, transport=httpx2.MockTransport(server)
        ) as fetcher:
            async with anyio.create_task_group() as tg:
                for i in files:

                    async def read(i: int = i) -> None:
                        got[i] = await fetcher.read(_ref(i), 0, 4)

                    tg.start_soon(read)
            stats = fetcher.client.statistics()
        assert stats.throttled == 0
        assert stats.paced > 0  # it waited for the window's reset

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader, range(0, 12))
        tg.start_soon(reader, range(12, 24))
    assert server.refused == 0
    assert sorted(server.served) == sorted(_ref(i).url.removeprefix(HUB) for i in range(24))
    assert got == dict.fromkeys(range(24), b"data")


@pytest.mark.anyio
async def test_without_a_shared_folder_the_same_two_clients_run_into_429s(
    tmp_path: Path,
) -> None:
    """The control: each client counting alone (folders of their own) overshoots."""
    server = _QuotaServer(quota=5, window=0.3)

    async def reader(files: range, folder: Path) -> None:
        options = ash.StreamOptions(cache_dir=folder, max_concurrency=8, backoff_base=0.001)
        async with (
            RangeFetcher(options, endpoint=HUB, transport=httpx2.MockTransport(server)) as fetcher,
            anyio.create_task_group() as tg,
        ):
            for i in files:
                tg.start_soon(fetcher.read, _ref(i), 0, 4)

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader, range(0, 12), tmp_path / "a")
        tg.start_soon(reader, range(12, 24), tmp_path / "b")
    assert server.refused > 0


@pytest.mark.anyio
async def test_a_spent_quota_past_max_rate_limit_wait_fails_at_once(tmp_path: Path) -> None:
    server = _QuotaServer(quota=1, window=3600)
    options = ash.StreamOptions(cache_dir=tmp_path, max_rate_limit_wait=5.0)
    async with RangeFetcher(options, endpoint=HUB, transport=httpx2.MockTransport(server)) as f:
        assert await f.read(_ref(0), 0, 4) == b"data"
        with pytest.raises(ash.RateLimitedError, match="quota of hub.test:80 is spent") as info:
            await f.read(_ref(1), 0, 4)
    assert info.value.resume_at is not None
    # The window is counted at most MAX_SERVER_DELAY_S (300 s) ahead, not its 3600 s: one
    # answer must not block the machine's later processes for longer (a probe then asks).
    assert time.time() + 250 < info.value.resume_at < time.time() + 310
    assert (server.refused, len(server.served)) == (0, 1)  # refused here, not by the server


@pytest.mark.anyio
async def test_a_server_without_ratelimit_headers_is_not_paced(tmp_path: Path) -> None:
    async def plain(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(206, content=b"data", headers={"Content-Range": "bytes 0-3/4"})

    options = ash.StreamOptions(cache_dir=tmp_path, max_concurrency=8)
    async with RangeFetcher(options, endpoint=HUB, transport=httpx2.MockTransport(plain)) as f:
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(f.read, _ref(i), 0, 4)
        stats = f.client.statistics()
    assert (stats.paced, stats.requests) == (0, 20)
