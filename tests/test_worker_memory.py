"""--worker_memory_mb on Dataflow: sized per vCPU, since Dataflow runs one SDK process per vCPU (issue 29).

A highcpu machine has 0.9-1 GB per vCPU: the default must not promise each of its processes 2 GB.
"""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.errors import UserError
from pipeline.options import validate
from pipeline.workers import machine_mb_per_vcpu

DATAFLOW = ["--input_dir=gs://b/photos", "--output_dir=gs://b/out", "--runner=DataflowRunner"]


def memory_mb(*argv: str) -> int:
    return validate(PipelineOptions(list(argv))).image.worker_memory_mb


@pytest.mark.parametrize("machine, per_vcpu", [
    ("n1-standard-4", 3840), ("n1-highmem-8", 6656), ("n1-highcpu-16", 921), ("n2-highcpu-32", 1024),
    ("e2-standard-2", 4096), ("c3-highmem-22", 8192), ("custom-8-16384", 2048), ("n2-custom-4-6144-ext", 1536),
    ("zones/us-central1-a/machineTypes/n1-highcpu-16", 921), ("a2-highgpu-1g", None), ("e2-micro", None),
])
def test_the_memory_per_vcpu_of_a_machine_type(machine, per_vcpu):
    assert machine_mb_per_vcpu(machine) == per_vcpu


@pytest.mark.parametrize("machine, expected", [
    (None, 2048),  # Dataflow's default n1-standard-1: 3,840 MB for its one process
    ("n1-standard-4", 2048),
    ("n1-highcpu-16", 621),  # 14.4 GB for 16 processes: 921 MB each, 300 of it the process's own
    ("n2-highcpu-8", 724),
    ("custom-4-8192", 1748),
    ("a2-highgpu-1g", 2048),  # a type whose memory is not known here keeps the default
])
def test_the_default_on_dataflow_never_over_commits_the_machine(machine, expected):
    argv = [*DATAFLOW, *([f"--machine_type={machine}"] if machine else [])]
    assert memory_mb(*argv) == expected
    if machine == "n1-highcpu-16":
        assert 16 * (expected + 300) <= 14.4 * 1024  # the 16 processes fit the machine's 14.4 GB


def test_a_local_run_keeps_2048_and_an_explicit_value():
    assert memory_mb("--input_dir=photos", "--output_dir=out") == 2048
    assert memory_mb("--input_dir=photos", "--output_dir=out", "--worker_memory_mb=4000") == 4000
    assert memory_mb("--input_dir=photos", "--output_dir=out", "--machine_type=n1-highcpu-16") == 2048


def test_a_flex_template_launch_is_sized_as_dataflow(monkeypatch):
    monkeypatch.setenv("FLEX_TEMPLATE_PYTHON_PY_FILE", "/template/launch.py")
    flex = ["--input_dir=gs://b/photos", "--output_dir=gs://b/out", "--worker_machine_type=n1-highcpu-8"]
    assert memory_mb(*flex) == 621


def test_an_explicit_value_that_over_commits_the_workers_is_refused_with_one_line():
    with pytest.raises(UserError) as refused:
        validate(PipelineOptions([*DATAFLOW, "--machine_type=n1-highcpu-16", "--worker_memory_mb=2048"]))
    assert str(refused.value) == (
        "--worker_memory_mb=2048 over-commits the workers: Dataflow runs one SDK process per vCPU, and a n1-highcpu-16 "
        "worker has 921 MB per vCPU, 621 MB of it for conversions beside the process's own ~300 MB; give at most "
        "621, leave it out (sized per vCPU), or choose a machine type with more memory per vCPU")
    assert memory_mb(*DATAFLOW, "--machine_type=n1-highcpu-16", "--worker_memory_mb=600") == 600
    assert memory_mb(*DATAFLOW, "--machine_type=n1-highcpu-16", "--worker_memory_mb=0") == 0  # no limit, if asked


def test_a_max_image_mb_the_share_cannot_hold_is_refused():
    with pytest.raises(UserError) as refused:
        validate(PipelineOptions([*DATAFLOW, "--machine_type=custom-8-4096"]))
    assert str(refused.value).startswith("--max_image_mb=512 does not fit the workers' memory: Dataflow runs one SDK "
                                         "process per vCPU, and a custom-8-4096 worker has 512 MB per vCPU")
    assert memory_mb(*DATAFLOW, "--machine_type=custom-8-4096", "--max_image_mb=200") == 212


def test_the_launch_stops_with_one_line_and_exit_2(capsys):
    from tests.conftest import main_in_process

    code, err = main_in_process(capsys, *DATAFLOW, "--project=p", "--region=us-central1",
                                "--temp_location=gs://b/tmp", "--machine_type=n1-highcpu-16",
                                "--worker_memory_mb=1024")
    assert code == 2
    assert err.strip().splitlines() == [
        "error: --worker_memory_mb=1024 over-commits the workers: Dataflow runs one SDK process per vCPU, and a "
        "n1-highcpu-16 worker has 921 MB per vCPU, 621 MB of it for conversions beside the process's own ~300 MB; "
        "give at most 621, leave it out (sized per vCPU), or choose a machine type with more memory per vCPU"]
