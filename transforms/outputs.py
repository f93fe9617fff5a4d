"""The output folder: every name this tool writes there, its lock, and how a finished run publishes its files.

Layout of --output_dir while a run is going on:

    .image-tfrecords.lock                     who is writing here (one run at a time)
    .image-tfrecords-tmp/<run id>/shards/     the run's shards, each written once under its standard name
    <the previous complete dataset, if any>   untouched until this run has finished

A run's files take their final names only when it publishes them, after every
shard is written and counted: the previous dataset's files are removed, the new
shards renamed into place (under their Kaggle names with --shard_names=kaggle),
then errors.jsonl, labels.txt, TFDS's files (label.labels.txt, features.json,
dataset_info.json) and, last, image_tfrecords.json, the completion marker. A
folder without image_tfrecords.json therefore never holds a file named like a
shard of a complete run, and `--overwrite` never loses the old dataset before the
new one is complete. (Format version 1 of this tool wrote its own description as
dataset_info.json, the marker then: `completion_marker` knows both.)

Each run works in a folder of its own (its run id), and removes only that
folder: a second run, or a scheduler's retry, can never delete a running job's
temporary files.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable

from apache_beam.io.filesystems import FileSystems

from transforms import bounded, tfds_metadata
from transforms.examples import SCHEMAS
from transforms.layout import SPLITS
from transforms.listing import is_local

# This tool's description of the dataset (counts, shards, options), the completion marker: written last.
INFO_FILE = "image_tfrecords.json"
LABELS_FILE = "labels.txt"
ERRORS_FILE = "errors.jsonl"
# TensorFlow Datasets' files (transforms/tfds_metadata.py), so that tfds.builder_from_directory loads the folder.
TFDS_INFO_FILE = tfds_metadata.TFDS_INFO_FILE
FEATURES_FILE = tfds_metadata.TFDS_FEATURES_FILE
TFDS_LABELS_FILES = tuple(sorted({tfds_metadata.labels_file(schema) for schema in SCHEMAS}))
# Format version 1's description, under TFDS's name: a folder holding one is a complete dataset of that version.
LEGACY_INFO_FILE = "dataset_info.json"
# In the order they are published.
DESCRIPTION_FILES = (ERRORS_FILE, LABELS_FILE, *TFDS_LABELS_FILES, FEATURES_FILE, TFDS_INFO_FILE, INFO_FILE)

# Everything temporary lives in this one folder, which this tool alone writes.
TEMP_DIR = ".image-tfrecords-tmp"
LOCK_FILE = ".image-tfrecords.lock"

_SPLITS = "|".join(SPLITS)
SHARD_NAME = re.compile(r"(?P<split>" + _SPLITS + r")-(?P<index>\d{5,})-of-(?P<count>\d{5,})"
                        r"\.(?:tfrecord(?:\.gz)?|array_record)")
# --shard_names=kaggle: the shard's index and record count, as Kaggle's notebooks count them (train00-2071.tfrec).
KAGGLE_NAME = re.compile(r"(?P<split>" + _SPLITS + r")(?P<index>\d{2,})-(?P<records>\d+)"
                         r"\.(?:tfrec(?:\.gz)?|array_record)")
# --index_files: a shard's index for DALI and the tfrecord package, beside it (train-00000-of-00004.idx,
# train00-2071.idx).
INDEX_NAME = re.compile(r"(?:" + _SPLITS + r")(?:-\d{5,}-of-\d{5,}|\d{2,}-\d+)\.idx")
_DESCRIPTIONS = "|".join(re.escape(name) for name in DESCRIPTION_FILES)
# Beam's temporary folders of earlier versions of this tool, which wrote next to the shards.
_BEAM_TEMP_DIR = r"beam-temp-(?:" + _SPLITS + "|" + re.escape(os.path.splitext(ERRORS_FILE)[0]) + r")-[0-9a-f]{32}"
BEAM_TEMP_DIR = re.compile(_BEAM_TEMP_DIR)
# The final names of a run's files: replaced when a new run publishes.
_FINAL_NAME = re.compile(re.sub(r"\?P<\w+>", "?:", "|".join([SHARD_NAME.pattern, KAGGLE_NAME.pattern,
                                                             INDEX_NAME.pattern, _DESCRIPTIONS])))
# Every name this tool writes, relative to --output_dir, except the lock. Nothing else there is ever
# removed, also not names that merely look alike (train-notes.txt, beam-temp-mine/, .notes.tmp-1).
_OWN_NAME = re.compile(
    "|".join(
        [
            _FINAL_NAME.pattern,
            r"\.(?:" + _DESCRIPTIONS + r")\.tmp-[0-9a-f]{32}",  # describe.write_lines' temporary names
            _BEAM_TEMP_DIR + r"/.+",
            re.escape(TEMP_DIR) + r"/.+",  # runs' temporary folders
        ]
    )
)


def new_run_id() -> str:
    """A run's id: the UTC time (readable in listings) and 8 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def relative_to(path: str, folder: str) -> str:
    return path[len(folder.rstrip("/")):].lstrip("/")


