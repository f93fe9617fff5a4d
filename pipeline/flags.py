"""The converter's command-line options, without Beam: `--help` answers without importing it.

`pipeline.options.ConvertOptions` (the Beam `PipelineOptions` subclass) adds the
same arguments to Beam's parser, and `help_text()` builds the `--help` page
from them with --input_dir and --output_dir marked required.
"""

from __future__ import annotations

import argparse

from pipeline.cli import program_name
from transforms.base.dataset_format import CLASSIFICATION_SCHEMAS, COMPRESSIONS, FILE_FORMATS, SHARD_NAMES, TASKS
from transforms.base.transient import JOB_READS_PER_S
from transforms.images.decode import IMAGE_BACKENDS
from transforms.images.encode import CHROMA_SUBSAMPLING, IMAGE_FORMATS
from transforms.images.pixels import RESAMPLE_FILTERS, RESIZE_MODES
from transforms.images.settings import ImageSettings

IF_EXISTS = ("refuse", "overwrite", "skip", "append")
IMAGES_WITHOUT_OBJECTS = ("keep", "drop")
DUPLICATES = ("keep", "drop")
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


def add_convert_arguments(parser: argparse.ArgumentParser, mark_required: bool = False) -> None:
    """Add every option of `python -m pipeline.main` to `parser`.

    `mark_required` makes argparse treat --input_dir and --output_dir as required
    (for the help page); Beam's own parser must not, since Beam parses the same
    options on workers that never see them, and validate() says what is missing.
    """
    add = parser.add_argument
    required = dict(required=True) if mark_required else {}
    add("--input_dir", default=None, **required,
        help="Folder of images, local or gs://: <input_dir>/<class>/<image>, or "
             "<input_dir>/<split>/<class>/<image> with split folders train/, validation/ (or val/), test/. "
             "Required, unless --manifest is given (then it is the folder that relative manifest paths are below).")
    add("--manifest", default=None,
        help="CSV (with a header) or JSON Lines file, local or gs://, listing the images instead of class "
             "folders: columns path (or filename; relative to the manifest's folder or --input_dir, absolute, or "
             "gs://), label (a class name) and optionally split (train, validation, test, or a name that stands "
             "for one as a split folder's does: val, valid, dev, training, ...); or, in a CSV without a label "
             "column, one 0/1 column per class (one-hot; multi-hot with --multi_label), as Roboflow's "
             "_classes.csv. Several files: comma-separated, or a glob in quotes such as 'data/*/_classes.csv'; "
             "a row without a split column takes its file's split folder's. Default: none, class folders.")
    add("--features", default=None,
        help="Types of the extra manifest (or --metadata) columns, each written into every Example under the "
             "column's name: name:type,... such as score:float,size:int[2],box:float[4],tags:string_list, or "
             "@FILE, a JSON object {\"score\": \"float\", ...} (local or gs://). Types: int, float, string "
             "(one value), int[N], float[N], string[N] (exactly N), int_list, float_list, string_list (any "
             "number); in CSV a list is a;b;c or a JSON array. A row whose value is not of its type is rejected "
             "as manifest_bad_value. A column without a type is stored as string. Default: none, every extra "
             "column stored as string.")
    add("--metadata", default=None,
        help="With class folders: a CSV or JSON Lines file (local or gs://) with a path column (the image's path "
             "below --input_dir, e.g. roses/1.jpg) and extra columns typed by --features, joined to the images "
             "inside the job. An image without a row is skipped as metadata_missing; rows whose image is not "
             "found are counted in the summary. Default: none.")
    add("--multi_label", **ON_OFF,
        help="With --manifest: each image has several classes, from a labels column (class names separated by "
             "';' in a CSV, a JSON list in JSON Lines) instead of label, or from a CSV's 0/1 class columns "
             "(multi-hot); each record stores the list of class ids "
             "(sorted, no repeats) under the label key and their names under class_name. Default: off, one label.")
    add("--unlabeled", **ON_OFF,
        help="Convert a flat folder of images without labels (a test set to predict): every image directly in "
             "--input_dir becomes a record of the one split test, with an id key (its file name without the "
             "extension) and no label or class_name; two files with one id keep the first by name and reject "
             "the other as duplicate_id. Default: off, class folders give the labels.")
    add("--label_from", default=None,
        help="Regular expression with a named group label, searched in each image's path below --input_dir (split "
             "folder included, e.g. train/cat.123.jpg): the label group is the image's class name, for images named "
             "by class in a flat folder or flat split folders, e.g. '(?P<label>[^/.]+)\\.\\d+\\.[^/.]+$' "
             "(cat.123.jpg -> cat) or '(?P<label>[^/]+)_\\d+\\.[^/.]+$' (american_bulldog_3.jpg -> "
             "american_bulldog). An optional named group group is the image's --group_by group. Class folders, "
             "if any, are not the labels then; split folders still give the splits. The classes are the labels "
             "found (sorted), or --labels_file's. An image whose path it does not match is skipped as "
             "no_label_in_path. Default: none, class folders give the labels.")
    add("--task", default="classification", choices=TASKS,
        help="What the records are for: classification (one class per image) or detection: the boxes (and masks) "
             "of an object-detection export, found in --input_dir (COCO JSON, Pascal VOC XML, YOLO's data.yaml), "
             "or a --manifest of boxes (one row per box: path,label,xmin,ymin,xmax,ymax), written with the keys "
             "of the TF Object Detection API (image/object/bbox/..., image/object/class/label); see "
             "docs/detection.md. Default: classification.")
    add("--first_class_id", default="1", choices=("0", "1"),
        help="With --task=detection: the class id of the first class in image/object/class/label and "
             "label_map.pbtxt: 1 (the TF Object Detection API keeps 0 for the background) or 0. Default: 1.")
    add("--images_without_objects", default="keep", choices=IMAGES_WITHOUT_OBJECTS,
        help="With --task=detection: keep writes images without any object (negatives) as records without "
             "objects; drop skips them as no_objects (in errors.jsonl), also an image whose every annotation "
             "is rejected. Counted either way in image_tfrecords.json. Default: keep.")
    add("--instance_masks", **ON_OFF,
        help="With --task=detection: write one mask per object (image/object/mask, a 0/1 PNG at the stored "
             "size) from the annotations' polygons or RLE (COCO, YOLO segmentation) or VOC's SegmentationObject "
             "PNGs, the box itself for an object without one. Default: off, boxes only (segmentations are "
             "counted, not written).")
    add("--output_dir", default=None, **required,
        help="Folder for the TFRecord shards and image_tfrecords.json, local or gs://. {date} and {timestamp} in "
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
    add("--split_lists", default=None,
        help="The dataset's own split lists, with class folders: train=PATH,test=PATH[,validation=PATH] (local or "
             "gs:// text files; val, valid, dev... name validation too), one image a line as its path below "
             "--input_dir (apple_pie/1005649, as Food-101's meta/train.txt) or as a bare file name unique among the "
             "images, with or without its extension. Each image takes the split of the list that names it; an "
             "image no list names is skipped as not_in_split_lists, a line that names no image is reported as "
             "listed_image_missing, an image two lists name is rejected as listed_in_two_splits. Not with "
             "--manifest, split folders, --validation_split or --test_split. Default: none, a hash of each "
             "image's path splits them (or the split folders).")
    add("--group_by", default=None,
        help="Regular expression searched in each image's path below --input_dir (e.g. '^[^/]+/(patient\\d+)_'): "
             "its first capture group (the whole match without one) is the image's group, and every image of a "
             "group lands in the same split, by a hash of the group and --seed. An image whose path it does not "
             "match is its own group (the split it has without --group_by) and is counted in the summary. With "
             "split folders, images keep their folder's split and groups found in two splits are reported. With "
             "--manifest it is searched in each row's path as written (a group column instead gives the groups). A "
             "search that takes over 1 s on one path (a pattern that backtracks) rejects that image "
             "(group_by_timeout). Default: none, each image's split comes from its own path.")
    add("--duplicates", default="keep", choices=DUPLICATES,
        help="What to do with byte-identical source files (found by the SHA-256 every record stores): keep "
             "writes every copy and reports the groups in the summary and image_tfrecords.json (same label in one "
             "split, across splits, different labels); drop writes the copy with the first path of each group and "
             "reports the others in errors.jsonl as duplicate, or every copy as duplicate_conflict when they carry "
             "different labels. drop reads every file twice (a hashing pass before the shards are assigned). "
             "Default: keep.")
    add("--seed", type=int, default=42,
        help="Seed of the split hash and of the shuffle order. Default: 42.")
    add("--image_size", default="512",
        help="Output size: N for NxN, or WxH such as 640x480. When most input images are smaller, a notice "
             "before converting (not with --quiet) gives their typical size and the dataset's size at each; the "
             "run goes on with this size. Default: 512.")
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
    add("--image_backend", default="auto", choices=IMAGE_BACKENDS,
        help="auto: 8-bit JPEGs and PNGs without alpha go through the fast core (libjpeg-turbo and OpenCV), "
             "everything else through Pillow; pillow: every image through Pillow. Default: auto.")
    add("--reencode", **ON_OFF,
        help="Re-encode images already at the output size too; without it an upright baseline JPEG of exactly "
             "--image_size is stored as it is: its image data, without metadata. Default: false.")
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
    add("--worker_memory_mb", type=int, default=None,
        help="Memory in MB that all the conversions of one worker process may hold at once (each counts as "
             "for --max_image_mb, plus its file): an image that does not fit waits, unrejected, until others "
             "finish, and the wait does not count against --image_timeout_s. Peak memory per worker process "
             "is about this plus the process's own ~200 MB. Dataflow runs one worker process per vCPU, so there "
             "it is sized per vCPU: at most the worker machine's memory per vCPU less 300 MB (n1-highcpu: 621), "
             "and a larger value is refused. At least --max_image_mb; 0 = no limit. "
             f"Default: auto ({ImageSettings.worker_memory_mb}, or on Dataflow the machine's share per vCPU if "
             "that is less).")
    add("--max_file_mb", type=int, default=ImageSettings.max_file_mb,
        help="Files larger than this many MB are rejected as file_too_large without being read, and no read "
             f"goes past it. Default: {ImageSettings.max_file_mb}.")
    add("--image_timeout_s", type=float, default=ImageSettings.timeout_s,
        help="Seconds one image may take to convert; a slower one is rejected as timeout. 0 = no limit. "
             f"Default: {ImageSettings.timeout_s:g}.")
    add("--throttled_retry_s", type=float, default=ImageSettings.throttled_retry_s,
        help="Seconds of waits with backoff one image read may spend on Cloud Storage's throttling answers (429, "
             "503) before its bundle fails; a cold bucket ramps its read capacity up over minutes. These waits do "
             f"not count against --image_timeout_s. Default: {ImageSettings.throttled_retry_s:g}.")
    add("--initial_read_rate", type=float, default=JOB_READS_PER_S,
        help="Image reads a second the whole job starts at, shared by its worker processes (--max_num_workers, "
             "or --num_workers, times the machine type's vCPUs; 100 processes when neither is given); the rate "
             "doubles every 20 minutes, Cloud Storage's ramp for a cold bucket, and halves on throttling. Raise "
             f"it for a bucket that already serves more. Default: {JOB_READS_PER_S:g}.")
    add("--conversion_threads", type=int, default=2,
        help="Images converted at once in each worker process (decoding, resizing, encoding). Pillow decodes "
             "and resizes outside Python's lock, so two keep a core busy while the other waits, and let busy "
             "workers use the cores of idle ones. More threads read files ahead of them, as many as the "
             "measured read latency asks for (up to 64), within --worker_memory_mb. Default: 2.")
    add("--schema", default="default", choices=CLASSIFICATION_SCHEMAS,
        help="Example keys: default (image, label, class_name, height, width, source_path, sha256), tf_slim "
             "(image/encoded, image/class/label, ...) or kaggle (image, class, id: the keys Kaggle's TPU notebooks "
             "read, and the default ones but label). Default: default.")
    add("--num_shards", default="0",
        help="Shards of each split: per split as train=64,validation=8 (a split not named is sized by "
             "--shard_size_mb), or one number N for train alone, the validation and test splits then sized "
             "by --shard_size_mb. Default: 0, every split sized for shards of about --shard_size_mb.")
    add("--shard_size_mb", type=int, default=150,
        help="Target shard size in MB for the splits --num_shards does not set, from the output size of a "
             "sample of images converted with these settings. Default: 150.")
    add("--compression", default="none", choices=COMPRESSIONS,
        help="TFRecord compression; gzip shards end in .tfrecord.gz. Default: none.")
    add("--file_format", default="tfrecord", choices=FILE_FORMATS,
        help="File format of the shards: tfrecord, or array_record (train-00000-of-00004.array_record, the same "
             "serialized Examples, one per ArrayRecord chunk) for Grain's random access. array_record takes "
             "neither --compression=gzip nor --index_files. Default: tfrecord.")
    add("--shard_names", default="standard", choices=SHARD_NAMES,
        help="How shards are named: standard (train-00000-of-00004.tfrecord) or kaggle, with the shard's index "
             "and record count as Kaggle's TPU notebooks count them (train00-2071.tfrec). Default: standard.")
    add("--index_files", **ON_OFF,
        help="Also write each shard's index for DALI's TFRecord reader and the tfrecord package, beside it: "
             "train-00000-of-00004.idx for train-00000-of-00004.tfrecord, one 'offset length' line per record. "
             "Uncompressed shards only. Default: off.")
    add("--if_exists", default="refuse", choices=IF_EXISTS,
        help="What a complete dataset already in --output_dir means: refuse stops with an error; overwrite "
             "replaces it once the new run has finished (only files this tool writes are removed); skip exits "
             "0 without converting when it was made from the same options, for schedulers' retries, and "
             "refuses one made with other options; append converts only the images the dataset does not hold "
             "yet (same relative path and SHA-256) into new shards beside its own, and needs the options that "
             "shape records to be the dataset's (docs/growing-datasets.md). Default: refuse.")
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


def help_text() -> str:
    parser = argparse.ArgumentParser(
        prog=program_name("python -m pipeline.main"),
        description="Convert a folder of labeled images into sharded TFRecord files with Apache Beam.",
        epilog="Any Apache Beam pipeline option (--runner, --direct_num_workers, --project, --region, "
               "--temp_location, ...) is accepted too.",
    )
    add_convert_arguments(parser, mark_required=True)
    return parser.format_help()
