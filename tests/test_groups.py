"""Group-safe splits (--group_by): every image of a group in one split; unmatched paths; reached shares."""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest
from PIL import Image

from pipeline.errors import UserError
from pipeline.report import format_summary
from tests.conftest import convert, main_in_process
from transforms.base.examples import Example
from transforms.base.tfrecord import iter_records
from transforms.labels.layout import GROUP_BY_TIMEOUT, GroupByTimeout, compile_group_by, group_of, hash_split, place

PATIENT = r"^[^/]+/(patient\d+)_"


def _splits_of(out) -> dict[str, str]:
    """relpath -> split of every record."""
    info = json.loads((out / "image_tfrecords.json").read_text())
    where = {}
    for split, split_info in info["splits"].items():
        for shard in split_info["shards"]:
            for raw in iter_records(str(out / shard["file"])):
                where[Example.FromString(raw).features.feature["source_path"].bytes_list.value[0].decode()] = split
    return where


def test_the_group_is_the_first_capture_group_or_the_whole_match():
    assert group_of("xray/patient042_1.png", compile_group_by(PATIENT)) == "patient042"
    assert group_of("xray/patient042_1.png", compile_group_by(r"patient\d+")) == "patient042"
    assert group_of("xray/notes_1.png", compile_group_by(PATIENT)) == ""  # not found: no group
    assert group_of("xray/x_1.png", compile_group_by(r"(patient)?x")) == ""  # the group took no part: no group
    assert group_of("xray/x_1.png", None) == ""


def test_images_of_a_group_share_a_split_and_the_shares_follow_the_asked_ones_over_many_groups():
    pattern = compile_group_by(PATIENT)
    split_of_group = defaultdict(set)
    spans_without = 0
    for g in range(3000):
        paths = [f"{cls}/patient{g:04d}_{k}.png" for cls in ("benign", "malign") for k in range(3)]
        for path in paths:
            placed = place(path, split_folders=False, seed=7, validation_split=0.2, test_split=0.1, group_by=pattern)
            assert placed.group == f"patient{g:04d}"
            split_of_group[placed.group].add(placed.split)
        spans_without += len({hash_split(p, 7, 0.2, 0.1) for p in paths}) > 1
    assert all(len(splits) == 1 for splits in split_of_group.values())
    assert spans_without > 1000  # by path, most groups of six would be spread over the splits
    shares = {s: sum(splits == {s} for splits in split_of_group.values()) / 3000 for s in ("train", "validation",
                                                                                           "test")}
    assert shares["validation"] == pytest.approx(0.2, abs=0.025)
    assert shares["test"] == pytest.approx(0.1, abs=0.02)
    assert shares["train"] == pytest.approx(0.7, abs=0.03)


def test_a_path_without_a_group_keeps_the_split_of_its_own_path():
    pattern = compile_group_by(PATIENT)
    for i in range(200):
        path = f"benign/scan_{i}.png"
        placed = place(path, split_folders=False, seed=42, validation_split=0.3, test_split=0.0, group_by=pattern)
        assert placed.group == "" and placed.split == hash_split(path, 42, 0.3, 0.0)


