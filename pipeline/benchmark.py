"""Measure how fast a converted dataset feeds a TPU, the GPUs or the CPU, stage by stage.

    python -m pipeline.benchmark tfrecords/
    python -m pipeline.benchmark gs://bucket/tfrecords --tpu=local --batch_size=1024 --steps=200
    python -m pipeline.benchmark tfrecords/ --global_batch=256 --target_steps_per_s=5
    python -m pipeline.benchmark tfrecords/ --compare_files=photos/ --json=bench.json --plot=bench.png
    python -m pipeline.benchmark --file_pattern='other/train-*' --schema=tf_slim --image_size=224

Stages, each a separate pass over the same files in one run:
    read     raw records, files read in parallel in no fixed order
    parse    + parse each Example with the reader helper (image bytes, label)
    decode   + decode the image, cast, batch with drop_remainder, prefetch
    device   + every batch handed to the device(s): a strategy.run step reduces it to one number
With --compare_files, files_decode and files_device run the same decode pipeline over the
original image files. The first batch of every stage is warm-up: reported as time to first
batch, excluded from the rates. After the table, one verdict line names the slowest stage and
compares the images/s the host feeds with what the accelerator needs: --global_batch images
--target_steps_per_s times a second.
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
import time
from dataclasses import dataclass

from pipeline.cli import (  # no Beam: --help and errors come fast
    import_tensorflow,
    main_of,
    parse_image_size,
    program_name,
)
from pipeline.errors import UserError
from pipeline.readers.bench_report import (
    FILE_STAGES,
    STAGES,
    TFRECORD_STAGES,
    StageResult,
    format_report,
    write_json,
    write_plot,
)
from transforms.base.dataset_format import CLASSIFICATION_SCHEMAS, SCHEMAS

DTYPE_NAMES = ("float32", "bfloat16", "uint8")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name("python -m pipeline.benchmark"), allow_abbrev=False,
        description="Measure how fast TFRecords feed a TPU, the GPUs or the CPU: raw read, parse, decode and "
                    "device feed, each measured separately in one run.")
    add = parser.add_argument
    add("dataset", nargs="?", default=None, metavar="DATASET_DIR",
        help="A converted dataset (the --output_dir of pipeline.main), local or gs://, as for verify and preview; "
             "its image_tfrecords.json names the shards, keys and image size. This (or --dataset_dir) or "
             "--file_pattern is required.")
    add("--dataset_dir", default=None,
        help="The same as the DATASET_DIR argument. Default: none.")
    add("--file_pattern", default=None,
        help="Any TFRecord files instead, as a glob (quote it), local or gs://; .gz files are read as GZIP. "
             "Keys from --schema or --image_key/--label_key.")
    add("--split", default="train", help="Split of --dataset_dir to read. Default: train.")
    add("--schema", default=None, choices=CLASSIFICATION_SCHEMAS,
        help="Keys of --file_pattern records: default (image, label) or tf_slim (image/encoded, "
             "image/class/label). Default: default.")
    add("--image_key", default=None, help="Key of the encoded image in --file_pattern records. Default: from "
                                         "--schema.")
    add("--label_key", default=None,
        help="Key of the int64 label in --file_pattern records; empty for none. Default: from --schema.")
    add("--image_size", default=None,
        help="Resize images to N (square) or WxH. Default: the dataset's fixed size, or for --file_pattern the "
             "first image's size (then every image must have it).")
    add("--batch_size", type=int, default=128,
        help="Global batch size, split evenly over the replicas (TPU cores, GPUs). Default: 128.")
    add("--epochs", type=int, default=1, help="Passes over the files per stage. Default: 1.")
    add("--steps", type=int, default=0,
        help="At most this many batches per stage, the warm-up batch included; 0 for no limit. Default: 0.")
    add("--stages", default=",".join(TFRECORD_STAGES),
        help=f"Comma-separated stages to run, of {','.join(TFRECORD_STAGES)}. Default: {','.join(TFRECORD_STAGES)}.")
    add("--dtype", default="float32", choices=DTYPE_NAMES,
        help="Type the decoded images are cast to before batching. Default: float32.")
    add("--tpu", default=None,
        help="TPU to use: a TPU name, a grpc:// address, or local on a TPU VM. Default: auto (a TPU detected "
             "from TPU_NAME or TPU devices, else all GPUs with MirroredStrategy, else the CPU).")
    add("--compare_files", default=None,
        help="Folder of the original image files (e.g. the conversion's --input_dir): run the decode and device "
             "stages over them too, resized to the same size. Default: none.")
    add("--global_batch", type=int, default=0,
        help="Global batch size of the training the verdict line compares with: images per step over all "
             "replicas. Default: 0, the --batch_size.")
    add("--target_steps_per_s", type=float, default=10.0,
        help="Training steps a second the accelerator should run (10 = a 100 ms step, typical of a mid-sized "
             "image model on one accelerator): the verdict needs --global_batch x this many images/s. "
             "Default: 10.")
    add("--json", default=None, help="Also write the figures to this JSON file (local or gs://). Default: none.")
    add("--plot", default=None,
        help="Also draw images/s per stage as a PNG bar chart here, on a linear axis with each value written "
             "and the images/s the accelerator needs drawn as a line. Default: none.")
    add("--verbose", action="store_true", help="Show TensorFlow's own logs. Default: off.")
    return parser


@dataclass
class Settings:
    """Validated options of one benchmark run."""

    dataset_dir: str | None
    file_pattern: str | None
    split: str
    image_key: str
    label_key: str | None
    image_size: tuple[int, int] | None  # (height, width)
    batch_size: int
    epochs: int
    steps: int
    stages: list[str]
    dtype: str
    tpu: str | None
    compare_files: str | None
    json_path: str | None
    plot_path: str | None
    verbose: bool
    global_batch: int = 0  # 0: the batch_size
    target_steps_per_s: float = 10.0


def validate(args: argparse.Namespace) -> Settings:
    """Check the options before TensorFlow is even imported."""
    if args.dataset and args.dataset_dir and args.dataset.rstrip("/") != args.dataset_dir.rstrip("/"):
        raise UserError(f"two dataset folders: {args.dataset} and --dataset_dir={args.dataset_dir}; give one")
    args.dataset_dir = args.dataset or args.dataset_dir
    if bool(args.dataset_dir) == bool(args.file_pattern):
        raise UserError("give the dataset folder (python -m pipeline.benchmark DIR, or --dataset_dir=DIR) or "
                        "--file_pattern='GLOB' (any TFRecords), not both and not neither")
    if args.dataset_dir and (args.schema or args.image_key or args.label_key is not None):
        raise UserError("--schema, --image_key and --label_key are for --file_pattern; with --dataset_dir the "
                        "keys come from image_tfrecords.json")
    for name in ("batch_size", "epochs"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name}={getattr(args, name)} must be at least 1")
    if args.global_batch < 0:
        raise UserError(f"--global_batch={args.global_batch} must be 0 (the --batch_size) or a number of images")
    if not (args.target_steps_per_s > 0 and math.isfinite(args.target_steps_per_s)):
        raise UserError(f"--target_steps_per_s={args.target_steps_per_s} must be a positive number of steps a "
                        "second, such as 10 for a 100 ms step")
    if args.steps < 0 or args.steps == 1:
        raise UserError(f"--steps={args.steps} must be 0 (no limit) or at least 2: the first batch is warm-up")
    stages = [stage.strip() for stage in args.stages.split(",") if stage.strip()]
    unknown = [stage for stage in stages if stage not in TFRECORD_STAGES]
    if unknown or not stages:
        raise UserError(f"--stages={args.stages!r}: choose from {','.join(TFRECORD_STAGES)}")
    if args.compare_files and not {"decode", "device"} & set(stages):
        raise UserError("--compare_files runs the decode and device stages over the image files; include decode "
                        "or device in --stages")
    image_key, label_key = SCHEMAS[args.schema or "default"]["image"][0], SCHEMAS[args.schema or "default"]["label"][0]
    image_size = None
    if args.image_size:
        width, height = parse_image_size(args.image_size)
        image_size = (height, width)
    return Settings(
        dataset_dir=args.dataset_dir, file_pattern=args.file_pattern, split=args.split,
        image_key=args.image_key or image_key,
        label_key=label_key if args.label_key is None else args.label_key or None,
        image_size=image_size, batch_size=args.batch_size, epochs=args.epochs, steps=args.steps,
        stages=[stage for stage in TFRECORD_STAGES if stage in stages], dtype=args.dtype, tpu=args.tpu,
        compare_files=args.compare_files, json_path=args.json, plot_path=args.plot, verbose=args.verbose,
        global_batch=args.global_batch or args.batch_size, target_steps_per_s=args.target_steps_per_s,
    )


def run_stages(settings: Settings, source, files, choice) -> list[StageResult]:
    """Run every stage in order; each is timed on its own pass over the files."""
    import tensorflow as tf

    from pipeline.readers import bench_input as bi

    batch, dtype, epochs = settings.batch_size, settings.dtype, settings.epochs
    strategy = choice.strategy

    def batches_of(stage):
        if stage in ("read", "parse", "decode"):
            return bi.host_batches(lambda: bi.tfrecord_dataset(source, stage, batch, dtype, epochs))
        if stage == "device":
            return bi.device_batches(strategy, lambda ctx: bi.tfrecord_dataset(
                source, "device", ctx.get_per_replica_batch_size(batch), dtype, epochs, ctx))
        if stage == "files_decode":
            return bi.host_batches(lambda: bi.files_dataset(files, source.image_size, batch, dtype, epochs))
        return bi.device_batches(strategy, lambda ctx: bi.files_dataset(
            files, source.image_size, ctx.get_per_replica_batch_size(batch), dtype, epochs, ctx))

    stages = list(settings.stages)
    if files is not None:
        bases = ("decode", "device")  # files_decode mirrors decode, files_device mirrors device
        stages += [name for name, base in zip(FILE_STAGES, bases, strict=True) if base in settings.stages]
    results = []
    for stage in stages:
        print(f"measuring {stage}: {STAGES[stage]}", file=sys.stderr, flush=True)
        try:
            result = bi.time_stage(stage, batches_of(stage), settings.steps)
        except (tf.errors.OpError, UnicodeDecodeError) as e:  # see bench_input.explain_error
            if stage in FILE_STAGES:
                raise UserError(f"reading the image files under {files.root} failed: {bi.tf_message(e)}") from None
            raise bi.explain_error(e, source, source.files) from None
        _check_counts(result, settings, source, files)
        results.append(result)
    return results


def _check_counts(result: StageResult, settings: Settings, source, files) -> None:
    """Refuse a stage that delivered nothing; note dropped remainders and skipped files."""
    batch = settings.batch_size
    per_epoch = len(files.paths) if result.stage in FILE_STAGES else source.records_per_epoch
    if result.batches == 0:
        have = f" ({per_epoch:,} records x {settings.epochs} epoch(s))" if per_epoch else ""
        raise UserError(f"{result.stage}: no complete batch: the input{have} holds fewer records than "
                        f"--batch_size={batch}; lower --batch_size or raise --epochs")
    if result.batches == 1:
        result.notes.append("only the warm-up batch ran, so there are no rates; lower --batch_size, raise "
                            "--epochs or --steps")
    if settings.steps or not per_epoch:
        return
    total = per_epoch * settings.epochs
    expected = total // batch * batch
    if result.stage in FILE_STAGES and result.records < expected:
        result.notes.append(f"about {expected - result.records} image file(s) could not be decoded and were skipped")
    elif total > result.records:
        result.notes.append(f"{total - result.records} record(s) of the last partial batch were not read "
                            "(drop_remainder)")


def run(argv: list[str]) -> int:
    """The command: options, the source, the strategy, every stage, then the report. Returns the exit code."""
    try:
        return _run(argv)
    except KeyboardInterrupt:  # nothing to clean up: the benchmark only reads
        print("error: interrupted", file=sys.stderr)
        return 130


def _run(argv: list[str]) -> int:
    settings = validate(build_parser().parse_args(argv))
    tf = import_tensorflow(settings.verbose)
    from pipeline.readers import bench_input as bi
    from pipeline.readers.strategy import select_strategy

    if settings.dataset_dir:
        source = bi.dataset_source(settings.dataset_dir, settings.split, settings.image_size)
    else:
        source = bi.pattern_source(settings.file_pattern, settings.image_key, settings.label_key,
                                   settings.image_size)
    files = bi.image_files(settings.compare_files) if settings.compare_files else None

    choice = select_strategy(settings.tpu)
    replicas = choice.num_replicas
    if settings.batch_size % replicas:
        nearest = replicas * max(1, settings.batch_size // replicas)
        raise UserError(f"--batch_size={settings.batch_size} is not a multiple of the {replicas} replicas of "
                        f"the {choice.description}; use a multiple such as {nearest}")

    results = run_stages(settings, source, files, choice)
    setup = {
        "source": source.name,
        "split": source.split,
        "files": len(source.files),
        "stored_bytes": sum(source.sizes),
        "records_per_epoch": source.records_per_epoch,
        "image_size": list(source.image_size),
        "resized": source.resize,
        "dtype": settings.dtype,
        "batch_size": settings.batch_size,
        "per_replica_batch_size": settings.batch_size // replicas,
        "epochs": settings.epochs,
        "steps": settings.steps,
        "strategy": choice.description,
        "strategy_kind": choice.kind,
        "replicas": replicas,
        "compare_files": settings.compare_files,
        "compare_files_count": len(files.paths) if files else 0,
        "global_batch": settings.global_batch,
        "target_steps_per_s": settings.target_steps_per_s,
        "required_images_per_s": settings.global_batch * settings.target_steps_per_s,
        "tensorflow_version": tf.__version__,
        "host": socket.gethostname(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "notes": list(choice.notes) + ([f"{files.skipped} file(s) under --compare_files are not images "
                                        "tf.io.decode_image reads and were left out"] if files and files.skipped
                                       else []),
    }
    for path, write in ((settings.json_path, write_json), (settings.plot_path, write_plot)):
        if path:
            try:
                write(path, setup, results)
            except OSError as e:
                raise UserError(f"cannot write {path} ({e.strerror or e}); choose another path") from None
            print(f"wrote {path}", file=sys.stderr)
    print(format_report(setup, results))  # last, so that a run ends with its table
    return 0


# What Ctrl-C or SIGTERM leaves (pipeline.cli.main_of's last line).
STOPPED = "the benchmark stopped before its report; the dataset is unchanged: run the same command again"


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point: `run`, with one error line for a bad input or an interruption."""
    return main_of(run, argv, stopped=STOPPED)


if __name__ == "__main__":
    sys.exit(main())
