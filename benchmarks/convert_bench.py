"""Conversion benchmark: the pipeline against the all-core Pillow floor and the seed notebook's method.

    python -m benchmarks.convert_bench                       # 2,000 generated photos, 512x512, quality 95
    python -m benchmarks.convert_bench --images 20000 --skip_notebook
    python -m benchmarks.convert_bench --repeat 3            # medians of 3 alternating runs
    python -m benchmarks.convert_bench --input_dir=my_photos/ --json=result.json
    python -m benchmarks.convert_bench --large --images 500   # camera-sized photos (about 1800x1350)

Every figure is measured in the same run on the same files, and reported as a
ratio against the floors, so a busy machine shifts all of them together:
  (a) Pillow floor: the project's own convert_image on its Pillow path over every core with a process
      pool, no Beam;
  (e) fast floor: the same work with the fastest stack (libjpeg-turbo through simplejpeg, OpenCV's
      SIMD resize) over every core, no Beam, none of the project's code;
  (f) convert_image over every core with its default core (the fast one for common files);
  (b) pipeline: `python -m pipeline.main` with its default options, as a user runs it (wall time
      of the whole command, start-up included), with the peak memory of its whole process tree;
  (c) notebook: the seed notebook's method, image_dataset_from_directory then one
      TFRecordWriter per shard with one Dataset.shard() pass per file;
  (d) graph only: the same command as (b) with the image work taken out (benchmarks.graph_only):
      what the pipeline adds to the floor's work. Were the two simply to add up, (b) / (a) would
      be floor / (floor + graph only); what (b) takes beyond that is the cost of running both at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import psutil

from transforms.images.imaging import convert_image
from transforms.images.settings import ImageSettings

CLASSES = ("apple", "banana", "cherry", "grape")


def generate_photos(root: str, count: int, seed: int = 0, median_width: int = 450) -> None:
    """Photo-like JPEGs around the median size of real photo folders (about 450x375), or of camera photos
    with `median_width` 1800 (about 1800x1350)."""
    from pipeline.sample_data import photo_like

    rng = np.random.default_rng(seed)
    for i in range(count):
        class_name = CLASSES[i % len(CLASSES)]
        os.makedirs(os.path.join(root, class_name), exist_ok=True)
        width = int(np.clip(rng.normal(median_width, median_width / 5), 200, 4 * median_width))
        height = int(np.clip(width * rng.uniform(0.65, 1.0), 150, 4 * median_width))
        image = photo_like(width, height, rng, hue=CLASSES.index(class_name) / len(CLASSES))
        image.save(os.path.join(root, class_name, f"{i:06d}.jpg"), quality=90)


def image_files(root: str) -> list[str]:
    return sorted(
        os.path.join(dirpath, name)
        for dirpath, _, names in os.walk(root)
        for name in names
        if name.lower().endswith((".jpg", ".jpeg", ".png"))
    )


class PeakMemory:
    """Peak summed RSS of a process and all its children (`peak`), and the peaks of the process itself
    (`launcher`) and of each child ({pid: bytes}, `workers`), sampled every 0.1 s."""

    def __init__(self, pid: int):
        self._process = psutil.Process(pid)
        self.peak = self.launcher = 0
        self.workers: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._stop.is_set():
            try:
                children = self._process.children(recursive=True)
                own = self._process.memory_info().rss
            except psutil.Error:
                return
            total, self.launcher = own, max(self.launcher, own)
            for child in children:
                try:
                    rss = child.memory_info().rss
                except psutil.Error:
                    continue
                total += rss
                self.workers[child.pid] = max(self.workers.get(child.pid, 0), rss)
            self.peak = max(self.peak, total)
            self._stop.wait(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


_SETTINGS = None


def _init_worker(settings):
    global _SETTINGS
    _SETTINGS = settings


def _convert_file(path: str) -> int:
    with open(path, "rb") as f:
        return len(convert_image(f.read(), _SETTINGS).data)


def _fast_file(path: str) -> int:
    """The fast floor's work on one file: libjpeg-turbo decode (DCT-scaled when it shrinks), OpenCV's SIMD
    resize (area when shrinking, bilinear when enlarging), libjpeg-turbo encode; nothing else."""
    import cv2
    import simplejpeg

    width, height = _SETTINGS.width, _SETTINGS.height
    with open(path, "rb") as f:
        data = f.read()
    try:
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=width, min_height=height)
    except ValueError:  # not a JPEG: OpenCV decodes it
        pixels = cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    shrinking = pixels.shape[1] > width and pixels.shape[0] > height
    pixels = cv2.resize(pixels, (width, height), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR)
    return len(simplejpeg.encode_jpeg(pixels, quality=_SETTINGS.jpeg_quality, colorspace="RGB",
                                      colorsubsampling="420"))


def pillow_settings(settings: ImageSettings) -> ImageSettings:
    """`settings` with every image on the Pillow path (the project's own image_backend option, where it has one)."""
    if "image_backend" in {f.name for f in dataclasses.fields(ImageSettings)}:
        return dataclasses.replace(settings, image_backend="pillow")
    return settings


def measure_floor(files: list[str], settings: ImageSettings, work=_convert_file) -> dict:
    """(a) convert_image over every core with nothing else: read, decode, resize, encode; (e) with _fast_file."""
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(os.cpu_count(), _init_worker, (settings,)) as pool:
        total_bytes = sum(pool.imap_unordered(work, files, chunksize=8))
    elapsed = time.perf_counter() - start
    return {"images": len(files), "seconds": elapsed, "images_per_second": len(files) / elapsed,
            "output_bytes": total_bytes}


def _children_cpu() -> float:
    """CPU seconds of every ended child process so far, with the children they waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_command(command: list[str], what: str) -> dict:
    """Run `command` to its end: its wall `seconds`, `cpu_seconds` (its whole process tree), `peak_rss_bytes` and
    `stdout`. Stops the benchmark (SystemExit naming `what`, with the end of its stderr) when it fails."""
    start, cpu_before = time.perf_counter(), _children_cpu()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakMemory(process.pid) as memory:
        stdout, stderr = process.communicate()
    elapsed = time.perf_counter() - start
    if process.returncode:
        raise SystemExit(f"{what} failed ({process.returncode}):\n{stderr[-3000:]}")
    return {"seconds": elapsed, "cpu_seconds": _children_cpu() - cpu_before, "peak_rss_bytes": memory.peak,
            "stdout": stdout}


def measure_pipeline(input_dir: str, output_dir: str, extra: list[str], module: str = "pipeline.main") -> dict:
    """(b) the real command line, default options, timed from launch to exit; (d) with module=GRAPH_ONLY."""
    command = [sys.executable, "-m", module, f"--input_dir={input_dir}", f"--output_dir={output_dir}",
               "--overwrite", "--quiet", *extra]
    run = timed_command(command, "pipeline")
    elapsed = run["seconds"]
    with open(os.path.join(output_dir, "image_tfrecords.json")) as f:
        info = json.load(f)
    written = info["files"]["written"]
    return {"images": written, "seconds": elapsed, "images_per_second": written / elapsed,
            "in_job_seconds": info["elapsed_seconds"], "peak_rss_bytes": run["peak_rss_bytes"],
            "cpu_seconds": run["cpu_seconds"],
            "output_bytes": info["total_bytes"], "shards": sum(len(s["shards"]) for s in info["splits"].values())}


def measure_notebook(input_dir: str, output_dir: str, image_size: int, quality: int, shards: int) -> dict:
    """(c) the seed notebook: decode/resize/encode in one TF loop, one Dataset.shard() pass per file."""
    code = f"""
import os, time, tensorflow as tf
start = time.perf_counter()
ds = tf.keras.utils.image_dataset_from_directory({input_dir!r}, image_size=({image_size}, {image_size}),
                                                 batch_size=None, shuffle=False)
count = 0
for shard in range({shards}):
    path = os.path.join({output_dir!r}, f"notebook-{{shard:05d}}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for image, label in ds.shard({shards}, shard):
            encoded = tf.io.encode_jpeg(tf.cast(image, tf.uint8), quality={quality})
            example = tf.train.Example(features=tf.train.Features(feature={{
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded.numpy()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }}))
            writer.write(example.SerializeToString())
            count += 1
print(count, time.perf_counter() - start)
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    os.makedirs(output_dir, exist_ok=True)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if result.returncode:
        raise SystemExit(f"notebook method failed:\n{result.stderr[-3000:]}")
    count, seconds = result.stdout.split()[-2:]
    count, seconds = int(count), float(seconds)
    return {"images": count, "seconds": seconds, "images_per_second": count / seconds, "shards": shards}


GRAPH_ONLY = "benchmarks.graph_only"


def additive_ratio(floor: dict, graph_only: dict) -> float:
    """The pipeline / floor ratio if the pipeline took the floor's time plus the graph's own."""
    return floor["seconds"] / (floor["seconds"] + graph_only["seconds"])


def _median_run(runs: list[dict]) -> dict:
    """The run with the median images/s (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda run: run["images_per_second"])
    return ordered[(len(ordered) - 1) // 2]


def photos_dir(workdir: str, count: int, median_width: int = 450) -> str:
    """A cached folder of `count` generated photos under `workdir`."""
    path = os.path.join(workdir, f"photos-{count}" + (f"-w{median_width}" if median_width != 450 else ""))
    if not os.path.isdir(path) or len(image_files(path)) != count:
        shutil.rmtree(path, ignore_errors=True)
        print(f"generating {count} photo-like JPEGs in {path} ...", flush=True)
        generate_photos(path, count, median_width=median_width)
    return path


def measure_startup(workdir: str, extra: list[str]) -> dict:
    """The fixed start-up: the whole command on a folder of 8 small photos (launch, plan, graph, exit)."""
    return measure_pipeline(photos_dir(workdir, 8, median_width=300), os.path.join(workdir, "startup-out"), extra)


def scaling(args) -> int:
    """The pipeline alone at several sizes: seconds per image and peak memory should not grow."""
    workdir = args.workdir or tempfile.mkdtemp(prefix="convert_bench-")
    rows = []
    for count in (int(n) for n in args.scaling.split(",")):
        result = measure_pipeline(photos_dir(workdir, count), os.path.join(workdir, "out"),
                                  args.pipeline_args.split())
        rows.append(result)
        print(f"{count:>7} images  {result['seconds']:7.1f} s  {result['images_per_second']:6.1f} images/s  "
              f"{1000 * result['seconds'] / count:6.2f} ms/image  peak {result['peak_rss_bytes'] / 1e6:5.0f} MB",
              flush=True)
    first, last = rows[0], rows[-1]
    print(f"\n{last['images'] / first['images']:.0f}x the images took {last['seconds'] / first['seconds']:.2f}x the "
          f"time; peak memory {last['peak_rss_bytes'] / first['peak_rss_bytes']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scaling": rows}, f, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.convert_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--input_dir", help="A folder of class folders to use instead of generated photos.")
    parser.add_argument("--images", type=int, default=2000, help="Photos to generate. Default: 2000.")
    parser.add_argument("--large", action="store_true",
                        help="Generate camera-sized photos (median about 1800x1350) instead of web-sized ones.")
    parser.add_argument("--notebook_images", type=int, default=400,
                        help="Photos the (slow) notebook method converts, a subset. Default: 400.")
    parser.add_argument("--notebook_shards", type=int, default=16,
                        help="Output files of the notebook method; it re-reads the dataset once per file. "
                             "Default: 16.")
    parser.add_argument("--skip_notebook", action="store_true", help="Do not run the notebook method.")
    parser.add_argument("--skip_graph_only", action="store_true",
                        help="Do not measure the pipeline without its image work.")
    parser.add_argument("--repeat", type=int, default=1,
                        help="Measure the floor and the pipeline this many times, alternating, and report the "
                             "medians (a shared machine's speed drifts between runs). Default: 1.")
    parser.add_argument("--workdir", default=None, help="Scratch folder. Default: a temporary folder.")
    parser.add_argument("--json", help="Write the figures to this file.")
    parser.add_argument("--pipeline_args", default="", help="Extra flags for pipeline.main, space-separated.")
    parser.add_argument("--scaling", default="",
                        help="Comma-separated image counts, e.g. 2000,20000: run only the pipeline at each size and "
                             "report time per image and peak memory, to show linear time and flat memory.")
    args = parser.parse_args(argv)
    if args.scaling:
        return scaling(args)

    workdir = args.workdir or tempfile.mkdtemp(prefix="convert_bench-")
    input_dir = args.input_dir or photos_dir(workdir, args.images, 1800 if args.large else 450)
    files = image_files(input_dir)
    settings = ImageSettings()  # the pipeline's defaults: 512x512 stretch, bilinear, JPEG quality 95
    sizes = [os.path.getsize(f) for f in files]
    print(f"{len(files)} images, median file {np.median(sizes) / 1e3:.0f} kB; {os.cpu_count()} cores", flush=True)

    results = {"images": len(files), "cores": os.cpu_count()}
    floors, fasts, cores, pipelines, graphs = [], [], [], [], []
    pillow = pillow_settings(settings)
    for _ in range(max(1, args.repeat)):
        floors.append(measure_floor(files, pillow))
        print(f"(a) Pillow floor {floors[-1]['images_per_second']:8.1f} images/s", flush=True)
        fasts.append(measure_floor(files, settings, _fast_file))
        print(f"(e) fast floor   {fasts[-1]['images_per_second']:8.1f} images/s (simplejpeg + OpenCV, no Beam)",
              flush=True)
        if pillow != settings:
            cores.append(measure_floor(files, settings))
            print(f"(f) convert_image, all cores {cores[-1]['images_per_second']:8.1f} images/s (its default core)",
                  flush=True)
        pipelines.append(measure_pipeline(input_dir, os.path.join(workdir, "out"), args.pipeline_args.split()))
        print(f"(b) pipeline  {pipelines[-1]['images_per_second']:8.1f} images/s, "
              f"peak memory {pipelines[-1]['peak_rss_bytes'] / 1e6:.0f} MB", flush=True)
        if not args.skip_graph_only:
            graphs.append(measure_pipeline(input_dir, os.path.join(workdir, "out"), args.pipeline_args.split(),
                                           module=GRAPH_ONLY))
            print(f"(d) graph only {graphs[-1]['seconds']:7.1f} s, {graphs[-1]['cpu_seconds']:.1f} CPU-s "
                  "(the pipeline without the image work)", flush=True)
    results["floor"] = _median_run(floors)
    results["fast_floor"] = _median_run(fasts)
    if cores:
        results["convert_image_floor"] = _median_run(cores)
    results["pipeline"] = _median_run(pipelines)
    results["startup"] = measure_startup(workdir, args.pipeline_args.split())
    print(f"start-up: {results['startup']['seconds']:.1f} s for {results['startup']['images']} images", flush=True)
    if graphs:
        results["graph_only"] = _median_run(graphs)
    if len(floors) > 1:
        results["runs"] = [{"floor": f, "fast_floor": e, "pipeline": p, **({"graph_only": g} if g else {})}
                           for f, e, p, g in zip(floors, fasts, pipelines, graphs or [None] * len(floors),
                                                 strict=True)]
        print(f"medians of {len(floors)}: floor {results['floor']['images_per_second']:.1f}, "
              f"pipeline {results['pipeline']['images_per_second']:.1f} images/s", flush=True)
    if not args.skip_notebook:
        subset_dir = os.path.join(workdir, "notebook-subset")
        shutil.rmtree(subset_dir, ignore_errors=True)
        for path in files[:: max(1, len(files) // args.notebook_images)][: args.notebook_images]:
            target = os.path.join(subset_dir, os.path.relpath(path, input_dir))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy(path, target)
        # Its cost per image does not depend on the folder size (every file pass decodes every
        # image), so a subset gives the same images/s in a fraction of the time.
        results["notebook"] = measure_notebook(subset_dir, os.path.join(workdir, "notebook-out"), 512, 95,
                                               args.notebook_shards)
        print(f"(c) notebook  {results['notebook']['images_per_second']:8.1f} images/s "
              f"({results['notebook']['images']} images)", flush=True)

    floor = results["floor"]["images_per_second"]
    pipeline = results["pipeline"]["images_per_second"]
    results["pipeline_vs_floor"] = pipeline / floor
    results["pipeline_vs_fast_floor"] = pipeline / results["fast_floor"]["images_per_second"]
    results["fast_floor_vs_floor"] = results["fast_floor"]["images_per_second"] / floor
    print(f"\npipeline / Pillow floor = {results['pipeline_vs_floor']:.2f}")
    print(f"pipeline / fast floor   = {results['pipeline_vs_fast_floor']:.2f}  (target >= 0.75 at 20,000 photos, "
          ">= 0.60 at 2,000)")
    print(f"fast floor / Pillow floor = {results['fast_floor_vs_floor']:.2f}")
    if "graph_only" in results:
        results["additive_vs_floor"] = additive_ratio(results["floor"], results["graph_only"])
        print(f"floor / (floor + graph only) = {results['additive_vs_floor']:.2f}  (the ratio if the two added up)")
    if "notebook" in results:
        results["pipeline_vs_notebook"] = pipeline / results["notebook"]["images_per_second"]
        print(f"pipeline / notebook = {results['pipeline_vs_notebook']:.1f}  (target >= 10)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
