"""Crash safety: a killed run leaves no image_tfrecords.json; the same command again gives a complete dataset.

Also: the output folder's hygiene. Only the names this tool writes are ever
removed, never a user's file, not even one whose name looks like a shard's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest
from apache_beam.io.filesystems import FileSystems

from pipeline import verify
from pipeline.cli import main_of
from pipeline.errors import UserError
from pipeline.output_folder import existing_dataset, prepare_output
from pipeline.sample_data import generate_dataset
from tests.conftest import REPO, cli, convert
from tests.crash_helpers import (
    HEX,
    RUN,
    USER_FILES,
    assert_complete,
    assert_user_files_intact,
    settings_for,
    write_files,
)
from transforms.base.dataset_format import INFO_FILE, LOCK_FILE, SHARD_NAME, TEMP_DIR
from transforms.output.ownership import own_outputs

# An interrupted run's leftovers, of every kind this tool and Beam write, from runs with other shard counts.
LEFTOVERS = [
    "train-00000-of-00007.tfrecord",
    "train-00006-of-00007.tfrecord",
    "validation-00000-of-00002.tfrecord.gz",
    "test-00000-of-00001.tfrecord",
    "labels.txt",
    "features.json",
    "dataset_info.json",
    "label.labels.txt",
    "errors.jsonl",
    f".{INFO_FILE}.tmp-{HEX}",
    f".labels.txt.tmp-{HEX}",
    f"beam-temp-errors-{HEX}/a1b2.errors.jsonl",
    f"beam-temp-train-{HEX}/c3d4.train.tfrecord",
    f"{TEMP_DIR}/beam-temp-train-{HEX}/e5f6.train.tfrecord",
    f"{TEMP_DIR}/validation-00000-of-00003.tfrecord",
    f"{TEMP_DIR}/{HEX}.partial",
    f"{TEMP_DIR}/20261129-230000-89abcdef/pieces/beam-temp-train-{HEX}/a.train.tfrecord",
    f"{TEMP_DIR}/20261129-230000-89abcdef/shards/train-00000-of-00001.tfrecord",
]
# The final names among them: a complete dataset's files, kept until a new run publishes its own. In a folder
# without a dataset no run can be proven to have written them: never deleted, they stop a run.
FINAL = [name for name in LEFTOVERS if "/" not in name and not name.startswith(".")]
# The temporary ones: an interrupted run's, removed by the next run.
TEMPORARY = [name for name in LEFTOVERS if name not in FINAL]


def all_files(folder) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def run_files(folder) -> set[str]:
    """Files of a run in progress (the folder changes while it is listed)."""
    try:
        return all_files(folder) - set(USER_FILES)
    except OSError:
        return set()


# --- output-folder hygiene ------------------------------------------------------------------------------------


def test_prepare_output_removes_every_leftover_and_no_user_file(tmp_path):
    out = tmp_path / "out"
    write_files(out, [*USER_FILES, *TEMPORARY])
    (out / f"beam-temp-validation-{HEX}").mkdir()  # emptied by Beam, not removed

    assert sorted(os.path.relpath(p, out) for p in own_outputs(str(out))) == sorted(TEMPORARY)
    removed = prepare_output(settings_for(out), RUN).paths

    assert sorted(os.path.relpath(p, out) for p in removed) == sorted(TEMPORARY)
    assert all_files(out) == set(USER_FILES)
    assert_user_files_intact(out)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        ".image-tfrecords-tmp", ".image-tfrecords-tmp-old", "beam-temp-mine", "beam-temp-train-notes", "keep"]
    assert os.listdir(out / TEMP_DIR) == [RUN]  # only this run's own folder


def test_in_the_background_the_names_are_free_at_once_and_only_old_files_are_deleted(tmp_path, monkeypatch):
    out = tmp_path / "out"
    write_files(out, [*USER_FILES, *TEMPORARY])
    (out / f"beam-temp-validation-{HEX}").mkdir()  # emptied by Beam: removed at once
    # The deletion is held back until the new run has written its files.
    go, rmtree = threading.Event(), shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: go.wait(10) and rmtree(*a, **k))

    old = prepare_output(settings_for(out), RUN, background=True)

    # Nothing of the old run is left under its own name, even before the deletion ends ...
    assert sorted(os.path.relpath(p, out) for p in old.paths) == sorted(TEMPORARY)
    aside = all_files(out) - set(USER_FILES)
    assert len(aside) == len(TEMPORARY)
    assert all(f.startswith(f"{TEMP_DIR}/{RUN}/old-") for f in aside), aside
    # ... so a new run's files, written meanwhile under the same names, are safe from it.
    new_files = [f".labels.txt.tmp-{HEX}", "labels.txt", f"{TEMP_DIR}/{RUN}/{HEX}.partial"]
    for name in new_files:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("new run")
    go.set()
    old.wait()

    assert all_files(out) == {*USER_FILES, *new_files}
    assert all((out / name).read_text() == "new run" for name in new_files)
    assert_user_files_intact(out)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        ".image-tfrecords-tmp", ".image-tfrecords-tmp-old", "beam-temp-mine", "beam-temp-train-notes", "keep"]


# Files under this tool's final names in a folder without a dataset: another tool's shards, a TFDS folder's metadata,
# the user's labels.txt. No run of this tool can be proven to have written them.
FOREIGN = ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord", "dataset_info.json", "features.json",
           "label.labels.txt", "labels.txt"]


@pytest.mark.parametrize("if_exists", [[], ["--overwrite"]], ids=["refuse", "overwrite"])
def test_files_named_like_the_tools_in_a_folder_without_a_dataset_are_never_deleted(tmp_path, if_exists):
    out = tmp_path / "out"
    write_files(out, [*USER_FILES, *FOREIGN, *TEMPORARY, "mydata-train.tfrecord-00000-of-00001"])
    before = {name: (out / name).read_bytes() for name in all_files(out)}

    with pytest.raises(UserError) as refused:
        prepare_output(settings_for(out, *if_exists), RUN)

    assert str(refused.value) == (
        f"--output_dir {out} holds no dataset of this tool, but 6 file(s) named as this run names its own "
        "(dataset_info.json, features.json, label.labels.txt, labels.txt, train-00000-of-00002.tfrecord and 1 "
        "more): they are not this tool's to delete, and the dataset would be published over or beside them; move "
        "or remove them, or choose an empty folder")
    assert {name: (out / name).read_bytes() for name in all_files(out)} == before  # nothing changed, not even ours


def test_a_sources_file_of_no_dataset_is_named_and_left(tmp_path, caplog):
    out = tmp_path / "out"
    sources = "sources-20261129-230000-89abcdef-00000-of-00001.jsonl"
    write_files(out, [*USER_FILES, sources, *TEMPORARY])

    removed = prepare_output(settings_for(out), RUN).paths

    assert sorted(os.path.relpath(p, out) for p in removed) == sorted(TEMPORARY)
    assert all_files(out) == {*USER_FILES, sources}
    assert [r.getMessage() for r in caplog.records if r.name == "pipeline"] == [
        f"Left 1 file(s) in {out} that are named like this tool's but belong to no dataset of it: {sources}"]


def test_a_complete_dataset_stays_whole_until_a_new_run_publishes(tmp_path):
    """--overwrite removes an earlier run's leftovers at the start, but the complete dataset only at the end."""
    out = tmp_path / "out"
    write_files(out, [*USER_FILES, *LEFTOVERS])
    (out / INFO_FILE).write_text("{}")
    with pytest.raises(UserError, match="already holds a dataset"):
        existing_dataset(settings_for(out))
    assert all_files(out) == {*USER_FILES, *LEFTOVERS, INFO_FILE}

    assert existing_dataset(settings_for(out, "--overwrite")) is None
    removed = prepare_output(settings_for(out, "--overwrite"), RUN).paths
    assert sorted(os.path.relpath(p, out) for p in removed) == sorted(set(LEFTOVERS) - set(FINAL))
    assert all_files(out) == {*USER_FILES, *FINAL, INFO_FILE}
    assert_user_files_intact(out)


