"""python -m pipeline.verify: every kind of damage is caught and named, a sound dataset passes.

A converted tree mixing good, bad and non-image files is the sound dataset;
each test damages a copy of it (or writes a small crafted dataset) and checks
that verify names the damage, and only it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct

import pytest
from PIL import Image, PngImagePlugin

from pipeline import verify
from pipeline.cli import main_of
from pipeline.errors import DatasetError
from tests.conftest import convert
from tests.crafted_datasets import CLASSES, craft_dataset, jpeg, rec, save_info
from transforms.base.records import Rejection
from transforms.base.tfrecord import masked_crc
from transforms.labels.layout import hash_split
from transforms.output.describe import DatasetIncomplete, _WriteInfo
from transforms.output.write import ShardInfo

GOOD_PER_CLASS = 8


def _write_tree(root) -> dict[str, int]:
    """Good images, bad images and non-image files; returns the counts the accounting must show."""
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(GOOD_PER_CLASS):
            image = Image.new("RGB", (24 + i, 20 + c), (80 * c % 256, 20 * i % 256, 200))
            image.save(root / name / f"{name}_{i}.{'png' if i % 3 == 0 else 'jpg'}")
    good = jpeg((1, 2, 3), (64, 64))
    (root / "cat" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "cat" / "text.png").write_text("this is not a picture")
    (root / "dog" / "empty.jpg").write_bytes(b"")
    (root / "notes.txt").write_text("notes")
    (root / "dog" / "readme.md").write_text("readme")
    (root / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / "fox" / ".hidden.jpg").write_bytes(good)
    written = GOOD_PER_CLASS * len(CLASSES)
    return {"found": written + 3 + 4, "written": written, "rejected": 3, "skipped": 4}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """(dataset folder, expected file counts) of a converted tree of good, bad and non-image files."""
    root = tmp_path_factory.mktemp("verify")
    expected = _write_tree(root / "in")
    assert convert(root / "in", root / "out", "--num_shards=train=2,validation=2", "--image_size=32",
                   "--validation_split=0.4") == 0
    return root / "out", expected


@pytest.fixture
def damaged(mixed, tmp_path):
    """A private copy of the sound dataset, to damage."""
    target = tmp_path / "copy"
    shutil.copytree(mixed[0], target)
    return target


def _info(path) -> dict:
    return json.loads((path / "image_tfrecords.json").read_text())


def _record_spans(path) -> list[tuple[int, int]]:
    """(offset of the data, length) of every record of an uncompressed TFRecord file."""
    blob, spans, pos = path.read_bytes(), [], 0
    while pos < len(blob):
        (length,) = struct.unpack("<Q", blob[pos:pos + 8])
        spans.append((pos + 12, length))
        pos += 12 + length + 4
    return spans


def _problems(path, decode=True) -> list[str]:
    return verify.verify_dataset(str(path), decode=decode).problems


# --- the sound dataset ------------------------------------------------------------------------------------------


def test_mixed_tree_accounts_for_every_file(mixed):
    dataset, expected = mixed
    info = _info(dataset)
    assert {k: info["files"][k] for k in expected} == expected
    errors = [json.loads(line) for line in (dataset / "errors.jsonl").read_text().splitlines()]
    assert sorted((e["relpath"], e["stage"]) for e in errors) == [
        (".DS_Store", "skipped"), ("cat/text.png", "rejected"), ("cat/truncated.jpg", "rejected"),
        ("dog/empty.jpg", "rejected"), ("dog/readme.md", "skipped"), ("fox/.hidden.jpg", "skipped"),
        ("notes.txt", "skipped"),
    ]
    report = verify.verify_dataset(str(dataset))
    assert report.problems == [] and report.warnings == []
    assert sum(report.split_records.values()) == expected["written"]


def test_verify_command_passes_a_sound_dataset_and_prints_the_accounting(mixed, capsys):
    dataset, expected = mixed
    assert main_of(verify.run, [str(dataset)]) == 0
    out = capsys.readouterr().out
    assert (f"Files: {expected['found']} found = {expected['written']} written + 3 rejected + 4 skipped; "
            "errors.jsonl has 7 line(s).") in out
    assert out.splitlines()[-1].startswith("OK: ")
    assert "problem:" not in out


def test_a_default_conversion_verifies(sample_output):
    report = verify.verify_dataset(str(sample_output))
    assert report.ok, report.problems
    assert sum(report.split_records.values()) == _info(sample_output)["files"]["written"]


def test_a_folder_without_dataset_info_is_refused(mixed, tmp_path, capsys):
    shutil.copytree(mixed[0], tmp_path / "partial")
    os.remove(tmp_path / "partial" / "image_tfrecords.json")
    assert main_of(verify.run, [str(tmp_path / "partial")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "has no image_tfrecords.json" in err[0]
    from pipeline import reader

    with pytest.raises(DatasetError, match="not a complete dataset"):
        reader.load_info(str(tmp_path / "partial"))
    with pytest.raises(DatasetError):
        reader.make_dataset(str(tmp_path / "partial"), "train")


def test_a_dataset_in_gcs_is_verified(gcs_emulator, mixed):
    bucket = gcs_emulator.create_bucket("verify-gcs")
    gcs_emulator.upload_tree(mixed[0], f"{bucket}/ds")
    assert _problems(f"{bucket}/ds") == []
    gcs_emulator.client().bucket("verify-gcs").blob("ds/validation-00001-of-00002.tfrecord").delete()
    assert _problems(f"{bucket}/ds", decode=False) == [
        "validation-00001-of-00002.tfrecord: listed in image_tfrecords.json but missing"]
    with pytest.raises(DatasetError, match="has no image_tfrecords.json"):
        verify.verify_dataset(f"{bucket}/nothing")


# --- damaged shards -------------------------------------------------------------------------------------------


def test_a_flipped_byte_in_a_record_is_caught_by_its_checksum(damaged):
    shard = damaged / "train-00000-of-00002.tfrecord"
    offset, length = _record_spans(shard)[1]
    blob = bytearray(shard.read_bytes())
    blob[offset + length - 40] ^= 0x04  # inside the JPEG's scan data: it would still decode
    shard.write_bytes(bytes(blob))
    assert _problems(damaged, decode=False) == [
        "train-00000-of-00002.tfrecord record 1: data checksum mismatch (the record's bytes are corrupt)"]


def test_a_flipped_byte_in_a_record_header_is_caught(damaged):
    shard = damaged / "validation-00001-of-00002.tfrecord"
    offset, _ = _record_spans(shard)[-1]
    blob = bytearray(shard.read_bytes())
    blob[offset - 12] ^= 0x01  # the record's length field
    shard.write_bytes(bytes(blob))
    problems = _problems(damaged)
    assert len(problems) == 1 and problems[0].startswith("validation-00001-of-00002.tfrecord: record ")
    assert "length checksum mismatch" in problems[0]


def test_the_verify_command_lists_the_damage_and_exits_1(damaged, capsys):
    shard = damaged / "train-00001-of-00002.tfrecord"
    offset, _ = _record_spans(shard)[0]
    blob = bytearray(shard.read_bytes())
    blob[offset + 5] ^= 0xFF
    shard.write_bytes(bytes(blob))
    os.remove(damaged / "validation-00000-of-00002.tfrecord")
    assert main_of(verify.run, [str(damaged), "--no_decode"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "problem: train-00001-of-00002.tfrecord record 0: data checksum mismatch (the record's bytes are " \
           "corrupt)" in lines
    assert "problem: validation-00000-of-00002.tfrecord: listed in image_tfrecords.json but missing" in lines
    assert lines[-1] == f"FAILED: 2 problem(s) in {damaged}."


def test_a_missing_shard_is_caught(damaged):
    os.remove(damaged / "validation-00001-of-00002.tfrecord")
    assert _problems(damaged) == ["validation-00001-of-00002.tfrecord: listed in image_tfrecords.json but missing"]


def test_a_stale_shard_of_another_run_is_caught(damaged):
    shutil.copy(damaged / "train-00000-of-00002.tfrecord", damaged / "train-00002-of-00003.tfrecord")
    (damaged / "train-notes.txt").write_text("a user's file: not a shard")
    assert _problems(damaged) == [
        "train-00002-of-00003.tfrecord: not listed in image_tfrecords.json, but the shard glob train-*.tfrecord* "
        "matches it, so readers that glob read it as part of the dataset (a stale shard from another run?): remove "
        "it or move it out of this folder"]


def test_a_truncated_shard_is_caught(damaged):
    shard = damaged / "train-00001-of-00002.tfrecord"
    blob = shard.read_bytes()
    shard.write_bytes(blob[:-10])
    problems = _problems(damaged)
    assert problems[0] == f"train-00001-of-00002.tfrecord: {len(blob) - 10} bytes, but image_tfrecords.json says " \
                          f"{len(blob)}"
    assert "the file ends inside the record" in problems[1]
    assert len(problems) == 2


def test_a_record_count_that_differs_from_dataset_info_is_caught(damaged):
    info = _info(damaged)
    shards = info["splits"]["train"]["shards"]
    shards[0]["records"] += 1
    shards[1]["records"] -= 1
    counts = info["splits"]["train"]["class_counts"]
    counts["cat"] += 1
    counts["dog"] -= 1
    save_info(damaged, info)
    problems = _problems(damaged, decode=False)
    assert sorted(problems) == sorted([
        f"train-00000-of-00002.tfrecord: holds {shards[0]['records'] - 1} records, but image_tfrecords.json says "
        f"{shards[0]['records']}",
        f"train-00001-of-00002.tfrecord: holds {shards[1]['records'] + 1} records, but image_tfrecords.json says "
        f"{shards[1]['records']}",
        f"split 'train' class 'cat': {counts['cat'] - 1} records, but image_tfrecords.json says {counts['cat']}",
        f"split 'train' class 'dog': {counts['dog'] + 1} records, but image_tfrecords.json says {counts['dog']}",
        # TFDS's shard lengths are the written ones, so they differ from the edited ones too.
        "dataset_info.json: its splits differ from the splits and keys in image_tfrecords.json (TFDS reads its "
        "shard lengths from it); tfds.builder_from_directory would not load the folder as it is; convert again",
    ])


# --- accounting -----------------------------------------------------------------------------------------------


def test_an_error_report_line_lost_is_caught(damaged):
    lines = (damaged / "errors.jsonl").read_text().splitlines()
    dropped = json.loads(lines[0])
    (damaged / "errors.jsonl").write_text("\n".join(lines[1:]) + "\n")
    problems = _problems(damaged, decode=False)
    assert ("errors.jsonl: 6 lines of files, but image_tfrecords.json counts 3 rejected + 4 skipped = 7 files"
            in problems)
    listed = _info(damaged)[f"{dropped['stage']}_by_reason"][dropped["reason"]]
    assert (f"errors.jsonl: {listed - 1} files {dropped['stage']} as {dropped['reason']!r}, but image_tfrecords.json "
            f"says {listed}") in problems
    assert len(problems) == 2


def test_files_found_but_not_accounted_for_are_caught(damaged):
    info = _info(damaged)
    info["files"]["found"] += 1
    save_info(damaged, info)
    found, written = info["files"]["found"], info["files"]["written"]
    assert _problems(damaged, decode=False) == [
        f"image_tfrecords.json: {found} files found but {written} written + 3 rejected + 4 skipped = {found - 1}; "
        "files are unaccounted for"]


def test_a_file_both_written_and_reported_rejected_is_caught(damaged):
    info = _info(damaged)
    info["files"]["found"] += 1
    info["files"]["rejected"] += 1
    info["rejected_by_reason"]["truncated"] = info["rejected_by_reason"].get("truncated", 0) + 1
    save_info(damaged, info)
    with open(damaged / "errors.jsonl", "a") as f:
        f.write(json.dumps({"relpath": "dog/dog_1.jpg", "stage": "rejected", "reason": "truncated",
                            "detail": "x"}) + "\n")
    assert _problems(damaged, decode=False) == [
        "errors.jsonl line 8: 'dog/dog_1.jpg' is reported as rejected but is also in the dataset"]


def test_the_job_refuses_to_write_dataset_info_when_files_are_unaccounted_for(tmp_path):
    """The in-job invariant: no image_tfrecords.json unless found = written + rejected + skipped."""
    fn = _WriteInfo(str(tmp_path), "run-1", ["cat", "dog"], "default", {"compression": "none"}, {}, 0.0, "test")
    tallies = [(("written", "train", 0, False), 2), (("written", "train", 1, False), 1),
               (("rejected", "truncated"), 1), (("skipped", "hidden_file"), 1)]
    shards = [ShardInfo("train", "train-00000-of-00001.tfrecord", 3, 100)]
    rejections = [Rejection("cat/bad.jpg", "rejected", "truncated", "cut off"),
                  Rejection("cat/.hidden.jpg", "skipped", "hidden_file", "")]
    with pytest.raises(DatasetIncomplete, match="accounting mismatch: 6 files found but 3 written"):
        list(fn.process(None, [*tallies, (("found",), 6)], shards, rejections))
    assert not (tmp_path / "image_tfrecords.json").exists()
    short = [ShardInfo("train", "train-00000-of-00001.tfrecord", 2, 100)]
    with pytest.raises(DatasetIncomplete, match="the shards hold 2 records but 3 images were converted"):
        list(fn.process(None, [*tallies, (("found",), 5)], short, rejections))
    assert not (tmp_path / "image_tfrecords.json").exists()
    # The run's finished shard waits in its temporary folder; publishing moves it into place.
    written = tmp_path / ".image-tfrecords-tmp" / "run-1" / "shards" / "train-00000-of-00001.tfrecord"
    written.parent.mkdir(parents=True)
    written.write_bytes(b"x" * 100)
    (info,) = fn.process(None, [*tallies, (("found",), 5)], shards, iter(rejections))
    assert (tmp_path / "train-00000-of-00001.tfrecord").read_bytes() == b"x" * 100
    assert not (tmp_path / ".image-tfrecords-tmp").exists()
    errors = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert [(e["relpath"], e["stage"], e["reason"]) for e in errors] == [
        ("cat/bad.jpg", "rejected", "truncated"), ("cat/.hidden.jpg", "skipped", "hidden_file")]
    assert info["files"] == {"found": 5, "written": 3, "rejected": 1, "skipped": 1, "upscaled": 0}
    assert (tmp_path / "image_tfrecords.json").exists()
    # Dataflow retries a bundle that failed after it had published: the retry finds the dataset complete.
    (again,) = fn.process(None, [*tallies, (("found",), 5)], shards, iter(rejections))
    assert again == info
    assert (tmp_path / "train-00000-of-00001.tfrecord").read_bytes() == b"x" * 100


# --- crafted datasets: labels, images, duplicates ---------------------------------------------------------------


def test_a_crafted_sound_dataset_passes(tmp_path):
    root = craft_dataset(tmp_path / "ds", {
        "train": [[rec(0, "cat/a.jpg", (1, 2, 3)), rec(1, "dog/b.jpg", (200, 2, 3))],
                  [rec(2, "fox/c.jpg", (1, 200, 3))]],
        "validation": [[rec(0, "cat/d.jpg", (1, 2, 200))]],
    })
    report = verify.verify_dataset(str(root))
    assert report.problems == [] and report.warnings == []
    assert report.split_records == {"train": 3, "validation": 1}


def test_an_out_of_range_label_is_caught(tmp_path):
    root = craft_dataset(tmp_path / "ds", {"train": [[
        rec(0, "cat/a.jpg", (1, 2, 3)), rec(3, "cat/b.jpg", (9, 9, 9), class_name="cat"),
        rec(-1, "dog/c.jpg", (50, 9, 9), class_name="dog")]]})
    problems = _problems(root)
    assert ("train-00000-of-00001.tfrecord record 1: label 3 is out of range: labels.txt has 3 classes "
            "(ids 0..2)") in problems
    assert ("train-00000-of-00001.tfrecord record 2: label -1 is out of range: labels.txt has 3 classes "
            "(ids 0..2)") in problems


def test_a_class_name_that_disagrees_with_labels_txt_is_caught(tmp_path):
    root = craft_dataset(tmp_path / "ds", {"train": [[rec(0, "cat/a.jpg"), rec(1, "dog/b.jpg", (90, 9, 9),
                                                                                class_name="cat")]]})
    problems = _problems(root)
    assert ("train-00000-of-00001.tfrecord record 1: class_name 'cat' does not match label 1, which is 'dog' in "
            "labels.txt") in problems


def test_labels_txt_that_disagrees_with_dataset_info_is_caught(damaged):
    (damaged / "labels.txt").write_text("cat\nfox\ndog\n")
    problems = _problems(damaged, decode=False)
    assert problems[0] == "labels.txt: 3 classes, but image_tfrecords.json lists 3; they differ first at id 1"


def test_an_image_that_does_not_decode_is_caught_and_no_decode_skips_it(tmp_path):
    broken = jpeg((1, 2, 3))[:-60]
    root = craft_dataset(tmp_path / "ds", {"train": [[rec(0, "cat/a.jpg"), rec(1, "dog/b.jpg", image=broken)]]})
    problems = _problems(root)
    assert len(problems) == 1
    assert problems[0].startswith("train-00000-of-00001.tfrecord record 1: the image cannot be decoded: ")
    assert _problems(root, decode=False) == []


def test_a_source_path_written_twice_is_caught(tmp_path):
    root = craft_dataset(tmp_path / "ds", {
        "train": [[rec(0, "cat/a.jpg", (1, 2, 3))], [rec(1, "dog/b.jpg", (90, 2, 3))]],
        "validation": [[rec(0, "cat/a.jpg", (1, 2, 90))]],
    })
    assert _problems(root) == [
        "validation-00000-of-00001.tfrecord record 0: source path 'cat/a.jpg' is written twice (also in "
        "train-00000-of-00002.tfrecord record 0)"]


def test_gzip_shards_are_read_and_a_damaged_one_is_caught(tmp_path):
    root = craft_dataset(tmp_path / "ds", {"train": [[rec(0, "cat/a.jpg", (1, 2, 3)), rec(1, "dog/b.jpg")]]},
                         compression="gzip")
    assert _problems(root) == []
    shard = root / "train-00000-of-00001.tfrecord.gz"
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    shard.write_bytes(bytes(blob))
    problems = _problems(root)
    assert problems and all(p.startswith("train-00000-of-00001.tfrecord.gz") for p in problems)


# --- leakage between splits -----------------------------------------------------------------------------------


def _name_in_split(folder: str, stem: str, extension: str, split: str) -> str:
    """A file name in `folder` that the default split hash (seed 42, 20% validation) puts in `split`."""
    for i in range(1000):
        relpath = f"{folder}/{stem}_{i}.{extension}"
        if hash_split(relpath, 42, 0.2, 0.0) == split:
            return relpath
    raise AssertionError("no name found")


def test_the_same_picture_from_two_different_files_is_a_warning_not_a_duplicate(tmp_path):
    """Two copies of one photo, one with a text chunk: equal pixels, but not identical files, which is what the
    converter counts as duplicates; verify says so apart, as a warning."""
    source = tmp_path / "in"
    for c, name in enumerate(("cat", "dog")):
        (source / name).mkdir(parents=True)
        for i in range(6):
            Image.new("RGB", (30, 20), (40 * c, 30 * i, 90)).save(source / name / f"{name}_{i}.jpg", quality=90)
    photo = Image.new("RGB", (40, 30), (200, 100, 50))
    photo.paste((10, 10, 10), (5, 5, 20, 20))
    photo.save(source / _name_in_split("cat", "photo", "png", "train"))
    note = PngImagePlugin.PngInfo()
    note.add_text("Comment", "a copy")
    photo.save(source / _name_in_split("cat", "copy", "png", "validation"), pnginfo=note)  # other bytes, same pixels
    assert convert(source, tmp_path / "out", "--image_size=32") == 0
    report = verify.verify_dataset(str(tmp_path / "out"))
    assert report.ok, report.problems
    assert report.warnings == ["1 stored images are equal pixel for pixel to another's from a different source "
                               "file (a picture saved twice, e.g. with other metadata); the duplicates above count "
                               "identical files only"]


def test_the_same_image_twice_in_one_split_is_only_a_warning(tmp_path):
    root = craft_dataset(tmp_path / "ds", {"train": [[rec(0, "cat/a.jpg", (1, 2, 3)), rec(0, "cat/b.jpg",
                                                                                            (1, 2, 3))]]})
    report = verify.verify_dataset(str(root))
    assert report.ok
    assert report.warnings == [
        "Duplicates: 1 groups of identical source files (2 files): 1 within a split, 0 across splits (leakage), "
        "0 with different labels (conflict); --fail_on_duplicates makes leakage and conflicts fail verify",
        "identical source files within a split: 'cat/a.jpg' (train, cat), 'cat/b.jpg' (train, cat)"]


def _copies_dataset(tmp_path):
    return craft_dataset(tmp_path / "ds", {
        "train": [[rec(0, "cat/a.jpg", (1, 2, 3)), rec(1, "dog/b.jpg", (1, 2, 3)), rec(1, "dog/c.jpg", (9, 9, 200))]],
        "validation": [[rec(0, "cat/d.jpg", (9, 9, 200)), rec(1, "dog/e.jpg", (200, 9, 9))]],
        "test": [[rec(1, "dog/f.jpg", (200, 9, 9))]],
    })


def test_copies_are_counted_in_three_kinds_and_named_as_the_converter_names_them(tmp_path):
    """Issue 18: identical files filed as rose and as tulip; verify said only 'leakage between splits'. Issue 30:
    the kinds are the converter's (a conflict is a conflict wherever its copies are), and only warnings."""
    report = verify.verify_dataset(str(_copies_dataset(tmp_path)))
    assert report.ok
    assert report.warnings == [
        "Duplicates: 3 groups of identical source files (6 files): 0 within a split, 1 across splits (leakage), "
        "2 with different labels (conflict); --fail_on_duplicates makes leakage and conflicts fail verify",
        "identical source files with different labels (conflict): 'cat/a.jpg' (train, cat), 'dog/b.jpg' (train, "
        "dog)",
        "identical source files with different labels (conflict): 'cat/d.jpg' (validation, cat), 'dog/c.jpg' "
        "(train, dog)",
        "identical source files across splits (leakage): 'dog/e.jpg' (validation, dog), 'dog/f.jpg' (test, dog)",
    ]
    failing = verify.verify_dataset(str(tmp_path / "ds"), fail_on_duplicates=True)
    assert not failing.ok and failing.warnings == []
    assert failing.problems[0].startswith("Duplicates: 3 groups of identical source files (6 files): 0 within a "
                                          "split, 1 across splits (leakage), 2 with different labels (conflict)")
    assert len(failing.problems) == 4


