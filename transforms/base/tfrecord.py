"""TFRecord framing, and reading shards back (TFRecord, ArrayRecord), with neither TensorFlow nor Beam.

Every record is read with its CRCs checked. Files are opened through transforms/base/paths.py: plain files locally,
TensorFlow's file systems for gs://, so that the read-side tools run where Beam is not installed.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile

import google_crc32c

from transforms.base.dataset_format import ARRAY_RECORD, format_of_shard
from transforms.base.paths import is_local, open_read, regular_file_problem


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class CorruptRecord(Exception):
    """A TFRecord file whose framing or checksums are broken."""


MAX_RECORD_BYTES = 1 << 31  # a serialized protocol buffer is under 2 GB


def scan_records(path: str):
    """Yield (index, record bytes) of a TFRecord file; bytes are None when that record's data checksum fails.

    A bad data checksum leaves the framing intact, so reading goes on. A bad
    length checksum or a cut-off record ends the file.

    Raises:
        CorruptRecord: when the framing is broken or the file cannot be read, naming the record index.
    """
    index = 0
    try:
        with open_read(path, decompress=True) as f:
            while True:
                header = f.read(12)
                if not header:
                    return
                if len(header) < 12:
                    raise CorruptRecord(f"record {index}: the file ends inside a record header")
                length, length_crc = struct.unpack("<QI", header)
                if masked_crc(header[:8]) != length_crc:
                    raise CorruptRecord(f"record {index}: length checksum mismatch; the rest of the file is unreadable")
                if length >= MAX_RECORD_BYTES:
                    raise CorruptRecord(f"record {index}: a length of {length} bytes is impossible for an Example")
                body = f.read(length + 4)
                if len(body) < length + 4:
                    raise CorruptRecord(
                        f"record {index}: the file ends inside the record ({len(body)} of {length + 4} bytes)")
                data, (data_crc,) = body[:length], struct.unpack("<I", body[length:])
                yield index, (data if masked_crc(data) == data_crc else None)
                index += 1
    except CorruptRecord:
        raise
    except Exception as e:  # a broken gzip stream, an I/O error: the file is unreadable from here on
        raise CorruptRecord(f"record {index}: cannot be read ({type(e).__name__}: {e})") from None


def iter_records(path: str):
    """Yield each record's bytes from a TFRecord file (gzip detected from the name), checking every CRC.

    Raises:
        CorruptRecord: naming the record index and what is wrong.
    """
    for index, data in scan_records(path):
        if data is None:
            raise CorruptRecord(f"record {index}: data checksum mismatch")
        yield data


def frame_record(data: bytes) -> bytes:
    """`data` framed as one TFRecord record: length, its masked CRC, the data and its masked CRC."""
    length = struct.pack("<Q", len(data))
    return b"".join((length, struct.pack("<I", masked_crc(length)), data, struct.pack("<I", masked_crc(data))))


def record_offsets(path: str) -> list[int]:
    """Byte offsets of every record start in an uncompressed TFRecord file, plus its end (framing only).

    Raises:
        ValueError: a local path that is no regular file (a FIFO would block the read for ever), or a file that
            ends inside a record header.
    """
    problem = regular_file_problem(path)
    if problem:
        raise ValueError(f"{path}: {problem}")
    offsets = [0]
    with open_read(path) as f:
        position = 0
        while True:
            header = f.read(12)
            if not header:
                return offsets
            if len(header) < 12:
                raise ValueError(f"{path}: file ends inside a record header at byte {position}")
            (length,) = struct.unpack("<Q", header[:8])
            position += 12 + length + 4
            f.seek(position)
            offsets.append(position)


def scan_array_records(path: str):
    """Yield (index, record bytes) of an ArrayRecord file, local or remote (copied to a local file first).

    Raises:
        Exception: whatever the ArrayRecord reader raises for a file it cannot read.
    """
    from array_record.python.array_record_module import ArrayRecordReader

    local, temp = path, None
    if not is_local(path):
        handle, temp = tempfile.mkstemp(suffix=".array_record")
        with os.fdopen(handle, "wb") as out, open_read(path) as source:
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
    if format_of_shard(path) == ARRAY_RECORD:
        return scan_array_records(path)
    return scan_records(path)
