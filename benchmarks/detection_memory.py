"""Where a local detection run's memory grows with the images: the peak RSS of each process of the run's tree.

    python -m benchmarks.detection_memory --images 1000 2000 4000
    python -m benchmarks.detection_memory --images 2000 --cases detection --json result.json

For each `--images` count it generates (no photos needed) a classic COCO export of small JPEGs
(`annotations/instances_{train,val}.json`, the images in `train/`, `val/`), each with 3 boxes and a 12-point polygon
inside each box, and, hard links to the same files, split and class folders; then runs the converter on them as a
whole command (classification, the reference; `--task=detection`; `--task=detection --instance_masks`) and samples,
every 0.1 s, the RSS of the launcher (the process that runs Beam's FnApiRunner, which holds the PCollections between
stages) and of each local worker. The figure per image is the growth between two sizes divided by the images
added: what the run holds per image, where.

It also prints the pickled bytes of one ImageRef of each kind (Beam's local runner and Dataflow's shuffle carry the
elements pickled), which is what the GroupByKeys before WriteShards hold per image.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

from benchmarks.convert_bench import PeakMemory
from benchmarks.detection_bench import polygon_in, with_comment

SIZE = (96, 72)  # every generated image's width and height: small, so that the conversion is cheap
OBJECTS = 3  # boxes per image, each with a polygon
CLASSES = ("ant", "bee", "flower")
CASES = {
    "classification": [],
    "detection": ["--task=detection"],
    "detection_masks": ["--task=detection", "--instance_masks"],
}
VALIDATION_EVERY = 5


def build_set(root: str, count: int, seed: int = 49) -> dict:
    """`count` generated JPEGs as a COCO export (root/coco) and split/class folders (root/folders)."""
    rng = random.Random(seed)
    pixels = np.random.default_rng(seed).integers(0, 255, (SIZE[1], SIZE[0], 3), dtype=np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(pixels).save(encoded, format="JPEG", quality=90)
    categories = [{"id": number, "name": name, "supercategory": "none"} for number, name in enumerate(CLASSES, 1)]
    splits = {split: {"categories": categories, "images": [], "annotations": []} for split in ("train", "val")}
    width, height = SIZE
    for index in range(count):
        split = "val" if index % VALIDATION_EVERY == VALIDATION_EVERY - 1 else "train"
        class_name = CLASSES[index % len(CLASSES)]
        relpath = f"{class_name}/{index:06d}.jpg"
        coco_path = os.path.join(root, "coco", split, relpath)
        os.makedirs(os.path.dirname(coco_path), exist_ok=True)
        with open(coco_path, "wb") as f:
            f.write(with_comment(encoded.getvalue(), f"copy {index}"))  # another file each time, the same pixels
        folder_path = os.path.join(root, "folders", split, relpath)
        os.makedirs(os.path.dirname(folder_path), exist_ok=True)
        os.link(coco_path, folder_path)
        data = splits[split]
        data["images"].append({"id": index + 1, "file_name": relpath, "width": width, "height": height})
        for _ in range(OBJECTS):
            w, h = width * rng.uniform(0.15, 0.5), height * rng.uniform(0.15, 0.5)
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            data["annotations"].append({
                "id": len(data["annotations"]) + 1 + (count * 10 if split == "val" else 0), "image_id": index + 1,
                "category_id": rng.randint(1, len(CLASSES)), "bbox": [round(v, 2) for v in (x, y, w, h)],
                "area": round(w * h * 0.78, 2), "iscrowd": 0, "segmentation": [polygon_in(x, y, w, h)]})
    os.makedirs(os.path.join(root, "coco", "annotations"), exist_ok=True)
    for split, data in splits.items():
        with open(os.path.join(root, "coco", "annotations", f"instances_{split}.json"), "w") as f:
            json.dump(data, f)
    return {"images": count, "coco": os.path.join(root, "coco"), "folders": os.path.join(root, "folders")}


def run_case(case: str, built: dict, output_dir: str, workers: int) -> dict:
    """One whole command; its peaks (MiB) and the records it wrote."""
    input_dir = built["folders"] if case == "classification" else built["coco"]
    command = [sys.executable, "-m", "pipeline.main", f"--input_dir={input_dir}", f"--output_dir={output_dir}",
               "--overwrite", "--quiet", f"--direct_num_workers={workers}", *CASES[case]]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakMemory(process.pid) as peaks:
        _, stderr = process.communicate()
    if process.returncode:
        raise SystemExit(f"{case} failed ({process.returncode}):\n{stderr[-3000:]}")
    with open(os.path.join(output_dir, "image_tfrecords.json")) as f:
        info = json.load(f)
    if info["files"]["written"] != built["images"]:
        raise SystemExit(f"{case} wrote {info['files']['written']} of {built['images']} images")
    mib = 2 ** 20
    return {"launcher_mib": peaks.launcher / mib, "worker_mib": max(peaks.workers.values(), default=0) / mib,
            "tree_mib": peaks.peak / mib, "workers": len(peaks.workers),
            "objects": (info.get("detection") or {}).get("annotations", {}).get("written")}


def element_bytes() -> dict:
    """The pickled bytes of one typical ImageRef of each kind: a classification one, a detection one (3 boxes),
    and a detection one with its 3 polygons (--instance_masks), as the runner's ToImageRefs makes them."""
    from transforms.detection.annotated import image_ref
    from transforms.detection.objects import Annotation, Box, ImageAnnotations, Segmentation
    from transforms.labels.layout import shuffle_key

    relpath = "flower/000123.jpg"
    path = f"/data/coco/train/{relpath}"
    rng = random.Random(7)
    objects = []
    for number in range(OBJECTS):
        x, y, w, h = (round(rng.uniform(10, 200), 2) for _ in range(4))
        objects.append(Annotation(CLASSES[number], Box(x, y, x + w, y + h), area=round(w * h * 0.78, 2),
                                  segmentation=Segmentation(polygons=(tuple(polygon_in(x, y, w, h)),)),
                                  where=f"annotations/instances_train.json: annotation id {1000 + number}"))
    image = ImageAnnotations(relpath, path, "124", "train", (640, 480), tuple(objects), size=51234)

    def one(segmentations: bool) -> int:
        refs = list(image_ref(image, 49, 0.1, 0.0, segmentations=segmentations))
        return len(pickle.dumps(refs[-1], protocol=pickle.HIGHEST_PROTOCOL))

    from transforms.base.records import ImageRef
    classification = ImageRef(path, relpath, 51234, "train", "flower", 2, shuffle_key(relpath, 49))
    return {"classification": len(pickle.dumps(classification, protocol=pickle.HIGHEST_PROTOCOL)),
            "detection": one(False), "detection_masks": one(True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, nargs="+", default=[1000, 2000, 4000])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--workers", type=int, default=2, help="--direct_num_workers (default 2)")
    parser.add_argument("--json", help="write the figures to this file too")
    args = parser.parse_args(argv)
    result = {"element_bytes": element_bytes(), "runs": {}}
    print("pickled bytes of one ImageRef:", result["element_bytes"], flush=True)
    with tempfile.TemporaryDirectory(prefix="detmem-") as workdir:
        for count in args.images:
            built = build_set(os.path.join(workdir, f"set-{count}"), count)
            for case in args.cases:
                run = run_case(case, built, os.path.join(workdir, f"out-{count}-{case}"), args.workers)
                result["runs"].setdefault(case, {})[count] = run
                print(f"{count:>7} images  {case:<16} launcher {run['launcher_mib']:6.0f} MiB  worker (largest) "
                      f"{run['worker_mib']:6.0f} MiB  tree {run['tree_mib']:6.0f} MiB", flush=True)
            shutil.rmtree(os.path.join(workdir, f"set-{count}"), ignore_errors=True)
    counts = sorted(args.images)
    if len(counts) > 1:
        small, large = counts[0], counts[-1]
        print(f"growth per image, {small} -> {large} (KiB/image):")
        for case, runs in result["runs"].items():
            growth = {key: (runs[large][key] - runs[small][key]) * 1024 / (large - small)
                      for key in ("launcher_mib", "worker_mib", "tree_mib")}
            result.setdefault("growth_kib_per_image", {})[case] = growth
            print(f"  {case:<16} launcher {growth['launcher_mib']:6.2f}  worker {growth['worker_mib']:6.2f}  "
                  f"tree {growth['tree_mib']:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
