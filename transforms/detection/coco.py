"""ReadCoco: COCO instances JSON (Roboflow's `<split>/_annotations.coco.json` beside its images, or the classic
`annotations/instances_<name>.json` + `<name>/`) -> ImageAnnotations, streamed, never loaded whole.

Each annotation file is read once, as a stream (ijson's C backend, a chunk at a time: a 1 GB file converts in a
worker's memory), by one worker; what it holds is keyed by image id and grouped in the graph, so that all the
work after that one read is parallel. Category ids are the file's own (COCO's 1..90 with gaps, Roboflow's
supercategory 0 without annotations): only their names travel on; ids are assigned later. A file that does not
parse to its end (a truncated copy) rejects every image of its folder and every annotation read from it
(bad_annotation_file): a file read in part would keep images whose annotations were in the lost part.
"""

from __future__ import annotations

from typing import NamedTuple

import apache_beam as beam
import ijson
from apache_beam.io.filesystems import FileSystems

from transforms.base.paths import name_bytes
from transforms.base.records import Rejection
from transforms.detection.objects import Annotation, AnnotationProblem, Box, ImageAnnotations, Segmentation
from transforms.detection.parsing import (
    BAD_ANNOTATION,
    BAD_ANNOTATION_FILE,
    COUNTS,
    DUPLICATE_IMAGE,
    IMAGES,
    PROBLEMS,
    READ_ERRORS,
    REJECTED,
    UNKNOWN_CLASS,
    UNKNOWN_IMAGE,
    LayoutError,
    ListFolders,
    Unusable,
    finite,
    folder_split,
    found,
    join_relpath,
    on_disk_entry,
    outputs_with_tally,
    read_problem,
    screen,
    settle,
    source_id_of,
    subfolders,
)
from transforms.inputs.rows import TruncatedFile, open_file

try:  # ijson's C backend (yajl2_c, in its wheels): the pure-Python one is correct but about ten times slower
    IJSON = ijson.get_backend("yajl2_c")
except ImportError:  # pragma: no cover - a platform without ijson's wheel
    IJSON = ijson

ROBOFLOW_FILE = "_annotations.coco.json"
CHUNK_BYTES = 1 << 20  # read and parsed a buffer at a time: the memory of a read is a buffer and one item
CATEGORY_ITEMS, IMAGE_ITEMS, ANNOTATION_ITEMS = "categories.item", "images.item", "annotations.item"
_ITEMS = (CATEGORY_ITEMS, IMAGE_ITEMS, ANNOTATION_ITEMS)
CATEGORIES = "categories"
BAD_FILES = "bad_files"
DUPLICATES = "duplicates"  # (relpath key, Rejection): a second image entry of an id, set aside in the join


class CocoSource(NamedTuple):
    """One COCO annotation file and the folder its images' file names are relative to."""

    annotations: str  # full path of the JSON file
    images_rel: str  # the images' folder relative to the input folder ('' for the input folder itself)
    split: str  # from the folder's name ('' when it names none: the hash split)
    relpath: str = ""  # the JSON file relative to the input folder, for messages


class CocoError(ValueError):
    """An annotation file that is not complete, valid JSON."""


def _join(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}" if name else folder


def find_coco(input_dir: str) -> list[CocoSource]:
    """The COCO annotation files of a dataset folder, by a few names (no file read, no whole listing): Roboflow's
    `_annotations.coco.json` in the folder itself, else in each of its sub-folders (train/, valid/, test/), its
    images beside it; and the classic `annotations/instances_<name>.json`, its images in `<name>/`. Raises
    LayoutError when there is none."""
    root = input_dir.rstrip("/")
    sources = []
    if FileSystems.exists(_join(root, ROBOFLOW_FILE)):  # one folder: its images beside it, no sub-folders to read
        sources.append(CocoSource(_join(root, ROBOFLOW_FILE), "", "", ROBOFLOW_FILE))
    else:
        for folder in subfolders(root):
            relpath = f"{folder}/{ROBOFLOW_FILE}"
            if FileSystems.exists(_join(root, relpath)):
                sources.append(CocoSource(_join(root, relpath), folder, folder_split(folder), relpath))
    for meta in sorted(FileSystems.match([_join(root, "annotations/instances_*.json")])[0].metadata_list,
                       key=lambda m: m.path):
        name = meta.path.rsplit("/", 1)[-1]
        images = name.removeprefix("instances_").removesuffix(".json")
        sources.append(CocoSource(meta.path, images, folder_split(images), f"annotations/{name}"))
    if not sources:
        raise LayoutError(f"no COCO annotation file in {input_dir}: expected {ROBOFLOW_FILE} (in the folder or in "
                          "each split folder, as Roboflow exports) or annotations/instances_<name>.json with the "
                          "images in <name>/")
    return sources


