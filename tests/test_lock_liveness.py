"""How the output folder's lock decides that its holder is alive: the kernel's flock on a local folder.

A lock is never taken over while its holder runs, also when the holder's process is not visible here (another
container or PID namespace on the same host name), and a stale lock taken over by several runs at once has
exactly one new holder. SIGTERM (schedulers, Kubernetes, systemd) releases it, and --if_exists=skip respects it.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import psutil
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline import verify
from pipeline.errors import UserError
from pipeline.options import validate
from pipeline.output_folder import take_lock, why_stale
from tests import hostile_files as hostile
from tests.conftest import REPO, convert
from transforms.base.dataset_format import LOCK_FILE, TEMP_DIR
from transforms.output.lock import LockHeld, acquire_lock, holder_record, read_lock

# Holds the flock of the lock file argv[1] until its stdin closes: a run in another PID namespace, as the kernel
# sees it (the lock file names a process that does not exist here).
HOLD_FLOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def flock_held_elsewhere(path: str):
    """Another process that holds the flock on `path` for the block, as a live run elsewhere would."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_FLOCK, path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.stdin.close()
        holder.wait(30)


def pid_not_running_here() -> int:
    """A process id that no process of this PID namespace has (another namespace's pid 3, as it were)."""
    for pid in range(3, 1 << 22):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    raise AssertionError("every pid is taken")


def write_lock(out, run_id: str, pid: int) -> dict:
    """A lock file as the run `run_id`, process `pid` of this host name, writes it (holding its flock)."""
    holder = {**holder_record(run_id, "local"), "pid": pid, "pid_started": "12345", "held_with": "flock"}
    out.mkdir(parents=True, exist_ok=True)
    (out / LOCK_FILE).write_text(json.dumps(holder, indent=2) + "\n")
    return holder


def settings_options(out, *args):
    options = PipelineOptions([f"--input_dir={REPO}", f"--output_dir={out}", *args])
    return validate(options), options


@pytest.mark.timeout(120)
def test_a_live_lock_of_a_process_not_visible_here_is_not_taken_over(tmp_path, caplog):
    """Finding 5: same host name, another PID namespace; the holder's pid does not exist here."""
    out = tmp_path / "out"
    other = write_lock(out, "20261201-100000-0000beef", pid_not_running_here())
    before = (out / LOCK_FILE).read_bytes()
    with flock_held_elsewhere(str(out / LOCK_FILE)) as holder:
        settings, options = settings_options(out)
        with pytest.raises(UserError) as refused:
            take_lock(settings, holder_record("20261201-100500-0000cafe", "local"), options)
        assert str(refused.value) == (
            f"--output_dir {out} is being written by run {other['run_id']} (process {other['pid']} on "
            f"{socket.gethostname()}, started {other['created']} by {other['user']}): two runs must not write one "
            f"folder; that process is not visible from here (another container or PID namespace): wait for it to "
            f"finish or stop it there, then run again, or choose another folder")
        assert (out / LOCK_FILE).read_bytes() == before  # untouched
        assert holder.poll() is None
    # Its process gone, the kernel has released the flock: the lock is stale now, and taken over.
    caplog.set_level("WARNING", logger="pipeline")
    take_lock(settings, holder_record("20261201-100500-0000cafe", "local"), options)
    assert read_lock(str(out))["run_id"] == "20261201-100500-0000cafe"
    assert f"run {other['run_id']} (process {other['pid']} on {socket.gethostname()}" in caplog.text
    assert "no longer holds it" in caplog.text


