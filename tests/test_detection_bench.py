"""benchmarks/detection_bench and its peer benchmarks/classic_detection: the set it builds, its arithmetic, its output
(the figures themselves are BENCHMARKS.md's, never a test's)."""

from __future__ import annotations

import hashlib
import json
import os
import statistics

import numpy as np
import pytest
from PIL import Image

from benchmarks.detection_bench import CASES, REFERENCE, build_set, marginal, source_photos, summarise
from tests.conftest import cli
from tests.datasets import write_tiny_tree
from tests.detection_runs import _values, read_detection_records, record_boxes
from transforms.base.examples import Example
from transforms.base.tfrecord import iter_records


def _photos(tmp_path):
    """Five non-square JPEGs in two class folders, and a PNG that is not a JPEG (left out, as ants-bees' GIF)."""
    write_tiny_tree(tmp_path / "photos", {"ants": 3, "bees": 2}, size=(64, 48))
    Image.new("RGB", (10, 10)).save(tmp_path / "photos" / "ants" / "not-a-jpeg.png")
    return source_photos(str(tmp_path / "photos"))


def test_the_set_repeats_the_photos_as_distinct_files_with_two_or_three_boxes_each(tmp_path):
    photos = _photos(tmp_path)
    assert len(photos) == 5 and all(size == (64, 48) for _, _, size in photos)
    built = build_set(photos, str(tmp_path / "set"), 12)
    coco = {split: json.load(open(tmp_path / "set" / "coco" / "annotations" / f"instances_{split}.json"))
            for split in ("train", "val")}
    images = coco["train"]["images"] + coco["val"]["images"]
    annotations = coco["train"]["annotations"] + coco["val"]["annotations"]
    assert len(images) == 12 and len(coco["val"]["images"]) == 2  # every fifth copy in val/
    assert built["objects"] == len(annotations)
    per_image = {image["id"]: 0 for image in images}
    for annotation in annotations:
        per_image[annotation["image_id"]] += 1
        x, y, w, h = annotation["bbox"]
        assert 0 <= x and 0 <= y and x + w <= 64.01 and y + h <= 48.01
        xs, ys = annotation["segmentation"][0][0::2], annotation["segmentation"][0][1::2]
        # the polygon inside its box (each number rounded to 0.01 on its own)
        assert len(xs) == 12 and x - 0.02 <= min(xs) and max(xs) <= x + w + 0.02 and y - 0.02 <= min(ys)
    assert set(per_image.values()) <= {2, 3}
    for split in ("train", "val"):  # a split's annotation ids unique
        ids = [annotation["id"] for annotation in coco[split]["annotations"]]
        assert len(ids) == len(set(ids))
    digests = set()
    for split in ("train", "val"):
        for image in coco[split]["images"]:
            path = tmp_path / "set" / "coco" / split / image["file_name"]
            digests.add(hashlib.sha256(path.read_bytes()).hexdigest())
            assert os.path.samefile(path, tmp_path / "set" / "folders" / split / image["file_name"])
            source = photos[(image["id"] - 1) % len(photos)]
            assert image["file_name"].startswith(source[1] + "/")  # the photo's class folder: (a)'s label
            assert np.array_equal(np.asarray(Image.open(path)), np.asarray(Image.open(source[0])))  # same pixels
    assert len(digests) == 12  # no two copies are duplicates


def _run(seconds: float, cpu: float) -> dict:
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_bytes": 2**20 * 100}


