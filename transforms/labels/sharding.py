"""AssignShards: every image gets its shard before it is converted, exactly balanced and reproducible.

Each image has a stable random 64-bit `shuffle_key` (a hash of the seed and
its relative path). Within a split, the images sorted by (shuffle_key, relpath)
have ranks 0..T-1, and shard k of N takes ranks [k*T/N, (k+1)*T/N): shards
differ by at most one image, each is a random sample of its split, and the
same input and options always give the same images in the same shards.

The ranks are found without sorting the dataset in one place:

1. CountBuckets: the images of each split are counted (with their bytes) in
   65,536 buckets of key space, by the key's top 16 bits. This is a Beam
   combine, spread over workers; its result is bounded by the bucket count,
   whatever the dataset's size.
2. LayOut: from the bucket counts alone (gathered in one combine), each split's total, shard count and
   the rank at which each bucket starts (`SplitLayout`, one small side input).
3. PlaceImages: an image whose whole bucket falls inside one shard's ranks
   gets that shard at once. Only the images of the (at most N-1) buckets that
   straddle a shard boundary are grouped by bucket and ranked exactly
   (RankStraddlers), a few thousandths of the data.

Shard counts come from the job's own totals: --num_shards, or the estimated
output bytes over --shard_size_mb (`ShardSizing`, measured by the launcher on a
small sample), with at least MIN_TRAIN_SHARDS train shards of 10 MB or more.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from itertools import accumulate
from typing import NamedTuple

import apache_beam as beam

from transforms.base.records import ImageRef

# The train split gets at least this many shards when each would still hold MIN_SHARD_BYTES: tf.data's
# num_parallel_reads needs several files to read at once, and a multi-host reader one file per host at least
# (TensorFlow's performance guide asks for 10 times as many files as hosts, and files of at least 10 MB).
MIN_TRAIN_SHARDS = 8
MIN_SHARD_BYTES = 10e6
BUCKET_BITS = 16
BUCKETS = 1 << BUCKET_BITS
STRADDLING = "straddling"


class ShardSizing(NamedTuple):
    """How many shards a split gets, decided once its images are counted.

    `explicit` holds --num_shards per split. Other splits get about
    --shard_size_mb per shard, from the output bytes one image makes
    (`bytes_per_image`, for a fixed output size) or, when the output follows the
    source's size (--resize_mode=fit or none), from the split's source bytes
    times `bytes_per_source_byte`.
    """

    explicit: dict
    shard_size_mb: int
    bytes_per_image: float
    bytes_per_source_byte: float | None = None
    extra_bytes_per_image: float = 0.0  # the typed extra features (--features) of one record, on top

    def estimated_bytes(self, images: int, source_bytes: int) -> float:
        extra = images * self.extra_bytes_per_image
        if self.bytes_per_source_byte is not None:
            return source_bytes * self.bytes_per_source_byte + extra
        return images * self.bytes_per_image + extra

    def shard_count(self, split: str, images: int, source_bytes: int) -> int:
        """Shards for a split of `images` images (`source_bytes` in all): never more shards than images."""
        if split in self.explicit:
            return max(1, min(self.explicit[split], images))
        estimated = self.estimated_bytes(images, source_bytes)
        wanted = round(estimated / (self.shard_size_mb * 1e6))
        if split == "train":  # enough files for parallel reads and for one per reading host (see MIN_TRAIN_SHARDS)
            wanted = max(wanted, min(MIN_TRAIN_SHARDS, int(estimated // MIN_SHARD_BYTES)))
        return max(1, min(wanted, images))


class ShardKey(NamedTuple):
    """Shard `index` of `count` in a split. It travels as a plain (split, index, count) tuple: Beam has a fast
    deterministic coder for tuples of str and int, and none for a NamedTuple."""

    split: str
    index: int
    count: int


class SplitLayout(NamedTuple):
    """A split's image total, its shard count and, per bucket, the rank of its first image (BUCKETS + 1 values)."""

    images: int
    shards: int
    starts: array

    def shard_of_rank(self, rank: int) -> int:
        return rank * self.shards // self.images

    def bucket_shard(self, bucket: int) -> int | None:
        """The shard that holds every image of `bucket`, or None when the bucket straddles a shard boundary."""
        first, end = self.starts[bucket], self.starts[bucket + 1]
        if first == end:
            return None
        shard = self.shard_of_rank(first)
        return shard if shard == self.shard_of_rank(end - 1) else None


def bucket_of(shuffle_key: int) -> int:
    return shuffle_key >> (64 - BUCKET_BITS)


def rank_order(ref: ImageRef) -> tuple:
    """The order that ranks images in a split and records in a shard: (shuffle_key, relpath), a total order."""
    return ref.shuffle_key, ref.relpath


