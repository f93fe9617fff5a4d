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
import apache_beam as beam
graph = beam.Pipeline()  # a graph that writes: iobase.Write asks (as it is applied) whether its sink is Pub/Sub's
_ = graph | beam.Create(["a"]) | beam.io.WriteToText(sys.argv[1] + "/out")
loaded = {name: name in sys.modules for name in sys.argv[2:]}
from apache_beam.runners.dataflow import dataflow_runner
lazy_before_use = "google.cloud.dataflow_v1beta3" not in sys.modules
state = dataflow_runner.dataflow_api.JobState.JOB_STATE_DONE.name  # the Dataflow runner's client, on first use
import pandas
from google.cloud import pubsub  # the lazy module, loaded here on first use
print(json.dumps({"loaded": loaded, "lazy_before_use": lazy_before_use, "state": state,
                  "pandas": pandas.DataFrame({"a": [1, 2]})["a"].sum().item(),
                  "pubsub": pubsub.types.PubsubMessage.__name__}))
"""

# The Pub/Sub client's code (google.cloud.pubsub itself is a lazy module, loaded on first use).
LEFT_OUT = ["pandas", "bson", "pymongo", "google.cloud.pubsub_v1", "google.pubsub_v1", "apache_beam.io.gcp.bigquery",
            "google.cloud.dataflow_v1beta3"]
KEPT = ["apache_beam.io.gcp.gcsio", "apache_beam.io.gcp.gcsfilesystem", "apache_beam.runners.dataflow.dataflow_runner",
        "google.cloud.storage"]


@pytest.mark.timeout(300)
def test_the_launchers_beam_leaves_out_the_unused_integrations_and_they_still_import_later(tmp_path):
    result = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path), *LEFT_OUT, *KEPT], cwd=REPO,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no warning of the missing bson (mongodbio's) or anything else
    report = json.loads(result.stdout)
    assert report["loaded"] == {**{name: False for name in LEFT_OUT}, **{name: True for name in KEPT}}
    assert report["lazy_before_use"] is True
    assert report["state"] == "JOB_STATE_DONE"
    assert report["pandas"] == 3  # imported as usual once Beam is in
    assert report["pubsub"] == "PubsubMessage"


def test_an_imported_beam_is_left_as_it_is():
    import apache_beam  # noqa: F401  (this process's Beam, imported whole by the tests)

    from pipeline import lean_beam

    before = set(sys.modules)
    lean_beam.import_beam()
    assert set(sys.modules) == before
    assert not [finder for finder in sys.meta_path if type(finder).__module__ == "pipeline.lean_beam"]


def test_memoized_signatures_answer_as_beam_does_for_every_dofn_of_a_run(tmp_path, monkeypatch):
    """Every question a whole run asks gets Beam's own answer; most are answered from memory."""
    from apache_beam.transforms import core

    from pipeline import lean_beam
    from pipeline.sample_data import generate_dataset
    from tests.conftest import convert

    lean_beam.memoize_signatures()
    memoized = core.get_function_arguments
    assert memoized.memoized
    asked = []

    def spy(obj, func):
        answer = memoized(obj, func)
        asked.append((obj, func, answer))
        return answer

    spy.memoized = True  # the run's own memoize_signatures() leaves it in place
    monkeypatch.setattr(core, "get_function_arguments", spy)
    generate_dataset(str(tmp_path / "in"), images_per_class=2, seed=1, min_side=32, max_side=48)
    assert convert(tmp_path / "in", tmp_path / "out", "--image_size=16") == 0
    functions = [getattr(obj, func).__func__ for obj, func, _ in asked if not hasattr(obj, f"_inspect_{func}")
                 and type(getattr(obj, func)).__name__ == "method"]
    assert len(asked) > 1000 and len(functions) > 5 * len(set(functions))  # the same methods, asked again and again
    for obj, func, answer in asked:
        hook = f"_inspect_{func}"
        beams = getattr(obj, hook)() if hasattr(obj, hook) else core.get_function_args_defaults(getattr(obj, func))
        assert answer == beams, (type(obj), func)


def test_memoized_signatures_ask_each_maps_callable_and_let_a_dofn_class_go():
    import gc
    import weakref

    import apache_beam as beam
    from apache_beam.transforms import core

    from pipeline import lean_beam

    lean_beam.memoize_signatures()
    timestamped = beam.Map(lambda x, t=beam.DoFn.TimestampParam: (x, t)).fn
    plain = beam.Map(lambda x: x).fn
    assert type(timestamped) is type(plain)  # one DoFn class (beam.Map's), two answers
    assert core.get_function_arguments(timestamped, "process") == (["x", "t"], [beam.DoFn.TimestampParam])
    assert core.get_function_arguments(plain, "process") == (["x"], [])

    class Once(beam.DoFn):
        def process(self, element, window=beam.DoFn.WindowParam):
            yield element

    answer = core.get_function_arguments(Once(), "process")
    assert answer == (["element", "window"], [beam.DoFn.WindowParam])
    answer[0].append("changed")  # a caller's change of its answer is not remembered
    assert core.get_function_arguments(Once(), "process") == (["element", "window"], [beam.DoFn.WindowParam])
    gone = weakref.ref(Once.process)
    del Once
    gc.collect()
    assert gone() is None  # memory keeps no graph's functions alive