def stream_coco(raw, prefix: str):
    """Every item of one of a COCO file's lists (`prefix`: 'categories.item', 'images.item' or
    'annotations.item'), streamed from `raw` (its bytes, a binary stream) by ijson's C backend a buffer at a
    time, numbers as ints and floats. (One pass per list: ijson's pull parser is four times faster than its
    push coroutines, which could split one pass among the three lists; the three passes run on any worker.)

    Raises:
        CocoError: the file is not JSON, or ends before its end (truncated).
    """
    try:
        yield from IJSON.items(raw, prefix, use_float=True, buf_size=CHUNK_BYTES)
    except ijson.JSONError as e:
        raise CocoError((str(e).strip().splitlines() or ["not JSON"])[0]) from None


def coco_box(value) -> Box:
    """COCO's [x, y, width, height] in pixels as (xmin, ymin, xmax, ymax). Raises ValueError."""
    if not isinstance(value, list) or len(value) != 4 or not finite(*value):
        raise ValueError(f"the bbox {str(value)[:60]} is not [x, y, width, height] in numbers")
    x, y, w, h = (float(v) for v in value)
    return Box(x, y, x + w, y + h)


def coco_segmentation(value) -> Segmentation | None:
    """A COCO segmentation: polygons ([[x0, y0, x1, y1, ...], ...]), an RLE ({'size': [h, w], 'counts': str or
    [int]}), or none ([] / missing). Raises ValueError for anything else."""
    if value is None or value == []:
        return None
    if isinstance(value, dict):
        size, counts = value.get("size"), value.get("counts")
        if not (isinstance(size, list) and len(size) == 2 and finite(*size)
                and (isinstance(counts, str) or (isinstance(counts, list) and finite(*counts)))):
            raise ValueError("the RLE segmentation is not {'size': [height, width], 'counts': ...}")
        return Segmentation(rle={"size": [int(v) for v in size], "counts": counts})
    if isinstance(value, list) and all(isinstance(p, list) for p in value):
        for polygon in value:
            if len(polygon) < 6 or len(polygon) % 2 or not finite(*polygon):
                raise ValueError("a polygon of the segmentation is not 3 or more x, y pairs of numbers")
        return Segmentation(polygons=tuple(tuple(float(v) for v in p) for p in value))
    raise ValueError("the segmentation is neither polygons nor an RLE")


def coco_annotation(item: dict, where: str) -> tuple[object, Annotation]:
    """(category id, Annotation without its class name) of an annotation entry. Raises ValueError."""
    if not isinstance(item, dict):
        raise ValueError("not a JSON object")
    box = coco_box(item.get("bbox"))
    segmentation = coco_segmentation(item.get("segmentation"))
    crowd = item.get("iscrowd", 0)
    if crowd not in (0, 1):  # True and False are 1 and 0
        raise ValueError(f"iscrowd is {str(crowd)[:20]}, not 0 or 1")
    area = item.get("area")
    if area is not None and not finite(area):
        raise ValueError(f"the area {str(area)[:20]} is not a number")
    return item.get("category_id"), Annotation("", box, is_crowd=bool(crowd), area=None if area is None else
                                               float(area), segmentation=segmentation, where=where)


