"""The output folder's lock, `.image-tfrecords.lock`: one run per folder, on a local folder and on gs://.

How the lock decides that its holder is alive (docs/guarantees.md, "How the lock decides liveness"):

* A local folder: the kernel holds the lock. The run keeps the lock file open
  with an exclusive `flock` for its whole life, and the kernel releases it when
  the process ends, however it ends. Another run that cannot take the flock
  knows that the holder is alive, whatever process ids it can see (a container
  or PID namespace of its own, the same host name), and one that can knows
  that it is not: the flock is its takeover, which no other taker can share.
  The file's JSON only says who holds it, for the messages.
* gs://: there is no kernel. The lock object is created and removed with
  generation preconditions (a takeover removes exactly the generation it
  judged, so two takers cannot both win), and liveness is judged from facts
  that hold across hosts: a Dataflow job's state, or for a local run its
  process, only where that process is visible (the same host, kernel boot and
  PID namespace). Any other holder counts as alive.
"""

from __future__ import annotations

import errno
import fcntl
import getpass
import json
import logging
import os
import re
import socket
import stat
import time
import urllib.request
from collections.abc import Callable

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms.base import bounded
from transforms.base.dataset_format import LOCK_FILE
from transforms.base.paths import is_gcs, is_local

# What a local lock file says of how it is held: a lock file without it was written by an earlier version of this
# tool, which held no flock, and whose holder is judged by its process.
HELD_WITH = "flock"
# How often, and how long apart, a taker tries a flock that is held before it reports the holder: a takeover
# in progress, or a --if_exists=skip run looking, holds it for a moment only.
_FLOCK_TRIES, _FLOCK_PAUSE_S = 10, 0.02
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EBADF)  # EBADF: NFS, read-only


class LockHeld(RuntimeError):
    """Another run holds the output folder's lock."""

    def __init__(self, path: str, holder: dict):
        super().__init__(f"{path} is held by {describe_holder(holder)}")
        self.path = path
        self.holder = holder


class LockUnsupported(RuntimeError):
    """The output folder cannot be locked: its file system has no flock, or the lock's name is not a file of ours.

    The message says what to do.
    """


def lock_path(output_dir: str) -> str:
    return FileSystems.join(output_dir, LOCK_FILE)


def _process_start(pid: int) -> str | None:
    """The start time of process `pid` (Linux: clock ticks since boot), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _read_small(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(200).decode("ascii", "replace").strip() or None
    except OSError:
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def holder_record(run_id: str, runner: str, **extra) -> dict:
    """What the lock says about the run that holds it.

    `boot_id` and `pid_namespace` say where its `pid` means something: only a
    process of the same kernel boot and PID namespace can look it up.
    """
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
        "boot_id": _read_small("/proc/sys/kernel/random/boot_id"),
        "pid_namespace": _pid_namespace(),
        "user": user,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
    }


def pid_visible(holder: dict) -> bool:
    """Whether the holder's process id can be looked up here: the same host, kernel boot and PID namespace.

    A lock written by an earlier version of this tool records only the host.
    """
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    return all(holder.get(name) is None or holder.get(name) == here
               for name, here in (("boot_id", _read_small("/proc/sys/kernel/random/boot_id")),
                                  ("pid_namespace", _pid_namespace())))


def local_holder_alive(holder: dict) -> bool | None:
    """Whether the holder's process still runs, where its pid can be looked up; None elsewhere (`pid_visible`)."""
    if not pid_visible(holder):
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


def describe_holder(holder: dict) -> str:
    """The run a lock names, in words, with only what its lock file says (never "run None")."""
    if holder.get("runner") == "dataflow":
        job = f"Dataflow job {holder['job_id']}" if holder.get("job_id") else (
            f"a Dataflow launch (job name {holder.get('job_name') or 'not recorded'})")
        where = ", ".join(f"{name} {holder[name]}" for name in ("project", "region") if holder.get(name))
        return f"{job}{' in ' + where if where else ''}, {_run_details(holder)}"
    return _run_details(holder)


