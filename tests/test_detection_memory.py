"""What a detection run carries per image through the graph's shuffles, which Beam's local runner holds in the
launcher's memory (benchmarks/detection_memory.py, BENCHMARKS.md): an ImageRef with its objects pickles small and
comes back the same; COCO's polygons are not carried without --instance_masks (a bad one is still rejected); the
parser's tally and found count leave each step as one sum, never as a Flatten of every image's annotations."""

from __future__ import annotations

import json
import pickle

import apache_beam as beam
from apache_beam.coders import coders

from tests.detection_datasets import IMAGE, roboflow_coco, run_parser, write
from transforms.detection.annotated import DetectionInput, ReadAnnotations, image_ref
from transforms.detection.coco import ReadCoco, find_coco
from transforms.detection.objects import Annotation, Box, ImageAnnotations, Segmentation
from transforms.detection.parsing import COUNTS, IMAGES, PROBLEMS, REJECTED

JSON_FILE = "annotations/instances_train.json"


def _coco_image(objects: int = 3) -> ImageAnnotations:
    """A typical COCO image after parsing: `objects` boxes, each with a 12-point polygon."""
    found = []
    for number in range(objects):
        x, y = 10.25 + 40 * number, 20.5 + 30 * number
        polygon = tuple(v + 0.125 * k for k, v in enumerate([x, y, x + 35.5, y, x + 35.5, y + 25.75] * 4))
        found.append(Annotation(("cat", "dog", "bird")[number], Box(x, y, x + 35.5, y + 25.75), area=640.5,
                                segmentation=Segmentation(polygons=(polygon,)),
                                where=f"{JSON_FILE}: annotation id {100017 + number}"))
    return ImageAnnotations("train2017/000000123456.jpg", "/data/coco/train2017/000000123456.jpg", "123456",
                            "train", (640, 480), tuple(found), size=161_234)


def _ref(segmentations: bool):
    (ref,) = image_ref(_coco_image(), 42, 0.1, 0.0, segmentations=segmentations)
    return ref


def test_an_image_ref_with_three_objects_pickles_small_and_comes_back_the_same():
    """Every image crosses four groupings between its parse and its record; with its objects' shared 'where'
    written once, this 3-object ImageRef pickles in 562 bytes (661 before), with its 3 polygons in 1,260 (1,359
    before), through pickle and through Beam's coder alike."""
    coder = coders.FastPrimitivesCoder()
    for segmentations, most in ((False, 580), (True, 1280)):
        ref = _ref(segmentations)
        data = pickle.dumps(ref, protocol=pickle.HIGHEST_PROTOCOL)
        assert len(data) <= most, (segmentations, len(data))
        assert data.count(JSON_FILE.encode()) == 1  # the file's name once, not once per object
        back = pickle.loads(data)
        assert back == ref and type(back.annotations) is ImageAnnotations
        assert [obj.where for obj in back.annotations.objects] == [
            f"{JSON_FILE}: annotation id {n}" for n in (100017, 100018, 100019)]
        assert coder.decode(coder.encode(ref)) == ref
        assert len(coder.encode(ref)) <= most + 8


def test_objects_without_a_shared_start_pickle_as_they_are():
    """One object, no object, or objects whose `where` share nothing: the same ImageAnnotations back."""
    image = _coco_image()
    mixed = image._replace(objects=(image.objects[0], image.objects[1]._replace(where="row 12"),
                                    image.objects[2]._replace(where="")))
    for case in (image._replace(objects=image.objects[:1]), image._replace(objects=()), mixed):
        assert pickle.loads(pickle.dumps(case)) == case


def _parse_both(root):
    """ReadCoco of the export at `root`, with and without the segmentations carried on."""
    sources = find_coco(str(root))
    return (run_parser(ReadCoco(str(root), sources, segmentations=True)),
            run_parser(ReadCoco(str(root), sources, segmentations=False)))


def test_coco_without_instance_masks_carries_no_polygons_and_the_same_objects_and_tally(tmp_path):
    roboflow_coco(tmp_path)
    with_masks, without = _parse_both(tmp_path)
    assert any(obj.segmentation for image in with_masks[IMAGES] for obj in image.objects)
    assert all(obj.segmentation is None for image in without[IMAGES] for obj in image.objects)
    stripped = sorted((image._replace(objects=tuple(obj._replace(segmentation=None) for obj in image.objects))
                       for image in with_masks[IMAGES]), key=lambda image: image.relpath)
    assert sorted(without[IMAGES], key=lambda image: image.relpath) == stripped  # the same `where`s, file included
    assert "train/_annotations.coco.json: annotation id 11" in {
        obj.where for image in without[IMAGES] for obj in image.objects}
    for tag in (REJECTED, PROBLEMS):
        assert sorted(without[tag]) == sorted(with_masks[tag])
    assert without[COUNTS] == with_masks[COUNTS]


