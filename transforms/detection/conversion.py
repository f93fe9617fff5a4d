"""A detection record from one converted image: its annotations placed in the output frame, the Example built, and
every annotation that record does not hold as an errors.jsonl line; and the "detection" section of the description.

No Beam here. `DetectionRecords.build` runs where the image was converted (a conversion helper thread of
transforms.output.write: transforms.images.convert calls it with the EncodedImage), so that masks are rasterised
and encoded to PNG on the helpers, in parallel, and never leave them as arrays.

Every annotation found by a parser ends in exactly one place (docs/detection.md, "How annotations are counted"):
written in a record, or one errors.jsonl line of stage 'annotation' with its reason: the parser's own (set aside
before any image was read), the geometry's (transforms.detection.geometry), or `image_rejected` (its image could not
be converted, or was skipped). So annotations found = written + rejected, per reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import NamedTuple

from transforms.base.dataset_format import SPLITS
from transforms.base.paths import display_path
from transforms.base.records import ImageRef, Rejection
from transforms.detection.geometry import (
    BAD_INSTANCE_MASK,
    BAD_SEMANTIC_MASK,
    INSTANCE_MASK_REASONS,
    place_annotations,
)
from transforms.detection.objects import AnnotationProblem, ImageAnnotations
from transforms.detection.parsing import FOUND, add_tallies
from transforms.detection.records import build_detection_example
from transforms.images.convert import Built, read_bytes
from transforms.images.imaging import EncodedImage

ANNOTATION = "annotation"  # the errors.jsonl stage of an annotation set aside (its image may well be written)
NO_OBJECTS = "no_objects"  # --images_without_objects=drop: an image without any object, skipped
IMAGE_REJECTED = "image_rejected"  # an annotation whose image was rejected (not decodable, ...) or skipped
DUPLICATE_IMAGE = "duplicate_image"  # an annotation of a copy --duplicates=drop does not write
# An append's tally: the objects of the images the dataset holds already (found again, written before).
ALREADY_IN_DATASET = "objects_already_in_dataset"
INPUT_FORMATS = ("coco", "voc", "yolo", "boxes")

# The keys of the object tallies (WriteShards' OBJECTS output, summed with the parser's tally).
OBJECTS_WRITTEN = "objects_written"
RECORDS_WITHOUT_OBJECTS = "records_without_objects"
MOST_OBJECTS = "objects_per_image_max"
CLASS_OBJECTS = "class_objects"  # {(split, class name): objects written}
CLASS_IMAGES = "class_images"  # {(split, class name): records holding at least one object of the class}


def annotation_rejection(problem: AnnotationProblem, relpath: str = "") -> Rejection:
    """An annotation set aside, as its errors.jsonl line: the image's relative path (the problem's own when it has
    one), stage 'annotation', the reason and the detail."""
    return Rejection(problem.image or relpath, ANNOTATION, problem.reason, problem.detail)


def lost_annotations(ref: ImageRef, rejection: Rejection) -> list[Rejection]:
    """The annotations of an image that is not written (rejected, or skipped), each as its errors.jsonl line; none
    for an image skipped as no_objects: each of its annotations was set aside already, with its own reason."""
    annotations = ref.annotations
    if annotations is None or rejection.stage == ANNOTATION or rejection.reason == NO_OBJECTS:
        return []
    detail = f"its image was {rejection.stage} ({rejection.reason})"
    return [Rejection(ref.relpath, ANNOTATION, IMAGE_REJECTED, f"{obj.where or obj.class_name}: {detail}")
            for obj in annotations.objects]


def duplicate_annotations(ref: ImageRef, rejection: Rejection) -> list[Rejection]:
    """The annotations of a copy that --duplicates=drop does not write (`rejection` says which copy is), each as its
    errors.jsonl line of reason duplicate_image: the copy written keeps its own annotations, never these."""
    annotations = ref.annotations
    if annotations is None:
        return []
    return [Rejection(ref.relpath, ANNOTATION, DUPLICATE_IMAGE,
                      f"{obj.where or obj.class_name}: its image is a copy that is not written "
                      f"({rejection.reason}: {rejection.detail})")
            for obj in annotations.objects]


class DetectionRecords(NamedTuple):
    """How a run builds its detection records (picklable: it travels to the workers with WriteShards)."""

    first_id: int = 1  # --first_class_id
    instance_masks: bool = False  # --instance_masks: one mask per object in every record
    drop_empty: bool = False  # --images_without_objects=drop: a record left without objects is not written
    max_mask_bytes: int = 64 << 20  # a semantic mask file larger than this is not read (bad_semantic_mask)

    def build(self, ref: ImageRef, image: EncodedImage, class_index: Mapping[str, int]) -> Built:
        """The record of `ref` (whose `annotations` are set) from its converted `image`: the annotations placed
        through the image's orientation and resize, each rejected one as an errors.jsonl line; with `drop_empty`,
        a record left without objects is skipped as no_objects instead."""
        annotations: ImageAnnotations = ref.annotations
        set_aside = []
        semantic = self._read_mask(annotations.semantic_mask, BAD_SEMANTIC_MASK, ref.relpath, set_aside)
        instance = self._read_mask(annotations.instance_mask if self.instance_masks else "", BAD_INSTANCE_MASK,
                                   ref.relpath, set_aside)
        placed = place_annotations(annotations, image.placement, semantic, masks=self.instance_masks,
                                   instance_mask=instance)
        set_aside += [annotation_rejection(problem, ref.relpath) for problem in placed.problems]
        if self.drop_empty and not placed.objects:
            skipped = Rejection(ref.relpath, "skipped", NO_OBJECTS,
                                "every annotation of the image was rejected (see its lines), and "
                                "--images_without_objects=drop skips an image without objects")
            return Built(image, None, 0, tuple(set_aside), skipped)
        example = build_detection_example(image, placed, class_index, source_id=annotations.source_id,
                                          filename=display_path(ref.relpath), first_id=self.first_id,
                                          with_masks=self.instance_masks)
        return Built(image, example, len(placed.objects), tuple(set_aside),
                     classes=tuple(obj.class_name for obj in placed.objects))

    def _read_mask(self, path: str, reason: str, relpath: str, set_aside: list) -> bytes | None:
        """The bytes of a mask file (None for no path); one that cannot be read is `reason`, set aside."""
        if not path:
            return None
        try:
            return read_bytes(path, self.max_mask_bytes)
        except Exception as e:  # noqa: BLE001 - an unreadable mask is this image's problem, never the job's
            set_aside.append(Rejection(relpath, ANNOTATION, reason, f"{path}: not readable ({type(e).__name__}: {e})"))
            return None


def objects_tally(objects_written: int = 0, records_without_objects: int = 0, most: int = 0, split: str = "",
                  classes=()) -> dict:
    """A shard's objects tally; `classes`: ((class name, objects, records), ...) of its split `split`."""
    return {OBJECTS_WRITTEN: objects_written, RECORDS_WITHOUT_OBJECTS: records_without_objects, MOST_OBJECTS: most,
            CLASS_OBJECTS: {(split, name): objects for name, objects, _ in classes},
            CLASS_IMAGES: {(split, name): records for name, _, records in classes}}


