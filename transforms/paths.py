"""Paths without Apache Beam or TensorFlow: is this path local, a path below a folder, what a local entry is, and
the read side's plain file access.

"Local" means no URL scheme (no '://'): gs://, s3:// and hdfs:// paths are not. The read-side tools
(pipeline/readers/) read and list files through `open_read`, `read_text`, `list_files` and `write_bytes`: the
operating system's files locally, TensorFlow's file systems (tf.io.gfile, which reads gs://) elsewhere, so that the
read side needs no Beam. The converter keeps Beam's file systems (its GCS client, retries and STORAGE_EMULATOR_HOST).
"""

from __future__ import annotations

import fnmatch
import gzip
import os
import stat

_FILE_TYPES = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
)


def is_local(path: str) -> bool:
    """Whether `path` is on this machine's file system (no URL scheme: not gs://, s3://, ...)."""
    return "://" not in path


def relative_to(path: str, folder: str) -> str:
    """The part of `path` below `folder` ('/' separators), without the leading '/'."""
    return path[len(folder.rstrip("/")):].lstrip("/")


def file_kind(mode: int) -> str:
    """What a path of this st_mode is, in words, for the entries that are not regular files."""
    return next((name for test, name in _FILE_TYPES if test(mode)), "not a regular file")


def regular_file_problem(path: str) -> str | None:
    """Why the local file at `path` (links followed) must not be opened: a FIFO (the read would block for ever),
    a device (it might never end), a socket or a folder. None for a regular file, for a path that cannot be
    looked at (its open says why) and for a gs:// object."""
    if not is_local(path):
        return None
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    return f"it is {file_kind(mode)}, not a regular file: it is not opened"


def _gfile():
    import tensorflow as tf  # only for a path that is not local: TensorFlow's file systems read gs://

    return tf.io.gfile


def open_read(path: str, decompress: bool = False):
    """`path` opened for reading bytes; with `decompress`, a name ending in .gz is read through gzip."""
    raw = open(path, "rb") if is_local(path) else _gfile().GFile(path, "rb")
    return gzip.GzipFile(fileobj=raw, mode="rb") if decompress and path.endswith(".gz") else raw


def exists(path: str) -> bool:
    return os.path.exists(path) if is_local(path) else _gfile().exists(path)


def read_text(path: str) -> str | None:
    """The UTF-8 text of the file at `path`, None when there is none.

    Raises:
        ValueError: for text that is not UTF-8; OSError (or TensorFlow's error) when it cannot be read.
    """
    if not exists(path):
        return None
    with open_read(path) as f:
        return f.read().decode("utf-8")


def list_files(folder: str, pattern: str = "*") -> list[tuple[str, int]]:
    """(path, size in bytes) of the entries directly in `folder` whose names match the glob `pattern`, as a shell
    glob finds them: names that start with '.' only for a pattern that does (links followed; one that leads nowhere
    is left out)."""
    if is_local(folder):
        if not os.path.isdir(folder):
            return []
        found = []
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith(".") and not pattern.startswith("."):
                    continue
                if fnmatch.fnmatchcase(entry.name, pattern):
                    try:
                        found.append((os.path.join(folder, entry.name), entry.stat().st_size))
                    except OSError:
                        continue
        return sorted(found)
    gfile = _gfile()
    paths = gfile.glob(folder.rstrip("/") + "/" + pattern)
    return sorted((path, gfile.stat(path).length) for path in paths)


def write_bytes(path: str, data: bytes) -> None:
    """Write `data` to `path` (local or, through TensorFlow's file systems, remote)."""
    if is_local(path):
        with open(path, "wb") as f:
            f.write(data)
        return
    with _gfile().GFile(path, "wb") as f:
        f.write(data)
