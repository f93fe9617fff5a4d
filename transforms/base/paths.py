"""Paths without Apache Beam or TensorFlow: is this path local, a path below a folder, what a local entry is, and
the read side's plain file access.

"Local" means no URL scheme (no '://'): gs://, s3:// and hdfs:// paths are not. The read-side tools
(pipeline/readers/) read and list files through `open_read`, `read_text`, `list_files` and `write_bytes`, so that
the read side needs no Beam: the operating system's files locally; gs:// through the google-cloud-storage client
when it is installed (it is wherever Beam's GCP extra is; it honours the application-default credentials and
STORAGE_EMULATOR_HOST), else through TensorFlow's own file systems (tf.io.gfile), as for any other scheme. The
converter keeps Beam's file systems.
"""

from __future__ import annotations

import fnmatch
import gzip
import os
import re
import stat

# Extensions recognised as images (case-insensitive). Decoding goes by content,
# so a PNG behind a .jpg name is fine; a file with another extension is skipped.
IMAGE_EXTENSIONS = frozenset(
    {
        ".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".gif", ".bmp", ".dib",
        ".webp", ".tif", ".tiff", ".mpo",
    }
)
# Those that tf.io.decode_image reads (JPEG, PNG, GIF, BMP): the benchmark's --compare_files.
TF_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")

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


def is_gcs(path: str | None) -> bool:
    """Whether `path` is on Cloud Storage (gs://): a different question from `is_local` (an s3:// or hdfs://
    path is neither)."""
    return bool(path) and path.startswith("gs://")


def relative_to(path: str, folder: str) -> str:
    """The part of `path` below `folder` ('/' separators), without the leading '/'."""
    return path[len(folder.rstrip("/")):].lstrip("/")


# A Cloud Storage bucket name: lower-case letters, digits, '-', '_', '.', starting and ending with a letter or
# digit. (Cloud Storage also wants 3 to 63 characters; shorter ones are left to its own "does not exist".)
_BUCKET = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,220}[a-z0-9])?")


def bucket_problem(path: str) -> str | None:
    """Why the bucket of a gs:// `path` is not a Cloud Storage bucket name, or None (also for a local path)."""
    if not is_gcs(path):
        return None
    bucket = path[len("gs://"):].split("/", 1)[0]
    if _BUCKET.fullmatch(bucket) and ".." not in bucket:
        return None
    return (f"{bucket!r} is not a Cloud Storage bucket name (lower-case letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit): give gs://BUCKET/folder")


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


# google-cloud-storage's switch for its background bucket-metadata GET (tracing attributes this project never
# sends): off in every client this project makes, so that object permissions are enough (transforms/base/gcs.py)
BUCKET_METADATA_ENV = "DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA"
_storage: list = []  # [the read side's google-cloud-storage client, or None when the package is missing]


def _blob(path: str):
    """The google-cloud-storage blob of a gs:// `path`; None for another scheme, or without that package."""
    if not path.startswith("gs://"):
        return None
    if not _storage:
        try:
            from google.cloud import storage
        except ImportError:
            _storage.append(None)
        else:
            os.environ.setdefault(BUCKET_METADATA_ENV, "true")
            _storage.append(storage.Client())
    if _storage[0] is None:
        return None
    bucket, _, name = path[len("gs://"):].partition("/")
    return _storage[0].bucket(bucket).blob(name)


def open_read(path: str, decompress: bool = False):
    """`path` opened for reading bytes; with `decompress`, a name ending in .gz is read through gzip."""
    if is_local(path):
        raw = open(path, "rb")
    else:
        blob = _blob(path)
        raw = blob.open("rb") if blob is not None else _gfile().GFile(path, "rb")
    return gzip.GzipFile(fileobj=raw, mode="rb") if decompress and path.endswith(".gz") else raw


def exists(path: str) -> bool:
    if is_local(path):
        return os.path.exists(path)
    blob = _blob(path)
    return blob.exists() if blob is not None else _gfile().exists(path)


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
    folder = folder.rstrip("/")
    blob = _blob(folder + "/")
    if blob is not None:
        prefix = blob.name
        listed = blob.client.list_blobs(blob.bucket, prefix=prefix, delimiter="/")
        return sorted((f"{folder}/{b.name[len(prefix):]}", b.size) for b in listed
                      if fnmatch.fnmatchcase(b.name[len(prefix):], pattern))
    gfile = _gfile()
    return sorted((path, gfile.stat(path).length) for path in gfile.glob(folder + "/" + pattern))


def write_bytes(path: str, data: bytes) -> None:
    """Write `data` to `path` (local or, through TensorFlow's file systems, remote)."""
    if is_local(path):
        with open(path, "wb") as f:
            f.write(data)
        return
    blob = _blob(path)
    if blob is not None:
        blob.upload_from_string(data, content_type="application/octet-stream")
        return
    with _gfile().GFile(path, "wb") as f:
        f.write(data)


def relative_path(path: str, input_dir: str) -> str:
    """The path of `path` below `input_dir`, with '/' separators.

    A backslash is a separator only in a local path on Windows; on POSIX and
    in gs:// names it is an ordinary character of the name.
    """
    separators = "/\\" if os.sep == "\\" and is_local(path) else "/"
    base = input_dir.rstrip(separators)
    if not path.startswith(base):
        raise ValueError(f"{path!r} is not below {input_dir!r}")
    relpath = path[len(base):].lstrip(separators)
    return relpath.replace("\\", "/") if len(separators) == 2 else relpath



def name_bytes(name: str) -> bytes:
    """The bytes of a file name as the file system holds them.

    Python names a local file whose name is not UTF-8 with surrogates
    (os.fsdecode); those go back to their original bytes here.
    """
    try:
        return name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that no file system name produces
        return name.encode("utf-8", "backslashreplace")



def text_name(name: str) -> str:
    """A local file name as the tool reads it, whatever the locale: its bytes on disk (os.fsencode) read as
    UTF-8, bytes that are not UTF-8 kept as surrogates. With Python's UTF-8 file system encoding this is `name`
    itself; in the C locale without UTF-8 mode (PYTHONUTF8=0 LC_ALL=C) Python lists the folder `café` as
    'caf\\udcc3\\udca9', which is 'café' here, as it is in any other locale. The listing gives relative paths
    (so class names, splits and --group_by) through it; files are opened by their path as listed."""
    try:
        return os.fsencode(name).decode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # not a name the file system gave (a surrogate it never produces)
        return name



def os_name(text: str) -> str:
    """A local path given as UTF-8 text (a manifest's, a name read by `text_name`) as this process's file system
    calls take it: its UTF-8 bytes in the locale's form (os.fsdecode). The text itself with Python's UTF-8 file
    system encoding; in the C locale without UTF-8 mode, 'café' is 'caf\\udcc3\\udca9', which opens the file
    `café` where 'café' cannot even be encoded."""
    return os.fsdecode(name_bytes(text))



def display_path(name: str) -> str:
    """`name` as valid UTF-8 text: bytes that are not UTF-8 become \\xNN (as in errors.jsonl and source_path)."""
    return name_bytes(name).decode("utf-8", "backslashreplace")



def quoted_name(name: str) -> str:
    """`name` quoted as Python's repr does, with bytes that are not UTF-8 shown as \\xNN."""
    return re.sub(r"\\udc([89a-f][0-9a-f])", r"\\x\1", repr(name))

