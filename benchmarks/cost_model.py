"""The Dataflow time-and-cost estimate: what was measured here, combined with list prices and Cloud Storage's rules.

    python -m benchmarks.cost_model                           # the tables of README.md and docs/dataflow.md
    python -m benchmarks.cost_model --images 5e6 --workers 20 --cpu_ms 9.5 --input_kb 300
    python -m benchmarks.cost_model --warm_bucket             # a bucket already read at a high rate

An estimate, never a measurement on Google Cloud (nothing here reaches it). The method:

* **Measured here** (BENCHMARKS.md, "CPU per image for the cost model"): the whole run's CPU
  per image on about 100 kB and about 300 kB photos, and the bytes each image makes; the
  requests each image and each shard make, counted on the GCS emulator
  (`tests/test_gcs_bytes.py`).
* **Cloud Storage's rules**: a bucket starts at about 5,000 object reads a second and should
  at most double its rate every 20 minutes (https://cloud.google.com/storage/docs/request-rate);
  the job keeps to that ramp: each worker process starts at its share of `--initial_read_rate`
  (5,000 over the job's processes, given `--max_num_workers`) and doubles every 20 minutes
  (`transforms/base/transient.py`). Deleted objects are kept, and
  billed, for 7 days by default (soft delete, https://cloud.google.com/storage/docs/soft-delete).
* **The conversion**, second by second: images a second = the least of what the CPUs convert,
  what the bucket serves at that moment, what the processes' own ramps allow and what the
  reads in flight deliver (64 a process at `read_latency_s` each).
* **Prices**: Google's list prices for us-central1 at the time of writing (`PRICES`).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math

from transforms.base.transient import JOB_READS_PER_S, MOST_READS_PER_S, RAMP_DOUBLING_S, process_start_rate
from transforms.images.convert import ReadPacing
from transforms.output.concat import MAX_COMPOSE
from transforms.output.write import CHUNK_IMAGES

PRICES = {  # us-central1 list prices, USD
    "vcpu_hour": 0.056,  # Dataflow batch worker vCPU
    "memory_gb_hour": 0.003557,  # Dataflow batch worker memory
    "disk_gb_hour": 0.000054,  # standard persistent disk
    "shuffle_gb": 0.011,  # Dataflow Shuffle, batch, data processed
    "class_a_per_1000": 0.005,  # Cloud Storage writes, composes, copies, listings
    "class_b_per_1000": 0.0004,  # Cloud Storage reads
    "storage_gb_month": 0.020,  # Standard storage: what soft-deleted objects are billed at
}
BUCKET_READS_PER_S = 5000.0  # a bucket's initial read capacity (Cloud Storage's request-rate guide)
READS_IN_FLIGHT = inspect.signature(ReadPacing).parameters["most"].default  # a process's reads ahead, at most
SOFT_DELETE_DAYS = 7  # Cloud Storage's default retention of deleted objects
SHARD_MB = 150  # --shard_size_mb's default
REFERENCE_BYTES = 300  # one image's reference in the shuffles (path, label, split, sizes)
SHUFFLES_PER_IMAGE = 2  # the bucket counts and the group by shard
WORKER_START_S = 4 * 60.0  # the workers booted and this package installed (setup.py, no TensorFlow)
LAUNCH_AND_END_S = 90.0  # launcher's plan and submission, the last chunks, assembling, the description


@dataclasses.dataclass(frozen=True)
class Job:
    images: float
    input_kb: float  # a source file, on average
    output_kb: float  # a stored record, on average
    cpu_ms: float  # the whole run's CPU per image, measured
    workers: int
    vcpus: int = 4  # n2-standard-4
    memory_gb: float = 16.0
    disk_gb: float = 25.0  # a batch job's boot disk with Dataflow Shuffle
    read_latency_s: float = 0.05  # a GET's time to its last byte
    warm_bucket: bool = False  # the bucket already serves this rate: no ramp


def model_conversion(job: Job) -> tuple[float, float, str]:
    """The conversion's seconds, the workers' mean CPU use over them (0-1), and what bounded it most of the time."""
    processes = job.workers * job.vcpus
    cpu_rate = processes * 1000.0 / job.cpu_ms
    read_rate = processes * READS_IN_FLIGHT / job.read_latency_s
    start = process_start_rate(JOB_READS_PER_S, processes)  # --initial_read_rate's share, with --max_num_workers
    done, t, busy, bounds = 0.0, 0.0, 0.0, {"CPU": 0.0, "read ramp": 0.0, "reads in flight": 0.0}
    step = 1.0
    while done < job.images:
        ramp = 2 ** (t / RAMP_DOUBLING_S)
        bucket = math.inf if job.warm_bucket else BUCKET_READS_PER_S * ramp
        own = math.inf if job.warm_bucket else processes * min(MOST_READS_PER_S, start * ramp)
        limits = {"CPU": cpu_rate, "read ramp": min(bucket, own), "reads in flight": read_rate}
        bound = min(limits, key=limits.get)
        rate = limits[bound]
        take = min(step, (job.images - done) / rate)
        done += rate * take
        busy += take * rate / cpu_rate
        bounds[bound] += take
        t += take
    return t, busy / t, max(bounds, key=bounds.get)


def estimate(job: Job) -> dict:
    images = job.images
    output_gb = images * job.output_kb / 1e6
    images_per_shard = max(1.0, SHARD_MB * 1000 / job.output_kb)
    shards = math.ceil(images / images_per_shard)
    pieces = math.ceil(images_per_shard / CHUNK_IMAGES)
    compose_calls = 1 if pieces <= MAX_COMPOSE else math.ceil(pieces / MAX_COMPOSE) + 1
    intermediate_share = 0.0 if pieces <= MAX_COMPOSE else 1.0  # the first level's composed objects, deleted
    convert_s, cpu_use, bound = model_conversion(job)
    job_s = WORKER_START_S + LAUNCH_AND_END_S + convert_s
    worker_hour = (job.vcpus * PRICES["vcpu_hour"] + job.memory_gb * PRICES["memory_gb_hour"]
                   + job.disk_gb * PRICES["disk_gb_hour"])
    worker_hours = job.workers * job_s / 3600
    class_a = shards * (2 * pieces + compose_calls + 1) + images / 1000  # uploads, composes, a copy; listing pages
    deleted_gb = output_gb * (1 + intermediate_share + 1)  # the pieces, the first level, the run folder's shard
    costs = {
        "workers": worker_hours * worker_hour,
        "reads (class B)": images * PRICES["class_b_per_1000"] / 1000,
        "writes, composes, copies, listings (class A)": class_a * PRICES["class_a_per_1000"] / 1000,
        "Dataflow Shuffle": images * REFERENCE_BYTES * SHUFFLES_PER_IMAGE / 1e9 * PRICES["shuffle_gb"],
        f"soft-deleted temporary files ({SOFT_DELETE_DAYS} days)":
            deleted_gb * PRICES["storage_gb_month"] * SOFT_DELETE_DAYS / 30.4,
    }
    return {"job": job, "shards": shards, "output_gb": output_gb, "cpu_hours": images * job.cpu_ms / 3.6e6,
            "convert_s": convert_s, "cpu_use": cpu_use, "bound": bound, "job_s": job_s,
            "worker_hours": worker_hours, "worker_hour": worker_hour, "class_a": class_a, "deleted_gb": deleted_gb,
            "costs": costs, "total": sum(costs.values())}


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{seconds / 60:.1f} min"


def _money(usd: float) -> str:
    return f"${usd:,.2f}" if usd < 100 else f"${usd:,.0f}"


def detail_table(names: list[str], results: list[dict]) -> str:
    """The docs' table: every figure of the estimate, a column per job."""
    rows = [("images", [f"{r['job'].images / 1e6:g} M" for r in results]),
            ("in, out", [f"{r['job'].images * r['job'].input_kb / 1e6:,.0f} GB, {r['output_gb']:,.0f} GB"
                         for r in results]),
            ("workers", [f"{r['job'].workers} × n2-standard-{r['job'].vcpus}" for r in results]),
            ("conversion CPU", [f"{r['cpu_hours']:,.1f} vCPU-hours ({r['job'].cpu_ms:g} ms an image)"
                                for r in results]),
            ("conversion time", [f"{_minutes(r['convert_s'])}, bound by the {r['bound']}" for r in results]),
            ("workers' CPU use while converting", [f"{r['cpu_use']:.0%}" for r in results]),
            ("job time, with start-up and the end", [_minutes(r["job_s"]) for r in results]),
            ("worker-hours", [f"{r['worker_hours']:,.1f}" for r in results])]
    rows += [(name, [_money(r["costs"][name]) for r in results]) for name in results[0]["costs"]]
    rows.append(("**total**", [f"**{_money(r['total'])}**" for r in results]))
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    return "\n".join(lines)


