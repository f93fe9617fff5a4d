"""All command-line options of the converter, as one Beam `PipelineOptions` subclass.

Every Beam flag (`--runner`, `--direct_num_workers`, `--project`, ...) passes
through unchanged. `validate()` checks every value before anything is built and
returns the typed settings the rest of the launcher uses.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import math
import os
import re
import time
from dataclasses import dataclass

import regex
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline import workers
from pipeline.cli import parse_image_size
from pipeline.errors import UserError
from pipeline.flags import MAX_CONVERSION_THREADS, add_convert_arguments
from pipeline.inputs import read_small_file
from transforms.base.dataset_format import CLASSIFICATION, DETECTION, SHARD_FORMATS, SPLITS, split_of
from transforms.base.features import format_spec, parse_spec
from transforms.base.paths import bucket_problem, is_local
from transforms.base.transient import JOB_READS_PER_S, process_start_rate
from transforms.images.settings import ImageSettings
from transforms.labels.layout import (
    LABEL_FROM_EXAMPLE,
    UNLABELED_SPLIT,
    compile_group_by,
    has_group_capture,
    label_from_problem,
)

NAMED_COLOURS = {
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "grey": (128, 128, 128),
    "gray": (128, 128, 128),
}


# The converter's options that say only how a run goes (where to, how fast, with how much memory, what to print),
# never what a record holds: not in `Settings.as_dict`, so not in the plan's fingerprint nor image_tfrecords.json.
# Every other option is recorded (tests/test_resume.py checks that each flag is in one of the two).
RUN_OPTIONS = frozenset({"output_dir", "run_date", "worker_memory_mb", "throttled_retry_s", "initial_read_rate",
                         "conversion_threads", "if_exists", "overwrite", "quiet", "verbose", "no_wait"})


class ConvertOptions(PipelineOptions):
    """Options of `python -m pipeline.main`."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_convert_arguments(parser)


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
    num_shards: dict[str, int]  # split -> shard count; a split not in it is sized by shard_size_mb
    shard_size_mb: int
    compression: str
    conversion_threads: int
    if_exists: str
    follow_symlinks: bool
    quiet: bool
    verbose: bool
    index_files: bool = False
    file_format: str = "tfrecord"
    shard_names: str = "standard"
    group_by: str | None = None
    duplicates: str = "keep"
    manifest: str | None = None  # CSV or JSON Lines of path,label[,split]; input_dir is then the base of its paths
    # --manifest's files or glob patterns, as given (comma-separated); (manifest,) for one file
    manifests: tuple[str, ...] = ()
    # without --input_dir, a manifest's relative paths are below its own folder (each file's, with several)
    paths_below_manifest: bool = False
    features: tuple = ()  # --features: the declared FeatureTypes (transforms.base.features), in the order given
    metadata: str | None = None  # --metadata: CSV or JSON Lines of path + extra columns, joined to folder images
    multi_label: bool = False  # --manifest's labels column: several classes per image
    unlabeled: bool = False  # --unlabeled: a flat folder of images, no labels, one split (UNLABELED_SPLIT)
    split_lists: tuple = ()  # --split_lists: (split, path) of each list, in SPLITS order; () for none
    label_from: str | None = None  # --label_from: a regex whose group `label` finds each listed image's class name
    task: str = CLASSIFICATION  # --task: classification, or detection (boxes and masks: transforms/detection/)
    first_class_id: int = 1  # --task=detection: the id of the first class in the records and label_map.pbtxt
    images_without_objects: str = "keep"  # --task=detection: keep or drop the images without any object
    instance_masks: bool = False  # --task=detection: one mask PNG per object in every record

    @property
    def detection(self) -> bool:
        return self.task == DETECTION

    @property
    def overwrite(self) -> bool:
        return self.if_exists == "overwrite"

    def as_dict(self) -> dict:
        """The options as recorded in image_tfrecords.json: every option that decides a record's bytes, which set,
        split or shard it is in, or which files are rejected; the others, which say only how a run goes, are
        `RUN_OPTIONS` (tests/test_resume.py holds every flag to one of the two). These are the options of the plan's
        fingerprint (`pipeline.plan.plan_record`: a resume), of --if_exists=skip and of an append's check."""
        image = self.image
        return {
            "input_dir": self.input_dir,
            "manifest": self.manifest,
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
            "image_backend": image.image_backend,  # the fast core and Pillow encode other bytes
            "background": "#{:02x}{:02x}{:02x}".format(*image.background),
            "max_pixels": image.max_pixels,
            "max_image_mb": image.max_image_mb,
            "max_file_mb": image.max_file_mb,
            "image_timeout_s": image.timeout_s,
            "schema": self.schema,
            "num_shards": format_num_shards(self.num_shards),
            "shard_size_mb": self.shard_size_mb,
            "compression": self.compression,
            "follow_symlinks": self.follow_symlinks,
            "index_files": self.index_files,
            "file_format": self.file_format,
            "shard_names": self.shard_names,
            "group_by": self.group_by,
            "label_from": self.label_from,
            "duplicates": self.duplicates,
            "features": format_spec(self.features) or None,
            "metadata": self.metadata,
            "multi_label": self.multi_label,
            **({"reencode": True} if image.reencode else {}),  # recorded when given: older datasets lack it
            **({"unlabeled": True} if self.unlabeled else {}),
            **({"split_lists": format_split_lists(self.split_lists)} if self.split_lists else {}),
            # recorded for a detection dataset only: a classification one's options are as they always were
            **({"task": self.task, "first_class_id": self.first_class_id,
                "images_without_objects": self.images_without_objects, "instance_masks": self.instance_masks}
               if self.detection else {}),
        }


