"""Detection records against classification on the same photos, and against a one-process script of the classic kind.

    python -m benchmarks.detection_bench --photos ../shared/data/ants-bees --images 2000 4000 --repeat 3
    python -m benchmarks.detection_bench --photos my_photos/ --images 500 --repeat 2 --json result.json

From a folder of real JPEG photos it builds, for each `--images` count, a classic COCO export
(`annotations/instances_{train,val}.json`, the images in `train/<class>/`, `val/<class>/`): the photos repeated in
turn, each copy made a different file (a JPEG comment naming it is added, so no two files are duplicates; the
pixels are the photo's), with 2-3 boxes of its own (random places and sizes, one of three classes) and a 12-point
polygon inside each box; and, hard links to the same files, a folder of split and class folders. Then, in rounds
whose order turns by one case each round (the machine's speed drifts; each case's figure is taken against the
reference of its own round), it times four whole commands, start-up included:

  (a) classification, the reference: `python -m pipeline.main --input_dir=<split and class folders>`
  (b) detection: `--input_dir=<the COCO export> --task=detection`
  (c) detection with masks: the same with `--instance_masks` (COCO's polygons filled per object)
  (d) classic: `python -m benchmarks.classic_detection`, the OD API's way in one process (json.load, Pillow, one
      `tf.io.TFRecordWriter` per shard, round-robin): (b)'s work
  (e) classic with masks: the same with `--instance_masks`: (c)'s work

every one at the converter's defaults (512x512 stretched, bilinear, JPEG q95) and the local runner's default worker
count. For each case: wall and CPU milliseconds per image, the cores it kept busy (CPU over wall; the classic script
can use one), and its wall and CPU against (a)'s in the same round, median (min-max). Each run's records are
counted (images, and objects for (b)-(e)) so the cases are known to have done the same work.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import struct
import sys
import tempfile

from PIL import Image

from benchmarks.convert_bench import measure_pipeline, timed_command

CLASSES = ("ant", "bee", "flower")  # the boxes' classes (the photos' own class folders give (a)'s labels)
REFERENCE = "classification"
CASES = (REFERENCE, "detection", "detection_masks", "classic", "classic_masks")
VALIDATION_EVERY = 5  # every fifth copy in val/


def source_photos(photos: str) -> list[tuple[str, str, tuple[int, int]]]:
    """(path, class folder, (width, height)) of every JPEG under `photos`, by its first bytes and Pillow's header."""
    found = []
    for root, _, names in sorted(os.walk(photos)):
        for name in sorted(names):
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                if f.read(3) != b"\xff\xd8\xff":
                    continue  # not a JPEG (ants-bees holds a GIF): the classic script expects JPEGs
            with Image.open(path) as image:
                found.append((path, os.path.basename(root), image.size))
    if not found:
        raise SystemExit(f"no JPEG files under {photos}")
    return found


def with_comment(data: bytes, text: str) -> bytes:
    """The JPEG with a COM segment after its SOI: other bytes (another SHA-256), the same pixels."""
    comment = text.encode("ascii")
    return data[:2] + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + data[2:]


def polygon_in(x: float, y: float, w: float, h: float, points: int = 12) -> list[float]:
    """An ellipse's `points` vertices inscribed in the box, as COCO's flat [x1, y1, x2, y2, ...]."""
    flat = []
    for k in range(points):
        angle = 2 * math.pi * k / points
        flat += [round(x + w / 2 * (1 + math.cos(angle)), 2), round(y + h / 2 * (1 + math.sin(angle)), 2)]
    return flat


def build_set(photos: list, root: str, count: int, seed: int = 49) -> dict:
    """`count` copies of the photos as a COCO export in root/coco and split/class folders in root/folders."""
    rng = random.Random(seed)
    categories = [{"id": number, "name": name, "supercategory": "none"} for number, name in enumerate(CLASSES, 1)]
    splits = {split: {"categories": categories, "images": [], "annotations": []} for split in ("train", "val")}
    sources: dict[str, bytes] = {}
    for index in range(count):
        path, class_name, (width, height) = photos[index % len(photos)]
        if path not in sources:
            with open(path, "rb") as f:
                sources[path] = f.read()
        split = "val" if index % VALIDATION_EVERY == VALIDATION_EVERY - 1 else "train"
        relpath = f"{class_name}/{index:06d}.jpg"
        coco_path = os.path.join(root, "coco", split, relpath)
        os.makedirs(os.path.dirname(coco_path), exist_ok=True)
        with open(coco_path, "wb") as f:
            f.write(with_comment(sources[path], f"copy {index}"))
        folder_path = os.path.join(root, "folders", split, relpath)
        os.makedirs(os.path.dirname(folder_path), exist_ok=True)
        os.link(coco_path, folder_path)
        data = splits[split]
        data["images"].append({"id": index + 1, "file_name": relpath, "width": width, "height": height})
        for _ in range(rng.choice((2, 3))):
            w, h = width * rng.uniform(0.15, 0.5), height * rng.uniform(0.15, 0.5)
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            data["annotations"].append({
                "id": len(data["annotations"]) + 1 + (count * 10 if split == "val" else 0), "image_id": index + 1,
                "category_id": rng.randint(1, len(CLASSES)), "bbox": [round(v, 2) for v in (x, y, w, h)],
                "area": round(math.pi / 4 * w * h, 2), "iscrowd": 0, "segmentation": [polygon_in(x, y, w, h)]})
    os.makedirs(os.path.join(root, "coco", "annotations"), exist_ok=True)
    for split, data in splits.items():
        with open(os.path.join(root, "coco", "annotations", f"instances_{split}.json"), "w") as f:
            json.dump(data, f)
    return {"images": count, "objects": sum(len(data["annotations"]) for data in splits.values()),
            "coco": os.path.join(root, "coco"), "folders": os.path.join(root, "folders")}