def test_verify_and_the_converter_report_the_same_duplicates(tmp_path, capsys):
    """Issue 30: on a flowers-like folder (files stored under both rose and tulip) the run said '0 across splits'
    and verify reported leakage and failed. Now both count by the source files' SHA-256, in the same words."""
    source = tmp_path / "in"
    for c, name in enumerate(("rose", "tulip")):
        (source / name).mkdir(parents=True)
        for i in range(8):
            Image.new("RGB", (30, 20), (90 * c, 25 * i, 60)).save(source / name / f"{name}_{i}.jpg", quality=90)
    for i in range(4):  # the same files under both classes, in whatever splits their paths hash to
        (source / "tulip" / f"copy_{i}.jpg").write_bytes((source / "rose" / f"rose_{i}.jpg").read_bytes())
    (source / "rose" / "again.jpg").write_bytes((source / "rose" / "rose_5.jpg").read_bytes())
    out = tmp_path / "out"
    assert convert(source, out, "--image_size=16", "--validation_split=0.5") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    from pipeline.report import duplicates_line

    converter = duplicates_line(info)
    assert converter.startswith("Duplicates: 5 groups of identical source files (10 files): ")
    assert "4 with different labels (conflict)" in converter
    report = verify.verify_dataset(str(out))
    assert report.ok, report.problems
    assert report.warnings[0].startswith(converter.split(";")[0] + ";")  # the same counts, the same words
    assert main_of(verify.run, [str(out)]) == 0
    assert main_of(verify.run, [str(out), "--fail_on_duplicates"]) == 1
    assert converter.split(";")[0] in capsys.readouterr().out
    info["duplicates"]["conflicting_labels"] = 3  # a description that disagrees with its records is damage
    info["duplicates"]["within_split"] += 1
    (out / "image_tfrecords.json").write_text(json.dumps(info))
    problems = verify.verify_dataset(str(out)).problems
    assert len(problems) == 1 and problems[0].startswith("image_tfrecords.json: its duplicates say Duplicates: 5 ")


