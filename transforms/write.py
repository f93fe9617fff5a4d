"""WriteShards: each shard converted and written in one place, once, straight to its file.

The images arrive with their shard assigned (`transforms.sharding`). Grouping
them by shard moves only their references (a few hundred bytes each), never
image bytes; then each shard's images are converted in rank order on the
worker that holds the group and written to the shard's file as they come. No
byte is written twice or read back: the shard's size and, with index files,
its `offset length` index are known from the records as they are written.

Shards are written under their standard names in the run's own temporary
folder; the dataset description publishes them into the output folder, under
their final names, once every count is checked. A final name can depend on
what the shard holds (--shard_names=kaggle puts its record count in it), so
ShardInfo carries both. A retried bundle writes the same shard again, whole,
under the same name (a GCS object appears only once its upload completes).
The file itself is TFRecord or ArrayRecord (`transforms.shardfiles`).
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
from transforms.records import label_of
from transforms.shardfiles import ARRAY_RECORD, KAGGLE, STANDARD, TFRECORD, kaggle_name, open_writer, shard_name
from transforms.sharding import ShardKey, rank_order
from transforms.stats import StatsTally
from transforms.tfrecord import record_offsets

__all__ = ["HASHES", "REJECTED", "STATS", "WRITTEN", "ShardInfo", "WriteShards", "index_name", "index_text",
           "kaggle_name", "record_offsets", "shard_name", "write_index"]
REJECTED = "rejected"
WRITTEN = "written"
HASHES = "hashes"  # (sha256, (split, label, relpath)) of every written image, for the duplicate report
STATS = "stats"  # (split, transforms.stats.SplitStats): one per shard, its images' pixel sums and source sizes


class ShardInfo(NamedTuple):
    """One final shard: its split, final file name, record count, size in bytes, final index file name ('' for
    none) and its file's name in the run's temporary folder ('' when the same as its final name)."""

    split: str
    file: str
    records: int
    bytes: int
    index: str = ""
    temp: str = ""


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
    (sha256, (split, label, relpath)) of each written image on HASHES; (split, SplitStats) of the shard on STATS."""

    def __init__(self, folder: str, settings: ImageSettings, schema: str, threads: int, compression: str,
                 index_files: bool, file_format: str = TFRECORD, shard_names: str = STANDARD):
        self._folder = folder
        self._settings = settings
        self._schema = schema
        self._threads = threads
        self._compression = compression
        self._index_files = index_files
        self._file_format = file_format
        self._shard_names = shard_names
        self._pool: ConversionPool | None = None

    def setup(self):
        self._pool = ConversionPool(time_limit(self._settings), threads=self._threads)

    def teardown(self):
        if self._pool is not None:
            self._pool.close()

    def process(self, element):
        key, refs = element
        key = ShardKey(*key)
        name = shard_name(key.split, key.index, key.count, self._compression, self._file_format)
        path = FileSystems.join(self._folder, name)
        written: Counter = Counter()  # (split, label, upscaled) -> records
        sizes = []  # size of each record in the file, in order
        tally = StatsTally()  # the shard's pixel sums and source sizes: one small element leaves, not one per image
        ordered = sorted(refs, key=rank_order)  # one shard's references: thousands, not the dataset
        out = open_writer(path, self._file_format, self._compression)
        for outcome in convert_in_order(self._pool, ordered, self._settings, self._schema):
            if outcome.rejection is not None:
                yield beam.pvalue.TaggedOutput(REJECTED, outcome.rejection)
                continue
            sizes.append(out.write(outcome.example))
            label = label_of(outcome.ref)  # a tuple of class ids with --multi_label
            written[(key.split, label, outcome.upscaled)] += 1
            tally.add(outcome.stats, outcome.upscaled)
            yield beam.pvalue.TaggedOutput(HASHES, (outcome.sha256, (key.split, label,
                                                                     display_path(outcome.ref.relpath))))
        size = out.close()
        final = name
        if self._shard_names == KAGGLE:  # the record count is known now; the file is renamed when published
            final = kaggle_name(key.split, key.index, key.count, len(sizes), self._compression, self._file_format)
        index = ""
        if self._index_files:
            index = index_name(name)
            write_index(self._folder, index, sizes)
        for kind, count in written.items():
            yield beam.pvalue.TaggedOutput(WRITTEN, (kind, count))
        if tally.images:
            yield beam.pvalue.TaggedOutput(STATS, (key.split, tally.result()))
        yield ShardInfo(key.split, final, len(sizes), size, index_name(final) if index else "",
                        name if final != name else "")


class WriteShards(beam.PTransform):
    """(ShardKey, ImageRef) -> ShardInfo of every shard; REJECTED (Rejection), WRITTEN (tallies), HASHES
    ((sha256, (split, label, relpath)) per written image) and STATS ((split, SplitStats) per shard) on the side.

    Shards are written to the run's own temporary folder under their standard
    names; the dataset description publishes them into `output_dir`, under
    their final names, once every count is checked. With `index_files`, each
    shard's index file is written beside it (uncompressed TFRecord shards only).
    """

    def __init__(self, output_dir: str, run_id: str, settings: ImageSettings, schema: str, threads: int,
                 compression: str, index_files: bool = False, file_format: str = TFRECORD,
                 shard_names: str = STANDARD):
        super().__init__()
        if index_files and (compression != "none" or file_format != TFRECORD):
            raise ValueError("index files hold byte offsets into uncompressed TFRecord shards: not with "
                             "compression or another file format")
        if file_format == ARRAY_RECORD and compression != "none":
            raise ValueError("ArrayRecord shards are not gzip-compressed")
        self._fn = _ConvertAndWrite(shards_dir(output_dir, run_id), settings, schema, threads, compression,
                                    index_files, file_format, shard_names)

    def expand(self, placed):
        return (
            placed
            # (ShardKey, [ImageRef]): references only, a shard's worth each
            | "GroupByShard" >> beam.GroupByKey()
            | "ConvertAndWrite" >> beam.ParDo(self._fn).with_outputs(REJECTED, WRITTEN, HASHES, STATS, main="shards")
        )