# --- the completion marker ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash") / "in"
    generate_dataset(str(root), images_per_class=6, seed=7, min_side=24, max_side=48)
    return root


def test_dataset_info_is_the_last_file_written(small_tree, tmp_path, monkeypatch):
    """Every shard, labels.txt, errors.jsonl and TFDS's files are final before image_tfrecords.json appears."""
    out = tmp_path / "out"
    events = []
    real_create, real_rename, real_delete = FileSystems.create, FileSystems.rename, FileSystems.delete

    def create(path, *args, **kwargs):
        events.append(("create", path))
        return real_create(path, *args, **kwargs)

    def rename(sources, destinations):
        real_rename(sources, destinations)
        events.extend(("rename", d) for d in destinations)

    def delete(paths):
        events.extend(("delete", p) for p in paths)
        real_delete(paths)

    monkeypatch.setattr(FileSystems, "create", create)
    monkeypatch.setattr(FileSystems, "rename", rename)
    monkeypatch.setattr(FileSystems, "delete", delete)
    assert convert(small_tree, out, "--num_shards=train=2,validation=2", "--image_size=16") == 0

    # Under final names (in the folder itself, not in the run's temporary folder):
    in_output = [(kind, path) for kind, path in events if os.path.dirname(path) == str(out)]
    assert in_output[-1] == ("rename", str(out / INFO_FILE))
    assert [e for e in in_output if e[1].endswith(INFO_FILE)] == [("rename", str(out / INFO_FILE))]
    # Every description was written in full (into the run's folder) before the first file took its final name.
    first_final = events.index(in_output[0])
    staged = [path for kind, path in events[:first_final] if kind == "create" and "/publish/" in path]
    assert {os.path.basename(p) for p in staged} >= {INFO_FILE, "labels.txt", "errors.jsonl", "features.json"}
    assert not [e for e in events[first_final:] if e[0] == "create"]
    final = {os.path.basename(path) for kind, path in in_output if kind == "rename"}
    assert {"labels.txt", "features.json", "dataset_info.json", "label.labels.txt", "errors.jsonl"} <= final
    assert sum(bool(SHARD_NAME.fullmatch(name)) for name in final) == 4  # 2 train + 2 validation


