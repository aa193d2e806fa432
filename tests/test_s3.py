"""s3:// sources against moto's S3 server over loopback (the ``s3_store`` fixture).

Signatures are required (moto checks every SigV4 signature and IAM policy), except
where a test turns them off to stand for a public bucket. Requests are counted at the
server, so the counts include a DataLoader's worker processes. Every format is read
from the bucket and compared with the same files read from local disk.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx2
import numpy as np
import pyarrow.parquet as pq
import pytest

import aiostream_hf as ash
from aiostream_hf import lerobot, video
from aiostream_hf._demo import human_bytes
from aiostream_hf._fetcher import RangeFetcher
from aiostream_hf.stores import s3 as _s3
from aiostream_hf.testing import (
    make_lerobot_dataset,
    make_text_parquet,
    make_video,
    make_webdataset_shards,
)

pytestmark = pytest.mark.anyio

BUCKET = "data"
PUBLIC = "open-data"
SHARDS = "s3://data/shards/train-{000000..000002}.tar"


@pytest.fixture(scope="module")
def local(s3_store: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files, on local disk and in bucket ``data`` under the same relative keys."""
    root = tmp_path_factory.mktemp("s3-data")
    for i in range(2):
        make_text_parquet(
            root / f"parquet/part-{i}.parquet",
            rows=60,
            row_group_size=20,
            seed=i,
            min_text=10,
            max_text=40,
            start_id=60 * i,
        )
    make_webdataset_shards(root / "shards", shards=3, samples_per_shard=8, width=16, height=16)
    make_video(root / "video/clip.mp4", frames=30, fps=30, width=32, height=24, options={"g": "10"})
    layout = make_lerobot_dataset(
        tmp_path_factory.mktemp("s3-lerobot"),
        "org/robot",
        episodes=(8, 10),
        fps=10,
        width=32,
        height=24,
        cameras=("observation.images.top",),
        codec="h264",
    )
    s3_store.put_folder(BUCKET, root)
    s3_store.put_folder(BUCKET, layout.path, prefix="robot/")
    (root / "robot").symlink_to(layout.path)  # the local copy, under the same key
    client = s3_store.boto3()
    # A public bucket: anyone may list it and read its objects.
    s3_store.put_folder(PUBLIC, root / "parquet", prefix="parquet/")
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": "*",
                "Action": s3_store.read_actions,
                "Resource": [f"arn:aws:s3:::{PUBLIC}", f"arn:aws:s3:::{PUBLIC}/*"],
            }
        ],
    }
    client.put_bucket_policy(Bucket=PUBLIC, Policy=json.dumps(policy))
    return root


@pytest.fixture
def store(s3_store: Any, local: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The store, with the reader's credentials in the AWS variables; counts reset."""
    s3_store.env(monkeypatch, tmp_path, s3_store.reader)
    s3_store.server.reset_stats()
    return s3_store


def _drop_url(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.items() if k != "__url__"} for s in samples]


async def _collect(s: ash.Stream) -> list[Any]:
    async with s:
        return [row async for row in s]


# -- every format, as from local disk -------------------------------------------------------


async def test_parquet_from_a_bucket_gives_the_local_rows(store: Any, local: Path) -> None:
    s = ash.stream("s3://data/parquet/*.parquet")
    rows = await _collect(s)
    assert rows == list(ash.stream(str(local / "parquet/*.parquet")))
    assert [f.path for f in s.manifest.files] == [
        "s3://data/parquet/part-0.parquet",
        "s3://data/parquet/part-1.parquet",
    ]
    stats = store.server.stats()
    assert stats["list"] == 1  # one listing page for the glob
    assert stats.get("unsigned", 0) == 0  # every request signed (and checked by moto)
    # The listing's ETag pinned each object: reads went straight to it, with If-Match.
    assert s.statistics().fetcher["requests"]["resolve"] == 0


