"""Objects and images per class and split of a detection dataset, counted in the job (each shard's objects tally,
summed by PublishDataset): the splits' class_counts (objects) and detection.images_per_class of
image_tfrecords.json, exact on a generated export; verify catches a description that says otherwise; preview charts
the objects per class; the summary says "Objects per class"."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FAST, run_tool
from tests.detection_runs import voc_export

# tests.detection_runs.IMAGES: train a (cat, dog), b (dog), c (none), d (cat, cat, dog); validation v (cat), w (dog)
OBJECTS = {"train": {"cat": 3, "dog": 3}, "validation": {"cat": 1, "dog": 1}}
IMAGES_WITH = {"train": {"cat": 2, "dog": 3}, "validation": {"cat": 1, "dog": 1}}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The VOC export converted into 2 train shards (so that the per-shard tallies are summed)."""
    from pipeline.launcher import run

    root = tmp_path_factory.mktemp("voc")
    voc_export(root)
    out = tmp_path_factory.mktemp("counted") / "out"
    assert run([f"--input_dir={root}", f"--output_dir={out}", "--quiet", "--task=detection", "--image_size=32x24",
                "--num_shards=2", *FAST]) == 0
    return out


def _info(out) -> dict:
    return json.loads((out / "image_tfrecords.json").read_text())


def test_objects_and_images_per_class_are_counted_per_split(dataset):
    info = _info(dataset)
    assert len(info["splits"]["train"]["shards"]) == 2
    assert {split: s["class_counts"] for split, s in info["splits"].items()} == OBJECTS
    assert info["detection"]["images_per_class"] == IMAGES_WITH
    assert sum(sum(c.values()) for c in OBJECTS.values()) == info["detection"]["annotations"]["written"]


def test_verify_passes_and_catches_a_tampered_count(dataset, tmp_path):
    import shutil

    assert run_tool("pipeline.verify", str(dataset)).returncode == 0
    copy = shutil.copytree(dataset, tmp_path / "copy")
    info = _info(copy)
    info["splits"]["train"]["class_counts"]["cat"] = 4
    info["detection"]["images_per_class"]["validation"]["dog"] = 2
    (copy / "image_tfrecords.json").write_text(json.dumps(info))
    result = run_tool("pipeline.verify", str(copy))
    assert result.returncode != 0
    assert "split 'train' class 'cat': 3 objects, but image_tfrecords.json says 4" in result.stdout
    assert ("split 'validation' class 'dog': 1 records hold one, but image_tfrecords.json says "
            "detection.images_per_class 2") in result.stdout


def test_preview_charts_the_objects_per_class(dataset, tmp_path):
    from pipeline import preview

    figure = preview.class_chart(_info(dataset))
    heights = [bar.get_height() for bar in figure.axes[0].patches]
    assert heights == [3, 3, 1, 1]  # train's cat and dog, then validation's
    assert figure.axes[0].get_ylabel() == "objects"
    result = run_tool("pipeline.preview", str(dataset), "--class_chart", tmp_path / "chart.png")
    assert result.returncode == 0, result.stderr
    assert "objects per class for train, validation" in result.stdout and (tmp_path / "chart.png").stat().st_size


def test_the_summary_counts_objects_per_class(dataset):
    """The run's summary has the table of objects per class, each class by the id its records hold (from 1, or
    from 0 with --first_class_id=0)."""
    from pipeline.report import format_summary

    info = _info(dataset)
    summary = format_summary(info).splitlines()
    start = next(i for i, line in enumerate(summary) if line.startswith("Objects per class:"))
    assert summary[start].split()[3:] == ["train", "validation"]
    assert [line.split() for line in summary[start + 1:start + 3]] == [["1", "cat", "3", "1"], ["2", "dog", "3", "1"]]
    info["detection"]["first_id"] = 0
    start = format_summary(info).splitlines().index(summary[start])
    assert [line.split()[:2] for line in format_summary(info).splitlines()[start + 1:start + 3]] == [["0", "cat"],
                                                                                                     ["1", "dog"]]


def test_shard_tallies_add_up_per_split_and_class():
    from transforms.detection.conversion import (
        CLASS_OBJECTS,
        add_detection_tallies,
        detection_section,
        objects_tally,
        per_class,
    )

    total = {}
    for tally in (objects_tally(3, 0, 2, "train", [("dog", 2, 1), ("cat", 1, 1)]),
                  objects_tally(2, 1, 2, "train", [("dog", 2, 1)]),
                  objects_tally(1, 0, 1, "test", [("cat", 1, 1)])):
        add_detection_tallies(total, tally)
    assert per_class(total, CLASS_OBJECTS, ["cat", "dog", "bird"]) == {"train": {"cat": 1, "dog": 4},
                                                                       "test": {"cat": 1}}
    section = detection_section({**total, "annotations_found": 7}, {"bad_box": 1, "empty_instance_mask": 2}, 0,
                                first_id=1, instance_masks=True, semantic_masks=False, input_format="voc",
                                class_names=["cat", "dog", "bird"])
    assert section["images_per_class"] == {"train": {"cat": 1, "dog": 2}, "test": {"cat": 1}}
    assert section["annotations"] == {"found": 7, "written": 6, "rejected": {"bad_box": 1}}
    assert section["instance_masks_rejected"] == {"empty_instance_mask": 2}
