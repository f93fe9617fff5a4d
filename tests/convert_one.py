"""`python -m tests.convert_one PATH [--listed_size=N] [--no_type_check] [--max_file_mb=N] [--max_image_mb=N]`

Reads and converts one file as a worker does (`transforms.images.convert.read_and_convert`) and
prints one JSON line: the outcome ("ok" or the rejection reason) and the peak resident
memory of this process. For hostile-input tests, run under `tests.hostile_files.run_bounded`.
--no_type_check skips the regular-file check, as if the file looked like one (a FUSE or
network file system can say so and still never answer).
"""

from __future__ import annotations

import argparse
import json
import os
import resource

from transforms.images import convert
from transforms.images.diagnosis import ImageRejected
from transforms.images.settings import ImageSettings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--listed_size", type=int, default=None)
    parser.add_argument("--no_type_check", action="store_true")
    parser.add_argument("--max_file_mb", type=int, default=ImageSettings.max_file_mb)
    parser.add_argument("--max_image_mb", type=int, default=ImageSettings.max_image_mb)
    args = parser.parse_args()
    if args.no_type_check:
        convert.check_regular_file = lambda path: args.listed_size
    settings = ImageSettings(timeout_s=0, max_file_mb=args.max_file_mb, max_image_mb=args.max_image_mb)
    size = args.listed_size if args.listed_size is not None else os.path.getsize(args.path)
    try:
        image = convert.read_and_convert(args.path, settings, None, size=size)
        outcome = {"outcome": "ok", "width": image.width, "height": image.height}
    except ImageRejected as e:
        outcome = {"outcome": e.reason, "detail": e.detail}
    outcome["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(outcome))


def peak_rss_mb() -> float:
    """This process's own peak resident memory.

    VmHWM belongs to the memory image that exec made; getrusage's ru_maxrss would also count the parent's,
    which Linux carries over through fork and exec (a large pytest process then looks like a large conversion).
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1000
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1000


if __name__ == "__main__":
    main()