def parse_num_shards(text) -> dict[str, int]:
    """--num_shards: N (train only; 0 for automatic) or split=N,... -> {split: N} for the splits that are set.

    Raises:
        UserError: for anything else, with the forms that work.
    """
    value = str(text).strip()
    forms = "give a number such as 8 (for train), or per split such as train=64,validation=8"
    if re.fullmatch(r"\d+", value):
        return {"train": int(value)} if int(value) else {}
    counts: dict[str, int] = {}
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\w+)\s*=\s*(\d+)\s*", part)
        if not match:
            raise UserError(f"--num_shards={text!r} is not a shard count: {forms}")
        split, count = match.group(1), int(match.group(2))
        if split not in SPLITS:
            raise UserError(f"--num_shards={text!r} names the split {split!r}: the splits are "
                            f"{', '.join(SPLITS)}")
        if split in counts:
            raise UserError(f"--num_shards={text!r} gives {split} twice: give each split once")
        counts[split] = count
    return {split: n for split, n in counts.items() if n}


def format_num_shards(counts: dict[str, int]):
    """How image_tfrecords.json records --num_shards: 0, a number for train alone, or 'train=64,validation=8'."""
    if not counts:
        return 0
    if set(counts) == {"train"}:
        return counts["train"]
    return ",".join(f"{split}={counts[split]}" for split in SPLITS if split in counts)


def parse_split_lists(text) -> tuple:
    """--split_lists: split=PATH,... -> ((split, path), ...) in SPLITS order; () when not given. A split is named as
    a split folder may be (val, valid, dev -> validation; training -> train).

    Raises:
        UserError: for another form, a name that is no split, a split or a file given twice, or no train list.
    """
    value = "" if text is None else str(text).strip()
    if not value:
        return ()
    forms = "give split=PATH pairs such as train=meta/train.txt,test=meta/test.txt"
    lists: dict[str, str] = {}
    for part in value.split(","):
        name, equals, path = part.partition("=")
        name, path = name.strip(), path.strip()
        if not equals or not name or not path:
            raise UserError(f"--split_lists={value!r}: {part.strip()!r} is not split=PATH: {forms}")
        split = split_of(name)
        if split is None:
            raise UserError(f"--split_lists={value!r} names the split {name!r}: the splits are {', '.join(SPLITS)} "
                            "(or val, valid, dev for validation)")
        if split in lists:
            raise UserError(f"--split_lists={value!r} gives a {split} list twice: give each split one list")
        if path in lists.values():
            raise UserError(f"--split_lists={value!r} gives {path} for two splits: give each split its own list")
        lists[split] = path
    if "train" not in lists:
        raise UserError(f"--split_lists={value!r} has no train list: give train=PATH too (the images of no list are "
                        "skipped)")
    return tuple((split, lists[split]) for split in SPLITS if split in lists)


def format_split_lists(lists: tuple) -> str:
    """How image_tfrecords.json records --split_lists: 'train=PATH,test=PATH'."""
    return ",".join(f"{split}={path}" for split, path in lists)


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


