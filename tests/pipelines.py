"""Beam's TestPipeline with its runner named: the FnApiRunner, in this process.

Without a runner, TestPipeline runs on Beam's DirectRunner, which first tries
the Prism runner and so downloads a binary when a network is there (and stalls
where one half-works). Every in-pipeline test makes its TestPipeline here;
tests/test_architecture.py fails on a test module that imports Beam's own.
"""

from __future__ import annotations

from apache_beam.testing.test_pipeline import TestPipeline as _BeamTestPipeline

LOCAL_RUNNER = "FnApiRunner"


class TestPipeline(_BeamTestPipeline):
    """`apache_beam.testing.test_pipeline.TestPipeline`, on the FnApiRunner unless a runner is given."""

    __test__ = False  # not a test class for pytest

    def __init__(self, runner=None, *args, **kwargs):
        super().__init__(runner if runner is not None else LOCAL_RUNNER, *args, **kwargs)
