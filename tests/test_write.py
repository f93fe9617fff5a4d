"""WriteShards' plain functions: cutting pieces into shards at record boundaries, and copying them."""

from __future__ import annotations

import gzip
import os

import pytest

from transforms.tfrecord import iter_records, masked_crc
from transforms.write import Segment, copy_shard, plan_shards, record_offsets


def frame(data: bytes) -> bytes:
    import struct

    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data))


def write_piece(path, records: list[bytes]) -> str:
    path.write_bytes(b"".join(frame(r) for r in records))
    return str(path)


def test_record_offsets_follow_the_framing(tmp_path):
    path = write_piece(tmp_path / "p.tfrecord", [b"a", b"", b"xyz" * 100])
    assert record_offsets(path) == [0, 17, 33, 33 + 316]
    assert record_offsets(write_piece(tmp_path / "empty.tfrecord", [])) == [0]


@pytest.mark.parametrize("sizes, shards", [((5, 0, 7), 4), ((1,), 3), ((10, 10), 1), ((3, 4, 5), 12), ((0,), 2)])
def test_plan_shards_balances_to_one_record_and_never_leaves_a_shard_empty(tmp_path, sizes, shards):
    pieces, expected = [], []
    for i, n in enumerate(sizes):
        records = [f"{i}-{j}".encode() for j in range(n)]
        expected.extend(records)
        path = write_piece(tmp_path / f"piece-{i}.tfrecord", records)
        pieces.append((path, record_offsets(path)))
    plan = plan_shards(pieces, shards)
    total = sum(sizes)
    assert len(plan) == min(shards, total)
    counts = [sum(s.records for s in segments) for segments in plan]
    assert sum(counts) == total
    if counts:
        assert min(counts) >= 1 and max(counts) - min(counts) <= 1
    # Copying every shard and reading it back gives every record exactly once, in order.
    got = []
    for k, segments in enumerate(plan):
        (tmp_path / "out").mkdir(exist_ok=True)
        name = f"s-{k}.tfrecord"
        size = copy_shard(segments, str(tmp_path / "out"), name, "none")
        assert size == (tmp_path / "out" / name).stat().st_size
        got.extend(iter_records(str(tmp_path / "out" / name)))
    assert got == expected


def test_copy_shard_gzip_is_a_valid_gzip_tfrecord(tmp_path):
    records = [bytes([i]) * (i + 1) for i in range(50)]
    path = write_piece(tmp_path / "piece.tfrecord", records)
    offsets = record_offsets(path)
    (tmp_path / "out").mkdir()
    copy_shard([Segment(path, offsets[10], offsets[40], 30)], str(tmp_path / "out"), "x.tfrecord.gz", "gzip")
    data = gzip.decompress((tmp_path / "out" / "x.tfrecord.gz").read_bytes())
    assert data == b"".join(frame(r) for r in records[10:40])
    assert list(iter_records(str(tmp_path / "out" / "x.tfrecord.gz"))) == records[10:40]
    assert os.listdir(tmp_path / "out") == ["x.tfrecord.gz"]  # the partial file was renamed


@pytest.mark.parametrize("kernel_copy", ["sendfile", "unavailable"])
def test_copy_shard_gives_the_same_bytes_with_or_without_the_kernel_copy(tmp_path, monkeypatch, kernel_copy):
    """Local shards are copied by sendfile; where it fails (old kernel, odd file system) the chunked copy does it."""
    import errno
    import os

    records = [bytes([i % 256]) * (37 * i + 1) for i in range(300)]
    path = write_piece(tmp_path / "piece.tfrecord", records)
    offsets = record_offsets(path)
    calls = []
    real_sendfile = os.sendfile

    def sendfile(*args):
        calls.append(args)
        if kernel_copy == "unavailable":
            raise OSError(errno.ENOSYS, "sendfile not supported")
        return real_sendfile(*args)

    monkeypatch.setattr(os, "sendfile", sendfile)
    monkeypatch.setattr("transforms.write._COPY_CHUNK", 1000)  # several chunks on the fallback path
    (tmp_path / "out").mkdir()
    segments = [Segment(path, offsets[5], offsets[120], 115), Segment(path, offsets[200], offsets[300], 100)]
    size = copy_shard(segments, str(tmp_path / "out"), "x.tfrecord", "none")
    data = (tmp_path / "out" / "x.tfrecord").read_bytes()
    assert data == b"".join(frame(r) for r in records[5:120] + records[200:300])
    assert size == len(data)
    assert len(calls) >= 2  # one kernel copy tried per segment
