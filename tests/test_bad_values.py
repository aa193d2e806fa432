"""Bad values given by a user get one library error naming them (issue 31): every
``StreamOptions`` field, a token from each place it can come from, URLs with credentials
in messages, ``mix()`` weights too large for a float."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import aiostream_hf as ash
from aiostream_hf import StreamOptions
from aiostream_hf._exceptions import display_url
from aiostream_hf.testing import make_text_parquet

NAN, INF = math.nan, math.inf
COUNT = [NAN, INF, -1, 1.5, 2.0, True, "4", None]
SECONDS = [NAN, INF, -INF, -1, True, "4", None]
FLAG = [1, 0, "yes", None]
TEXT = [5, b"x", ["x"]]

#: For every field of StreamOptions, values that must be refused. A new option fails
#: ``test_every_option_has_bad_values`` until it is given a row here (and a check).
BAD: dict[str, list[Any]] = {
    "max_concurrency": [*COUNT, 0],
    "block_size": [*COUNT, 0],
    "max_range_size": [*COUNT, 0],
    "coalesce_gap": COUNT,
    "prefetch_bytes": [*COUNT, 0],
    "prefetch_count": [*COUNT, 0],
    "max_whole_video_bytes": [*COUNT, 0],
    "kept_video_bytes": COUNT,
    "max_retries": COUNT,
    "backoff_base": SECONDS,
    "backoff_max": [*SECONDS, 0],
    "timeout": [*SECONDS, 0],
    "min_throughput": SECONDS,
    "max_rate_limit_wait": SECONDS,
    "rate_limit_reserve": COUNT,
    "cache_dir": [5, 1.5, True, b"/tmp"],
    "pin_ttl": SECONDS,
    "manifest_dir": [5, 1.5, True, b"/tmp"],
    "byte_cache_bytes": COUNT,
    "byte_cache_dir": [5, 1.5, True, b"/tmp"],
    "verify_checksums": FLAG,
    "elastic": FLAG,
    "slice_bytes": [*COUNT, 0],
    "shuffle_units": [*COUNT, 0],
    "s3_endpoint_url": TEXT,
    "s3_region": TEXT,
    "s3_anonymous": FLAG,
    "s3_credentials": ["AKID:secret", {"aws_access_key_id": "AKID"}, {"x": "y"}],
    "s3_addressing": ["dns", 5, None, ["path"]],
}


def test_every_option_has_bad_values() -> None:
    assert set(BAD) == {f.name for f in dataclasses.fields(StreamOptions)}


@pytest.mark.parametrize(
    ("name", "value"), [(name, value) for name, values in BAD.items() for value in values]
)
def test_a_bad_option_is_refused_naming_it(name: str, value: Any) -> None:
    with pytest.raises(ash.SourceError, match=rf"StreamOptions[.:] ?{name}"):
        StreamOptions(**{name: value})


def test_the_defaults_and_plain_good_values_construct(tmp_path: Path) -> None:
    default = StreamOptions()
    for f in dataclasses.fields(StreamOptions):
        assert StreamOptions(**{f.name: getattr(default, f.name)}) == default
    StreamOptions(
        max_concurrency=1,
        coalesce_gap=0,
        max_retries=0,
        timeout=1,
        backoff_base=0,
        min_throughput=0,
        pin_ttl=0.0,
        cache_dir=str(tmp_path),
        s3_endpoint_url="http://127.0.0.1:9000",
        s3_region="eu-west-1",
        s3_addressing="path",
    )
    assert StreamOptions(cache_dir=tmp_path).resolved_cache_dir() == tmp_path


# -- mix() weights -------------------------------------------------------------------------


def test_a_weight_too_large_for_a_float_is_named(tmp_path: Path) -> None:
    paths = [tmp_path / f"{i}.parquet" for i in range(2)]
    for i, path in enumerate(paths):
        make_text_parquet(path, rows=4, seed=i)
    members = [ash.stream(str(p)) for p in paths]
    with pytest.raises(ash.SourceError, match=r"weights\[0\] is too large for a float"):
        ash.mix(members, [10**400, 1])


# -- credentials in URLs -------------------------------------------------------------------

SECRET = "pa55w0rd-secret"
#: A port nothing listens on: connections are refused at once.
DEAD = f"http://reader:{SECRET}@127.0.0.1:9"


async def _drain(s: ash.Stream) -> None:
    async with s:
        async for _ in s:
            pass


def _sources(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    quick = {"max_retries": 1, "cache_dir": None}
    return {
        "s3_endpoint_url": lambda: ash.stream(
            "s3://bucket/x.parquet",
            options=StreamOptions(s3_endpoint_url=DEAD, s3_anonymous=True, **quick),
        ),
        "AWS_ENDPOINT_URL": lambda: (
            monkeypatch.setenv("AWS_ENDPOINT_URL", DEAD),
            ash.stream("s3://bucket/x.parquet", options=StreamOptions(s3_anonymous=True, **quick)),
        )[1],
        "endpoint=": lambda: ash.stream(
            "hf://datasets/org/name", endpoint=DEAD, options=StreamOptions(**quick)
        ),
        "http URL": lambda: ash.stream(f"{DEAD}/a.parquet", options=StreamOptions(**quick)),
    }


@pytest.mark.anyio
@pytest.mark.parametrize("way", ["s3_endpoint_url", "AWS_ENDPOINT_URL", "endpoint=", "http URL"])
async def test_a_failing_endpoint_with_a_password_is_named_without_it(
    way: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("AIOSTREAM_HF_CACHE", str(tmp_path))
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "HF_TOKEN", "HF_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    caplog.set_level(logging.WARNING, logger="aiostream_hf")
    with pytest.raises(ash.FetchError) as info:
        await _drain(_sources(monkeypatch)[way]())
    assert "127.0.0.1:9" in str(info.value)
    assert SECRET not in str(info.value)
    assert SECRET not in info.value.url
    assert caplog.records, "the retry was not logged"
    assert all(SECRET not in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "url",
    [
        f"https://user:{SECRET}@cdn.example/x",
        f"https://cdn.example/x?X-Amz-Credential=AKID&X-Amz-Signature={SECRET}",
        f"https://cdn.example/x?Expires=1&Signature={SECRET}&Key-Pair-Id=K",
        f"https://cdn.example/x?expires=1&sig={SECRET}",
        f"http://user:{SECRET}@[::1/x?sig={SECRET}",  # not a URL urllib can split
    ],
)
def test_display_url_hides_passwords_and_signatures(url: str) -> None:
    shown = display_url(url)
    assert SECRET not in shown
    assert shown.split("?")[0].endswith("/x")
    error = ash.FetchError(f"GET {url}: failed", url=url)
    assert SECRET not in str(error)
    assert SECRET not in error.url
    assert SECRET not in str(ash.SourceError(f"{url!r} and {url}"))


def test_display_url_keeps_a_plain_url() -> None:
    url = "https://hub.example/api/datasets/org/name/revision/main?expand=sha"
    assert display_url(url) == url
    assert str(ash.FetchError(f"GET {url}: failed")) == f"GET {url}: failed"


# -- tokens that cannot be sent, from every place a token comes from ------------------------

HIDDEN = "hf_H1DDENvalue"
BAD_TOKENS = {"a line break": f"{HIDDEN}\r\nX-Evil: 1", "a non-ASCII letter": f"{HIDDEN}\u00e9"}


def _put(place: str, token: str | bytes, home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Give ``token`` the way ``place`` says; what the error must name."""
    if place in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        assert isinstance(token, str)
        monkeypatch.setenv(place, token)
        return f"${place}"
    path = home / "token" if place == "HF_HOME/token" else home.parent / "my-token"
    path.write_bytes(token if isinstance(token, bytes) else token.encode())
    if place == "HF_TOKEN_PATH":
        monkeypatch.setenv("HF_TOKEN_PATH", str(path))
    return f"the token file {path}"


