"""An image's annotations carried through exactly what its conversion did to the pixels: EXIF orientation, resize.

No Beam here. `place_annotations` takes one image's `ImageAnnotations` (transforms.detection.objects) and the
`Placement` its conversion followed (`EncodedImage.placement`, transforms.images.pixels: the same function sizes
and crops the pixels, on the fast core and on Pillow's path, whatever scale a JPEG was drafted at) and returns its
objects in the output image's frame, boxes normalised to [0, 1], with each annotation that cannot be kept as an
`AnnotationProblem` with its reason. Every object given comes out once: placed, or with one problem.

The frame of the coordinates (docs/detection.md, "Geometry"):
  * `ImageAnnotations.frame` when the format fixes it ('upright': the pixels after the EXIF orientation, as YOLO's
    tools read images; 'stored': the pixels as the file stores them);
  * else from `frame_size` against the file: the stored size means 'stored', the upright size (different only for
    a transposing orientation 5-8 of a non-square image) 'upright'; a size that is neither is
    `image_size_mismatch` for every object;
  * when that cannot tell (no `frame_size`, or orientations 2-4 and square images, where both sizes are the same):
    'stored', as the TF Object Detection API's dataset scripts and TensorFlow's decoders (which ignore EXIF) assume.
Normalised (YOLO) coordinates are fractions of the size of the frame they refer to.

Masks: polygons are mapped vertex by vertex and rasterised by pycocotools at the output size (so a polygon and its
box follow the one mapping); a COCO RLE is decoded at its own size (the frame's) and sampled nearest-neighbour, as is
a semantic mask PNG (a palette PNG's indices, never its colours; a grey PNG's values), so that a mask holds only
values it held before. Pad's bars are 0 in an instance mask and `SEMANTIC_PAD` (255, "ignore") in a semantic one.
When some objects of an image have a segmentation, those without get their box as their mask (the records need
one mask per object). An instance mask file (VOC's SegmentationObject PNG) is sampled the same way, its index k the
mask of the annotation's k-th object (`Annotation.instance`), its boundary (VOID, 255) part of none.
"""

from __future__ import annotations

import io
import math
from typing import NamedTuple

import numpy as np
from PIL import Image

from transforms.detection.objects import Annotation, AnnotationProblem, Box, ImageAnnotations
from transforms.images.pixels import Placement, oriented_point

STORED, UPRIGHT = "stored", "upright"
FRAMES = (STORED, UPRIGHT)

# Reasons of annotation-level rejections (errors.jsonl); the image itself is kept.
BAD_BOX = "bad_box"  # not a box: a coordinate not finite, xmax <= xmin or ymax <= ymin
BOX_OUTSIDE_IMAGE = "box_outside_image"  # nothing left after clipping to the image, or to the crop
BOX_TOO_SMALL = "box_too_small"  # under one output pixel wide or high once resized
BAD_SEGMENTATION = "bad_segmentation"  # a polygon or RLE that cannot be rasterised
IMAGE_SIZE_MISMATCH = "image_size_mismatch"  # the annotation's image size is neither the file's stored nor upright
BAD_SEMANTIC_MASK = "bad_semantic_mask"  # not a palette or grey PNG of the image's size
# An instance mask PNG's problems (VOC's SegmentationObject): the objects are kept, each with its box as its mask.
BAD_INSTANCE_MASK = "bad_instance_mask"  # not readable, or not a palette or grey PNG: the whole file
INSTANCE_MASK_SIZE_MISMATCH = "instance_mask_size_mismatch"  # neither the image's stored nor upright size
INSTANCE_MASK_EXTRA_INDEX = "instance_mask_extra_index"  # indices beyond the annotation's objects: the whole file
EMPTY_INSTANCE_MASK = "empty_instance_mask"  # one object whose index has no pixel in the file
INSTANCE_MASK_REASONS = (BAD_INSTANCE_MASK, INSTANCE_MASK_SIZE_MISMATCH, INSTANCE_MASK_EXTRA_INDEX,
                         EMPTY_INSTANCE_MASK)