def test_the_summary_takes_each_case_against_the_reference_of_its_own_round():
    rounds = [{REFERENCE: _run(10, 16), "classic": _run(30, 29)},
              {REFERENCE: _run(12, 18), "classic": _run(30, 30)},
              {REFERENCE: _run(11, 17), "classic": _run(44, 34)}]
    summary = summarise(rounds, images=1000)
    assert summary[REFERENCE]["wall_vs_reference"] == {"median": 1, "min": 1, "max": 1}
    classic = summary["classic"]
    assert classic["wall_vs_reference"] == {"median": 3.0, "min": 2.5, "max": 4.0}  # 3.0, 2.5, 4.0: round by round
    assert classic["cpu_vs_reference"]["median"] == pytest.approx(29 / 16)
    assert classic["wall_ms_per_image"] == {"median": 30.0, "min": 30.0, "max": 44.0}
    assert classic["cores_busy"]["median"] == 29 / 30 and classic["cores_busy"]["min"] == 34 / 44
    assert summary[REFERENCE]["cores_busy"]["max"] == 1.6
    assert classic["peak_rss_mib"]["median"] == 100

    small = {"images": 1000, "summary": summary, "rounds": rounds}
    large = {"images": 3000, "summary": summary,
             "rounds": [{REFERENCE: _run(20, 36), "classic": _run(90, 89)}]}
    figures = marginal(small, large)["cases"]
    assert figures[REFERENCE]["wall_ms_per_image"] == pytest.approx((20 - 11) / 2000 * 1000)
    assert figures["classic"]["wall_ms_per_image"] == pytest.approx((90 - 30) / 2000 * 1000)
    assert figures["classic"]["cpu_vs_reference"] == pytest.approx((89 - 30) / (36 - 17))


def _classic_records(out) -> dict[str, dict]:
    records = {}
    for name in sorted(os.listdir(out)):
        for raw in iter_records(str(out / name)):
            feature = Example.FromString(raw).features.feature
            kinds = {key: feature[key].WhichOneof("kind").split("_")[0] for key in feature}
            record = {key: _values(feature, key, kind) for key, kind in kinds.items()}
            records[record["image/filename"][0]] = record
    return records


@pytest.mark.bench  # the script itself, every case run twice: make test runs it; leave it out while you work
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_case_runs_and_the_classic_script_writes_the_converters_boxes(tmp_path):
    _photos(tmp_path)
    work = tmp_path / "work"
    result = cli("benchmarks.detection_bench", f"--photos={tmp_path / 'photos'}", "--images=6", "--repeat=2",
                 "--warmup=0", "--image_size=32", f"--workdir={work}", "--keep", f"--json={tmp_path / 'r.json'}",
                 timeout=540)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads((tmp_path / "r.json").read_text())
    assert figures["photos"] == 5 and figures["image_size"] == 32
    [size] = figures["sizes"]
    assert size["images"] == 6 and len(size["rounds"]) == 2
    for measured in size["rounds"]:
        assert list(measured) == list(CASES)
        assert all(run["images"] == 6 for run in measured.values())
        assert all(measured[case]["objects"] == size["objects"] for case in CASES if case != REFERENCE)
    ratios = [m["classic"]["seconds"] / m[REFERENCE]["seconds"] for m in size["rounds"]]
    assert size["summary"]["classic"]["wall_vs_reference"]["median"] == pytest.approx(statistics.median(ratios))
    assert "| case | wall ms/image | CPU ms/image | cores busy | wall / (a) | CPU / (a) | peak MiB |" in result.stdout
    assert "| detection_masks |" in result.stdout and "marginal" not in figures  # one size: no marginal cost

    tool = {record["image/filename"][0].split("/", 1)[1]: record  # train/ants/000000.jpg: below the split folder
            for split in read_detection_records(work / "set-6" / "out-detection_masks").values() for record in split}
    classic = _classic_records(work / "set-6" / "out-classic_masks")
    assert sorted(classic) == sorted(tool) and len(tool) == 6
    for name, record in classic.items():
        assert (record["image/width"], record["image/height"]) == ([32], [32])
        assert [text for text, _ in record_boxes(record)] == [text for text, _ in record_boxes(tool[name])]
        for (_, ours), (_, theirs) in zip(record_boxes(record), record_boxes(tool[name]), strict=True):
            assert ours == pytest.approx(theirs, abs=1e-3)  # the same boxes: the same work
        assert len(record["image/object/mask"]) == len(tool[name]["image/object/mask"]) >= 2
        assert record["image/object/class/label"] == tool[name]["image/object/class/label"]
