"""ReadYolo: a YOLO / Ultralytics export (`data.yaml` with `names` and `train:`/`val:`/`test:` image folders;
`<...>/images/<...>` beside `<...>/labels/<...>.txt`, one `class cx cy w h` line per box, normalised, or
`class x1 y1 x2 y2 ...` per polygon) -> ImageAnnotations.

The label file of an image is the image's path with its last `/images/` made `/labels/` and its extension
`.txt`, as Ultralytics' img2label_paths (ultralytics/data/utils.py) finds it. Coordinates are fractions of the
image as Ultralytics reads it, with its EXIF orientation applied: its loader reads images with cv2.imread /
cv2.imdecode, which apply the orientation, and verify_image_label checks labels against exif_size(), the size
after a 90-degree EXIF rotation (ultralytics/data/utils.py). So ImageAnnotations.frame is 'upright'.
"""

from __future__ import annotations

import math
import posixpath
from typing import NamedTuple

import apache_beam as beam
import yaml

from transforms.base.paths import name_bytes
from transforms.base.records import Rejection
from transforms.detection.objects import Annotation, AnnotationProblem, Box, Segmentation
from transforms.detection.parsing import (
    BAD_ANNOTATION,
    COUNTS,
    DUPLICATE_IMAGE,
    IMAGES,
    MISSING_IMAGE,
    PROBLEMS,
    READ_ERRORS,
    REJECTED,
    UNKNOWN_CLASS,
    LayoutError,
    ListFolders,
    found,
    has_file,
    listed_file,
    on_disk_entry,
    outputs_with_tally,
    read_problem,
    screen,
)
from transforms.inputs.rows import open_file

DATA_YAML = "data.yaml"
MAX_YAML_BYTES = 1 << 20
MAX_LABEL_BYTES = 16 << 20  # a label file is a line per object; a bigger one is refused unread
YAML_SPLITS = {"train": "train", "val": "validation", "validation": "validation", "test": "test"}


class YoloLayout(NamedTuple):
    names: dict  # {class id: name}
    folders: tuple  # ((split, images folder relative to the input folder), ...)
    keypoints: bool = False  # a pose dataset (kpt_shape): each line is a box, then keypoints (not read)


def _join(*parts: str) -> str:
    return "/".join(part.rstrip("/") for part in parts if part)


def class_names(names) -> dict:
    """data.yaml's `names` (a list, or {id: name}) as {id: name}. Raises LayoutError."""
    if isinstance(names, list):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or not names:
        raise LayoutError("data.yaml has no `names` (a list of class names, or {id: name}): add them")
    out = {}
    for key, name in names.items():
        if isinstance(key, bool) or not isinstance(key, int) or key < 0 or not isinstance(name, (str, int)):
            raise LayoutError(f"data.yaml's names has {key!r}: {name!r}; give names as a list, or as "
                              "{id: name} with ids 0, 1, ...")
        out[key] = str(name)
    return out