REASONS = (BAD_BOX, BOX_OUTSIDE_IMAGE, BOX_TOO_SMALL, BAD_SEGMENTATION, IMAGE_SIZE_MISMATCH, BAD_SEMANTIC_MASK,
           *INSTANCE_MASK_REASONS)

SEMANTIC_PAD = 255  # the class id of pad's bars in a semantic mask: the "ignore" label of VOC and Model Garden
VOID = 255  # VOC's boundary ("void") in an instance mask: part of no object's mask
MIN_SIZE_PX = 1.0  # a box narrower or lower than this many output pixels is `box_too_small`


class PlacedObject(NamedTuple):
    """One object in the output image: its box normalised to the output's width and height, clipped to [0, 1]."""

    class_name: str
    box: Box
    area: float  # in output pixels: the mask's pixels; else the given area scaled (and cut as the box); else the box's
    is_crowd: bool = False
    difficult: bool = False
    truncated: bool = False  # as given, or the box was cut by the image's edge or the crop
    mask: np.ndarray | None = None  # 0/1 uint8 (height, width) of the output image, when the image has masks
    where: str = ""


class PlacedAnnotations(NamedTuple):
    """One image's annotations in its output frame; `problems` are this function's rejections only (not the
    parser's `ImageAnnotations.problems`)."""

    objects: tuple[PlacedObject, ...]
    problems: tuple[AnnotationProblem, ...]
    frame: str  # the frame the coordinates were read in: 'stored' or 'upright' ('' when the sizes did not match)
    semantic_mask: np.ndarray | None = None  # uint8 class ids (height, width) of the output image


def decide_frame(declared: str, frame_size: tuple[int, int] | None, placement: Placement) -> str:
    """The frame the coordinates refer to (see the module's docstring); '' when `frame_size` is neither the file's
    stored size nor its upright one, or contradicts the declared frame."""
    stored, upright = tuple(placement.stored_size), tuple(placement.upright_size)
    size = tuple(frame_size) if frame_size else None
    if declared:
        if declared not in FRAMES:
            raise ValueError(f"frame {declared!r}: expected one of {FRAMES} or ''")
        return declared if size is None or size == (stored if declared == STORED else upright) else ""
    if size is None or size == stored:  # the same size both ways (orientations 1-4, square images): stored
        return STORED
    return UPRIGHT if size == upright else ""


class _Mapping:
    """Frame coordinates (pixels of the stored or the upright source) -> output pixels, and back for sampling."""

    def __init__(self, placement: Placement, frame: str):
        self.placement, self.frame = placement, frame
        self.frame_size = tuple(placement.stored_size if frame == STORED else placement.upright_size)
        self.source, self.content = placement.source_box, placement.content_box
        (s0x, s0y, s1x, s1y), (c0x, c0y, c1x, c1y) = self.source, self.content
        self.kx, self.ky = (c1x - c0x) / (s1x - s0x), (c1y - c0y) / (s1y - s0y)  # output px per source px

    def _upright(self, x, y):
        if self.frame == STORED:
            return oriented_point(self.placement.orientation, self.placement.stored_size, x, y)
        return x, y

    def point(self, x, y):
        """A frame point in output pixels (numpy arrays too)."""
        u, v = self._upright(x, y)
        return self.content[0] + (u - self.source[0]) * self.kx, self.content[1] + (v - self.source[1]) * self.ky

    def box(self, box: Box) -> tuple[float, float, float, float]:
        (ax, ay), (bx, by) = self.point(box.xmin, box.ymin), self.point(box.xmax, box.ymax)
        return min(ax, bx), min(ay, by), max(ax, bx), max(ay, by)

    def sample(self, raster: np.ndarray, fill: int) -> np.ndarray:
        """`raster` (covering the frame, at any resolution) at the output's size, nearest-neighbour: each output
        pixel of the content box takes the raster pixel under its centre; the rest (pad's bars) is `fill`."""
        width, height = self.placement.output_size
        out = np.full((height, width), fill, raster.dtype)
        c0x, c0y, c1x, c1y = self.content
        u = self.source[0] + (np.arange(c0x, c1x) + 0.5 - c0x) / self.kx  # upright source, at output pixel centres
        v = self.source[1] + (np.arange(c0y, c1y) + 0.5 - c0y) / self.ky
        u, v = u[np.newaxis, :], v[:, np.newaxis]
        if self.frame == STORED:  # back through the orientation: its inverse, on the upright size
            inverse = {6: 8, 8: 6}.get(self.placement.orientation, self.placement.orientation)
            x, y = oriented_point(inverse, self.placement.upright_size, u, v)
        else:
            x, y = u, v
        rows, cols = raster.shape[:2]
        fw, fh = self.frame_size
        col = np.clip(np.floor(np.asarray(x) * (cols / fw)).astype(np.int64), 0, cols - 1)
        row = np.clip(np.floor(np.asarray(y) * (rows / fh)).astype(np.int64), 0, rows - 1)
        out[c0y:c1y, c0x:c1x] = raster[row, col]
        return out


