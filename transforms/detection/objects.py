"""The annotations of one image, as every input format (COCO, Pascal VOC, YOLO, CSV/JSONL boxes) gives them.

Coordinates are in pixels of the source image file as its annotation file describes it: `frame_size` is the
(width, height) the annotation file says the image has (None when the format does not say: YOLO, most CSVs), and
the geometry (transforms.detection.geometry) decides from it and the file's EXIF orientation whether the
coordinates refer to the stored pixels or to the upright image. Boxes are (xmin, ymin, xmax, ymax), floats, in
pixels with the top-left corner of the top-left pixel at (0, 0) (COCO's convention; VOC's 1-based inclusive integer
corners are converted by its parser, YOLO's normalised centre boxes by its).

No Beam and no image bytes here: these are the elements the parsers yield and the graph carries.
"""

from __future__ import annotations

import os
from typing import NamedTuple


class Box(NamedTuple):
    xmin: float
    ymin: float
    xmax: float
    ymax: float


class Segmentation(NamedTuple):
    """An instance's mask, as its format gives it: polygons (each a flat x0, y0, x1, y1, ... in pixels), or a COCO
    run-length encoding ({'size': [h, w], 'counts': str or list}); at most one of the two is set."""

    polygons: tuple[tuple[float, ...], ...] = ()
    rle: dict | None = None


class Annotation(NamedTuple):
    """One object: its class name as the annotation gives it, its box, and what the formats record about it."""

    class_name: str
    box: Box
    is_crowd: bool = False
    difficult: bool = False
    truncated: bool = False
    area: float | None = None  # COCO's `area` (of the segmentation, in source pixels); None: the box's
    segmentation: Segmentation | None = None
    where: str = ""  # where it is written, for errors.jsonl: "annotations.json: annotation id 17", "0001.xml: object 3"
    # its index in the image's instance mask (VOC: the k-th <object> of the XML is index k of its SegmentationObject
    # PNG, from 1); 0 for none
    instance: int = 0


class AnnotationProblem(NamedTuple):
    """An annotation that cannot be used, found while parsing (the image itself may still be kept)."""

    reason: str  # machine-readable, e.g. 'unknown_class', 'box_outside_image', 'bad_annotation'
    detail: str  # one line for people, naming the file and the annotation
    image: str = ""  # the image's relative path or file name as the annotation file names it ('' when unknown)


class ImageAnnotations(NamedTuple):
    """Everything known about one image before its bytes are read."""

    relpath: str  # path relative to --input_dir, '/'-separated (the record's image/filename)
    path: str  # the full path (local or gs://) of the image file
    source_id: str  # a number as text, stable across runs: COCO's image id; else derived from relpath
    split: str = ""  # 'train' / 'validation' / 'test' from the dataset's own folders or files; '' for the hash split
    frame_size: tuple[int, int] | None = None  # (width, height) as the annotation file gives them
    objects: tuple[Annotation, ...] = ()
    problems: tuple[AnnotationProblem, ...] = ()  # annotations of this image already rejected by the parser
    semantic_mask: str = ""  # full path of a per-image class-id mask (PNG, palette or grey) for semantic segmentation
    # Boxes and polygons as fractions of the image's width and height (YOLO), made pixels once its size is known.
    normalised: bool = False
    # The frame the coordinates refer to when the format fixes it: 'upright' (after the EXIF orientation, as
    # YOLO's tools read images) or 'stored' (the pixels as stored in the file); '' to decide from frame_size.
    frame: str = ""
    # Full path of a per-image instance mask (VOC's SegmentationObject PNG: palette index k is the k-th object of
    # the annotation file, in its order; 0 background, 255 the boundary): '' for none.
    instance_mask: str = ""
    instances: int = 0  # the objects its annotation file lists, rejected ones too: the indices its instance mask uses
    size: int = 0  # the image file's bytes as its folder's listing gave them (0 when not listed: box rows)

    def __reduce__(self):
        """Pickled (as Beam carries it between steps, through every shuffle, and the local runner holds it) with the
        start its objects' `where` share written once: 'annotations/instances_train.json: annotation id ' once per
        image, not once per object. Unpickled, it is the same ImageAnnotations."""
        shared = os.path.commonprefix([obj.where for obj in self.objects]) if len(self.objects) > 1 else ""
        if not shared:
            return ImageAnnotations, tuple(self)
        objects = tuple(obj._replace(where=obj.where[len(shared):]) for obj in self.objects)
        return _with_shared_where, (shared, tuple(self._replace(objects=objects)))


def _with_shared_where(shared: str, fields: tuple) -> ImageAnnotations:
    """An ImageAnnotations from its pickled form (ImageAnnotations.__reduce__): each object's `where` begins with
    `shared` again."""
    image = ImageAnnotations(*fields)
    return image._replace(objects=tuple(obj._replace(where=shared + obj.where) for obj in image.objects))
