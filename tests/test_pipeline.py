"""End-to-end conversions of generated folder trees: records, labels, splits, shards, report."""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np
from PIL import Image

from tests.conftest import convert
from tests.datasets import read_records, write_tiny_tree
from transforms.base.examples import Example
from transforms.base.tfrecord import iter_records
from transforms.labels.layout import hash_split


def test_every_image_becomes_one_record_with_its_folder_label(sample_tree, sample_output):
    info = json.loads((sample_output / "image_tfrecords.json").read_text())
    records = read_records(sample_output)
    sources = [r["source_path"] for rows in records.values() for r in rows]
    images = sorted(str(p.relative_to(sample_tree)) for p in sample_tree.rglob("*") if p.suffix in (".jpg", ".png"))
    assert sorted(sources) == images  # exactly one record per image, none twice
    assert info["class_names"] == ["circle", "square", "stripes", "triangle"]
    assert (sample_output / "labels.txt").read_text().splitlines() == info["class_names"]
    for rows in records.values():
        for r in rows:
            folder = r["source_path"].split("/")[0]
            assert r["class_name"] == folder
            assert r["label"] == info["class_names"].index(folder)
            assert (r["height"], r["width"]) == (512, 512)
            with Image.open(__import__("io").BytesIO(r["image"])) as decoded:
                assert decoded.format == "JPEG" and decoded.size == (512, 512) and decoded.mode == "RGB"


def test_counts_per_split_and_class_match_the_hash_and_the_info(sample_tree, sample_output):
    info = json.loads((sample_output / "image_tfrecords.json").read_text())
    records = read_records(sample_output)
    for split, rows in records.items():
        for r in rows:
            assert hash_split(r["source_path"], 42, 0.2, 0.0) == split
        assert info["splits"][split]["records"] == len(rows)
        assert info["splits"][split]["class_counts"] == dict(sorted(Counter(r["class_name"] for r in rows).items()))
        assert sum(s["records"] for s in info["splits"][split]["shards"]) == len(rows)
        for shard in info["splits"][split]["shards"]:
            assert shard["bytes"] == os.path.getsize(sample_output / shard["file"])
    assert info["files"] == {"found": 161, "written": 160, "rejected": 0, "skipped": 1, "upscaled": 160}
    assert info["skipped_by_reason"] == {"not_an_image_extension": 1}


def test_summary_and_error_report(sample_output):
    lines = [json.loads(line) for line in (sample_output / "errors.jsonl").read_text().splitlines()]
    assert lines == [{"relpath": "README.txt", "stage": "skipped", "reason": "not_an_image_extension",
                      "detail": "extension .txt is not an image extension"}]
    features = json.loads((sample_output / "image_tfrecords.json").read_text())["features"]
    assert set(features) == {"image", "label", "class_name", "height", "width", "source_path", "sha256"}
    tfds_features = json.loads((sample_output / "features.json").read_text())  # TFDS's (tests/test_tfds.py)
    assert set(tfds_features["featuresDict"]["features"]) == set(features)