def _problem(reason: str, annotation: Annotation, detail: str, image: str) -> AnnotationProblem:
    where = annotation.where or annotation.class_name
    return AnnotationProblem(reason, f"{where}: {detail}", image)


def _fmt(box) -> str:
    return "({:g}, {:g}, {:g}, {:g})".format(*box)


def _frame_box(annotation: Annotation, scale: tuple[float, float]) -> Box | None:
    """The box in frame pixels, or None when it is not a box (not finite, or empty or reversed)."""
    try:
        x0, y0, x1, y1 = (float(v) for v in annotation.box)
    except (TypeError, ValueError):
        return None
    x0, x1, y0, y1 = x0 * scale[0], x1 * scale[0], y0 * scale[1], y1 * scale[1]
    if not all(math.isfinite(v) for v in (x0, y0, x1, y1)) or x1 <= x0 or y1 <= y0:
        return None
    return Box(x0, y0, x1, y1)


def _polygons(annotation: Annotation, scale: tuple[float, float], mapping: _Mapping) -> list[list[float]] | str:
    """The polygons in output pixels (flat x, y lists), or what is wrong with them."""
    out = []
    for number, polygon in enumerate(annotation.segmentation.polygons, 1):
        values = np.asarray(polygon, dtype=np.float64).ravel()
        if values.size % 2 or values.size < 6 or not np.isfinite(values).all():
            return f"polygon {number} has {values.size} coordinates (it needs pairs, at least 3 points, all finite)"
        xs, ys = mapping.point(values[0::2] * scale[0], values[1::2] * scale[1])
        out.append(np.stack([xs, ys], axis=1).ravel().tolist())
    return out or "an empty list of polygons"


def _rasterise(polygons: list[list[float]], size: tuple[int, int]) -> np.ndarray:
    """0/1 mask (height, width) of the polygons, by pycocotools (COCO's own rasteriser)."""
    from pycocotools import mask as coco_mask

    width, height = size
    rle = coco_mask.merge(coco_mask.frPyObjects(polygons, height, width))
    return coco_mask.decode(rle)


def _rle_counts(text: str) -> list[int] | None:
    """The run lengths of COCO's compressed RLE string (pycocotools' rleFrString, in Python: that one decodes any
    string, garbage too, without a word), or None when it is not one."""
    counts, value, shift = [], 0, 0
    for char in text:
        c = ord(char) - 48
        if not 0 <= c < 64:
            return None
        value |= (c & 0x1F) << shift
        shift += 5
        if c & 0x20:
            continue
        if c & 0x10:
            value -= 1 << shift
        if len(counts) > 2:
            value += counts[-2]
        counts.append(value)
        value, shift = 0, 0
    return None if shift or any(c < 0 for c in counts) else counts


