"""pipeline.warm_workers: local runs get worker processes started early, and never leave one behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from pipeline import warm_workers
from pipeline.sample_data import generate_dataset
from tests.conftest import REPO


def _worker_processes(parent: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in parent.children(recursive=True):
        try:
            if warm_workers.WORKER_MODULE in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            pass
    return found


def test_a_default_local_run_uses_the_started_workers_and_leaves_none_behind(tmp_path, monkeypatch):
    from pipeline.launcher import read_info, run

    generate_dataset(str(tmp_path / "in"), images_per_class=12, seed=3, min_side=24, max_side=48)
    handed_out, addresses = [], []
    real_start = warm_workers.WarmWorkerPool.start_worker

    def start_worker(self, request):
        handed_out.append((request.worker_id, len(_worker_processes(psutil.Process()))))
        addresses.append(request.control_endpoint.url)
        return real_start(self, request)

    monkeypatch.setattr(warm_workers.WarmWorkerPool, "start_worker", start_worker)
    code = run([f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}", "--quiet",
                "--direct_num_workers=2", "--image_size=16"])
    assert code == 0
    # The runner asked the pool for its two workers, and both were already running when it did.
    assert len({worker_id for worker_id, _ in handed_out}) == 2
    assert all(running == 2 for _, running in handed_out)
    # Local workers reach the runner at localhost, never through a host-name lookup.
    assert all(url.startswith("localhost:") for url in addresses), addresses
    assert _worker_processes(psutil.Process()) == []  # stopped with the job
    info = read_info(str(tmp_path / "out"))
    assert info["files"]["written"] == info["files"]["found"] == 12 * len(info["class_names"])


@pytest.mark.parametrize("moment", ["before the first stage", "mid-run"])
def test_workers_end_by_themselves_when_the_launcher_is_killed(tmp_path, moment):
    source = tmp_path / "in"
    generate_dataset(str(source), images_per_class=60, seed=5, min_side=24, max_side=64)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "pipeline.main", f"--input_dir={source}", f"--output_dir={out}",
               "--image_size=16", "--quiet", "--direct_num_workers=2"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    launcher = psutil.Process(process.pid)
    try:
        workers = []
        while process.poll() is None and len(workers) < 2:
            workers = _worker_processes(launcher)
            time.sleep(0.01)
        if moment == "mid-run":
            while process.poll() is None and not (out / ".image-tfrecords-tmp").exists():
                time.sleep(0.01)  # the first piece of a shard: the workers are converting
        assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read()!r}"
        os.kill(process.pid, signal.SIGKILL)  # the launcher alone: its workers lose their parent
        process.wait(timeout=60)
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert alive == [], "a worker process outlived its launcher"
    finally:
        for worker in _worker_processes(launcher) if process.poll() is None else []:
            worker.kill()
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_quiet_default_run_prints_only_the_summary(tmp_path):
    """Worker log records (Beam's own warnings about options it does not know) stay out of the terminal."""
    from tests.conftest import cli

    generate_dataset(str(tmp_path / "in"), images_per_class=6, seed=4, min_side=24, max_side=48)
    result = cli("pipeline.main", f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}", "--quiet",
                 "--image_size=16")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.startswith("Found 24 files: 24 written, 0 rejected, 0 skipped.")


def test_worker_errors_still_reach_the_terminal(caplog):
    """The pool's log service passes a worker's ERROR records on, at their level."""
    import logging

    from apache_beam.portability.api import beam_fn_api_pb2

    entry = beam_fn_api_pb2.LogEntry(severity=beam_fn_api_pb2.LogEntry.Severity.ERROR, message="disk full",
                                     thread="7", log_location="write.py:12")
    with caplog.at_level(logging.INFO, logger="apache_beam.worker"):
        list(warm_workers._LogServicer().Logging([beam_fn_api_pb2.LogEntry.List(log_entries=[entry])]))
    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert records == [(logging.ERROR, "worker 7 at write.py:12: disk full")]


def test_a_started_worker_that_died_is_replaced():
    from apache_beam.portability.api import beam_fn_api_pb2, endpoints_pb2

    pool = warm_workers.WarmWorkerPool(1, quiet=True)
    try:
        (first,) = pool._free
        first.kill()
        first.wait()
        request = beam_fn_api_pb2.StartWorkerRequest(
            worker_id="w1", control_endpoint=endpoints_pb2.ApiServiceDescriptor(url="127.0.0.1:1"))
        pool.start_worker(request)  # no BrokenPipeError: a fresh process got the assignment
        assert len(pool._processes) == 2 and pool._processes[1].poll() is None
    finally:
        pool.close()
    assert all(process.poll() is not None for process in pool._processes)