def test_a_record_length_no_example_can_have_is_caught_without_reading_it(tmp_path):
    root = craft_dataset(tmp_path / "ds", {"train": [[rec(0, "cat/a.jpg"), rec(1, "dog/b.jpg", (90, 9, 9))]]})
    shard = root / "train-00000-of-00001.tfrecord"
    header = struct.pack("<Q", 1 << 40)  # a terabyte, with a valid checksum
    with open(shard, "ab") as f:
        f.write(header + struct.pack("<I", masked_crc(header)))
    info = _info(root)
    info["splits"]["train"]["shards"][0]["bytes"] = shard.stat().st_size
    save_info(root, info)
    assert _problems(root) == [
        "train-00000-of-00001.tfrecord: record 2: a length of 1099511627776 bytes is impossible for an Example"]


def test_a_dataset_info_not_written_by_the_tool_is_refused(damaged, capsys):
    info = _info(damaged)
    del info["splits"]
    save_info(damaged, info)
    assert main_of(verify.run, [str(damaged)]) == 2
    assert capsys.readouterr().err == (f"error: {damaged}/image_tfrecords.json lacks splits: it was not written by "
                                       "this tool; convert again\n")


def test_a_re_serialised_or_crlf_features_json_still_verifies(damaged):
    """TFDS reads features.json as JSON: other indentation, key order or CRLF line ends say the same thing."""
    path = damaged / "features.json"
    features = json.loads(path.read_text())
    path.write_bytes(json.dumps(features, indent=4, sort_keys=True).replace("\n", "\r\n").encode())
    assert _problems(damaged, decode=False) == []
    path.write_text(json.dumps(features, separators=(",", ":")))
    assert _problems(damaged, decode=False) == []
    features["featuresDict"]["features"]["image"]["pythonClassName"] = "something.Else"
    path.write_text(json.dumps(features))
    assert _problems(damaged, decode=False) == [
        "features.json: TFDS's features differ from the keys and image size in image_tfrecords.json; "
        "tfds.builder_from_directory would not load the folder as it is; convert again"]


