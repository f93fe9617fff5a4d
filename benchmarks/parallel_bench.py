"""Parallelism benchmark: few shards against many, and reads with 100 ms of latency against none.

    python -m benchmarks.parallel_bench                        # both cases, 3 alternating pairs each
    python -m benchmarks.parallel_bench --case shards --images 2000 --repeat 3
    python -m benchmarks.parallel_bench --case latency --images 1000 --latency_ms 100

Each case runs two commands in turn, A B A B ..., on the same files, and
reports each pair's ratio, so a shared machine's drift moves both together:

* **shards**: `python -m pipeline.main` on the same photos with
  `--num_shards=train=1` (A) and `--num_shards=train=8` (B), no validation
  split: the wall time of one shard against eight. Before chunks, a shard was
  converted in one place, so one shard kept one core busy.
* **latency**: the photos on the GCS emulator, read through a proxy
  (tests/fault_proxy.py) that delays every read of an object's bytes by
  `--latency_ms` (A) or not at all (B), with one worker process
  (`--direct_num_workers=1`): its speed with the latency against without, as
  a whole process (the launcher's own sample reads go through the proxy too)
  and in the conversion alone (the rate of its last progress line).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.convert_bench import _children_cpu, measure_pipeline, photos_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pairs(run_a, run_b, repeat: int) -> dict:
    """`repeat` alternating pairs of run_a() and run_b(); each returns measure_pipeline's dict."""
    rows = []
    for _ in range(repeat):
        a, b = run_a(), run_b()
        rows.append({"a": a, "b": b, "wall_ratio": a["seconds"] / b["seconds"],
                     "cpu_ratio": a["cpu_seconds"] / b["cpu_seconds"]})
        print(f"  A {a['seconds']:6.1f} s ({a['images_per_second']:6.1f} images/s)   B {b['seconds']:6.1f} s "
              f"({b['images_per_second']:6.1f} images/s)   A/B wall {rows[-1]['wall_ratio']:.3f}, "
              f"cpu {rows[-1]['cpu_ratio']:.3f}", flush=True)
    ratios = [row["wall_ratio"] for row in rows]
    return {"pairs": rows, "wall_ratio_median": statistics.median(ratios), "wall_ratio_min": min(ratios),
            "wall_ratio_max": max(ratios)}


def shards_case(workdir: str, images: int, repeat: int, extra: list[str]) -> dict:
    photos = photos_dir(workdir, images)
    out = os.path.join(workdir, "out-shards")
    common = ["--validation_split=0", *extra]
    print(f"shards: {images} photos, 1 shard (A) against 8 shards (B)", flush=True)
    result = _pairs(lambda: measure_pipeline(photos, out, [*common, "--num_shards=train=1"]),
                    lambda: measure_pipeline(photos, out, [*common, "--num_shards=train=8"]), repeat)
    print(f"  1 shard / 8 shards wall time: median {result['wall_ratio_median']:.3f} "
          f"({result['wall_ratio_min']:.3f}-{result['wall_ratio_max']:.3f}); target at most 1.10", flush=True)
    return result