def _id(value) -> str | None:
    """An image id as a key: ints and strings alike ('17' and 17 are one image); None for none."""
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def coco_image(item, source: CocoSource, input_dir: str) -> ImageAnnotations:
    """An image entry as an ImageAnnotations without objects. Raises ValueError for an entry without an id or
    a usable file_name."""
    if not isinstance(item, dict) or _id(item.get("id")) is None:
        raise ValueError("an image entry without an id")
    name = item.get("file_name")
    if not isinstance(name, str):
        raise ValueError(f"the image entry of id {_id(item['id'])} has no file_name")
    relpath = join_relpath(source.images_rel, name)
    width, height = item.get("width"), item.get("height")
    frame = (int(width), int(height)) if finite(width, height) and width > 0 and height > 0 else None
    image_id = _id(item["id"])
    return ImageAnnotations(relpath, _join(input_dir, relpath),
                            image_id if image_id.isdigit() else source_id_of(relpath), source.split, frame)


class _StreamCoco(beam.DoFn):
    """(index, CocoSource, list) -> ((index, image id), (kind, value)) for every image or annotation of the file;
    CATEGORIES: (index, category id, name); BAD_FILES: (index, why) for a file that does not parse to its end;
    PROBLEMS: an annotation that names no image; COUNTS: the annotations read.

    What goes into the grouping by image id is what the record needs, no more (every annotation of the export
    passes through that shuffle, and the local runner holds it in memory): an annotation's `where` without its
    file's name (`coco_entries` puts it back), and, without `segmentations`, no polygons or RLE (they are still
    checked: a malformed one is a bad_annotation either way)."""

    def __init__(self, input_dir: str, segmentations: bool = True):
        self._input_dir, self._segmentations = input_dir, segmentations

    def process(self, item):
        index, source, kind = item
        annotations = 0
        try:
            with open_file(source.annotations) as raw:
                for value in stream_coco(raw, kind):
                    if kind == ANNOTATION_ITEMS:
                        annotations += 1
                        yield from self._annotation(index, source, value, annotations)
                    elif kind == IMAGE_ITEMS:
                        yield from self._image(index, source, value)
                    elif isinstance(value, dict) and _id(value.get("id")) is not None:
                        name = value.get("name")
                        yield beam.pvalue.TaggedOutput(CATEGORIES, (index, _id(value["id"]),
                                                                    name if isinstance(name, str) else None))
        except (CocoError, TruncatedFile) as e:
            yield beam.pvalue.TaggedOutput(BAD_FILES, (index, f"{source.relpath} does not parse: {e}"))
        except READ_ERRORS as e:  # a transient error fails the bundle (read_problem): the runner reads it again
            yield beam.pvalue.TaggedOutput(BAD_FILES, (index, f"{source.relpath} cannot be read: {read_problem(e)}"))
        if kind == ANNOTATION_ITEMS:
            yield found(annotations, 1)

    def _annotation(self, index, source, value, number):
        ann_id = value.get("id") if isinstance(value, dict) else None
        place = f"annotation id {ann_id}" if ann_id is not None else f"annotation number {number}"
        where = f"{source.relpath}: {place}"
        image_id = _id(value.get("image_id")) if isinstance(value, dict) else None
        if image_id is None:
            yield beam.pvalue.TaggedOutput(PROBLEMS, AnnotationProblem(BAD_ANNOTATION, f"{where}: no image_id"))
            return
        try:
            category, obj = coco_annotation(value, place)  # its file's name is put back by coco_entries
        except ValueError as e:
            yield (index, image_id), ("problem", AnnotationProblem(BAD_ANNOTATION, f"{where}: {e}"))
            return
        if not self._segmentations:
            obj = obj._replace(segmentation=None)
        yield (index, image_id), ("annotation", (category, obj))

    def _image(self, index, source, value):
        try:
            image = coco_image(value, source, self._input_dir)
        except ValueError as e:
            image_id = _id(value.get("id")) if isinstance(value, dict) else None
            if image_id is None:
                yield beam.pvalue.TaggedOutput(REJECTED, Rejection(source.relpath, "rejected", BAD_ANNOTATION,
                                                                   f"{source.relpath}: {e}"))
            else:
                yield (index, image_id), ("bad_image", f"{source.relpath}: {e}")
            return
        yield (index, _id(value["id"])), ("image", image)