def _rle_raster(rle: dict) -> np.ndarray | str:
    """A COCO RLE (compressed counts, or a list of counts) decoded to 0/1 at its own size, or what is wrong."""
    from pycocotools import mask as coco_mask

    try:
        height, width = (int(v) for v in rle["size"])
        counts = rle["counts"]
        runs = [int(c) for c in counts] if isinstance(counts, list) else _rle_counts(
            counts.decode("ascii") if isinstance(counts, bytes) else counts)
        if runs is None or any(c < 0 for c in runs):
            return "RLE counts are not COCO's run lengths"
        if sum(runs) != height * width:
            return f"RLE counts add up to {sum(runs)} pixels, not {height}x{width}"
        if isinstance(counts, list):
            encoded = coco_mask.frPyObjects({"size": [height, width], "counts": runs}, height, width)
        else:
            encoded = {"size": [height, width], "counts": counts.encode("ascii") if isinstance(counts, str) else counts}
        return coco_mask.decode(encoded)
    except Exception as e:  # noqa: BLE001 - any malformed RLE is this annotation's problem, never the job's
        return f"RLE not decodable ({type(e).__name__}: {e})"


def _mask(annotation: Annotation, scale, mapping: _Mapping, content: np.ndarray) -> np.ndarray | str:
    """The object's 0/1 mask at the output size (zero outside the content box), or what is wrong with it."""
    segmentation = annotation.segmentation
    size = mapping.placement.output_size
    if segmentation.rle is not None:
        raster = _rle_raster(segmentation.rle)
        if isinstance(raster, str):
            return raster
        if (raster.shape[1], raster.shape[0]) != tuple(mapping.frame_size):
            return "RLE size {}x{} is not the image's {}x{}".format(raster.shape[1], raster.shape[0],
                                                                     *mapping.frame_size)
        return mapping.sample(raster, 0)
    polygons = _polygons(annotation, scale, mapping)
    if isinstance(polygons, str):
        return polygons
    return _rasterise(polygons, size) & content


def _box_mask(box: tuple[float, float, float, float], size: tuple[int, int]) -> np.ndarray:
    x0, y0, x1, y1 = box
    return _rasterise([[x0, y0, x1, y0, x1, y1, x0, y1]], size)


def _semantic(data: bytes, annotations: ImageAnnotations, placement: Placement) -> np.ndarray | str:
    """The class-id mask at the output size, or what is wrong with it."""
    try:
        mask = Image.open(io.BytesIO(data), formats=["PNG"])
        size = mask.size
        frame = decide_frame(annotations.frame, size, placement)
        if not frame:
            return "its size {}x{} is neither the image's {}x{} nor, upright, {}x{}".format(
                *size, *placement.stored_size, *placement.upright_size)
        if mask.mode in ("P", "L", "1"):
            values = np.asarray(mask, dtype=np.uint8)  # a palette image's indices, not its colours
        elif mask.mode in ("I", "I;16", "I;16B", "I;16L"):
            wide = np.asarray(mask)
            if wide.size and (wide.min() < 0 or wide.max() > 255):
                return f"class ids {int(wide.min())}-{int(wide.max())}: only 0-255 fit a class-id PNG"
            values = wide.astype(np.uint8)
        else:
            return (f"a {mask.mode} PNG: its colours are not class ids; save it as a palette (P) or greyscale (L) "
                    "PNG whose values are the class ids")
    except Exception as e:  # noqa: BLE001 - an unreadable mask is this image's annotation problem, not the job's
        return f"not a readable PNG ({type(e).__name__}: {e})"
    return _Mapping(placement, frame).sample(values, SEMANTIC_PAD)


