"""A run's shard files made directly in the GCS emulator, as the shards step leaves them, for the publishing tests."""

from __future__ import annotations

import json

from transforms.base.dataset_format import INFO_FILE
from transforms.output import ownership

RUN = "20261202-010000-0a1b2c3d"
OLD_SHARDS = 3


def shard_names(count: int) -> list[str]:
    """The names of a `count`-shard train split's shard files."""
    return [f"train-{i:05d}-of-{count:05d}.tfrecord" for i in range(count)]


def fill(emulator, out: str, count: int, run_id: str = RUN) -> list[str]:
    """An old complete dataset of OLD_SHARDS shards in `out`, and run `run_id`'s `count` shard files (a few bytes
    each, named by their shard) in its temporary folder; returns the new shards' names."""
    old = {"splits": {"train": {"shards": [{"file": name} for name in shard_names(OLD_SHARDS)]}}}
    names = shard_names(count)
    folder = ownership.shards_dir(out, run_id)
    emulator.write_many({**{f"{out}/{name}": b"old" for name in shard_names(OLD_SHARDS)},
                         f"{out}/{INFO_FILE}": json.dumps(old).encode(),
                         **{f"{folder}/{name}": name.encode() for name in names}})
    return names
