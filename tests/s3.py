"""moto's S3 server for the tests of the S3 blob store: a real HTTP server on loopback, spoken to
with boto3 configured only through its standard environment (AWS_ENDPOINT_URL...), as in
production. The server dies with the test session, also when pytest is SIGKILLed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

# As tests/procs.py's dying_with_us (which needs Django; this module does not, so the benchmark
# bench/s3_store.py starts its server with it too): SIGKILL when this process dies, however.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"  # PR_SET_PDEATHSIG
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def dying_with_us(argv: list[str]) -> list[str]:
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Nothing from this machine's own AWS files.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """`python -m moto.server` on a free loopback port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(
            dying_with_us(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def env(self) -> dict[str, str]:
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}


def client():
    import boto3

    return boto3.session.Session().client("s3")


def empty_and_delete(bucket: str) -> None:
    s3 = client()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", ())]
        if keys:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys})
    for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        for up in page.get("Uploads", ()):
            s3.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    s3.delete_bucket(Bucket=bucket)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def s3_env(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> MotoServer:
    """boto3's standard environment pointed at the moto server, for this test."""
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for k, v in moto_server.env().items():
        monkeypatch.setenv(k, v)
    return moto_server


@pytest.fixture
def s3_url(s3_env: MotoServer) -> Iterator[str]:
    """A new bucket for this test, as an s3://BUCKET/PREFIX address; emptied and deleted after."""
    bucket = f"shiftlog-test-{uuid.uuid4().hex[:12]}"
    client().create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/blobs"
    empty_and_delete(bucket)