def parse_label_from(text: str | None, group_by: str | None) -> str | None:
    """--label_from as a regular expression with a named group `label` (and, if any, a group `group` that
    --group_by does not contradict), or None when not given."""
    if text is None or text == "":
        return None
    problem = label_from_problem(text)
    if problem:
        raise UserError(f"--label_from='{text}' {problem}: give a Python regular expression with a group "
                        f"(?P<label>...), e.g. --label_from={LABEL_FROM_EXAMPLE}")
    if group_by and has_group_capture(text):
        raise UserError(f"--label_from='{text}' has a group named group, which gives each image's group, and "
                        "--group_by is given too: drop --group_by, or rename the group in --label_from")
    return text


def parse_group_by(text: str | None) -> str | None:
    """--group_by as a regular expression that compiles, or None when not given."""
    if text is None or text == "":
        return None
    try:
        compile_group_by(text)  # compiled again on the workers
    except regex.error as e:
        raise UserError(f"--group_by='{text}' is not a regular expression ({e}): give a Python regular expression "
                        r"whose first group is the group, such as '^[^/]+/(patient\d+)_'") from None
    return text


SCHEMA_FILE_BYTES = 1 << 20  # a --features=@FILE schema is a few names and types


def parse_features(text: str | None) -> tuple:
    """--features as FeatureTypes: name:type,... or @FILE (a JSON object {name: type}, local or gs://)."""
    if text is None or str(text).strip() == "":
        return ()
    value = str(text).strip()
    flag = f"--features={value}"
    if value.startswith("@"):
        path = value[1:]
        data = read_small_file("--features file", path, SCHEMA_FILE_BYTES, 'JSON file {"name": "type", ...}')
        try:
            value = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise UserError(f"--features file {path} is not UTF-8 text: save it as UTF-8") from None
        flag = f"--features file {path}"
        if not value.strip().startswith("{"):
            raise UserError(f'{flag} is not a JSON object: write {{"score": "float", "box": "float[4]"}}')
    try:
        return parse_spec(value)
    except ValueError as e:
        raise UserError(f"{flag} {e}") from None


PATH_OPTIONS = ("input_dir", "output_dir", "manifest", "metadata", "labels_file")


def check_gcs_paths(o) -> None:
    """A gs:// path of a path option names a bucket as Cloud Storage spells one (else the client raises deep
    inside the run)."""
    for name in PATH_OPTIONS:
        value = getattr(o, name, None) or ""
        for piece in manifest_pieces(value) if name == "manifest" else [value]:
            problem = bucket_problem(piece)
            if problem:
                raise UserError(f"--{name}={piece}: {problem}")


def manifest_pieces(value: str) -> list[str]:
    """--manifest's files or glob patterns: comma-separated (a file name holding a comma cannot be given)."""
    return [piece.strip() for piece in value.split(",")] if value else []


def _worker_memory_mb(options: PipelineOptions, o) -> int:
    """--worker_memory_mb: the MB all the conversions of one worker process may hold; unset, sized for the workers.

    A local run's default is ImageSettings'. On Dataflow, which runs one SDK process per vCPU, the default is at
    most the worker machine's memory per vCPU less the process's own needs, so that it cannot over-commit a
    highcpu machine, and a value above that share is refused.

    Raises:
        UserError: a negative value; on Dataflow, a value (or a --max_image_mb) the machine's share cannot hold.
    """
    given = o.worker_memory_mb
    if given is not None and given < 0:
        raise UserError(f"--worker_memory_mb={given} must be a number of MB, or 0 for no limit")
    default = ImageSettings.worker_memory_mb
    sized = (workers.worker_memory_share(options)
             if workers.is_dataflow(options) or os.environ.get(workers.FLEX_TEMPLATE_ENV) else None)
    if sized is None:
        return default if given is None else given
    machine, per_vcpu, share = sized
    facts = (f"Dataflow runs one SDK process per vCPU, and a {machine} worker has {per_vcpu} MB per vCPU, {share} MB "
             f"of it for conversions beside the process's own ~{workers.SDK_PROCESS_RESERVE_MB} MB")
    if given is None:
        if share < o.max_image_mb:
            raise UserError(f"--max_image_mb={o.max_image_mb} does not fit the workers' memory: {facts}; lower "
                            f"--max_image_mb to at most {max(share, 1)}, or choose a machine type with more memory "
                            "per vCPU (--machine_type=n1-standard-4, n2-standard-4)")
        return min(default, share)
    if given > share:
        raise UserError(f"--worker_memory_mb={given} over-commits the workers: {facts}; give at most {share}, leave "
                        "it out (sized per vCPU), or choose a machine type with more memory per vCPU")
    return given