def coco_entries(key, values, categories: dict, bad_files: dict, sources: list[CocoSource], class_names=None):
    """One image id's entries -> (relpath key, ImageAnnotations) for the join with the files on disk, or
    PROBLEMS: annotations whose image entry is missing or unusable, or whose file does not parse; DUPLICATES:
    (relpath key, Rejection) for the files of the id's second image entries."""
    index, image_id = key
    source = sources[index]
    images, objects, problems, bad_image = [], [], [], None
    for kind, value in values:
        if kind == "image":
            images.append(value)
        elif kind == "bad_image":
            bad_image = value
        elif kind == "problem":
            problems.append(value)
        else:
            category, obj = value
            obj = obj._replace(where=f"{source.relpath}: {obj.where}")  # _StreamCoco left its file's name out
            name = categories.get((index, _id(category)))
            if name is None:
                problems.append(AnnotationProblem(UNKNOWN_CLASS, f"{obj.where}: the category_id {category} is not "
                                                                 f"among the categories of {source.relpath}"))
            else:
                objects.append(obj._replace(class_name=name))
    if not images:
        if index in bad_files:
            reason, detail = BAD_ANNOTATION_FILE, bad_files[index]
        elif bad_image:
            reason, detail = BAD_ANNOTATION, bad_image
        else:
            reason, detail = UNKNOWN_IMAGE, f"no image entry of {source.relpath} has the id {image_id}"
        for obj in objects:
            yield beam.pvalue.TaggedOutput(PROBLEMS, AnnotationProblem(reason, f"{obj.where}: {detail}"))
        for problem in problems:
            yield beam.pvalue.TaggedOutput(PROBLEMS, problem)
        return
    first, *others = sorted(images, key=lambda image: image.relpath)
    kept, rejected = screen(objects, first.frame_size, class_names, first.relpath)
    attached = tuple(p._replace(image=first.relpath) for p in problems) + rejected
    yield name_bytes(first.relpath), first._replace(objects=kept, problems=attached)
    for image in others:  # one id, two image entries: the first (by file name) is read; the other file is set
        # aside in the join with the files on disk (where it would else be an image without an entry)
        yield beam.pvalue.TaggedOutput(DUPLICATES, (name_bytes(image.relpath), Rejection(
            image.relpath, "rejected", DUPLICATE_IMAGE,
            f"{source.relpath}: a second image entry of id {image_id}, whose first ({first.relpath}) is read")))


def _deepest(relpath: str, folders: list[str]) -> int:
    """The index in `folders` (relative to the input folder, '' for itself) of the deepest that holds `relpath`."""
    best, depth = 0, -1
    for index, folder in enumerate(folders):
        if (not folder or relpath.startswith(folder + "/")) and len(folder) > depth:
            best, depth = index, len(folder)
    return best


def _on_disk(entry, input_dir: str, sources: list[CocoSource], ignore: frozenset):
    source = sources[_deepest(entry.path[len(input_dir) + 1:], [s.images_rel for s in sources])]
    yield from on_disk_entry(entry, input_dir, source.split, ignore)


def _settle(item, bad_files: dict, sources: list[CocoSource]):
    """One file name's outputs from its annotation entries, its file on disk, and the second image entries of
    another id that name it (`duplicate`): a file only such entries name is one duplicate_image rejection
    (never also kept as an image without objects); a file with an entry of its own is read for that entry."""
    _, grouped = item
    candidates, on_disk, duplicates = (list(grouped["annotated"]), list(grouped["on_disk"]),
                                       sorted(grouped["duplicate"], key=lambda rejection: rejection.detail))
    relpath = (on_disk or candidates or duplicates)[0].relpath
    index = _deepest(relpath, [source.images_rel for source in sources])
    unusable = Unusable(BAD_ANNOTATION_FILE, bad_files[index]) if index in bad_files else None
    if duplicates and not candidates:
        yield beam.pvalue.TaggedOutput(REJECTED, duplicates[0] if unusable is None else
                                       Rejection(relpath, "rejected", *unusable))
        return
    yield from settle(candidates, on_disk, unusable)


