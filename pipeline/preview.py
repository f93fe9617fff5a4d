"""Look at a converted dataset: a contact sheet of sample images per class and a chart of class counts.

    python -m pipeline.preview tfrecords/ --contact_sheet=sheet.png [--per_class 8] [--split train]
    python -m pipeline.preview tfrecords/ --class_chart=classes.png
    python -m pipeline.preview gs://bucket/tfrecords/ --contact_sheet=sheet.png --class_chart=classes.png

The images are decoded back from the TFRecords with the reader helper, exactly
as a training job reads them, and each tile is captioned with the label id and
class name stored next to it: a person sees at a glance that labels,
orientation and colours are right. Records are read in shard order, so the same
dataset always gives the same sheet; the shards are shuffled, so the first
images of a class are a random sample of it. An unlabeled set (--unlabeled) has
one row, of its first records in shard order, each captioned with its id. A detection dataset has a row per
class, of the records holding an object of it, each box drawn in its class's colour with its class name (each mask
tinted, with instance masks), the caption the row's class and the record's object count; its class chart counts
objects. A record that cannot be shown (a corrupt record, one that is not an Example, an image that does not decode) is
skipped and named on a `problem:` line with its shard and index; the exit code
is then 1, and 2 when no image at all could be shown.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from pipeline.cli import import_tensorflow, main_of, program_name
from pipeline.errors import DatasetError, UserError
from transforms.base.dataset_format import DETECTION, INFO_FILE
from transforms.base.paths import is_local, write_bytes

_LOG = logging.getLogger("pipeline.preview")
_CHECK = "check the dataset with python -m pipeline.verify"

MARGIN = 12
GAP = 6
FONT_SIZE = 14
CAPTION_HEIGHT = FONT_SIZE + 8
HEADER_HEIGHT = FONT_SIZE + 16
SHEET_BACKGROUND = (24, 24, 24)
TILE_BACKGROUND = (64, 64, 64)
CAPTION_BACKGROUND = (0, 0, 0)
CAPTION_TEXT = (255, 255, 255)
# Bars of the class chart per split, in the same colour on every chart.
UNLABELED_ROW = "unlabeled"  # the one row of an unlabeled set's contact sheet
SPLIT_COLOURS = {"train": "#4C72B0", "validation": "#DD8452", "test": "#55A868"}
# Boxes of a detection dataset, by class id (repeating): saturated colours that differ on photos and on each other.
BOX_COLOURS = ((255, 56, 56), (56, 255, 56), (56, 136, 255), (255, 210, 40), (255, 56, 255), (40, 230, 230),
               (255, 140, 20), (160, 90, 255), (150, 255, 80), (255, 120, 170))
MASK_OPACITY = 0.45


@dataclass(frozen=True)
class Tile:
    """One image placed on the sheet: which record it is and where its pixels are."""

    row: int
    column: int
    label: int  # -1 in an unlabeled set
    class_name: str  # in an unlabeled set (--unlabeled), the record's id
    source_path: str
    record_index: int  # position of the record in the split, in shard order
    box: tuple[int, int, int, int]  # (left, top, right, bottom) of the image pixels on the sheet
    caption_box: tuple[int, int, int, int]
    caption: str = ""  # the text drawn under it (a single label's is cut with an ellipsis if it does not fit)
    # a detection record's objects as drawn: (class id, class name, (left, top, right, bottom) of the box's outline)
    objects: tuple[tuple[int, str, tuple[int, int, int, int]], ...] = ()


def _font(size: int = FONT_SIZE) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # a Pillow without FreeType has only the small bitmap font
        return ImageFont.load_default()


def caption_text(label: int, class_name: str) -> str:
    return f"{label}  {class_name}"


def multi_label_caption(row: int, names: list[str], fits) -> str:
    """A --multi_label record's caption in row `row`: the row's id, then the record's class names (the row's own
    class first, as the record holds them after it) as many as `fits` (text -> bool) allows, and '+N' for the N
    names left out: every label is shown or counted."""
    if not names:
        return f"{row}  (no class)"
    for shown in range(len(names), 0, -1):
        text = f"{row}  {';'.join(names[:shown])}" + (f" +{len(names) - shown}" if shown < len(names) else "")
        if fits(text):
            return text
    return f"{row}  +{len(names)}"


def caption_image(text: str, width: int, height: int = CAPTION_HEIGHT) -> Image.Image:
    """White text on black, cut with an ellipsis when it does not fit the tile."""
    font = _font()
    image = Image.new("RGB", (width, height), CAPTION_BACKGROUND)
    draw = ImageDraw.Draw(image)
    draw.text((4, height // 2), _fit_text(draw, text, font, width - 8), fill=CAPTION_TEXT, font=font, anchor="lm")
    return image


def _fit_text(draw: ImageDraw.ImageDraw, text: str, font, width: int) -> str:
    """`text`, cut with an ellipsis to at most `width` pixels."""
    shown = text
    while shown and draw.textlength(shown, font=font) > width:
        shown = shown[:-1]
    return text if shown == text else shown[:-1].rstrip() + "…"


def fit_tile(pixels: np.ndarray, tile_size: int) -> Image.Image:
    """The image scaled to fit a tile_size square, keeping its aspect ratio (never enlarged past the tile)."""
    image = Image.fromarray(pixels)
    scale = min(tile_size / image.width, tile_size / image.height)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, Image.Resampling.LANCZOS) if size != image.size else image


def box_colour(class_id: int) -> tuple[int, int, int]:
    """The colour of a detection dataset's boxes of class `class_id` (0-based)."""
    return BOX_COLOURS[class_id % len(BOX_COLOURS)]


