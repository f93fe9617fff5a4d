"""pipeline/lean_beam.py: the launcher's Beam import leaves out the integrations a run never uses, and only those.

A fresh interpreter imports Beam as `python -m pipeline.main` does, then the launcher; what it loaded is read
from sys.modules. The submission and local runs through `python -m pipeline.main` (tests/test_dataflow_submit.py,
tests/test_pipeline.py) run on this import.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

PROBE = """
import json, sys
from pipeline import lean_beam
lean_beam.import_beam()
import pipeline.launcher
loaded = {name: name in sys.modules for name in sys.argv[1:]}
from apache_beam.runners.dataflow import dataflow_runner
lazy_before_use = "google.cloud.dataflow_v1beta3" not in sys.modules
state = dataflow_runner.dataflow_api.JobState.JOB_STATE_DONE.name  # the Dataflow runner's client, on first use
import pandas
print(json.dumps({"loaded": loaded, "lazy_before_use": lazy_before_use, "state": state,
                  "pandas": pandas.DataFrame({"a": [1, 2]})["a"].sum().item()}))
"""

LEFT_OUT = ["pandas", "bson", "pymongo", "google.cloud.pubsub", "apache_beam.io.gcp.bigquery",
            "google.cloud.dataflow_v1beta3"]
KEPT = ["apache_beam.io.gcp.gcsio", "apache_beam.io.gcp.gcsfilesystem", "apache_beam.runners.dataflow.dataflow_runner",
        "google.cloud.storage"]


@pytest.mark.timeout(300)
def test_the_launchers_beam_leaves_out_the_unused_integrations_and_they_still_import_later():
    result = subprocess.run([sys.executable, "-c", PROBE, *LEFT_OUT, *KEPT], cwd=REPO, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no warning of the missing bson (mongodbio's) or anything else
    report = json.loads(result.stdout)
    assert report["loaded"] == {**{name: False for name in LEFT_OUT}, **{name: True for name in KEPT}}
    assert report["lazy_before_use"] is True
    assert report["state"] == "JOB_STATE_DONE"
    assert report["pandas"] == 3  # imported as usual once Beam is in


def test_an_imported_beam_is_left_as_it_is():
    import apache_beam  # noqa: F401  (this process's Beam, imported whole by the tests)

    from pipeline import lean_beam

    before = set(sys.modules)
    lean_beam.import_beam()
    assert set(sys.modules) == before
    assert not [finder for finder in sys.meta_path if type(finder).__module__ == "pipeline.lean_beam"]
