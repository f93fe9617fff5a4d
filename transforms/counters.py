"""Beam counters under one namespace, so a job's progress reads the same locally and on Dataflow."""

from apache_beam.metrics import Metrics

NAMESPACE = "image_tfrecords"
_counters = {}


def inc(name: str, value: int = 1) -> None:
    counter = _counters.get(name)
    if counter is None:
        counter = _counters[name] = Metrics.counter(NAMESPACE, name)
    counter.inc(value)
