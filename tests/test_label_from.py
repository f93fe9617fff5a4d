"""--label_from: labels taken from image paths (issue 48), on generated copies of the layouts people publish: Kaggle's
dogs vs cats (`train/cat.123.jpg`, flat or in split folders) and Oxford-IIIT Pets (`Abyssinian_12.jpg`,
`american_bulldog_3.jpg`), read back record by record."""

from __future__ import annotations

import hashlib
import json
import re
import shlex

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from PIL import Image

from pipeline.errors import UserError
from tests.conftest import FAST, convert, main_in_process, run_tool
from tests.datasets import error_rows, read_records
from tests.gcs_fixtures import NO_AUTH
from tests.pipelines import TestPipeline
from transforms.base.records import FileRef
from transforms.labels.layout import (
    NO_LABEL_IN_PATH,
    OUTSIDE_SPLIT_FOLDERS,
    PathLabel,
    compile_group_by,
    kept_spellings,
    label_from_problem,
    place_by_path,
    suggest_label_from,
)

DOTS = r"(?P<label>[^/.]+)\.\d+\.[^/.]+$"  # cat.123.jpg -> cat
UNDERSCORE = r"(?P<label>[^/]+)_\d+\.[^/.]+$"  # american_bulldog_3.jpg -> american_bulldog
PETS = {"Abyssinian": 4, "american_bulldog": 5, "Bengal": 3, "great_pyrenees": 4}