def record_classes(names) -> list[tuple[str, int, int]]:
    """One record's class names of its objects -> ((class name, objects, 1), ...)."""
    return [(name, n, 1) for name, n in Counter(names).items()]


def add_class_counts(total: dict, classes) -> dict:
    """{class name: [objects, records]} `total` with `classes` ((class name, objects, records), ...) added in
    place."""
    for name, objects, records in classes:
        counts = total.setdefault(name, [0, 0])
        counts[0] += objects
        counts[1] += records
    return total


def per_class(tally: dict, key: str, class_names) -> dict[str, dict[str, int]]:
    """{split: {class name: count}} of a tally's CLASS_OBJECTS or CLASS_IMAGES, splits in SPLITS order, classes in
    id order (those of no object left out)."""
    counts = tally.get(key) or {}
    return {split: {name: counts[split, name] for name in class_names if counts.get((split, name))}
            for split in SPLITS if any(s == split for s, _ in counts)}


def add_detection_tallies(total: dict, more: dict) -> dict:
    """`total` with `more` added in place: a parser's tally (transforms.detection.parsing) or an objects tally;
    numbers summed, {reason: count} merged, the most objects of a record the larger."""
    most = max(total.get(MOST_OBJECTS, 0), more.get(MOST_OBJECTS, 0))
    add_tallies(total, {key: value for key, value in more.items() if key != MOST_OBJECTS})
    if MOST_OBJECTS in total or MOST_OBJECTS in more:
        total[MOST_OBJECTS] = most
    return total


