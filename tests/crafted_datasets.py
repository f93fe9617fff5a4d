"""Datasets written by hand for the read-side tests: records as build_example kwargs, a description that agrees."""

from __future__ import annotations

import gzip
import io
import json

from PIL import Image

from tests.hostile_records import frame
from transforms.base.dataset_format import FORMAT_VERSION
from transforms.base.examples import build_example, feature_description

CLASSES = ("cat", "dog", "fox")


def jpeg(colour, size=(20, 16)) -> bytes:
    """A JPEG of one `colour` (20 x 16 unless `size`), quality 90."""
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "JPEG", quality=90)
    return out.getvalue()


def save_info(path, info: dict) -> None:
    """Write `info` as the image_tfrecords.json of the dataset folder `path`."""
    (path / "image_tfrecords.json").write_text(json.dumps(info, indent=2))


def craft_dataset(root, splits: dict[str, list[list[dict]]], class_names=CLASSES, compression="none"):
    """Write a dataset by hand: splits maps a split to its shards, each a list of build_example kwargs.

    image_tfrecords.json agrees with what is written (class counts follow the class_name fields), so
    that only the damage a test puts in the records is wrong.
    """
    root.mkdir(parents=True, exist_ok=True)
    suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    info_splits, written = {}, 0
    for split, shards in splits.items():
        listed, counts = [], {}
        for number, records in enumerate(shards):
            name = f"{split}-{number:05d}-of-{len(shards):05d}{suffix}"
            blob = b"".join(frame(build_example(**record)) for record in records)
            (root / name).write_bytes(gzip.compress(blob) if compression == "gzip" else blob)
            listed.append({"file": name, "records": len(records), "bytes": (root / name).stat().st_size})
            for record in records:
                counts[record["class_name"]] = counts.get(record["class_name"], 0) + 1
        total = sum(len(records) for records in shards)
        written += total
        info_splits[split] = {"records": total, "class_counts": counts, "shards": listed,
                              "bytes": sum(s["bytes"] for s in listed)}
    info = {
        "format_version": FORMAT_VERSION, "schema": "default", "features": feature_description("default"),
        "image": {"height": 16, "width": 20, "channels": 3, "format": "jpeg", "fixed_size": True},
        "compression": compression, "class_names": list(class_names), "num_classes": len(class_names),
        "splits": info_splits,
        "files": {"found": written, "written": written, "rejected": 0, "skipped": 0, "upscaled": 0},
        "rejected_by_reason": {}, "skipped_by_reason": {}, "error_report": "errors.jsonl",
    }
    (root / "labels.txt").write_text("".join(f"{name}\n" for name in class_names))
    (root / "errors.jsonl").write_text("")
    save_info(root, info)
    return root


def rec(label: int, source_path: str, colour=(10, 20, 30), class_name: str | None = None, image=None) -> dict:
    """build_example's kwargs of one 20 x 16 record of class `label` (named from CLASSES unless `class_name`)."""
    return dict(image=image if image is not None else jpeg(colour), image_format="jpeg", label=label,
                class_name=class_name if class_name is not None else CLASSES[label % len(CLASSES)],
                height=16, width=20, source_path=source_path)