def test_bad_and_odd_files_are_reported_and_counted(tmp_path):
    src = tmp_path / "in"
    write_tiny_tree(src, {"a": 6, "b": 6})
    (src / "a" / "truncated.jpg").write_bytes((src / "a" / "img_00000.jpg").read_bytes()[:-10])
    (src / "a" / "text.jpg").write_text("this is not an image")
    (src / "b" / "empty.png").write_bytes(b"")
    (src / "b" / ".hidden.jpg").write_bytes((src / "b" / "img_00000.jpg").read_bytes())
    (src / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (src / "b" / "notes.md").write_text("# notes")
    (src / "stray.jpg").write_bytes((src / "b" / "img_00001.jpg").read_bytes())
    (src / "C" / "sub").mkdir(parents=True)  # not B: B and b would be refused (they differ only in case)
    Image.new("RGB", (10, 10), "red").save(src / "C" / "sub" / "UPPER.JPEG")
    out = tmp_path / "out"
    assert convert(src, out) == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    report = {r["relpath"]: r for r in map(json.loads, (out / "errors.jsonl").read_text().splitlines())}
    assert {k: (v["stage"], v["reason"]) for k, v in report.items()} == {
        "a/truncated.jpg": ("rejected", "truncated"),
        "a/text.jpg": ("rejected", "not_an_image"),
        "b/empty.png": ("rejected", "empty_file"),
        "b/.hidden.jpg": ("skipped", "hidden_file"),
        ".DS_Store": ("skipped", "hidden_file"),
        "b/notes.md": ("skipped", "not_an_image_extension"),
        "stray.jpg": ("skipped", "no_class_folder"),
    }
    assert all(v["detail"] for v in report.values())
    # Upper-case extension in a nested folder: converted, labelled by the first folder.
    assert info["class_names"] == ["C", "a", "b"]
    assert info["files"]["found"] == 12 + 1 + 7
    assert info["files"]["written"] == 13
    assert info["files"]["found"] == info["files"]["written"] + info["files"]["rejected"] + info["files"]["skipped"]
    assert info["rejected_by_reason"] == {"empty_file": 1, "not_an_image": 1, "truncated": 1}


def test_split_membership_is_stable_across_runs_and_when_files_are_added(tmp_path):
    src = tmp_path / "in"
    write_tiny_tree(src, {"x": 40, "y": 40})
    assert convert(src, tmp_path / "run1") == 0
    assert convert(src, tmp_path / "run2") == 0
    write_tiny_tree(src, {"x": 25, "y": 25}, start=100)
    assert convert(src, tmp_path / "run3") == 0

    def membership(out):
        return {r["source_path"]: split for split, rows in read_records(out).items() for r in rows}

    first, second, third = membership(tmp_path / "run1"), membership(tmp_path / "run2"), membership(tmp_path / "run3")
    assert first == second
    assert len(third) == 130
    assert {path: third[path] for path in first} == first
    # Same inputs, same options: byte-identical shards.
    for shard in os.listdir(tmp_path / "run1"):
        if shard.endswith(".tfrecord"):
            assert (tmp_path / "run1" / shard).read_bytes() == (tmp_path / "run2" / shard).read_bytes()


def test_thousands_of_images_exact_records_validation_share_and_mixed_shards(tmp_path):
    src = tmp_path / "in"
    per_class = {"ant": 1200, "bee": 900, "cat": 500, "dog": 400}
    write_tiny_tree(src, per_class, size=(16, 16))
    out = tmp_path / "out"
    assert convert(src, out, "--image_size=16", "--num_shards=train=4,validation=4") == 0
    records = read_records(out)
    total = sum(per_class.values())
    assert sum(len(rows) for rows in records.values()) == total
    assert len({r["source_path"] for rows in records.values() for r in rows}) == total
    share = len(records["validation"]) / total
    # Hash splits are binomial: at 3,000 images one standard deviation is 0.7 points.
    assert abs(share - 0.2) <= 0.02, share
    shares = {name: count / total for name, count in per_class.items()}
    for rows in records.values():
        by_shard = {}
        for r in rows:
            by_shard.setdefault(r["shard"], []).append(r["class_name"])
        assert len(by_shard) == 4  # never an empty shard
        for names in by_shard.values():
            counts = Counter(names)
            for name, expected in shares.items():
                # every shard mixes the classes in about their global proportions
                assert abs(counts[name] / len(names) - expected) < 0.12, (name, counts)
            longest = max(len(list(run)) for run in _runs(names))
            assert longest <= 12, longest  # no long single-class stretch inside a shard


def _runs(names):
    import itertools

    return (list(group) for _, group in itertools.groupby(names))


def test_split_folders_and_labels_file(tmp_path):
    src = tmp_path / "in"
    write_tiny_tree(src / "train", {"cat": 5, "dog": 4})
    write_tiny_tree(src / "val", {"cat": 2, "dog": 2, "eel": 1})
    write_tiny_tree(src / "test", {"dog": 3})
    labels = tmp_path / "labels.txt"
    labels.write_text("dog\ncat\n")
    out = tmp_path / "out"
    assert convert(src, out, f"--labels_file={labels}") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["dog", "cat"]
    assert {s: v["records"] for s, v in info["splits"].items()} == {"train": 9, "validation": 4, "test": 3}
    records = read_records(out)
    assert all(r["label"] == {"dog": 0, "cat": 1}[r["class_name"]] for rows in records.values() for r in rows)
    assert {r["source_path"].split("/")[0] for r in records["validation"]} == {"val"}
    report = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [(r["relpath"], r["reason"]) for r in report] == [("val/eel/img_00000.jpg", "unknown_class")]


def test_tf_slim_schema_gzip_and_explicit_shards(tmp_path):
    src = tmp_path / "in"
    write_tiny_tree(src, {"a": 10, "b": 10})
    out = tmp_path / "out"
    assert convert(src, out, "--schema=tf_slim", "--compression=gzip", "--num_shards=train=2,validation=2",
                   "--image_size=32x20", "--validation_split=0.3") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    files = sorted(s["file"] for split in info["splits"].values() for s in split["shards"])
    assert files == ["train-00000-of-00002.tfrecord.gz", "train-00001-of-00002.tfrecord.gz",
                     "validation-00000-of-00002.tfrecord.gz", "validation-00001-of-00002.tfrecord.gz"]
    raw = next(iter_records(str(out / files[0])))
    feature = Example.FromString(raw).features.feature
    assert set(feature) == {"image/encoded", "image/format", "image/class/label", "image/class/text",
                            "image/height", "image/width", "image/filename", "image/key/sha256"}
    assert feature["image/format"].bytes_list.value[0] == b"jpeg"
    assert (feature["image/width"].int64_list.value[0], feature["image/height"].int64_list.value[0]) == (32, 20)


def test_pixels_survive_the_round_trip(tmp_path):
    src = tmp_path / "in"
    (src / "red").mkdir(parents=True)
    (src / "blue").mkdir()
    Image.new("RGB", (300, 200), (220, 20, 20)).save(src / "red" / "r.png")
    Image.new("RGB", (64, 64), (20, 20, 220)).save(src / "blue" / "b.jpg", quality=100)
    out = tmp_path / "out"
    assert convert(src, out, "--image_size=64", "--validation_split=0") == 0
    import io

    for r in read_records(out)["train"]:
        pixels = np.asarray(Image.open(io.BytesIO(r["image"])), dtype=np.int16)
        expected = (220, 20, 20) if r["class_name"] == "red" else (20, 20, 220)
        assert pixels.shape == (64, 64, 3)
        assert np.abs(pixels - expected).max() <= 6
