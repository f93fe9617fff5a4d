"""The output folder's lock, on a local folder and on gs:// (the GCS emulator, with generation preconditions)."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import threading

import pytest

from transforms.base.dataset_format import LOCK_FILE
from transforms.output.lock import LockHeld, acquire_lock, holder_record, read_lock, release_lock, update_lock


@pytest.fixture(params=["local", "gcs"])
def folder(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "out")
    emulator = request.getfixturevalue("gcs_emulator")
    name = f"lock-{abs(hash(str(tmp_path))) % 10**8}"
    emulator.create_bucket(name)
    return f"gs://{name}/out"


def never_stale(_holder):
    return None


def test_one_holder_at_a_time_and_only_the_holder_releases(folder):
    first, second = holder_record("run-1", "local"), holder_record("run-2", "local")
    assert acquire_lock(folder, first, never_stale) is None
    with pytest.raises(LockHeld) as held:
        acquire_lock(folder, second, never_stale)
    assert held.value.holder["run_id"] == "run-1" and held.value.path.endswith("/" + LOCK_FILE)
    assert release_lock(folder, "run-2") is False  # not its lock
    assert update_lock(folder, "run-1", job_id="2024-01-31_00_00_00-1")
    assert read_lock(folder)["job_id"] == "2024-01-31_00_00_00-1"
    assert release_lock(folder, "run-1") is True
    assert read_lock(folder) is None
    assert acquire_lock(folder, second, never_stale) is None  # free again


def _take_and_end(folder):
    acquire_lock(folder, holder_record("dead-run", "local"), never_stale)
    os._exit(0)  # killed: no release


def test_a_stale_lock_is_taken_over_and_says_why(folder):
    if folder.startswith("gs://"):
        acquire_lock(folder, holder_record("dead-run", "local"), never_stale)
    else:  # a local lock is held by its process's flock: its process has to end
        ended = multiprocessing.get_context("fork").Process(target=_take_and_end, args=(folder,))
        ended.start()
        ended.join(60)
        assert ended.exitcode == 0
    reason = acquire_lock(folder, holder_record("run-2", "local"),
                          lambda other: "its process ended" if other["run_id"] == "dead-run" else None)
    if folder.startswith("gs://"):
        assert reason == "its process ended"
    else:  # judged by the kernel: nobody holds its flock
        assert re.fullmatch(r"run dead-run \(process \d+ on .+\) no longer holds it: its process has ended", reason)
    assert read_lock(folder)["run_id"] == "run-2"


def test_racing_runs_never_both_get_the_lock(folder):
    """Eight runs at once, each treating every other's lock as live: exactly one wins."""
    winners, losers = [], []
    start = threading.Barrier(8)

    def take(n):
        start.wait()
        try:
            acquire_lock(folder, holder_record(f"run-{n}", "local"), never_stale)
            winners.append(n)
        except LockHeld:
            losers.append(n)

    threads = [threading.Thread(target=take, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(winners) == 1 and len(losers) == 7
    assert read_lock(folder)["run_id"] == f"run-{winners[0]}"


def test_an_unreadable_lock_is_reported_not_crashed_on(folder, tmp_path):
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(FileSystems.join(folder, LOCK_FILE)) as f:
        f.write(b"\x00not json")
    holder = read_lock(folder)
    assert holder["run_id"] is None and "not json" in holder["unreadable"]
    seen = []
    acquire_lock(folder, holder_record("run-3", "local"), lambda other: seen.append(other) or "unreadable")
    assert seen[0]["run_id"] is None
    assert json.loads(json.dumps(read_lock(folder)))["run_id"] == "run-3"
