"""WriteShards: exactly N well-mixed TFRecord shards per split, with memory flat in dataset size.

Beam's WriteToTFRecord writes the records where they are converted, one piece
per bundle, so no image bytes ever pass through a shuffle (a GroupByKey of
image bytes holds the whole dataset in memory on the local runner). The pieces
are then cut at record boundaries into the requested number of shards: each
shard is a byte-range copy of consecutive records, written under a temporary
name and renamed, so shards are balanced to one record, never empty, and a
reader never sees a half-written shard.

With index files on, each shard gets `<shard stem>.idx` beside it: one
`offset length` line per record, the index DALI's TFRecord reader and the
`tfrecord` package read. It is derived from the record offsets of the pieces,
known before the shard is copied, never by reading the shard again.
"""

from __future__ import annotations

import bisect
import os
import struct
import uuid
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.layout import SPLITS
from transforms.outputs import TEMP_DIR, delete_tree, index_name, pieces_dir, shards_dir

__all__ = ["TEMP_DIR", "ShardInfo", "WriteShards", "copy_shard", "index_name", "index_text", "plan_shards",
           "record_offsets", "record_sizes", "shard_name", "write_index"]
SHARD_NAME_TEMPLATE = "-SSSSS-of-NNNNN"
_COPY_CHUNK = 8 << 20


class ShardInfo(NamedTuple):
    """One final shard: its split, file name, record count, size in bytes and index file name ('' for none)."""

    split: str
    file: str
    records: int
    bytes: int
    index: str = ""


class Segment(NamedTuple):
    """Consecutive records of one piece: bytes [start, end) hold `records` records."""

    path: str
    start: int
    end: int
    records: int


def shard_suffix(compression: str) -> str:
    return ".tfrecord.gz" if compression == "gzip" else ".tfrecord"


def shard_name(split: str, index: int, count: int, compression: str) -> str:
    return f"{split}-{index:05d}-of-{count:05d}{shard_suffix(compression)}"


def record_offsets(path: str) -> list[int]:
    """Byte offsets of every record start in an uncompressed TFRecord file, plus its end."""
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


