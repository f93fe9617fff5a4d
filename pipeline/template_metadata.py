"""The Flex Template's parameters, `dataflow/metadata.json`, made from the converter's flags.

    python -m pipeline.template_metadata --write   # after changing a flag: rewrite dataflow/metadata.json
    python -m pipeline.template_metadata --check   # exit 1 if dataflow/metadata.json is not what the flags give

What the flags say is taken from them (`pipeline.flags`): every parameter's name and
order, which are required, each choice list (an ENUM with its options and the regex
that the template's form checks), the on/off flags (BOOLEAN, true|false), the numbers
(NUMBER) and each default, which ends every help text. A flag without an entry here,
or an entry without a flag, is an error, so the two cannot drift apart.

What only the template knows is in PARAMETERS: a label, the help text in the
template's words (its parameters are name=value pairs without dashes, and its paths
are gs://), the Cloud Storage picker for paths, the regex for a number's range or a
text's form, and the default's wording where the flag's default is none.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass

from pipeline.flags import add_convert_arguments, parse_bool
from transforms.base.dataset_format import SPLITS

NAME = "image-tfrecords"
DESCRIPTION = ("Convert a Cloud Storage folder of labeled images (one folder per class) into shuffled, sharded "
               "TFRecord files of tf.train.Example, with counts and labels in image_tfrecords.json.")
METADATA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dataflow", "metadata.json")

# Regexes the template's form checks a value against.
GCS_PATH = r"^gs://[a-z0-9][-_.a-z0-9]{1,220}[a-z0-9](/.*)?$"
POSITIVE = r"^[1-9][0-9]*$"
COUNT = r"^(0|[1-9][0-9]*)$"
SECONDS = r"^[0-9]+(\.[0-9]+)?$"
SHARE = r"^(0(\.[0-9]+)?|\.[0-9]+)$"
_FEATURE = r"[A-Za-z][A-Za-z0-9_]*\s*:\s*[a-z_]+(\[\s*[0-9]+\s*\])?"
_SPLIT_COUNT = "(" + "|".join(SPLITS) + ")=[0-9]+"

# The Cloud Storage pickers (the API's paramType) for the path parameters.
GCS_PICKERS = {"read_folder": "GCS_READ_FOLDER", "write_folder": "GCS_WRITE_FOLDER", "read_file": "GCS_READ_FILE"}


@dataclass(frozen=True)
class Parameter:
    label: str
    help: str  # without the default: " Default: <the flag's default>." is added
    gcs: str | None = None  # a key of GCS_PICKERS: a gs:// path, with its picker and GCS_PATH as its regex
    kind: str | None = None  # the paramType of a text parameter (a flag with choices, on/off or a number has its own)
    regex: str | None = None
    default: str | None = None  # the default's wording, for a flag whose default is None


PARAMETERS = {
    "input_dir": Parameter(
        "Input folder",
        "Cloud Storage folder of images: gs://BUCKET/photos/<class>/<image>, or gs://BUCKET/photos/<split>/<class>/"
        "<image> with split folders train/, validation/ (or val/), test/. With manifest: the folder that its relative "
        "paths are below.", gcs="read_folder"),
    "output_dir": Parameter(
        "Output folder",
        "Cloud Storage folder for the TFRecord shards, labels.txt, errors.jsonl and image_tfrecords.json. {date} and "
        "{timestamp} become the UTC launch date (2024-01-31) and time (20240131-235959), so that every scheduled run "
        "writes its own folder, e.g. gs://BUCKET/tfrecords/{date}.", gcs="write_folder"),
    "run_date": Parameter(
        "Run date",
        "The date that {date} in output_dir stands for, YYYY-MM-DD: a scheduler's logical date (Airflow: {{ ds }}), "
        "so that backfills and retries write the right folder.",
        regex=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$", default="none, the UTC launch date"),
    "manifest": Parameter(
        "Manifest",
        "CSV (with a header) or JSON Lines file listing the images instead of class folders: columns path (or "
        "filename; relative to input_dir, or gs://), label (a class name), and optionally split (train, validation, "
        "test, or a name that stands for one as a split folder's does: val, valid, dev, training, ...); or, in a CSV "
        "without a label column, one 0/1 column per class (Roboflow's _classes.csv). Several files: comma-separated, "
        "or a glob such as gs://bucket/data/*/_classes.csv.", gcs="read_file", default="none, class folders"),
    "features": Parameter(
        "Typed extra features",
        "Types of the extra manifest (or metadata) columns, written into every Example under the column's name: "
        "name:type,... such as score:float,size:int[2],box:float[4],tags:string_list, or @gs://.../schema.json (a "
        "JSON object {name: type}). Types: int, float, string, int[N], float[N], string[N], int_list, float_list, "
        "string_list.",
        regex=rf"^(@gs://.+|{_FEATURE}(\s*,\s*{_FEATURE})*)?$", default="none, every extra column stored as string"),
    "metadata": Parameter(
        "Metadata",
        "With class folders: a CSV or JSON Lines file with a path column (the image's path below input_dir) and extra "
        "columns typed by features, joined to the images inside the job. An image without a row is skipped as "
        "metadata_missing.", gcs="read_file", default="none"),
    "multi_label": Parameter(
        "Multi-label",
        "true: with manifest, each image has several classes, from a labels column (names separated by ';' in a CSV, "
        "a JSON list in JSON Lines) or a CSV's 0/1 class columns; records store the list of class ids under the "
        "label key."),
    "unlabeled": Parameter(
        "Unlabeled",
        "true: convert a flat folder of images without labels (a test set to predict) into the one split test, each "
        "record with an id (its file name without the extension) and no label."),
    "label_from": Parameter(
        "Labels from file names",
        "Regular expression with a named group label, searched in each image's path below input_dir (split folder "
        "included): the label group is the image's class name, e.g. (?P<label>[^/.]+)\\.\\d+\\.[^/.]+$ for "
        "cat.123.jpg, for images named by class in a flat folder; an optional named group group is the image's "
        "group. An image it does not match is skipped as no_label_in_path.",
        default="none, class folders give the labels"),
    "task": Parameter(
        "Task",
        "classification: one class per image. detection: the boxes (and masks) of an object-detection export in "
        "input_dir (COCO JSON, Pascal VOC XML, YOLO data.yaml) or a manifest of boxes (one row per box), written "
        "with the keys of the TF Object Detection API."),
    "first_class_id": Parameter(
        "First class id",
        "With task=detection: the id of the first class in image/object/class/label and label_map.pbtxt: 1 (the "
        "Object Detection API keeps 0 for the background) or 0."),
    "images_without_objects": Parameter(
        "Images without objects",
        "With task=detection: keep writes images without objects as records without objects; drop skips them as "
        "no_objects. Counted either way."),
    "instance_masks": Parameter(
        "Instance masks",
        "true: with task=detection, write one 0/1 PNG mask per object (image/object/mask) from the annotations' "
        "polygons or RLE or VOC's SegmentationObject PNGs, the box for an object without one."),
    "labels_file": Parameter(
        "Labels file",
        "Text file with one class name per line; line i gets label id i. Give it to keep label ids stable across "
        "runs.", gcs="read_file", default="none, ids follow the sorted class folder names"),
    "validation_split": Parameter(
        "Validation share",
        "Share of images hashed into validation when the input has no split folders, from 0 up to 1.", regex=SHARE),
    "test_split": Parameter("Test share", "Share of images hashed into test, like validation_split.", regex=SHARE),
    "split_lists": Parameter(
        "Split lists",
        "The dataset's own split lists, with class folders: train=gs://.../train.txt,test=gs://.../test.txt (and "
        "validation=...), one image a line as its path below input_dir (apple_pie/1005649, as Food-101's "
        "meta/train.txt) or as a bare file name unique among the images, with or without its extension. An image no "
        "list names is skipped as not_in_split_lists, a line that names no image is reported as listed_image_missing, "
        "an image two lists name is rejected as listed_in_two_splits. Not with manifest, split folders, "
        "validation_split or test_split.",
        kind="TEXT", regex=r"^[A-Za-z_]+=gs://[^,]+(,[A-Za-z_]+=gs://[^,]+)*$",
        default="none, a hash of each image's path splits them (or the split folders)"),
    "seed": Parameter(
        "Seed", "Seed of the split hash and of the shuffle order; keep it fixed so that a file stays in its split.",
        regex=r"^-?[0-9]+$"),
    "group_by": Parameter(
        "Group-safe splits",
        "Regular expression searched in each image's path below input_dir, e.g. ^[^/]+/(patient\\d+)_ : its first "
        "capture group is the image's group, and every image of a group lands in the same split. An image it does "
        "not match is its own group, counted in the summary.",
        default="none, each image's split comes from its own path"),
    "image_size": Parameter("Image size", "Output size: N for NxN, or WxH such as 640x480.",
                            regex=r"^[0-9]+([xX][0-9]+)?$"),
    "resize_mode": Parameter(
        "Resize mode",
        "stretch, crop (centre crop to the aspect ratio, then resize), pad (letterbox), fit (longer side at most the "
        "size), or none (keep the size)."),
    "resample": Parameter("Resampling filter", "bilinear, area, bicubic or lanczos."),
    "image_format": Parameter("Image format", "jpeg, or png for a lossless dataset."),
    "jpeg_quality": Parameter("JPEG quality", "1 to 100.", regex=r"^([1-9][0-9]?|100)$"),
    "chroma_subsampling": Parameter("JPEG chroma subsampling", "4:4:4, 4:2:2 or 4:2:0."),
    "image_backend": Parameter(
        "Image backend",
        "auto: 8-bit JPEGs and PNGs without alpha go through the fast core (libjpeg-turbo and OpenCV), everything "
        "else through Pillow; pillow: every image through Pillow."),
    "reencode": Parameter(
        "Re-encode images already at the output size",
        "true also re-encodes images already at the output size; without it an upright baseline JPEG of exactly "
        "image_size is stored as it is: its image data, without metadata."),
    "background": Parameter(
        "Background colour",
        "Colour under transparent pixels and around letterboxed images: white, black, grey, #rrggbb or r,g,b.",
        regex=r"^(white|black|grey|gray|#[0-9a-fA-F]{6}|[0-9]{1,3},[0-9]{1,3},[0-9]{1,3})$"),
    "max_pixels": Parameter(
        "Maximum pixels", "Images declaring more pixels are rejected as decompression_bomb before decoding.",
        regex=POSITIVE),
    "max_image_mb": Parameter(
        "Maximum memory per image (MB)",
        "Memory one image may need while converted (decoded pixels by mode and bit depth, plus an RGB copy), checked "
        "before decoding; larger ones are rejected as image_too_large_in_memory.", regex=POSITIVE),
    "worker_memory_mb": Parameter(
        "Memory for conversions per worker process (MB)",
        "Memory all the conversions of one worker process (one per vCPU) may hold at once; an image that does not "
        "fit waits for others to finish. At most the worker machine's memory per vCPU less 300 MB (n1-highcpu: 621); "
        "at least max_image_mb; 0 = no limit.", regex=COUNT,
        default="2048, or the machine's share per vCPU if that is less (sized for the machine type the launch "
                "passes, else n1-standard-1)"),
    "max_file_mb": Parameter(
        "Maximum file size (MB)", "Larger files are rejected as file_too_large without being read.", regex=POSITIVE),
    "image_timeout_s": Parameter(
        "Image timeout (s)", "Seconds one image may take to convert; a slower one is rejected as timeout. 0 = no "
        "limit.", regex=SECONDS),
    "throttled_retry_s": Parameter(
        "Retry on throttling (s)",
        "Seconds of waits with backoff one image read may spend on Cloud Storage's throttling answers (429, 503) "
        "before its bundle fails; a cold bucket ramps its read capacity up over minutes. These waits do not count "
        "against image_timeout_s.", regex=SECONDS),
    "initial_read_rate": Parameter(
        "First read rate (reads/s)",
        "Image reads a second the whole job starts at, shared by its worker processes (max_num_workers, or "
        "num_workers, times the machine type's vCPUs; 100 processes when neither is given); the rate doubles every "
        "20 minutes, Cloud Storage's ramp for a cold bucket, and halves on throttling. Raise it for a bucket that "
        "already serves more.", regex=SECONDS),
    "conversion_threads": Parameter(
        "Conversions at once per worker process",
        "Images decoded, resized and encoded at once in each worker process; more threads read files ahead of them, "
        "as many as the read latency asks for, within worker_memory_mb.", regex=r"^[0-9]+$"),
    "schema": Parameter(
        "Example schema",
        "default (image, label, class_name, height, width, source_path, sha256), tf_slim (image/encoded, "
        "image/class/label, ...) or kaggle (image, class, id: the keys Kaggle's TPU notebooks read, and the default "
        "ones but label)."),
    "duplicates": Parameter(
        "Duplicate files",
        "keep: write every byte-identical copy and report the groups (same label in one split, across splits, "
        "different labels) in the summary and image_tfrecords.json. drop: write the copy with the first path of each "
        "group, report the others in errors.jsonl as duplicate (all copies as duplicate_conflict when their labels "
        "differ); reads every file twice."),
    "num_shards": Parameter(
        "Shards per split",
        "Per split as train=64,validation=8 (a split not named is sized by shard_size_mb), or one number for train "
        "alone, validation and test then sized by shard_size_mb; 0 sizes every split by shard_size_mb.",
        kind="TEXT", regex=rf"^([0-9]+|{_SPLIT_COUNT}(,{_SPLIT_COUNT})*)$"),
    "shard_size_mb": Parameter(
        "Shard size (MB)",
        "Target shard size for the splits num_shards does not set, from a sample of images converted with these "
        "settings.", regex=POSITIVE),
    "compression": Parameter("Compression", "none, or gzip (.tfrecord.gz)."),
    "file_format": Parameter(
        "Shard file format",
        "tfrecord, or array_record (train-00000-of-00004.array_record, the same serialized Examples) for Grain's "
        "random access; array_record takes neither gzip compression nor index files."),
    "shard_names": Parameter(
        "Shard names",
        "standard (train-00000-of-00004.tfrecord), or kaggle: the shard's index and record count, as Kaggle's TPU "
        "notebooks count them (train00-2071.tfrec)."),
    "index_files": Parameter(
        "Index files",
        "true also writes each shard's index for DALI and the tfrecord package beside it "
        "(train-00000-of-00004.idx: one 'offset length' line per record); uncompressed shards only."),
    "if_exists": Parameter(
        "If a dataset exists",
        "What a complete dataset already in output_dir means: refuse stops with an error; overwrite replaces it once "
        "the new run has finished; skip ends the launch successfully without converting when that dataset was made "
        "with the same options (for scheduler retries) and refuses one made with other options; append converts only "
        "the images the dataset does not hold yet (same relative path and SHA-256) into new shards beside its own, "
        "with the options that shape records the dataset's."),
    "follow_symlinks": Parameter(
        "Follow symlinks", "true also reads symlinks whose target is outside input_dir (gs:// has none)."),
    "overwrite": Parameter("Overwrite", "true is the same as if_exists=overwrite."),
    "quiet": Parameter("Quiet", "true logs only errors and the final summary."),
    "verbose": Parameter("Verbose", "true also logs Beam's own messages."),
    "no_wait": Parameter(
        "Do not wait",
        "Return once the job is submitted. A template launch never waits for the job, so this changes nothing here."),
}


def _flags() -> list[argparse.Action]:
    parser = argparse.ArgumentParser(add_help=False)
    add_convert_arguments(parser, mark_required=True)
    return parser._actions


def _default_text(action: argparse.Action, parameter: Parameter) -> str | None:
    if action.required:
        return None
    if action.default is None:
        if parameter.default is None:
            raise ValueError(f"--{action.dest} has no default: give its wording in PARAMETERS (default=...)")
        return parameter.default
    if parameter.default is not None:
        raise ValueError(f"--{action.dest}'s default comes from the flag ({action.default!r}): drop default=...")
    if action.type is parse_bool:
        return "true" if action.default else "false"
    return f"{action.default:g}" if isinstance(action.default, float) else str(action.default)


def _parameter(action: argparse.Action, parameter: Parameter) -> dict:
    name = action.dest
    default = _default_text(action, parameter)
    entry = {"name": name, "label": parameter.label,
             "helpText": parameter.help + (f" Default: {default}." if default is not None else ""),
             "isOptional": not action.required}
    derived = (action.choices is not None or action.type is parse_bool or action.type in (int, float)
               or parameter.gcs is not None)
    if derived and parameter.kind is not None:
        raise ValueError(f"--{name}'s paramType comes from the flag: drop kind=...")
    if action.choices is not None or action.type is parse_bool:
        if parameter.regex is not None:
            raise ValueError(f"--{name}'s regex comes from its values: drop regex=...")
        values = list(action.choices) if action.choices is not None else ["true", "false"]
        entry["regexes"] = ["^(" + "|".join(re.escape(v) for v in values) + ")$"]
        entry["paramType"] = "ENUM" if action.choices is not None else "BOOLEAN"
        if action.choices is not None:
            entry["enumOptions"] = [{"value": v} for v in values]
        return entry
    if parameter.gcs is not None:
        entry["regexes"], entry["paramType"] = [GCS_PATH], GCS_PICKERS[parameter.gcs]
        return entry
    if action.type in (int, float) and parameter.regex is None:
        raise ValueError(f"--{name} is a number: give the regex of its range in PARAMETERS (regex=...)")
    if parameter.regex is not None:
        entry["regexes"] = [parameter.regex]
    kind = "NUMBER" if action.type in (int, float) else parameter.kind
    if kind is not None:
        entry["paramType"] = kind
    return entry


def metadata() -> dict:
    """The template's metadata: every converter flag as a Flex Template parameter, the required ones first, then in
    --help's order."""
    actions = sorted((a for a in _flags() if a.option_strings), key=lambda a: not a.required)
    names = [a.dest for a in actions]
    missing, extra = sorted(set(names) - set(PARAMETERS)), sorted(set(PARAMETERS) - set(names))
    if missing or extra:
        raise ValueError("PARAMETERS and the flags differ: "
                         + "; ".join(filter(None, [missing and f"flags without an entry: {', '.join(missing)}",
                                                   extra and f"entries without a flag: {', '.join(extra)}"])))
    return {"name": NAME, "description": DESCRIPTION, "streaming": False,
            "parameters": [_parameter(a, PARAMETERS[a.dest]) for a in actions]}


def metadata_json() -> str:
    return json.dumps(metadata(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.template_metadata", description=__doc__.split("\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"Write {METADATA_FILE}.")
    action.add_argument("--check", action="store_true",
                        help="Exit 1 if that file is not what the flags give (default: print the metadata).")
    args = parser.parse_args(argv)
    text = metadata_json()
    if args.write:
        with open(METADATA_FILE, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {METADATA_FILE}")
        return 0
    if args.check:
        with open(METADATA_FILE, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{METADATA_FILE} is out of date with the converter's flags: run "
                      "python -m pipeline.template_metadata --write", file=sys.stderr)
                return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
