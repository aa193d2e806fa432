from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

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
def _own_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A cache folder per test: the rate-limit counts kept there (shared by the processes
    of a machine) must not carry one test's fake server's "quota spent" into another."""
    monkeypatch.setenv("AIOSTREAM_HF_CACHE", str(tmp_path / "aiostream-cache"))


@pytest.fixture
def plain_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No token anywhere, as on a fresh machine (no HF_TOKEN, HF_TOKEN_PATH, offline or
    implicit-token switch): HF_HOME is an empty folder, returned."""
    for name in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN",
        "HF_HUB_OFFLINE",
        "HF_OIDC_RESOURCE",
    ):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "hf-home"
    home.mkdir()
    monkeypatch.setenv("HF_HOME", str(home))
    return home


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


# -- an S3-compatible store: moto's server over loopback, for every test that needs one ------


#: What reading a bucket takes. AWS authorizes ListObjectsV2 by ``s3:ListBucket``; moto
#: 5.2.6 checks ``s3:ListObjectsV2`` instead (5.2.5 and before: ``s3:ListBucket``). Both,
#: so the tests mean the same under either.
S3_READ_ACTIONS = ["s3:GetObject", "s3:ListBucket", "s3:ListObjectsV2"]


@dataclass
class S3Store:
    """moto's S3 server (``aiostream_hf.testing._moto.MotoS3``) with IAM users made for the
    tests, signatures required. ``admin`` may do anything (the tests put their buckets and
    objects with it, through boto3); ``reader`` may read every bucket; ``outsider`` may
    read only buckets named ``elsewhere*``."""

    server: Any
    admin: dict[str, str]
    reader: dict[str, str]
    outsider: dict[str, str]
    read_actions: ClassVar[list[str]] = S3_READ_ACTIONS

    @property
    def endpoint(self) -> str:
        return str(self.server.endpoint)

    def boto3(self) -> Any:
        """An admin boto3 S3 client, for putting buckets and objects."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", **self.admin)

    def variables(self, folder: Path, creds: dict[str, str] | None) -> dict[str, str]:
        """The AWS variables of a shell for this store with ``creds`` (None: without
        credentials); no AWS config, credentials file or instance role of the user's."""
        found = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(folder / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        if creds is not None:
            found["AWS_ACCESS_KEY_ID"] = creds["aws_access_key_id"]
            found["AWS_SECRET_ACCESS_KEY"] = creds["aws_secret_access_key"]
        return found

    def env(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, creds: dict[str, str] | None
    ) -> None:
        """This process's AWS variables set to ``variables`` (and no others), with a
        fresh resolution cache."""
        for name in list(os.environ):
            if name.startswith("AWS_"):
                monkeypatch.delenv(name)
        for name, value in self.variables(tmp_path, creds).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AIOSTREAM_HF_CACHE", str(tmp_path / "aiostream-cache"))

    def put_folder(self, bucket: str, folder: Path, prefix: str = "") -> None:
        """Every file below ``folder`` as an object of ``bucket`` (made if new), keyed by
        ``prefix`` and its path relative to ``folder``."""
        client = self.boto3()
        if bucket not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            client.create_bucket(Bucket=bucket)
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, prefix + path.relative_to(folder).as_posix())


def _iam_user(iam: Any, name: str, resources: list[str], actions: list[str]) -> dict[str, str]:
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": actions, "Resource": resources}],
    }
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {
        "aws_access_key_id": key["AccessKeyId"],
        "aws_secret_access_key": key["SecretAccessKey"],
    }


@pytest.fixture(scope="session")
def s3_store() -> Iterator[S3Store]:
    import boto3

    from aiostream_hf.testing._moto import MotoS3

    with MotoS3() as server:
        iam = boto3.client(
            "iam",
            endpoint_url=server.endpoint,
            region_name="us-east-1",
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        admin = _iam_user(iam, "admin", ["*"], ["*"])
        reader = _iam_user(iam, "reader", ["*"], S3_READ_ACTIONS)
        outsider = _iam_user(iam, "outsider", ["arn:aws:s3:::elsewhere*"], S3_READ_ACTIONS)
        server.require_signatures(True)
        yield S3Store(server, admin, reader, outsider)