async def test_tar_shards_by_braces_are_one_listing_and_the_local_samples(
    store: Any, local: Path
) -> None:
    s = ash.stream(SHARDS)
    samples = await _collect(s)
    expected = list(ash.stream(str(local / "shards/train-{000000..000002}.tar")))
    assert _drop_url(samples) == _drop_url(expected)
    assert samples[0]["__url__"] == f"{store.endpoint}/data/shards/train-000000.tar"
    # Three sources, one listing of the prefix they share; one GET per shard.
    assert store.server.stats() == {"list": 1, "get": 3}


async def test_a_video_object_gives_the_local_frames(store: Any, local: Path) -> None:
    at = [0.0, 0.4, 0.9]
    async with video.open(str(local / "video/clip.mp4")) as reader:
        expected = await reader.frames_at(at)
    async with video.open("s3://data/video/clip.mp4") as reader:
        got = await reader.frames_at(at)
        assert reader.file.size == (local / "video/clip.mp4").stat().st_size
    assert np.array_equal(got.data, expected.data)
    assert np.array_equal(got.pts, expected.pts)
    assert store.server.stats()["list"] == 1  # the object's size and ETag


def test_a_lerobot_folder_gives_the_local_items(store: Any, local: Path) -> None:
    items = list(lerobot.stream("s3://data/robot/"))
    expected = list(lerobot.stream(local / "robot"))
    assert len(items) == len(expected) == 18
    for a, b in zip(items, expected, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key
    assert store.server.stats()["list"] == 1  # meta, data and videos: one listing


# -- addressing ------------------------------------------------------------------------------


class _LoopbackNames(httpx2.AsyncBaseTransport):
    """Connects to 127.0.0.1 whatever the URL's host, keeping the Host header it gave:
    ``data.localhost`` has no DNS name on this machine, and virtual-hosted addressing
    names the bucket in the host. A stand-in for DNS only; the server is real."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.url = request.url.copy_with(host="127.0.0.1")
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_virtual_hosted_addressing_reads_the_same_samples(store: Any) -> None:
    port = httpx2.URL(store.endpoint).port
    options = ash.StreamOptions(s3_endpoint_url=f"http://localhost:{port}", s3_addressing="virtual")
    async with ash.HubClient(transport=_LoopbackNames()) as client:
        s = ash.stream(SHARDS, options=options, client=client)
        samples = await _collect(s)
    assert s.manifest.files[0].url == f"http://data.localhost:{port}/shards/train-000000.tar"
    assert _drop_url(samples) == _drop_url(await _collect(ash.stream(SHARDS)))


def test_auto_addressing_is_virtual_on_aws_and_path_elsewhere() -> None:
    def ctx(endpoint: str, addressing: str = "auto") -> _s3.S3Context:
        return _s3.S3Context(
            endpoint=endpoint,
            region="us-east-1",
            addressing=addressing,
            credentials=None,
            described="unsigned",
        )

    aws = ctx("https://s3.us-east-1.amazonaws.com")
    assert aws.object_url("my-bucket", "a b/c+d.tar") == (
        "https://my-bucket.s3.us-east-1.amazonaws.com/a%20b/c%2Bd.tar"
    )
    # A dot cannot be in a TLS wildcard's label: such buckets stay path-style.
    assert aws.bucket_url("my.bucket") == "https://s3.us-east-1.amazonaws.com/my.bucket"
    assert ctx("http://minio:9000").bucket_url("b") == "http://minio:9000/b"
    assert ctx("http://minio:9000", "virtual").bucket_url("b") == "http://b.minio:9000"
    assert ctx("http://minio:9000").covers("http://b.minio:9000/k")
    assert not ctx("http://minio:9000").covers("http://minio:9001/b/k")
    assert not ctx("http://minio:9000").covers("http://evilminio:9000/b/k")


async def test_a_profile_of_the_aws_config_files_names_the_store_and_the_keys(
    s3_store: Any, local: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    s3_store.env(monkeypatch, tmp_path, None)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.delenv("AWS_REGION")
    (tmp_path / "no-aws-config").write_text(
        f"[profile bench]\nregion = us-east-1\nendpoint_url = {s3_store.endpoint}\n"
    )
    creds = s3_store.reader
    (tmp_path / "no-aws-credentials").write_text(
        f"[bench]\naws_access_key_id = {creds['aws_access_key_id']}\n"
        f"aws_secret_access_key = {creds['aws_secret_access_key']}\n"
    )
    monkeypatch.setenv("AWS_PROFILE", "bench")
    rows = await _collect(ash.stream("s3://data/parquet/", columns=["id"]))
    assert [r["id"] for r in rows] == list(range(120))
    # AWS_ENDPOINT_URL_S3 wins over AWS_ENDPOINT_URL (here a port nothing listens on).
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_store.endpoint)
    assert len(await _collect(ash.stream("s3://data/parquet/part-0.parquet"))) == 60
    monkeypatch.setenv("AWS_PROFILE", "nope")
    with pytest.raises(ash.SourceError, match="AWS_PROFILE"):
        await _collect(ash.stream("s3://data/parquet/"))


# -- refusals ----------------------------------------------------------------------------


async def test_without_credentials_a_bucket_is_refused_naming_the_way_in(
    s3_store: Any, local: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    s3_store.env(monkeypatch, tmp_path, None)
    with pytest.raises(ash.AccessDeniedError) as info:
        await _collect(ash.stream(SHARDS))
    message = str(info.value)
    assert message.startswith("s3://data/shards/train-000000.tar: no AWS credentials found")
    assert "AWS_ACCESS_KEY_ID" in message
    assert "s3_anonymous=True" in message


async def test_credentials_without_access_are_refused_naming_the_bucket(
    s3_store: Any, local: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    s3_store.env(monkeypatch, tmp_path, s3_store.outsider)
    with pytest.raises(ash.AccessDeniedError) as info:
        await _collect(ash.stream("s3://data/parquet/"))
    message = str(info.value)
    assert message.startswith("s3://data/parquet/: access denied, HTTP 403 (AccessDenied")
    assert s3_store.outsider["aws_access_key_id"] in message  # who was refused
    assert "AWS_ACCESS_KEY_ID" in message
    assert "s3_anonymous" in message


@pytest.mark.parametrize(
    ("change", "code"),
    [("secret", "SignatureDoesNotMatch"), ("key", "InvalidAccessKeyId")],
)
async def test_wrong_credentials_are_refused_with_the_store_s_reason(
    s3_store: Any,
    local: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    change: str,
    code: str,
) -> None:
    creds = dict(s3_store.reader)
    field = "aws_secret_access_key" if change == "secret" else "aws_access_key_id"
    creds[field] = "AKIAWRONGWRONGWRONG0" if change == "key" else "not-the-secret"
    s3_store.env(monkeypatch, tmp_path, None)
    options = ash.StreamOptions(s3_credentials=creds)
    with pytest.raises(ash.AccessDeniedError) as info:
        await _collect(ash.stream("s3://data/parquet/", options=options))
    message = str(info.value)
    assert f"HTTP 403 ({code}" in message
    assert "(from StreamOptions.s3_credentials)" in message


async def test_a_missing_key_and_a_missing_bucket(store: Any) -> None:
    with pytest.raises(ash.EntryNotFoundError, match=r"s3://data/shards/nope\.tar: no such key"):
        await _collect(ash.stream("s3://data/shards/nope.tar"))
    with pytest.raises(ash.RepoNotFoundError, match=r"bucket 'no-such-bucket' does not exist"):
        await _collect(ash.stream("s3://no-such-bucket/x.parquet"))
    with pytest.raises(ash.EntryNotFoundError, match="the glob matches no object"):
        await _collect(ash.stream("s3://data/shards/*.parquet"))


@pytest.mark.parametrize("change", ["replaced", "deleted"])
async def test_an_object_changed_mid_stream_is_file_changed(
    store: Any, tmp_path: Path, anyio_backend: str, change: str
) -> None:
    path = tmp_path / "grouped.parquet"
    table = make_text_parquet(path, rows=200, row_group_size=20, min_text=1000, max_text=3000)
    assert pq.ParquetFile(path).metadata.num_row_groups == 10
    key = f"{change}/{anyio_backend}.parquet"
    client = store.boto3()
    client.upload_file(str(path), BUCKET, key)

    def change_it() -> None:  # same key, other bytes and ETag; or no object at all
        if change == "replaced":
            client.put_object(Bucket=BUCKET, Key=key, Body=b"new" * 100)
        else:
            client.delete_object(Bucket=BUCKET, Key=key)

    ids: list[int] = []
    options = ash.StreamOptions(prefetch_count=1)
    s = ash.stream(f"s3://{BUCKET}/{key}", columns=["id"], options=options)
    with pytest.raises(ash.FileChangedError) as info:
        async with s:
            async for row in s:
                ids.append(row["id"])
                if len(ids) == 1:
                    await anyio.to_thread.run_sync(change_it)
    assert ids == table["id"].to_pylist()[: len(ids)]  # the old version's rows, never a mix
    assert len(ids) < 200
    message = str(info.value)
    assert f"s3://{BUCKET}/{key}: the file changed while it was read" in message
    assert ("412 to If-Match" if change == "replaced" else "answered 404") in message


async def test_a_public_bucket_is_read_unsigned(
    s3_store: Any, local: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A bucket whose policy lets anyone read. moto cannot check signatures and serve
    unsigned requests at once, so its IAM checks are off here; it still refuses an
    unsigned read of an object nobody made public. With ``s3_anonymous`` no credentials
    are looked up and nothing is signed."""
    s3_store.env(monkeypatch, tmp_path, None)
    s3_store.server.require_signatures(False)
    try:
        s3_store.server.reset_stats()
        anonymous = ash.StreamOptions(s3_anonymous=True)
        rows = await _collect(ash.stream(f"s3://{PUBLIC}/parquet/", options=anonymous))
        stats = s3_store.server.stats()
        with pytest.raises(ash.FetchError, match="the bucket is not public") as info:
            await _collect(ash.stream(f"s3://{BUCKET}/parquet/", options=anonymous))
    finally:
        s3_store.server.require_signatures(True)
    assert [r["id"] for r in rows] == list(range(120))
    assert stats["unsigned"] == stats["list"] + stats["get"] > 1
    assert info.value.status == 403


# -- one listing per machine, none in workers ---------------------------------------------


def test_a_listing_is_shared_by_the_processes_of_a_machine(store: Any) -> None:
    first = ash.stream(SHARDS)
    list(first)
    second = ash.stream(SHARDS)  # another iteration: a new resolver, as another process has
    list(second)
    assert store.server.stats()["list"] == 1
    assert second.statistics().resolver["disk_hits"] == 1


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_dataloader_workers_read_their_shards_and_list_nothing(store: Any, local: Path) -> None:
    from torch.utils.data import DataLoader

    from aiostream_hf.torch import StreamDataset

    ds = StreamDataset(SHARDS)
    after_parent = store.server.stats()
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    keys = sorted(sample["__key__"] for sample in loader)
    stats = store.server.stats()
    assert after_parent == {"list": 1}  # the parent's one listing
    assert stats == {"list": 1, "get": 3}  # the workers: one GET per shard, no listing
    expected = list(ash.stream(str(local / "shards/train-{000000..000002}.tar")))
    assert keys == sorted(s["__key__"] for s in expected)


# -- the listing, against hostile answers (unit tests: MockTransport) -------------------------


def _page(keys: list[str], token: str | None, *, extra: str = "") -> bytes:
    contents = "".join(
        f"<Contents><Key>{k}</Key><Size>{len(k)}</Size><ETag>&quot;e{i}&quot;</ETag></Contents>"
        for i, k in enumerate(keys)
    )
    more = f"<NextContinuationToken>{token}</NextContinuationToken>" if token else ""
    return (
        f'{extra}<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<IsTruncated>{'true' if token else 'false'}</IsTruncated>{more}{contents}"
        "</ListBucketResult>"
    ).encode()


def _listing(pages: dict[str | None, bytes]) -> tuple[_s3.S3Context, Any, list[str]]:
    """A context, a ``get`` that answers ``pages`` by continuation token, and the URLs
    it was asked for."""
    ctx = _s3.S3Context(
        endpoint="http://store:9000",
        region="us-east-1",
        addressing="path",
        credentials=None,
        described="unsigned",
    )
    seen: list[str] = []

    async def get(url: str) -> bytes:
        seen.append(url)
        token = httpx2.URL(url).params.get("continuation-token")
        return pages[token]

    return ctx, get, seen


async def test_a_listing_follows_its_pages_with_the_query_it_signs() -> None:
    pages = {None: _page(["p/a", "p/b"], "x+y/="), "x+y/=": _page(["p/c"], None)}
    ctx, get, seen = _listing(pages)
    objects = await _s3.list_objects(get, ctx, "bkt", "p/")
    assert [o.key for o in objects] == ["p/a", "p/b", "p/c"]
    assert objects[0].etag == "e0"
    # RFC 3986 encoding, sorted: the canonical query SigV4 signs is the one sent.
    assert seen == [
        "http://store:9000/bkt?encoding-type=url&list-type=2&prefix=p%2F",
        "http://store:9000/bkt?continuation-token=x%2By%2F%3D&encoding-type=url"
        "&list-type=2&prefix=p%2F",
    ]


@pytest.mark.parametrize(
    ("pages", "problem"),
    [
        ({None: _page(["p/a"], None, extra="<!DOCTYPE x [<!ENTITY a 'b'>]>")}, "<!DOCTYPE>"),
        ({None: _page(["p/a"], "t"), "t": _page(["p/b"], "t")}, "loops"),
        ({None: _page(["p/a"], "t"), "t": _page(["p/a"], None)}, "lists 'p/a' twice"),
        ({None: _page(["q/a"], None)}, "not below the prefix"),
        (
            {None: b"<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>"},
            "no NextContinuationToken",
        ),
        (
            {
                None: b"<ListBucketResult><Contents><Key>p/a</Key><Size>-1</Size>"
                b"<ETag>x</ETag></Contents></ListBucketResult>"
            },
            "has size",
        ),
        ({None: b"<ListBucketResult"}, "malformed XML"),
    ],
)
async def test_a_hostile_listing_is_refused(pages: dict[str | None, bytes], problem: str) -> None:
    ctx, get, _ = _listing(pages)
    with pytest.raises(ash.ResolutionError, match=problem):
        await _s3.list_objects(get, ctx, "bkt", "p/")


async def test_a_listing_stops_at_its_page_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_s3, "MAX_LIST_PAGES", 3)
    pages = {
        None: _page(["p/0"], "1"),
        **{str(i): _page([f"p/{i}"], str(i + 1)) for i in range(1, 5)},
    }
    ctx, get, seen = _listing(pages)
    with pytest.raises(ash.ResolutionError, match="past 3 pages"):
        await _s3.list_objects(get, ctx, "bkt", "p/")
    assert len(seen) == 3


