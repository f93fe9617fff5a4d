"""pipeline.local.warm_workers: local runs get worker processes started early, and never leave one behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from pipeline.local import warm_workers
from pipeline.sample_data import generate_dataset
from tests.conftest import REPO


def _worker_processes(launcher: psutil.Process) -> list[psutil.Process]:
    """A launcher started in a subprocess has no other children than its workers."""
    return launcher.children(recursive=True)


def _start_launcher(tmp_path, images_per_class: int, seed: int, stdout=subprocess.DEVNULL):
    """A conversion in a subprocess with two workers: (its Popen, its psutil.Process, its output dir)."""
    source = tmp_path / "in"
    generate_dataset(str(source), images_per_class=images_per_class, seed=seed, min_side=24, max_side=64)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "pipeline.main", f"--input_dir={source}", f"--output_dir={out}",
               "--image_size=16", "--quiet", "--direct_num_workers=2"]
    process = subprocess.Popen(command, cwd=REPO, stdout=stdout, stderr=subprocess.PIPE)
    return process, psutil.Process(process.pid), out


def _alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def test_a_default_local_run_uses_the_started_workers_and_leaves_none_behind(tmp_path, monkeypatch):
    from pipeline.launcher import run
    from pipeline.report import read_info

    generate_dataset(str(tmp_path / "in"), images_per_class=12, seed=3, min_side=24, max_side=48)
    handed_out, addresses, pools = [], [], []
    real_start = warm_workers.WarmWorkerPool.start_worker

    def start_worker(self, request):
        handed_out.append((request.worker_id, len(_alive(self.pids())), len(self.pids())))
        addresses.append(request.control_endpoint.url)
        pools.append(self)
        return real_start(self, request)

    monkeypatch.setattr(warm_workers.WarmWorkerPool, "start_worker", start_worker)
    code = run([f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}", "--quiet",
                "--direct_num_workers=2", "--image_size=16"])
    assert code == 0
    # The runner asked the pool for its two workers, and both were already running when it did.
    assert len({worker_id for worker_id, _, _ in handed_out}) == 2
    assert all(running == started == 2 for _, running, started in handed_out)
    # Local workers reach the runner at localhost, never through a host-name lookup.
    assert all(url.startswith("localhost:") for url in addresses), addresses
    assert _alive(pools[0].pids()) == []  # stopped with the job
    info = read_info(str(tmp_path / "out"))
    assert info["files"]["written"] == info["files"]["found"] == 12 * len(info["class_names"])


@pytest.mark.parametrize("moment", ["before the first stage", "mid-run"])
def test_workers_end_by_themselves_when_the_launcher_is_killed(tmp_path, moment):
    process, launcher, out = _start_launcher(tmp_path, images_per_class=60, seed=5)
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
        first.process.join()
        request = beam_fn_api_pb2.StartWorkerRequest(
            worker_id="w1", control_endpoint=endpoints_pb2.ApiServiceDescriptor(url="127.0.0.1:1"))
        pool.start_worker(request)  # no BrokenPipeError: a fresh process got the assignment
        assert len(pool.pids()) == 2 and _alive(pool.pids()) == pool.pids()[1:]
    finally:
        pool.close()
    assert _alive(pool.pids()) == []


def test_workers_are_forked_from_the_launcher_with_beam_already_loaded(tmp_path):
    """A default run forks its workers: they share the launcher's command line and import nothing."""
    process, launcher, _ = _start_launcher(tmp_path, images_per_class=40, seed=6, stdout=subprocess.PIPE)
    command = process.args  # (read from /proc right after the fork, it can still be empty or the parent's)
    seen = {}
    try:
        while process.poll() is None and len(seen) < 2:
            for worker in _worker_processes(launcher):
                try:
                    seen[worker.pid] = worker.cmdline()
                except psutil.Error:
                    pass
            time.sleep(0.01)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert stdout.startswith(b"Found 160 files: 160 written")
    assert len(seen) == 2 and all(cmdline == command for cmdline in seen.values()), (command, seen)


def test_where_forking_is_unsafe_spawned_workers_do_the_job(tmp_path, monkeypatch):
    """Not Linux, or threads already running: each worker is a fresh interpreter that imports Beam itself."""
    from pipeline.launcher import run
    from pipeline.report import read_info

    generate_dataset(str(tmp_path / "in"), images_per_class=10, seed=7, min_side=24, max_side=48)
    monkeypatch.setattr(warm_workers, "can_fork", lambda: False)
    command_lines = []
    real_start = warm_workers.WarmWorkerPool.start_worker

    def start_worker(self, request):
        command_lines.extend(psutil.Process(pid).cmdline() for pid in _alive(self.pids()))
        return real_start(self, request)

    monkeypatch.setattr(warm_workers.WarmWorkerPool, "start_worker", start_worker)
    code = run([f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}", "--quiet",
                "--direct_num_workers=2", "--image_size=16"])
    assert code == 0
    assert command_lines and all("from multiprocessing.spawn import spawn_main" in " ".join(c)
                                 for c in command_lines), command_lines
    info = read_info(str(tmp_path / "out"))
    assert info["files"]["written"] == info["files"]["found"] == 10 * len(info["class_names"])
