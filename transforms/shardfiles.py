"""Shard files: their names (standard or Kaggle's) and their writers (TFRecord or ArrayRecord).

Standard names say where a shard is in its split: train-00000-of-00004.tfrecord
(.tfrecord.gz with --compression=gzip, .array_record with
--file_format=array_record). Kaggle's TPU notebooks count a dataset's records
from its file names instead (`count_data_items` parses `-(\\d+)\\.`), so
--shard_names=kaggle names a shard with its index and record count:
train00-2071.tfrec. A shard's record count is known only once its images are
converted (some are rejected), so a shard is always written under its standard
name in the run's temporary folder and takes its Kaggle name when the run
publishes it.

A writer takes records one by one and says how many bytes each took in the
file; closing it gives the file's size. ArrayRecord's writer (a C++ library)
writes local files only: a shard for gs:// is written to a local temporary
file and uploaded whole through Beam's file systems when it is closed.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.listing import is_local, regular_file_problem
from transforms.tfrecord import CorruptRecord, frame_record, scan_records

TFRECORD, ARRAY_RECORD = "tfrecord", "array_record"
FILE_FORMATS = (TFRECORD, ARRAY_RECORD)
STANDARD, KAGGLE = "standard", "kaggle"
SHARD_NAMES = (STANDARD, KAGGLE)
# One record per chunk: each record can be read alone, as Grain's random access does.
ARRAY_RECORD_OPTIONS = "group_size:1"


def shard_suffix(compression: str, file_format: str = TFRECORD) -> str:
    if file_format == ARRAY_RECORD:
        return ".array_record"
    return ".tfrecord.gz" if compression == "gzip" else ".tfrecord"


def shard_name(split: str, index: int, count: int, compression: str, file_format: str = TFRECORD) -> str:
    """The standard name of shard `index` of `count`: train-00000-of-00004.tfrecord."""
    return f"{split}-{index:05d}-of-{count:05d}{shard_suffix(compression, file_format)}"


def kaggle_name(split: str, index: int, count: int, records: int, compression: str,
                file_format: str = TFRECORD) -> str:
    """Kaggle's name of shard `index` of `count` holding `records` records: train00-2071.tfrec.

    The index has at least two digits, and as many as the split's last index
    needs, so that the names sort in shard order.
    """
    if file_format == ARRAY_RECORD:
        suffix = ".array_record"
    else:
        suffix = ".tfrec.gz" if compression == "gzip" else ".tfrec"
    width = max(2, len(str(count - 1)))
    return f"{split}{index:0{width}d}-{records}{suffix}"


class TFRecordShardWriter:
    """Writes framed TFRecord records (gzip-compressed or not) to `path`, local or remote."""

    def __init__(self, path: str, compression: str = "none"):
        self._path = path
        self._codec = CompressionTypes.GZIP if compression == "gzip" else CompressionTypes.UNCOMPRESSED
        self._out = FileSystems.create(path, mime_type="application/octet-stream", compression_type=self._codec)
        self._written = 0

    def write(self, data: bytes) -> int:
        """Write one record; returns its framed size in bytes (before compression)."""
        record = frame_record(data)
        self._out.write(record)
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

    def write(self, data: bytes) -> int:
        self._writer.write(data)
        return len(data)

    def close(self) -> int:
        try:
            self._writer.close()
            size = os.path.getsize(self._file)
            if not self._local:
                with open(self._file, "rb") as source, FileSystems.create(
                        self._path, mime_type="application/octet-stream",
                        compression_type=CompressionTypes.UNCOMPRESSED) as out:
                    shutil.copyfileobj(source, out, 8 << 20)
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


def scan_array_records(path: str):
    """Yield (index, record bytes) of an ArrayRecord file, local or remote (copied to a local file first).

    Raises:
        Exception: whatever the ArrayRecord reader raises for a file it cannot read.
    """
    from array_record.python.array_record_module import ArrayRecordReader

    local, temp = path, None
    if not is_local(path):
        handle, temp = tempfile.mkstemp(suffix=".array_record")
        with os.fdopen(handle, "wb") as out, FileSystems.open(
                path, compression_type=CompressionTypes.UNCOMPRESSED) as source:
            shutil.copyfileobj(source, out, 8 << 20)
        local = temp
    try:
        reader = ArrayRecordReader(local)
        try:
            total = reader.num_records()
            for start in range(0, total, 256):
                for offset, data in enumerate(reader.read(list(range(start, min(start + 256, total))))):
                    yield start + offset, data
        finally:
            reader.close()
    finally:
        if temp:
            os.unlink(temp)


def scan_shard(path: str):
    """(index, record bytes, or None for a bad checksum) of every record of a shard: TFRecord, or ArrayRecord
    by its name (.array_record).

    Raises:
        CorruptRecord: a local shard that is no regular file (a FIFO would block the read for ever), checked at
            once; a TFRecord shard whose framing breaks; for ArrayRecord, whatever its reader raises.
    """
    problem = regular_file_problem(path)
    if problem:
        raise CorruptRecord(problem)
    if path.endswith(".array_record"):
        return scan_array_records(path)
    return scan_records(path)
