"""Local runs by worker count: the launcher's own CPU per worker, per stage and per image, and a 96-core model.

    python -m benchmarks.worker_scale                              # 1-32 workers, 500 and 2,000 cheap images
    python -m benchmarks.worker_scale --workers 2 32 --images 2000 --repeat 3 --json result.json

Cheap images (generated, 24-72 px, converted to 16 px) make the conversion itself small, so what grows with
the worker count shows: each run is `python -m pipeline.main --direct_num_workers=W` as a user runs it, and
reports its wall time, the launcher process's own CPU (its workers' apart) and its workers' CPU. A least-squares
fit over every run gives the launcher's CPU as fixed + per worker x W + per image x N; the fixed part divided by
the graph's fused stages is its cost per stage.

The 96-core model then combines, for N photos:
- the share of 96 workers busy during conversion: the chunks `cut_chunks` makes for N images on 96 workers,
  in a random order (the shuffle before conversion), cut into 96 runs of equal count, as Beam's local runner
  hands each worker its share of a stage; busy share = mean load / largest load;
- the conversion's CPU per image on one core (`--cpu_ms_per_image`, measured by benchmarks.convert_bench on
  real photos at 512 px) and the launcher's serial CPU (fixed + per worker x 96 + per image x N);
- images/s = N / (launcher's serial CPU + N x cpu per image / (96 x busy share)).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The launcher's own CPU (RUSAGE_SELF) and its children's, printed as the process ends.
_WRAPPER = (
    "import resource, sys\n"
    "from pipeline.main import main\n"
    "code = main(sys.argv[1:])\n"
    "me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print('CPU', me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime, file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def run_once(photos: str, workers: int, workdir: str) -> dict:
    out = tempfile.mkdtemp(dir=workdir)
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", _WRAPPER, f"--input_dir={photos}", f"--output_dir={out}/out",
                             "--image_size=16", "--quiet", f"--direct_num_workers={workers}"],
                            cwd=REPO, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"the run with {workers} workers failed:\n{result.stderr[-3000:]}")
    launcher, children = (float(x) for x in result.stderr.strip().splitlines()[-1].split()[1:])
    info = json.load(open(os.path.join(out, "out", "image_tfrecords.json")))
    return {"workers": workers, "images": info["files"]["written"], "seconds": seconds,
            "launcher_cpu": launcher, "workers_cpu": children}


def fused_stages(photos: str) -> int:
    """The fused stages of the default local graph on `photos` (Beam's own fusion of the graph the launcher builds)."""
    from apache_beam.runners.portability.fn_api_runner import translations

    import pipeline.launcher as launcher

    jobs = []
    build = launcher.build_pipeline

    def kept(job, *args, **kwargs):
        jobs.append(job)
        build(job, *args, **kwargs)

    launcher.build_pipeline = kept
    out = tempfile.mkdtemp()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the run's summary: not this benchmark's output
            launcher.run([f"--input_dir={photos}", f"--output_dir={out}/out", "--image_size=16", "--quiet",
                          "--direct_running_mode=in_memory"])
    finally:
        launcher.build_pipeline = build
    proto = jobs[0].to_runner_api()
    stages = translations.create_and_optimize_stages(proto, translations.standard_optimize_phases(),
                                                     known_runner_urns=frozenset())[1]
    return len(stages)


def fit(rows: list[dict]) -> dict:
    """Least squares: launcher CPU = fixed + per_worker x W + per_image x N."""
    a = np.array([[1.0, r["workers"], r["images"]] for r in rows])
    b = np.array([r["launcher_cpu"] for r in rows])
    (fixed, per_worker, per_image), *_ = np.linalg.lstsq(a, b, rcond=None)
    return {"fixed_s": float(fixed), "per_worker_s": float(per_worker), "per_image_ms": float(per_image) * 1000}


def chunk_counts(images: int, workers: int, validation: float = 0.2, shard_images: int = 1000) -> list[int]:
    """The images of every chunk `cut_chunks` makes for `images` photos (80/20 split, shards of `shard_images`)."""
    from transforms.output.write import chunk_limit

    sizes = []
    for split_images in (round(images * (1 - validation)), round(images * validation)):
        shards = max(1, -(-split_images // shard_images))
        for shard in range(shards):
            n = split_images * (shard + 1) // shards - split_images * shard // shards
            limit = chunk_limit(images, workers)  # from every split's images together (AssignShards' layouts)
            chunks = max(1, -(-n // limit))
            sizes += [n * (c + 1) // chunks - n * c // chunks for c in range(chunks)]
    return sizes


def busy_share(images: int, workers: int, seed: int = 0) -> float:
    """Mean over max of the images each worker converts, the chunks shuffled then cut in `workers` equal runs."""
    sizes = chunk_counts(images, workers)
    random.Random(seed).shuffle(sizes)
    loads = [sum(sizes[len(sizes) * w // workers:len(sizes) * (w + 1) // workers]) for w in range(workers)]
    return statistics.mean(loads) / max(loads)


def model(costs: dict, stages: int, cpu_ms_per_image: float, cores: int = 96,
          photos=(4000, 20000, 1_000_000)) -> list[dict]:
    rows = []
    for n in photos:
        share = statistics.mean(busy_share(n, cores, seed) for seed in range(5))
        serial = costs["fixed_s"] + costs["per_worker_s"] * cores + costs["per_image_ms"] / 1000 * n
        convert = n * cpu_ms_per_image / 1000 / (cores * share)
        rows.append({"photos": n, "chunks": len(chunk_counts(n, cores)), "busy_share": share,
                     "launcher_serial_s": serial, "conversion_s": convert, "images_per_s": n / (serial + convert)})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--images", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--cpu_ms_per_image", type=float, default=2.7,
                        help="the conversion's CPU per real photo at 512 px on one core (default 2.7: "
                             "BENCHMARKS.md, the pipeline's conversion on 2 cores)")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args(argv)
    from pipeline.sample_data import generate_dataset

    workdir = tempfile.mkdtemp(prefix="worker-scale-")
    rows = []
    for images in args.images:
        photos = os.path.join(workdir, f"photos-{images}")
        generate_dataset(photos, images_per_class=images // 4, seed=46, min_side=24, max_side=72)
        for _ in range(args.repeat):
            for workers in args.workers:
                row = run_once(photos, workers, workdir)
                rows.append(row)
                print(f"{images:6d} images {workers:3d} workers: {row['seconds']:6.2f} s wall, launcher "
                      f"{row['launcher_cpu']:5.2f} s CPU, workers {row['workers_cpu']:6.2f} s CPU", flush=True)
    stages = fused_stages(os.path.join(workdir, f"photos-{args.images[0]}"))
    costs = fit(rows)
    costs["per_stage_s"] = costs["fixed_s"] / stages
    print(f"launcher CPU = {costs['fixed_s']:.3f} s + {costs['per_worker_s'] * 1000:.1f} ms x workers + "
          f"{costs['per_image_ms']:.4f} ms x images; {stages} fused stages: {costs['per_stage_s'] * 1000:.0f} ms "
          "a stage")
    by_count = {}
    for row in rows:
        by_count.setdefault((row["images"], row["workers"]), []).append(row["seconds"])
    for images in args.images:
        base = statistics.median(by_count.get((images, 2), [float("nan")]))
        for workers in args.workers:
            wall = statistics.median(by_count[(images, workers)])
            print(f"  {images} images, {workers:2d} workers: median {wall:.2f} s, {wall / base:.2f}x of 2 workers")
    modelled = model(costs, stages, args.cpu_ms_per_image)
    for row in modelled:
        print(f"96 cores, {row['photos']:>9,} photos: {row['chunks']:6d} chunks, {row['busy_share']:.0%} of workers "
              f"busy, launcher {row['launcher_serial_s']:.1f} s serial, about {row['images_per_s']:,.0f} images/s")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"runs": rows, "stages": stages, "launcher_cpu": costs, "model_96_cores": modelled}, out,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
