"""What the four annotation parsers (COCO, Pascal VOC, YOLO, CSV/JSONL boxes) share: their outputs' tags, the
reasons of their rejections, the listing of an image folder, the join of annotations with the files on disk,
and the accounting (annotations found = kept + rejected, per reason).

Every parser's PTransform gives the same outputs:
- the main one (IMAGES): ImageAnnotations of every image kept, with the objects it kept and the problems of the
  annotations it set aside (ImageAnnotations.problems);
- REJECTED: Rejection of every image (or annotation file) that is not in the dataset, with its reason;
- PROBLEMS: AnnotationProblem of every annotation that belongs to no kept image (its image is missing, its
  annotation file is broken, it names no image);
- COUNTS: one dict, the tally (`Tally`): annotations found by the parser as it read them, against the
  annotations kept and rejected (per reason), and the images kept, without objects and rejected.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import posixpath
import re
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from google.api_core.exceptions import GoogleAPICallError

from transforms.base import counters
from transforms.base.dataset_format import split_of
from transforms.base.paths import is_local
from transforms.base.records import Rejection
from transforms.base.transient import describe, is_transient
from transforms.detection.objects import AnnotationProblem, Box, ImageAnnotations
from transforms.inputs.listing import (
    PARTS,
    Entry,
    Folder,
    classify,
    list_folder_or_parts,
    list_folder_part,
    list_top,
)
from transforms.labels.layout import class_name_problem

IMAGES = "images"
REJECTED = "rejected"
PROBLEMS = "problems"
COUNTS = "counts"

# Reasons (machine-readable, in errors.jsonl) of an annotation or an image set aside by a parser.
UNKNOWN_CLASS = "unknown_class"  # a class the dataset's class list does not have (COCO category, YOLO id, labels)
BAD_CLASS_NAME = "bad_class_name"  # a class name labels.txt cannot hold (a line break, not UTF-8, ...)
BOX_OUTSIDE_IMAGE = "box_outside_image"  # a box with nothing inside the frame its annotation file declares
MISSING_IMAGE = "missing_image"  # an annotation (or a label file) whose image file is not there
BAD_ANNOTATION = "bad_annotation"  # an annotation that cannot be read (a bbox that is not 4 numbers, ...)
BAD_ANNOTATION_FILE = "bad_annotation_file"  # an annotation file that does not parse (its images are rejected)
UNKNOWN_IMAGE = "unknown_image"  # a COCO annotation whose image_id no image entry has
DUPLICATE_IMAGE = "duplicate_image"  # a second annotation entry, or a second file, for one image
CONFLICTING_SPLITS = "conflicting_splits"  # an image that its dataset puts in two splits
CONFLICTING_ROWS = "conflicting_rows"  # box rows of one image that disagree on its split, size or unit
AMBIGUOUS_BOX_UNIT = "ambiguous_box_unit"  # a CSV/JSONL box in [0, 1] without a unit: pixels or fractions?

# The tally's keys (COUNTS): found is what the parsers read; kept + rejected must add up to it.
FOUND = "annotations_found"
KEPT = "annotations_kept"
ANNOTATIONS_REJECTED = "annotations_rejected"  # {reason: count}
IMAGES_KEPT = "images"
WITHOUT_OBJECTS = "images_without_objects"
IMAGES_REJECTED = "images_rejected"  # {reason: count}
FILES_READ = "annotation_files"  # annotation files read (COCO JSON, VOC XML, YOLO label files, the box file)
_NESTED = (ANNOTATIONS_REJECTED, IMAGES_REJECTED)


class LayoutError(ValueError):
    """A dataset folder that is not of the format it was read as: one line that says what is wrong and what to
    do (the launcher turns it into its UserError)."""


# -- the launcher's look at a dataset folder: a few names, never a whole listing -----------------------------------

TOP_ENTRIES = 1000  # the entries of a dataset's top folder looked at for its sub-folders (VOC2012/, ...)


def has_file(folder: str, suffix: str = "") -> bool:
    """Whether `folder` holds a file whose name ends with `suffix`, found from the first names only (a local
    folder is read lazily, a gs:// one a page at a time): never a whole listing of a large folder."""
    if is_local(folder):
        try:
            with os.scandir(folder) as listing:
                return any(entry.name.endswith(suffix) and entry.is_file() for entry in listing)
        except OSError:
            return False
    return bool(FileSystems.match([f"{folder.rstrip('/')}/*{suffix}"], [1])[0].metadata_list)


def subfolders(folder: str) -> list[str]:
    """The names of the folders directly in `folder`, among its first TOP_ENTRIES entries (none when there is no
    such folder)."""
    try:
        items = list(itertools.islice(list_top(folder, False, 1), TOP_ENTRIES))
    except FileNotFoundError:
        return []
    return sorted(posixpath.basename(item.path.rstrip("/")) for item in items if isinstance(item, Folder))


def listed_file(entry: Entry, input_dir: str, suffix: str):
    """An annotation folder's listed entry: its full path for a file ending with `suffix` (another file is not
    an annotation file, and is passed over), a REJECTED Rejection for an entry the listing cannot use."""
    if entry.problem is not None:
        result = classify(entry, input_dir)
        yield beam.pvalue.TaggedOutput(REJECTED, result)
    elif entry.path.lower().endswith(suffix):
        yield entry.path


# -- plain functions -------------------------------------------------------------------------------------------------

# What reading an annotation file raises when the file is missing or unreadable: locally an OSError, on Cloud
# Storage also google-cloud-storage's 403 and 404 (no OSError). The file's problem (bad_annotation_file), unless
# transient (`read_problem`).
READ_ERRORS = (OSError, GoogleAPICallError)


def read_problem(error: BaseException) -> str:
    """Why an annotation file could not be read (one of READ_ERRORS), for its images' bad_annotation_file lines.

    Raises:
        `error` itself when it is transient (a 429 or 5xx, a reset connection, a timeout), as an image's read
        does: not the file's fault, so the bundle fails and the runner tries it again, rather than every image
        of the file (a COCO file: a whole split) being rejected for a moment's network trouble.
    """
    if is_transient(error):
        raise error
    return describe(error) if isinstance(error, GoogleAPICallError) else str(error)



def source_id_of(relpath: str) -> str:
    """A number as text, stable across runs, for a format that gives no image id (VOC, YOLO, boxes): the first 63
    bits of the SHA-256 of the image's relative path (two of 100 million images share one with a chance of about
    1 in 2,000; the OD API's evaluation is the only reader that needs them distinct)."""
    digest = hashlib.sha256(relpath.encode("utf-8", "surrogateescape")).digest()
    return str(int.from_bytes(digest[:8], "big") >> 1)


def folder_split(name: str) -> str:
    """The split a dataset's folder or file name stands for ('valid' -> 'validation', 'train2017' -> 'train',
    'instances_val2017' -> 'validation'), '' for none (the usual hash split then decides)."""
    name = name.rsplit("/", 1)[-1]
    for candidate in (name, re.sub(r"\d+$", "", name), re.sub(r"^instances_|\d+$", "", name)):
        split = split_of(candidate.rstrip("_-. ")) if candidate else None
        if split:
            return split
    return ""


def join_relpath(folder: str, name: str) -> str:
    """`name` (a file name an annotation file gives, maybe with folders) below `folder` ('' for the input folder),
    '/'-separated and normal. Raises ValueError for a name that leads out of the folder ('..') or is absolute."""
    name = name.replace("\\", "/")
    if not name or name.startswith("/") or re.match(r"^[A-Za-z]:/", name):
        raise ValueError(f"the file name {name!r} is empty or absolute: give it relative to its image folder")
    normal = posixpath.normpath(name)
    if normal == ".." or normal.startswith("../") or normal == ".":
        raise ValueError(f"the file name {name!r} leads out of its image folder")
    return f"{folder}/{normal}" if folder else normal


def finite(*values) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def outside(box: Box, frame: tuple[float, float] | None) -> bool:
    """Whether a box has nothing inside the frame (width, height) its annotation declares: clearly outside the
    image, not merely overflowing an edge (the geometry clips those)."""
    if frame is None:
        return False
    width, height = frame
    return box.xmax <= 0 or box.ymax <= 0 or box.xmin >= width or box.ymin >= height


def screen(objects, frame: tuple[float, float] | None, class_names=None, image: str = ""):
    """(the objects kept, AnnotationProblems of the others): a class name labels.txt cannot hold, a class that
    `class_names` (when given) does not have, a box outside the declared frame."""
    kept, problems = [], []
    for obj in objects:
        where = obj.where or image
        problem = class_name_problem(obj.class_name) if obj.class_name else "an empty name"
        if problem:
            problems.append(AnnotationProblem(BAD_CLASS_NAME, f"{where}: the class name {obj.class_name!r} has "
                                                              f"{problem}: rename it", image))
        elif class_names is not None and obj.class_name not in class_names:
            problems.append(AnnotationProblem(UNKNOWN_CLASS, f"{where}: the class {obj.class_name!r} is not in the "
                                                             "class list", image))
        elif outside(obj.box, frame):
            problems.append(AnnotationProblem(
                BOX_OUTSIDE_IMAGE, f"{where}: the box {tuple(round(v, 3) for v in obj.box)} is outside the image "
                                   f"({frame[0]} x {frame[1]})", image))
        else:
            kept.append(obj)
    return tuple(kept), tuple(problems)


def problems_of(image: ImageAnnotations, reason: str, detail: str) -> list[AnnotationProblem]:
    """Every annotation of an image set aside (its objects as `reason`, its problems as they are)."""
    name = image.relpath
    return [*(AnnotationProblem(reason, f"{obj.where or name}: {detail}", name) for obj in image.objects),
            *image.problems]


class Unusable(NamedTuple):
    """Why every image and annotation of one key is set aside (a broken annotation file, two splits)."""

    reason: str
    detail: str


def settle(candidates, on_disk, unusable: Unusable | None = None):
    """One image's outputs from what its annotation files say (`candidates`: ImageAnnotations, any number) and
    the files found for it on disk (`on_disk`: ImageAnnotations without objects, one per file, their split from
    their folder): the kept ImageAnnotations, and REJECTED / PROBLEMS tagged outputs.

    An image on disk without an annotation entry is kept without objects; an entry without its file is a
    missing_image (each of its annotations too); a second entry or a second file for one image is a
    duplicate_image; with `unusable`, nothing is kept."""
    candidates = sorted(candidates, key=_id_order)
    on_disk = sorted(on_disk, key=lambda image: image.relpath)
    if unusable is not None:
        for image in on_disk or candidates[:1]:
            yield beam.pvalue.TaggedOutput(REJECTED, Rejection(image.relpath, "rejected", *unusable))
        for image in candidates:
            yield from _tagged(PROBLEMS, problems_of(image, unusable.reason, unusable.detail))
        return
    if not on_disk:
        for image in candidates:
            detail = f"the image file {image.relpath} is not there"
            yield beam.pvalue.TaggedOutput(REJECTED, Rejection(image.relpath, "rejected", MISSING_IMAGE, detail))
            yield from _tagged(PROBLEMS, problems_of(image, MISSING_IMAGE, detail))
        return
    found, *others = on_disk
    for image in others:
        yield beam.pvalue.TaggedOutput(REJECTED, Rejection(
            image.relpath, "rejected", DUPLICATE_IMAGE,
            f"another file for the same image: {found.relpath} is read, one file per annotated image"))
    if not candidates:
        yield found
        return
    first, *again = candidates
    for image in again:
        detail = (f"a second annotation entry (id {image.source_id}) for the image {found.relpath}, whose first "
                  f"(id {first.source_id}) is read")
        yield beam.pvalue.TaggedOutput(REJECTED, Rejection(image.relpath, "rejected", DUPLICATE_IMAGE, detail))
        yield from _tagged(PROBLEMS, problems_of(image, DUPLICATE_IMAGE, detail))
    yield first._replace(relpath=found.relpath, path=found.path, split=first.split or found.split, size=found.size)


def _id_order(image: ImageAnnotations):
    return (0, int(image.source_id), "") if image.source_id.isdigit() else (1, 0, image.source_id)


def _tagged(tag: str, items):
    for item in items:
        yield beam.pvalue.TaggedOutput(tag, item)


def on_disk_entry(entry: Entry, input_dir: str, split: str, ignore: frozenset = frozenset()):
    """A listed file of an image folder: an ImageAnnotations without objects (its split `split`) for an image,
    a Rejection for what the listing cannot use or skips by name; nothing for a file of `ignore` (relpaths of
    the annotation files that live among the images, as Roboflow's _annotations.coco.json)."""
    result = classify(entry, input_dir)
    if isinstance(result, Rejection):
        if result.relpath not in ignore:
            yield beam.pvalue.TaggedOutput(REJECTED, result)
        return
    yield ImageAnnotations(result.relpath, result.path, source_id_of(result.relpath), split, size=result.size)


class ListFolders(beam.PTransform):
    """PBegin -> Entry of every file below each of `folders` (full paths), each folder on whichever worker gets it
    (transforms.inputs.listing.list_folder_or_parts: local or gs://, symlink loops and unreadable entries as
    problems). A local folder is walked whole, streamed; a gs:// one is listed there for its first
    SMALL_FOLDER_PAGES pages, and the rest of a long one (a COCO export's train/ of millions of images) is cut
    into FolderParts that any worker lists, as ListImages does with a class folder."""

    def __init__(self, folders: list[str], input_dir: str):
        super().__init__()
        self._folders, self._input_dir = list(folders), input_dir

    def expand(self, pbegin):
        listed = (pbegin
                  | "Folders" >> beam.Create(self._folders)
                  | "SpreadFolders" >> beam.Reshuffle()
                  # Entry, streamed from each folder's walk or first pages; FolderPart of the rest of a long gs://
                  # folder, on PARTS
                  | "ListFolder" >> beam.FlatMap(lambda folder, root: list_folder_or_parts(Folder(folder), root),
                                                 self._input_dir).with_outputs(PARTS, main="entries"))
        if is_local(self._input_dir):  # a local folder is walked whole: it is never cut into parts
            return listed.entries
        parts = (listed[PARTS]
                 | "SpreadParts" >> beam.Reshuffle()
                 # Entry of each part of a long gs:// folder, on whichever worker gets it
                 | "ListParts" >> beam.FlatMap(list_folder_part))
        return (listed.entries, parts) | "AllEntries" >> beam.Flatten()


# -- the accounting ------------------------------------------------------------------------------------------------


def empty_tally() -> dict:
    return {FOUND: 0, KEPT: 0, ANNOTATIONS_REJECTED: {}, IMAGES_KEPT: 0, WITHOUT_OBJECTS: 0, IMAGES_REJECTED: {},
            FILES_READ: 0}


def add_tallies(total: dict, more: dict) -> dict:
    """`total` with `more` added (in place): numbers summed, {reason: count} dicts merged."""
    for key, value in more.items():
        if isinstance(value, dict):
            into = total.setdefault(key, {})
            for reason, count in value.items():
                into[reason] = into.get(reason, 0) + count
        else:
            total[key] = total.get(key, 0) + value
    return total


def tally_of(item) -> dict:
    """What one output element adds to the tally: an ImageAnnotations (kept, its objects and problems), a
    Rejection (an image), an AnnotationProblem, or a parser's own dict (found, files read)."""
    if isinstance(item, dict):
        return item
    if isinstance(item, ImageAnnotations):
        rejected = {}
        for problem in item.problems:
            rejected[problem.reason] = rejected.get(problem.reason, 0) + 1
        return {KEPT: len(item.objects), ANNOTATIONS_REJECTED: rejected, IMAGES_KEPT: 1,
                WITHOUT_OBJECTS: 0 if item.objects else 1}
    if isinstance(item, AnnotationProblem):
        return {ANNOTATIONS_REJECTED: {item.reason: 1}}
    if isinstance(item, Rejection):
        return {IMAGES_REJECTED: {item.reason: 1}}
    raise TypeError(f"not an element of a parser's outputs: {type(item).__name__}")


def tally_problem(tally: dict) -> str | None:
    """Why a tally does not add up (annotations found != kept + rejected), else None."""
    rejected = sum(tally.get(ANNOTATIONS_REJECTED, {}).values())
    if tally.get(FOUND, 0) != tally.get(KEPT, 0) + rejected:
        return (f"{tally.get(FOUND, 0)} annotations found, but {tally.get(KEPT, 0)} kept and {rejected} rejected "
                f"({tally.get(ANNOTATIONS_REJECTED, {})})")
    return None


def found(annotations: int, files: int = 0):
    """A parser's count of what it read, as a COUNTS element; the same in Beam counters."""
    if annotations:
        counters.inc(FOUND, annotations)
    if files:
        counters.inc(FILES_READ, files)
    return beam.pvalue.TaggedOutput(COUNTS, {FOUND: annotations, FILES_READ: files})


class SumTallies(beam.CombineFn):
    """Tally dicts -> their sum (one dict, with every key even when nothing was read)."""

    def create_accumulator(self):
        return empty_tally()

    def add_input(self, accumulator, item):
        return add_tallies(accumulator, item)

    def merge_accumulators(self, accumulators):
        total = empty_tally()
        for accumulator in accumulators:
            add_tallies(total, accumulator)
        return total

    def extract_output(self, accumulator):
        return accumulator


def _count_outcome(item):
    tally = tally_of(item)
    for key in (KEPT, IMAGES_KEPT, WITHOUT_OBJECTS):
        if tally.get(key):
            counters.inc(key, tally[key])
    for key in _NESTED:
        for reason, count in tally.get(key, {}).items():
            counters.inc(f"{key}_{reason}", count)
    return tally


class Tally(beam.PTransform):
    """{IMAGES, REJECTED, PROBLEMS, COUNTS} PCollections -> one dict: the parser's counts of what it read, and
    what became of it (`tally_problem` says whether it adds up); each outcome counted in Beam counters too.

    Each outcome is made its tally where it is produced and summed there (a lifted combine): only one dict per
    bundle leaves, never the ImageAnnotations themselves, which a Flatten of the outcomes would hold whole in the
    local runner's memory (benchmarks/detection_memory.py)."""

    def expand(self, outputs):
        sums = [outputs[tag]
                | f"Count{name}" >> beam.Map(_count_outcome)
                | f"Sum{name}" >> beam.CombineGlobally(SumTallies()).without_defaults()  # SumCounts' is the one
                for tag, name in ((IMAGES, "Images"), (REJECTED, "Rejected"), (PROBLEMS, "Problems"))]
        return ((*sums, outputs[COUNTS])
                | "AllCounts" >> beam.Flatten()
                | "SumCounts" >> beam.CombineGlobally(SumTallies()))


def outputs_with_tally(images, rejected, problems, counts) -> dict:
    """The four outputs of a parser's PTransform, COUNTS summed into its one tally dict."""
    outputs = {IMAGES: images, REJECTED: rejected, PROBLEMS: problems, COUNTS: counts}
    return {**outputs, COUNTS: outputs | "Tally" >> Tally()}