@pytest.mark.timeout(120)
def test_the_lock_message_names_only_what_the_lock_file_says(tmp_path):
    """Finding 21: a lock file that says little (written by hand, or by another tool) never reads "run None ... on
    None"; what to do follows from what is known."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).write_text(json.dumps({"run_id": "20261201-120000-0000dddd"}))
    with flock_held_elsewhere(str(out / LOCK_FILE)):
        settings, options = settings_options(out)
        with pytest.raises(UserError) as refused:
            take_lock(settings, holder_record("20261201-120500-0000eeee", "local"), options)
        assert str(refused.value) == (
            f"--output_dir {out} is being written by run 20261201-120000-0000dddd: two runs must not write one "
            "folder; wait for it to finish, or stop it on its machine, then run again, or choose another folder")
        (out / LOCK_FILE).write_text("\x00 not json")
        with pytest.raises(UserError) as refused:
            take_lock(settings, holder_record("20261201-120500-0000eeee", "local"), options)
        assert str(refused.value) == (
            f"--output_dir {out} is being written by a run whose lock file does not say which (it reads "
            "'\\x00 not json'): two runs must not write one folder; wait for that run to finish, then run again, "
            "or choose another folder")
        assert "None" not in str(refused.value)


@pytest.mark.timeout(120)
def test_another_users_lock_file_is_judged_and_a_stale_one_replaced(tmp_path, monkeypatch):
    """A shared folder: the lock file is another user's, so it opens read-only here (simulated: this test runs as
    root, whom permissions do not stop). A live one is refused as any other; a stale one is replaced by a new file."""
    out = tmp_path / "out"
    other = write_lock(out, "20261201-130000-0000ffff", pid_not_running_here())
    lock = str(out / LOCK_FILE)
    real_open, real_unlink, removed = os.open, os.unlink, []

    def as_another_user(path, flags, *args):
        if os.fspath(path) == lock and flags & (os.O_RDWR | os.O_WRONLY) and not removed:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args)

    def unlink(path, *args, **kwargs):
        removed.append(os.fspath(path))
        return real_unlink(path, *args, **kwargs)

    settings, options = settings_options(out)
    with flock_held_elsewhere(lock):
        with monkeypatch.context() as patch:
            patch.setattr(os, "open", as_another_user)
            with pytest.raises(UserError, match=f"is being written by run {other['run_id']} "):
                take_lock(settings, holder_record("20261201-130500-00001111", "local"), options)
    with monkeypatch.context() as patch:
        patch.setattr(os, "open", as_another_user)
        patch.setattr(os, "unlink", unlink)
        take_lock(settings, holder_record("20261201-130500-00001111", "local"), options)
    assert removed == [lock]  # theirs removed, under its flock; the lock file now is a new one, this run's
    assert read_lock(str(out))["run_id"] == "20261201-130500-00001111"


@pytest.mark.timeout(120)
def test_on_gcs_a_lock_of_a_process_in_another_pid_namespace_is_not_taken_over(gcs_emulator, tmp_path):
    """Finding 5 on gs:// (no kernel): a pid is looked up only in the holder's own PID namespace and kernel boot."""
    gcs_emulator.create_bucket("liveness")
    out = "gs://liveness/out"
    other = {**holder_record("20261201-100000-0000beef", "local"), "pid": pid_not_running_here(),
             "pid_namespace": "pid:[4026532999]"}
    gcs_emulator.client().bucket("liveness").blob(f"out/{LOCK_FILE}").upload_from_string(json.dumps(other))
    settings, options = settings_options(out)
    with pytest.raises(UserError) as refused:
        take_lock(settings, holder_record("20261201-100500-0000cafe", "local"), options)
    assert str(refused.value).endswith(
        f"two runs must not write one folder; wait for it to finish; if it is no longer running on "
        f"{socket.gethostname()}, delete {out}/{LOCK_FILE} and run again, or choose another folder")
    assert read_lock(out)["run_id"] == other["run_id"]
    # In this namespace and boot, the same record's ended process is seen as ended: the lock is taken over.
    gcs_emulator.client().bucket("liveness").blob(f"out/{LOCK_FILE}").upload_from_string(
        json.dumps({**other, "pid_namespace": holder_record("x", "local")["pid_namespace"]}))
    take_lock(settings, holder_record("20261201-100500-0000cafe", "local"), options)
    assert read_lock(out)["run_id"] == "20261201-100500-0000cafe"