# --- the sources files: what an append reads to know which images the dataset holds -----------------------------


def _sources_file(path):
    """The dataset's sources file of the most lines, and its lines (JSON lists)."""
    names = _info(path)["sources"]["files"]
    largest = max((path / name for name in names), key=lambda p: len(p.read_text().splitlines()))
    return largest, [json.loads(line) for line in largest.read_text().splitlines()]


def _write_lines(path, lines) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_missing_sources_file_is_caught(damaged):
    path, _ = _sources_file(damaged)
    path.unlink()
    problems = _problems(damaged, decode=False)
    assert f"{path.name}: missing, but image_tfrecords.json lists it among the sources files; an append would " \
           "write images it holds a second time; convert again with --if_exists=overwrite" in problems
    assert any(p.startswith("sources files: they list ") for p in problems)


def test_sources_lines_cut_at_a_newline_are_caught(damaged):
    path, lines = _sources_file(damaged)
    _write_lines(path, lines[:-2])
    problems = _problems(damaged, decode=False)
    split = lines[-1][2]
    assert any(p.startswith("sources files: they list ") and f"of split {split!r}" in p for p in problems)
    assert sum(f"source path {lines[-1][0]!r} is in no sources file" in p for p in problems) == 1


def test_a_sources_line_of_another_path_or_hash_is_caught(damaged):
    """A hand-edited sources line (or a run that listed a wrong one): verify names the record and the line."""
    path, lines = _sources_file(damaged)
    moved, rehashed = lines[0][0], lines[1][0]
    lines[0][0] = moved.rsplit("/", 1)[0] + "/NOT-THIS-FILE.jpg"
    lines[1][1] = "0" * 64
    _write_lines(path, lines)
    problems = _problems(damaged, decode=False)
    assert sum(f"source path {moved!r} is in no sources file" in p for p in problems) == 1
    assert any("NOT-THIS-FILE.jpg' is listed, but no record has that source path" in p for p in problems)
    assert sum(f"the sources files give {rehashed!r} SHA-256 {'0' * 64}" in p for p in problems) == 1
    assert main_of(verify.run, [str(damaged), "--no_decode"]) == 1


