"""WriteShards: each shard converted and written in one place, once, straight to its file.

The images arrive with their shard assigned (`transforms.sharding`). Grouping
them by shard moves only their references (a few hundred bytes each), never
image bytes; then each shard's images are converted in rank order on the
worker that holds the group and written to the shard's file as they come. No
byte is written twice or read back: the shard's size and, with index files,
its `offset length` index are known from the records as they are written.

Shards are written under their final names in the run's own temporary
folder; the dataset description publishes them into the output folder once
every count is checked. A retried bundle writes the same shard again, whole,
under the same name (a GCS object appears only once its upload completes).
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.convert import convert_in_order
from transforms.imaging import ImageSettings
from transforms.layout import display_path
from transforms.outputs import index_name, shards_dir
from transforms.pool import ConversionPool, time_limit
from transforms.sharding import ShardKey, rank_order
from transforms.tfrecord import frame_record, record_offsets

__all__ = ["HASHES", "REJECTED", "WRITTEN", "ShardInfo", "WriteShards", "index_name", "index_text", "record_offsets",
           "shard_name", "write_index"]
REJECTED = "rejected"
WRITTEN = "written"
HASHES = "hashes"  # (sha256, (split, label, relpath)) of every written image, for the duplicate report


class ShardInfo(NamedTuple):
    """One final shard: its split, file name, record count, size in bytes and index file name ('' for none)."""

    split: str
    file: str
    records: int
    bytes: int
    index: str = ""


def shard_suffix(compression: str) -> str:
    return ".tfrecord.gz" if compression == "gzip" else ".tfrecord"


def shard_name(split: str, index: int, count: int, compression: str) -> str:
    return f"{split}-{index:05d}-of-{count:05d}{shard_suffix(compression)}"


def index_text(sizes: list[int]) -> str:
    """An index file's text: `offset length` per record, as DALI's and the tfrecord package's tfrecord2idx write."""
    lines, offset = [], 0
    for size in sizes:
        lines.append(f"{offset} {size}\n")
        offset += size
    return "".join(lines)


def write_index(folder: str, name: str, sizes: list[int]) -> None:
    """Write the index of a shard whose records have framed `sizes` to `folder/name`."""
    with FileSystems.create(FileSystems.join(folder, name), mime_type="text/plain",
                            compression_type=CompressionTypes.UNCOMPRESSED) as out:
        out.write(index_text(sizes).encode("ascii"))


class _ConvertAndWrite(beam.DoFn):
    """(ShardKey, [ImageRef]) -> ShardInfo; Rejection on REJECTED; ((split, label, upscaled), records) on WRITTEN;
    (sha256, (split, label, relpath)) of each written image on HASHES."""

    def __init__(self, folder: str, settings: ImageSettings, schema: str, threads: int, compression: str,
                 index_files: bool):
        self._folder = folder
        self._settings = settings
        self._schema = schema
        self._threads = threads
        self._compression = compression
        self._index_files = index_files
        self._pool: ConversionPool | None = None

    def setup(self):
        self._pool = ConversionPool(time_limit(self._settings), threads=self._threads)

    def teardown(self):
        if self._pool is not None:
            self._pool.close()

    def process(self, element):
        key, refs = element
        key = ShardKey(*key)
        name = shard_name(key.split, key.index, key.count, self._compression)
        path = FileSystems.join(self._folder, name)
        codec = CompressionTypes.GZIP if self._compression == "gzip" else CompressionTypes.UNCOMPRESSED
        written: Counter = Counter()  # (split, label, upscaled) -> records
        sizes = []  # framed size of each record, in order
        ordered = sorted(refs, key=rank_order)  # one shard's references: thousands, not the dataset
        with FileSystems.create(path, mime_type="application/octet-stream", compression_type=codec) as out:
            for outcome in convert_in_order(self._pool, ordered, self._settings, self._schema):
                if outcome.rejection is not None:
                    yield beam.pvalue.TaggedOutput(REJECTED, outcome.rejection)
                    continue
                record = frame_record(outcome.example)
                out.write(record)
                sizes.append(len(record))
                written[(key.split, outcome.ref.label, outcome.upscaled)] += 1
                yield beam.pvalue.TaggedOutput(HASHES, (outcome.sha256, (key.split, outcome.ref.label,
                                                                         display_path(outcome.ref.relpath))))
        size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
        if codec == CompressionTypes.UNCOMPRESSED and size != sum(sizes):
            raise OSError(f"{path} holds {size} bytes after writing {sum(sizes)}: the file system lost data; "
                          "run the conversion again")
        index = ""
        if self._index_files:
            index = index_name(name)
            write_index(self._folder, index, sizes)
        for tally, count in written.items():
            yield beam.pvalue.TaggedOutput(WRITTEN, (tally, count))
        yield ShardInfo(key.split, name, len(sizes), size, index)


class WriteShards(beam.PTransform):
    """(ShardKey, ImageRef) -> ShardInfo of every shard; REJECTED (Rejection), WRITTEN (tallies) and HASHES
    ((sha256, (split, label, relpath)) per written image) on the side.

    Shards are written to the run's own temporary folder under their final
    names; the dataset description publishes them into `output_dir` once every
    count is checked. With `index_files`, each shard's index file is written
    beside it (uncompressed shards only).
    """

    def __init__(self, output_dir: str, run_id: str, settings: ImageSettings, schema: str, threads: int,
                 compression: str, index_files: bool = False):
        super().__init__()
        if index_files and compression != "none":
            raise ValueError("index files hold byte offsets into uncompressed shards: not with compression")
        self._fn = _ConvertAndWrite(shards_dir(output_dir, run_id), settings, schema, threads, compression,
                                    index_files)

    def expand(self, placed):
        return (
            placed
            # (ShardKey, [ImageRef]): references only, a shard's worth each
            | "GroupByShard" >> beam.GroupByKey()
            | "ConvertAndWrite" >> beam.ParDo(self._fn).with_outputs(REJECTED, WRITTEN, HASHES, main="shards")
        )