def summary_table(names: list[str], results: list[dict]) -> str:
    """The README's table: workers, job time and cost, a column per job."""
    lines = ["| on n2-standard-4 workers | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines.append("| workers | " + " | ".join(str(r["job"].workers) for r in results) + " |")
    lines.append("| job time (a cold bucket) | " + " | ".join(f"about {_minutes(r['job_s'])}" for r in results) + " |")
    lines.append("| cost (workers, GCS requests, shuffle, soft delete) | "
                 + " | ".join(f"about {_money(r['total'])}" for r in results) + " |")
    return "\n".join(lines)


# The measured figures (BENCHMARKS.md, "CPU per image for the cost model"), and the jobs the docs show.
CPU_MS_100KB = 8.5  # real photos of 86 kB (about 500x375): 7.8 and 9.1 ms in two runs
CPU_MS_230KB = 20.4  # the same enlarged 2x, 230 kB: 19.9 and 20.9 ms
OUTPUT_KB = 92.0  # a 512x512 JPEG q95 record of a real photo: 91-94 kB


def documented_jobs() -> tuple[list[str], list[Job]]:
    names = ["ImageNet: 1.28 M images of ~110 kB", "100 M images of ~100 kB", "100 M images of ~230 kB"]
    jobs = [Job(1.28e6, 110, OUTPUT_KB, CPU_MS_100KB, workers=12),
            Job(100e6, 100, OUTPUT_KB, CPU_MS_100KB, workers=100),
            Job(100e6, 230, OUTPUT_KB, CPU_MS_230KB, workers=200)]
    return names, jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=float, help="Images in the job; without it, the documented jobs.")
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--vcpus", type=int, default=4, help="vCPUs a worker. Default: 4 (n2-standard-4).")
    parser.add_argument("--cpu_ms", type=float, default=CPU_MS_100KB, help="The whole run's CPU per image.")
    parser.add_argument("--input_kb", type=float, default=100)
    parser.add_argument("--output_kb", type=float, default=OUTPUT_KB)
    parser.add_argument("--read_latency_s", type=float, default=0.05)
    parser.add_argument("--warm_bucket", action="store_true", help="No read ramp: the bucket already serves the rate.")
    args = parser.parse_args(argv)
    if args.images is None:
        names, jobs = documented_jobs()
        print(summary_table(names, [estimate(j) for j in jobs]) + "\n")
        print(detail_table(names, [estimate(j) for j in jobs]))
        return 0
    job = Job(args.images, args.input_kb, args.output_kb, args.cpu_ms, args.workers, vcpus=args.vcpus,
              memory_gb=4.0 * args.vcpus, read_latency_s=args.read_latency_s, warm_bucket=args.warm_bucket)
    print(detail_table([f"{args.images:g} images"], [estimate(job)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
