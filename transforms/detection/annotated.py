"""ReadAnnotations: a detection dataset's annotations (COCO, Pascal VOC, YOLO or box rows) read by its parser, each
kept image made an ImageRef that carries its objects, everything set aside made an errors.jsonl line.

    ReadAnnotations (Read<Format>: the parser, transforms/detection/{coco,voc,yolo,boxes}.py; ToImageRefs; ClassNames)
        -> ImageRef (its split, its shuffle key, its ImageAnnotations), on to AssignShards and WriteShards
        \\ images the parser rejected, images without objects dropped, annotations set aside -> errors.jsonl

The split of an image is the dataset's own (its split folder or file: ImageAnnotations.split), else the usual hash
of its path (never per box). The class ids are the YOLO names' or --labels_file's when given; else found in the job:
COCO's categories in the order of their ids (those no annotation uses left out, as Roboflow's supercategory), the
other formats' class names in sorted order (numbers as numbers: transforms.labels.layout.class_order).
"""

from __future__ import annotations

import re
from typing import NamedTuple

import apache_beam as beam

from transforms.base import counters
from transforms.base.records import ImageRef, Rejection
from transforms.detection.boxes import ReadBoxes
from transforms.detection.coco import CATEGORIES, ReadCoco
from transforms.detection.conversion import NO_OBJECTS, add_detection_tallies, annotation_rejection
from transforms.detection.objects import ImageAnnotations
from transforms.detection.parsing import COUNTS, IMAGES, PROBLEMS, REJECTED
from transforms.detection.voc import ReadVoc
from transforms.detection.yolo import ReadYolo
from transforms.labels.layout import class_order, hash_split, shuffle_key

SKIPPED = "skipped"  # Rejections: the images without objects that --images_without_objects=drop skips
FOUND = "found"  # one number: the images and other entries the parser found (kept or rejected)
TALLY = "tally"  # one dict: the parser's tally (transforms.detection.parsing)
CLASS_NAMES = "class_names"  # one list, when the class names are found in the job


class DetectionInput(NamedTuple):
    """What the launcher found of a detection dataset (pipeline/plan.py): its format and layout."""

    input_format: str  # 'coco', 'voc', 'yolo' or 'boxes'
    layout: object  # [CocoSource], VocLayout, YoloLayout, or BoxFile
    semantic_masks: bool = False  # the layout has per-image class masks (VOC's SegmentationClass/)
    splits: bool = False  # the layout gives splits (split folders, ImageSets, data.yaml): the rest are hashed


class BoxFile(NamedTuple):
    """A --manifest of boxes: its path, its format ('csv' or 'jsonl') and the folder its relative paths are below."""

    path: str
    fmt: str
    base: str


def image_ref(image: ImageAnnotations, seed: int, validation_split: float, test_split: float,
              drop_empty: bool = False, segmentations: bool = True):
    """A kept image -> its ImageRef (the dataset's split, else the hash split; its objects, not its problems);
    with `drop_empty` an image without objects is a SKIPPED Rejection (no_objects) instead. The annotations its
    parser set aside go to PROBLEMS as errors.jsonl lines. Without `segmentations` (no instance masks are
    written) the objects travel without their polygons and RLEs."""
    for problem in image.problems:
        yield beam.pvalue.TaggedOutput(PROBLEMS, annotation_rejection(problem, image.relpath))
    if drop_empty and not image.objects:
        yield beam.pvalue.TaggedOutput(SKIPPED, Rejection(
            image.relpath, "skipped", NO_OBJECTS, "no object in its annotations: --images_without_objects=drop"))
        return
    counters.inc(counters.TO_CONVERT)
    split = image.split or hash_split(image.relpath, seed, validation_split, test_split)
    # in the order the annotation files give them (a grouping's order is no order): the same record in every run
    objects = sorted(image.objects, key=lambda obj: written_order(obj.where))
    if not segmentations:
        objects = [obj._replace(segmentation=None) for obj in objects]
    yield ImageRef(image.path, image.relpath, image.size, split, "", None, shuffle_key(image.relpath, seed),
                   annotations=image._replace(problems=(), objects=tuple(objects)))