def tinted(pixels: np.ndarray, masks: np.ndarray, class_ids) -> np.ndarray:
    """`pixels` with each object's 0/1 mask (uint8 [N, H, W]) tinted in its class's colour."""
    out = pixels.astype(np.float32)
    for mask, class_id in zip(masks, class_ids, strict=True):
        where = mask.astype(bool)
        out[where] = (1 - MASK_OPACITY) * out[where] + MASK_OPACITY * np.asarray(box_colour(class_id), np.float32)
    return out.round().astype(np.uint8)


def draw_objects(draw: ImageDraw.ImageDraw, placed: tuple[int, int, int, int], example: dict,
                 class_names: list[str], first_id: int) -> tuple:
    """Draw a detection record's boxes (normalised [ymin, xmin, ymax, xmax]) on its tile, whose image covers
    `placed` (left, top, right, bottom) of the sheet: an outline in the class's colour and the class name on it.
    Returns (class id, class name, outline) of each object."""
    left, top, right, bottom = placed
    width, height = right - left, bottom - top
    font = _font(max(9, FONT_SIZE - 4))
    drawn = []
    for (ymin, xmin, ymax, xmax), label in zip(example["boxes"].tolist(), example["label"].tolist(), strict=True):
        class_id = int(label) - first_id
        name = class_names[class_id] if 0 <= class_id < len(class_names) else f"<id {label}>"
        outline = (left + round(xmin * (width - 1)), top + round(ymin * (height - 1)),
                   left + round(xmax * (width - 1)), top + round(ymax * (height - 1)))
        colour = box_colour(class_id)
        draw.rectangle(outline, outline=colour, width=1 if min(width, height) < 96 else 2)
        text_box = draw.textbbox((outline[0] + 2, outline[1] + 1), name, font=font)
        draw.rectangle(text_box, fill=colour)
        draw.text((outline[0] + 2, outline[1] + 1), name, fill=(0, 0, 0), font=font)
        drawn.append((class_id, name, outline))
    return tuple(drawn)


def _label_of(data: bytes, label_key: str, multi_label: bool = False) -> int | tuple[int, ...] | str:
    """The int64 label of a serialized Example (with `multi_label`, its tuple of labels), or what is wrong with
    the record (a string)."""
    from google.protobuf.message import DecodeError

    from transforms.base.examples import Example

    try:
        features = Example.FromString(data).features.feature
    except DecodeError:
        return "not a tf.train.Example (it does not parse)"
    values = features[label_key].int64_list.value if label_key in features else []
    if multi_label and label_key in features:
        return tuple(values)
    if len(values) != 1:
        return f"has no int64 feature {label_key!r}"
    return values[0]


