"""``python benchmarks/_s3_cat.py s3://BUCKET/KEY``: the object's bytes on stdout.

What a webdataset user without the AWS CLI writes for ``pipe:`` URLs
(``pipe:python s3cat.py s3://bucket/shard-000000.tar``): one boto3 GetObject,
its body streamed in 1 MiB chunks. boto3 reads the endpoint, region and
credentials from the AWS variables, as the CLI does.
"""

from __future__ import annotations

import sys

import boto3


def main(uri: str) -> None:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"]
    out = sys.stdout.buffer
    for chunk in body.iter_chunks(1 << 20):
        out.write(chunk)
    out.flush()


if __name__ == "__main__":
    main(sys.argv[1])