def read_data_yaml(input_dir: str, yaml_name: str = DATA_YAML) -> YoloLayout:
    """The classes and split folders of an Ultralytics data.yaml in `input_dir`. Split paths are relative to the
    yaml's `path:` (itself relative to the yaml's folder), else to the yaml's folder; as Ultralytics'
    check_det_dataset does, a path that starts with '../' and is not there is read without it (Roboflow's
    exports say `train: ../train/images`). A path must stay inside the input folder. Raises LayoutError."""
    path = _join(input_dir, yaml_name)
    try:
        with open_file(path) as raw:
            text = raw.read(MAX_YAML_BYTES + 1)
        if len(text) > MAX_YAML_BYTES:
            raise LayoutError(f"{path} is over {MAX_YAML_BYTES >> 20} MiB: not a data.yaml")
        data = yaml.safe_load(text)
    except (OSError, FileNotFoundError) as e:
        raise LayoutError(f"no {yaml_name} in {input_dir} ({e}): a YOLO dataset needs one, with names and "
                          "train/val folders") from None
    except yaml.YAMLError as e:
        raise LayoutError(f"{path} is not YAML ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(data, dict):
        raise LayoutError(f"{path} is not a YAML mapping with names and train/val folders")
    names = class_names(data.get("names"))
    base = data.get("path") if isinstance(data.get("path"), str) else ""
    base = posixpath.normpath(base) if base and not base.startswith("/") and "://" not in base else ""
    if base.startswith(".."):
        base = ""  # the dataset's own folder is the input folder
    folders, seen = [], {}
    for key, split in YAML_SPLITS.items():
        values = data.get(key)
        if values is None or any(split == s for s, _ in folders):
            continue
        for value in values if isinstance(values, list) else [values]:
            folder = _split_folder(input_dir, base, value, key)
            if folder in seen:
                raise LayoutError(f"data.yaml gives the folder {folder} for both {seen[folder]} and {key}: its "
                                  "images would be in two splits; give each split its own folder")
            seen[folder] = key
            folders.append((split, folder))
    if not folders:
        raise LayoutError(f"{path} names no train/val/test image folder")
    return YoloLayout(names, tuple(folders), keypoints="kpt_shape" in data)


def _split_folder(input_dir: str, base: str, value, key: str) -> str:
    if not isinstance(value, str) or value.endswith(".txt"):
        raise LayoutError(f"data.yaml's {key}: {str(value)[:60]!r} is not a folder of images (a list file is not "
                          "read): give the folder")
    for candidate in (value, value[3:] if value.startswith("../") else None):
        if candidate is None:
            continue
        folder = posixpath.normpath(_join(base, candidate)) if base else posixpath.normpath(candidate)
        if folder.startswith("..") or folder.startswith("/"):
            continue
        folder = "" if folder == "." else folder
        if has_file(_join(input_dir, folder)):
            if "/images" not in "/" + folder and not folder.startswith("images"):
                raise LayoutError(f"data.yaml's {key} folder {folder} has no 'images' in its path: YOLO finds "
                                  "each label file by replacing the last /images/ with /labels/")
            return folder
    raise LayoutError(f"data.yaml's {key} folder {value!r} is not in {input_dir}, or holds no file: give the "
                      "folder of its images, relative to data.yaml (or to its path:)")


def label_relpath(image_relpath: str) -> str:
    """The label file of an image (Ultralytics' img2label_paths): the last '/images/' made '/labels/', the
    extension '.txt'."""
    head, sep, tail = ("/" + image_relpath).rpartition("/images/")
    path = (head + "/labels/" + tail) if sep else "/" + image_relpath
    return posixpath.splitext(path)[0].lstrip("/") + ".txt"


def labels_folder(images_folder: str) -> str:
    return posixpath.dirname(label_relpath(_join(images_folder, "x.jpg")))


def parse_label_line(line: str, names: dict, where: str, keypoints: bool = False):
    """An Annotation (normalised coordinates) or an AnnotationProblem for one non-empty line of a label file:
    `class cx cy w h` (a box), `class x1 y1 ... xn yn` with n >= 3 (a polygon; its box is its extent, as
    Ultralytics' segments2boxes), or with `keypoints` a box followed by keypoints (read as its box)."""
    parts = line.split()
    try:
        class_id, values = int(parts[0]), [float(v) for v in parts[1:]]
    except ValueError:
        return AnnotationProblem(BAD_ANNOTATION, f"{where}: {line.strip()[:60]!r} is not a class id and numbers")
    if not all(math.isfinite(v) for v in values):
        return AnnotationProblem(BAD_ANNOTATION, f"{where}: a coordinate is not a finite number")
    if class_id not in names:
        return AnnotationProblem(UNKNOWN_CLASS, f"{where}: the class id {class_id} is not in data.yaml's names "
                                                f"({min(names)}..{max(names)})")
    name = names[class_id]
    if len(values) == 4 or (keypoints and len(values) > 4):
        cx, cy, w, h = values[:4]
        if w < 0 or h < 0:
            return AnnotationProblem(BAD_ANNOTATION, f"{where}: a box of negative width or height")
        return Annotation(name, Box(cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), where=where)
    if len(values) >= 6 and len(values) % 2 == 0:
        xs, ys = values[0::2], values[1::2]
        return Annotation(name, Box(min(xs), min(ys), max(xs), max(ys)), where=where,
                          segmentation=Segmentation(polygons=(tuple(values),)))
    return AnnotationProblem(BAD_ANNOTATION, f"{where}: {len(values)} numbers after the class id: a box has 4, "
                                             "a polygon 6 or more (x, y pairs)")


def parse_labels(text: str, relpath: str, names: dict, keypoints: bool = False):
    """([Annotation], [AnnotationProblem]) of a label file's text (its empty lines skipped)."""
    objects, problems = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            item = parse_label_line(line, names, f"{relpath}: line {number}", keypoints)
            (objects if isinstance(item, Annotation) else problems).append(item)
    return objects, problems


def _read_labels(path: str, relpath: str) -> str:
    with open_file(path) as raw:
        data = raw.read(MAX_LABEL_BYTES + 1)
    if len(data) > MAX_LABEL_BYTES:
        raise ValueError(f"{relpath} is over {MAX_LABEL_BYTES >> 20} MiB: not a label file")
    return data.decode("utf-8")


def yolo_image(key, grouped: dict, layout: YoloLayout, input_dir: str, class_filter=None):
    """One label key's images and label file -> the image with its objects (normalised, frame 'upright'), or
    REJECTED / PROBLEMS, and COUNTS (the lines read)."""
    images = sorted(grouped["images"], key=lambda image: image.relpath)
    labels = sorted(grouped["labels"])
    objects, problems = [], []
    for relpath in labels[:1]:
        try:
            text = _read_labels(_join(input_dir, relpath), relpath)
        except (*READ_ERRORS, ValueError) as e:  # UnicodeDecodeError is a ValueError
            # a transient read error fails the bundle (read_problem), which the runner tries again
            why = read_problem(e) if isinstance(e, READ_ERRORS) else e
            yield found(0, 1)
            for image in images:
                yield beam.pvalue.TaggedOutput(REJECTED, Rejection(image.relpath, "rejected", "bad_annotation_file",
                                                                   f"{relpath} cannot be read: {why}"))
            if not images:
                yield beam.pvalue.TaggedOutput(REJECTED, Rejection(relpath, "rejected", "bad_annotation_file",
                                                                   f"{relpath} cannot be read: {why}"))
            return
        objects, problems = parse_labels(text, relpath, layout.names, layout.keypoints)
        yield found(len(objects) + len(problems), 1)
    if not images:
        relpath = labels[0]
        detail = f"no image for the label file {relpath}"
        yield beam.pvalue.TaggedOutput(REJECTED, Rejection(relpath, "rejected", MISSING_IMAGE, detail))
        for obj in objects:
            yield beam.pvalue.TaggedOutput(PROBLEMS, AnnotationProblem(MISSING_IMAGE, f"{obj.where}: {detail}",
                                                                       relpath))
        for problem in problems:
            yield beam.pvalue.TaggedOutput(PROBLEMS, problem)
        return
    image, *others = images
    for other in others:
        yield beam.pvalue.TaggedOutput(REJECTED, Rejection(
            other.relpath, "rejected", DUPLICATE_IMAGE,
            f"{image.relpath} has the same label file, {label_relpath(image.relpath)}; it is read, not this one"))
    kept, rejected = screen(objects, (1.0, 1.0), class_filter, image.relpath)
    yield image._replace(objects=kept, problems=tuple(p._replace(image=image.relpath) for p in problems) + rejected,
                         normalised=True, frame="upright")


def _label_entry(entry, input_dir: str):
    for item in listed_file(entry, input_dir, ".txt"):
        if isinstance(item, str):
            relpath = item[len(input_dir) + 1:]
            item = (name_bytes(relpath), relpath)
        yield item


def _image_entry(entry, input_dir: str, folders: tuple):
    relpath = entry.path[len(input_dir) + 1:]
    split = next((s for s, folder in sorted(folders, key=lambda f: -len(f[1]))
                  if not folder or relpath.startswith(folder + "/")), "")
    yield from on_disk_entry(entry, input_dir, split)


class ReadYolo(beam.PTransform):
    """PBegin -> {IMAGES, REJECTED, PROBLEMS, COUNTS} (transforms.detection.parsing) of the YOLO dataset `layout`
    (read_data_yaml) below `input_dir`. An image without a label file is an image without objects; a label file
    without an image is missing_image (its lines too); a class id out of data.yaml's names is unknown_class.
    `class_filter`: when given, an object of another class name is unknown_class too."""

    def __init__(self, input_dir: str, layout: YoloLayout, class_filter=None):
        super().__init__()
        self._input_dir, self._layout = input_dir.rstrip("/"), layout
        self._class_filter = None if class_filter is None else frozenset(class_filter)

    def expand(self, pbegin):
        input_dir, layout = self._input_dir, self._layout
        folders = sorted({folder for _, folder in layout.folders})
        listed = (pbegin
                  | "ListImages" >> ListFolders([_join(input_dir, f) for f in folders], input_dir)
                  | "ImagesOnDisk" >> beam.FlatMap(_image_entry, input_dir, layout.folders).with_outputs(
                      REJECTED, main="images"))
        # (label file relpath bytes, ImageAnnotations without objects) of every image
        images = listed.images | "KeyImages" >> beam.Map(lambda image: (name_bytes(label_relpath(image.relpath)),
                                                                        image))
        labels = (pbegin
                  | "ListLabels" >> ListFolders(sorted({_join(input_dir, labels_folder(f)) for f in folders}),
                                                input_dir)
                  # (label file relpath bytes, its relpath); REJECTED: an entry the listing cannot use
                  | "LabelFiles" >> beam.FlatMap(_label_entry, input_dir).with_outputs(REJECTED, main="labels"))
        joined = ({"images": images, "labels": labels.labels}
                  | "JoinLabels" >> beam.CoGroupByKey()
                  # each label file read and parsed on the worker its image lands on
                  | "ReadLabels" >> beam.FlatMap(lambda item, lay, root, names: yolo_image(*item, lay, root, names),
                                                 layout, input_dir, self._class_filter).with_outputs(
                      REJECTED, PROBLEMS, COUNTS, main=IMAGES))
        rejected = (listed[REJECTED], labels[REJECTED], joined[REJECTED]) | "AllRejected" >> beam.Flatten()
        return outputs_with_tally(joined[IMAGES], rejected, joined[PROBLEMS], joined[COUNTS])
