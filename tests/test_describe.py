"""PublishDataset: its accounting as plain functions (summarise, check_accounting), and the composite itself."""

from __future__ import annotations

import json
import os
import re

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from tests.pipelines import TestPipeline
from transforms.base.dataset_format import ERRORS_FILE, INFO_FILE, LABELS_FILE
from transforms.base.records import Rejection
from transforms.output.describe import (
    DatasetIncomplete,
    PublishDataset,
    check_accounting,
    summarise,
)
from transforms.output.ownership import shards_dir
from transforms.output.write import ShardInfo

CLASSES = ["cat", "dog"]
# ("found",), ("written", split, label, upscaled) or (stage, reason), each with its count
TALLIES = [(("found",), 7), (("written", "train", 0, False), 3), (("written", "train", 1, True), 1),
           (("written", "validation", 1, False), 1), (("rejected", "truncated"), 1), (("skipped", "not_an_image"), 1)]
SHARDS = [ShardInfo("train", "train-00001-of-00002.tfrecord", 2, 200),
          ShardInfo("train", "train-00000-of-00002.tfrecord", 2, 150),
          ShardInfo("validation", "validation-00000-of-00001.tfrecord", 1, 90, "validation-00000-of-00001.idx")]


def test_summarise_adds_up_the_tallies_per_split_and_class_and_lists_shards_in_name_order():
    counts = summarise(TALLIES, SHARDS, CLASSES)
    assert counts.files == {"found": 7, "written": 5, "rejected": 1, "skipped": 1, "upscaled": 1}
    assert list(counts.splits) == ["train", "validation"]
    train = counts.splits["train"]
    assert (train["records"], train["class_counts"], train["bytes"]) == (4, {"cat": 3, "dog": 1}, 350)
    assert [s["file"] for s in train["shards"]] == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    assert counts.splits["validation"]["shards"] == [{"file": "validation-00000-of-00001.tfrecord", "records": 1,
                                                      "bytes": 90, "index": "validation-00000-of-00001.idx"}]
    assert counts.rejected_by_reason == {"truncated": 1}
    assert counts.skipped_by_reason == {"not_an_image": 1}
    check_accounting(counts)  # found 7 = 5 written + 1 rejected + 1 skipped; every split's shards hold its images


def test_summarise_leaves_out_a_class_and_a_split_with_no_image():
    counts = summarise([(("found",), 1), (("written", "train", 1, False), 1)], [ShardInfo("train", "t.tfrecord", 1, 9)],
                       CLASSES)
    assert list(counts.splits) == ["train"]
    assert counts.splits["train"]["class_counts"] == {"dog": 1}


def test_check_accounting_refuses_a_file_neither_written_rejected_nor_skipped():
    counts = summarise([(("found",), 8), *TALLIES[1:]], SHARDS, CLASSES)
    with pytest.raises(DatasetIncomplete, match=r"accounting mismatch: 8 files found but 5 written \+ 1 rejected "
                                                rf"\+ 1 skipped; {re.escape(INFO_FILE)} was not written"):
        check_accounting(counts)


def test_check_accounting_refuses_shards_that_miss_a_converted_image():
    counts = summarise(TALLIES, SHARDS[1:], CLASSES)  # a train shard of 2 records is missing
    with pytest.raises(DatasetIncomplete, match=r"split 'train': the shards hold 2 records but 4 images were "
                                                r"converted; the dataset is incomplete"):
        check_accounting(counts)


def _shard_files(output_dir, run_id):
    folder = shards_dir(str(output_dir), run_id)
    os.makedirs(folder)
    for _, name, _, size, index, _ in SHARDS:
        with open(os.path.join(folder, name), "wb") as f:
            f.write(b"x" * size)
        if index:
            with open(os.path.join(folder, index), "w") as f:
                f.write("0 90\n")


def _describe(p, output_dir, run_id, found):
    rejections = [Rejection("a/broken.jpg", "rejected", "truncated", "image file is truncated"),
                  Rejection("notes.txt", "skipped", "not_an_image", "not an image file name")]
    return {
        "written": p | "Written" >> beam.Create([(key[1:], n) for key, n in TALLIES if key[0] == "written"]),
        "rejections": p | "Rejections" >> beam.Create(rejections),
        "shards": p | "Shards" >> beam.Create(SHARDS),
        "found": p | "Found" >> beam.Create([found - 2, 2]),  # counted per bundle
    } | PublishDataset(str(output_dir), run_id, CLASSES, "default", {"compression": ""}, {"fixed_size": False},
                        0.0, "0.1.0")


def test_describe_dataset_publishes_the_shards_and_writes_the_description_last(tmp_path):
    _shard_files(tmp_path, "run1")
    with TestPipeline() as p:
        info = _describe(p, tmp_path, "run1", found=7)
        assert_that(info | beam.Map(lambda i: (i["files"], i["splits"]["train"]["records"], i["num_classes"])),
                    equal_to([({"found": 7, "written": 5, "rejected": 1, "skipped": 1, "upscaled": 1}, 4, 2)]))
    written = json.loads((tmp_path / INFO_FILE).read_text())
    assert written["run_id"] == "run1" and written["total_bytes"] == 440
    assert (tmp_path / LABELS_FILE).read_text() == "cat\ndog\n"
    assert sorted(json.loads(line)["reason"] for line in (tmp_path / ERRORS_FILE).read_text().splitlines()) == [
        "not_an_image", "truncated"]
    published = {INFO_FILE, LABELS_FILE, ERRORS_FILE, *(s[1] for s in SHARDS), SHARDS[2][4]}
    assert published <= set(os.listdir(tmp_path))
    assert not os.path.exists(shards_dir(str(tmp_path), "run1"))  # the run's own folder is gone


def test_describe_dataset_writes_no_description_when_a_file_is_unaccounted_for(tmp_path):
    _shard_files(tmp_path, "run1")
    with pytest.raises(Exception, match="accounting mismatch: 8 files found"):
        with TestPipeline() as p:
            _describe(p, tmp_path, "run1", found=8)
    assert not (tmp_path / INFO_FILE).exists()
