"""Plain rules that recognise an object-detection export (YOLO, Pascal VOC, COCO) from the names the launcher saw.

Such a folder holds images and files of boxes (or masks) beside them, not one folder per class: read as class
folders, a YOLO export became one class named `images`. The launcher refuses it instead
(`pipeline.plan.plan_dataset`), from what it lists anyway: the input's top folders, the split folders, and the
first entries of each folder it looks into (never the whole input). No bytes are read here.

One sign is not enough where a real dataset could show it: a class folder may be called `images` or `labels`.
An export is named only by a file that is its own (data.yaml, a COCO .json, VOC's Annotations/*.xml), or by two
signs together (images/ beside a labels/ of .txt files and no images; JPEGImages/ beside ImageSets/ or
SegmentationClass/).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from typing import NamedTuple

from transforms.base.dataset_format import split_of
from transforms.base.paths import IMAGE_EXTENSIONS

YOLO_FILES = ("data.yaml", "data.yml")  # Ultralytics' and Roboflow's dataset file: class names and the splits
_COCO_FILE = re.compile(r"(.*\.coco\.json|instances_.*\.json)", re.IGNORECASE)  # Roboflow's, COCO's own
VOC_FOLDERS = ("ImageSets", "SegmentationClass", "SegmentationObject")  # beside JPEGImages/


class Export(NamedTuple):
    """An object-detection export recognised: its kind ('YOLO', 'Pascal VOC', 'COCO') and what gave it away."""

    kind: str
    seen: str  # e.g. "train/labels/ holds YOLO box files (.txt) beside train/images/, and data.yaml"


def _folders_of(files: Iterable[str], folders: Iterable[str]) -> set[str]:
    """Every folder named, and every folder on the path of a file named (relative paths, '/'-separated)."""
    found = {f.strip("/") for f in folders if f.strip("/")}
    for path in files:
        parent = posixpath.dirname(path)
        while parent:
            found.add(parent)
            parent = posixpath.dirname(parent)
    return found


def _under(folder: str, files: list[str]) -> list[str]:
    return [f for f in files if f.startswith(folder + "/")]


def _is_image(path: str) -> bool:
    return posixpath.splitext(path)[1].lower() in IMAGE_EXTENSIONS


def _sibling(folder: str, name: str, folders: set[str]) -> str | None:
    """The folder called `name` (any letter case) beside `folder`, if it was seen."""
    parent = posixpath.dirname(folder)
    for other in folders:
        if posixpath.dirname(other) == parent and posixpath.basename(other).lower() == name.lower():
            return other
    return None


def _named(folders: set[str], name: str) -> list[str]:
    return sorted(f for f in folders if posixpath.basename(f) == name)


def _yolo(files: list[str], folders: set[str]) -> Export | None:
    signs = []  # (labels folder, images folder) pairs
    for labels in sorted(f for f in folders if posixpath.basename(f).lower() == "labels"):
        inside = _under(labels, files)
        images = _sibling(labels, "images", folders)
        if images and any(f.lower().endswith(".txt") for f in inside) and not any(map(_is_image, inside)):
            signs.append((labels, images))
    yaml = sorted(f for f in files if posixpath.basename(f).lower() in YOLO_FILES)
    if not signs and not yaml:
        return None
    seen = []
    if signs:
        signs.sort(key=lambda pair: (split_of(posixpath.basename(posixpath.dirname(pair[0]))) != "train", pair))
        labels, images = signs[0]
        more = f" (and {len(signs) - 1} more such folder{'s' if len(signs) > 2 else ''})" if len(signs) > 1 else ""
        seen.append(f"{labels}/ holds YOLO box files (.txt) beside {images}/{more}")
    return Export("YOLO", ", and ".join([*seen, *yaml[:1]]))


def _voc(files: list[str], folders: set[str]) -> Export | None:
    for boxes in _named(folders, "Annotations"):
        if any(f.lower().endswith(".xml") for f in _under(boxes, files)):
            beside = _sibling(boxes, "JPEGImages", folders)
            return Export("Pascal VOC", f"{boxes}/ holds Pascal VOC box files (.xml)"
                                        + (f" beside {beside}/" if beside else ""))
    for jpeg_images in _named(folders, "JPEGImages"):
        others = [s for s in (_sibling(jpeg_images, name, folders) for name in VOC_FOLDERS) if s]
        if others:
            return Export("Pascal VOC", f"{jpeg_images}/ sits beside {', '.join(o + '/' for o in others)}, Pascal "
                                        "VOC's folders")
    return None


def _coco(files: list[str]) -> Export | None:
    found = sorted(f for f in files if export_file(f) and posixpath.basename(f).lower() not in YOLO_FILES)
    if not found:
        return None
    more = f" (and {len(found) - 1} more like it)" if len(found) > 1 else ""
    return Export("COCO", f"{found[0]}{more} is a COCO annotation file (boxes and masks)")


def export_file(relpath: str) -> bool:
    """Whether the file is one an export alone has: data.yaml (YOLO), a COCO annotation file."""
    name = posixpath.basename(relpath)
    return name.lower() in YOLO_FILES or bool(_COCO_FILE.fullmatch(name))


def detection_export(files: Iterable[str], folders: Iterable[str] = ()) -> Export | None:
    """The object-detection export that `files` (relative paths of the files seen: images and others) and `folders`
    (relative paths of the folders seen) show, or None for anything else (class folders, split folders)."""
    files = sorted(set(files))
    seen = _folders_of(files, folders)
    return _yolo(files, seen) or _voc(files, seen) or _coco(files)


def detection_message(input_dir: str, export: Export) -> str:
    """The one line that refuses an object-detection export: what was seen, and what to do."""
    return (f"in --input_dir {input_dir}, {export.seen}: this is a {export.kind} object-detection export, not class "
            "folders; it holds boxes (or masks) around objects, not one class per image: give --task=detection to "
            "convert it into detection records (docs/detection.md); to classify whole images instead, arrange them "
            "as <class>/ folders (<input_dir>/<class>/<image>) or list each image with its class in a --manifest")
