"""Class names that are all integers take ids in numeric order (1 -> 0, ..., 10 -> 9), not text order (where
"10" got id 1), for class folders and manifests alike, with a note; "01" beside "1" keeps text order and says
why; --labels_file still wins, and an append keeps the ids of the dataset it grows (issue 48)."""

from __future__ import annotations

import csv
import json

import pytest

from tests.conftest import FAST, run_tool
from tests.datasets import convert_manifest, read_records, write_tiny_tree
from transforms.inputs.manifest import class_names_of
from transforms.labels.layout import class_order, class_order_note

ONE_TO_TEN = [str(i) for i in range(1, 11)]


def _info(out) -> dict:
    return json.loads((out / "image_tfrecords.json").read_text())


def _labels(out) -> dict[str, set[int]]:
    """class name -> the label ids its records hold, every record read back."""
    found: dict[str, set[int]] = {}
    for rows in read_records(out).values():
        for row in rows:
            found.setdefault(row["class_name"], set()).add(row["label"])
    return found


def test_class_order():
    assert class_order(["10", "2", "1", "9"]) == ["1", "2", "9", "10"]
    assert class_order(["-1", "10", "0", "2"]) == ["-1", "0", "2", "10"]
    assert class_order(["b", "a", "10", "2"]) == ["10", "2", "a", "b"]  # not all integers: text order
    assert class_order(["1", "01", "2", "10"]) == ["01", "1", "10", "2"]  # the same number twice: text order
    assert class_order(["١", "2"]) == ["2", "١"]  # digits of other scripts are not integers here
    assert class_names_of([(name, 1) for name in ONE_TO_TEN[::-1]]) == ONE_TO_TEN


def test_class_order_note():
    assert class_order_note(ONE_TO_TEN) == (
        "class names are all integers: ids follow their numeric order, 1 -> 0, 2 -> 1, 3 -> 2, ..., 10 -> 9 (not "
        "their text order, where 10 comes before 2); give --labels_file for another order")
    assert class_order_note(["0", "1", "2"]) is None  # the same in both orders: nothing to say
    assert class_order_note(["cat", "dog"]) is None
    assert class_order_note(["1", "01", "2"]) == (
        "class names are all integers, but '01' and '1' are the same number: ids follow their text order (01 -> 0, "
        "1 -> 1, 2 -> 2, ...); rename one of them, or give --labels_file for the order you want")


def test_class_folders_1_to_10_take_ids_in_numeric_order(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    write_tiny_tree(src, dict.fromkeys(ONE_TO_TEN, 2))
    result = run_tool("pipeline.main", f"--input_dir={src}", f"--output_dir={out}", "--image_size=16", *FAST)
    assert result.returncode == 0, result.stderr
    assert "class names are all integers: ids follow their numeric order, 1 -> 0" in result.stderr
    assert (out / "labels.txt").read_text().splitlines() == ONE_TO_TEN
    assert _info(out)["class_names"] == ONE_TO_TEN
    labels = _labels(out)
    assert labels["10"] == {9} and labels["2"] == {1}  # record by record
    assert labels == {name: {int(name) - 1} for name in ONE_TO_TEN}


def _manifest(path, rows, header=("path", "label")) -> None:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])


def test_a_manifests_integer_labels_take_ids_in_numeric_order_and_the_summary_says_so(tmp_path):
    data = tmp_path / "data"
    paths = write_tiny_tree(data, dict.fromkeys(ONE_TO_TEN, 2))
    _manifest(data / "m.csv", [(p, p.split("/")[0]) for p in paths])
    out = tmp_path / "out"
    result = run_tool("pipeline.main", f"--manifest={data / 'm.csv'}", f"--output_dir={out}", "--image_size=16",
                      "--quiet", *FAST)
    assert result.returncode == 0, result.stderr
    assert (out / "labels.txt").read_text().splitlines() == ONE_TO_TEN
    assert _labels(out) == {name: {int(name) - 1} for name in ONE_TO_TEN}
    assert ("Class ids: class names are all integers: ids follow their numeric order, 1 -> 0, 2 -> 1, 3 -> 2, ..., "
            "10 -> 9") in result.stdout


