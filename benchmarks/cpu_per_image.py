"""The whole run's CPU per image on real photos: the figure the Dataflow cost model (`benchmarks.cost_model`) rests on.

    python -m benchmarks.cpu_per_image --photos ../shared/data/ants-bees          # about 100 kB and 300 kB inputs
    python -m benchmarks.cpu_per_image --photos my_photos/ --copies 4 --json out.json

From a folder of real photos it makes two input folders: the photos themselves in `--copies`
variants each (cropped by a few pixels and saved again at JPEG quality 95, so that no two
files are duplicates), and the same enlarged 2x (about 300 kB a file for ~500x375 photos of
about 100 kB). Each folder is converted by the real command (`python -m pipeline.main`,
default options: 512x512 JPEG q95), and so is an 8-photo folder; the CPU of the whole process
tree (the launcher and its worker processes, user + system) on the big folder, less that on
the 8-photo one, over the difference in images, is the marginal CPU per image: what one
more image costs a worker on Dataflow, where the fixed start-up is paid once per job.
CPU seconds, unlike wall time, move little with other load on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

from PIL import Image

from benchmarks.convert_bench import image_files, measure_pipeline


def make_inputs(photos: str, root: str, copies: int, scale: float) -> str:
    """`copies` variants of every photo under `photos`, enlarged by `scale`, in class folders under `root`."""
    os.makedirs(root, exist_ok=True)
    for index, path in enumerate(image_files(photos)):
        class_name = os.path.basename(os.path.dirname(path))
        os.makedirs(os.path.join(root, class_name), exist_ok=True)
        with Image.open(path) as image:
            image = image.convert("RGB")
            for copy in range(copies):
                cut = image.crop((copy, copy, image.width - copy, image.height - copy))
                if scale != 1:
                    cut = cut.resize((round(cut.width * scale), round(cut.height * scale)), Image.Resampling.LANCZOS)
                cut.save(os.path.join(root, class_name, f"{index:05d}-{copy}.jpg"), quality=95)
    return root


def subset(source: str, root: str, count: int) -> str:
    files = image_files(source)[:count]
    for path in files:
        dest = os.path.join(root, os.path.basename(os.path.dirname(path)))
        os.makedirs(dest, exist_ok=True)
        os.link(path, os.path.join(dest, os.path.basename(path)))
    return root


def measure(input_dir: str, small_dir: str, workdir: str, repeat: int) -> dict:
    files = image_files(input_dir)
    big, small = [], []
    for _ in range(repeat):  # alternating: the machine's speed drifts
        big.append(measure_pipeline(input_dir, os.path.join(workdir, "out"), []))
        small.append(measure_pipeline(small_dir, os.path.join(workdir, "out-small"), []))
    marginal = [(b["cpu_seconds"] - s["cpu_seconds"]) / (b["images"] - s["images"])
                for b, s in zip(big, small, strict=True)]
    return {"images": len(files), "input_kb": sum(os.path.getsize(p) for p in files) / len(files) / 1e3,
            "output_kb": big[0]["output_bytes"] / big[0]["images"] / 1e3,
            "cpu_ms_per_image": [1e3 * m for m in marginal], "cpu_ms_median": 1e3 * statistics.median(marginal),
            "fixed_cpu_s": [s["cpu_seconds"] for s in small], "runs": {"all": big, "eight": small}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", required=True, help="A folder of class folders of real photos.")
    parser.add_argument("--copies", type=int, default=4, help="Variants of each photo. Default: 4.")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workdir", help="Scratch folder. Default: a temporary folder.")
    parser.add_argument("--json", help="Write the figures to this file.")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        workdir = args.workdir or scratch
        results = {}
        for name, scale in (("photos", 1.0), ("photos-2x", 2.0)):
            folder = make_inputs(args.photos, os.path.join(workdir, name), args.copies, scale)
            small = subset(folder, os.path.join(workdir, name + "-8"), 8)
            results[name] = measure(folder, small, workdir, args.repeat)
            r = results[name]
            print(f"{name}: {r['images']} files of {r['input_kb']:.0f} kB on average, {r['output_kb']:.0f} kB stored "
                  f"each; CPU per image " + ", ".join(f"{m:.1f}" for m in r["cpu_ms_per_image"]) + " ms", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
