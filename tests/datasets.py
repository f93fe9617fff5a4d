"""Helpers shared by the tests: a converted folder's records read back without TensorFlow (or counted from the shard
names, as Kaggle's notebooks do), and small trees of images to convert."""

from __future__ import annotations

import json
import os
import re

import numpy as np
from PIL import Image

from transforms.base.examples import Example
from transforms.base.tfrecord import iter_records


def read_records(dataset_dir) -> dict[str, list[dict]]:
    """Every record of every split, parsed without TensorFlow, in file order."""
    info = json.loads((dataset_dir / "image_tfrecords.json").read_text())
    out = {}
    for split, split_info in info["splits"].items():
        rows = []
        for shard in split_info["shards"]:
            for raw in iter_records(str(dataset_dir / shard["file"])):
                feature = Example.FromString(raw).features.feature
                rows.append({
                    "shard": shard["file"],
                    "label": feature["label"].int64_list.value[0],
                    "class_name": feature["class_name"].bytes_list.value[0].decode(),
                    "source_path": feature["source_path"].bytes_list.value[0].decode(),
                    "height": feature["height"].int64_list.value[0],
                    "width": feature["width"].int64_list.value[0],
                    "image": feature["image"].bytes_list.value[0],
                    "sha256": (feature["sha256"].bytes_list.value or [b""])[0].decode(),
                })
        out[split] = rows
    return out


def write_tiny_tree(root, per_class: dict[str, int], size=(24, 24), start=0):
    """Small solid-colour JPEGs: fast to convert in bulk."""
    paths = []
    for c, (name, count) in enumerate(sorted(per_class.items())):
        os.makedirs(root / name, exist_ok=True)
        for i in range(start, start + count):
            path = root / name / f"img_{i:05d}.jpg"
            Image.new("RGB", size, (40 * c % 256, 255 - 30 * c % 256, (i * 7) % 256)).save(path, quality=80)
            paths.append(f"{name}/{path.name}")
    return paths


def convert_manifest(manifest, out, *args) -> int:
    """`pipeline.launcher.run` on a --manifest, in-process (quiet, in memory, one worker); returns its exit code."""
    from pipeline.launcher import run
    from tests.conftest import FAST

    return run([f"--manifest={manifest}", f"--output_dir={out}", "--quiet", *args, *FAST])


def error_rows(out) -> list[dict]:
    """The rows of `out`/errors.jsonl ([] without one)."""
    path = out / "errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def count_data_items(filenames):
    """Kaggle's TPU notebooks' record count, as they write it: the number before the dot of each file name."""
    n = [int(re.compile(r"-([0-9]*)\.").search(filename).group(1)) for filename in filenames]
    return np.sum(n)