def index_name(shard_file: str) -> str:
    """The index file of a shard: its name without .tfrecord (or .tfrec), plus .idx (train-00000-of-00004.idx).

    Not `<shard>.tfrecord.idx`: the shard glob `train-*.tfrecord*` would read it as a shard.
    """
    stem = shard_file
    for suffix in (".tfrecord", ".tfrec"):
        if shard_file.endswith(suffix):
            stem = shard_file[:-len(suffix)]
            break
    return stem + ".idx"


def run_dir(output_dir: str, run_id: str) -> str:
    """The temporary folder of one run."""
    return FileSystems.join(output_dir, TEMP_DIR, run_id)


def shards_dir(output_dir: str, run_id: str) -> str:
    return FileSystems.join(run_dir(output_dir, run_id), "shards")


def _all_files(folder: str) -> list[str]:
    """Every file below `folder`: local folders by walking them, others through FileSystems."""
    if is_local(folder):
        found = []
        for root, dirs, files in os.walk(folder):
            found.extend(os.path.join(root, name) for name in files)
            # Links to folders are listed, not followed: they are never this tool's.
            found.extend(os.path.join(root, d) for d in dirs if os.path.islink(os.path.join(root, d)))
        return found
    pattern = FileSystems.join(folder, "**")
    return [m.path for m in FileSystems.match([pattern])[0].metadata_list]


def own_outputs(output_dir: str) -> list[str]:
    """Paths in `output_dir` that this tool writes (final files, descriptions, temporary files and folders)."""
    return sorted(p for p in _all_files(output_dir) if _OWN_NAME.fullmatch(relative_to(p, output_dir)))


def final_outputs(output_dir: str) -> list[str]:
    """The files of a complete dataset in `output_dir` (shards and descriptions), as a run publishes them."""
    if is_local(output_dir):
        if not os.path.isdir(output_dir):
            return []
        names = [n for n in os.listdir(output_dir) if os.path.isfile(os.path.join(output_dir, n))]
        return sorted(os.path.join(output_dir, n) for n in names if _FINAL_NAME.fullmatch(n))
    pattern = FileSystems.join(output_dir, "*")
    found = FileSystems.match([pattern])[0].metadata_list
    return sorted(m.path for m in found if _FINAL_NAME.fullmatch(relative_to(m.path, output_dir)))


def delete_tree(folder: str) -> None:
    """Delete `folder` and everything below it (local or gs://); a missing folder is fine."""
    if is_local(folder):
        shutil.rmtree(folder, ignore_errors=True)
        return
    paths = [m.path for m in FileSystems.match([FileSystems.join(folder, "**")])[0].metadata_list]
    if paths:
        FileSystems.delete(paths)


def remove_run_dir(output_dir: str, run_id: str) -> None:
    """Delete a run's temporary folder, and the folder of all runs' when it is left empty."""
    delete_tree(run_dir(output_dir, run_id))
    if is_local(output_dir):
        try:
            os.rmdir(os.path.join(output_dir, TEMP_DIR))
        except OSError:
            pass  # another run's folder (a leftover, or being deleted) is in it


def _read_json(path: str):
    try:
        with FileSystems.open(path, compression_type="uncompressed") as f:
            return bounded.loads(f.read().decode("utf-8"))
    except Exception:  # none there, or not readable
        return None


def completion_marker(output_dir: str) -> str | None:
    """The file that marks `output_dir`'s dataset complete, None when there is none.

    image_tfrecords.json; or, for a dataset of format version 1, its dataset_info.json (this
    tool's format, with a format_version, not TFDS's).
    """
    marker = FileSystems.join(output_dir, INFO_FILE)
    if FileSystems.exists(marker):
        return marker
    legacy = FileSystems.join(output_dir, LEGACY_INFO_FILE)
    if FileSystems.exists(legacy):
        info = _read_json(legacy)
        if isinstance(info, dict) and "format_version" in info:
            return legacy
    return None


def publish_shards(output_dir: str, run_id: str, shard_files: list) -> None:
    """Replace the folder's previous dataset with this run's shards; the descriptions follow, by the caller.

    `shard_files` names every file of the run's shards folder to publish (the
    shards and their index files): a name, or a (name in the run's folder,
    final name) pair for a file whose final name differs (--shard_names=kaggle).
    Each file is renamed once, from the run's folder to its final name.

    The completion marker goes first (image_tfrecords.json, or an earlier version's
    dataset_info.json), so that from here until the caller writes the new one, the
    folder is visibly incomplete.
    """
    pairs = [(entry, entry) if isinstance(entry, str) else tuple(entry) for entry in shard_files]
    for name in (INFO_FILE, LEGACY_INFO_FILE):
        marker = FileSystems.join(output_dir, name)
        if FileSystems.exists(marker):
            FileSystems.delete([marker])
    new = {final for _, final in pairs}
    old = [p for p in final_outputs(output_dir) if relative_to(p, output_dir) not in new]
    if old:
        FileSystems.delete(old)
    source = shards_dir(output_dir, run_id)
    # A retried attempt of this step finds the files an earlier attempt renamed already in place.
    moves = [(FileSystems.join(source, temp), FileSystems.join(output_dir, final)) for temp, final in pairs]
    moves = [(src, dst) for src, dst in moves if FileSystems.exists(src) or not FileSystems.exists(dst)]
    if moves:
        FileSystems.rename([src for src, _ in moves], [dst for _, dst in moves])


# --- the lock -------------------------------------------------------------------------------------------------


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
