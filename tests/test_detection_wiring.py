"""The pieces that wire detection into the converter, one by one: ImageAnnotations made ImageRefs, the class ids'
order, the annotations of an image not written, the tallies and the description's detection section, the schema,
and ReadAnnotations on a TestPipeline."""

from __future__ import annotations

import apache_beam as beam
import pytest

from tests.detection_runs import voc_export
from tests.pipelines import TestPipeline
from transforms.base.dataset_format import DescriptionError, check_description
from transforms.base.examples import detection_feature_description
from transforms.base.records import ImageRef, Rejection
from transforms.detection.annotated import (
    CLASS_NAMES,
    FOUND,
    TALLY,
    DetectionInput,
    ReadAnnotations,
    class_names_of,
    image_ref,
    written_order,
)
from transforms.detection.conversion import (
    add_detection_tallies,
    annotations_problem,
    detection_section,
    lost_annotations,
    objects_tally,
)
from transforms.detection.objects import Annotation, AnnotationProblem, Box, ImageAnnotations, Segmentation
from transforms.detection.parsing import PROBLEMS
from transforms.detection.voc import find_voc
from transforms.output.describe import summarise

CAT = Annotation("cat", Box(1, 1, 5, 5), where="a.json: annotation id 10",
                 segmentation=Segmentation(polygons=((1, 1, 5, 1, 5, 5),)))
DOG = Annotation("dog", Box(2, 2, 6, 6), where="a.json: annotation id 9")


def _outputs(items):
    tagged = {"main": []}
    for item in items:
        if isinstance(item, beam.pvalue.TaggedOutput):
            tagged.setdefault(item.tag, []).append(item.value)
        else:
            tagged["main"].append(item)
    return tagged


def test_an_image_becomes_an_image_ref_with_its_objects_in_file_order():
    image = ImageAnnotations("train/a.jpg", "/in/train/a.jpg", "7", "train", (10, 10), (CAT, DOG),
                             (AnnotationProblem("unknown_class", "a.json: annotation id 11: ...", "train/a.jpg"),),
                             size=123)
    out = _outputs(image_ref(image, 42, 0.2, 0.0, segmentations=False))
    (ref,) = out["main"]
    assert (ref.split, ref.size, ref.label, ref.class_name) == ("train", 123, None, "")
    assert [obj.class_name for obj in ref.annotations.objects] == ["dog", "cat"]  # id 9 before id 10
    assert all(obj.segmentation is None for obj in ref.annotations.objects) and ref.annotations.problems == ()
    assert out[PROBLEMS] == [Rejection("train/a.jpg", "annotation", "unknown_class", "a.json: annotation id 11: ...")]
    kept = _outputs(image_ref(image, 42, 0.2, 0.0))["main"][0]
    assert kept.annotations.objects[1].segmentation == CAT.segmentation


def test_an_image_without_a_split_takes_the_hash_split_and_one_without_objects_may_be_dropped():
    from transforms.labels.layout import hash_split

    image = ImageAnnotations("x/b.jpg", "/in/x/b.jpg", "8")
    (ref,) = _outputs(image_ref(image, 42, 0.5, 0.0))["main"]
    assert ref.split == hash_split("x/b.jpg", 42, 0.5, 0.0)
    dropped = _outputs(image_ref(image, 42, 0.5, 0.0, drop_empty=True))
    assert dropped["main"] == [] and [r.reason for r in dropped["skipped"]] == ["no_objects"]


def test_written_order_reads_numbers_as_numbers():
    assert sorted(["row 10", "row 9", "row 100"], key=written_order) == ["row 9", "row 10", "row 100"]


def test_class_ids_follow_coco_categories_else_sorted_names():
    categories = {(0, "0"): "animals", (0, "2"): "dog", (0, "10"): "zebra", (0, "9"): "cat", (1, "2"): "dog"}
    assert class_names_of(["zebra", "dog", "cat"], categories) == ["dog", "cat", "zebra"]  # ids 2, 9, 10
    assert class_names_of(["b", "a"]) == ["a", "b"]
    assert class_names_of(["2", "10", "1"]) == ["1", "2", "10"]  # numbers as numbers


def test_the_annotations_of_an_image_not_written_are_each_a_line():
    ref = ImageRef("/in/a.jpg", "a.jpg", 1, "train", "", None, 0,
                   annotations=ImageAnnotations("a.jpg", "/in/a.jpg", "1", objects=(CAT, DOG)))
    lines = lost_annotations(ref, Rejection("a.jpg", "rejected", "not_an_image", "..."))
    assert [(r.relpath, r.stage, r.reason) for r in lines] == [("a.jpg", "annotation", "image_rejected")] * 2
    assert "rejected (not_an_image)" in lines[0].detail and "annotation id 10" in lines[0].detail
    assert lost_annotations(ref._replace(annotations=None), Rejection("a.jpg", "rejected", "x", "")) == []


def test_the_detection_section_adds_up_or_says_why_not():
    tally = add_detection_tallies({"annotations_found": 5, "annotations_kept": 4}, objects_tally(2, 1, 2))
    add_detection_tallies(tally, objects_tally(1, 0, 1))
    section = detection_section(tally, {"bad_box": 1, "unknown_class": 1, "bad_semantic_mask": 1}, 2, first_id=0,
                                instance_masks=False, semantic_masks=True, input_format="voc")
    assert section["annotations"] == {"found": 5, "written": 3, "rejected": {"bad_box": 1, "unknown_class": 1}}
    assert section["images_without_objects"] == {"kept": 1, "dropped": 2}
    assert section["objects_per_image_max"] == 2 and section["semantic_masks_rejected"] == 1
    assert annotations_problem(section) is None
    section["annotations"]["written"] = 2
    assert "5 annotations found, but 2 written and 2 rejected" in annotations_problem(section)


