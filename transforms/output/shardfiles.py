"""Shard files' writers (TFRecord or ArrayRecord); their names are in transforms/base/dataset_format.py.

A shard's record count is known only once its images are converted (some are
rejected), so a shard is always written under its standard name in the run's
temporary folder and takes its Kaggle name (--shard_names=kaggle) when the run
publishes it. Reading shards back is transforms/base/tfrecord.py's (no Beam).

A writer takes records one by one and says how many bytes each took in the
file; closing it gives the file's size. ArrayRecord's writer (a C++ library)
writes local files only: a shard for gs:// is written to a local temporary
file and uploaded whole through Beam's file systems when it is closed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.base.dataset_format import ARRAY_RECORD, TFRECORD
from transforms.base.paths import is_local
from transforms.base.tfrecord import frame_record

# One record per chunk: each record can be read alone, as Grain's random access does.
ARRAY_RECORD_OPTIONS = "group_size:1"


class TFRecordShardWriter:
    """Writes framed TFRecord records (gzip-compressed or not) to `path`, local or remote."""

    def __init__(self, path: str, compression: str = "none"):
        self._path = path
        self._codec = CompressionTypes.GZIP if compression == "gzip" else CompressionTypes.UNCOMPRESSED
        self._out = FileSystems.create(path, mime_type="application/octet-stream", compression_type=self._codec)
        self._written = 0
        # uncompressed, the file's bytes are the framed records: their SHA-256 is the file's, known without a read
        self._digest = hashlib.sha256() if self._codec == CompressionTypes.UNCOMPRESSED else None

    @property
    def sha256(self) -> str | None:
        """The SHA-256 of the file's bytes written so far when known without reading them back (uncompressed)."""
        return self._digest.hexdigest() if self._digest is not None else None

    def write(self, data: bytes) -> int:
        """Write one record; returns its framed size in bytes (before compression)."""
        record = frame_record(data)
        self._out.write(record)
        if self._digest is not None:
            self._digest.update(record)
        self._written += len(record)
        return len(record)

    def close(self) -> int:
        """Close the file; returns its size in bytes.

        Raises:
            OSError: when an uncompressed file does not hold every byte written.
        """
        self._out.close()
        size = FileSystems.match([self._path])[0].metadata_list[0].size_in_bytes
        if self._codec == CompressionTypes.UNCOMPRESSED and size != self._written:
            raise OSError(f"{self._path} holds {size} bytes after writing {self._written}: the file system lost "
                          "data; run the conversion again")
        return size


class ArrayRecordShardWriter:
    """Writes records to an ArrayRecord file at `path`: directly when local, else through a local file uploaded on
    close."""

    def __init__(self, path: str):
        from array_record.python.array_record_module import ArrayRecordWriter

        self._path = path
        self._local = is_local(path)
        if self._local:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._file = path
        else:
            handle, self._file = tempfile.mkstemp(suffix=".array_record")
            os.close(handle)
        self._writer = ArrayRecordWriter(self._file, ARRAY_RECORD_OPTIONS)
        if not self._writer.ok():
            raise OSError(f"cannot write {self._file}")

        self.sha256: str | None = None  # the file's SHA-256 once closed, from its local bytes (never a read back)

    def write(self, data: bytes) -> int:
        self._writer.write(data)
        return len(data)

    def close(self) -> int:
        try:
            self._writer.close()
            size = os.path.getsize(self._file)
            digest = hashlib.sha256()
            with open(self._file, "rb") as source, contextlib.ExitStack() as stack:
                out = None if self._local else stack.enter_context(FileSystems.create(
                    self._path, mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED))
                while chunk := source.read(8 << 20):
                    digest.update(chunk)
                    if out is not None:
                        out.write(chunk)
            self.sha256 = digest.hexdigest()
            if not self._local:
                uploaded = FileSystems.match([self._path])[0].metadata_list[0].size_in_bytes
                if uploaded != size:
                    raise OSError(f"{self._path} holds {uploaded} bytes after uploading {size}: run the conversion "
                                  "again")
            return size
        finally:
            if not self._local:
                os.unlink(self._file)


def open_writer(path: str, file_format: str = TFRECORD, compression: str = "none"):
    """A writer of a shard file at `path`, with write(record bytes) -> bytes taken and close() -> file size."""
    if file_format == ARRAY_RECORD:
        return ArrayRecordShardWriter(path)
    return TFRecordShardWriter(path, compression)