def measure_classic(input_dir: str, output_dir: str, image_size: int, masks: bool) -> dict:
    """(d) and (e): the classic script as a whole command, timed as measure_pipeline times the converter's."""
    shutil.rmtree(output_dir, ignore_errors=True)
    command = [sys.executable, "-m", "benchmarks.classic_detection", f"--input_dir={input_dir}",
               f"--output_dir={output_dir}", f"--image_size={image_size}", *(["--instance_masks"] if masks else [])]
    run = timed_command(command, "the classic script")
    report = json.loads(run["stdout"].strip().splitlines()[-1])
    return {"images": report["images"], "objects": report["objects"], "seconds": run["seconds"],
            "cpu_seconds": run["cpu_seconds"], "peak_rss_bytes": run["peak_rss_bytes"],
            "seconds_after_imports": report["seconds_after_imports"]}


def measure_converter(input_dir: str, output_dir: str, extra: list[str]) -> dict:
    """(a)-(c): benchmarks.convert_bench's measure_pipeline, plus the objects a detection run wrote."""
    result = measure_pipeline(input_dir, output_dir, extra)
    with open(os.path.join(output_dir, "image_tfrecords.json")) as f:
        detection = json.load(f).get("detection")
    if detection:
        result["objects"] = detection["annotations"]["written"]
    return result


def run_case(case: str, built: dict, workdir: str, image_size: int, extra: list[str]) -> dict:
    out = os.path.join(workdir, f"out-{case}")
    size = [f"--image_size={image_size}", *extra]
    if case == REFERENCE:
        return measure_converter(built["folders"], out, size)
    if case == "detection":
        return measure_converter(built["coco"], out, ["--task=detection", *size])
    if case == "detection_masks":
        return measure_converter(built["coco"], out, ["--task=detection", "--instance_masks", *size])
    return measure_classic(built["coco"], out, image_size, masks=case == "classic_masks")


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(rounds: list[dict], images: int) -> dict:
    """Per case, over the rounds ({case: a run's dict}): ms per image (wall and CPU), cores busy, and wall and CPU
    against the reference of the same round, each as median, min and max."""
    summary = {}
    for case in rounds[0]:
        runs = [measured[case] for measured in rounds]
        summary[case] = {
            "wall_ms_per_image": _spread([1000 * run["seconds"] / images for run in runs]),
            "cpu_ms_per_image": _spread([1000 * run["cpu_seconds"] / images for run in runs]),
            "cores_busy": _spread([run["cpu_seconds"] / run["seconds"] for run in runs]),
            "wall_vs_reference": _spread([measured[case]["seconds"] / measured[REFERENCE]["seconds"]
                                          for measured in rounds]),
            "cpu_vs_reference": _spread([measured[case]["cpu_seconds"] / measured[REFERENCE]["cpu_seconds"]
                                         for measured in rounds]),
            "peak_rss_mib": _spread([run["peak_rss_bytes"] / 2**20 for run in runs]),
        }
    return summary


def marginal(small: dict, large: dict) -> dict:
    """Per case, what one more image costs between two sizes (each size's median run): wall and CPU ms per image,
    and against the reference's: the start-up, paid once a run, drops out."""
    extra = large["images"] - small["images"]

    def median_of(size: dict, case: str, key: str) -> float:
        return statistics.median(measured[case][key] for measured in size["rounds"])

    figures = {}
    for case in large["summary"]:
        wall, cpu = ((median_of(large, case, key) - median_of(small, case, key)) / extra * 1000
                     for key in ("seconds", "cpu_seconds"))
        figures[case] = {"wall_ms_per_image": wall, "cpu_ms_per_image": cpu}
    for case in figures:
        for key in ("wall", "cpu"):
            figures[case][f"{key}_vs_reference"] = (figures[case][f"{key}_ms_per_image"]
                                                    / figures[REFERENCE][f"{key}_ms_per_image"])
    return {"from_images": small["images"], "to_images": large["images"], "cases": figures}


