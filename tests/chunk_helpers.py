"""A chunk's conversion outcomes made by hand, for the tests of its pieces and shards (transforms/output/write.py)."""

from __future__ import annotations

from transforms.images.convert import Converted


def outcomes_of(refs, images):
    """A written Converted per (ref, serialized record), not upscaled, each with a distinct made-up source SHA-256."""
    return [Converted(ref, image, False, None, f"{i:064x}") for i, (ref, image) in enumerate(zip(refs, images,
                                                                                                  strict=True))]