# --- what a record holds under a valid checksum (issue 47, finding 15) -------------------------------------------


def _noisy_jpeg(seed: int = 0) -> bytes:
    """A 64 x 64 JPEG of noise: its entropy-coded data is long enough to damage in the middle."""
    import io

    import numpy as np

    out = io.BytesIO()
    pixels = (np.random.default_rng(seed).random((8, 8, 3)) * 255).astype("uint8")
    Image.fromarray(pixels).resize((64, 64)).save(out, "JPEG", quality=90)
    return out.getvalue()


def _damaged_scan(data: bytes) -> bytes:
    """`data` with 30 bytes in the middle of its scan changed (never into or after a 0xFF: no marker is made)."""
    damaged = bytearray(data)
    start = (damaged.find(b"\xff\xda") + len(damaged)) // 2
    for k in range(start, start + 30):
        if damaged[k] != 0xFF and damaged[k - 1] != 0xFF and damaged[k] ^ 0x55 != 0xFF:
            damaged[k] ^= 0x55
    return bytes(damaged)


def test_a_jpeg_whose_data_is_damaged_under_a_valid_checksum_is_caught(tmp_path):
    """TensorFlow's decoder takes the damaged scan with a warning on stderr; verify names the record. --no_decode
    does not decode it."""
    import tensorflow as tf

    damaged = _damaged_scan(_noisy_jpeg(1))  # damage that libjpeg notices (about 2 in 3 such damages are)
    assert tf.io.decode_jpeg(damaged).shape == (64, 64, 3)  # what a training job would read, silently
    root = craft_dataset(tmp_path / "ds", {"train": [[
        dict(rec(0, "cat/a.jpg"), image=_noisy_jpeg(2), height=64, width=64),
        dict(rec(1, "dog/b.jpg"), image=damaged, height=64, width=64)]]})
    info = _info(root)
    info["image"].update(height=64, width=64)
    save_info(root, info)
    problems = _problems(root)
    assert len(problems) == 1, problems
    assert problems[0].startswith("train-00000-of-00001.tfrecord record 1: the image's JPEG data is damaged "
                                  "(libjpeg: Corrupt JPEG data")
    assert problems[0].endswith("TensorFlow decodes it with a warning, into damaged pixels; convert again")
    assert _problems(root, decode=False) == []