def _cell(spread: dict, digits: int) -> str:
    return f"{spread['median']:.{digits}f} ({spread['min']:.{digits}f}-{spread['max']:.{digits}f})"


def table(summary: dict, images: int, repeat: int) -> str:
    """The summary as a Markdown table, as BENCHMARKS.md shows it."""
    lines = [f"{images} images, {repeat} rounds: median (min-max)", "",
             "| case | wall ms/image | CPU ms/image | cores busy | wall / (a) | CPU / (a) | peak MiB |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for case, figures in summary.items():
        lines.append(f"| {case} | {_cell(figures['wall_ms_per_image'], 2)} | {_cell(figures['cpu_ms_per_image'], 2)}"
                     f" | {_cell(figures['cores_busy'], 2)} | {_cell(figures['wall_vs_reference'], 2)}"
                     f" | {_cell(figures['cpu_vs_reference'], 2)} | {_cell(figures['peak_rss_mib'], 0)} |")
    return "\n".join(lines)


def check_work(case: str, run: dict, built: dict) -> None:
    """Every case converted every image, and every detection case wrote every box: the same work, or no figure."""
    if run["images"] != built["images"] or run.get("objects", built["objects"]) != built["objects"]:
        raise SystemExit(f"{case} wrote {run['images']} images and {run.get('objects')} objects, not "
                         f"{built['images']} and {built['objects']}: its time is not comparable")


def bench_size(photos: list, count: int, args, extra: list[str]) -> dict:
    workdir = os.path.join(args.workdir, f"set-{count}")
    shutil.rmtree(workdir, ignore_errors=True)
    built = build_set(photos, workdir, count)
    print(f"{count} images ({built['objects']} boxes) from {len(photos)} photos in {workdir}", flush=True)
    cases = [case for case in CASES if case in args.cases]
    for _ in range(args.warmup):
        for case in cases:
            run_case(case, built, workdir, args.image_size, extra)
    rounds = []
    for number in range(args.repeat):
        order = cases[number % len(cases):] + cases[:number % len(cases)]
        measured = {}
        for case in order:
            measured[case] = run = run_case(case, built, workdir, args.image_size, extra)
            check_work(case, run, built)
            print(f"  round {number + 1} {case:16s} {run['seconds']:7.2f} s wall {run['cpu_seconds']:7.2f} s CPU",
                  flush=True)
        rounds.append({case: measured[case] for case in cases})
    summary = summarise(rounds, count)
    print(table(summary, count, args.repeat), flush=True)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"images": count, "objects": built["objects"], "rounds": rounds, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.detection_bench", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--photos", required=True, help="A folder of JPEG photos (in class folders: (a)'s labels).")
    parser.add_argument("--images", type=int, nargs="+", default=[2000, 4000], help="Set sizes. Default: 2000 4000.")
    parser.add_argument("--repeat", type=int, default=3, help="Rounds per size. Default: 3.")
    parser.add_argument("--warmup", type=int, default=1, help="Unrecorded rounds before them. Default: 1.")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES),
                        help=f"Default: all; {REFERENCE} is always run (the ratios' reference).")
    parser.add_argument("--image_size", type=int, default=512, help="Every case's output side. Default: 512.")
    parser.add_argument("--pipeline_args", default="", help="Extra flags for (a)-(c), space-separated.")
    parser.add_argument("--workdir", help="Scratch folder. Default: a new temporary folder.")
    parser.add_argument("--keep", action="store_true", help="Keep each set and its outputs in --workdir.")
    parser.add_argument("--json", help="Write every run and the summaries to this file.")
    args = parser.parse_args(argv)
    args.cases = sorted(set(args.cases) | {REFERENCE}, key=CASES.index)
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="detection_bench-")
    photos = source_photos(args.photos)
    results = {"photos": len(photos), "image_size": args.image_size, "cpu_count": os.cpu_count(),
               "load_average_at_start": os.getloadavg(),
               "sizes": [bench_size(photos, count, args, args.pipeline_args.split()) for count in args.images],
               "load_average_at_end": os.getloadavg()}
    if len(results["sizes"]) > 1:
        results["marginal"] = marginal(results["sizes"][0], results["sizes"][-1])
        print(f"\nOne more image, from {results['marginal']['from_images']} to {results['marginal']['to_images']} "
              "(medians; start-up left out):")
        for case, figures in results["marginal"]["cases"].items():
            print(f"  {case:16s} {figures['wall_ms_per_image']:6.2f} ms wall ({figures['wall_vs_reference']:.2f}x (a))"
                  f" {figures['cpu_ms_per_image']:6.2f} ms CPU ({figures['cpu_vs_reference']:.2f}x (a))", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