def _instances(data: bytes, annotations: ImageAnnotations, placement: Placement):
    """An instance mask file (VOC's SegmentationObject PNG: index k is the k-th object of the annotation file, 0
    the background, VOID the boundary) -> (its indices at the output size, nearest-neighbour, 0 on pad's bars;
    the indices it holds), or (reason, detail) of what is wrong with it. Its own size says its frame."""
    try:
        mask = Image.open(io.BytesIO(data), formats=["PNG"])
        size = mask.size
        frame = decide_frame(annotations.frame, size, placement)
        if not frame:  # before its pixels are decoded
            return INSTANCE_MASK_SIZE_MISMATCH, "its size {}x{} is neither the image's {}x{} nor, upright, " \
                "{}x{}".format(*size, *placement.stored_size, *placement.upright_size)
        if mask.mode not in ("P", "L", "1"):
            return BAD_INSTANCE_MASK, (f"a {mask.mode} PNG: its colours are not object indices; save it as a palette "
                                       "(P) or greyscale (L) PNG whose value k is the annotation's k-th object")
        values = np.asarray(mask, dtype=np.uint8)  # a palette image's indices, not its colours
    except Exception as e:  # noqa: BLE001 - an unreadable mask is this image's problem, not the job's
        return BAD_INSTANCE_MASK, f"not a readable PNG ({type(e).__name__}: {e})"
    held = np.bincount(values.ravel(), minlength=256)
    present = frozenset(k for k in range(1, VOID) if held[k])
    extra = sorted(k for k in present if k > annotations.instances)
    if extra:
        return INSTANCE_MASK_EXTRA_INDEX, (f"it holds object indices up to {extra[-1]} ({len(extra)} beyond), but "
                                           f"the annotation file lists {annotations.instances} objects: it is not "
                                           "this annotation's mask")
    return _Mapping(placement, frame).sample(values, 0), present


def _content(placement: Placement) -> np.ndarray:
    width, height = placement.output_size
    inside = np.zeros((height, width), np.uint8)
    c0x, c0y, c1x, c1y = placement.content_box
    inside[c0y:c1y, c0x:c1x] = 1
    return inside


def _clip(box, limits) -> tuple[float, float, float, float]:
    return max(box[0], limits[0]), max(box[1], limits[1]), min(box[2], limits[2]), min(box[3], limits[3])


def _place(annotation: Annotation, mapping: _Mapping, scale: tuple[float, float], content: np.ndarray | None,
           image: str, given: np.ndarray | None = None) -> PlacedObject | AnnotationProblem:
    """One object in the output frame, or its problem. `content` (the content box's pixels) is given when the
    image has masks: then the object gets one, `given` (its instance mask at the output size) when there is one."""
    placement, (fw, fh) = mapping.placement, mapping.frame_size
    width, height = placement.output_size
    box = _frame_box(annotation, scale)
    if box is None:
        return _problem(BAD_BOX, annotation, f"box {annotation.box!r} is not a box (xmin < xmax and ymin < ymax, "
                        "all finite)", image)
    clipped = _clip(box, (0.0, 0.0, float(fw), float(fh)))
    if clipped[2] <= clipped[0] or clipped[3] <= clipped[1]:
        return _problem(BOX_OUTSIDE_IMAGE, annotation, f"box {_fmt(box)} lies outside the image ({fw}x{fh}, "
                        f"{mapping.frame})", image)
    unclipped = mapping.box(box)
    out = _clip(mapping.box(Box(*clipped)), placement.content_box)
    out_w, out_h = out[2] - out[0], out[3] - out[1]
    if out_w <= 0 or out_h <= 0:
        return _problem(BOX_OUTSIDE_IMAGE, annotation, f"box {_fmt(box)} lies outside the crop (of the upright "
                        f"image: {_fmt(placement.source_box)})", image)
    if out_w < MIN_SIZE_PX or out_h < MIN_SIZE_PX:
        return _problem(BOX_TOO_SMALL, annotation, f"box {_fmt(box)} is {out_w:.3g}x{out_h:.3g} pixels once "
                        f"resized to {width}x{height}: under one pixel", image)
    mask = None
    if content is not None and given is not None:
        mask = given
    elif content is not None:
        mask = _box_mask(out, placement.output_size) if annotation.segmentation is None else \
            _mask(annotation, scale, mapping, content)
        if isinstance(mask, str):
            return _problem(BAD_SEGMENTATION, annotation, mask, image)
    if mask is not None:
        area = float(mask.sum())
    elif annotation.area is not None and math.isfinite(annotation.area):
        kept = out_w * out_h / ((unclipped[2] - unclipped[0]) * (unclipped[3] - unclipped[1]))  # the crop's share
        area = float(annotation.area) * scale[0] * scale[1] * mapping.kx * mapping.ky * kept
    else:
        area = out_w * out_h
    sides = (width, height, width, height)
    normalised = Box(*(min(1.0, max(0.0, v / side)) for v, side in zip(out, sides, strict=True)))
    cut = clipped != tuple(box) or out != unclipped
    return PlacedObject(annotation.class_name, normalised, area, bool(annotation.is_crowd),
                        bool(annotation.difficult), bool(annotation.truncated or cut), mask, annotation.where)


