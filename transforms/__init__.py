"""Beam transforms for image-to-TFRecord conversion, and the plain functions they call, by stage.

    base/    the ground floor: dataset names and formats, paths, typed elements, counters, shared I/O
    labels/  where each image goes: class, split, group, shard (from its relative path alone)
    inputs/  what the job reads: the listing, manifests, metadata, an existing dataset's sources, duplicates
    images/  converting one image: decode, pixels, encode, diagnosis, the fast core, statistics, the pool
    output/  what the job writes: shard pieces and their assembly, descriptions, resume records, lock, publishing

A sub-package imports only its own modules and those of the sub-packages above it (tests/test_architecture.py).
"""