def detection_section(tally: dict, annotations_rejected: Mapping[str, int], dropped: int, *, first_id: int,
                      instance_masks: bool, semantic_masks: bool, input_format: str, class_names=()) -> dict:
    """image_tfrecords.json's "detection" section: `tally` is the parsers' tally with the object tallies added
    (`add_detection_tallies`), `annotations_rejected` the errors.jsonl lines of stage 'annotation' per reason,
    `dropped` the images skipped as no_objects. A rejected semantic mask is not an annotation the parsers count:
    it is reported on its own (`semantic_masks_rejected`), and so is an instance mask set aside, whose objects are
    written with their boxes as masks (`instance_masks_rejected`, per reason). `images_per_class`: per split, the
    records holding at least one object of each class of `class_names` (the objects per class are the splits'
    class_counts: `per_class`)."""
    rejected = {reason: n for reason, n in sorted(annotations_rejected.items())
                if reason != BAD_SEMANTIC_MASK and reason not in INSTANCE_MASK_REASONS}
    section = {
        "first_id": first_id,
        "instance_masks": instance_masks,
        "semantic_masks": semantic_masks,
        "input_format": input_format,
        # an append's objects of images the dataset holds are not this run's to write: found = written + rejected
        "annotations": {"found": tally.get(FOUND, 0) - tally.get(ALREADY_IN_DATASET, 0),
                        "written": tally.get(OBJECTS_WRITTEN, 0), "rejected": rejected},
        "images_without_objects": {"kept": tally.get(RECORDS_WITHOUT_OBJECTS, 0), "dropped": dropped},
        "objects_per_image_max": tally.get(MOST_OBJECTS, 0),
        "images_per_class": per_class(tally, CLASS_IMAGES, class_names),
    }
    if annotations_rejected.get(BAD_SEMANTIC_MASK):
        section["semantic_masks_rejected"] = annotations_rejected[BAD_SEMANTIC_MASK]
    instance_masks_rejected = {reason: n for reason, n in sorted(annotations_rejected.items())
                               if reason in INSTANCE_MASK_REASONS and n}
    if instance_masks_rejected:
        section["instance_masks_rejected"] = instance_masks_rejected
    return section


def grown_section(base: dict, run: dict, class_names=None) -> dict:
    """The "detection" section of a dataset grown by an append: `base`, the dataset's section, and `run`, this run's
    (`detection_section`). As for the images (transforms.output.describe.grow), the objects written add up and the
    annotations rejected are this run's, as errors.jsonl lists them: found = the objects the dataset held + this
    run's found (but the objects of images it holds already) = written + rejected."""
    held = base.get("annotations", {}).get("written", 0)
    formats = [*dict.fromkeys([*str(base.get("input_format", "")).split("+"), run["input_format"]])]
    return {
        **run,
        "semantic_masks": bool(base.get("semantic_masks")) or run["semantic_masks"],
        "input_format": "+".join(name for name in formats if name),
        "annotations": {"found": held + run["annotations"]["found"], "written": held + run["annotations"]["written"],
                        "rejected": run["annotations"]["rejected"]},
        "images_without_objects": {"kept": base.get("images_without_objects", {}).get("kept", 0)
                                   + run["images_without_objects"]["kept"],
                                   "dropped": run["images_without_objects"]["dropped"]},
        "objects_per_image_max": max(base.get("objects_per_image_max", 0), run["objects_per_image_max"]),
        "images_per_class": _added_per_class(base.get("images_per_class") or {}, run.get("images_per_class") or {},
                                             class_names),
    }


def _added_per_class(base: dict, run: dict, class_names=None) -> dict:
    """{split: {class: count}} of the dataset and of this run, added (in `class_names`' order when given)."""
    added = {}
    for split in [*dict.fromkeys([*base, *run])]:
        counts = Counter(base.get(split) or {}) + Counter(run.get(split) or {})
        names = class_names or list(counts)
        added[split] = {name: counts[name] for name in names if counts[name]}
    return added


def annotations_problem(section: dict) -> str | None:
    """Why a description's annotations do not add up (found != written + rejected), else None."""
    annotations = section["annotations"]
    rejected = sum(annotations["rejected"].values())
    if annotations["found"] != annotations["written"] + rejected:
        return (f"{annotations['found']} annotations found, but {annotations['written']} written and {rejected} "
                f"rejected ({annotations['rejected']})")
    return None