def test_coco_without_instance_masks_still_rejects_a_malformed_polygon(tmp_path):
    data = {"categories": [{"id": 1, "name": "cat"}],
            "images": [{"id": 1, "file_name": "a.jpg", "width": 50, "height": 50}],
            "annotations": [{"id": 7, "image_id": 1, "category_id": 1, "bbox": [1, 1, 9, 9],
                             "segmentation": [[1, 1, 9, 1, 9, 9]]},
                            {"id": 8, "image_id": 1, "category_id": 1, "bbox": [2, 2, 5, 5],
                             "segmentation": [[2, 2, 5]]}]}
    write(f"{tmp_path}/_annotations.coco.json", json.dumps(data))
    write(f"{tmp_path}/a.jpg", IMAGE)
    for out in _parse_both(tmp_path):
        (image,) = out[IMAGES]
        assert [obj.where for obj in image.objects] == ["_annotations.coco.json: annotation id 7"]
        assert [(p.reason, p.detail.split(":")[0] + ":" + p.detail.split(":")[1]) for p in image.problems] == [
            ("bad_annotation", "_annotations.coco.json: annotation id 8")]
        assert out[COUNTS]["annotations_found"] == 2 and out[COUNTS]["annotations_kept"] == 1


def _producers(proto) -> dict[str, str]:
    return {pcoll: t.unique_name for t in proto.components.transforms.values() if not t.subtransforms
            for pcoll in t.outputs.values()}


def test_the_tally_and_the_found_count_flatten_sums_never_the_images(tmp_path):
    """The Flattens of ReadAnnotations' count and of the parser's tally take one sum per input (lifted combines:
    one accumulator per bundle leaves a step), not the ImageAnnotations, which the local runner would hold whole
    between the steps."""
    roboflow_coco(tmp_path)
    detection = DetectionInput("coco", find_coco(str(tmp_path)))
    p = beam.Pipeline()
    _ = p | ReadAnnotations(str(tmp_path), detection, None, seed=42, validation_split=0.2, test_split=0.0)
    proto = p.to_runner_api()
    producer = _producers(proto)
    flattens = {t.unique_name: [producer[pcoll] for pcoll in t.inputs.values()]
                for t in proto.components.transforms.values() if t.unique_name.endswith(("/Entries", "/AllCounts"))}
    assert set(flattens) == {"ReadAnnotations/Entries", "ReadAnnotations/ReadCOCO/Tally/AllCounts"}
    assert all(name.startswith(("ReadAnnotations/CountImages/", "ReadAnnotations/CountRejected/"))
               for name in flattens["ReadAnnotations/Entries"]), flattens
    tally = [name.removeprefix("ReadAnnotations/ReadCOCO/") for name in flattens[
        "ReadAnnotations/ReadCOCO/Tally/AllCounts"]]
    assert sorted(name.split("/")[1] for name in tally if name.startswith("Tally/")) == [
        "SumImages", "SumProblems", "SumRejected"], tally
    assert [name for name in tally if not name.startswith("Tally/")] == ["StreamCoco/ParDo(_StreamCoco)"], tally


def test_the_memory_benchmark_builds_three_polygon_boxes_an_image_in_distinct_files(tmp_path):
    from benchmarks.detection_memory import OBJECTS, build_set

    built = build_set(str(tmp_path), 6)
    with open(f"{built['coco']}/annotations/instances_train.json") as f:
        train = json.load(f)
    with open(f"{built['coco']}/annotations/instances_val.json") as f:
        val = json.load(f)
    assert (len(train["images"]), len(val["images"])) == (5, 1)
    annotations = train["annotations"] + val["annotations"]
    assert len(annotations) == 6 * OBJECTS and all(len(a["segmentation"][0]) == 24 for a in annotations)
    files = [f"{built['coco']}/{split}/{image['file_name']}" for split, data in (("train", train), ("val", val))
             for image in data["images"]]
    contents = set()
    for path in files:
        with open(path, "rb") as f:
            contents.add(f.read())
    assert len(contents) == 6
