"""ReadBoxes: a CSV (with a header) or JSON Lines file of boxes, one row per box -> ImageAnnotations.

Columns: `path` (relative to the file's folder or --input_dir, absolute, or gs://, as a manifest's), `label`,
`xmin`, `ymin`, `xmax`, `ymax`; optional `split` (train, validation, test or a name for one), `width` and `height`
(the image's size as the boxes were drawn on it), and `unit`. A row whose four coordinates are all empty is an
image without objects.

The unit rule: coordinates are pixels (0-based, continuous: a box of the whole 640 x 480 image is 0, 0, 640, 480)
unless the row's `unit` is `normalized` (or `normalised`, `fraction`: fractions of the width and height). A box
without a unit whose coordinates all lie in [0, 1], not all whole numbers (0.1, 0.2, 0.5, 0.6), is refused as
ambiguous_box_unit: read as pixels it would be a sub-pixel box in a corner, and is most likely fractions; give the
unit. (0, 0, 1, 1) in whole numbers is a one-pixel box. The rows of one image must agree on split, size and unit.

The file is read in parallel byte ranges by the manifest's reader (transforms.inputs.rows.ReadRows), and the rows
of each image are grouped in the graph; each image's file is checked to exist on the worker its group lands on.
"""

from __future__ import annotations

import math

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms.base.dataset_format import split_of
from transforms.base.paths import name_bytes
from transforms.base.records import Rejection
from transforms.detection.objects import Annotation, AnnotationProblem, Box, ImageAnnotations
from transforms.detection.parsing import (
    AMBIGUOUS_BOX_UNIT,
    BAD_ANNOTATION,
    CONFLICTING_ROWS,
    COUNTS,
    IMAGES,
    MISSING_IMAGE,
    PROBLEMS,
    READ_ERRORS,
    REJECTED,
    Unusable,
    found,
    outputs_with_tally,
    problems_of,
    read_problem,
    screen,
    source_id_of,
)
from transforms.inputs.manifest import RowProblem, normal_path, resolve
from transforms.inputs.rows import ReadRows, RowFields

COORDINATES = ("xmin", "ymin", "xmax", "ymax")
PIXELS, NORMALISED = "pixels", "normalized"
UNITS = {"": PIXELS, "px": PIXELS, "pixel": PIXELS, "pixels": PIXELS,
         "normalized": NORMALISED, "normalised": NORMALISED, "norm": NORMALISED, "fraction": NORMALISED}


def _cell(fields: dict, name: str):
    value = fields.get(name)
    if isinstance(value, str):
        value = value.strip()
        return value or None
    return value


def _number(value, name: str, row: int) -> float:
    if isinstance(value, bool):
        raise ValueError(f"row {row}: {name} is {value}, not a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"row {row}: {name} is {str(value)[:20]!r}, not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"row {row}: {name} is {str(value)[:20]!r}, not a finite number")
    return number


def box_row(row: int, fields: dict | str, base: str):
    """(image path, relpath, split, size, unit, Annotation | AnnotationProblem | None) of one data row, None for
    a row without a box; or an AnnotationProblem of a row that names no image (its fields cannot be read, no
    path). The path is resolved as a manifest's (transforms.inputs.manifest.resolve)."""
    if isinstance(fields, str):
        return AnnotationProblem(BAD_ANNOTATION, f"row {row}: {fields}")
    path = _cell(fields, "path")
    if not isinstance(path, str):
        return AnnotationProblem(BAD_ANNOTATION, f"row {row}: no path")
    try:
        relpath = normal_path(path)
    except RowProblem as p:
        return AnnotationProblem(BAD_ANNOTATION, f"row {row}: {p.detail}")
    full = resolve(relpath, base)
    where = f"row {row}"
    try:
        split_text = str(_cell(fields, "split") or "").lower()
        split = split_of(split_text) if split_text else ""
        if split is None:
            raise ValueError(f"row {row}: split {split_text!r} is not train, validation or test")
        unit = UNITS.get(str(_cell(fields, "unit") or "").lower())
        if unit is None:
            raise ValueError(f"row {row}: unit {_cell(fields, 'unit')!r} is not pixels or normalized")
        width, height = _cell(fields, "width"), _cell(fields, "height")
        size = None
        if width is not None or height is not None:
            size = (_number(width, "width", row), _number(height, "height", row))
            if size[0] <= 0 or size[1] <= 0 or not all(v.is_integer() for v in size):
                raise ValueError(f"row {row}: width and height {size} are not whole numbers of pixels")
            size = (int(size[0]), int(size[1]))
    except ValueError as e:
        return full, relpath, "", None, PIXELS, AnnotationProblem(BAD_ANNOTATION, str(e), relpath)
    cells = [_cell(fields, name) for name in COORDINATES]
    if all(cell is None for cell in cells):
        return full, relpath, split, size, unit, None
    try:
        box = Box(*(_number(cell, name, row) for cell, name in zip(cells, COORDINATES, strict=True)))
    except ValueError as e:
        return full, relpath, split, size, unit, AnnotationProblem(BAD_ANNOTATION, str(e), relpath)
    label = _cell(fields, "label")
    if label is None or isinstance(label, (bool, list, dict, float)):
        return full, relpath, split, size, unit, AnnotationProblem(BAD_ANNOTATION, f"{where}: no label (a class "
                                                                                  "name) for its box", relpath)
    given_unit = str(_cell(fields, "unit") or "")
    if not given_unit and all(0 <= v <= 1 for v in box) and not all(float(v).is_integer() for v in box):
        return full, relpath, split, size, unit, AnnotationProblem(
            AMBIGUOUS_BOX_UNIT, f"{where}: the box {tuple(box)} lies in [0, 1]: pixels or fractions of the image? "
                                "give a unit column (pixels or normalized)", relpath)
    return full, relpath, split, size, unit, Annotation(str(label), box, where=where)


