"""`python -m tests.held_run_main ARGS`: pipeline.main, held just before it publishes until $HOLD_UNTIL exists.

For tests of two runs at once: the first run holds the output folder's lock for as long as the test needs.
With $HOLD_CONVERSIONS (a path) set, every image's conversion in the worker processes forked from this one is held
instead, each after creating that file (the launcher's own sample of the images is not held): for a test that must
interrupt a run while its workers are converting.
"""

import os
import sys
import time

import pipeline.main  # first: it sets up the environment before Beam is imported
import transforms.images.imaging
import transforms.output.describe

LAUNCHER = os.getpid()  # the launcher samples images itself (pipeline/estimate.py): never held


def _held(function, started: str = ""):
    def held(*args, **kwargs):
        if started and os.getpid() == LAUNCHER:
            return function(*args, **kwargs)
        if started:
            open(started, "a").close()
        while not os.path.exists(os.environ["HOLD_UNTIL"]):
            time.sleep(0.05)
        return function(*args, **kwargs)

    return held


if os.environ.get("HOLD_CONVERSIONS"):
    imaging = transforms.images.imaging
    imaging.convert_image = _held(imaging.convert_image, os.environ["HOLD_CONVERSIONS"])
else:
    transforms.output.describe.publish_dataset = _held(transforms.output.describe.publish_dataset)

if __name__ == "__main__":
    sys.exit(pipeline.main.main())
