"""Beam counters under one namespace, so a job's progress reads the same locally and on Dataflow."""

from apache_beam.metrics import Metrics

NAMESPACE = "image_tfrecords"
# The counters the progress line adds up (pipeline/local/progress.py): an image leaves conversion either converted
# or rejected (under a name `rejected(reason)` gives), out of the images labelled for conversion.
CONVERTED = "images_converted"
RESUMED = "images_resumed"  # records taken, checked, from an interrupted run's chunks (output.resume)
TO_CONVERT = "images_to_convert"  # counted by AssignLabels (or the manifest's labels): the job's own total
_REJECTED_PREFIX = "rejected_"
_counters = {}


def rejected(reason: str) -> str:
    """The counter of the images rejected for `reason` after they were labelled for conversion."""
    return _REJECTED_PREFIX + reason


def leaves_conversion(name: str) -> bool:
    """Whether counter `name` counts images that left conversion (converted, resumed, or rejected after labelling)."""
    return name in (CONVERTED, RESUMED) or name.startswith(_REJECTED_PREFIX)


def inc(name: str, value: int = 1) -> None:
    counter = _counters.get(name)
    if counter is None:
        counter = _counters[name] = Metrics.counter(NAMESPACE, name)
    counter.inc(value)