def _take_stale(folder, n, start, results, done):
    start.wait()
    try:  # with the launcher's own judgement of another run's lock
        acquire_lock(folder, holder_record(f"run-{n}", "local"), lambda other: why_stale(other, PipelineOptions([])))
        results.put(n)
    except LockHeld:
        results.put(-1)
    done.wait(60)  # a winner holds the lock (its process lives) until every taker has tried


@pytest.mark.timeout(300)
def test_racing_takeovers_of_a_stale_lock_leave_exactly_one_holder(tmp_path):
    """Finding 6: five processes take over one stale lock at once, thirty times: one holder each time."""
    context = multiprocessing.get_context("fork")
    takers = 5
    for trial in range(30):
        out = tmp_path / f"out-{trial}"
        write_lock(out, "dead-run", pid_not_running_here())
        start, done, results = context.Barrier(takers), context.Event(), context.Queue()
        processes = [context.Process(target=_take_stale, args=(str(out), n, start, results, done))
                     for n in range(takers)]
        for process in processes:
            process.start()
        try:
            outcomes = [results.get(timeout=60) for _ in processes]
            winners = [n for n in outcomes if n >= 0]
            assert len(winners) == 1, f"trial {trial}: holders {winners}"
            assert read_lock(str(out))["run_id"] == f"run-{winners[0]}"
        finally:
            done.set()
            for process in processes:
                process.join(60)


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory):
    from pipeline.sample_data import generate_dataset

    root = tmp_path_factory.mktemp("liveness") / "in"
    generate_dataset(str(root), images_per_class=4, seed=3, min_side=24, max_side=40)
    return root


@pytest.mark.timeout(300)
def test_if_exists_skip_refuses_while_another_run_writes_the_folder(small_tree, tmp_path, capsys):
    """Finding 20: an --overwrite run holds the lock; skip must not answer "nothing to do"."""
    out = tmp_path / "out"
    assert convert(small_tree, out, "--image_size=16") == 0
    capsys.readouterr()
    (out / LOCK_FILE).touch()
    with flock_held_elsewhere(str(out / LOCK_FILE)) as holder:
        writer = write_lock(out, "20261201-110000-0000aaaa", holder.pid)
        with pytest.raises(UserError) as refused:
            convert(small_tree, out, "--image_size=16", "--if_exists=skip")
        assert str(refused.value) == (
            f"--output_dir {out} already holds a dataset (image_tfrecords.json) made with the same options, but it "
            f"is being written by run {writer['run_id']} (process {holder.pid} on {socket.gethostname()}, started "
            f"{writer['created']} by {writer['user']}), which may replace it: --if_exists=skip accepts a dataset "
            "only while no run writes the folder; run the same command again once that run has finished")
        assert "nothing to do" not in capsys.readouterr().out
    # That run gone (the lock it left is stale), the dataset is accepted, and the stale lock is left as it was.
    assert convert(small_tree, out, "--image_size=16", "--if_exists=skip") == 0
    assert "nothing to do (--if_exists=skip)" in capsys.readouterr().out
    assert read_lock(str(out))["run_id"] == writer["run_id"]


STOPPED = "error: terminated (SIGTERM); no image_tfrecords.json was written, so run the same command again"