def write_images(folder, names):
    """A tiny JPEG of its own colour per name (no two files alike: no duplicate groups)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        r, g, b = hashlib.sha256(name.encode()).digest()[:3]
        Image.new("RGB", (12, 10), (r, g, b)).save(folder / name, quality=90)


def labels_of(out) -> dict[str, tuple[str, int, str]]:
    """source path -> (class name, label id, split) of every record."""
    return {r["source_path"]: (r["class_name"], r["label"], split)
            for split, rows in read_records(out).items() for r in rows}


def info_of(out) -> dict:
    return json.loads((out / "image_tfrecords.json").read_text())


def suggested(message: str) -> str:
    """The --label_from=... that an error line suggests, unquoted as a shell would."""
    found = re.search(r"--label_from=('[^']*')", message)
    assert found, message
    return "--label_from=" + shlex.split(found.group(1))[0]


# The plain functions


def test_a_path_gives_its_split_folder_label_and_group():
    pattern = compile_group_by(r"(?P<group>p\d+)_.*_(?P<label>[a-z]+)\.jpg$")
    assert place_by_path("p7_scan3_benign.jpg", pattern, split_folders=False) == PathLabel("", "benign", "p7")
    dots = compile_group_by(DOTS)
    assert place_by_path("train/cat.123.jpg", dots, split_folders=True) == PathLabel("train", "cat")
    assert place_by_path("val/dog.7.jpg", dots, split_folders=True) == PathLabel("validation", "dog")
    # class folders are not the labels: the pattern decides wherever the image is
    assert place_by_path("cats/dog.7.jpg", dots, split_folders=False) == PathLabel("", "dog")
    assert place_by_path("cat.1.jpg", dots, split_folders=True)[0] == OUTSIDE_SPLIT_FOLDERS
    reason, detail = place_by_path("train/notes.jpg", dots, split_folders=True)
    assert reason == NO_LABEL_IN_PATH and DOTS in detail and "does not match" in detail
    empty = compile_group_by(r"(?P<label>[a-z]*)\d+\.jpg$")
    reason, detail = place_by_path("123.jpg", empty, split_folders=False)
    assert reason == NO_LABEL_IN_PATH and "captures nothing" in detail


def test_a_pattern_that_backtracks_rejects_the_image_at_the_time_limit():
    from transforms.labels.layout import LABEL_FROM_TIMEOUT

    pattern = compile_group_by(r"(?P<label>(a|aa)+)b$")
    reason, detail = place_by_path("a" * 80 + "c.jpg", pattern, split_folders=False)
    assert reason == LABEL_FROM_TIMEOUT and detail.startswith("--label_from=") and "backtracks" in detail


def test_a_suggestion_fits_the_names_and_says_what_it_gives():
    assert suggest_label_from(["cat.0.jpg", "cat.1.jpg", "dog.0.jpg"]) == (DOTS, [("cat.0.jpg", "cat"),
                                                                                  ("dog.0.jpg", "dog")])
    pattern, shown = suggest_label_from(["Abyssinian_12.jpg", "american_bulldog_3.jpg", "Bengal_100.jpg",
                                         "Bengal_101.jpg"])
    assert pattern == UNDERSCORE
    assert shown == [("Abyssinian_12.jpg", "Abyssinian"), ("american_bulldog_3.jpg", "american_bulldog"),
                     ("Bengal_100.jpg", "Bengal")]
    assert suggest_label_from(["train/rose-7.png", "train/tulip-8.png"])[0] == r"(?P<label>[^/]+)-\d+\.[^/.]+$"
    assert suggest_label_from(["IMG_A.jpg", "photo.jpg"]) is None  # no number: no guess


def test_a_pattern_must_compile_and_name_a_label_group():
    assert label_from_problem(DOTS) is None
    assert "not a regular expression" in label_from_problem("(?P<label>[a-z]+")
    assert "no named group label" in label_from_problem(r"([a-z]+)\.\d+")


def test_labels_in_other_letter_case_keep_the_spelling_of_most_images():
    assert kept_spellings([("Cat", 1), ("cat", 5), ("dog", 2)]) == ["cat", "dog"]
    assert kept_spellings([("Cat", 2), ("cat", 2)]) == ["Cat"]  # a tie: the first in sorted order
    assert kept_spellings([("cafe\u0301", 1), ("caf\xe9", 3)]) == ["caf\xe9"]


def test_label_from_paths_finds_the_classes_in_the_job():
    from transforms.inputs.path_labels import CLASS_NAMES, SKIPPED, LabelFromPaths

    refs = [FileRef(f"/in/{name}", name, 10) for name in ("cat.1.jpg", "dog.2.jpg", "Dog.3.jpg", "dog.4.jpg",
                                                         "notes.jpg", " cat.5.jpg")]
    with TestPipeline() as p:
        out = p | beam.Create(refs) | LabelFromPaths(DOTS, None, split_folders=False, seed=1, validation_split=0.0,
                                                     test_split=0.0)
        assert_that(out[CLASS_NAMES], equal_to([["cat", "dog"]]), label="ClassNames")
        assert_that(out["images"] | beam.Map(lambda r: (r.relpath, r.class_name, r.label, r.size)),
                    equal_to([("cat.1.jpg", "cat", 0, 10), ("dog.2.jpg", "dog", 1, 10),
                              ("dog.4.jpg", "dog", 1, 10)]), label="Images")
        assert_that(out[SKIPPED] | beam.Map(lambda r: (r.relpath, r.stage, r.reason)),
                    equal_to([("Dog.3.jpg", "rejected", "same_label_other_spelling"),
                              ("notes.jpg", "skipped", "no_label_in_path"),
                              (" cat.5.jpg", "rejected", "bad_label_in_path")]), label="Skipped")


# Whole runs


@pytest.fixture(scope="module")
def dogs_vs_cats(tmp_path_factory):
    """Kaggle's dogs vs cats in split folders: train/ and test/ of cat.N.jpg and dog.N.jpg, and a file named by
    no class (train/notes_1.jpg)."""
    root = tmp_path_factory.mktemp("dogs-vs-cats")
    write_images(root / "train", [f"{kind}.{i}.jpg" for kind in ("cat", "dog") for i in range(8)] + ["notes_1.jpg"])
    write_images(root / "test", [f"{kind}.{i}.jpg" for kind in ("cat", "dog") for i in range(100, 103)])
    return root


def test_split_folders_of_named_images_convert_with_each_label_from_its_name(dogs_vs_cats, tmp_path):
    out = tmp_path / "out"
    result = run_tool("pipeline.main", f"--input_dir={dogs_vs_cats}", f"--output_dir={out}", f"--label_from={DOTS}",
                      "--image_size=8", *FAST)
    assert result.returncode == 0, result.stderr
    assert "labels from the paths" in result.stderr and "test/cat.100.jpg -> cat" in result.stderr
    assert (out / "labels.txt").read_text() == "cat\ndog\n"
    records = labels_of(out)
    assert len(records) == 22
    for path, (name, label, split) in records.items():
        assert name == path.split("/")[-1].split(".")[0] and label == ["cat", "dog"].index(name)
        assert split == path.split("/")[0]  # the split folders give the splits
    info = info_of(out)
    assert info["split_by"] == "split_folders" and info["options"]["label_from"] == DOTS
    assert info["files"] == {"found": 23, "written": 22, "rejected": 0, "skipped": 1, "upscaled": 0}
    assert info["skipped_by_reason"] == {NO_LABEL_IN_PATH: 1}
    (error,) = error_rows(out)
    assert (error["relpath"], error["stage"], error["reason"]) == ("train/notes_1.jpg", "skipped", NO_LABEL_IN_PATH)
    assert DOTS in error["detail"]
    assert "Skipped: no_label_in_path 1" in result.stdout
    # the same command again: the dataset is there, made with the same options
    again = run_tool("pipeline.main", f"--input_dir={dogs_vs_cats}", f"--output_dir={out}", f"--label_from={DOTS}",
                     "--image_size=8", "--if_exists=skip", *FAST)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr
    # another pattern is another dataset: never taken for this one
    other = run_tool("pipeline.main", f"--input_dir={dogs_vs_cats}", f"--output_dir={out}",
                     r"--label_from=(?P<label>[a-z]+)\.", "--image_size=8", "--if_exists=skip", *FAST)
    assert other.returncode == 2 and "label_from: " in other.stderr, other.stderr


def test_the_flat_folder_error_suggests_a_label_from_that_converts_it(dogs_vs_cats, tmp_path):
    """Kaggle's train/ on its own: the error names --label_from, built from the folder's own names, and the
    suggested command converts it."""
    flat = dogs_vs_cats / "train"
    with pytest.raises(UserError) as e:
        convert(flat, tmp_path / "refused")
    message = str(e.value)
    assert "\n" not in message and f"found 17 images directly in {flat} but no class folders" in message
    assert f"--label_from='{DOTS}' (cat.0.jpg -> cat, dog.0.jpg -> dog)" in message
    assert "--manifest" in message and "--unlabeled" in message
    out = tmp_path / "out"
    assert convert(flat, out, suggested(message), "--image_size=8") == 0
    records = labels_of(out)
    assert sorted(records) == sorted(f"{kind}.{i}.jpg" for kind in ("cat", "dog") for i in range(8))
    assert all(name == path.split(".")[0] for path, (name, _, _) in records.items())
    assert {split for _, _, split in records.values()} <= {"train", "validation"}
    assert info_of(out)["split_by"] == "path_hash" and info_of(out)["skipped_by_reason"] == {NO_LABEL_IN_PATH: 1}


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    """Oxford-IIIT Pets' images/: Abyssinian_12.jpg, american_bulldog_3.jpg (class names with underscores)."""
    root = tmp_path_factory.mktemp("pets") / "images"
    write_images(root, [f"{breed}_{i}.jpg" for breed, count in PETS.items() for i in range(1, count + 1)])
    return root


