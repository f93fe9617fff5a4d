"""ReadVoc: Pascal VOC (`Annotations/<id>.xml`, `JPEGImages/<id>.jpg`, optional `ImageSets/Main/{train,val,
trainval,test}.txt` and `SegmentationClass/<id>.png`, `SegmentationObject/<id>.png`) -> ImageAnnotations.

One XML per image, parsed on the workers in parallel. The image of `Annotations/<id>.xml` is the file of
`JPEGImages/` whose name without its extension is `<id>` (as VOC's own tools find it; the XML's `<filename>` is
not used). XML is parsed as untrusted input: no DOCTYPE (so no entity of any kind, internal or external: no
billion laughs, no file or URL read), at most MAX_XML_BYTES, at most MAX_OBJECTS objects. VOC's 1-based inclusive
pixel corners become the 0-based continuous ones of objects.py: (xmin - 1, ymin - 1, xmax, ymax).
"""

from __future__ import annotations

import posixpath
import xml.etree.ElementTree as ElementTree
from typing import NamedTuple
from xml.parsers import expat

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms.base.paths import name_bytes
from transforms.base.records import Rejection
from transforms.detection.objects import Annotation, AnnotationProblem, Box, ImageAnnotations
from transforms.detection.parsing import (
    BAD_ANNOTATION,
    BAD_ANNOTATION_FILE,
    CONFLICTING_SPLITS,
    COUNTS,
    IMAGES,
    PROBLEMS,
    READ_ERRORS,
    REJECTED,
    LayoutError,
    ListFolders,
    Unusable,
    found,
    has_file,
    listed_file,
    on_disk_entry,
    outputs_with_tally,
    read_problem,
    screen,
    settle,
    source_id_of,
    subfolders,
)
from transforms.inputs.listing import Entry
from transforms.inputs.rows import open_file

MAX_XML_BYTES = 4 << 20  # a VOC XML is a few KB; a bigger one is refused unread
MAX_OBJECTS = 10_000
ANNOTATIONS, IMAGES_DIR, SETS = "Annotations", "JPEGImages", "ImageSets/Main"
SEGMENTATION_CLASS, SEGMENTATION_OBJECT = "SegmentationClass", "SegmentationObject"
# ImageSets/Main's split files; trainval.txt is read only without train.txt and val.txt (it is their union)
SPLIT_FILES = {"train": "train", "val": "validation", "test": "test"}
MASK_WITHOUT_IMAGE = "mask_without_image"


class VocLayout(NamedTuple):
    root: str  # the folder that holds Annotations/ and JPEGImages/, relative to the input folder ('' for itself)
    split_files: tuple = ()  # ((split, relpath of its ImageSets/Main file), ...)
    masks: tuple = ()  # the segmentation folders there are: SegmentationClass, SegmentationObject


class VocError(ValueError):
    """An XML file that cannot be read as a VOC annotation (str: why, in a few words)."""


def _join(*parts: str) -> str:
    return "/".join(part.rstrip("/") for part in parts if part)


def find_voc(input_dir: str) -> VocLayout:
    """The VOC layout of a dataset folder, by a few names (no annotation read, no whole listing): the input folder
    itself, or the one folder below it (VOC2012/), or below VOCdevkit/, whose Annotations/ holds XML files.
    Raises LayoutError."""
    root = input_dir.rstrip("/")

    def is_voc(folder: str) -> bool:
        return has_file(_join(root, folder, ANNOTATIONS), ".xml")

    roots = [""] if is_voc("") else [
        folder for folder in [*subfolders(root), *(f"VOCdevkit/{f}" for f in subfolders(_join(root, "VOCdevkit")))]
        if folder != "VOCdevkit" and is_voc(folder)]
    if len(roots) != 1:
        raise LayoutError(f"{'no' if not roots else 'more than one'} Pascal VOC folder ({ANNOTATIONS}/*.xml beside "
                          f"{IMAGES_DIR}/) in {input_dir}" + (f": {', '.join(roots)}; give one of them as the input "
                                                              "folder" if roots else ""))
    voc = roots[0]
    sets = {name: _join(voc, SETS, f"{name}.txt") for name in (*SPLIT_FILES, "trainval")
            if FileSystems.exists(_join(root, voc, SETS, f"{name}.txt"))}
    if "trainval" in sets and ("train" in sets or "val" in sets):
        del sets["trainval"]
    split_files = tuple((SPLIT_FILES.get(name, "train"), relpath) for name, relpath in sorted(sets.items()))
    masks = tuple(name for name in (SEGMENTATION_CLASS, SEGMENTATION_OBJECT) if has_file(_join(root, voc, name),
                                                                                          ".png"))
    return VocLayout(voc, split_files, masks)