async def test_signing_covers_range_and_if_match_and_only_the_store() -> None:
    import botocore.credentials

    ctx = _s3.S3Context(
        endpoint="http://store:9000",
        region="eu-west-1",
        addressing="path",
        credentials=botocore.credentials.Credentials("AKIDEXAMPLE", "secret", "tok"),
        described="signed",
    )
    request = httpx2.Request(
        "GET", "http://store:9000/b/k", headers={"Range": "bytes=0-9", "If-Match": '"e"'}
    )
    await ctx.sign(request)
    auth = request.headers["Authorization"]
    assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/s3/aws4_request" in auth
    assert "SignedHeaders=host;if-match;range;x-amz-content-sha256;x-amz-date;" in auth
    assert request.headers["X-Amz-Security-Token"] == "tok"
    elsewhere = httpx2.Request("GET", "http://cdn:9000/b/k")
    await ctx.sign(elsewhere)
    assert "Authorization" not in elsewhere.headers


class _CutStream(httpx2.AsyncByteStream):
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self) -> Any:
        yield self.data
        raise httpx2.RemoteProtocolError("peer closed connection without sending complete body")


async def test_a_cut_body_resumes_with_a_fresh_signature_for_its_new_range(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each attempt is signed as it is sent: the resume's Range (and If-Range) are in
    its own signature; If-Match carries the listing's ETag from the first request."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    data = bytes(range(256)) * 40
    seen: list[httpx2.Request] = []

    async def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        start = int(request.headers["Range"].removeprefix("bytes=").partition("-")[0])
        headers = {"ETag": '"abc"', "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
        if len(seen) == 1:
            return httpx2.Response(206, headers=headers, stream=_CutStream(data[:1000]))
        return httpx2.Response(206, headers=headers, content=data[start:])

    options = ash.StreamOptions(
        s3_endpoint_url="http://store.test:9000",
        s3_credentials={"aws_access_key_id": "AKIDEXAMPLE", "aws_secret_access_key": "secret"},
        backoff_base=0,
    )
    file = ash.FileRef(
        "http://store.test:9000/bkt/k.tar", "s3://bkt/k.tar", size=len(data), etag="abc"
    )
    client = ash.HubClient(transport=httpx2.MockTransport(handler))
    async with client, RangeFetcher(options, client=client) as fetcher:
        assert await fetcher.read(file, 0, len(data)) == data
        stats = fetcher.statistics()
    assert [r.headers["Range"] for r in seen] == [
        f"bytes=0-{len(data) - 1}",
        f"bytes=1000-{len(data) - 1}",
    ]
    assert all(r.headers["If-Match"] == '"abc"' for r in seen)
    assert seen[1].headers["If-Range"] == '"abc"'
    signed = [r.headers["Authorization"] for r in seen]
    assert "SignedHeaders=host;if-match;range;" in signed[0]
    assert "SignedHeaders=host;if-match;if-range;range;" in signed[1]
    assert signed[0] != signed[1]
    assert stats.resumes == 1
    assert stats.requests["resolve"] == 0


def test_bad_s3_sources_and_options_fail_before_any_request() -> None:
    with pytest.raises(ash.SourceError, match="names no bucket"):
        ash.stream("s3:///key")
    with pytest.raises(ash.SourceError, match="is not a bucket name"):
        ash.stream("s3://-bad-/key")
    with pytest.raises(ash.SourceError, match="s3_addressing"):
        ash.StreamOptions(s3_addressing="dns")
    with pytest.raises(ash.SourceError, match="s3_credentials"):
        ash.StreamOptions(s3_credentials={"aws_access_key_id": "only"})
    with pytest.raises(ash.SourceError, match="name one object"):
        video.open("s3://data/video/*.mp4")
    secret = ash.StreamOptions(
        s3_credentials={"aws_access_key_id": "AKID", "aws_secret_access_key": "hush"}
    )
    assert "hush" not in repr(secret)


def test_a_state_json_round_trip_of_an_s3_manifest(store: Any) -> None:
    s = ash.stream(SHARDS)
    list(s)
    assert s.manifest is not None
    again = ash.Manifest.from_json(json.loads(json.dumps(s.manifest.to_json())))
    assert again == s.manifest


# -- the command line -------------------------------------------------------------------------


def test_the_cli_lists_and_heads_s3_sources(store: Any) -> None:
    from click.testing import CliRunner

    from aiostream_hf.cli import main

    runner = CliRunner()
    listed = runner.invoke(main, ["ls", "s3://data/shards/"])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.startswith("s3://data/shards/\nformat: webdataset\n")
    assert "train-000000.tar" in listed.stdout
    assert "jpg" in listed.stdout  # the extensions of the first samples: a shard was read
    head = runner.invoke(main, ["head", "s3://data/parquet/part-1.parquet", "-n", "2"])
    assert head.exit_code == 0, head.output
    assert head.stdout.startswith("[0]\n  id     60\n")
    robot = runner.invoke(main, ["ls", "s3://data/robot"])
    assert robot.exit_code == 0, robot.output
    assert "episodes" in robot.stdout
    assert "18" in robot.stdout  # frames
    store.server.require_signatures(False)  # as in test_a_public_bucket_is_read_unsigned
    try:
        public = runner.invoke(main, ["head", f"s3://{PUBLIC}/parquet/", "--no-sign-request"])
        refused = runner.invoke(main, ["head", "s3://data/parquet/", "--no-sign-request"])
    finally:
        store.server.require_signatures(True)
    assert public.exit_code == 0, public.output
    assert public.stdout.startswith("[0]\n  id     0\n")
    assert refused.exit_code == 1
    assert refused.output.startswith("Error: s3://data/parquet/part-0.parquet: access denied")
    assert "the bucket is not public" in refused.output
    assert len(refused.output.splitlines()) == 1


def test_the_cli_ls_names_the_keys_a_brace_pattern_misses(store: Any, local: Path) -> None:
    """Two of five shards are not in the bucket: ls lists the three there (their sizes,
    from the listing), a line for each missing one, and exits with 1. When every shard
    is there, checking them costs nothing: one listing, as reading them."""
    from click.testing import CliRunner

    from aiostream_hf.cli import main

    there = CliRunner().invoke(main, ["ls", SHARDS])
    assert there.exit_code == 0, there.output
    assert "not there" not in there.stdout
    assert store.server.stats()["list"] == 1
    listed = CliRunner().invoke(main, ["ls", "s3://data/shards/train-{000000..000004}.tar"])
    assert listed.exit_code == 1, listed.output
    size = human_bytes(sum(p.stat().st_size for p in (local / "shards").glob("*.tar")))
    (row,) = [r.split() for r in listed.stdout.splitlines() if r.startswith("default ")]
    assert row[:3] == ["default", "train", "3"]
    assert row[3:-2] == size.split()
    assert listed.stdout.splitlines()[-2:] == [
        f"missing (not in the bucket)  s3://data/shards/train-00000{i}.tar" for i in (3, 4)
    ]
    assert listed.stderr.startswith("Error: 2 of the 5 files that ")
    assert "missing (not in the bucket): train-000003.tar, train-000004.tar" in listed.stderr


async def test_the_byte_cache_keeps_objects_per_identity(
    store: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A bucket's objects through the byte cache: a second read gets nothing from the
    store; another identity (other credentials) gets none of the first one's blocks."""
    options = ash.StreamOptions(cache_dir=tmp_path / "cache", byte_cache_bytes=1 << 30)
    rows = await _collect(ash.stream("s3://data/parquet/*.parquet", options=options))
    first = store.server.stats().get("get", 0)
    assert first > 0
    assert await _collect(ash.stream("s3://data/parquet/*.parquet", options=options)) == rows
    assert store.server.stats().get("get", 0) == first  # the blocks, from disk
    store.env(monkeypatch, tmp_path, store.admin)  # another identity
    assert await _collect(ash.stream("s3://data/parquet/*.parquet", options=options)) == rows
    assert store.server.stats().get("get", 0) > first  # fetched again, kept apart