def _tree(root, groups=24, unmatched=("benign/scan_a.png", "malign/scan_b.png")):
    paths = [f"{cls}/patient{g:02d}_{k}.png" for g in range(groups) for cls in ("benign", "malign") for k in range(2)]
    for n, path in enumerate([*paths, *unmatched]):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (n % 256, n // 256, 77)).save(root / path)
    return paths


def test_conversion_keeps_every_group_in_one_split_and_reports_groups_and_shares(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    paths = _tree(src)
    assert convert(src, out, f"--group_by={PATIENT}", "--validation_split=0.3", "--image_size=8") == 0
    where = _splits_of(out)
    assert len(where) == len(paths) + 2
    by_group = defaultdict(set)
    for path in paths:
        by_group[path.split("/")[1].split("_")[0]].add(where[path])
    assert all(len(s) == 1 for s in by_group.values()), by_group
    assert {next(iter(s)) for s in by_group.values()} == {"train", "validation"}
    for path in ("benign/scan_a.png", "malign/scan_b.png"):  # its own group: the split of its path
        assert where[path] == hash_split(path, 42, 0.3, 0.0)
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["split_by"] == "group_hash" and info["options"]["group_by"] == PATIENT
    assert info["groups"] == {"groups": 24, "grouped_images": 96, "ungrouped_images": 2,
                              "ungrouped_examples": ["benign/scan_a.png", "malign/scan_b.png"],
                              "groups_in_several_splits": 0, "several_splits_examples": []}
    text = format_summary(info)
    validation = sum(split == "validation" for split in where.values()) / len(where)
    assert (f"Split shares of the images written: train {100 * (1 - validation):.1f} % (asked 70 %), "
            f"validation {100 * validation:.1f} % (asked 30 %).") in text
    assert f"Groups (--group_by={PATIENT}): 24 groups of 96 images." in text
    assert ("2 images matched no group and are each their own group (e.g. 'benign/scan_a.png', "
            "'malign/scan_b.png')") in text


def test_with_split_folders_groups_in_two_splits_are_reported_as_leakage(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    for n, path in enumerate(["train/a/patient1_0.png", "validation/a/patient1_1.png", "train/b/patient2_0.png",
                              "train/a/patient2_1.png", "validation/b/patient3_0.png"]):
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (n * 40, 9, 9)).save(src / path)
    assert convert(src, out, r"--group_by=/(patient\d+)_", "--image_size=8") == 0
    where = _splits_of(out)
    assert where == {"train/a/patient1_0.png": "train", "validation/a/patient1_1.png": "validation",
                     "train/b/patient2_0.png": "train", "train/a/patient2_1.png": "train",
                     "validation/b/patient3_0.png": "validation"}  # the folders' splits, untouched
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["split_by"] == "split_folders"
    assert info["groups"]["groups"] == 3 and info["groups"]["groups_in_several_splits"] == 1
    assert info["groups"]["several_splits_examples"] == [{"group": "patient1", "images": {"train": 1,
                                                                                           "validation": 1}}]
    text = format_summary(info)
    assert ("Groups with images in more than one split folder (leakage): 1, e.g. 'patient1' (train 1, validation 1)"
            in text)
    assert "Split shares" not in text  # the folders made the splits


def test_without_group_by_the_summary_gives_the_reached_shares_too(sample_output):
    info = json.loads((sample_output / "image_tfrecords.json").read_text())
    assert info["split_by"] == "path_hash" and "groups" not in info
    line = next(line for line in format_summary(info).splitlines() if line.startswith("Split shares"))
    assert re.fullmatch(r"Split shares of the images written: train \d+\.\d % \(asked 80 %\), "
                        r"validation \d+\.\d % \(asked 20 %\)\.", line)


def test_a_bad_regex_is_one_line_naming_the_flag(tmp_path, capsys):
    (tmp_path / "in" / "a").mkdir(parents=True)
    with pytest.raises(UserError, match=r"^--group_by='\(patient' is not a regular expression \(missing \)"):
        convert(tmp_path / "in", tmp_path / "out", "--group_by=(patient")
    code, stderr = main_in_process(capsys, f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}",
                                   "--group_by=[a-")
    assert code != 0
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --group_by='[a-' is not a regular expression"), lines
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(300)
def test_names_that_are_not_utf8_are_grouped_reported_and_deduplicated(tmp_path):
    """A file name that is not UTF-8 (its bytes as surrogates in Python) in the group and duplicate reports, and
    in the hashing pass of --duplicates=drop: shown as \\xNN, and the run does not fail on it."""
    import os

    src, out = tmp_path / "in", tmp_path / "out"
    _tree(src, groups=4, unmatched=())
    data = (src / "benign" / "patient00_0.png").read_bytes()
    for name in (b"benign/patient\xe9_0.png", b"malign/caf\xe9.png"):
        with open(os.path.join(os.fsencode(src), name), "wb") as f:
            f.write(data)  # byte-identical to benign/patient00_0.png
    assert convert(src, out, r"--group_by=/(patient[^_]+)_", "--image_size=8", "--duplicates=drop") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["groups"]["groups"] == 5 and info["groups"]["ungrouped_examples"] == ["malign/caf\\xe9.png"]
    assert info["duplicates"]["groups"] == 1 and info["duplicates"]["conflicting_labels"] == 1
    errors = {e["relpath"]: e["reason"] for e in map(json.loads, (out / "errors.jsonl").read_text().splitlines())}
    assert errors == {"benign/patient00_0.png": "duplicate_conflict", "benign/patient\\xe9_0.png": "duplicate_conflict",
                      "malign/caf\\xe9.png": "duplicate_conflict"}


# --- a --group_by that backtracks: a time limit per path, and a rejection --------------------------------------------

BACKTRACKS = r"(a|aa)+$"  # tries every split of a run of a's into ones and twos: 10**12 ways for 60 a's
HOSTILE_NAME = "a" * 60 + "1!.jpg"


def test_a_match_that_backtracks_is_stopped_and_the_path_rejected():
    with pytest.raises(GroupByTimeout, match=r"found no answer on this path within 1 s: the pattern backtracks"):
        group_of(f"cls/{HOSTILE_NAME}", compile_group_by(BACKTRACKS))
    placed = place(f"cls/{HOSTILE_NAME}", split_folders=False, seed=42, validation_split=0.2, test_split=0.0,
                   group_by=compile_group_by(BACKTRACKS))
    assert placed[0] == GROUP_BY_TIMEOUT and "simplify it" in placed[1]
    # The ((a+)+)$ is no trouble for the engine: it finds no group, at once.
    assert group_of(f"cls/{HOSTILE_NAME}", compile_group_by(r"((a+)+)$")) == ""


def _hostile_tree(root) -> None:
    for n, path in enumerate(("cls/ok_1.png", "cls/ok_2.png", f"cls/{HOSTILE_NAME}", f"other/b{HOSTILE_NAME}")):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (n, 0, 0)).save(root / path, format="PNG")