class CrashAtMarker(Exception):
    """Stands for the process dying just before image_tfrecords.json would be renamed into place."""


def crash_before_the_marker(monkeypatch):
    real_rename = FileSystems.rename

    def rename(sources, destinations):
        if any(d.endswith("/" + INFO_FILE) for d in destinations):
            raise CrashAtMarker("killed")
        real_rename(sources, destinations)

    monkeypatch.setattr(FileSystems, "rename", rename)


def test_a_crash_just_before_the_marker_leaves_no_dataset_and_a_rerun_completes_it(small_tree, tmp_path,
                                                                                 monkeypatch, capsys):
    out = tmp_path / "out"
    write_files(out, USER_FILES)
    args = ["--num_shards=train=3,validation=3", "--image_size=16"]
    with monkeypatch.context() as patch:
        crash_before_the_marker(patch)
        with pytest.raises(Exception, match="killed"):
            convert(small_tree, out, *args)
    # Everything but the marker is in place, the marker written in full in the run's folder: not a dataset yet.
    assert not (out / INFO_FILE).exists()
    assert [p.name for p in (out / TEMP_DIR).glob(f"*/publish/{INFO_FILE}")] == [INFO_FILE]
    assert sum(bool(SHARD_NAME.fullmatch(name)) for name in os.listdir(out)) == 6
    assert main_of(verify.run, [str(out)]) == 2
    assert "has no image_tfrecords.json" in capsys.readouterr().err

    # The same command again finishes the publishing: that dataset is complete, and nothing is converted again.
    assert main_of(lambda argv: convert(small_tree, out, *argv), args) == 0
    assert "was stopped while it published its dataset" in capsys.readouterr().out
    assert_complete(out, images=24, shards=3)
    # Another shard count, --overwrite: complete, exact, nothing stale.
    assert convert(small_tree, out, "--num_shards=train=2,validation=2", "--image_size=16", "--overwrite") == 0
    assert_complete(out, images=24, shards=2)

    # Replacing it with --overwrite and crashing again: the old marker is gone, not left over new shards.
    with monkeypatch.context() as patch:
        crash_before_the_marker(patch)
        with pytest.raises(Exception, match="killed"):
            convert(small_tree, out, "--num_shards=1", "--image_size=16", "--overwrite")
    assert not (out / INFO_FILE).exists()
    assert_user_files_intact(out)
    # A rerun with other options finishes that publishing first, then refuses the dataset it finished ...
    with pytest.raises(UserError, match=r"was stopped while it published its dataset .* made with other options"):
        convert(small_tree, out, "--num_shards=1", "--image_size=24")
    assert_complete(out, images=24, shards=1)


