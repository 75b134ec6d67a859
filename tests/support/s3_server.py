"""A local S3-compatible server (moto's, from PyPI) on a free loopback port, started and stopped by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reflector.runtime.devserver import free_port


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str

    def env(self, prefix: str = "rr") -> dict[str, str]:
        """What a process needs to use the store: the RR_BLOB_URL and the standard AWS variables."""
        return {
            "RR_BLOB_URL": f"s3://{self.bucket}/{prefix}",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "rr-test",
            "AWS_SECRET_ACCESS_KEY": "rr-test-secret",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="rr-test",
            aws_secret_access_key="rr-test-secret",
            region_name="us-east-1",
        )

    def keys(self, prefix: str = "") -> list[str]:
        out: list[str] = []
        for page in (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        ):
            out += [str(o["Key"]) for o in page.get("Contents") or ()]
        return out


@contextmanager
def s3_server(log: Path) -> Iterator[S3Server]:
    """moto's server in a subprocess on 127.0.0.1, with one new bucket."""
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start:\n{log.read_text()[-2000:]}") from None
                time.sleep(0.1)
        server = S3Server(endpoint, f"rr-test-{uuid.uuid4().hex[:8]}")
        server.client().create_bucket(Bucket=server.bucket)
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
