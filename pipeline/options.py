"""All command-line options of the converter, as one Beam `PipelineOptions` subclass.

Every Beam flag (`--runner`, `--direct_num_workers`, `--project`, ...) passes
through unchanged. `validate()` checks every value before anything is built and
returns the typed settings the rest of the launcher uses.
"""

from __future__ import annotations

import argparse
import datetime
import math
import re
import time
from dataclasses import dataclass

from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.errors import UserError
from transforms.examples import SCHEMAS
from transforms.imaging import (
    CHROMA_SUBSAMPLING,
    IMAGE_FORMATS,
    RESAMPLE_FILTERS,
    RESIZE_MODES,
    ImageSettings,
)

COMPRESSIONS = ("none", "gzip")
IF_EXISTS = ("refuse", "overwrite", "skip")
MAX_CONVERSION_THREADS = 32


def parse_bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


# On/off flags: `--overwrite` alone, or `--overwrite=true|false` as Dataflow Flex Templates pass them.
ON_OFF = dict(nargs="?", const=True, default=False, type=parse_bool, metavar="true|false")
NAMED_COLOURS = {
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "grey": (128, 128, 128),
    "gray": (128, 128, 128),
}


class ConvertOptions(PipelineOptions):
    """Options of `python -m pipeline.main`."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add = parser.add_argument
        add("--input_dir", default=None,
            help="Folder of images, local or gs://: <input_dir>/<class>/<image>, or "
                 "<input_dir>/<split>/<class>/<image> with split folders train/, validation/ (or val/), test/. "
                 "Required.")
        add("--output_dir", default=None,
            help="Folder for the TFRecord shards and dataset_info.json, local or gs://. {date} and {timestamp} in "
                 "it become the UTC launch date (2024-01-31) and time (20240131-235959), for scheduled runs; "
                 "--run_date sets the date. Required.")
        add("--run_date", default=None,
            help="The date that {date} in --output_dir stands for, YYYY-MM-DD: a scheduler's logical date "
                 "(Airflow's {{ ds }}), so that backfills and late retries write the right folder. "
                 "Default: none, the UTC launch date.")
        add("--labels_file", default=None,
            help="Text file with one class name per line; line i gets label id i, so ids stay fixed across "
                 "runs. Default: none, ids are 0..K-1 in sorted order of the class folder names.")
        add("--validation_split", type=float, default=0.2,
            help="Share of images assigned to validation by a hash of their path, when the input has no "
                 "split folders. Default: 0.2.")
        add("--test_split", type=float, default=0.0,
            help="Share of images assigned to test, like --validation_split. Default: 0.0.")
        add("--seed", type=int, default=42,
            help="Seed of the split hash and of the shuffle order. Default: 42.")
        add("--image_size", default="512",
            help="Output size: N for NxN, or WxH such as 640x480. Default: 512.")
        add("--resize_mode", default="stretch", choices=RESIZE_MODES,
            help="stretch to the size (as image_dataset_from_directory does), crop the centre to the aspect "
                 "ratio then resize, pad (letterbox) with --background, fit inside the size keeping the aspect "
                 "ratio (variable size), or none (original size). Default: stretch.")
        add("--resample", default="bilinear", choices=tuple(RESAMPLE_FILTERS),
            help="Resampling filter. Default: bilinear.")
        add("--image_format", default="jpeg", choices=IMAGE_FORMATS,
            help="Encoding of the stored images; png is lossless. Default: jpeg.")
        add("--jpeg_quality", type=int, default=95,
            help="JPEG quality, 1-100. Default: 95.")
        add("--chroma_subsampling", default="4:2:0", choices=tuple(CHROMA_SUBSAMPLING),
            help="JPEG chroma subsampling. Default: 4:2:0.")
        add("--background", default="white",
            help="Colour that transparent pixels are composited onto and that pads letterboxed images: "
                 "white, black, grey, #rrggbb or r,g,b. Default: white.")
        add("--max_pixels", type=int, default=ImageSettings.max_pixels,
            help="Images declaring more pixels than this are rejected as decompression bombs before "
                 f"decoding. Default: {ImageSettings.max_pixels}.")
        add("--max_image_mb", type=int, default=ImageSettings.max_image_mb,
            help="Memory in MB one image may need while it is converted (its decoded pixels, by pixel mode and "
                 "bit depth, plus an RGB copy), checked from the header before decoding; a larger one is rejected "
                 "as image_too_large_in_memory. JPEGs count at the reduced scale they are decoded at. "
                 f"Default: {ImageSettings.max_image_mb}.")
        add("--max_file_mb", type=int, default=ImageSettings.max_file_mb,
            help="Files larger than this many MB are rejected as file_too_large without being read, and no read "
                 f"goes past it. Default: {ImageSettings.max_file_mb}.")
        add("--image_timeout_s", type=float, default=ImageSettings.timeout_s,
            help="Seconds one image may take to convert; a slower one is rejected as timeout. 0 = no limit. "
                 f"Default: {ImageSettings.timeout_s:g}.")
        add("--conversion_threads", type=int, default=2,
            help="Threads reading and converting images in each worker process. Pillow decodes and resizes "
                 "outside Python's lock, so two keep a core busy while the other waits, and let busy workers use "
                 "the cores of idle ones. Default: 2.")
        add("--schema", default="default", choices=tuple(SCHEMAS),
            help="Example keys: default (image, label, class_name, height, width, source_path) or tf_slim "
                 "(image/encoded, image/class/label, ...). Default: default.")
        add("--num_shards", type=int, default=0,
            help="Shards per split. Default: 0, sized for shards of about --shard_size_mb.")
        add("--shard_size_mb", type=int, default=150,
            help="Target shard size in MB when --num_shards is 0. Default: 150.")
        add("--compression", default="none", choices=COMPRESSIONS,
            help="TFRecord compression; gzip shards end in .tfrecord.gz. Default: none.")
        add("--index_files", **ON_OFF,
            help="Also write each shard's index for DALI's TFRecord reader and the tfrecord package, beside it: "
                 "train-00000-of-00004.idx for train-00000-of-00004.tfrecord, one 'offset length' line per record. "
                 "Uncompressed shards only. Default: off.")
        add("--if_exists", default="refuse", choices=IF_EXISTS,
            help="What a complete dataset already in --output_dir means: refuse stops with an error; overwrite "
                 "replaces it once the new run has finished (only files this tool writes are removed); skip exits "
                 "0 without converting when it was made from the same options, for schedulers' retries, and "
                 "refuses one made with other options. Default: refuse.")
        add("--follow_symlinks", **ON_OFF,
            help="Also read symlinks (to files or folders) whose target is outside --input_dir. Symlinks inside "
                 "it are always followed. Default: off, such a link is reported as symlink_outside_input in "
                 "errors.jsonl.")
        add("--overwrite", **ON_OFF,
            help="The same as --if_exists=overwrite. Default: off.")
        add("--quiet", **ON_OFF,
            help="Print nothing but errors and the final summary. Default: off.")
        add("--verbose", **ON_OFF,
            help="Show Beam's and TensorFlow's own logs. Default: off.")
        add("--no_wait", **ON_OFF,
            help="Dataflow only: return once the job is submitted, printing its console link, instead of "
                 "waiting for it and printing the summary. Flex Template launches never wait. Default: off.")


@dataclass(frozen=True)
class Settings:
    """Validated, typed options of one conversion."""

    input_dir: str
    output_dir: str
    labels_file: str | None
    validation_split: float
    test_split: float
    seed: int
    image: ImageSettings
    schema: str
    num_shards: int
    shard_size_mb: int
    compression: str
    conversion_threads: int
    if_exists: str
    follow_symlinks: bool
    quiet: bool
    verbose: bool
    index_files: bool = False

    @property
    def overwrite(self) -> bool:
        return self.if_exists == "overwrite"

    def as_dict(self) -> dict:
        """The options as recorded in dataset_info.json."""
        image = self.image
        return {
            "input_dir": self.input_dir,
            "labels_file": self.labels_file,
            "validation_split": self.validation_split,
            "test_split": self.test_split,
            "seed": self.seed,
            "image_size": f"{image.width}x{image.height}",
            "resize_mode": image.resize_mode,
            "resample": image.resample,
            "image_format": image.image_format,
            "jpeg_quality": image.jpeg_quality,
            "chroma_subsampling": image.chroma_subsampling,
            "background": "#{:02x}{:02x}{:02x}".format(*image.background),
            "max_pixels": image.max_pixels,
            "max_image_mb": image.max_image_mb,
            "max_file_mb": image.max_file_mb,
            "image_timeout_s": image.timeout_s,
            "schema": self.schema,
            "num_shards": self.num_shards,
            "shard_size_mb": self.shard_size_mb,
            "compression": self.compression,
            "follow_symlinks": self.follow_symlinks,
            "index_files": self.index_files,
        }


def parse_image_size(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", str(text))
    if not match:
        raise UserError(f"--image_size={text!r} is not a size: give N (square) or WxH such as 640x480")
    width = int(match.group(1))
    height = int(match.group(2) or width)
    if not (1 <= width <= 16384 and 1 <= height <= 16384):
        raise UserError(f"--image_size={text!r} is out of range: each side must be 1 to 16384 pixels")
    return width, height


def parse_colour(text: str) -> tuple[int, int, int]:
    value = str(text).strip().lower()
    if value in NAMED_COLOURS:
        return NAMED_COLOURS[value]
    if re.fullmatch(r"#[0-9a-f]{6}", value):
        return tuple(int(value[i:i + 2], 16) for i in (1, 3, 5))
    parts = value.split(",")
    if len(parts) == 3 and all(p.strip().isdigit() and int(p) <= 255 for p in parts):
        return tuple(int(p) for p in parts)
    raise UserError(f"--background={text!r} is not a colour: use white, black, grey, #rrggbb or r,g,b (0-255)")


def parse_run_date(text: str | None) -> str | None:
    """--run_date as YYYY-MM-DD, or None."""
    if text is None or str(text).strip() == "":
        return None
    value = str(text).strip()
    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            raise ValueError
        datetime.date.fromisoformat(value)
    except ValueError:
        raise UserError(f"--run_date={text!r} is not a date: give YYYY-MM-DD, such as 2024-01-31 "
                        "(Airflow: --run_date={{ ds }})") from None
    return value


def expand_placeholders(path: str, flag: str, now: float | None = None, run_date: str | None = None) -> str:
    """`{date}` and `{timestamp}` in `path` become the UTC date and time of the launch.

    A scheduled job (Flex Template, Cloud Scheduler) passes the same parameters every
    time; these placeholders give each run its own dated output folder. `run_date`
    (a scheduler's logical date) replaces the launch date in `{date}`.
    """
    stamp = time.gmtime(now)
    values = {"date": run_date or time.strftime("%Y-%m-%d", stamp),
              "timestamp": time.strftime("%Y%m%d-%H%M%S", stamp)}

    def substitute(match: re.Match) -> str:
        name = match.group(1)
        if name not in values:
            raise UserError(f"{flag} {path} has the unknown placeholder {{{name}}}: use {{date}} or {{timestamp}}")
        return values[name]

    return re.sub(r"\{([^{}]*)\}", substitute, path)


def validate(options: PipelineOptions) -> Settings:
    """Check every option and return typed settings.

    Raises:
        UserError: for the first invalid value, with what to do about it.
    """
    o = options.view_as(ConvertOptions)
    if not o.input_dir:
        raise UserError("--input_dir is required: the folder of class folders to convert")
    if not o.output_dir:
        raise UserError("--output_dir is required: the folder to write the TFRecord dataset to")
    for name in ("validation_split", "test_split"):
        value = getattr(o, name)
        if not 0.0 <= value < 1.0:
            raise UserError(f"--{name}={value} is out of range: give a fraction from 0 up to (not including) 1")
    if o.validation_split + o.test_split >= 1.0:
        raise UserError(
            f"--validation_split + --test_split = {o.validation_split + o.test_split:g} leaves no training "
            "images: keep the sum below 1"
        )
    width, height = parse_image_size(o.image_size)
    if not 1 <= o.jpeg_quality <= 100:
        raise UserError(f"--jpeg_quality={o.jpeg_quality} is out of range: give 1 to 100")
    if o.max_pixels < 1:
        raise UserError(f"--max_pixels={o.max_pixels} must be a positive number of pixels")
    for name in ("max_image_mb", "max_file_mb"):
        if getattr(o, name) < 1:
            raise UserError(f"--{name}={getattr(o, name)} must be a positive number of MB")
    if not (o.image_timeout_s >= 0 and math.isfinite(o.image_timeout_s)):
        raise UserError(f"--image_timeout_s={o.image_timeout_s} must be 0 (no limit) or a positive number of seconds")
    if not 1 <= o.conversion_threads <= MAX_CONVERSION_THREADS:
        raise UserError(f"--conversion_threads={o.conversion_threads} must be between 1 and {MAX_CONVERSION_THREADS}: "
                        "2 suits most machines")
    if o.num_shards < 0:
        raise UserError(f"--num_shards={o.num_shards} must be 0 (automatic) or a positive count")
    if o.shard_size_mb < 1:
        raise UserError(f"--shard_size_mb={o.shard_size_mb} must be at least 1")
    if o.index_files and o.compression != "none":
        raise UserError(f"--index_files needs uncompressed shards, but --compression={o.compression}: an index "
                        "holds byte offsets into the uncompressed file; drop one of the two options")
    if o.quiet and o.verbose:
        raise UserError("--quiet and --verbose contradict each other: give one of them")
    if_exists = o.if_exists
    if o.overwrite:
        if if_exists not in ("refuse", "overwrite"):
            raise UserError(f"--overwrite and --if_exists={if_exists} contradict each other: give one of them")
        if_exists = "overwrite"
    run_date = parse_run_date(o.run_date)
    image = ImageSettings(
        width=width,
        height=height,
        resize_mode=o.resize_mode,
        resample=o.resample,
        image_format=o.image_format,
        jpeg_quality=o.jpeg_quality,
        chroma_subsampling=o.chroma_subsampling,
        background=parse_colour(o.background),
        max_pixels=o.max_pixels,
        max_image_mb=o.max_image_mb,
        max_file_mb=o.max_file_mb,
        timeout_s=o.image_timeout_s,
    )
    return Settings(
        input_dir=o.input_dir.rstrip("/") or "/",
        output_dir=expand_placeholders(o.output_dir, "--output_dir", run_date=run_date).rstrip("/") or "/",
        labels_file=o.labels_file,
        validation_split=o.validation_split,
        test_split=o.test_split,
        seed=o.seed,
        image=image,
        schema=o.schema,
        num_shards=o.num_shards,
        conversion_threads=o.conversion_threads,
        shard_size_mb=o.shard_size_mb,
        compression=o.compression,
        if_exists=if_exists,
        follow_symlinks=o.follow_symlinks,
        quiet=o.quiet,
        verbose=o.verbose,
        index_files=o.index_files,
    )


def check_flags(argv: list[str]) -> None:
    """Reject malformed values and unknown flags with one line, instead of argparse's usage dump.

    Beam silently discards flags it does not know; a typo such as --input_dri
    would then run with defaults, so unknown flags are an error here.
    """
    ours = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    ConvertOptions._add_argparse_args(ours)
    try:
        ours.parse_known_args(argv)
    except argparse.ArgumentError as e:
        raise UserError(f"{e}; run with --help to see the options") from None
    captured = []
    PipelineOptions(argv).get_all_options(add_extra_args_fn=captured.append)
    _, unknown = captured[0].parse_known_args(argv)
    flags = [a.split("=", 1)[0] for a in unknown if a.startswith("-")]
    if flags:
        raise UserError(f"unknown option {flags[0]}; run with --help to see the options")
    if unknown:
        raise UserError(f"unexpected argument {unknown[0]!r}: options take the form --name=value")


def help_text() -> str:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.main",
        description="Convert a folder of labeled images into sharded TFRecord files with Apache Beam.",
        epilog="Any Apache Beam pipeline option (--runner, --direct_num_workers, --project, --region, "
               "--temp_location, ...) is accepted too.",
    )
    ConvertOptions._add_argparse_args(parser)
    return parser.format_help()
