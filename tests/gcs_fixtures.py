"""A real GCS-compatible server on loopback (gcp-storage-emulator), and helpers to fill and read its buckets.

The emulator runs through tests/gcs_emulator_server.py, which adds GCS's generation preconditions.

The `gcs_emulator` fixture starts `python -m gcp_storage_emulator` on 127.0.0.1
with a free port and points every GCS client of this process and of its
subprocesses at it through STORAGE_EMULATOR_HOST. It also makes sure no test
can look for real credentials or reach a metadata server.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parent.parent)
# Every run against the emulator passes this: no credentials are looked up (see pipeline.cloud).
NO_AUTH = "--no_auth"


@dataclass(frozen=True)
class Emulator:
    host: str  # http://127.0.0.1:PORT
    env: dict  # what a subprocess needs to use it

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project="test-project", credentials=AnonymousCredentials())

    def create_bucket(self, name: str) -> str:
        """An empty bucket `name`. A module's fixture that made it may run again in the same session: pytest-xdist's
        worksteal can hand a worker the rest of a module after other modules' tests, and the module's fixtures are
        then set up anew; the bucket, left by the module's earlier tests, is emptied instead of a 409 Conflict."""
        from google.api_core.exceptions import Conflict

        client = self.client()
        try:
            client.create_bucket(name)
        except Conflict:
            for blob in client.list_blobs(name):
                blob.delete()
        return f"gs://{name}"

    def upload_tree(self, local_dir, gs_dir: str) -> int:
        """Copy every file below `local_dir` to `gs_dir`; returns the number of files."""
        bucket_name, prefix = _split(gs_dir)
        bucket = self.client().bucket(bucket_name)
        count = 0
        for path in sorted(Path(local_dir).rglob("*")):
            if path.is_file():
                relpath = path.relative_to(local_dir).as_posix()
                bucket.blob(f"{prefix}/{relpath}" if prefix else relpath).upload_from_filename(str(path))
                count += 1
        return count

    def list_names(self, gs_dir: str) -> list[str]:
        """Object names below `gs_dir`, relative to it."""
        bucket_name, prefix = _split(gs_dir)
        start = f"{prefix}/" if prefix else ""
        return sorted(b.name[len(start):] for b in self.client().list_blobs(bucket_name, prefix=start))

    def write(self, gs_path: str, data: bytes | str) -> str:
        bucket_name, name = _split(gs_path)
        self.client().bucket(bucket_name).blob(name).upload_from_string(data)
        return gs_path

    def write_many(self, contents: dict, threads: int = 16) -> None:
        """Write many small objects at once ({gs path: bytes}), on `threads` threads (a client each)."""
        from concurrent.futures import ThreadPoolExecutor

        local = threading.local()

        def write(item):
            if not hasattr(local, "client"):
                local.client = self.client()
            bucket_name, name = _split(item[0])
            local.client.bucket(bucket_name).blob(name).upload_from_string(item[1])

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(write, contents.items()))

    def read(self, gs_path: str) -> bytes:
        bucket_name, name = _split(gs_path)
        return self.client().bucket(bucket_name).blob(name).download_as_bytes()


def _split(gs_path: str) -> tuple[str, str]:
    bucket, _, rest = gs_path[len("gs://"):].partition("/")
    return bucket, rest.rstrip("/")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(host: str, process: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gcp-storage-emulator exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(host + "/", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"gcp-storage-emulator did not answer on {host} within {timeout:.0f} s")


@contextlib.contextmanager
def running_emulator(config_dir) -> Iterator[Emulator]:
    """A fresh in-memory GCS emulator, with this process's environment pointed at it until the block ends.

    `config_dir`: an empty folder for gcloud's configuration, so that no user's credentials are picked up.
    """
    port = _free_port()
    host = f"http://127.0.0.1:{port}"
    closed_port = _free_port()  # nothing listens there: a metadata-server probe fails at once
    env = {
        "STORAGE_EMULATOR_HOST": host,
        "NO_GCE_CHECK": "True",
        "GCE_METADATA_HOST": f"127.0.0.1:{closed_port}",
        "GCE_METADATA_IP": f"127.0.0.1:{closed_port}",
        # An empty gcloud configuration: no user's credentials or project are ever picked up.
        "CLOUDSDK_CONFIG": str(config_dir),
        "GOOGLE_CLOUD_PROJECT": "test-project",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.gcs_emulator_server", "start", "--host", "127.0.0.1", "--port", str(port),
         "--in-memory", "--quiet"],
        cwd=REPO,  # tests.gcs_emulator_server: the emulator with generation preconditions
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    saved = {name: os.environ.get(name) for name in [*env, "GOOGLE_APPLICATION_CREDENTIALS"]}
    try:
        _wait_until_up(host, process)
        os.environ.update(env)
        os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
        # In this process, as `--no_auth` does for a run: no credential lookup with retries.
        from pipeline.cloud import skip_credential_lookup

        skip_credential_lookup()
        yield Emulator(host, dict(env))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """A fresh in-memory GCS emulator for the session; yields an Emulator."""
    with running_emulator(tmp_path_factory.mktemp("gcloud-config")) as emulator:
        yield emulator
