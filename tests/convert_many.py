"""`python -m tests.convert_many PATH... [--threads=N] [--worker_memory_mb=N] [--max_image_mb=N]`

Reads and converts the files at once on one `ConversionPool` of N threads, as a worker process's
DoFn does (`transforms.images.convert.read_and_convert`), and prints one JSON line: each file's outcome
("ok" or the rejection reason), this process's resident memory before the first image and its
peak (VmHWM), and the most memory the process's budget ever had reserved at once. Run it under
`tests.hostile_files.run_bounded`.
"""

from __future__ import annotations

import argparse
import functools
import json

from tests.convert_one import peak_rss_mb
from transforms.base import memory
from transforms.images import convert
from transforms.images.diagnosis import ImageRejected
from transforms.images.pool import ConversionPool
from transforms.images.settings import ImageSettings


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1000
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker_memory_mb", type=int, default=ImageSettings.worker_memory_mb)
    parser.add_argument("--max_image_mb", type=int, default=ImageSettings.max_image_mb)
    args = parser.parse_args()
    settings = ImageSettings(timeout_s=0, max_image_mb=args.max_image_mb, worker_memory_mb=args.worker_memory_mb)
    base = rss_mb()
    pool = ConversionPool(None, threads=args.threads)
    jobs = [pool.submit(functools.partial(convert.read_and_convert, path, settings)) for path in args.paths]
    outcomes = []
    for job in jobs:
        try:
            pool.result(job)
            outcomes.append("ok")
        except ImageRejected as e:
            outcomes.append(e.reason)
    pool.close()
    budget = memory.budget(settings.worker_memory_bytes)
    print(json.dumps({
        "outcomes": outcomes,
        "base_rss_mb": base,
        "peak_rss_mb": peak_rss_mb(),
        "budget_peak_mb": budget.peak / 1e6 if budget is not None else None,
    }))


if __name__ == "__main__":
    main()
