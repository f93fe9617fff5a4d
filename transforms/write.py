"""WriteShards: one set of TFRecord shards per split, written with Beam's WriteToTFRecord."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms.layout import SPLITS

SHARD_NAME_TEMPLATE = "-SSSSS-of-NNNNN"


def shard_suffix(compression: str) -> str:
    return ".tfrecord.gz" if compression == "gzip" else ".tfrecord"


def shard_prefix(output_dir: str, split: str) -> str:
    return FileSystems.join(output_dir, split)


class WriteShards(beam.PTransform):
    """ExampleRecord -> {split: PCollection of written shard paths}.

    `num_shards` maps each split that may hold records to its shard count;
    splits not in it are not written.
    """

    def __init__(self, output_dir: str, num_shards: dict[str, int], compression: str):
        super().__init__()
        self._output_dir = output_dir
        self._num_shards = num_shards
        self._compression = compression

    def expand(self, records):
        splits = [s for s in SPLITS if s in self._num_shards]
        index = {split: i for i, split in enumerate(splits)}
        # ExampleRecord, one PCollection per split
        by_split = records | "PartitionBySplit" >> beam.Partition(
            lambda record, _n: index[record.split], len(splits)
        )
        written = {}
        for split, part in zip(splits, by_split, strict=True):
            written[split] = (
                part
                # serialized tf.train.Example bytes
                | f"Serialize/{split}" >> beam.Map(lambda record: record.serialized).with_output_types(bytes)
                | f"WriteToTFRecord/{split}" >> beam.io.WriteToTFRecord(
                    shard_prefix(self._output_dir, split),
                    file_name_suffix=shard_suffix(self._compression),
                    num_shards=self._num_shards[split],
                    shard_name_template=SHARD_NAME_TEMPLATE,
                    compression_type="gzip" if self._compression == "gzip" else "uncompressed",
                )
            )
        return written