def sample_records(dataset_dir: str, info: dict, split: str, per_class: int, max_records: int,
                   problems: list[str] | None = None) -> tuple[dict, int]:
    """The first `per_class` records of each class in shard order, reading at most `max_records`.

    A record that cannot be shown (a corrupt record, one that is no Example, an
    image that does not decode) is skipped and described in `problems` as
    "<shard> record <index in the shard>: <what>; skipped"; the next record of its
    class takes its place. A shard whose framing breaks is skipped from there on.

    Returns ({label: [(record_index in the split, decoded example dict)]}, records read).
    """
    import tensorflow as tf

    from pipeline import reader
    from transforms.base.tfrecord import CorruptRecord, scan_shard

    problems = [] if problems is None else problems
    paths = reader.shard_paths(dataset_dir, split, info)  # refuses a missing split, or a dataset of no records
    schema = info["schema"]
    image_key, label_key = reader.image_label_keys(schema)
    budget = reader.decode_budget(info)  # an image is measured from its header before it is decoded
    detection = info.get("task") == DETECTION  # a record goes in the row of each class of its objects
    first_id = (info.get("detection") or {}).get("first_id", 1) if detection else 0
    multi_label = bool(info.get("multi_label")) or detection  # a record goes in the row of each of its classes
    unlabeled = bool(info.get("unlabeled"))  # one row (0): the split's first records
    # image_tfrecords.json says how many images each class has here: stop as soon as all of them are found.
    counts = info["splits"][split].get("class_counts", {})
    wanted = {label: min(per_class, counts.get(name, 0)) for label, name in enumerate(info["class_names"])}
    if unlabeled:
        wanted = {0: min(per_class, info["splits"][split]["records"])}
    elif detection and not counts:  # no objects per class given: look for `per_class` of each, up to max_records
        wanted = dict.fromkeys(range(len(info["class_names"])), per_class)
    chosen: dict[int, list] = {label: [] for label in wanted}
    read = offset = 0  # records read; position of the shard's first record in the split
    # Records are read one shard after another (CRCs checked without TensorFlow), so the sheet is the same on
    # every run and a bad record is named by its shard and index, and skipped.
    for path, listed in zip(paths, info["splits"][split]["shards"], strict=True):
        name = path.rsplit("/", 1)[-1]
        try:
            for index, data in scan_shard(path):
                if not any(wanted.values()) or read >= max_records:
                    return chosen, read
                read += 1
                label = "data checksum mismatch (the record's bytes are corrupt)" if data is None else \
                    0 if unlabeled else _label_of(data, label_key, multi_label)
                if isinstance(label, str):
                    problems.append(f"{name} record {index}: {label}; skipped")
                    continue
                ids = sorted({k - first_id for k in label}) if detection else label if multi_label else (label,)
                rows = [k for k in ids if wanted.get(k, 0) > 0]
                if not rows:
                    continue
                too_large = reader.record_too_large(data, image_key, budget)
                if too_large:
                    problems.append(f"{name} record {index}: cannot be shown ({too_large}); skipped")
                    continue
                try:
                    example = reader.parse_example(data, schema, decode=True, multi_label=multi_label,
                                                   unlabeled=unlabeled)
                    example = {k: v.numpy() for k, v in example.items()}
                    if detection and (info.get("detection") or {}).get("instance_masks"):
                        example["image"] = _tinted_record(data, example, first_id)
                except (tf.errors.OpError, UnicodeDecodeError) as e:
                    problems.append(f"{name} record {index}: cannot be shown ({reader.error_text(e)}); skipped")
                    continue
                for row in rows:
                    wanted[row] -= 1
                    chosen[row].append((offset + index, example))
        except CorruptRecord as e:
            problems.append(f"{name} {e}; skipped the rest of this shard")
        offset += listed["records"]
    return chosen, read


def _tinted_record(data: bytes, example: dict, first_id: int) -> np.ndarray:
    """A detection record's decoded image with its instance masks tinted (`tinted`)."""
    from pipeline.readers.detection import parse_detection

    masks = parse_detection(data, decode=True, instance_masks=True)["masks"].numpy()
    return tinted(example["image"], masks, [int(k) - first_id for k in example["label"]])