def validate(options: PipelineOptions) -> Settings:
    """Check every option and return typed settings.

    Raises:
        UserError: for the first invalid value, with what to do about it.
    """
    o = options.view_as(ConvertOptions)
    check_gcs_paths(o)
    manifest = o.manifest or None
    if not o.input_dir and not manifest:
        raise UserError("--input_dir is required: the folder of class folders to convert (or give --manifest)")
    check_detection_options(o)
    if o.multi_label and not manifest:
        raise UserError("--multi_label needs --manifest: class folders give each image one class; list the images "
                        "in a manifest with a labels column (names separated by ';'), or drop --multi_label")
    if o.unlabeled and manifest:
        raise UserError("--unlabeled converts a flat folder of images, and --manifest lists labeled images: give "
                        "the folder of images as --input_dir, or drop --unlabeled")
    if o.label_from and manifest:
        raise UserError("--label_from takes the labels from the paths of listed files, and --manifest lists them "
                        "with their labels: drop one of the two")
    if o.label_from and o.unlabeled:
        raise UserError("--label_from labels the images, and --unlabeled converts them without labels: drop one "
                        "of the two")
    if o.unlabeled and o.labels_file:
        raise UserError("--labels_file names the classes, and --unlabeled writes no labels: drop one of the two")
    split_lists = parse_split_lists(o.split_lists)
    if split_lists and manifest:
        raise UserError("--split_lists gives the splits of class-folder images, and a --manifest has its own split "
                        "column: put each image's split in the manifest, or give the folder as --input_dir")
    if split_lists and o.unlabeled:
        raise UserError("--split_lists splits labeled images, and --unlabeled writes one split: drop one of the two")
    for _, path in split_lists:
        problem = bucket_problem(path)
        if problem:
            raise UserError(f"--split_lists {path}: {problem}")
    metadata = o.metadata or None
    if metadata and manifest:
        raise UserError("--metadata is for class folders, and a --manifest carries its own extra columns: put "
                        "them in the manifest, or drop --metadata")
    features = parse_features(o.features)
    if features and not (manifest or metadata):
        raise UserError("--features types the extra columns of --manifest or --metadata: give one of them, or "
                        "drop --features")
    # With --manifest, --input_dir is the base of the manifest's relative paths (default: the manifest's folder;
    # with several files, each one's own, and input_dir the folder of the first before any glob character).
    manifests = tuple(manifest_pieces(manifest)) if manifest else ()
    if manifest and not all(manifests):
        raise UserError(f"--manifest={manifest} has an empty entry: give files or glob patterns separated by commas, "
                        "e.g. --manifest='data/*/_classes.csv'")
    input_dir = o.input_dir or _manifest_folder(manifests[0])
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
    worker_memory_mb = _worker_memory_mb(options, o)
    if worker_memory_mb and worker_memory_mb < o.max_image_mb:
        raise UserError(
            f"--worker_memory_mb={worker_memory_mb} is below --max_image_mb={o.max_image_mb}: an image allowed "
            "to need that much would have to run beyond the worker's budget; give --worker_memory_mb at least "
            "--max_image_mb (or 0 for no budget), or lower --max_image_mb"
        )
    if not (o.image_timeout_s >= 0 and math.isfinite(o.image_timeout_s)):
        raise UserError(f"--image_timeout_s={o.image_timeout_s} must be 0 (no limit) or a positive number of seconds")
    if not (o.throttled_retry_s >= 0 and math.isfinite(o.throttled_retry_s)):
        raise UserError(f"--throttled_retry_s={o.throttled_retry_s} must be 0 (fail at the first throttling answer "
                        "after its retries) or a positive number of seconds; 600 suits a cold bucket")
    if not (o.initial_read_rate > 0 and math.isfinite(o.initial_read_rate)):
        raise UserError(f"--initial_read_rate={o.initial_read_rate:g} must be a positive number of reads a second: "
                        f"{JOB_READS_PER_S:g} suits a cold bucket")
    if not 1 <= o.conversion_threads <= MAX_CONVERSION_THREADS:
        raise UserError(f"--conversion_threads={o.conversion_threads} must be between 1 and {MAX_CONVERSION_THREADS}: "
                        "2 suits most machines")
    num_shards = parse_num_shards(o.num_shards)
    if o.unlabeled:  # one split: a bare --num_shards=N is its count, as it is train's otherwise
        bare = re.fullmatch(r"\s*\d+\s*", str(o.num_shards))
        count = num_shards.get("train" if bare else UNLABELED_SPLIT)
        num_shards = {UNLABELED_SPLIT: count} if count else {}
    if o.shard_size_mb < 1:
        raise UserError(f"--shard_size_mb={o.shard_size_mb} must be at least 1")
    if o.index_files and o.compression != "none":
        raise UserError(f"--index_files needs uncompressed shards, but --compression={o.compression}: an index "
                        "holds byte offsets into the uncompressed file; drop one of the two options")
    shard_format = SHARD_FORMATS[o.file_format]
    if not shard_format.gzip and o.compression != "none":
        raise UserError(f"--file_format=array_record takes no --compression={o.compression}: ArrayRecord shards "
                        "are written uncompressed; drop --compression, or write TFRecord shards")
    if shard_format.package and importlib.util.find_spec(shard_format.package) is None:
        raise UserError("--file_format=array_record needs the array-record package, which is not installed: "
                        "pip install array-record, or write TFRecord shards")
    if o.index_files and not shard_format.index_files:
        raise UserError("--index_files is for TFRecord shards, and ArrayRecord shards index themselves "
                        "(random access): drop --index_files, or write TFRecord shards")
    if o.quiet and o.verbose:
        raise UserError("--quiet and --verbose contradict each other: give one of them")
    if_exists = o.if_exists
    if o.overwrite:
        if if_exists not in ("refuse", "overwrite"):
            raise UserError(f"--overwrite and --if_exists={if_exists} contradict each other: give one of them")
        if_exists = "overwrite"
    run_date = parse_run_date(o.run_date)
    group_by = parse_group_by(o.group_by)
    label_from = parse_label_from(o.label_from, group_by)
    image = ImageSettings(
        width=width,
        height=height,
        resize_mode=o.resize_mode,
        resample=o.resample,
        image_format=o.image_format,
        jpeg_quality=o.jpeg_quality,
        chroma_subsampling=o.chroma_subsampling,
        image_backend=o.image_backend,
        reencode=bool(o.reencode),
        background=parse_colour(o.background),
        max_pixels=o.max_pixels,
        max_image_mb=o.max_image_mb,
        worker_memory_mb=worker_memory_mb,
        max_file_mb=o.max_file_mb,
        timeout_s=o.image_timeout_s,
        throttled_retry_s=o.throttled_retry_s,
        reads_per_s_at_start=process_start_rate(o.initial_read_rate, workers.worker_processes(options)),
    )
    return Settings(
        input_dir=input_dir.rstrip("/") or "/",
        manifest=manifest,
        manifests=manifests,
        paths_below_manifest=bool(manifest) and not o.input_dir,
        output_dir=expand_placeholders(o.output_dir, "--output_dir", run_date=run_date).rstrip("/") or "/",
        labels_file=o.labels_file,
        validation_split=o.validation_split,
        test_split=o.test_split,
        seed=o.seed,
        image=image,
        schema=DETECTION if o.task == DETECTION else o.schema,
        num_shards=num_shards,
        conversion_threads=o.conversion_threads,
        shard_size_mb=o.shard_size_mb,
        compression=o.compression,
        if_exists=if_exists,
        follow_symlinks=o.follow_symlinks,
        quiet=o.quiet,
        verbose=o.verbose,
        index_files=o.index_files,
        file_format=o.file_format,
        shard_names=o.shard_names,
        group_by=group_by,
        duplicates=o.duplicates,
        features=features,
        metadata=metadata,
        multi_label=bool(o.multi_label),
        unlabeled=bool(o.unlabeled),
        split_lists=split_lists,
        label_from=label_from,
        task=o.task,
        first_class_id=int(o.first_class_id),
        images_without_objects=o.images_without_objects,
        instance_masks=bool(o.instance_masks),
    )


