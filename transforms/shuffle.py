"""ShuffleImages: a reproducible random order of images, which also spreads the work over workers.

Shuffling the small references before conversion (rather than the converted
bytes after it) costs almost nothing, and it breaks fusion after listing so
that Dataflow spreads the conversion over every worker.
"""

from __future__ import annotations

import apache_beam as beam

from transforms.records import ImageRef

# Images per shuffle group on average. Groups are random samples of the whole
# dataset, sorted by shuffle key, so every stretch of the output stream mixes
# the classes in about their global proportions.
GROUP_SIZE = 256
MIN_GROUPS = 16


def group_count(expected_images: int) -> int:
    """Enough groups to keep every worker busy, each small enough to sort in memory.

    The local runner hands whole groups to workers in turn, so 16 groups balance up
    to 16 cores; fewer, larger groups would mix less well for tiny datasets.
    """
    return max(MIN_GROUPS, -(-expected_images // GROUP_SIZE))


def _sorted_group(keyed) -> list[ImageRef]:
    _, refs = keyed
    return sorted(refs, key=lambda ref: ref.shuffle_key)


class ShuffleImages(beam.PTransform):
    """ImageRef -> ImageRef, in shuffle-key order within random groups."""

    def __init__(self, expected_images: int):
        super().__init__()
        self._groups = group_count(expected_images)

    def expand(self, refs):
        groups = self._groups
        return (
            refs
            # (group, ImageRef)
            | "KeyByGroup" >> beam.Map(lambda ref: (ref.shuffle_key % groups, ref))
            # (group, [ImageRef])
            | "GroupImages" >> beam.GroupByKey()
            # ImageRef, sorted by shuffle key inside each group
            | "SortGroups" >> beam.FlatMap(_sorted_group)
        )