def test_class_names_with_underscores_come_whole_from_the_suggested_pattern(pets, tmp_path, capsys):
    code, err = main_in_process(capsys, f"--input_dir={pets}", f"--output_dir={tmp_path / 'refused'}", *FAST)
    assert code == 2 and err.count("\n") == 1, err
    assert f"--label_from='{UNDERSCORE}'" in err
    assert "american_bulldog_1.jpg -> american_bulldog" in err
    out = tmp_path / "out"
    assert convert(pets, out, suggested(err), "--image_size=8", "--validation_split=0.25") == 0
    names = sorted(PETS)  # labels.txt: the labels found, sorted
    assert (out / "labels.txt").read_text() == "".join(f"{name}\n" for name in names)
    records = labels_of(out)
    assert len(records) == sum(PETS.values())
    for path, (name, label, _) in records.items():
        assert path == f"{name}_{path.rsplit('_', 1)[1]}" and label == names.index(name)
    info = info_of(out)
    assert {n: sum(s["class_counts"].get(n, 0) for s in info["splits"].values()) for n in names} == PETS


def test_a_labels_file_gives_the_classes_and_skips_the_others(pets, tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("great_pyrenees\nAbyssinian\n")
    out = tmp_path / "out"
    assert convert(pets, out, f"--label_from={UNDERSCORE}", f"--labels_file={labels}", "--image_size=8") == 0
    assert (out / "labels.txt").read_text() == "great_pyrenees\nAbyssinian\n"
    records = labels_of(out)
    assert {name: label for name, label, _ in records.values()} == {"great_pyrenees": 0, "Abyssinian": 1}
    assert len(records) == PETS["great_pyrenees"] + PETS["Abyssinian"]
    skipped = {row["relpath"]: row["reason"] for row in error_rows(out)}
    assert len(skipped) == PETS["american_bulldog"] + PETS["Bengal"]
    assert set(skipped.values()) == {"unknown_class"}


def test_a_group_capture_keeps_each_group_in_one_split(tmp_path):
    """p<N>_<view>_<label>.jpg: the patient is the group, the diagnosis the label."""
    root = tmp_path / "scans"
    names = [f"p{p}_{view}_{'benign' if p % 2 else 'malign'}.jpg" for p in range(12) for view in ("a", "b", "c")]
    write_images(root, names)
    out = tmp_path / "out"
    pattern = r"(?P<group>p\d+)_[a-z]+_(?P<label>[a-z]+)\.jpg$"
    assert convert(root, out, f"--label_from={pattern}", "--image_size=8", "--validation_split=0.4") == 0
    records = labels_of(out)
    assert len(records) == 36
    splits_of: dict[str, set] = {}
    for path, (name, _, split) in records.items():
        assert name == path[:-4].rsplit("_", 1)[1]
        splits_of.setdefault(path.split("_")[0], set()).add(split)
    assert all(len(splits) == 1 for splits in splits_of.values())
    assert {s for splits in splits_of.values() for s in splits} == {"train", "validation"}
    info = info_of(out)
    assert info["split_by"] == "group_hash" and info["groups"]["groups"] == 12


def test_labels_in_two_letter_cases_keep_one_class_and_reject_the_others(tmp_path):
    root = tmp_path / "flat"
    write_images(root, ["cat.1.jpg", "cat.2.jpg", "Cat.3.jpg", "dog.1.jpg"])
    out = tmp_path / "out"
    assert convert(root, out, f"--label_from={DOTS}", "--image_size=8") == 0
    assert (out / "labels.txt").read_text() == "cat\ndog\n"
    assert sorted(labels_of(out)) == ["cat.1.jpg", "cat.2.jpg", "dog.1.jpg"]
    (row,) = error_rows(out)
    assert (row["relpath"], row["stage"], row["reason"]) == ("Cat.3.jpg", "rejected", "same_label_other_spelling")
    assert "'Cat' and the class 'cat' differ only in letter case" in row["detail"]
    assert info_of(out)["rejected_by_reason"] == {"same_label_other_spelling": 1}


def test_class_folders_are_not_the_labels_with_label_from(tmp_path):
    root = tmp_path / "sorted-wrongly"
    write_images(root / "pets", ["cat.1.jpg", "dog.2.jpg"])
    write_images(root / "more", ["dog.3.jpg"])
    out = tmp_path / "out"
    result = run_tool("pipeline.main", f"--input_dir={root}", f"--output_dir={out}", f"--label_from={DOTS}",
                      "--image_size=8", *FAST)
    assert result.returncode == 0, result.stderr
    assert "the folders (more, pets) are not the labels" in result.stderr
    assert {path: name for path, (name, _, _) in labels_of(out).items()} == {
        "pets/cat.1.jpg": "cat", "pets/dog.2.jpg": "dog", "more/dog.3.jpg": "dog"}


@pytest.mark.parametrize("args, expected", [
    (["--label_from=(?P<label>[a-z]+"], "--label_from='(?P<label>[a-z]+' is not a regular expression"),
    ([r"--label_from=([a-z]+)\.\d+"], "has no named group label"),
    ([r"--label_from=(?P<group>p\d+)_(?P<label>[a-z]+)", "--group_by=(p\\d+)"], "--group_by is given too"),
    ([f"--label_from={DOTS}", "--unlabeled"], "--unlabeled converts them without labels"),
])
def test_a_pattern_that_cannot_label_is_one_line_at_start(dogs_vs_cats, tmp_path, capsys, args, expected):
    code, err = main_in_process(capsys, f"--input_dir={dogs_vs_cats}", f"--output_dir={tmp_path / 'out'}", *args)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and expected in err, err
    assert not (tmp_path / "out").exists()


def test_a_pattern_that_labels_none_of_the_sample_is_refused_with_a_suggestion(dogs_vs_cats, tmp_path, capsys):
    code, err = main_in_process(capsys, f"--input_dir={dogs_vs_cats}", f"--output_dir={tmp_path / 'out'}",
                                r"--label_from=(?P<label>[a-z]+)_\d+\.png$", *FAST)
    assert code == 2 and err.count("\n") == 1, err
    assert "finds no label in any of the 23 image paths looked at" in err and f"'{DOTS}'" in err


def test_a_gs_flat_folder_converts_with_labels_from_its_names(gcs_emulator, pets, tmp_path):
    bucket = gcs_emulator.create_bucket("label-from")
    assert gcs_emulator.upload_tree(pets, f"{bucket}/pets/images") == sum(PETS.values())
    out = tmp_path / "out"
    assert convert(f"{bucket}/pets/images", out, NO_AUTH, f"--label_from={UNDERSCORE}", "--image_size=8") == 0
    records = labels_of(out)
    assert len(records) == sum(PETS.values())
    assert all(path.rsplit("_", 1)[0] == name for path, (name, _, _) in records.items())
    assert (out / "labels.txt").read_text() == "".join(f"{name}\n" for name in sorted(PETS))


def test_the_pattern_is_part_of_the_plan_that_a_resume_must_match(dogs_vs_cats, tmp_path):
    """An interrupted run is resumed only by a run of the same plan record (transforms.output.resume): another
    pattern is another record, so its chunks are never taken for this one."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.options import validate
    from pipeline.plan import plan_dataset, plan_record

    def record(pattern):
        settings = validate(PipelineOptions([f"--input_dir={dogs_vs_cats}", f"--output_dir={tmp_path / 'out'}",
                                             f"--label_from={pattern}", "--image_size=8"]))
        plan = plan_dataset(settings)
        assert plan.class_names == [] and plan.split_folders  # the classes are found in the job
        return plan_record(settings, plan)

    first = record(DOTS)
    assert first["options"]["label_from"] == DOTS and first == record(DOTS)
    assert record(r"(?P<label>[a-z]+)\.")["options"] != first["options"]


def test_an_append_labels_the_new_files_with_the_dataset_classes(tmp_path):
    root = tmp_path / "flat"
    write_images(root, ["cat.1.jpg", "dog.1.jpg"])
    out = tmp_path / "out"
    args = (f"--label_from={DOTS}", "--image_size=8", "--if_exists=append")
    assert convert(root, out, *args) == 0
    write_images(root, ["cat.2.jpg", "dog.2.jpg", "owl.1.jpg"])
    assert convert(root, out, *args) == 0
    records = labels_of(out)
    assert {path: (name, label) for path, (name, label, _) in records.items()} == {
        "cat.1.jpg": ("cat", 0), "dog.1.jpg": ("dog", 1), "cat.2.jpg": ("cat", 0), "dog.2.jpg": ("dog", 1)}
    assert (out / "labels.txt").read_text() == "cat\ndog\n"  # a new class would shift the ids: skipped
    assert [(row["relpath"], row["reason"]) for row in error_rows(out)] == [("owl.1.jpg", "unknown_class")]


def test_gs_split_folders_of_named_images_keep_their_splits(gcs_emulator, dogs_vs_cats, tmp_path):
    bucket = gcs_emulator.create_bucket("label-from-splits")
    assert gcs_emulator.upload_tree(dogs_vs_cats, f"{bucket}/dogs-vs-cats") == 23
    out = tmp_path / "out"
    assert convert(f"{bucket}/dogs-vs-cats", out, NO_AUTH, f"--label_from={DOTS}", "--image_size=8") == 0
    records = labels_of(out)
    assert len(records) == 22
    assert all(name == path.split("/")[1].split(".")[0] and split == path.split("/")[0]
               for path, (name, _, split) in records.items())
    assert [(row["relpath"], row["reason"]) for row in error_rows(out)] == [("train/notes_1.jpg", NO_LABEL_IN_PATH)]


def test_a_manifest_shares_the_rule_for_labels_in_two_spellings(tmp_path):
    """The labelling --label_from reuses is the manifest's: its labels found in the job get the same rule."""
    from tests.datasets import convert_manifest

    write_images(tmp_path, ["a.jpg", "b.jpg", "c.jpg", "d.jpg"])
    manifest = tmp_path / "list.csv"
    manifest.write_text("path,label\na.jpg,dog\nb.jpg,Dog\nc.jpg,dog\nd.jpg,owl\n")
    out = tmp_path / "out"
    assert convert_manifest(manifest, out, "--image_size=8") == 0
    assert (out / "labels.txt").read_text() == "dog\nowl\n"
    assert sorted(labels_of(out)) == ["a.jpg", "c.jpg", "d.jpg"]
    (row,) = error_rows(out)
    assert (row["relpath"], row["reason"]) == ("b.jpg", "same_label_other_spelling")
    assert row["detail"].startswith("row 2: the label 'Dog' and the class 'dog' differ only in letter case")
