"""TensorFlow Datasets loads a detection dataset as it is: `tfds.builder_from_directory(out)` gives each record's
image, objects/bbox and objects/label, the same boxes and 0-based classes the reader gives, for every input format
and both --first_class_id; TFDS's files say what TFDS's own classes would write; verify names a record whose TFDS
keys disagree with the OD API's; the docs' KerasCV and KerasHub maps batch what TFDS gives."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests import detection_fixtures as fixtures
from tests.conftest import FAST, doc_example, run_tool
from tests.detection_runs import IMAGES, export_of
from transforms.detection.records import TFDS_OBJECT_KEYS

tf = pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")
pytestmark = pytest.mark.timeout(300)

OUTPUT = (32, 24)  # --image_size, WIDTHxHEIGHT
TFDS_FILES = ["objects-label.labels.txt", "features.json", "dataset_info.json"]
TRAIN_SHARD = "train-00000-of-00002.tfrecord"  # of the fixture: a.jpg (cat, dog), c.jpg (dog, dog, cat), e.jpg


def _convert(kind: str, root, first_id: int, *args: str) -> str:
    from pipeline.launcher import run

    inputs, _ = export_of(kind, root / kind)
    out = root / "out"
    assert run([*inputs, f"--output_dir={out}", "--quiet", "--task=detection", f"--first_class_id={first_id}",
                f"--image_size={OUTPUT[0]}x{OUTPUT[1]}", *args, *FAST]) == 0
    return str(out)


def _by_file(dataset, name) -> dict:
    return {name(e): e for e in tfds.as_numpy(dataset)}


@pytest.mark.parametrize("kind, first_id, args", [
    ("coco", 1, ()), ("coco", 0, ("--instance_masks",)), ("voc", 0, ()), ("yolo", 1, ()), ("boxes", 0, ()),
])
def test_tfds_loads_the_boxes_and_classes_the_reader_reads(tmp_path, kind, first_id, args):
    from pipeline import reader

    out = _convert(kind, tmp_path, first_id, *args)
    info = reader.load_info(out)
    assert info["tfds"] == {"files": TFDS_FILES, "note": None}
    assert info["detection"]["instance_masks"] == bool(args)
    builder = tfds.builder_from_directory(out)
    features = builder.info.features
    assert set(features) == {"image", "objects"}  # the masks (with --instance_masks) are not TFDS's features
    assert set(features["objects"].feature) == {"bbox", "label", "is_crowd", "is_difficult"}
    assert features["objects"]["label"].names == info["class_names"] == ["cat", "dog"]
    assert isinstance(features["objects"]["bbox"], tfds.features.BBoxFeature)
    assert features["image"]["encoded"].shape == (OUTPUT[1], OUTPUT[0], 3)
    assert builder.info.supervised_keys is None  # no one label per image
    without_objects = 0
    for split, split_info in info["splits"].items():
        assert builder.info.splits[split].num_examples == split_info["records"]
        loaded = _by_file(builder.as_dataset(split=split), lambda e: e["image"]["filename"].decode())
        read = _by_file(reader.make_dataset(out, split), lambda e: e["source_path"].decode())
        assert sorted(loaded) == sorted(read) and len(loaded) == split_info["records"]
        for path, example in loaded.items():
            objects, expected = example["objects"], read[path]
            assert example["image"]["encoded"].dtype == np.uint8
            np.testing.assert_array_equal(example["image"]["encoded"], expected["image"])  # (24, 32, 3), as stored
            assert objects["bbox"].dtype == np.float32 and objects["bbox"].shape == (len(expected["boxes"]), 4)
            np.testing.assert_array_equal(objects["bbox"], expected["boxes"])  # [ymin, xmin, ymax, xmax], the same
            assert objects["label"].tolist() == expected["classes"].tolist()  # 0-based, whatever first_id
            assert [info["class_names"][i] for i in objects["label"]] == \
                [name.decode() for name in expected["class_name"]]
            assert objects["is_crowd"].tolist() == [False] * len(objects["label"])
            assert example["image"]["source_id"] == expected["source_id"]
            without_objects += objects["bbox"].shape == (0, 4)
    assert without_objects == sum(not objects for _, _, objects in IMAGES) == 1  # image c: bbox (0, 4)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The read side's detection fixture (written as the converter writes it), class ids from 1."""
    export = fixtures.export(tmp_path_factory.mktemp("export"))
    return fixtures.write_dataset(export, tmp_path_factory.mktemp("detections") / "out")


