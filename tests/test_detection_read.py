"""The read side of detection datasets: the reader (ragged and padded boxes, classes, masks), verify's checks of
every object and of the "detection" accounting, preview's boxes, the benchmark.

The datasets are written by tests/detection_fixtures.py as the converter writes them; `build` is the one line to
change for real conversions of the same export (`detection_fixtures.export`)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from tests import detection_fixtures as fixtures
from tests.conftest import doc_example, run_tool

tf = pytest.importorskip("tensorflow")

build = fixtures.write_dataset  # -> lambda export, out, **options: convert(export, out, "--task=detection", ...)
TRAIN_SHARD = "train-00000-of-00002.tfrecord"  # a.jpg (cat, dog), c.jpg (dog, dog, cat), e.jpg (cat)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return fixtures.export(tmp_path_factory.mktemp("export"))


@pytest.fixture(scope="module")
def dataset(export, tmp_path_factory):
    """Boxes only, class ids from 1 (the TF Object Detection API's)."""
    return build(export, tmp_path_factory.mktemp("detections") / "out")


@pytest.fixture(scope="module")
def masked(export, tmp_path_factory):
    """Instance and semantic masks, class ids from 0."""
    return build(export, tmp_path_factory.mktemp("masked") / "out", first_id=0, instance_masks=True,
                 semantic_masks=True)


@pytest.fixture
def damaged(dataset, tmp_path):
    """A copy of `dataset` for a test to damage."""
    return shutil.copytree(dataset, tmp_path / "copy")


def stored_objects(out, split: str) -> dict:
    """{filename: (boxes [ymin, xmin, ymax, xmax] as float32, stored class ids)} read with the protobuf alone."""
    from transforms.base.examples import Example
    from transforms.base.tfrecord import iter_records

    found = {}
    for name in sorted(os.listdir(out)):
        if not name.startswith(f"{split}-"):
            continue
        for data in iter_records(os.path.join(out, name)):
            feature = Example.FromString(data).features.feature
            boxes = np.stack([np.asarray(feature[f"image/object/bbox/{k}"].float_list.value, np.float32)
                              for k in ("ymin", "xmin", "ymax", "xmax")], axis=-1).reshape(-1, 4)
            found[feature["image/filename"].bytes_list.value[0].decode()] = (
                boxes, list(feature["image/object/class/label"].int64_list.value))
    return found


def by_file(ds) -> dict:
    return {e["source_path"].decode(): e for e in ds.as_numpy_iterator()}


def test_ragged_reading_gives_the_boxes_and_classes_written(dataset):
    from pipeline import reader

    read = by_file(reader.make_dataset(str(dataset), "train"))
    stored = stored_objects(dataset, "train")
    assert set(read) == set(stored) == {"train/a.jpg", "train/b.jpg", "train/c.jpg", "train/d.jpg", "train/e.jpg"}
    for filename, boxes, classes in fixtures.objects_of("train"):
        element = read[filename]
        assert element["boxes"].dtype == np.float32 and element["boxes"].shape == (len(classes), 4)
        assert element["boxes"].tobytes() == stored[filename][0].tobytes()  # the floats written, bit for bit
        assert element["boxes"].tolist() == [list(b) for b in boxes]  # [ymin, xmin, ymax, xmax] of the pixels drawn
        assert element["classes"].tolist() == classes  # 0-based, from ids stored from 1
        assert [c - 1 for c in stored[filename][1]] == classes
        assert [n.decode() for n in element["class_name"]] == [fixtures.CLASSES[c] for c in classes]
        assert element["image"].shape == (fixtures.HEIGHT, fixtures.WIDTH, 3)
    assert read["train/c.jpg"]["is_crowd"].tolist() == [0, 1, 0]
    assert read["train/d.jpg"]["boxes"].shape == (0, 4) and read["train/d.jpg"]["classes"].shape == (0,)


def test_batches_hold_ragged_boxes_of_each_image_own_count(dataset):
    from pipeline import reader

    ds = reader.make_dataset(str(dataset), "train", batch_size=2, drop_remainder=False)
    assert isinstance(ds.element_spec["boxes"], tf.RaggedTensorSpec)
    assert ds.element_spec["image"] == tf.TensorSpec([None, fixtures.HEIGHT, fixtures.WIDTH, 3], tf.uint8)
    counts = sorted(n for batch in ds for n in batch["boxes"].row_lengths().numpy().tolist())
    assert counts == sorted(len(p.objects) for p in fixtures.PICTURES if p.split == "train")


def test_padded_reading_has_static_shapes_and_the_same_boxes(dataset):
    from pipeline import reader

    ds = reader.make_dataset(str(dataset), "train", batch_size=2, max_boxes=4)
    assert ds.element_spec["boxes"] == tf.TensorSpec([2, 4, 4], tf.float32)
    assert ds.element_spec["classes"] == tf.TensorSpec([2, 4], tf.int32)
    assert ds.element_spec["num_boxes"] == tf.TensorSpec([2], tf.int32)
    expected = {filename: (boxes, classes) for filename, boxes, classes in fixtures.objects_of("train")}
    seen = 0
    for batch in ds.as_numpy_iterator():  # 5 records, drop_remainder: 4 of them
        for i, filename in enumerate(batch["source_path"]):
            boxes, classes = expected[filename.decode()]
            n = len(classes)
            assert batch["num_boxes"][i] == n
            assert batch["boxes"][i, :n].tolist() == [list(b) for b in boxes]
            assert batch["classes"][i].tolist() == classes + [-1] * (4 - n)
            assert not batch["boxes"][i, n:].any()
            seen += 1
    assert seen == 4


def test_supervised_gives_images_and_the_bounding_box_dict(dataset):
    from pipeline import reader

    images, targets = reader.make_dataset(str(dataset), "validation", batch_size=2, max_boxes=3, supervised=True,
                                          scale=True).element_spec
    assert images == tf.TensorSpec([2, fixtures.HEIGHT, fixtures.WIDTH, 3], tf.float32)
    assert targets == {"boxes": tf.TensorSpec([2, 3, 4], tf.float32), "classes": tf.TensorSpec([2, 3], tf.int32)}


def test_max_boxes_below_the_most_objects_of_an_image_is_refused(dataset):
    from pipeline import reader

    with pytest.raises(ValueError, match=r"max_boxes=2 is fewer than the 3 objects an image of .* holds .* give "
                                         r"max_boxes=3 or more"):
        reader.make_dataset(str(dataset), "train", max_boxes=2)
    with pytest.raises(ValueError, match="one_hot is for classification labels"):
        reader.make_dataset(str(dataset), "train", one_hot=True)


def test_masks_and_class_ids_from_zero(masked):
    from pipeline import reader

    read = by_file(reader.make_dataset(str(masked), "train"))
    for filename, _, classes in fixtures.objects_of("train"):
        assert read[filename]["classes"].tolist() == classes  # the same 0-based ids, stored from 0 this time
    picture = next(p for p in fixtures.PICTURES if p.name == "c.jpg")
    element = read["train/c.jpg"]
    assert element["masks"].shape == (3, fixtures.HEIGHT, fixtures.WIDTH) and element["masks"].dtype == np.uint8
    for mask, (_, (x0, y0, x1, y1)) in zip(element["masks"], picture.objects, strict=True):
        expected = np.zeros((fixtures.HEIGHT, fixtures.WIDTH), np.uint8)
        expected[y0:y1, x0:x1] = 1
        assert np.array_equal(mask, expected)
    semantic = element["segmentation_mask"][:, :, 0]
    assert semantic[40, 80] == fixtures.CLASSES.index("cat") and semantic[0, 0] == 0
    padded = reader.make_dataset(str(masked), "train", batch_size=1, max_boxes=3)
    assert padded.element_spec["masks"] == tf.TensorSpec([1, 3, fixtures.HEIGHT, fixtures.WIDTH], tf.uint8)


def test_a_class_id_out_of_range_stops_the_reader(damaged):
    from pipeline import reader

    def bad_label(example):
        labels = example.features.feature["image/object/class/label"].int64_list.value
        labels[1] = 9
    fixtures.rewrite_record(damaged, TRAIN_SHARD, 0, bad_label)
    with pytest.raises(tf.errors.InvalidArgumentError, match="class_id_out_of_range_of_the_classes"):
        list(reader.make_dataset(str(damaged), "train"))


def test_verify_passes_a_good_dataset(masked):
    result = run_tool("pipeline.verify", masked)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Annotations: 11 found = 10 written + 1 rejected" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("OK:")


def test_verify_names_a_box_outside_the_image(damaged):
    def outside(example):
        example.features.feature["image/object/bbox/xmax"].float_list.value[1] = 1.25
        example.features.feature["objects/bbox"].float_list.value[4 + 3] = 1.25  # TFDS's copy agrees
    fixtures.rewrite_record(damaged, TRAIN_SHARD, 0, outside)
    result = run_tool("pipeline.verify", damaged)
    assert result.returncode == 1
    problems = [line for line in result.stdout.splitlines() if line.startswith("problem:")]
    assert problems == [f"problem: {TRAIN_SHARD} record 0: object 1: box [ymin 0.3125, xmin 0.520833, ymax 0.9375, "
                        "xmax 1.25] is outside [0, 1] (boxes are normalised to the image)"]


def test_verify_names_a_class_id_out_of_range_and_a_wrong_class_text(damaged):
    def bad(example):
        example.features.feature["image/object/class/label"].int64_list.value[0] = 7
        example.features.feature["objects/label"].int64_list.value[0] = 6  # TFDS's copy agrees (from 0)
        example.features.feature["image/object/class/text"].bytes_list.value[1] = b"bird"
    fixtures.rewrite_record(damaged, TRAIN_SHARD, 0, bad)
    result = run_tool("pipeline.verify", damaged)
    assert result.returncode == 1
    out = result.stdout
    assert (f"problem: {TRAIN_SHARD} record 0: object 0: class id 7 is out of range: the dataset's 3 classes have "
            "ids 1..3") in out
    assert (f"problem: {TRAIN_SHARD} record 0: object 1: class text 'bird' does not match class id 2, which is "
            "'dog' in labels.txt") in out
    # the object counted under its id, so that the class counts differ too
    assert "problem: split 'train' class 'cat': 2 objects, but image_tfrecords.json says 3" in out
    assert "problem: split 'train' class '<id 7>': 1 objects, but image_tfrecords.json says 0" in out


@pytest.mark.parametrize("change, line", [
    (lambda info: info["detection"]["annotations"].update(written=9),
     "image_tfrecords.json: detection.annotations: 11 found but 9 written + 1 rejected = 10; annotations are "
     "unaccounted for"),
    (lambda info: info["detection"]["images_without_objects"].update(kept=0),
     "1 records have no object, but image_tfrecords.json says detection.images_without_objects.kept 0"),
    (lambda info: info["splits"]["validation"]["class_counts"].update(bird=3),
     "split 'validation' class 'bird': 2 objects, but image_tfrecords.json says 3"),
    (lambda info: info["detection"]["annotations"]["rejected"].update(box_outside_image=2),
     "errors.jsonl: annotations set aside {'box_outside_image': 1}, but image_tfrecords.json says "
     "{'box_outside_image': 2}"),
])
def test_verify_catches_a_count_that_differs_from_the_records(damaged, change, line):
    fixtures.rewrite_info(damaged, change)
    result = run_tool("pipeline.verify", damaged)
    assert result.returncode == 1
    assert f"problem: {line}" in result.stdout.splitlines(), result.stdout


def test_preview_draws_boxes_in_their_class_colour_and_charts_objects(masked, tmp_path):
    from PIL import Image

    from pipeline import preview

    sheet, tiles = preview.make_contact_sheet(str(masked), "train", per_class=4)
    c_tiles = [t for t in tiles if t.source_path == "train/c.jpg"]
    assert [t.caption for t in c_tiles] == ["0  cat: 3 objects", "1  dog: 3 objects"]
    pixels = np.asarray(sheet)
    drawn = c_tiles[0].objects
    assert [(class_id, name) for class_id, name, _ in drawn] == [(1, "dog"), (1, "dog"), (0, "cat")]
    for class_id, _, (left, top, right, bottom) in drawn:
        middle = (top + bottom) // 2
        assert tuple(pixels[middle, left]) == preview.box_colour(class_id)  # the outline's left edge
        assert tuple(pixels[middle, right]) == preview.box_colour(class_id)
    assert {t.row for t in tiles} == {0, 1, 2}  # d.jpg (no object) is in no row
    result = run_tool("pipeline.preview", masked, "--per_class=4", "--contact_sheet", tmp_path / "sheet.png",
                      "--class_chart", tmp_path / "chart.png")
    assert result.returncode == 0, result.stderr
    assert "objects per class for train, validation" in result.stdout
    assert Image.open(tmp_path / "sheet.png").size == sheet.size


def test_benchmark_reads_boxes(dataset):
    result = run_tool("pipeline.benchmark", dataset, "--batch_size=2", "--stages=read,parse,decode")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.split()}
    for stage in ("read", "parse", "decode"):
        assert rows[stage][1] == "4"  # 5 records, batches of 2 with drop_remainder


def test_the_docs_reading_example_trains(dataset, monkeypatch, tmp_path):
    """docs/detection.md's Reading example, run as written in a folder holding its detections/ dataset."""
    block = doc_example("docs/detection.md", "max_boxes=")
    assert '"detections/"' in block
    (tmp_path / "detections").symlink_to(dataset)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block, "docs/detection.md", "exec"), namespace)  # noqa: S102 - the documented example
    history = namespace["history"]
    assert len(history.history["loss"]) == 2 and all(np.isfinite(history.history["loss"]))


def test_preview_of_a_dataset_without_objects_per_class_still_shows_every_class(damaged, tmp_path):
    from pipeline import preview

    fixtures.rewrite_info(damaged, lambda info: [s.update(class_counts={}) for s in info["splits"].values()])
    _, tiles = preview.make_contact_sheet(str(damaged), "train", per_class=2)
    assert sorted((t.row, t.source_path) for t in tiles) == [
        (0, "train/a.jpg"), (0, "train/c.jpg"), (1, "train/a.jpg"), (1, "train/c.jpg"), (2, "train/b.jpg")]
    result = run_tool("pipeline.preview", damaged, "--class_chart", tmp_path / "chart.png")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: --class_chart: image_tfrecords.json of ")
