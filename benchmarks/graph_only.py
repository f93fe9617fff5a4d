"""The pipeline's own cost: `pipeline.main` with the image work taken out.

    python -m benchmarks.graph_only --input_dir=photos/ --output_dir=out/ [any pipeline.main option]

This is the real command and the real Beam graph, with one change: each
worker process converts the first image it is given, and hands out that same
encoded image for every later one without reading their files, so the records
of one worker all hold the same picture. Everything else runs as usual:
imports, planning, listing, labels, the shard assignment, grouping by
shard, building each tf.train.Example, the TFRecord writes and the dataset
description. Its time is what the pipeline adds to the image work: were the
two simply to add up, the pipeline would run at floor / (floor + this) of the
floor's speed. The output is for timing only.
"""

from __future__ import annotations

import threading

import pipeline.main  # first: it sets up the environment before Beam is imported
import transforms.images.convert

_real_read_and_convert = transforms.images.convert.read_and_convert
_ready: dict = {}  # ImageSettings -> the EncodedImage handed out for every image
_lock = threading.Lock()  # the helper threads of a worker: one conversion, not one each


def convert_once(path, settings, deadline, **kwargs):
    """The first image's conversion, reused for every image after it (per process)."""
    with _lock:
        if settings not in _ready:
            _ready[settings] = _real_read_and_convert(path, settings, deadline, **kwargs)
    return _ready[settings]


# At import, so worker processes get it too: forked ones inherit the patched
# module, and spawned ones import this module again as their __main__.
transforms.images.convert.read_and_convert = convert_once

if __name__ == "__main__":
    raise SystemExit(pipeline.main.main())
