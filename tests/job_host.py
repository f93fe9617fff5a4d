"""Where the Dataflow stand-in's jobs run: a process that imports Beam once and forks a worker per job.

A job's workers (tests/dataflow_service.py: `run_staged_job`) ran in an interpreter of their own, which spent
1.1 s of its 1.6 s of CPU importing Beam before the job's first step; about twenty jobs run in a suite. This
process imports it once, as the launcher does (lean_beam), and forks a child for each job: the child takes the
job's environment (its metadata server, the GCS emulator) and working folder, runs the job, and exits with
its code, its stderr in a file. A fork starts no thread and opens no connection: the parent has none.

Jobs that run other code (`worker_code`) or die midway (`KILL_AFTER_PIECES`) still get an interpreter of their
own (dataflow_service.py decides).

    python -m tests.job_host   # reads one JSON request a line on stdin, answers one JSON line on stdout
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _serve() -> None:
    from pipeline import lean_beam

    lean_beam.import_beam()
    from apache_beam.runners.portability.fn_api_runner import fn_runner  # noqa: F401  (what a job imports)

    from tests.dataflow_service import run_staged_job

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the job's worker
            code = 1
            try:
                signal.alarm(request["timeout"])  # a job that hangs ends with SIGALRM, as a timeout kills one
                with open(request["stderr"], "w") as err, open(os.devnull, "w") as out:
                    os.dup2(err.fileno(), 2)
                    os.dup2(out.fileno(), 1)
                os.environ.clear()
                os.environ.update(request["env"])
                os.chdir(request["cwd"])
                run_staged_job(request["staging"])
                code = 0
            except BaseException:  # noqa: BLE001  (what an interpreter prints of an uncaught error)
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


class JobHost:
    """The host process of this test process (started on first use); runs one job at a time."""

    _started: JobHost | None = None
    _start_lock = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process = subprocess.Popen([sys.executable, "-m", "tests.job_host"], cwd=REPO, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        atexit.register(self.close)

    def close(self) -> None:
        """End the host (its stdin closes) and wait for it: no process is left behind."""
        self._process.stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    @classmethod
    def get(cls) -> JobHost:
        with cls._start_lock:
            if cls._started is None or cls._started._process.poll() is not None:
                cls._started = cls()
            return cls._started

    def run(self, staging: str, env: dict, cwd: str, stderr_path: str, timeout: int = 600) -> tuple[int, str]:
        """Run the job staged at `staging` in a forked worker: (its exit code, its stderr)."""
        request = {"staging": staging, "env": env, "cwd": cwd, "stderr": stderr_path, "timeout": timeout}
        with self._lock:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            answer = self._process.stdout.readline()
        if not answer:
            raise RuntimeError("the stand-in's job host ended (see the test's stderr)")
        with open(stderr_path, encoding="utf-8", errors="replace") as f:
            return json.loads(answer)["returncode"], f.read()


if __name__ == "__main__":
    _serve()