def place_annotations(annotations: ImageAnnotations, placement: Placement, semantic_mask: bytes | None = None,
                      masks: bool | None = None, instance_mask: bytes | None = None) -> PlacedAnnotations:
    """The image's objects in its output frame (see the module's docstring), and the annotations rejected.

    `placement` is the converted image's (`EncodedImage.placement`); `semantic_mask` the bytes of the file
    `annotations.semantic_mask` names, when it names one. Boxes are clipped to the image, then to the crop
    (`box_outside_image` when nothing is left); one under a pixel of the output wide or high is `box_too_small`;
    one that is not a box `bad_box`; an object whose segmentation cannot be rasterised `bad_segmentation`.
    `masks`: None gives every object a mask when one of the image's objects has a segmentation; True always (a
    dataset of instance masks: one per object in every record, its box for an object without a segmentation);
    False never (boxes only: nothing is rasterised).
    `instance_mask`: the bytes of the file `annotations.instance_mask` names (read with masks only): each object
    whose `instance` index it holds gets that index's pixels as its mask; one whose index has no pixel
    (`empty_instance_mask`), and every object when the file cannot be used (`bad_instance_mask`,
    `instance_mask_size_mismatch`, `instance_mask_extra_index`), is kept with its box as its mask, the problem
    one line of `problems` (a mask's, not an annotation's: INSTANCE_MASK_REASONS).
    """
    image = annotations.relpath
    frame = decide_frame(annotations.frame, annotations.frame_size, placement)
    placed, problems = [], []
    if frame:
        mapping = _Mapping(placement, frame)
        scale = tuple(float(v) for v in mapping.frame_size) if annotations.normalised else (1.0, 1.0)
        if masks is None:
            masks = any(a.segmentation is not None for a in annotations.objects)
        content = _content(placement) if masks else None
        indices, present = None, frozenset()
        if content is not None and instance_mask is not None:
            found = _instances(instance_mask, annotations, placement)
            if isinstance(found[0], str):
                problems.append(AnnotationProblem(found[0], f"{annotations.instance_mask}: {found[1]}", image))
            else:
                indices, present = found
        for annotation in annotations.objects:
            index = annotation.instance if indices is not None else 0
            given = (indices == index).astype(np.uint8) if index in present else None
            result = _place(annotation, mapping, scale, content, image, given)
            (problems if isinstance(result, AnnotationProblem) else placed).append(result)
            if index and given is None and not isinstance(result, AnnotationProblem):
                problems.append(_problem(EMPTY_INSTANCE_MASK, annotation, f"index {index} has no pixel in "
                                         f"{annotations.instance_mask}: its box is its mask", image))
    else:
        detail = "the annotation file gives the image as {}x{}{}, the file is {}x{} ({}x{} upright)".format(
            *annotations.frame_size, f" ({annotations.frame})" if annotations.frame else "",
            *placement.stored_size, *placement.upright_size)
        problems.extend(_problem(IMAGE_SIZE_MISMATCH, a, detail, image) for a in annotations.objects)
    semantic = None
    if semantic_mask is not None:  # a file of its own: its own size says its frame
        semantic = _semantic(semantic_mask, annotations, placement)
        if isinstance(semantic, str):
            problems.append(AnnotationProblem(BAD_SEMANTIC_MASK, f"{annotations.semantic_mask}: {semantic}", image))
            semantic = None
    return PlacedAnnotations(tuple(placed), tuple(problems), frame, semantic)