def test_the_files_tfds_writes_itself_match_ours(dataset, tmp_path):
    """TFDS's own classes, given the features described in docs/detection.md, write the same features.json and
    class names file."""
    features = tfds.features.FeaturesDict({
        "image": {
            "encoded": tfds.features.Image(shape=(fixtures.HEIGHT, fixtures.WIDTH, 3), encoding_format="jpeg"),
            "format": tfds.features.Text(), "filename": tfds.features.Text(), "source_id": tfds.features.Text(),
            "height": tfds.features.Scalar(dtype=np.int64), "width": tfds.features.Scalar(dtype=np.int64),
            "key": {"sha256": tfds.features.Text()},
        },
        "objects": tfds.features.Sequence({
            "bbox": tfds.features.BBoxFeature(),
            "label": tfds.features.ClassLabel(names=list(fixtures.CLASSES)),
            "is_crowd": tfds.features.Scalar(dtype=np.bool_),
            "is_difficult": tfds.features.Scalar(dtype=np.bool_),
        }),
    })
    features.save_config(str(tmp_path))
    features.save_metadata(str(tmp_path))
    assert json.loads((tmp_path / "features.json").read_text()) == \
        json.loads(open(f"{dataset}/features.json").read())
    assert (tmp_path / "objects-label.labels.txt").read_text().split() == list(fixtures.CLASSES) == \
        open(f"{dataset}/objects-label.labels.txt").read().split()


def test_tfds_gives_the_crowd_flags_and_the_fixture_s_objects(dataset):
    """The fixture's boxes (known exactly) and its crowd object, as TFDS reads them."""
    builder = tfds.builder_from_directory(dataset)
    for split in ("train", "validation"):
        loaded = _by_file(builder.as_dataset(split=split), lambda e: e["image"]["filename"].decode())
        for path, boxes, classes in fixtures.objects_of(split):
            objects = loaded[path]["objects"]
            np.testing.assert_array_equal(objects["bbox"], np.asarray(boxes, np.float32).reshape(-1, 4))
            assert objects["label"].tolist() == classes
    crowd = _by_file(builder.as_dataset(split="train"), lambda e: e["image"]["filename"].decode())["train/c.jpg"]
    assert crowd["objects"]["is_crowd"].tolist() == [False, True, False]
    assert crowd["objects"]["is_difficult"].tolist() == [False, False, False]


def _damaged(dataset, tmp_path, change) -> str:
    copy = shutil.copytree(dataset, tmp_path / "copy")
    fixtures.rewrite_record(copy, TRAIN_SHARD, 0, change)
    return str(copy)


@pytest.mark.parametrize("change, problem", [
    (lambda e: e.features.feature["objects/bbox"].float_list.value.__setitem__(5, 0.5),
     "TFDS's objects/bbox differs from the boxes of image/object/bbox/* (8 values for 8, first difference at "
     "value 5)"),
    (lambda e: e.features.feature["objects/label"].int64_list.value.__setitem__(1, 2),
     "TFDS's objects/label differs from image/object/class/label - 1 (2 values for 2, first difference at value 1)"),
    (lambda e: e.features.feature["objects/is_crowd"].int64_list.value.append(1),
     "TFDS's objects/is_crowd differs from image/object/is_crowd (3 values for 2, first difference at value 2)"),
    (lambda e: e.features.feature.pop("objects/label"),
     "it lacks TFDS's objects/label, which image_tfrecords.json lists: tfds.builder_from_directory reads no "
     "objects from it; convert again"),
])
def test_verify_names_a_record_whose_tfds_keys_disagree(dataset, tmp_path, change, problem):
    assert run_tool("pipeline.verify", dataset).returncode == 0
    result = run_tool("pipeline.verify", _damaged(dataset, tmp_path, change))
    assert result.returncode == 1
    problems = [line for line in result.stdout.splitlines() if line.startswith("problem:")]
    assert problems[0].startswith(f"problem: {TRAIN_SHARD} record 0: {problem}"), problems
    assert len(problems) == 1, problems


def test_verify_checks_detection_tfds_files(dataset, tmp_path):
    from pipeline import verify

    copy = shutil.copytree(dataset, tmp_path / "copy")
    (copy / "objects-label.labels.txt").write_text("cat\ndog\nfish\n")
    assert verify.verify_dataset(str(copy), decode=False).problems == [
        "objects-label.labels.txt: TFDS's class names differ from labels.txt; tfds.builder_from_directory would "
        "not load the folder as it is; convert again"]


