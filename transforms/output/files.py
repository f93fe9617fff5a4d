"""Plain file operations on local and gs:// paths through Beam's file systems: list, read, write, move, delete."""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from apache_beam.io.filesystems import FileSystems

from transforms.base import bounded, gcs
from transforms.base.paths import is_local

# On gs:// (the copies and deletions of publishing): Cloud Storage's batches of at most 100 operations, up to 64 of
# them at once, as Beam's FileBasedSink finalizes with up to 64 rename threads.
GCS_BATCH = 100
PUBLISH_THREADS = 64


def list_folder(folder: str, recursive: bool = False) -> dict[str, int]:
    """The files in `folder` (below it, with `recursive`) and their sizes in bytes: one listing.

    On gs://, one paged listing of the folder's prefix (with `recursive=False`, a delimited one, which does not
    descend into subfolders); locally, lstat of each entry (a link is listed, never followed, with its own size).
    A missing folder has none.
    """
    if is_local(folder):
        if not os.path.isdir(folder) or os.path.islink(folder):
            return {}
        found = {}
        for root, dirs, files in os.walk(folder) if recursive else [(folder, [], os.listdir(folder))]:
            for name in files:
                path = os.path.join(root, name)
                entry = os.lstat(path)
                if not stat.S_ISDIR(entry.st_mode):
                    found[path] = entry.st_size
            found.update((os.path.join(root, d), 0) for d in dirs if os.path.islink(os.path.join(root, d)))
        return found
    from apache_beam.io.gcp.gcsio import parse_gcs_path
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, prefix = parse_gcs_path(folder.rstrip("/") + "/", object_optional=True)
    blobs = gcs.client().list_blobs(bucket, prefix=prefix, delimiter=None if recursive else "/",
                                          retry=DEFAULT_RETRY)
    return {f"gs://{bucket}/{blob.name}": blob.size or 0 for blob in blobs}


def exists(path: str) -> bool:
    """Whether `path` exists; a local link counts, also a dangling one (it is checked, never followed)."""
    return os.path.lexists(path) if is_local(path) else FileSystems.exists(path)


def present(paths: list[str]) -> set[str]:
    """Which of `paths` exist (a local link counts): locally by lstat, elsewhere one listing per folder."""
    if not paths or is_local(paths[0]):
        return {path for path in paths if os.path.lexists(path)}
    listed = set()
    for folder in sorted({path.rsplit("/", 1)[0] for path in paths}):
        listed.update(list_folder(folder))
    return {path for path in paths if path in listed}


def read_text(path: str) -> str | None:
    """The UTF-8 text of the file at `path` through Beam's file systems, None when there is none.

    Raises:
        ValueError: not UTF-8; OSError: what the file system says.
    """
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path, compression_type="uncompressed") as f:
        return f.read().decode("utf-8")


def read_json(path: str):
    """The JSON value in the file at `path` (parsed with bounds, `bounded.loads`), None when there is none or it is
    not readable."""
    try:
        return bounded.loads(read_text(path))
    except Exception:  # none there, or not readable
        return None


def write_file(path: str, lines: Iterable[str]) -> None:
    """Write `lines` (streamed, each ending in a newline) to `path`."""
    with FileSystems.create(path, mime_type="application/octet-stream") as f:
        for line in lines:
            f.write(line.encode("utf-8"))


def write_atomically(path: str, data: bytes) -> None:
    """Write `data` to `path` under a temporary name first, then rename it: a reader finds the whole file or none
    (on GCS, one object write and a server-side copy)."""
    folder, name = path.rsplit("/", 1)
    temp = FileSystems.join(folder, f".{name}.tmp-{uuid.uuid4().hex}")
    with FileSystems.create(temp, mime_type="application/octet-stream", compression_type="uncompressed") as f:
        f.write(data)
    FileSystems.rename([temp], [path])


def delete_files(paths: list[str]) -> None:
    """Delete files: locally one by one (each must exist); on gs://, in batches of 100, up to 64 at once (a
    missing one is fine there).

    Raises:
        OSError: naming the first file that could not be deleted, and how many more.
    """
    if not paths:
        return
    if is_local(paths[0]):
        FileSystems.delete(paths)
        return
    results = _in_parallel(lambda part: _gcsio(part[0]).delete_batch(part), paths, GCS_BATCH)
    failed = [(path, error) for path, error in results if error]
    if failed:
        path, error = failed[0]
        raise OSError(f"deleting {path} failed ({error}), and {len(failed) - 1} more")


def delete_tree(folder: str) -> None:
    """Delete `folder` and everything below it (local or gs://); a missing folder is fine.

    A local folder below --output_dir must have passed `ownership.check_own_tree` first (no link, device or mount
    point in it).
    """
    if is_local(folder):
        shutil.rmtree(folder, ignore_errors=True)
        return
    delete_files(sorted(list_folder(folder, recursive=True)))


def move_files(moves: list) -> None:
    """Give files new names, `moves` being (source, destination) pairs: renames locally; on gs://, server-side
    copies in batches of 100, up to 64 batches at once (a rename there is a copy and a delete: the sources stay, for
    the caller to delete).

    Raises:
        OSError: on gs://, naming the first copy that failed, and how many more.
    """
    if not moves:
        return
    if is_local(moves[0][0]):
        FileSystems.rename([src for src, _ in moves], [dst for _, dst in moves])
        return
    pairs = [tuple(move) for move in moves]
    results = _in_parallel(lambda part: _gcsio(part[0][0]).copy_batch(part), pairs, GCS_BATCH)
    failed = [(src, dst, error) for src, dst, error in results if error]
    if failed:
        src, dst, error = failed[0]
        raise OSError(f"copying {src} to {dst} failed ({error}), and {len(failed) - 1} more")


def _in_parallel(work: Callable[[list], list], items: list, chunk: int) -> list:
    """`work` on `items` in chunks of `chunk`, up to PUBLISH_THREADS chunks at once; their results, in order."""
    chunks = [items[start:start + chunk] for start in range(0, len(items), chunk)]
    if len(chunks) <= 1:
        return [result for part in chunks for result in work(part)]
    with ThreadPoolExecutor(min(PUBLISH_THREADS, len(chunks)), thread_name_prefix="publish") as pool:
        return [result for part in pool.map(work, chunks) for result in part]


def _gcsio(path: str):
    """Beam's GcsIO for `path` on the process's one storage client (`transforms.base.gcs`), shared by the threads."""
    from apache_beam.io.gcp import gcsio

    return gcsio.GcsIO(storage_client=gcs.client())