def test_01_and_1_stay_two_classes_in_text_order_with_a_note(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    write_tiny_tree(src, {"01": 2, "1": 3, "2": 1, "10": 1})
    result = run_tool("pipeline.main", f"--input_dir={src}", f"--output_dir={out}", "--image_size=16", *FAST)
    assert result.returncode == 0, result.stderr
    assert "'01' and '1' are the same number: ids follow their text order" in result.stderr
    assert (out / "labels.txt").read_text().splitlines() == ["01", "1", "10", "2"]
    counts = {name: 0 for name in ("01", "1", "10", "2")}
    for rows in read_records(out).values():
        for row in rows:
            counts[row["class_name"]] += 1
            assert row["label"] == ["01", "1", "10", "2"].index(row["class_name"])
    assert counts == {"01": 2, "1": 3, "10": 1, "2": 1}


def test_a_labels_file_still_decides_the_ids(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    write_tiny_tree(src, dict.fromkeys(["1", "2", "10"], 1))
    (tmp_path / "labels.txt").write_text("10\n2\n1\n")
    result = run_tool("pipeline.main", f"--input_dir={src}", f"--output_dir={out}", "--image_size=16",
                      f"--labels_file={tmp_path / 'labels.txt'}", *FAST)
    assert result.returncode == 0, result.stderr
    assert "numeric order" not in result.stderr
    assert _labels(out) == {"10": {0}, "2": {1}, "1": {2}}


@pytest.mark.parametrize("source", ["folders", "manifest"])
def test_an_append_keeps_the_text_order_of_a_dataset_made_before(tmp_path, source):
    """A dataset made before numeric order (its labels.txt: 1, 10, 2, ...) grows with its own ids."""
    src, out = tmp_path / "in", tmp_path / "out"
    write_tiny_tree(src, dict.fromkeys(ONE_TO_TEN, 1))
    text_order = sorted(ONE_TO_TEN)
    (tmp_path / "old_labels.txt").write_text("\n".join(text_order) + "\n")
    # the ids an earlier version gave (text order), made here with the labels file
    result = run_tool("pipeline.main", f"--input_dir={src}", f"--output_dir={out}", "--image_size=16",
                      f"--labels_file={tmp_path / 'old_labels.txt'}", *FAST)
    assert result.returncode == 0, result.stderr
    added = write_tiny_tree(src, dict.fromkeys(ONE_TO_TEN, 1), start=1)
    if source == "folders":
        where = [f"--input_dir={src}"]
    else:
        _manifest(src / "m.csv", [(p, p.split("/")[0]) for p in added])
        where = [f"--manifest={src / 'm.csv'}"]
    result = run_tool("pipeline.main", *where, f"--output_dir={out}", "--image_size=16", "--if_exists=append",
                      *FAST)
    assert result.returncode == 0, result.stderr
    assert (out / "labels.txt").read_text().splitlines() == text_order
    assert _info(out)["class_names"] == text_order
    labels = _labels(out)
    assert labels["10"] == {1} and labels["2"] == {2}  # old and new records alike
    assert labels == {name: {text_order.index(name)} for name in ONE_TO_TEN}
    assert sum(len(rows) for rows in read_records(out).values()) == 20
    assert "Class ids:" not in result.stdout
    if source == "folders":  # the launcher's note says the append keeps them
        assert "an append keeps the ids of the dataset it grows (its labels.txt)" in result.stderr


def test_a_multi_label_manifest_orders_integer_names_numerically(tmp_path):
    """--multi_label manifests find their class names the same way (class_names_of)."""
    data = tmp_path / "data"
    paths = write_tiny_tree(data, dict.fromkeys(["3", "20", "100"], 1))
    _manifest(data / "m.csv", [(p, f"{p.split('/')[0]};3") for p in paths], header=("path", "labels"))
    out = tmp_path / "out"
    assert convert_manifest(data / "m.csv", out, "--multi_label", "--image_size=16") == 0
    assert (out / "labels.txt").read_text().splitlines() == ["3", "20", "100"]
