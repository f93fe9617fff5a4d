"""Files joined end to end on the file system itself: a shard assembled from its pieces without reading them.

No Beam transforms here. TFRecord records are self-delimiting, and a gzip file
may hold several members one after another (RFC 1952; tf.data's GZIP reader
and Beam's reader read them all), so a shard is the plain concatenation of its
pieces, in order:

* **local files**: the kernel copies them (`os.copy_file_range`, a reflink on
  file systems that have them): no byte passes through the worker's memory;
* **gs://**: Cloud Storage composes them server-side (`compose`, at most 32
  sources a call, so a tree of calls for more): nothing is downloaded or
  uploaded again;
* **other file systems**: streamed through, 8 MiB at a time.
"""

from __future__ import annotations

import os
import shutil

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.gcp import gcsio
from google.cloud.storage.retry import DEFAULT_RETRY

from transforms.base import gcs
from transforms.base.paths import is_gcs, is_local

MAX_COMPOSE = 32  # Cloud Storage composes at most 32 source objects in one call
_COPY_CHUNK = 8 << 20


def file_size(path: str) -> int:
    return FileSystems.match([path])[0].metadata_list[0].size_in_bytes


def concatenate(sources: list[str], dest: str, expected: int) -> int:
    """Write `sources`, in order, end to end to `dest` (replacing it); returns `dest`'s size, `expected` (the
    sources' sizes added up, as their writers reported them).

    `sources` and `dest` are on the same file system. The sources are left in place.

    Raises:
        OSError: `dest` does not hold exactly `expected` bytes afterwards.
        Exception: whatever the file system raises for a missing source or a refused write.
    """
    if not sources:
        raise ValueError("nothing to concatenate")
    if is_local(dest):
        size = _concatenate_local(sources, dest)
    elif is_gcs(dest):
        size = _compose_gcs(sources, dest)
    else:
        size = _concatenate_stream(sources, dest)
    if size != expected:
        raise OSError(f"{dest} holds {size} bytes after joining {len(sources)} pieces of {expected} bytes: the file "
                      "system lost data; run the conversion again")
    return size


def _concatenate_local(sources: list[str], dest: str) -> int:
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with open(dest, "wb") as out:
        for source in sources:
            with open(source, "rb") as f:
                _copy_file(f, out, os.fstat(f.fileno()).st_size)
        out.flush()
        return os.fstat(out.fileno()).st_size


def _copy_file(source, out, size: int) -> None:
    """Copy `size` bytes of the open file `source` to the end of `out`, in the kernel when it can."""
    copied = 0
    try:
        while copied < size:
            done = os.copy_file_range(source.fileno(), out.fileno(), size - copied)
            if done == 0:
                break
            copied += done
    except (AttributeError, OSError):  # no copy_file_range (not Linux), or not between these two file systems
        source.seek(copied)
        out.seek(0, os.SEEK_END)
        shutil.copyfileobj(source, out, _COPY_CHUNK)
        return
    if copied != size:
        raise OSError(f"{source.name} ended after {copied} of its {size} bytes while it was copied")


def _compose_gcs(sources: list[str], dest: str) -> int:
    """Compose the gs:// `sources` into `dest`, in a tree of calls of at most 32 sources each."""
    bucket_name, name = gcsio.parse_gcs_path(dest)
    bucket = gcs.client().bucket(bucket_name)
    blobs = []
    for source in sources:
        source_bucket, source_name = gcsio.parse_gcs_path(source)
        if source_bucket != bucket_name:
            raise ValueError(f"{source} is not in the bucket of {dest}: composing needs one bucket")
        blobs.append(bucket.blob(source_name))
    level, intermediates = 0, []
    while len(blobs) > MAX_COMPOSE:
        grouped = []
        for start in range(0, len(blobs), MAX_COMPOSE):
            part = bucket.blob(f"{name}.compose-{level}-{start // MAX_COMPOSE:05d}")
            _compose(part, blobs[start:start + MAX_COMPOSE])
            grouped.append(part)
        intermediates.extend(grouped)
        blobs, level = grouped, level + 1
    target = bucket.blob(name)
    _compose(target, blobs)
    for part in intermediates:
        part.delete(retry=DEFAULT_RETRY)
    return target.size


def _compose(target, sources: list) -> None:
    target.content_type = "application/octet-stream"
    # Composing the same sources again gives the same object: safe to retry (429, 5xx, a reset connection).
    target.compose(sources, retry=DEFAULT_RETRY)


def _concatenate_stream(sources: list[str], dest: str) -> int:
    with FileSystems.create(dest, mime_type="application/octet-stream",
                            compression_type=CompressionTypes.UNCOMPRESSED) as out:
        for source in sources:
            with FileSystems.open(source, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                while chunk := f.read(_COPY_CHUNK):
                    out.write(chunk)
    return file_size(dest)