def _run_details(holder: dict) -> str:
    if not holder.get("run_id"):
        text = holder.get("unreadable")
        return ("a run whose lock file does not say which" + (f" (it reads {text[:60]!r})" if text else "")
                + (f" ({holder['note']})" if holder.get("note") else ""))
    facts = []
    if holder.get("pid") is not None:
        facts.append(f"process {holder['pid']}" + (f" on {holder['host']}" if holder.get("host") else ""))
    elif holder.get("host"):
        facts.append(f"on {holder['host']}")
    if holder.get("created"):
        facts.append(f"started {holder['created']}" + (f" by {holder['user']}" if holder.get("user") else ""))
    elif holder.get("user"):
        facts.append(f"by {holder['user']}")
    return f"run {holder['run_id']}" + (f" ({', '.join(facts)})" if facts else "")


def _parse_holder(data: bytes) -> dict:
    """A lock file's holder record; for one that is not a JSON object, what it reads."""
    text = data.decode("utf-8", "replace")
    try:
        holder = bounded.loads(text)
    except ValueError:
        holder = None
    return holder if isinstance(holder, dict) else {"run_id": None, "unreadable": text[:200]}


# --- a local folder: the kernel's flock -----------------------------------------------------------------------

# The local locks this process holds: lock path -> the open file whose flock holds it (kept open for the run).
_HELD: dict[str, int] = {}


def _same_file(fd: int, path: str) -> bool:
    """Whether `path` still names the file open as `fd` (a released lock file is removed, and a new one made)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _read_fd(fd: int) -> bytes:
    return os.pread(fd, 1 << 16, 0)


def _read_path(path: str) -> bytes:
    fd = _open_regular(path, os.O_RDONLY)
    try:
        return _read_fd(fd)
    finally:
        os.close(fd)


def _rewrite(fd: int, data: bytes) -> None:
    """The lock file's record replaced in place (its inode, which the flock is on, stays)."""
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


