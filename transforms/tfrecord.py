"""Reading TFRecord framing without TensorFlow: every record, with its CRCs checked."""

from __future__ import annotations

import struct

import google_crc32c
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.listing import regular_file_problem


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
        with FileSystems.open(path, compression_type=CompressionTypes.AUTO) as f:
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
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
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
