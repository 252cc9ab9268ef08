"""An S3 endpoint on loopback for the storage tests: moto's threaded server with test credentials."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def moto_s3(*buckets: str) -> Iterator[str]:
    """Start moto's S3 server on a free loopback port with ``buckets`` made, and the AWS test
    credentials in the environment while it runs; yields its URL."""
    import boto3
    from _pg import free_port
    from moto.server import ThreadedMotoServer

    old = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield url
    finally:
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