def lay_out(counts: Iterable[tuple[tuple[str, int], tuple[int, int]]], sizing: ShardSizing) -> dict[str, SplitLayout]:
    """{split: SplitLayout} from ((split, bucket), (images, source bytes)) counts."""
    per_split: dict[str, array] = {}
    source_bytes: dict[str, int] = {}
    for (split, bucket), (images, size) in counts:
        if split not in per_split:  # (not setdefault: its default, 512 kB of zeros, would be made for every count)
            per_split[split] = array("q", bytes(8 * BUCKETS))
        per_split[split][bucket] += images
        source_bytes[split] = source_bytes.get(split, 0) + size
    layouts = {}
    for split, counts_of in per_split.items():
        starts = array("q", accumulate(counts_of, initial=0))  # in C: this one step runs on one worker
        total = starts[-1]
        layouts[split] = SplitLayout(total, sizing.shard_count(split, total, source_bytes[split]), starts)
    return layouts


class _PlaceImage(beam.DoFn):
    """ImageRef -> ((split, index, count), ImageRef); ((split, bucket), ImageRef) on STRADDLING if it needs a rank."""

    def process(self, ref: ImageRef, layouts: dict[str, SplitLayout]):
        layout = layouts[ref.split]
        bucket = bucket_of(ref.shuffle_key)
        shard = layout.bucket_shard(bucket)
        if shard is None:
            yield beam.pvalue.TaggedOutput(STRADDLING, ((ref.split, bucket), ref))
        else:
            yield (ref.split, shard, layout.shards), ref


def rank_bucket(keyed, layouts: dict[str, SplitLayout]):
    """((split, bucket), [ImageRef]) -> ((split, index, count), ImageRef) for each, from the images' exact ranks."""
    (split, bucket), refs = keyed
    layout = layouts[split]
    first = layout.starts[bucket]
    for offset, ref in enumerate(sorted(refs, key=rank_order)):
        yield (split, layout.shard_of_rank(first + offset), layout.shards), ref


class AssignShards(beam.PTransform):
    """ImageRef -> ((split, index, count) of a ShardKey, ImageRef): shards exactly balanced, the same on every run.

    Once applied, `layouts` is its side input of {split: SplitLayout} (the image totals), for steps after it.
    """

    def __init__(self, sizing: ShardSizing):
        super().__init__()
        self._sizing = sizing
        self.layouts = None

    def expand(self, refs):
        counts = (
            refs
            # ((split, bucket), (1, source bytes))
            | "KeyByBucket" >> beam.Map(lambda ref: ((ref.split, bucket_of(ref.shuffle_key)), (1, ref.size)))
            # ((split, bucket), (images, source bytes)): at most 3 x 65,536 of them
            | "CountBuckets" >> beam.CombinePerKey(_SumPairs())
        )
        # {split: SplitLayout}, one element: the counts gathered in one place and laid out there ({} if none)
        layouts = beam.pvalue.AsSingleton(
            counts | "LayOut" >> beam.CombineGlobally(_LayOut(self._sizing)).without_defaults(), default_value={})
        self.layouts = layouts
        placed = refs | "PlaceImages" >> beam.ParDo(_PlaceImage(), layouts).with_outputs(STRADDLING, main="placed")
        ranked = (
            placed[STRADDLING]
            # ((split, bucket), [ImageRef]) for the buckets that straddle a shard boundary
            | "GroupStraddlers" >> beam.GroupByKey()
            | "RankStraddlers" >> beam.FlatMap(rank_bucket, layouts)
        )
        return (placed.placed, ranked) | "AllPlaced" >> beam.Flatten()


class _LayOut(beam.CombineFn):
    """((split, bucket), (images, source bytes)) counts -> {split: SplitLayout} (`lay_out`), in one combine.

    A combine without a default (an empty input gives no element) needs no step of its own to make one, and the
    layout is made where the counts meet, not in a step after them.
    """

    def __init__(self, sizing: ShardSizing):
        self._sizing = sizing

    def create_accumulator(self):
        return []

    def add_input(self, accumulator, element):
        accumulator.append(element)
        return accumulator

    def merge_accumulators(self, accumulators):
        return [count for accumulator in accumulators for count in accumulator]

    def extract_output(self, accumulator):
        return lay_out(accumulator, self._sizing)


class _SumPairs(beam.CombineFn):
    """Sums (images, bytes) pairs."""

    def create_accumulator(self):
        return 0, 0

    def add_input(self, accumulator, element):
        return accumulator[0] + element[0], accumulator[1] + element[1]

    def merge_accumulators(self, accumulators):
        images = size = 0
        for a, b in accumulators:
            images += a
            size += b
        return images, size

    def extract_output(self, accumulator):
        return accumulator