def test_a_detection_dataset_written_before_the_tfds_keys_still_verifies(dataset, tmp_path):
    """Records without TFDS's keys and a description that lists neither them nor TFDS's files (written before):
    verify asks nothing of them, and still checks the rest."""
    from pipeline import verify

    copy = shutil.copytree(dataset, tmp_path / "copy")
    for name in TFDS_FILES:
        (copy / name).unlink()
    info = json.loads((copy / "image_tfrecords.json").read_text())
    for shard in (entry for split_info in info["splits"].values() for entry in split_info["shards"]):
        for index in range(shard["records"]):
            fixtures.rewrite_record(copy, shard["file"], index,
                                    lambda e: [e.features.feature.pop(key) for key in TFDS_OBJECT_KEYS])

    def before(info):
        info["tfds"] = {"files": [], "note": "TFDS files are not written for detection records yet"}
        for key in TFDS_OBJECT_KEYS:
            del info["features"][key]
    fixtures.rewrite_info(copy, before)
    assert verify.verify_dataset(str(copy), decode=False).problems == []
    fixtures.rewrite_record(copy, TRAIN_SHARD, 0, lambda e: e.features.feature[
        "image/object/class/label"].int64_list.value.__setitem__(0, 9))
    assert verify.verify_dataset(str(copy), decode=False).problems[0] == (
        f"{TRAIN_SHARD} record 0: object 0: class id 9 is out of range: the dataset's 3 classes have ids 1..3")


def test_gzip_detection_shards_get_no_tfds_files_and_say_why(dataset):
    from transforms.output import tfds_metadata

    info = json.loads(open(f"{dataset}/image_tfrecords.json").read())
    files, why_not = tfds_metadata.tfds_files(info["splits"], "detection", info["image"], info["class_names"], "gzip")
    assert files == {} and why_not.startswith("TFDS reads uncompressed TFRecord shards only")


def test_the_docs_keras_snippets_batch_what_tfds_gives(dataset, monkeypatch):
    """docs/detection.md's maps from TFDS's features to KerasCV's bounding-box dict and KerasHub's pairs, run with
    plain TensorFlow and Keras (neither KerasCV nor KerasHub is installed here) in a folder holding its detections/."""
    shutil.copytree(dataset, dataset.rsplit("/", 1)[0] + "/detections")
    monkeypatch.chdir(dataset.rsplit("/", 1)[0])
    scope: dict = {}
    exec(compile(doc_example("docs/detection.md", "def to_keras_cv"), "docs/detection.md", "exec"), scope)
    most = json.loads(open(f"{dataset}/image_tfrecords.json").read())["detection"]["objects_per_image_max"]
    by_file = {path: (b, c) for path, b, c in fixtures.objects_of("train")}
    names = [e["image"]["filename"].decode() for e in tfds.as_numpy(scope["builder"].as_dataset(split="train"))][:4]
    batch = next(iter(scope["train"]))
    images, hub_boxes = next(iter(scope["train_hub"]))
    boxes, classes = batch["bounding_boxes"]["boxes"], batch["bounding_boxes"]["classes"]
    for pixels in (batch["images"], images):
        assert pixels.shape == (4, fixtures.HEIGHT, fixtures.WIDTH, 3) and pixels.dtype == tf.float32
    assert boxes.shape == hub_boxes["boxes"].shape == (4, most, 4)
    assert classes.shape == hub_boxes["labels"].shape == (4, most) and classes.dtype == tf.float32
    # Each image's objects first, then padding: classes (labels) -1; boxes 0 (KerasCV's), -1 (Keras's layer).
    for row, path in enumerate(names):
        expected_boxes, expected_classes = by_file[path]
        n = len(expected_classes)
        for got_classes in (classes, hub_boxes["labels"]):
            assert got_classes[row].numpy().tolist() == [float(c) for c in expected_classes] + [-1.0] * (most - n)
        expected = np.asarray(expected_boxes, np.float32).reshape(-1, 4)
        np.testing.assert_array_equal(boxes[row, :n].numpy(), expected)
        np.testing.assert_array_equal(hub_boxes["boxes"][row, :n].numpy(), expected)
        assert not boxes[row, n:].numpy().any() and (hub_boxes["boxes"][row, n:].numpy() == -1).all()