class _Emulator:
    """The GCS emulator (tests.gcs_emulator_server) on a free port, for the length of a `with` block."""

    def __enter__(self):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.host = f"http://127.0.0.1:{port}"
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.gcs_emulator_server", "start", "--host", "127.0.0.1", "--port", str(port),
             "--in-memory", "--quiet"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import urllib.request

        for _ in range(300):
            try:
                urllib.request.urlopen(f"{self.host}/storage/v1/b", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        return self

    def __exit__(self, *exc):
        self._process.terminate()
        self._process.wait(timeout=10)


def latency_case(workdir: str, images: int, repeat: int, latency_ms: float, extra: list[str],
                 pythonpath: str | None = None) -> dict:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from tests.fault_proxy import FaultProxy

    photos = photos_dir(workdir, images)
    out = os.path.join(workdir, "out-latency")
    print(f"latency: {images} photos on the GCS emulator, one worker process, {latency_ms:g} ms added per read "
          "(A) against none (B)", flush=True)
    with _Emulator() as emulator, FaultProxy(emulator.host) as proxy:
        saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT", "NO_GCE_CHECK")}
        os.environ.update(STORAGE_EMULATOR_HOST=emulator.host, GOOGLE_CLOUD_PROJECT="bench", NO_GCE_CHECK="True")
        client = storage.Client(project="bench", credentials=AnonymousCredentials())
        bucket = client.create_bucket("bench")
        for root, _, names in os.walk(photos):
            for name in names:
                path = os.path.join(root, name)
                bucket.blob(f"photos/{os.path.relpath(path, photos)}").upload_from_filename(path)
        os.environ["STORAGE_EMULATOR_HOST"] = proxy.url  # the pipeline's reads go through the proxy
        args = ["--validation_split=0", "--direct_num_workers=1", "--no_auth", *extra]

        def run(latency_s: float):
            proxy.read_latency_s = latency_s
            return measure_conversion("gs://bench/photos", out, args, pythonpath)

        try:
            result = _pairs(lambda: run(latency_ms / 1000), lambda: run(0.0), repeat)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    for figure, key in (("whole process", "seconds"), ("conversion", "conversion_seconds")):
        speed = [row["b"][key] / row["a"][key] for row in result["pairs"]]
        result[f"speed_with_latency_{key}"] = {"median": statistics.median(speed), "min": min(speed),
                                               "max": max(speed)}
        print(f"  {figure} speed with {latency_ms:g} ms per read / without: median {statistics.median(speed):.3f} "
              f"({min(speed):.3f}-{max(speed):.3f}); target at least 0.8", flush=True)
    return result


_RATE = re.compile(r"Converted (\d+)/(\d+) images \(100%\), ([0-9.]+) images/s")


def measure_conversion(input_dir: str, output_dir: str, extra: list[str], pythonpath: str | None = None) -> dict:
    """The command timed as a whole, and its conversion alone: the images over the rate its last progress line
    gives (images/s over the conversion's last 30 s), so the launcher's start-up is left out of it."""
    command = [sys.executable, "-m", "pipeline.main", f"--input_dir={input_dir}", f"--output_dir={output_dir}",
               "--overwrite", *extra]
    start, cpu_before = time.perf_counter(), _children_cpu()
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None  # another checkout's code, to compare
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if result.returncode:
        raise SystemExit(f"pipeline failed ({result.returncode}):\n{result.stderr[-3000:]}")
    rates = _RATE.findall(result.stderr)
    if not rates:
        raise SystemExit(f"no final progress line in:\n{result.stderr[-3000:]}")
    done, _, rate = rates[-1]
    return {"images": int(done), "seconds": elapsed, "images_per_second": int(done) / elapsed,
            "conversion_images_per_second": float(rate), "conversion_seconds": int(done) / float(rate),
            "cpu_seconds": _children_cpu() - cpu_before}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=("shards", "latency", "both"), default="both")
    parser.add_argument("--images", type=int, default=2000, help="Photos per case. Default: 2000.")
    parser.add_argument("--repeat", type=int, default=3, help="Alternating pairs per case. Default: 3.")
    parser.add_argument("--latency_ms", type=float, default=100.0, help="Added per read. Default: 100.")
    parser.add_argument("--workdir", help="Where the photos and outputs go (kept). Default: a new temporary folder.")
    parser.add_argument("--pipeline_args", default="", help="Extra flags for pipeline.main, space-separated.")
    parser.add_argument("--json", help="Write the figures to this file.")
    parser.add_argument("--latency_pythonpath",
                        help="PYTHONPATH of the pipeline runs of the latency case: another checkout, to compare.")
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="parallel_bench-")
    extra = args.pipeline_args.split()
    results = {}
    if args.case in ("shards", "both"):
        results["shards"] = shards_case(workdir, args.images, args.repeat, extra)
    if args.case in ("latency", "both"):
        results["latency"] = latency_case(workdir, args.images, args.repeat, args.latency_ms, extra,
                                          args.latency_pythonpath)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