# --- SIGKILL, end to end --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_killed_mid_way_leaves_no_dataset_and_the_same_command_again_completes_it(tmp_path):
    source = tmp_path / "in"
    generate_dataset(str(source), images_per_class=50, seed=11, min_side=24, max_side=64)
    out = tmp_path / "out"
    write_files(out, USER_FILES)
    command = [sys.executable, "-m", "pipeline.main", f"--input_dir={source}", f"--output_dir={out}",
               "--num_shards=3", "--compression=gzip", "--image_size=16", "--quiet"]
    # Its own session, so that the kill reaches Beam's worker processes too, as a machine's death would.
    process = subprocess.Popen(command, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        while process.poll() is None and not any(f.startswith(f"{TEMP_DIR}/") for f in run_files(out)):
            time.sleep(0.01)  # until the run's first file (a piece of a shard, usually) appears
        assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read()!r}"
        workers = psutil.Process(process.pid).children(recursive=True)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert alive == [], "a worker process survived the kill"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not (out / INFO_FILE).exists()
    assert own_outputs(str(out)), "the kill left nothing behind: it did not happen mid-run"
    # Shards take their final names only as the run finishes: a plain glob finds nothing to misread.
    assert [name for name in os.listdir(out) if SHARD_NAME.fullmatch(name)] == []
    # The killed run's lock stays, naming a process that no longer exists: the next run takes it over.
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == process.pid

    from pipeline import reader
    from pipeline.errors import DatasetError

    with pytest.raises(DatasetError, match="not a complete dataset"):
        reader.load_info(str(out))
    from pipeline import benchmark

    assert main_of(benchmark.run, [f"--dataset_dir={out}"]) == 2
    refused = cli("pipeline.verify", str(out))  # as a user would check the folder
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: {out} has no image_tfrecords.json: it is not a complete dataset (an interrupted conversion leaves "
        "none); convert again with python -m pipeline.main"]

    # The same command (other shard count, no compression), with no --overwrite needed.
    assert convert(source, out, "--num_shards=train=2,validation=2", "--image_size=16") == 0
    assert_complete(out, images=200, shards=2)


# --- --overwrite and the lock ---------------------------------------------------------------------------------


def shard_bytes(out) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in os.listdir(out) if SHARD_NAME.fullmatch(name)}


def test_overwrite_that_fails_before_it_finishes_leaves_the_old_dataset_whole(small_tree, tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert convert(small_tree, out, "--num_shards=train=2,validation=2", "--image_size=16") == 0
    before, info_before = shard_bytes(out), (out / INFO_FILE).read_text()

    import transforms.output.describe

    def killed(*args, **kwargs):
        raise CrashAtMarker("killed just before publishing")

    with monkeypatch.context() as patch:
        patch.setattr(transforms.output.describe, "publish_dataset", killed)
        with pytest.raises(Exception, match="killed just before publishing"):
            convert(small_tree, out, "--num_shards=train=3,validation=3", "--image_size=24", "--overwrite")
    # The new run's shards never took final names; the old dataset is exactly as it was, and verifies.
    assert shard_bytes(out) == before and (out / INFO_FILE).read_text() == info_before
    assert verify.verify_dataset(str(out), decode=True).problems == []
    assert not (out / LOCK_FILE).exists()  # the failed run gave its lock back

    # The same command again replaces it, and leaves nothing of the failed run.
    assert convert(small_tree, out, "--num_shards=train=3,validation=3", "--image_size=24", "--overwrite") == 0
    assert_complete(out, images=24, shards=3, user_files=False)


def test_a_second_run_into_a_folder_in_use_stops_at_once_naming_the_first(small_tree, tmp_path):
    out, go = tmp_path / "out", tmp_path / "go"
    args = [f"--input_dir={small_tree}", f"--output_dir={out}", "--image_size=16", "--quiet"]
    # The first run converts everything, then waits before it publishes, holding the lock, until `go` exists.
    first = subprocess.Popen([sys.executable, "-m", "tests.held_run_main", *args], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, HOLD_UNTIL=str(go)))
    try:
        while first.poll() is None and not (out / LOCK_FILE).exists():
            time.sleep(0.01)
        second = cli("pipeline.main", *args, "--overwrite", timeout=120)
        assert first.poll() is None, first.communicate()
        go.touch()
        stdout, stderr = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert second.returncode == 2
    (line,) = second.stderr.strip().splitlines()
    assert re.fullmatch(
        rf"error: --output_dir {re.escape(str(out))} is being written by run \d{{8}}-\d{{6}}-[0-9a-f]{{8}} "
        rf"\(process {first.pid} on {re.escape(socket.gethostname())}, started \S+ by \S+\): two runs must not "
        r"write one folder; wait for it to finish, or stop it \(Ctrl-C\), then run again, or choose another folder",
        line), line
    # The first run was not disturbed: it finishes with a complete dataset.
    assert first.returncode == 0, stderr
    assert stdout.startswith("Found 24 files: 24 written")
    assert_complete(out, images=24, shards=1, user_files=False)


def test_if_exists_skip_takes_an_option_an_older_dataset_does_not_record_as_its_default(tmp_path):
    from pipeline.output_folder import option_differences

    settings = settings_for(tmp_path / "out", "--seed=7")
    recorded = settings.as_dict()
    del recorded["index_files"]  # a dataset made before the option existed: made without index files
    assert option_differences(recorded, settings) == []
    assert option_differences(recorded, settings_for(tmp_path / "out", "--seed=7", "--index_files")) == [
        "index_files: False -> True"]
    assert option_differences(settings.as_dict(), settings_for(tmp_path / "out")) == ["seed: 7 -> 42"]