def test_annotation_lines_are_not_files_in_the_accounting():
    counts = summarise([(("found",), 2), (("written", "train", None, False), 1), (("rejected", "not_an_image"), 1),
                        (("annotation", "bad_box"), 3)], [], ["cat"])
    assert counts.files["found"] == 2 and counts.files["rejected"] == 1
    assert counts.annotations_rejected == {"bad_box": 3} and counts.rejected_by_reason == {"not_an_image": 1}


def _description(**detection) -> dict:
    section = {"first_id": 1, "instance_masks": False, "semantic_masks": False, "input_format": "coco",
               "annotations": {"found": 1, "written": 1, "rejected": {}},
               "images_without_objects": {"kept": 0, "dropped": 0}, "objects_per_image_max": 1, **detection}
    return {"format_version": 2, "splits": {}, "image": {}, "schema": "detection", "class_names": ["cat"],
            "compression": "none", "task": "detection", "detection": section}


def test_a_detection_description_is_checked():
    assert check_description(_description())["task"] == "detection"
    with pytest.raises(DescriptionError, match=r"detection.first_id is 2, not 0 or 1"):
        check_description(_description(first_id=2))
    with pytest.raises(DescriptionError, match=r"detection.annotations.rejected.bad_box is -1, not a count"):
        check_description(_description(annotations={"found": 1, "written": 1, "rejected": {"bad_box": -1}}))
    broken = _description()
    del broken["detection"]
    with pytest.raises(DescriptionError, match="lacks detection"):
        check_description(broken)
    with pytest.raises(DescriptionError, match="task 'segmentation' is not one of"):
        check_description({**_description(), "task": "segmentation"})


def test_the_detection_features_match_the_records_keys():
    from transforms.detection.records import (
        IMAGE_KEYS,
        MASK_KEY,
        OBJECT_KEYS,
        SEMANTIC_FORMAT_KEY,
        SEMANTIC_KEY,
        TFDS_OBJECT_KEYS,
    )

    plain = detection_feature_description()
    assert set(plain) == set(IMAGE_KEYS) | set(OBJECT_KEYS) | set(TFDS_OBJECT_KEYS)
    for key, kind in {**IMAGE_KEYS, **OBJECT_KEYS, **TFDS_OBJECT_KEYS}.items():
        assert plain[key]["dtype"] == {"bytes": "string"}.get(kind, kind)
        lists = [-1, 4] if key == "objects/bbox" else [-1]  # objects/bbox: 4 floats per object
        assert plain[key]["shape"] == (lists if key in {**OBJECT_KEYS, **TFDS_OBJECT_KEYS} else [])
    masks = detection_feature_description(True, True)
    assert set(masks) - set(plain) == {MASK_KEY, SEMANTIC_KEY, SEMANTIC_FORMAT_KEY}
    assert masks[MASK_KEY]["shape"] == [-1] and masks[SEMANTIC_KEY]["shape"] == []


_COLLECTED: dict[str, list] = {}


def _collect(element, into: str):
    _COLLECTED.setdefault(into, []).append(element)


def test_read_annotations_on_a_pipeline(tmp_path):
    """A VOC export: its images as ImageRefs with their splits, the found count, the tally and the class names
    found in the job."""
    voc_export(tmp_path / "voc")
    detection = DetectionInput("voc", find_voc(str(tmp_path / "voc")), splits=True)
    with TestPipeline() as p:
        out = p | ReadAnnotations(str(tmp_path / "voc"), detection, None, seed=42, validation_split=0.2,
                                  test_split=0.0)
        for tag in ("images", "rejections", FOUND, TALLY, CLASS_NAMES):
            _ = out[tag] | f"Collect[{tag}]" >> beam.Map(_collect, tag)
    got = {tag: _COLLECTED.pop(tag, []) for tag in ("images", "rejections", FOUND, TALLY, CLASS_NAMES)}
    assert sorted((ref.relpath, ref.split) for ref in got["images"]) == [
        ("JPEGImages/a.jpg", "train"), ("JPEGImages/b.jpg", "train"), ("JPEGImages/c.jpg", "train"),
        ("JPEGImages/d.jpg", "train"), ("JPEGImages/v.jpg", "validation"), ("JPEGImages/w.jpg", "validation")]
    assert all(ref.size > 0 for ref in got["images"])
    assert got["rejections"] == [] and got[FOUND] == [6] and got[CLASS_NAMES] == [["cat", "dog"]]
    assert got[TALLY][0]["annotations_found"] == 8


def test_detection_options_without_the_task_are_named_as_having_no_effect(tmp_path):
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.options import ignored_options, validate

    argv = [f"--input_dir={tmp_path}", f"--output_dir={tmp_path / 'out'}", "--first_class_id=0", "--instance_masks"]
    options = PipelineOptions(argv)
    notes = ignored_options(argv, options, validate(options), dataflow=False, split_folders=False)
    assert notes == ["--first_class_id has no effect: it is an option of detection records; give --task=detection, "
                     "or drop it", "--instance_masks has no effect: it is an option of detection records; give "
                     "--task=detection, or drop it"]
    settings = validate(PipelineOptions([*argv, "--task=detection"]))
    assert (settings.schema, settings.first_class_id, settings.instance_masks) == ("detection", 0, True)
    assert settings.as_dict()["task"] == "detection" and "task" not in validate(options).as_dict()