def _rewrite_record(shard, number: int, change) -> None:
    """Record `number` of the TFRecord file `shard` changed by `change(feature map)`, framed with a valid CRC."""
    from tests.hostile_records import frame
    from transforms.base.examples import Example

    spans = _record_spans(shard)
    blob = shard.read_bytes()
    records = [blob[offset:offset + length] for offset, length in spans]
    example = Example.FromString(records[number])
    change(example.features.feature)
    records[number] = example.SerializeToString()
    shard.write_bytes(b"".join(frame(r) for r in records))


def test_a_record_whose_sha256_was_rewritten_is_caught_against_the_sources_files(damaged):
    """The record's sha256 must be the one the dataset's sources files list for its path (what an append trusts);
    a rewritten one, of the same length, keeps every size and count."""
    shard = damaged / _info(damaged)["splits"]["train"]["shards"][0]["file"]
    size = shard.stat().st_size
    _rewrite_record(shard, 1, lambda f: f["sha256"].bytes_list.value.__setitem__(0, b"0" * 64))
    assert shard.stat().st_size == size
    problems = _problems(damaged, decode=False)
    assert len(problems) == 1, problems
    assert re.fullmatch(rf"{shard.name} record 1: the sources files give '[^']+' SHA-256 [0-9a-f]{{64}}, the record "
                        rf"{'0' * 64}; an append would write images it holds a second time; convert again with "
                        r"--if_exists=overwrite", problems[0]), problems[0]
    assert _problems(damaged) == problems