def sigterm_mid_run(args: list[str], env: dict, writing: Callable[[], bool]) -> tuple[subprocess.Popen, str, str]:
    """Run the converter, held before it publishes; once `writing()`, SIGTERM the launcher alone (as Kubernetes
    and Airflow send it). Returns the process, its stdout and its stderr, once it and its workers have ended."""
    go = env["HOLD_UNTIL"]
    run = subprocess.Popen([sys.executable, "-m", "tests.held_run_main", *args], cwd=REPO, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        while run.poll() is None and not writing():
            time.sleep(0.05)
        assert run.poll() is None, run.communicate()
        workers = psutil.Process(run.pid).children(recursive=True)
        run.send_signal(signal.SIGTERM)
        stdout, stderr = run.communicate(timeout=120)
        _, alive = psutil.wait_procs(workers, timeout=60)
        assert alive == [], "a worker process outlived the run"
    finally:
        open(go, "w").close()
        if run.poll() is None:
            run.kill()
            run.wait()
    return run, stdout, stderr


@pytest.mark.timeout(300)
def test_sigterm_releases_the_lock_prints_one_line_and_exits_143(small_tree, tmp_path):
    """Finding 17: a scheduler stops an --overwrite run with SIGTERM while its workers are busy (held before it
    publishes): the lock goes, the earlier dataset stays whole, and a retry can start at once."""
    out = tmp_path / "out"
    assert convert(small_tree, out, "--image_size=16") == 0
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    args = [f"--input_dir={small_tree}", f"--output_dir={out}", "--image_size=16", "--quiet", "--overwrite"]
    run, stdout, stderr = sigterm_mid_run(args, dict(os.environ, HOLD_UNTIL=str(tmp_path / "go")),
                                          lambda: any((out / TEMP_DIR).glob("*/shards/train-*")))
    assert (run.returncode, stderr.splitlines(), stdout) == (143, [STOPPED], "")
    assert not (out / LOCK_FILE).exists()
    assert {name: (out / name).read_bytes() for name in os.listdir(out) if name != TEMP_DIR} == before
    assert verify.verify_dataset(str(out), decode=True).problems == []


@pytest.mark.timeout(300)
def test_sigterm_releases_a_gcs_lock(small_tree, tmp_path, gcs_emulator):
    """Finding 17 on gs://: a retry from another host is not refused by the lock of a run stopped with SIGTERM."""
    gcs_emulator.create_bucket("sigterm")
    out = "gs://sigterm/out"
    args = [f"--input_dir={small_tree}", f"--output_dir={out}", "--image_size=16", "--quiet", "--no_auth"]

    def writing() -> bool:
        names = gcs_emulator.list_names(out)
        return LOCK_FILE in names and any(name.startswith(f"{TEMP_DIR}/") for name in names)

    run, stdout, stderr = sigterm_mid_run(args, dict(os.environ, **gcs_emulator.env, HOLD_UNTIL=str(tmp_path / "go")),
                                          writing)
    assert (run.returncode, stderr.splitlines(), stdout) == (143, [STOPPED], "")
    names = gcs_emulator.list_names(out)
    assert LOCK_FILE not in names and "image_tfrecords.json" not in names


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder"])
def test_a_lock_name_that_is_not_a_regular_file_is_refused_and_nothing_is_written_through_it(small_tree, tmp_path,
                                                                                              kind):
    """Hostile: a link planted under the lock's name (a shared folder), a FIFO or a folder. The lock is never
    written through a link, never opened so that it blocks; one line, nothing outside the output folder touched."""
    out, precious = tmp_path / "out", tmp_path / "precious.txt"
    out.mkdir()
    precious.write_text("my thesis")
    lock = out / LOCK_FILE
    {"symlink": lambda: lock.symlink_to(precious), "fifo": lambda: hostile.fifo(lock),
     "folder": lambda: lock.mkdir()}[kind]()
    run = hostile.run_bounded([f"--input_dir={small_tree}", f"--output_dir={out}", "--image_size=16", "--quiet"],
                              2000)
    hostile.release_fifos([str(lock)] if kind == "fifo" else [])
    assert not run.killed, run.killed
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.splitlines() == [
        f"error: --output_dir {out} cannot be locked against a second run: {lock} is not a regular file (a symbolic "
        "link, folder, FIFO or device), and this tool never makes one there: remove it, or choose another folder"]
    assert precious.read_text() == "my thesis"
    assert sorted(os.listdir(out)) == [LOCK_FILE]