def draw_contact_sheet(info: dict, chosen: dict, split: str, per_class: int, tile_size: int,
                       title: str = "") -> tuple[Image.Image, list[Tile]]:
    """One row per class, `per_class` captioned tiles per row; returns the sheet and where each record went.

    An unlabeled set has one row, each tile captioned with its record's id."""
    unlabeled = bool(info.get("unlabeled"))
    detection = info.get("task") == DETECTION  # boxes drawn on the tiles
    first_id = (info.get("detection") or {}).get("first_id", 1) if detection else 0
    names = [UNLABELED_ROW] if unlabeled else info["class_names"]
    cell_w, cell_h = tile_size, tile_size + CAPTION_HEIGHT
    width = 2 * MARGIN + per_class * cell_w + (per_class - 1) * GAP
    height = HEADER_HEIGHT + MARGIN + len(names) * cell_h + (len(names) - 1) * GAP
    sheet = Image.new("RGB", (width, height), SHEET_BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = _font()
    draw.text((MARGIN, HEADER_HEIGHT // 2 + 2), _fit_text(draw, title, font, width - 2 * MARGIN), fill=CAPTION_TEXT,
              font=font, anchor="lm")
    tiles = []
    for row, name in enumerate(names):
        top = HEADER_HEIGHT + row * (cell_h + GAP)
        records = chosen.get(row, [])
        for column in range(per_class):
            left = MARGIN + column * (cell_w + GAP)
            sheet.paste(TILE_BACKGROUND, (left, top, left + cell_w, top + tile_size))
            caption_box = (left, top + tile_size, left + cell_w, top + cell_h)
            if column >= len(records):
                if column == len(records):  # say why the row ends early
                    sheet.paste(caption_image(f"{row}  {name}: no more in {split}", cell_w), caption_box[:2])
                continue
            index, example = records[column]
            # The caption shows what the record says, so a wrong label in the data is visible as such.
            if unlabeled:  # no label: the id, to match a prediction to its file
                label, class_name = -1, example["id"].decode("utf-8")
                caption = class_name
            elif detection:  # the row's class; the objects' names are drawn on their boxes
                label, class_name = row, name
                count = len(example["label"])
                caption = f"{row}  {name}: {count} object{'' if count == 1 else 's'}"
            elif example["label"].ndim:  # --multi_label: the row's class, and every name the record holds
                label, held = row, [n.decode("utf-8") for n in example["class_name"]]
                class_name = ";".join(held)
                held.sort(key=lambda n: n != name)  # the row's own class first, the others in the record's order
                caption = multi_label_caption(row, held, lambda text: draw.textlength(text, font=font) <= cell_w - 8)
            else:
                label, class_name = int(example["label"]), example["class_name"].decode("utf-8")
                caption = caption_text(label, class_name)
            image = fit_tile(example["image"], tile_size)
            x = left + (tile_size - image.width) // 2
            y = top + (tile_size - image.height) // 2
            sheet.paste(image, (x, y))
            placed = (x, y, x + image.width, y + image.height)
            objects = draw_objects(draw, placed, example, names, first_id) if detection else ()
            sheet.paste(caption_image(caption, cell_w), caption_box[:2])
            tiles.append(Tile(row, column, label, class_name, example["source_path"].decode("utf-8"), index,
                              placed, caption_box, caption, objects))
    return sheet, tiles


def make_contact_sheet(dataset_dir: str, split: str | None = None, per_class: int = 8, tile_size: int = 128,
                       max_records: int = 100_000, problems: list[str] | None = None) -> tuple[Image.Image, list[Tile]]:
    """Read samples of every class from `split` (default: train, else the first split) and draw the sheet.

    Records that cannot be shown are skipped and described in `problems` (see
    sample_records); without that list each is logged as a warning.

    Raises:
        DatasetError: when `dataset_dir` holds no complete dataset or has no such split.
    """
    from pipeline import reader

    info = reader.load_info(dataset_dir)
    split = split or ("train" if "train" in info["splits"] else next(iter(info["splits"]), "train"))
    found: list[str] = []
    chosen, read = sample_records(dataset_dir, info, split, per_class, max_records, found)
    if problems is None:
        for problem in found:
            _LOG.warning("%s", problem)
    else:
        problems.extend(found)
    counts = info["splits"][split].get("class_counts", {})
    missed = [f"{name} ({len(chosen[label])} of {counts.get(name, 0)})"
              for label, name in enumerate(info["class_names"])
              if len(chosen[label]) < min(per_class, counts.get(name, 0))
              and info.get("task") != DETECTION]  # a detection dataset counts objects: a record holds several
    if missed and read >= max_records:
        _LOG.warning("Not every image to show was found in the first %d records of %s: %s; raise --max_records",
                     read, split, ", ".join(missed))
    elif missed and not found:
        _LOG.warning("Fewer images than %s counts were found in %s: %s; check the dataset with python -m "
                     "pipeline.verify", INFO_FILE, split, ", ".join(missed))
    what = "unlabeled  |  id as stored" if info.get("unlabeled") else \
        f"{len(info['class_names'])} classes  |  boxes and class names as stored" if info.get("task") == DETECTION \
        else f"{len(info['class_names'])} classes  |  label id and class name as stored"
    title = f"{dataset_dir.rstrip('/')}  |  {split}: {info['splits'][split]['records']} images, {what}"
    return draw_contact_sheet(info, chosen, split, per_class, tile_size, title)


def class_chart(info: dict):
    """A matplotlib Figure of images per class, one bar per split; many classes are sorted and unlabelled."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    names = info["class_names"]
    splits = list(info["splits"])
    counts = {s: [info["splits"][s].get("class_counts", {}).get(n, 0) for n in names] for s in splits}
    many = len(names) > 60
    order = list(range(len(names)))
    if many:
        order.sort(key=lambda i: -sum(counts[s][i] for s in splits))
    width = min(max(6.0, 0.25 * len(names) * max(len(splits), 1) + 2), 16.0)
    fig = Figure(figsize=(width, 4.5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(names))
    bar_width = 0.8 / max(len(splits), 1)
    for i, split in enumerate(splits):
        heights = [counts[split][j] for j in order]
        if many:  # stacked: side-by-side bars of hundreds of classes would be hairlines
            bottom = [sum(counts[s][j] for s in splits[:i]) for j in order]
            ax.bar(x, heights, 1.0, bottom=bottom, label=split, color=SPLIT_COLOURS.get(split))
        else:
            bars = ax.bar(x + (i - (len(splits) - 1) / 2) * bar_width, heights, bar_width, label=split,
                          color=SPLIT_COLOURS.get(split))
            if len(names) <= 20:
                ax.bar_label(bars, fontsize=8, padding=2)
    if many:
        ax.set_xticks([])
        ax.set_xlabel(f"{len(names)} classes, sorted by count (names and counts in image_tfrecords.json)")
    else:
        ax.set_xticks(x, [f"{i} {names[i]}" for i in order], rotation=45 if len(names) > 6 else 0, ha="right"
                      if len(names) > 6 else "center")
    what = "objects" if info.get("task") == DETECTION else "images"  # a detection dataset counts objects
    ax.set_ylabel(what)
    ax.set_title(f"{what.capitalize()} per class and split")
    ax.margins(y=0.15)  # room above the tallest bar for its count and the legend
    ax.legend(loc="upper right", ncols=len(splits))
    return fig


_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP"}


def _check_image_path(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in _FORMATS:
        raise UserError(f"cannot write {path}: give a file name ending in .png, .jpg or .webp")
    return ext


def _save(image_or_figure, path: str) -> None:
    """Save a PIL image or a matplotlib figure to a local path or gs:// (format from the extension)."""
    import io

    ext = _check_image_path(path)
    image = image_or_figure
    if not isinstance(image, Image.Image):  # a figure: rendered by Agg, then encoded like a sheet
        rendered = io.BytesIO()
        image.savefig(rendered, format="png")
        image = Image.open(io.BytesIO(rendered.getvalue())).convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format=_FORMATS[ext], **({"optimize": True} if ext == ".png" else {"quality": 90}))
    if is_local(path):
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise UserError(f"cannot write {path}: the folder {directory} does not exist")
    write_bytes(path, buffer.getvalue())


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name("python -m pipeline.preview"),
        description="Draw a contact sheet of sample images per class, decoded back from the TFRecords, and/or a "
                    "bar chart of images per class and split.")
    add = parser.add_argument
    add("dataset_dir", help="the dataset folder (--output_dir of the conversion), local or gs://")
    add("--contact_sheet", default=None, metavar="FILE.png",
        help="write the contact sheet here (.png, .jpg or .webp; local or gs://). Default: none.")
    add("--class_chart", default=None, metavar="FILE.png",
        help="write the bar chart of images per class and split here. Default: none.")
    add("--per_class", type=int, default=8, help="images per class on the contact sheet. Default: 8.")
    add("--split", default=None, help="split to sample the contact sheet from. Default: train (else the first).")
    add("--tile_size", type=int, default=128, help="side of each tile in pixels. Default: 128.")
    add("--max_records", type=int, default=100_000,
        help="read at most this many records looking for images of every class. Default: 100000.")
    add("--verbose", action="store_true", help="show TensorFlow's own logs. Default: off.")
    return parser


