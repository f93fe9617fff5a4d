"""What a job's workers are, from its options alone: the runner, the machine type's vCPUs and memory, the processes.

No Beam step and no client here: `pipeline.options` (sizing --worker_memory_mb and the read rate's
share) and `pipeline.cloud` (submitting) both need these facts, so they live below both.
Dataflow runs one SDK process per vCPU of each worker.
"""

from __future__ import annotations

import os
import re

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, WorkerOptions

# Set in every Python Flex Template launcher image: the launcher must return once the job is submitted.
FLEX_TEMPLATE_ENV = "FLEX_TEMPLATE_PYTHON_PY_FILE"


LOCAL_RUNNER_NAMES = (None, "DirectRunner", "SwitchingDirectRunner", "FnApiRunner")


def is_local_run(options: PipelineOptions) -> bool:
    """Whether the job runs on this machine (the local runner: Beam's FnApiRunner, pipeline.local)."""
    return options.view_as(StandardOptions).runner in LOCAL_RUNNER_NAMES


def is_dataflow(options: PipelineOptions) -> bool:
    runner = options.view_as(StandardOptions).runner
    if runner is None:
        return False
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.rsplit(".", 1)[-1].lower() in ("dataflow", "dataflowrunner")


# Memory per vCPU, in MB (MiB), of Compute Engine's predefined machine types: n1 has 3.75, 6.5 and 0.9 GB a vCPU
# (standard, highmem, highcpu), the later families (n2, n2d, e2, c2d, c3, n4...) 4, 8 and 1 at least.
_MB_PER_VCPU = {"standard": 4096, "highmem": 8192, "highcpu": 1024}
_N1_MB_PER_VCPU = {"standard": 3840, "highmem": 6656, "highcpu": 921}
DATAFLOW_DEFAULT_MACHINE = "n1-standard-1"  # what a batch job's workers are without --machine_type
# What one SDK process needs beside its conversions: the process itself (~200 MB) and Beam's buffers.
SDK_PROCESS_RESERVE_MB = 300


def machine_mb_per_vcpu(machine_type: str) -> int | None:
    """The memory per vCPU of a machine type (predefined, or custom-VCPUS-MB); None for a type this does not know."""
    name = machine_type.strip().rsplit("/", 1)[-1].lower()
    custom = re.fullmatch(r"(?:[a-z][a-z0-9]*-)?custom-([1-9][0-9]*)-([1-9][0-9]*)(?:-ext)?", name)
    if custom:
        return int(custom[2]) // int(custom[1])
    found = re.fullmatch(r"([a-z][a-z0-9]*)-(standard|highmem|highcpu)-[1-9][0-9]*", name)
    if not found:
        return None
    return (_N1_MB_PER_VCPU if found[1] == "n1" else _MB_PER_VCPU)[found[2]]


def machine_vcpus(machine_type: str) -> int | None:
    """The vCPUs of a machine type (n2-standard-4: 4, custom-8-32768: 8, e2-medium: 2); None when not known."""
    name = machine_type.strip().rsplit("/", 1)[-1].lower()  # a full resource URL ends with the type's name
    found = re.fullmatch(r"(?:[a-z][a-z0-9]*-)?(?:standard|highcpu|highmem|highgpu|megagpu|ultragpu|megamem|"
                         r"ultramem|hypermem|custom)-([1-9][0-9]*)(?:-.*)?", name)
    shared_core = {"e2-micro": 2, "e2-small": 2, "e2-medium": 2, "f1-micro": 1, "g1-small": 1}
    return int(found[1]) if found else shared_core.get(name)


def worker_memory_share(options: PipelineOptions) -> tuple[str, int, int] | None:
    """(machine type, its MB per vCPU, the MB one SDK process may give its conversions) for a Dataflow job's workers.

    Dataflow runs one SDK process per vCPU, so each has the machine's memory per vCPU, less its own needs.
    None for a machine type whose memory this does not know.
    """
    machine = options.view_as(WorkerOptions).machine_type or DATAFLOW_DEFAULT_MACHINE
    per_vcpu = machine_mb_per_vcpu(machine)
    return None if per_vcpu is None else (machine, per_vcpu, per_vcpu - SDK_PROCESS_RESERVE_MB)


def worker_processes(options: PipelineOptions) -> int | None:
    """The most worker processes a job runs. On Dataflow: one per vCPU on each of --max_num_workers (or
    --num_workers) machines of --machine_type (Dataflow's n1-standard-1 when not given); None when neither count
    is given. A local run: its --direct_num_workers, else one per core (the local runner's default; a
    --direct_num_workers=1 given is counted as one per core too, Beam's default being 1), so that its
    processes share the job's first read rate as a Dataflow job's do, rather than each taking the share of one
    of 100 processes (50 reads a second: a local run from gs:// on a small machine was capped by it). Another
    runner is counted as Dataflow is."""
    if is_local_run(options):
        given = options.view_as(DirectOptions).direct_num_workers or 0
        return given if given > 1 else os.cpu_count() or 1
    workers = options.view_as(WorkerOptions)
    count = workers.max_num_workers or workers.num_workers
    if not count:
        return None
    return count * (machine_vcpus(workers.machine_type or DATAFLOW_DEFAULT_MACHINE) or 1)