@pytest.mark.anyio
@pytest.mark.parametrize("bad", list(BAD_TOKENS))
@pytest.mark.parametrize(
    "place", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HOME/token"]
)
async def test_a_token_that_cannot_be_sent_names_where_it_came_from(
    place: str, bad: str, plain_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = _put(place, BAD_TOKENS[bad], plain_env, monkeypatch)
    with pytest.raises(ash.SourceError) as info:
        await _drain(ash.stream("hf://datasets/org/name"))
    message = str(info.value)
    assert message.startswith(f"{where}: the token holds")
    assert "H1DDEN" not in message
    env = place in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
    assert f"fix or unset {place}" in message if env else "log in again" in message


@pytest.mark.anyio
@pytest.mark.parametrize("place", ["HF_TOKEN_PATH", "HF_HOME/token"])
async def test_a_token_file_that_is_not_text_is_named(
    place: str, plain_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = _put(place, b"hf_\xff\xfe", plain_env, monkeypatch)
    with pytest.raises(ash.SourceError, match=rf"^{re.escape(where)} is not UTF-8 text: log in"):
        await _drain(ash.stream("hf://datasets/org/name"))


_LIBRARY_FILE = """
import anyio, aiostream_hf as ash
async def main():
    async with ash.stream("hf://datasets/org/name") as s:
        async for _ in s:
            break
try:
    anyio.run(main)
except ash.SourceError as exc:
    print("SourceError:", exc)
"""


@pytest.mark.parametrize("content", [b"hf_\xff\xfe\n", f"{HIDDEN}\u00e9\n".encode()])
def test_huggingface_hubs_own_token_file_gives_the_same_errors(
    content: bytes, tmp_path: Path
) -> None:
    """HF_HOME set before anything is imported: the file is huggingface_hub's own, read
    by its get_token()."""
    (tmp_path / "token").write_bytes(content)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    env.update(HF_HOME=str(tmp_path), HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_OFFLINE="0")
    run = subprocess.run(
        [sys.executable, "-c", _LIBRARY_FILE], env=env, capture_output=True, text=True, timeout=120
    )
    where = f"SourceError: the token file {tmp_path / 'token'}"
    assert run.stdout.startswith((f"{where} is not UTF-8", f"{where}: the token holds")), run.stderr
    assert "H1DDEN" not in run.stdout
    assert "log in again" in run.stdout


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: ash.stream("hf://datasets/org/name"), id="stream"),
        pytest.param(lambda: ash.lerobot.stream("hf://datasets/org/robot"), id="lerobot.stream"),
        pytest.param(lambda: ash.video.open("hf://datasets/org/clips/clip.mp4"), id="video.open"),
    ],
)
@pytest.mark.anyio
async def test_every_entry_point_refuses_a_bad_hf_token(
    make: Any, plain_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", BAD_TOKENS["a line break"])
    with pytest.raises(ash.SourceError, match=r"^\$HF_TOKEN: the token holds") as info:
        async with make() as opened:
            async for _ in opened:  # pragma: no cover - refused before
                pass
    assert "H1DDEN" not in str(info.value)


def test_webdataset_gopen_refuses_a_bad_hf_token(
    plain_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiostream_hf import webdataset

    monkeypatch.setenv("HF_TOKEN", BAD_TOKENS["a non-ASCII letter"])
    with pytest.raises(ash.SourceError, match=r"^\$HF_TOKEN: the token holds") as info:
        webdataset.open_shard("hf://datasets/org/shards/a.tar").read(1)
    assert "H1DDEN" not in str(info.value)