def parse_xml(data: bytes) -> ElementTree.Element:
    """The element tree of an untrusted XML text: expat, with any DOCTYPE refused (so no entity is declared,
    expanded or fetched) and nothing read from elsewhere. Raises VocError."""
    if len(data) > MAX_XML_BYTES:
        raise VocError(f"over {MAX_XML_BYTES >> 20} MiB, not a VOC annotation")
    builder = ElementTree.TreeBuilder()
    parser = expat.ParserCreate()

    def refuse(*_args):
        raise VocError("it declares a DOCTYPE or entities, which a VOC annotation never does")

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.ExternalEntityRefHandler = refuse
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartElementHandler = builder.start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    try:
        parser.Parse(data, True)
        return builder.close()
    except expat.ExpatError as e:
        raise VocError(f"not XML ({expat.ErrorString(e.code)}, line {e.lineno})") from None
    except AssertionError:  # TreeBuilder.close without a root element
        raise VocError("no root element") from None


def _text(element, path: str) -> str:
    child = element.find(path)
    return (child.text or "").strip() if child is not None else ""


def _number(element, path: str, where: str) -> float:
    text = _text(element, path)
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {path} is {text[:20]!r}, not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{where}: {path} is {text[:20]!r}, not a number")
    return value


def _flag(element, path: str) -> bool:
    return _text(element, path) in ("1", "true", "True")


def voc_objects(root: ElementTree.Element, xml_relpath: str):
    """(frame_size or None, [Annotation], [AnnotationProblem]) of a parsed VOC annotation."""
    if root.tag != "annotation":
        raise VocError(f"its root element is <{root.tag}>, not <annotation>")
    frame = None
    size = root.find("size")
    if size is not None:
        try:
            width, height = _number(size, "width", "size"), _number(size, "height", "size")
            frame = (int(width), int(height)) if width > 0 and height > 0 else None
        except ValueError:
            frame = None  # no usable size: the geometry takes the image's own
    objects, problems = [], []
    elements = root.findall("object")
    if len(elements) > MAX_OBJECTS:
        raise VocError(f"{len(elements)} objects, over {MAX_OBJECTS}")
    for number, element in enumerate(elements, 1):
        where = f"{xml_relpath}: object {number}"
        box = element.find("bndbox")
        try:
            if box is None:
                raise ValueError(f"{where}: no <bndbox>")
            xmin, ymin, xmax, ymax = (_number(box, k, where) for k in ("xmin", "ymin", "xmax", "ymax"))
        except ValueError as e:
            problems.append(AnnotationProblem(BAD_ANNOTATION, str(e)))
            continue
        objects.append(Annotation(_text(element, "name"), Box(xmin - 1, ymin - 1, xmax, ymax),
                                  difficult=_flag(element, "difficult"), truncated=_flag(element, "truncated"),
                                  where=where, instance=number))
    return frame, objects, problems


def _key(relpath: str, folder: str) -> bytes:
    """An image's id: its path below `folder` (Annotations/, JPEGImages/...) without its extension."""
    return name_bytes(posixpath.splitext(relpath[len(folder) + 1:])[0])


