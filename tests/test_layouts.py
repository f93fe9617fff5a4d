"""Split folders under the names datasets ship with (training_set/, test_set/, dev/ ...), and folders of class
folders never taken as classes (issue 30: the cats-dogs layout got the labels 'training_set' and 'test_set')."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import UserError
from tests.conftest import convert, run_tool
from tests.datasets import read_records, write_tiny_tree
from transforms.base.dataset_format import split_of
from transforms.labels.layout import nested_class_folders, split_folder_note


@pytest.mark.parametrize("name, split", [
    ("train", "train"), ("Training", "train"), ("training_set", "train"), ("Train-Set", "train"),
    ("train_set", "train"), ("TRAINING SET", "train"), ("valid", "validation"), ("val", "validation"),
    ("dev", "validation"), ("Validation_Set", "validation"), ("testing", "test"), ("test_set", "test"),
    ("test-set", "test"), ("cats", None), ("trainer", None), ("pretest", None),
])
def test_split_of(name, split):
    assert split_of(name) == split


def test_split_folder_note_names_each_folder_in_split_order():
    assert split_folder_note(["test_set", "training_set", "dev"]) == (
        "split folders: training_set/ -> train, dev/ -> validation, test_set/ -> test")


def test_nested_class_folders():
    assert nested_class_folders(["cats/1.jpg", "dogs/2.jpg"], False) is None
    assert nested_class_folders(["set_a/cats/1.jpg", "set_b/dogs/2.jpg", "set_a/dogs/3.jpg"], False) == {
        "set_a": {"cats", "dogs"}, "set_b": {"dogs"}}
    assert nested_class_folders(["set_a/cats/1.jpg", "set_b/2.jpg"], False) is None  # one real class
    assert nested_class_folders(["train/cats/1.jpg"], True) is None
    assert nested_class_folders(["train/training_set/cats/1.jpg"], True) == {"train/training_set": {"cats"}}
    assert nested_class_folders([], False) is None


def test_cats_dogs_layout_gets_its_labels_and_splits(tmp_path):
    src = tmp_path / "cats-dogs"
    write_tiny_tree(src / "training_set", {"cats": 6, "dogs": 5})
    write_tiny_tree(src / "test_set", {"cats": 2, "dogs": 3})
    out = tmp_path / "out"
    assert convert(src, out) == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["cats", "dogs"]
    assert {s: v["records"] for s, v in info["splits"].items()} == {"train": 11, "test": 5}
    records = read_records(out)
    for split, folder in (("train", "training_set"), ("test", "test_set")):
        assert {r["source_path"].split("/")[0] for r in records[split]} == {folder}
        for r in records[split]:
            assert r["class_name"] == r["source_path"].split("/")[1]
            assert r["label"] == ["cats", "dogs"].index(r["class_name"])


def test_the_run_prints_which_folder_became_which_split_and_that_validation_split_is_unused(tmp_path):
    src = tmp_path / "in"
    write_tiny_tree(src / "Train", {"a": 2, "b": 2})
    write_tiny_tree(src / "dev", {"a": 1, "b": 1})
    result = run_tool("pipeline.main", f"--input_dir={src}", f"--output_dir={tmp_path / 'out'}",
                      "--validation_split=0.3", "--direct_running_mode=in_memory", "--direct_num_workers=1")
    assert result.returncode == 0, result.stderr
    printed = result.stdout + result.stderr
    assert "split folders: Train/ -> train, dev/ -> validation" in printed
    assert "--validation_split has no effect: the input's split folders decide every image's split" in printed


@pytest.mark.parametrize("layout", [
    {"set_a": ("cats", "dogs"), "set_b": ("cats", "dogs")},  # split folders under unknown names
    {"training_set/training_set": ("cats", "dogs"), "test_set/test_set": ("cats", "dogs")},  # Kaggle's zip
])
def test_folders_of_class_folders_are_refused_not_taken_as_classes(tmp_path, layout):
    src = tmp_path / "in"
    for folder, classes in layout.items():
        write_tiny_tree(src / folder, dict.fromkeys(classes, 2))
    out = tmp_path / "out"
    with pytest.raises(UserError) as e:
        convert(src, out)
    message = str(e.value)
    assert "\n" not in message
    assert "not classes but folders of class folders" in message
    assert "{cats,dogs}/" in message
    assert "rename them train/, validation/" in message
    assert not (out / "image_tfrecords.json").exists()


def test_a_class_folder_with_images_and_subfolders_stays_a_class(tmp_path):
    src = tmp_path / "in"
    write_tiny_tree(src, {"cats": 2, "dogs": 2})
    write_tiny_tree(src / "cats", {"more": 2})  # cats/more/*.jpg: still class 'cats'
    out = tmp_path / "out"
    assert convert(src, out, "--validation_split=0") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["cats", "dogs"]
    assert info["splits"]["train"]["records"] == 6