class ReadCoco(beam.PTransform):
    """PBegin -> {IMAGES: ImageAnnotations, REJECTED: Rejection, PROBLEMS: AnnotationProblem, COUNTS: one dict}
    (transforms.detection.parsing) of the COCO files `sources` (find_coco) below `input_dir`, and CATEGORIES:
    one dict {(file index, category id): name}.

    `class_names`: when given, an annotation of another class is unknown_class; else every category's name is
    a class. `segmentations`: whether the annotations' polygons and RLEs are carried on (--instance_masks).
    Images in an annotation file's image folder that no entry names are kept without objects.
    """

    def __init__(self, input_dir: str, sources: list[CocoSource], class_names=None, segmentations: bool = True):
        super().__init__()
        self._input_dir, self._sources = input_dir.rstrip("/"), list(sources)
        self._class_names = None if class_names is None else frozenset(class_names)
        self._segmentations = segmentations

    def expand(self, pbegin):
        sources, input_dir = self._sources, self._input_dir
        streamed = (pbegin
                    | "AnnotationFiles" >> beam.Create([(i, s, kind) for i, s in enumerate(sources) for kind in _ITEMS])
                    | "SpreadFiles" >> beam.Reshuffle()
                    # ((file index, image id), (kind, value)): one streaming read per file and list
                    | "StreamCoco" >> beam.ParDo(_StreamCoco(input_dir, self._segmentations)).with_outputs(
                        CATEGORIES, BAD_FILES, PROBLEMS, REJECTED, COUNTS, main="entries"))
        # {(file index, category id): name}, and {file index: why it does not parse}: a few entries each
        categories = (streamed[CATEGORIES]
                      | "CategoryList" >> beam.combiners.ToList()
                      | "Categories" >> beam.Map(lambda items: {(i, c): n for i, c, n in items if n is not None}))
        bad_files = (streamed[BAD_FILES]
                     | "BadFileList" >> beam.combiners.ToList()
                     | "BadFiles" >> beam.Map(dict))
        bad = beam.pvalue.AsSingleton(bad_files)
        per_image = (streamed.entries
                     | "GroupByImageId" >> beam.GroupByKey()
                     # (relpath bytes, ImageAnnotations): each image with its named, screened objects
                     | "ImageObjects" >> beam.FlatMap(
                         lambda item, cats, bad, srcs, names: coco_entries(*item, cats, bad, srcs, names),
                         beam.pvalue.AsSingleton(categories), bad, sources, self._class_names
                     ).with_outputs(PROBLEMS, DUPLICATES, main="annotated"))
        ignore = frozenset(source.relpath for source in sources)
        folders = sorted({_join(input_dir, source.images_rel) for source in sources})
        listed = (pbegin
                  | "ListImages" >> ListFolders(folders, input_dir)
                  # ImageAnnotations without objects for every image file found; REJECTED for what is not one
                  | "ImagesOnDisk" >> beam.FlatMap(_on_disk, input_dir, sources, ignore).with_outputs(
                      REJECTED, main="images"))
        on_disk = listed.images | "KeyOnDisk" >> beam.Map(lambda image: (name_bytes(image.relpath), image))
        joined = ({"annotated": per_image.annotated, "on_disk": on_disk, "duplicate": per_image[DUPLICATES]}
                  | "JoinFiles" >> beam.CoGroupByKey()
                  | "Settle" >> beam.FlatMap(_settle, bad, sources).with_outputs(REJECTED, PROBLEMS, main=IMAGES))
        rejected = ((streamed[REJECTED], listed[REJECTED], joined[REJECTED])
                    | "AllRejected" >> beam.Flatten())
        problems = ((streamed[PROBLEMS], per_image[PROBLEMS], joined[PROBLEMS]) | "AllProblems" >> beam.Flatten())
        # CATEGORIES: one dict {(file index, category id): name} of the files' categories (the class ids' order)
        return {**outputs_with_tally(joined[IMAGES], rejected, problems, streamed[COUNTS]), CATEGORIES: categories}