def run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not args.contact_sheet and not args.class_chart:
        raise UserError("nothing to draw: give --contact_sheet=FILE.png and/or --class_chart=FILE.png")
    if not 1 <= args.per_class <= 100:
        raise UserError(f"--per_class={args.per_class} is out of range: give 1 to 100")
    if not 16 <= args.tile_size <= 1024:
        raise UserError(f"--tile_size={args.tile_size} is out of range: give 16 to 1024 pixels")
    if args.max_records < 1:
        raise UserError(f"--max_records={args.max_records} must be at least 1")
    for path in filter(None, (args.contact_sheet, args.class_chart)):
        _check_image_path(path)
    _configure_logging(args.verbose)
    import_tensorflow(args.verbose)  # before the reader imports it, so that it loads quietly
    from pipeline import reader

    info = reader.load_info(args.dataset_dir)
    if args.class_chart and info.get("unlabeled"):
        raise UserError(f"--class_chart: {args.dataset_dir} is an unlabeled set (--unlabeled), with no classes to "
                        "chart: drop --class_chart (--contact_sheet shows its images with their ids)")
    if args.class_chart and info.get("task") == DETECTION and not any(
            split.get("class_counts") for split in info["splits"].values()):
        raise UserError(f"--class_chart: {INFO_FILE} of {args.dataset_dir} gives no objects per class (class_counts) "
                        "to chart: drop --class_chart (python -m pipeline.verify counts the objects)")
    problems: list[str] = []
    if args.contact_sheet:
        sheet, tiles = make_contact_sheet(args.dataset_dir, args.split, args.per_class, args.tile_size,
                                          args.max_records, problems)
        for problem in problems:
            print(f"problem: {problem}", file=sys.stderr)
        if problems and not tiles:
            split = args.split or ("train" if "train" in info["splits"] else next(iter(info["splits"])))
            raise DatasetError(f"no image of split {split!r} of {args.dataset_dir} could be shown: {len(problems)} "
                               f"record{'s were' if len(problems) > 1 else ' was'} skipped (listed above); "
                               f"{_CHECK}")
        _save(sheet, args.contact_sheet)
        skipped = f"; {len(problems)} record{'s' if len(problems) > 1 else ''} could not be shown (listed " \
                  f"above); {_CHECK}" if problems else ""
        of = "an unlabeled set" if info.get("unlabeled") else f"{len(info['class_names'])} classes"
        print(f"Wrote {args.contact_sheet}: {len(tiles)} images of {of} ({sheet.width}x{sheet.height} px){skipped}")
    if args.class_chart:
        _save(class_chart(info), args.class_chart)
        what = "objects" if info.get("task") == DETECTION else "images"
        print(f"Wrote {args.class_chart}: {what} per class for {', '.join(info['splits'])}")
    return 1 if problems else 0


# What Ctrl-C or SIGTERM leaves (pipeline.cli.main_of's last line).
STOPPED = ("preview stopped; the dataset is unchanged, and a contact sheet or chart it was writing may be "
           "incomplete: run the same command again")


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point: `run`, with one error line for a bad input or an interruption."""
    return main_of(run, argv, stopped=STOPPED)


if __name__ == "__main__":
    sys.exit(main())