# Options a detection run refuses: what each does makes no sense for boxes, or is not built for them yet.
_NOT_WITH_DETECTION = {
    "multi_label": "detection records hold a class per object, from the annotations",
    "unlabeled": "detection records hold the annotations' objects",
    "label_from": "the annotations give each object's class",
    "split_lists": "the splits come from the dataset's own split folders or files, else a hash of each path",
    "group_by": "not yet supported for --task=detection (the splits come from the dataset's folders or a hash of "
                "each image's path)",
    "metadata": "not yet supported for --task=detection",
    "features": "not yet supported for --task=detection",
}


def check_detection_options(o) -> None:
    """--task=detection with an option that makes no sense for it, or detection's options without it: one line.

    Raises:
        UserError: naming the first such option.
    """
    if o.task != DETECTION:
        return
    for name, why in _NOT_WITH_DETECTION.items():
        if getattr(o, name, None):
            raise UserError(f"--{name} and --task=detection do not go together: {why}; drop --{name}")
    if o.schema != "default":
        raise UserError(f"--schema={o.schema} is for classification records: --task=detection writes the keys of "
                        "the TF Object Detection API (docs/detection.md); drop --schema")


def _manifest_folder(pattern: str) -> str:
    """The folder of a manifest file, or of a glob pattern's part before its first glob character."""
    fixed = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
    return fixed.rsplit("/", 1)[0] if "/" in fixed else "."