def _errors(out) -> dict:
    return {e["relpath"]: e for e in map(json.loads, (out / "errors.jsonl").read_text().splitlines())}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("source", ["folders", "manifest"])
def test_a_backtracking_group_by_rejects_those_images_and_the_job_ends(tmp_path, source):
    src, out = tmp_path / "in", tmp_path / "out"
    _hostile_tree(src)
    if source == "folders":
        code = convert(src, out, f"--group_by={BACKTRACKS}", "--image_size=8")
    else:
        from pipeline.launcher import run
        from tests.conftest import FAST

        rows = ["path,label", *(f"{p.relative_to(src)},{p.parent.name}" for p in sorted(src.rglob("*.*")))]
        (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
        code = run([f"--manifest={tmp_path / 'list.csv'}", f"--input_dir={src}", f"--output_dir={out}", "--quiet",
                    f"--group_by={BACKTRACKS}", "--image_size=8", *FAST])
    assert code == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["files"]["found"] == 4 and info["files"]["written"] == 2 and info["files"]["rejected"] == 2
    assert info["rejected_by_reason"] == {GROUP_BY_TIMEOUT: 2}
    errors = _errors(out)
    assert set(errors) == {f"cls/{HOSTILE_NAME}", f"other/b{HOSTILE_NAME}"}
    for entry in errors.values():
        assert entry["stage"] == "rejected" and entry["reason"] == GROUP_BY_TIMEOUT
        assert f"--group_by='{BACKTRACKS}' found no answer on this path within 1 s" in entry["detail"]
    assert set(_splits_of(out)) == {"cls/ok_1.png", "cls/ok_2.png"}