def test_a_sound_conversion_has_each_records_sha256_in_its_sources_files(mixed):
    assert _problems(mixed[0], decode=False) == []


# --- the reader helper checks what it reads -----------------------------------------------------------------------


def _read_all(root, **kwargs) -> list:
    from pipeline import reader

    return list(reader.make_dataset(str(root), "train", batch_size=None, **kwargs).as_numpy_iterator())


def _three_records(tmp_path, labels=(0, 1, 2)):
    return craft_dataset(tmp_path / "ds", {"train": [
        [rec(labels[0], "cat/a.jpg", (1, 2, 3)), rec(labels[1], "dog/b.jpg", (200, 2, 3), class_name="dog")],
        [rec(labels[2], "fox/c.jpg", (1, 200, 3), class_name="fox")]]})


def test_the_reader_refuses_a_shard_cut_between_records_or_with_one_more(tmp_path):
    """A shard of another size than image_tfrecords.json gives is refused before anything is read, named."""
    import tensorflow as tf

    from pipeline.errors import DatasetError

    root = _three_records(tmp_path)
    assert len(_read_all(root)) == 3
    shard = root / "train-00000-of-00002.tfrecord"
    sound = shard.read_bytes()
    (offset, length), _ = _record_spans(shard)
    shard.write_bytes(sound[:offset + length + 4])  # the first record only: cut between records
    with pytest.raises(DatasetError, match=r"^train-00000-of-00002\.tfrecord: \d+ bytes, but image_tfrecords\.json "
                                           r"says \d+: the shard was changed or cut short"):
        _read_all(root)
    # The description's bytes changed too (or the shard changed in between): the records are counted as read.
    info = _info(root)
    info["splits"]["train"]["shards"][0]["bytes"] = shard.stat().st_size
    save_info(root, info)
    with pytest.raises(tf.errors.FailedPreconditionError, match="expected to contain 3 elements but contained only 2"):
        _read_all(root)
    shard.write_bytes(sound + sound[:offset + length + 4])  # one record more
    info["splits"]["train"]["shards"][0]["bytes"] = shard.stat().st_size
    save_info(root, info)
    with pytest.raises(tf.errors.FailedPreconditionError, match="expected to contain 3 elements"):
        _read_all(root)


def test_the_reader_refuses_a_label_out_of_range_instead_of_an_all_zero_one_hot(tmp_path):
    import tensorflow as tf

    root = _three_records(tmp_path, labels=(0, 7, 2))
    for one_hot in (True, False):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices = 7 is not in \[0, 3\)[\s\S]*"
                                                                 "label_out_of_range_of_the_classes_in_image_tfrecords"):
            _read_all(root, supervised=True, one_hot=one_hot)
    labels = sorted(int(label.argmax()) for _, label in _read_all(_three_records(tmp_path / "good"),
                                                                     supervised=True, one_hot=True))
    assert labels == [0, 1, 2]