class _ParseXml(beam.DoFn):
    """An XML file's path -> (id, ('annotated', ImageAnnotations)) or (id, ('bad', why)); COUNTS."""

    def __init__(self, input_dir: str, layout: VocLayout, class_names):
        self._input_dir, self._layout, self._class_names = input_dir, layout, class_names

    def process(self, path: str):
        relpath = path[len(self._input_dir) + 1:]
        key = _key(relpath, _join(self._layout.root, ANNOTATIONS))
        try:
            with open_file(path) as raw:
                data = raw.read(MAX_XML_BYTES + 1)
            frame, objects, problems = voc_objects(parse_xml(data), relpath)
        except (VocError, *READ_ERRORS) as e:  # a transient read error fails the bundle (read_problem)
            why = f"does not parse: {e}" if isinstance(e, VocError) else f"cannot be read: {read_problem(e)}"
            yield found(0, 1)
            yield key, ("bad", f"{relpath} {why}")
            return
        yield found(len(objects) + len(problems), 1)
        # VOC's name for the image, until the join finds its file (with whatever extension it has)
        image = _join(self._layout.root, IMAGES_DIR, key.decode("utf-8", "surrogateescape") + ".jpg")
        kept, rejected = screen(objects, frame, self._class_names, image)
        yield key, ("annotated", ImageAnnotations(image, "", source_id_of(image), "", frame, kept,
                                                  tuple(p._replace(image=image) for p in problems) + rejected,
                                                  instances=len(objects) + len(problems)))


def voc_image(key, grouped: dict, masks: tuple):
    """One image id's XML, files, splits and masks -> settle's outputs (transforms.detection.parsing.settle),
    with the image's split from ImageSets and its masks' paths."""
    candidates = [value for kind, value in grouped["xml"] if kind == "annotated"]
    bad = [value for kind, value in grouped["xml"] if kind == "bad"]
    splits = sorted(set(grouped["split"]))
    on_disk = list(grouped["on_disk"])
    mask = dict(grouped["mask"])
    unusable = None
    if bad:
        unusable = Unusable(BAD_ANNOTATION_FILE, bad[0])
    elif len(splits) > 1:
        unusable = Unusable(CONFLICTING_SPLITS, f"ImageSets/Main lists the image in {' and '.join(splits)}")
    if not candidates and not on_disk and not bad:
        name = key.decode("utf-8", "surrogateescape")
        if splits:
            yield beam.pvalue.TaggedOutput(REJECTED, Rejection(name, "rejected", "missing_image",
                                                               f"ImageSets/Main lists {name}, which has no image"))
        for kind, path in mask.items():
            yield beam.pvalue.TaggedOutput(REJECTED, Rejection(path, "skipped", MASK_WITHOUT_IMAGE,
                                                               f"a {kind} mask of no image"))
        return
    if not on_disk and bad:  # a broken XML of an image that is not there either
        name = bad[0].split(" does not parse", 1)[0]
        yield beam.pvalue.TaggedOutput(REJECTED, Rejection(name, "rejected", BAD_ANNOTATION_FILE, bad[0]))
        return
    split = splits[0] if len(splits) == 1 else ""
    candidates = [c._replace(split=split, semantic_mask=mask.get(SEGMENTATION_CLASS, ""),
                             instance_mask=mask.get(SEGMENTATION_OBJECT, "")) for c in candidates]
    for item in settle(candidates, [d._replace(split=split, semantic_mask=mask.get(SEGMENTATION_CLASS, ""),
                                                instance_mask=mask.get(SEGMENTATION_OBJECT, "")) for d in on_disk],
                       unusable):
        if isinstance(item, ImageAnnotations):
            item = item._replace(source_id=source_id_of(item.relpath))
        yield item


def _split_line(line: str, split: str):
    name = line.strip().split(" ")[0] if line.strip() else ""
    if name:
        yield name_bytes(name), split


