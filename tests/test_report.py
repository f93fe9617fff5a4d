"""The final report: what image_tfrecords.json records and what the summary prints from it."""

from __future__ import annotations

import json
import re
import statistics

from pipeline.report import class_count_lines, format_summary, human_bytes, shard_size_line


def test_dataset_info_holds_every_number_of_the_report(sample_output):
    info = json.loads((sample_output / "image_tfrecords.json").read_text())
    shard_sizes = [shard["bytes"] for split in info["splits"].values() for shard in split["shards"]]
    on_disk = [(sample_output / shard["file"]).stat().st_size
               for split in info["splits"].values() for shard in split["shards"]]
    assert shard_sizes == on_disk
    assert info["shard_bytes"] == {"min": min(on_disk), "median": statistics.median(on_disk), "max": max(on_disk)}
    assert info["total_bytes"] == sum(on_disk)
    for split in info["splits"].values():
        assert sum(split["class_counts"].values()) == split["records"]
    assert info["files"]["written"] == sum(s["records"] for s in info["splits"].values())
    assert {"elapsed_seconds", "images_per_second"} <= set(info)  # the machine's figures, reported, not checked


def test_summary_prints_counts_per_class_and_split_and_shard_sizes(sample_output):
    info = json.loads((sample_output / "image_tfrecords.json").read_text())
    text = format_summary(info)
    splits = list(info["splits"])
    header = next(line for line in text.splitlines() if line.startswith("Images per class:"))
    assert header.split()[3:] == splits
    for label, name in enumerate(info["class_names"]):
        row = next(line for line in text.splitlines() if re.fullmatch(rf"\s+{label} {name}\s.*", line))
        assert [int(n) for n in row.split()[2:]] == [info["splits"][s]["class_counts"].get(name, 0) for s in splits]
    assert shard_size_line(info) in text
    assert f"{human_bytes(info['total_bytes'])} in all" in text or "Shards: 1 file" in text
    assert f"{info['images_per_second']:.1f} images/s" in text


def test_many_classes_are_summarised_with_the_smallest_named():
    names = [f"c{i:03d}" for i in range(50)]
    info = {"class_names": names,
            "splits": {"train": {"class_counts": {n: 100 + i for i, n in enumerate(names)}, "shards": [], "bytes": 0}}}
    lines = class_count_lines(info)
    assert lines[0].startswith("Images per class (50 classes")
    assert lines[1].split() == ["train", "100", "to", "149", "(median", "124.5);", "fewest:", "c000", "100,",
                                "c001", "101,", "c002", "102"]


def test_shard_line_and_sizes():
    info = {"splits": {"train": {"shards": [{}, {}, {}]}},
            "shard_bytes": {"min": 900, "median": 1500, "max": 2_500_000}, "total_bytes": 2_502_400}
    assert shard_size_line(info) == "Shards: 3 files of 900 B to 2.5 MB (median 1.5 KB), 2.5 MB in all."
    assert human_bytes(3.2e9) == "3.2 GB"
