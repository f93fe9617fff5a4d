"""`python -m tests.held_run_main ARGS`: pipeline.main, held just before it publishes until $HOLD_UNTIL exists.

For tests of two runs at once: the first run holds the output folder's lock for as long as the test needs.
"""

import os
import sys
import time

import pipeline.main  # first: it sets up the environment before Beam is imported
import transforms.describe

_publish = transforms.describe.publish_dataset


def _held_publish(*args, **kwargs):
    while not os.path.exists(os.environ["HOLD_UNTIL"]):
        time.sleep(0.05)
    return _publish(*args, **kwargs)


transforms.describe.publish_dataset = _held_publish

if __name__ == "__main__":
    sys.exit(pipeline.main.main())