def _flock(fd: int, path: str) -> bool:
    """Take the exclusive flock of `fd`: False while another process holds it."""
    for attempt in range(_FLOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < _FLOCK_TRIES:
                time.sleep(_FLOCK_PAUSE_S)
        except OSError as e:
            if e.errno in _NO_FLOCK:
                raise LockUnsupported(f"the file system of {path} cannot lock a file (flock: {e.strerror}): write "
                                      "to a local disk, or an NFS mount with locking") from None
            raise
    return False


def _live_holder(path: str) -> dict:
    """The record of a lock file whose flock another process holds; it may be writing it just now."""
    holder = {"run_id": None}
    for _ in range(_FLOCK_TRIES):
        try:
            holder = _parse_holder(_read_path(path))
        except (FileNotFoundError, LockUnsupported):
            return {"run_id": None, "note": "it was released just now"}
        if holder.get("run_id"):
            break
        time.sleep(_FLOCK_PAUSE_S)
    return holder


def _open_regular(path: str, flags: int, mode: int = 0o644) -> int:
    """Open the lock file itself: never through a symbolic link, never a FIFO, device or folder in its place.

    Raises:
        LockUnsupported: something else has the lock's name.
        FileNotFoundError: there is none (without O_CREAT).
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise
        fd = None
    if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    if fd is not None:
        os.close(fd)
    raise LockUnsupported(f"{path} is not a regular file (a symbolic link, folder, FIFO or device), and this tool "
                          "never makes one there: remove it, or choose another folder")


def _open_lock_file(path: str) -> tuple[int, bool] | None:
    """The lock file, open (made if missing), and whether this process may write it; None if it just went."""
    try:
        return _open_regular(path, os.O_RDWR | os.O_CREAT), True
    except PermissionError:  # another user's lock file (a shared folder): judged, and replaced by a new file
        try:
            return _open_regular(path, os.O_RDONLY), False
        except FileNotFoundError:
            return None


def _acquire_local(path: str, holder: dict, why_stale: Callable[[dict], str | None]) -> str | None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    data = (json.dumps({**holder, "held_with": HELD_WITH}, indent=2) + "\n").encode("utf-8")
    taken_over = None
    for _ in range(10):
        opened = _open_lock_file(path)
        if opened is None:
            continue
        fd, writable = opened
        try:
            if not _flock(fd, path):
                raise LockHeld(path, _live_holder(path))
            if not _same_file(fd, path):
                continue  # its holder released it (removed the file) before we took the flock: take the new one
            previous = _read_fd(fd)
            if previous.strip():  # a holder that has ended without releasing the lock (killed)
                other = _parse_holder(previous)
                if other.get("held_with") == HELD_WITH:
                    taken_over = f"{describe_holder(other)} no longer holds it: its process has ended"
                else:  # written by an earlier version, which held no flock: judged by its process
                    taken_over = why_stale(other)
                    if taken_over is None:
                        raise LockHeld(path, other)
            if not writable:
                os.unlink(path)  # under its flock, so no other taker judges it again: the next try makes ours
                continue
            _rewrite(fd, data)
            _HELD[path], fd = fd, None
            return taken_over
        finally:
            if fd is not None:
                os.close(fd)  # releases our flock, if we took it
    raise LockHeld(path, {"run_id": None, "note": "the lock kept changing"})


def _release_local(path: str, run_id: str) -> bool:
    """Remove the lock file if it names `run_id`; the flock goes with the file, if this process holds it.

    The job's last step releases the lock from a worker process, which holds no
    flock: while the launcher holds it, no other run can change the file.
    """
    fd = _HELD.get(path)
    if fd is None:
        try:
            if _parse_holder(_read_path(path)).get("run_id") != run_id:
                return False
            os.unlink(path)
        except (FileNotFoundError, LockUnsupported):
            return False
        return True
    if _parse_holder(_read_fd(fd)).get("run_id") != run_id:
        return False
    del _HELD[path]
    try:
        removed = _same_file(fd, path)
        if removed:
            os.unlink(path)  # while the flock is still ours: the next run makes a new file
        return removed
    finally:
        os.close(fd)


def lock_holder(output_dir: str, why_stale: Callable[[dict], str | None], gcs_client=None) -> dict | None:
    """The record of the live run that holds the output folder's lock, None when no live run does.

    Changes nothing: a stale lock stays for the next run to take over.
    """
    if not is_local(output_dir):
        current, _ = _lock_store(output_dir, gcs_client).read()
        if current is None:
            return None
        other = _parse_holder(current)
        return other if why_stale(other) is None else None
    path = os.path.abspath(lock_path(output_dir))
    if path in _HELD:
        return _parse_holder(_read_fd(_HELD[path]))
    try:
        fd = _open_regular(path, os.O_RDONLY)
    except (FileNotFoundError, LockUnsupported):  # none; or not a file of ours, which taking the lock reports
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _live_holder(path)
        except OSError:  # a file system without flock: taking the lock will say so
            return None
        other = _parse_holder(_read_fd(fd))
        if other.get("held_with") == HELD_WITH or not (other.get("run_id") or other.get("unreadable")):
            return None
        return other if why_stale(other) is None else None
    finally:
        os.close(fd)


def read_lock(output_dir: str) -> dict | None:
    """The lock's holder record, None when there is no lock."""
    path = lock_path(output_dir)
    try:
        with FileSystems.open(path, compression_type="uncompressed") as f:
            data = f.read()
    except Exception:
        if FileSystems.exists(path):
            raise
        return None
    return _parse_holder(data)


# --- gs://: generation preconditions ---------------------------------------------------------------------------


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

    def replace(self, data: bytes, version) -> bool:
        from google.api_core import exceptions

        try:
            self._bucket.blob(self._blob_name).upload_from_string(
                data, content_type="application/json", if_generation_match=version)
        except exceptions.PreconditionFailed:
            return False
        return True

    def remove(self, version) -> bool:
        from google.api_core import exceptions

        try:
            self._bucket.blob(self._blob_name).delete(if_generation_match=version)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            return False
        return True


def _lock_store(output_dir: str, gcs_client=None) -> _GcsLock:
    path = lock_path(output_dir)
    if is_gcs(path):
        if gcs_client is None:
            from transforms.base import gcs

            gcs_client = gcs.client()
        return _GcsLock(path, gcs_client)
    raise ValueError(f"cannot lock {output_dir}: only local folders and gs:// are supported")


def acquire_lock(output_dir: str, holder: dict, why_stale: Callable[[dict], str | None], gcs_client=None) -> str | None:
    """Take the output folder's lock for `holder`, or raise LockHeld.

    A local folder's lock is held by the kernel (a flock, kept until
    `release_lock` or the end of this process): it is stale exactly when no
    process holds its flock. `why_stale(other)` judges a lock without one (on
    gs://, or written by an earlier version of this tool): why it is stale (its
    process or job has ended), or None while its run may still be going on.
    On gs:// a stale lock is removed only if unchanged since it was judged (its
    generation), then created anew.
    Returns the reason when a stale lock was taken over, else None.

    Raises:
        LockHeld: a live run holds it.
        LockUnsupported: the local folder's file system cannot lock a file.
    """
    if is_local(output_dir):
        return _acquire_local(os.path.abspath(lock_path(output_dir)), holder, why_stale)
    store = _lock_store(output_dir, gcs_client)
    data = (json.dumps(holder, indent=2) + "\n").encode("utf-8")
    taken_over = None
    for _ in range(10):
        if store.create(data):
            return taken_over
        current, version = store.read()
        if current is None:
            continue  # released meanwhile
        other = _parse_holder(current)
        reason = why_stale(other)
        if reason is None:
            raise LockHeld(lock_path(output_dir), other)
        if store.remove(version):
            taken_over = reason
    raise LockHeld(lock_path(output_dir), {"run_id": None, "note": "the lock kept changing"})


def release_lock(output_dir: str, run_id: str, gcs_client=None) -> bool:
    """Remove the lock if `run_id` holds it; returns whether it did."""
    if is_local(output_dir):
        return _release_local(os.path.abspath(lock_path(output_dir)), run_id)
    store = _lock_store(output_dir, gcs_client)
    current, version = store.read()
    if current is None or _parse_holder(current).get("run_id") != run_id:
        return False
    return store.remove(version)


def update_lock(output_dir: str, run_id: str, gcs_client=None, **fields) -> bool:
    """Add `fields` (such as the Dataflow job id) to the lock `run_id` holds."""
    if is_local(output_dir):
        path = os.path.abspath(lock_path(output_dir))
        fd = _HELD.get(path)
        if fd is None:
            return False  # only its holder's process writes a local lock
        holder = _parse_holder(_read_fd(fd))
        if holder.get("run_id") != run_id:
            return False
        _rewrite(fd, (json.dumps({**holder, **fields}, indent=2) + "\n").encode("utf-8"))
        return True
    store = _lock_store(output_dir, gcs_client)
    current, version = store.read()
    if current is None:
        return False
    holder = _parse_holder(current)
    if holder.get("run_id") != run_id:
        return False
    return store.replace((json.dumps({**holder, **fields}, indent=2) + "\n").encode("utf-8"), version)


# --- a Dataflow job's own id, recorded by the job (Flex Template launches) -------------------------------------

# Where a Dataflow worker VM's metadata server is: Google's libraries read this variable (tests point it at a
# stand-in); the job's id is its instance attribute `job_id`, as Beam's own gce_metadata_util reads it.
METADATA_HOST_ENV = "GCE_METADATA_HOST"
_JOB_ID = re.compile(r"[-_0-9A-Za-z]{1,128}")
_LOG = logging.getLogger(__name__)


def dataflow_job_id(timeout_s: float = 5.0) -> str | None:
    """The id of the Dataflow job this process works for, from the VM's metadata server; None off Dataflow."""
    host = os.environ.get(METADATA_HOST_ENV) or "metadata.google.internal"
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/instance/attributes/job_id",
                                     headers={"Metadata-Flavor": "Google"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        with opener.open(request, timeout=timeout_s) as response:
            text = response.read(200).decode("ascii", "replace").strip()
    except (OSError, ValueError):
        return None
    return text if _JOB_ID.fullmatch(text) else None


def record_job_id(_, output_dir: str, run_id: str) -> None:
    """Write the job's own id into the lock of run `run_id`: from then on, the job's state says if it is alive.

    A Flex Template launch writes its lock before Dataflow has a job to run, so the lock holds no job id
    until the job itself records it here, on a worker. Without it a lock is never taken over (see
    `pipeline.cloud.dataflow_lock_stale`), so failing to record it only costs a retry the takeover.
    """
    job_id = dataflow_job_id()
    if job_id is None:
        _LOG.warning("Could not learn this Dataflow job's id from the metadata server: the lock of run %s in %s "
                     "keeps naming no job", run_id, output_dir)
        return
    try:
        if not update_lock(output_dir, run_id, job_id=job_id):
            _LOG.warning("The lock of %s is no longer run %s's: its job id was not recorded", output_dir, run_id)
    except Exception as e:  # never fail the job for it
        _LOG.warning("Could not record job id %s in the lock of %s (%s)", job_id, output_dir, e)


class RecordJobId(beam.PTransform):
    """A step of its own, at the start of a job: the job records its id in the output folder's lock."""

    def __init__(self, output_dir: str, run_id: str):
        super().__init__()
        self._output_dir, self._run_id = output_dir, run_id

    def expand(self, pbegin):
        return (pbegin | "Once" >> beam.Create([None])
                | "Record" >> beam.Map(record_job_id, self._output_dir, self._run_id))