def _parse(item: RowFields, base: str):
    parsed = box_row(item.row, item.fields, base)
    has_box = not isinstance(parsed, tuple) or parsed[-1] is not None
    yield found(1 if has_box else 0, 0)
    if isinstance(parsed, AnnotationProblem):
        yield beam.pvalue.TaggedOutput(PROBLEMS, parsed)
        return
    yield name_bytes(parsed[0]), (item.row, parsed)


def _present(path: str, exists) -> bool:
    """Whether the image file is there. One the store will not describe (Cloud Storage's 403) is left to its read,
    which rejects the image with the store's answer, as any image's read does; a transient error is raised (the
    bundle is tried again)."""
    try:
        return exists(path)
    except READ_ERRORS as e:
        read_problem(e)  # raises it again when transient
        return True


def boxes_image(rows, class_names=None, exists=FileSystems.exists):
    """One image's rows ((row number, box_row tuple), ...) -> its ImageAnnotations, or REJECTED / PROBLEMS."""
    rows = [parsed for _, parsed in sorted(rows, key=lambda r: r[0])]
    full, relpath = rows[0][0], rows[0][1]
    objects = [r[-1] for r in rows if isinstance(r[-1], Annotation)]
    problems = [r[-1] for r in rows if isinstance(r[-1], AnnotationProblem)]
    splits = {r[2] for r in rows if r[2]}
    sizes = {r[3] for r in rows if r[3] is not None}
    units = {r[4] for r in rows if isinstance(r[-1], Annotation)}
    image = ImageAnnotations(relpath, full, source_id_of(relpath), next(iter(splits), ""),
                             next(iter(sizes), None), tuple(objects), tuple(problems),
                             normalised=units == {NORMALISED})
    unusable = None
    if len(splits) > 1 or len(sizes) > 1 or len(units) > 1:
        what = "splits" if len(splits) > 1 else "sizes" if len(sizes) > 1 else "units"
        unusable = Unusable(CONFLICTING_ROWS, f"the rows of {relpath} give different {what}")
    elif not _present(full, exists):
        unusable = Unusable(MISSING_IMAGE, f"the image file {relpath} is not there")
    if unusable is not None:
        yield beam.pvalue.TaggedOutput(REJECTED, Rejection(relpath, "rejected", *unusable))
        for problem in problems_of(image, *unusable):
            yield beam.pvalue.TaggedOutput(PROBLEMS, problem)
        return
    frame = (1.0, 1.0) if image.normalised else image.frame_size
    kept, rejected = screen(objects, frame, class_names, relpath)
    yield image._replace(objects=kept, problems=image.problems + rejected)


class ReadBoxes(beam.PTransform):
    """PBegin -> {IMAGES, REJECTED, PROBLEMS, COUNTS} (transforms.detection.parsing) of a box file (`fmt`:
    'csv' or 'jsonl'), paths relative to `base`. `class_names`: when given, a box of another label is
    unknown_class."""

    def __init__(self, path: str, fmt: str, base: str, class_names=None, range_bytes: int | None = None):
        super().__init__()
        self._path, self._fmt, self._base, self._range_bytes = path, fmt, base, range_bytes
        self._class_names = None if class_names is None else frozenset(class_names)

    def expand(self, pbegin):
        read = pbegin | "Read" >> ReadRows(self._path, self._fmt, self._range_bytes)
        parsed = (read.fields
                  # (image path bytes, (row, box_row)): every row, or PROBLEMS for one that names no image
                  | "ParseBoxes" >> beam.FlatMap(_parse, self._base).with_outputs(PROBLEMS, COUNTS, main="rows"))
        images = (parsed.rows
                  | "GroupByImage" >> beam.GroupByKey()
                  | "ImageBoxes" >> beam.FlatMap(lambda item, names: boxes_image(item[1], names), self._class_names
                                                 ).with_outputs(REJECTED, PROBLEMS, main=IMAGES))
        problems = (parsed[PROBLEMS], images[PROBLEMS]) | "AllProblems" >> beam.Flatten()
        files = pbegin | "BoxFile" >> beam.Create([{"annotation_files": 1}])
        counts = (parsed[COUNTS], files) | "AllCounts" >> beam.Flatten()
        return outputs_with_tally(images[IMAGES], images[REJECTED], problems, counts)