def plan_shards(pieces: list[tuple[str, list[int]]], num_shards: int) -> list[list[Segment]]:
    """Cut the records of `pieces` (path, offsets) into at most `num_shards` runs of consecutive records.

    Shard k takes records [k*T/N, (k+1)*T/N) of the pieces laid end to end, so
    sizes differ by at most one record and no shard is empty (N <= T).
    """
    pieces = sorted(pieces)
    total = sum(len(offsets) - 1 for _, offsets in pieces)
    count = min(num_shards, total)
    shards: list[list[Segment]] = [[] for _ in range(count)]
    if not count:
        return []
    bounds = [k * total // count for k in range(count + 1)]
    first = 0  # global index of the current piece's first record
    for path, offsets in pieces:
        n = len(offsets) - 1
        for k in range(count):
            lo, hi = max(bounds[k], first), min(bounds[k + 1], first + n)
            if lo < hi:
                shards[k].append(Segment(path, offsets[lo - first], offsets[hi - first], hi - lo))
        first += n
    return shards


def record_sizes(segments: list[Segment], offsets_of: dict[str, list[int]]) -> list[int]:
    """The framed size of every record of a shard made of `segments`, in order, from its pieces' record offsets.

    `offsets_of` maps each piece path to its `record_offsets`. A framed size
    counts the 12-byte header, the data and the 4-byte data CRC.
    """
    sizes = []
    for segment in segments:
        offsets = offsets_of[segment.path]
        first = bisect.bisect_left(offsets, segment.start)
        run = offsets[first:first + segment.records + 1]
        if len(run) != segment.records + 1 or run[0] != segment.start or run[-1] != segment.end:
            raise ValueError(f"{segment.path}: bytes {segment.start}-{segment.end} are not {segment.records} whole "
                             "records of its index")
        sizes.extend(b - a for a, b in zip(run, run[1:], strict=False))
    return sizes


def index_text(sizes: list[int]) -> str:
    """An index file's text: `offset length` per record, as DALI's and the tfrecord package's tfrecord2idx write."""
    lines, offset = [], 0
    for size in sizes:
        lines.append(f"{offset} {size}\n")
        offset += size
    return "".join(lines)


def write_index(folder: str, name: str, sizes: list[int]) -> None:
    """Write the index of a shard whose records have framed `sizes` to `folder/name`, via a temporary name."""
    destination = FileSystems.join(folder, name)
    temp = FileSystems.join(folder, f"{uuid.uuid4().hex}.partial")
    with FileSystems.create(temp, mime_type="text/plain", compression_type=CompressionTypes.UNCOMPRESSED) as out:
        out.write(index_text(sizes).encode("ascii"))
    FileSystems.rename([temp], [destination])


def _copy_in_kernel(source, out, start: int, count: int) -> int:
    """Copy `count` bytes of `source` from `start` to `out`'s position without passing them through Python.

    Only for two plain local files, uncompressed; returns the bytes copied,
    which is 0 when this cannot be done here (another file system, an old
    kernel) and the caller must copy them itself.
    """
    try:
        source_fd, out_fd = source.fileno(), out.fileno()
    except (AttributeError, OSError, ValueError):  # not a local file (gs://)
        return 0
    out.flush()
    copied = 0
    try:
        while copied < count:
            n = os.sendfile(out_fd, source_fd, start + copied, count - copied)
            if not n:
                break  # the source ended early: the caller finds out
            copied += n
    except OSError:
        if copied:
            raise  # part of it went out: never mix in a second copy
        return 0
    return copied


def copy_shard(segments: list[Segment], folder: str, name: str, compression: str) -> int:
    """Write `segments` to `folder/name` via a temporary name in `folder`; returns the bytes written.

    Between local files the kernel copies the bytes (sendfile), as
    `shutil.copyfile` does; elsewhere they go through Beam's file systems in chunks.
    """
    destination = FileSystems.join(folder, name)
    temp = FileSystems.join(folder, f"{uuid.uuid4().hex}.partial")
    codec = CompressionTypes.GZIP if compression == "gzip" else CompressionTypes.UNCOMPRESSED
    with FileSystems.create(temp, mime_type="application/octet-stream", compression_type=codec) as out:
        for segment in segments:
            with FileSystems.open(segment.path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                start = segment.start
                if codec == CompressionTypes.UNCOMPRESSED:
                    start += _copy_in_kernel(f, out, segment.start, segment.end - segment.start)
                f.seek(start)
                remaining = segment.end - start
                while remaining:
                    chunk = f.read(min(_COPY_CHUNK, remaining))
                    if not chunk:
                        raise ValueError(f"{segment.path} ended {remaining} bytes early")
                    out.write(chunk)
                    remaining -= len(chunk)
    FileSystems.rename([temp], [destination])
    size = FileSystems.match([destination])[0].metadata_list[0].size_in_bytes
    expected = sum(segment.end - segment.start for segment in segments)
    if compression != "gzip" and size != expected:
        raise OSError(f"{destination} holds {size} bytes after the copy, {expected} were written: the file system "
                      "lost data; run the conversion again")
    return size


class _PlanSplit(beam.DoFn):
    def __init__(self, num_shards: dict[str, int], compression: str, index_files: bool = False):
        self._num_shards = num_shards
        self._compression = compression
        self._index_files = index_files

    def process(self, split: str, pieces):
        mine = [(path, offsets) for piece_split, path, offsets in pieces if piece_split == split]
        shards = plan_shards(mine, self._num_shards[split])
        offsets_of = dict(mine)
        for index, segments in enumerate(shards):
            sizes = record_sizes(segments, offsets_of) if self._index_files else None
            # (split, final file name, [Segment], framed record sizes or None)
            yield split, shard_name(split, index, len(shards), self._compression), segments, sizes


class _CopyShard(beam.DoFn):
    def __init__(self, folder: str, compression: str):
        self._folder = folder
        self._compression = compression

    def process(self, job):
        split, name, segments, sizes = job
        size = copy_shard(segments, self._folder, name, self._compression)
        index = ""
        if sizes is not None:
            if sum(sizes) != size:
                raise ValueError(f"{name}: the index adds up to {sum(sizes)} bytes but the shard holds {size}")
            index = index_name(name)
            write_index(self._folder, index, sizes)
        yield ShardInfo(split, name, sum(s.records for s in segments), size, index)


def _remove_pieces(_, pieces_folder: str, shards, pieces):
    """Delete the pieces once every shard is written; pass the shards on."""
    paths = [path for _, path, _ in pieces]
    if paths:
        FileSystems.delete(paths)
    delete_tree(pieces_folder)  # Beam's emptied temporary folders
    yield from shards


class WriteShards(beam.PTransform):
    """{split: serialized tf.train.Example bytes} -> ShardInfo of every final shard.

    `num_shards` maps each split that may hold records to its shard count;
    splits not in it are not written. Shards are written to the run's own
    temporary folder under their final names; the dataset description
    publishes them into `output_dir` once every count is checked.
    With `index_files`, each shard's index file is written beside it (uncompressed shards only).
    """

    def __init__(self, output_dir: str, run_id: str, num_shards: dict[str, int], compression: str,
                 index_files: bool = False):
        super().__init__()
        if index_files and compression != "none":
            raise ValueError("index files hold byte offsets into uncompressed shards: not with compression")
        self._pieces = pieces_dir(output_dir, run_id)
        self._shards = shards_dir(output_dir, run_id)
        self._num_shards = num_shards
        self._compression = compression
        self._index_files = index_files

    def expand(self, records_by_split):
        splits = [s for s in SPLITS if s in self._num_shards]
        pipeline = records_by_split[splits[0]].pipeline
        pieces = []
        for split in splits:
            # piece paths: one piece per bundle, written where the records were made
            piece_paths = records_by_split[split] | f"WriteToTFRecord/{split}" >> beam.io.WriteToTFRecord(
                FileSystems.join(self._pieces, split),
                file_name_suffix=".tfrecord",
                num_shards=0,
                shard_name_template=SHARD_NAME_TEMPLATE,
                compression_type=CompressionTypes.UNCOMPRESSED,
            )
            # (split, piece path, [record offsets])
            pieces.append(piece_paths | f"IndexPieces/{split}" >> beam.Map(
                lambda path, split: (split, path, record_offsets(path)), split))
        all_pieces = pieces | "AllPieces" >> beam.Flatten()
        all_shards = (
            pipeline
            # split name (at most three: spreading them over workers is not worth a shuffle stage)
            | "Splits" >> beam.Create(splits, reshuffle=False)
            # (split, shard file name, [Segment], record sizes or None)
            | "PlanShards" >> beam.ParDo(_PlanSplit(self._num_shards, self._compression, self._index_files),
                                         beam.pvalue.AsList(all_pieces))
            | "SpreadShards" >> beam.Reshuffle()
            | "CopyShards" >> beam.ParDo(_CopyShard(self._shards, self._compression))
        )
        return (
            pipeline
            | "Once" >> beam.Create([None])
            | "RemovePieces" >> beam.FlatMap(
                _remove_pieces, self._pieces, beam.pvalue.AsList(all_shards), beam.pvalue.AsList(all_pieces))
        )