def given_flags(argv: list[str]) -> set[str]:
    """The names of the options `argv` gives (`--jpeg_quality=90` and `--jpeg_quality 90` both name it)."""
    return {arg[2:].split("=", 1)[0] for arg in argv if arg.startswith("--")}


def check_split_list_flags(argv: list[str], settings: Settings) -> None:
    """--split_lists decides every image's split: --validation_split and --test_split given with it are refused
    (their defaults are not: they are only not used).

    Raises:
        UserError: naming the first such flag given.
    """
    if not settings.split_lists:
        return
    for flag in ("validation_split", "test_split"):
        if flag in given_flags(argv):
            raise UserError(f"--{flag} and --split_lists contradict each other: the lists give every image's split; "
                            f"drop --{flag}")


def ignored_options(argv: list[str], options: PipelineOptions, settings: Settings, *, dataflow: bool,
                    split_folders: bool) -> list[str]:
    """One warning line for each option `argv` gives that has no effect in this run, with why and what to do
    (`split_folders`: the plan found split folders, which decide the splits)."""
    given, o, image = given_flags(argv), options.view_as(ConvertOptions), settings.image
    notes = []

    def note(flag: str, why: str, fix: str) -> None:
        if flag in given:
            notes.append(f"--{flag} has no effect: {why}; {fix}")

    if not settings.detection:
        for flag in ("first_class_id", "images_without_objects", "instance_masks"):
            note(flag, "it is an option of detection records", "give --task=detection, or drop it")
    if settings.unlabeled:
        for flag in ("validation_split", "test_split", "group_by"):
            note(flag, f"--unlabeled writes every image into one split ({UNLABELED_SPLIT})", f"drop --{flag}")
        if not re.fullmatch(r"\s*\d+\s*", str(o.num_shards)) and set(parse_num_shards(o.num_shards)) - {
                UNLABELED_SPLIT}:
            note("num_shards", f"--unlabeled writes one split ({UNLABELED_SPLIT}), and it names others",
                 f"give --num_shards=N or {UNLABELED_SPLIT}=N")
    if split_folders:
        for flag in ("validation_split", "test_split"):
            note(flag, "the input's split folders decide every image's split",
                 f"drop --{flag}, or put the images in class folders at the top to let it split them")
    if "{date}" not in (o.output_dir or ""):
        note("run_date", "--output_dir holds no {date} placeholder for it to fill",
             "put {date} in --output_dir (e.g. gs://bucket/datasets/{date}) or drop --run_date")
    if image.image_format == "png":
        for flag in ("jpeg_quality", "chroma_subsampling"):
            note(flag, "--image_format=png stores lossless PNG", f"drop --{flag}, or store JPEG")
    if image.image_format == "png":
        note("reencode", "PNG output re-encodes every image", "drop --reencode")
    if image.resize_mode == "none":
        for flag in ("image_size", "resample", "reencode"):
            note(flag, "--resize_mode=none keeps every image at its own size", f"drop --{flag}, or pick a resize mode")
    if not dataflow:
        note("no_wait", "it only stops the launcher waiting for a Dataflow job, and this run is local", "drop it")
    if not is_local(settings.input_dir) and not settings.manifest:
        note("follow_symlinks", "Cloud Storage has no symbolic links", "drop it")
    if set(SPLITS) <= set(settings.num_shards):
        note("shard_size_mb", "--num_shards sets the shard count of every split", "drop one of the two")
    return notes


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
    # Beam's parser of every option, built without argv: given argv, Beam would log
    # "Discarding unparseable args" for a mistyped flag before the one line below.
    PipelineOptions([]).get_all_options(add_extra_args_fn=captured.append)
    _, unknown = captured[0].parse_known_args(argv)
    flags = [a.split("=", 1)[0] for a in unknown if a.startswith("-")]
    if flags:
        raise UserError(f"unknown option {flags[0]}; run with --help to see the options")
    if unknown:
        raise UserError(f"unexpected argument {unknown[0]!r}: options take the form --name=value")
