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
# The group count is a multiple of this: 48 groups split evenly over 1, 2, 3,
# 4, 6, 8, 12, 16, 24 or 48 workers.
GROUP_MULTIPLE = 48


def group_count(expected_images: int) -> int:
    """Enough groups to keep every worker busy, each small enough to sort in memory.

    Beam's local runner deals the groups out to its worker processes in turn,
    one share per worker for the whole conversion. With a group count that is
    not a multiple of the worker count, one worker gets a whole group more
    than another and the job ends with it converting alone: 79 groups of 253
    images on 2 workers left one core idle for the last 1.8 s. With a multiple
    of 48, what remains is the random spread of group sizes: on 2 workers a
    share differs from half by sqrt(images)/2 images (about 70 of 20,000).
    """
    groups = max(1, -(-expected_images // GROUP_SIZE))
    return -(-groups // GROUP_MULTIPLE) * GROUP_MULTIPLE


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
