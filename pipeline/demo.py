"""`make demo`: generate a small labeled photo dataset, convert it on the local runner, read it back, benchmark it.

    python -m pipeline.demo [--workdir demo_output] [--images_per_class 60]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from pipeline.cli import import_tensorflow, main_of
from pipeline.launcher import run as convert
from pipeline.sample_data import DEFAULT_CLASSES, generate_dataset


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="demo_output", help="Folder for the demo's files. Default: demo_output.")
    parser.add_argument("--images_per_class", type=int, default=60, help="Images per class. Default: 60.")
    args = parser.parse_args(argv)

    images = os.path.join(args.workdir, "images")
    dataset = os.path.join(args.workdir, "tfrecords")
    shutil.rmtree(images, ignore_errors=True)
    paths = generate_dataset(images, images_per_class=args.images_per_class, seed=0)
    print(f"1/4 Generated {len(paths)} photo-like images in {len(DEFAULT_CLASSES)} class folders under {images}")

    print(f"2/4 Converting to TFRecords in {dataset} on the local runner")
    code = convert([f"--input_dir={images}", f"--output_dir={dataset}", "--overwrite"])
    if code:
        return code

    print("3/4 Reading the dataset back with tf.data")
    import_tensorflow()  # quietly: no CUDA probing chatter between the demo's lines
    from pipeline import reader

    info = reader.load_info(dataset)
    for split, split_info in info["splits"].items():
        ds = reader.make_dataset(dataset, split, batch_size=16, drop_remainder=False)
        seen, shape = 0, None
        for batch in ds:
            seen += int(batch["label"].shape[0])
            shape = tuple(batch["image"].shape[1:])
        status = "ok" if seen == split_info["records"] else "MISMATCH"
        print(f"    {split:<10} read {seen} of {split_info['records']} records, images {shape}: {status}")
        if seen != split_info["records"]:
            return 1

    print("4/4 Benchmarking how fast the train split feeds the device, beside the original files")
    from pipeline import benchmark

    return benchmark.run([f"--dataset_dir={dataset}", "--batch_size=16", f"--compare_files={images}",
                          f"--json={os.path.join(args.workdir, 'benchmark.json')}",
                          f"--plot={os.path.join(args.workdir, 'benchmark.png')}"])


if __name__ == "__main__":
    sys.exit(main_of(run))
