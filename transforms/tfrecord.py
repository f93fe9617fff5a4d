"""Reading TFRecord framing without TensorFlow: count records and check their CRCs."""

from __future__ import annotations

import struct

import google_crc32c
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class CorruptRecord(Exception):
    """A TFRecord file whose framing or checksums are broken."""


def iter_records(path: str, check_crc: bool = True):
    """Yield each record's bytes from a TFRecord file (gzip detected from the name).

    Raises:
        CorruptRecord: naming the record index and what is wrong.
    """
    with FileSystems.open(path, compression_type=CompressionTypes.AUTO) as f:
        index = 0
        while True:
            header = f.read(12)
            if not header:
                return
            if len(header) < 12:
                raise CorruptRecord(f"record {index}: file ends inside a record header")
            length, length_crc = struct.unpack("<QI", header)
            if check_crc and masked_crc(header[:8]) != length_crc:
                raise CorruptRecord(f"record {index}: length checksum mismatch")
            body = f.read(length + 4)
            if len(body) < length + 4:
                raise CorruptRecord(f"record {index}: file ends inside a record ({len(body)} of {length + 4} bytes)")
            data, (data_crc,) = body[:length], struct.unpack("<I", body[length:])
            if check_crc and masked_crc(data) != data_crc:
                raise CorruptRecord(f"record {index}: data checksum mismatch")
            yield data
            index += 1


def count_records(path: str) -> int:
    """The number of records in a TFRecord file, checking every checksum."""
    return sum(1 for _ in iter_records(path))
