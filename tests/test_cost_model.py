"""The Dataflow time-and-cost estimate (benchmarks/cost_model.py): its arithmetic; the docs' tables are its output.

Nothing here is timed: the durations are the model's answers, compared with the same model solved by hand.
"""

from __future__ import annotations

import argparse
import math
import os

import pytest

from benchmarks import cost_model
from benchmarks.cost_model import Job, estimate, model_conversion
from pipeline.flags import add_convert_arguments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_warm_bucket_converts_at_the_cpus_speed():
    modelled, cpu_use, bound = model_conversion(Job(1e6, 100, 60, cpu_ms=8.0, workers=10, warm_bucket=True))
    assert bound == "CPU"
    assert modelled == pytest.approx(1e6 * 8.0 / 1000 / 40)  # 40 processes, 8 ms an image
    assert cpu_use == pytest.approx(1.0)


def test_a_cold_bucket_ramps_up_whatever_the_workers():
    """With far more CPUs than the bucket feeds, the time is the ramp's: 5,000 reads/s doubling every 20 minutes."""
    images = 100e6
    modelled, cpu_use, bound = model_conversion(Job(images, 100, 60, cpu_ms=7.0, workers=1000))
    doubling = cost_model.RAMP_DOUBLING_S
    # images = 5,000 * doubling / ln 2 * (2 ** (t / doubling) - 1), solved for t
    expected = doubling * math.log2(1 + images * math.log(2) / (cost_model.BUCKET_READS_PER_S * doubling))
    assert bound == "read ramp"
    assert modelled == pytest.approx(expected, rel=0.005)
    assert cpu_use < 0.25


def test_a_small_job_reads_at_the_buckets_rate_from_the_start():
    """One worker's 4 processes share the job's first 5,000 reads a second, 1,250 each: less than their CPUs' 8,000."""
    images, doubling = 200_000, cost_model.RAMP_DOUBLING_S
    modelled, _, bound = model_conversion(Job(images, 100, 60, cpu_ms=0.5, workers=1))
    assert bound == "read ramp"
    assert modelled == pytest.approx(doubling * math.log2(1 + images * math.log(2) / (5000 * doubling)), rel=0.005)
    assert modelled > images / 8000  # the CPUs alone: 25 s


def test_soft_delete_bills_the_temporary_copies_for_seven_days():
    result = estimate(Job(1e6, 100, 60, cpu_ms=7.0, workers=10))
    # 60 GB out, about 2,500 images a shard: 40 pieces, composed in two levels, plus the run folder's shard
    assert result["deleted_gb"] == pytest.approx(3 * 60)
    assert result["costs"]["soft-deleted temporary files (7 days)"] == pytest.approx(180 * 0.020 * 7 / 30.4)


def test_the_models_constants_are_the_tools_defaults():
    parser = argparse.ArgumentParser()
    add_convert_arguments(parser)
    assert parser.get_default("shard_size_mb") == cost_model.SHARD_MB
    assert cost_model.READS_IN_FLIGHT == 64


@pytest.mark.parametrize("doc, table", [("README.md", "summary_table"), ("docs/dataflow.md", "detail_table")])
def test_the_docs_show_the_models_figures(doc, table):
    names, jobs = cost_model.documented_jobs()
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        text = f.read()
    expected = getattr(cost_model, table)(names, [estimate(job) for job in jobs])
    assert expected in text, f"{doc}'s cost table differs from `python -m benchmarks.cost_model`; paste its output"