def _mask_entry(entry: Entry, input_dir: str, folder: str, kind: str):
    if entry.problem is None and entry.path.lower().endswith(".png"):
        yield _key(entry.path[len(input_dir) + 1:], folder), (kind, entry.path)


class ReadVoc(beam.PTransform):
    """PBegin -> {IMAGES, REJECTED, PROBLEMS, COUNTS} (transforms.detection.parsing) of the VOC folder `layout`
    (find_voc) below `input_dir`. `class_names`: when given, an object of another class is unknown_class.

    Images of JPEGImages/ without an XML are kept without objects; an XML that does not parse rejects its image
    (bad_annotation_file); an image in two of ImageSets/Main's split files is rejected (conflicting_splits).
    """

    def __init__(self, input_dir: str, layout: VocLayout, class_names=None):
        super().__init__()
        self._input_dir, self._layout = input_dir.rstrip("/"), layout
        self._class_names = None if class_names is None else frozenset(class_names)

    def expand(self, pbegin):
        input_dir, layout = self._input_dir, self._layout
        root = _join(input_dir, layout.root) if layout.root else input_dir
        images_folder = _join(layout.root, IMAGES_DIR)
        listed_xml = (pbegin
                      | "ListXml" >> ListFolders([_join(root, ANNOTATIONS)], input_dir)
                      # the XML files' paths; REJECTED: an entry the listing cannot use (a dangling link...)
                      | "XmlFiles" >> beam.FlatMap(listed_file, input_dir, ".xml").with_outputs(REJECTED,
                                                                                              main="paths"))
        xmls = (listed_xml.paths
                | "SpreadXml" >> beam.Reshuffle()
                # (id, ('annotated', ImageAnnotations) | ('bad', why)): every XML parsed where it lands
                | "ParseXml" >> beam.ParDo(_ParseXml(input_dir, layout, self._class_names)).with_outputs(
                    COUNTS, main="parsed"))
        listed = (pbegin
                  | "ListImages" >> ListFolders([_join(root, IMAGES_DIR)], input_dir)
                  | "ImagesOnDisk" >> beam.FlatMap(on_disk_entry, input_dir, "").with_outputs(REJECTED, main="images"))
        on_disk = listed.images | "KeyOnDisk" >> beam.Map(lambda image: (_key(image.relpath, images_folder), image))
        splits = [pbegin
                  | f"ReadSplit[{name}]" >> beam.io.ReadFromText(_join(input_dir, relpath))
                  | f"SplitIds[{name}]" >> beam.FlatMap(_split_line, split)
                  for split, relpath in layout.split_files for name in [posixpath.basename(relpath)]]
        split_ids = (splits or [pbegin | "NoSplits" >> beam.Create([])]) | "AllSplits" >> beam.Flatten()
        masks = [pbegin
                 | f"List[{kind}]" >> ListFolders([_join(root, kind)], input_dir)
                 | f"Masks[{kind}]" >> beam.FlatMap(_mask_entry, input_dir, _join(layout.root, kind), kind)
                 for kind in layout.masks]
        mask_ids = (masks or [pbegin | "NoMasks" >> beam.Create([])]) | "AllMasks" >> beam.Flatten()
        joined = ({"xml": xmls.parsed, "on_disk": on_disk, "split": split_ids, "mask": mask_ids}
                  | "JoinById" >> beam.CoGroupByKey()
                  | "Settle" >> beam.FlatMap(lambda item, m: voc_image(*item, m), layout.masks).with_outputs(
                      REJECTED, PROBLEMS, main=IMAGES))
        rejected = (listed_xml[REJECTED], listed[REJECTED], joined[REJECTED]) | "AllRejected" >> beam.Flatten()
        return outputs_with_tally(joined[IMAGES], rejected, joined[PROBLEMS], xmls[COUNTS])
