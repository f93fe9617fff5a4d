"""The output folder's lock, `.image-tfrecords.lock`: one run per folder, on a local folder and on gs://."""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
import uuid
from collections.abc import Callable

from apache_beam.io.filesystems import FileSystems

from transforms import bounded
from transforms.listing import is_local
from transforms.outputs import LOCK_FILE


class LockHeld(RuntimeError):
    """Another run holds the output folder's lock."""

    def __init__(self, path: str, holder: dict):
        super().__init__(f"{path} is held by run {holder.get('run_id')}")
        self.path = path
        self.holder = holder


def lock_path(output_dir: str) -> str:
    return FileSystems.join(output_dir, LOCK_FILE)


def _process_start(pid: int) -> str | None:
    """The start time of process `pid` (Linux: clock ticks since boot), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def holder_record(run_id: str, runner: str, **extra) -> dict:
    """What the lock says about the run that holds it."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in some containers
        user = str(os.getuid()) if hasattr(os, "getuid") else "?"
    return {
        "run_id": run_id,
        "runner": runner,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_started": _process_start(os.getpid()),
        "user": user,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
    }


def local_holder_alive(holder: dict) -> bool | None:
    """For a lock taken on this host: whether its process still runs. None when it was taken elsewhere."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return None
    pid = holder["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    started = holder.get("pid_started")
    return started is None or _process_start(pid) in (None, started)


def read_lock(output_dir: str) -> dict | None:
    """The lock's holder record, None when there is no lock."""
    path = lock_path(output_dir)
    try:
        with FileSystems.open(path, compression_type="uncompressed") as f:
            text = f.read().decode("utf-8", "replace")
    except Exception:
        if FileSystems.exists(path):
            raise
        return None
    try:
        holder = bounded.loads(text)
    except ValueError:
        holder = None
    return holder if isinstance(holder, dict) else {"run_id": None, "unreadable": text[:200]}


class _LocalLock:
    def __init__(self, path: str):
        self.path = path

    def create(self, data: bytes) -> bool:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True

    def read(self):
        try:
            with open(self.path, "rb") as f:
                return f.read(), None
        except FileNotFoundError:
            return None, None

    def remove(self, data: bytes, _version) -> bool:
        """Remove the lock if it still holds `data`: moved aside first, so two removers cannot both win."""
        aside = f"{self.path}.{uuid.uuid4().hex}.stale"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        with open(aside, "rb") as f:
            moved = f.read()
        if moved != data:  # replaced meanwhile: put the new holder's lock back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
            os.unlink(aside)
            return False
        os.unlink(aside)
        return True


class _GcsLock:
    """The lock object on GCS, created and removed with generation preconditions."""

    def __init__(self, path: str, client):
        bucket, _, name = path[len("gs://"):].partition("/")
        self._blob_name = name
        self._bucket = client.bucket(bucket)

    def create(self, data: bytes) -> bool:
        from google.api_core import exceptions

        try:
            self._bucket.blob(self._blob_name).upload_from_string(
                data, content_type="application/json", if_generation_match=0)
        except exceptions.PreconditionFailed:
            return False
        return True

    def read(self):
        blob = self._bucket.get_blob(self._blob_name)
        if blob is None:
            return None, None
        from google.api_core import exceptions

        try:
            return blob.download_as_bytes(if_generation_match=blob.generation), blob.generation
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            return self.read()

    def remove(self, data: bytes, version) -> bool:
        from google.api_core import exceptions

        try:
            self._bucket.blob(self._blob_name).delete(if_generation_match=version)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            return False
        return True


def _lock_store(output_dir: str, gcs_client=None):
    path = lock_path(output_dir)
    if is_local(output_dir):
        return _LocalLock(path)
    if path.startswith("gs://"):
        if gcs_client is None:
            from apache_beam.io.gcp import gcsio

            gcs_client = gcsio.GcsIO().client
        return _GcsLock(path, gcs_client)
    raise ValueError(f"cannot lock {output_dir}: only local folders and gs:// are supported")


def acquire_lock(output_dir: str, holder: dict, why_stale: Callable[[dict], str | None], gcs_client=None) -> str | None:
    """Take the output folder's lock for `holder`, or raise LockHeld.

    `why_stale(other)` says why another holder's lock is stale (its process or
    job has ended), or None while it may still be running. A stale lock is
    taken over: removed only if unchanged since it was judged, then created anew.
    Returns the reason when a stale lock was taken over, else None.
    """
    store = _lock_store(output_dir, gcs_client)
    data = (json.dumps(holder, indent=2) + "\n").encode("utf-8")
    taken_over = None
    for _ in range(10):
        if store.create(data):
            return taken_over
        current, version = store.read()
        if current is None:
            continue  # released meanwhile
        try:
            other = bounded.loads(current.decode("utf-8"))
        except ValueError:
            other = None
        if not isinstance(other, dict):
            other = {"run_id": None, "unreadable": current[:200].decode("utf-8", "replace")}
        reason = why_stale(other)
        if reason is None:
            raise LockHeld(lock_path(output_dir), other)
        if store.remove(current, version):
            taken_over = reason
    raise LockHeld(lock_path(output_dir), {"run_id": None, "note": "the lock kept changing"})


def release_lock(output_dir: str, run_id: str, gcs_client=None) -> bool:
    """Remove the lock if `run_id` holds it; returns whether it did."""
    store = _lock_store(output_dir, gcs_client)
    current, version = store.read()
    if current is None:
        return False
    try:
        if bounded.loads(current.decode("utf-8")).get("run_id") != run_id:
            return False
    except (ValueError, AttributeError):
        return False
    return store.remove(current, version)


def update_lock(output_dir: str, run_id: str, gcs_client=None, **fields) -> bool:
    """Add `fields` (such as the Dataflow job id) to the lock `run_id` holds."""
    store = _lock_store(output_dir, gcs_client)
    current, version = store.read()
    if current is None:
        return False
    holder = bounded.loads(current.decode("utf-8"))
    if holder.get("run_id") != run_id:
        return False
    holder.update(fields)
    data = (json.dumps(holder, indent=2) + "\n").encode("utf-8")
    if isinstance(store, _LocalLock):
        temp = f"{store.path}.{uuid.uuid4().hex}.new"
        with open(temp, "wb") as f:
            f.write(data)
        os.replace(temp, store.path)
        return True
    from google.api_core import exceptions

    try:
        store._bucket.blob(store._blob_name).upload_from_string(
            data, content_type="application/json", if_generation_match=version)
    except exceptions.PreconditionFailed:
        return False
    return True