def written_order(where: str) -> tuple:
    """The place an annotation's `where` names ('annotations.json: annotation id 17', '0001.xml: object 3', 'row
    12') as a sort key: its numbers as numbers, so that id 9 comes before id 10."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", where) if part)


def class_names_of(used: list[str], categories: dict | None = None, known=()) -> list[str]:
    """The class names in id order: COCO's `categories` ({(file index, category id): name}) in the order of their
    ids, those of no kept object (`used`) left out; else `used` in class_order. With `known` (an append: the
    dataset's), those first, as they are, then the others found in that order."""
    if known:
        return [*known, *(name for name in class_names_of(used, categories) if name not in known)]
    if categories is None:
        return class_order(used)
    used, names = set(used), []
    for (_, _), name in sorted(categories.items(), key=lambda item: (_number(item[0][1]), item[0][0])):
        if name in used and name not in names:
            names.append(name)
    return names + class_order(used - set(names))  # none: every used name is a category's


def _number(category_id: str):
    return (0, int(category_id), "") if category_id.lstrip("-").isdigit() else (1, 0, category_id)


def _reader(detection: DetectionInput, input_dir: str, class_names, segmentations: bool = True):
    layout = detection.layout
    if detection.input_format == "coco":
        return ReadCoco(input_dir, layout, class_names, segmentations)
    if detection.input_format == "voc":
        return ReadVoc(input_dir, layout, class_names)
    if detection.input_format == "yolo":
        return ReadYolo(input_dir, layout, class_names)
    return ReadBoxes(layout.path, layout.fmt, layout.base, class_names)


class DetectionTally(beam.CombineFn):
    """Tally dicts (a parser's, objects tallies) -> their sum (transforms.detection.conversion
    .add_detection_tallies)."""

    def create_accumulator(self):
        return {}

    def add_input(self, accumulator, item):
        return add_detection_tallies(accumulator, item)

    def merge_accumulators(self, accumulators):
        total = {}
        for accumulator in accumulators:
            add_detection_tallies(total, accumulator)
        return total

    def extract_output(self, accumulator):
        return accumulator


class ReadAnnotations(beam.PTransform):
    """PBegin -> {"images": ImageRef, "rejections": Rejection (images rejected or skipped, annotations set aside),
    FOUND: one number, TALLY: one dict, and CLASS_NAMES: one list when `class_names` is None (found in the job)}.

    `class_names`: the classes (YOLO's names, --labels_file's), an object of another class is unknown_class; None:
    every class name found is a class. `drop_empty`: --images_without_objects=drop; `segmentations`: whether the
    objects' segmentations are carried on (--instance_masks). `known` (an append, with `class_names` None): the
    dataset's class names, which keep their ids; the classes found that it lacks follow them in their order.
    """

    def __init__(self, input_dir: str, detection: DetectionInput, class_names=None, *, seed: int,
                 validation_split: float, test_split: float, drop_empty: bool = False, segmentations: bool = True,
                 known=None):
        super().__init__()
        self._known = list(known or ())
        self._input_dir, self._detection = input_dir, detection
        self._class_names = None if class_names is None else list(class_names)
        self._split = dict(seed=seed, validation_split=validation_split, test_split=test_split)
        self._drop_empty, self._segmentations = drop_empty, segmentations

    def expand(self, pbegin):
        fmt = self._detection.input_format
        parsed = pbegin | f"Read{fmt.upper() if fmt != 'boxes' else 'Boxes'}" >> _reader(
            self._detection, self._input_dir, self._class_names, self._segmentations)
        refs = (parsed[IMAGES]
                # ImageRef with its objects; SKIPPED: images without objects dropped; PROBLEMS: annotations aside
                | "ToImageRefs" >> beam.FlatMap(image_ref, **self._split, drop_empty=self._drop_empty,
                                                segmentations=self._segmentations)
                .with_outputs(SKIPPED, PROBLEMS, main="images"))
        aside = parsed[PROBLEMS] | "ProblemLines" >> beam.Map(annotation_rejection)
        rejections = ((parsed[REJECTED], refs[SKIPPED], refs[PROBLEMS], aside)
                      | "AnnotationRejections" >> beam.Flatten())
        # counted where they are made (lifted combines): a Flatten of the entries themselves would hold every
        # ImageAnnotations whole in the local runner's memory; no default (CountFound's is the one)
        count = beam.CombineGlobally(beam.combiners.CountCombineFn()).without_defaults
        found = ((parsed[IMAGES] | "CountImages" >> count(), parsed[REJECTED] | "CountRejected" >> count())
                 | "Entries" >> beam.Flatten()
                 | "CountFound" >> beam.CombineGlobally(sum))
        outputs = {"images": refs.images, "rejections": rejections, FOUND: found, TALLY: parsed[COUNTS]}
        if self._class_names is None:
            used = (parsed[IMAGES]
                    | "ObjectClasses" >> beam.FlatMap(lambda image: {obj.class_name for obj in image.objects})
                    | "DistinctClasses" >> beam.Distinct()
                    | "UsedClasses" >> beam.combiners.ToList())
            categories = beam.pvalue.AsSingleton(parsed[CATEGORIES]) if fmt == "coco" else None
            outputs[CLASS_NAMES] = used | "ClassNames" >> beam.Map(class_names_of, categories, known=self._known)
        return outputs
