"""Nothing outside --output_dir is ever touched, only the tool's own files go, and publishing claims its space first.

Hostile output folders: a temporary folder linked elsewhere (another user can plant one in a shared,
group-writable datasets folder), links and FIFOs among the leftovers, another device, a full disk while
publishing, a kill inside publishing, user files named like this tool's. Every case has a time limit; the
runs as a user makes them are memory-limited subprocesses (tests/hostile_files.bounded_cli).
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile

import pytest
from apache_beam.io.filesystems import FileSystems

from pipeline import verify
from pipeline.cli import main_of
from pipeline.errors import UserError
from pipeline.launcher import run
from pipeline.output_folder import prepare_output
from pipeline.sample_data import generate_dataset
from tests.conftest import FAST, REPO, convert
from tests.crash_helpers import (
    HEX,
    RUN,
    USER_FILES,
    assert_complete,
    assert_user_files_intact,
    settings_for,
    write_files,
)
from tests.error_lines import error_line, full_disk_line
from tests.hostile_files import bounded_cli
from transforms.base.dataset_format import DESCRIPTION_FILES, ERRORS_FILE, INFO_FILE, LOCK_FILE, TEMP_DIR

DEAD_RUN = "20261129-230000-89abcdef"  # an interrupted run's folder in .image-tfrecords-tmp/
# A folder outside --output_dir: nothing in it may ever change.
PRECIOUS = {"a.txt": "mine", "sub/b.txt": "also mine", f"{DEAD_RUN}/shards/train-00000-of-00001.tfrecord": "mine"}


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("safety") / "in"
    generate_dataset(str(root), images_per_class=4, seed=3, min_side=24, max_side=40)
    return root


def precious(folder):
    for name, text in PRECIOUS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def snapshot(folder) -> dict:
    """Every entry below `folder` (links not followed): relative path -> bytes, or 'dir', 'special' or
    'link -> target'."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if os.path.islink(path):
                found[rel] = "link -> " + os.readlink(path)
            elif os.path.isdir(path):
                found[rel] = "dir"
            elif not os.path.isfile(path):
                found[rel] = "special"  # a FIFO: never opened
            else:
                with open(path, "rb") as f:
                    found[rel] = f.read()
    return found


def refusal(path, what: str) -> str:
    return (f"{path} is {what}, which this tool never makes, so it stopped before changing anything (it acts only "
            "on its own files and folders inside --output_dir): remove or move it out of the output folder and run "
            "again")


def shard_names(out) -> set[str]:
    info = json.loads((out / INFO_FILE).read_text())
    return {s["file"] for split in info["splits"].values() for s in split["shards"]}


def dataset_bytes(out) -> dict:
    """The complete dataset's files (as its description lists them, and the descriptions) -> bytes."""
    names = shard_names(out) | set(DESCRIPTION_FILES)
    return {name: (out / name).read_bytes() for name in sorted(names) if (out / name).exists()}


# --- 1. a link or another device among the paths the tool acts on -----------------------------------------


@pytest.mark.timeout(300)
def test_a_linked_temporary_folder_is_refused_as_a_user_runs_it(small_tree, tmp_path):
    """The issue's reproduction: `ln -s ~/precious out/.image-tfrecords-tmp; echo '{}' > out/errors.jsonl`."""
    target = precious(tmp_path / "precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / TEMP_DIR).symlink_to(target)
    (out / ERRORS_FILE).write_text("{}\n")
    before = snapshot(target)

    result = bounded_cli(f"--input_dir={small_tree}", f"--output_dir={out}", "--image_size=16", "--quiet")

    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"error: {refusal(out / TEMP_DIR, 'a symbolic link')}"]
    assert snapshot(target) == before
    assert sorted(os.listdir(out)) == [TEMP_DIR, ERRORS_FILE]  # the lock went back; nothing else changed


def _link_to_folder(out, target):
    (out / TEMP_DIR).symlink_to(target)
    return out / TEMP_DIR, "a symbolic link"


def _link_to_file(out, target):
    (out / TEMP_DIR).symlink_to(target / "a.txt")
    return out / TEMP_DIR, "a symbolic link"


def _file_instead_of_folder(out, target):
    (out / TEMP_DIR).write_text("not a folder")
    return out / TEMP_DIR, "a regular file where this tool keeps a folder"


def _linked_run_folder(out, target):
    (out / TEMP_DIR).mkdir()
    (out / TEMP_DIR / DEAD_RUN).symlink_to(target / DEAD_RUN)
    return out / TEMP_DIR / DEAD_RUN, "a symbolic link"


def _linked_leftover_shard(out, target):
    (out / f"beam-temp-train-{HEX}").mkdir()
    (out / f"beam-temp-train-{HEX}" / "a.train.tfrecord").symlink_to(target / "a.txt")
    return out / f"beam-temp-train-{HEX}" / "a.train.tfrecord", "a symbolic link"


def _fifo_among_leftovers(out, target):
    (out / TEMP_DIR / DEAD_RUN).mkdir(parents=True)
    os.mkfifo(out / TEMP_DIR / DEAD_RUN / "pipe")
    return out / TEMP_DIR / DEAD_RUN / "pipe", "not a regular file or folder"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plant", [_link_to_folder, _link_to_file, _file_instead_of_folder, _linked_run_folder,
                                   _linked_leftover_shard, _fifo_among_leftovers], ids=lambda f: f.__name__[1:])
def test_a_path_the_tool_would_act_on_that_it_did_not_make_is_refused(small_tree, tmp_path, plant):
    target = precious(tmp_path / "precious")
    out = tmp_path / "out"
    write_files(out, [*USER_FILES, f".{ERRORS_FILE}.tmp-{HEX}"])  # a leftover: an interrupted run's temporary file
    path, what = plant(out, target)
    before, in_out = snapshot(target), snapshot(out)

    message = error_line(f"--input_dir={small_tree}", f"--output_dir={out}", "--image_size=16", "--quiet", *FAST)

    assert message == refusal(path, what)
    assert snapshot(target) == before
    assert snapshot(out) == in_out  # nothing changed in the output folder either


@pytest.mark.timeout(300)
def test_overwrite_with_the_temporary_folder_linked_to_another_device_keeps_the_old_dataset(small_tree, tmp_path):
    """The issue's cross-device variant: the old description went, then a rename across devices crashed."""
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no /dev/shm on another device than the temporary folder")
    out = tmp_path / "out"
    assert convert(small_tree, out, "--image_size=16") == 0
    before = dataset_bytes(out)
    with tempfile.TemporaryDirectory(dir=shm) as name:
        elsewhere = precious(pathlib.Path(name))
        (out / TEMP_DIR).symlink_to(elsewhere)
        held = snapshot(elsewhere)
        result = bounded_cli(f"--input_dir={small_tree}", f"--output_dir={out}", "--image_size=24", "--overwrite",
                             "--quiet")
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [f"error: {refusal(out / TEMP_DIR, 'a symbolic link')}"]
        assert snapshot(elsewhere) == held
    assert dataset_bytes(out) == before
    assert verify.verify_dataset(str(out), decode=False).problems == []


@pytest.mark.timeout(60)
def test_a_mount_point_among_the_leftovers_is_refused_and_kept(tmp_path, monkeypatch):
    """Another device below the output folder (simulated: lstat reports another st_dev for it)."""
    out = tmp_path / "out"
    mounted = out / TEMP_DIR / DEAD_RUN
    write_files(out, [ERRORS_FILE, f"{TEMP_DIR}/{DEAD_RUN}/shards/train-00000-of-00001.tfrecord"])
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):
        found = real_lstat(path, *args, **kwargs)
        if os.fspath(path).startswith(str(mounted)):
            return os.stat_result((*tuple(found)[:2], found.st_dev + 1, *tuple(found)[3:10]))
        return found

    before = snapshot(out)
    with monkeypatch.context() as patch:
        patch.setattr(os, "lstat", lstat)
        with pytest.raises(UserError) as refused:
            prepare_output(settings_for(out), RUN, background=True)
    assert str(refused.value) == refusal(mounted, "on another device than --output_dir (a mount point)")
    assert snapshot(out) == before


@pytest.mark.timeout(300)
def test_a_temporary_folder_swapped_for_a_link_during_the_run_is_refused_when_publishing(small_tree, tmp_path,
                                                                                        monkeypatch, capsys):
    """The last step checks again: a link planted while the job ran is not published through."""
    import transforms.output.describe

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    publish = transforms.output.describe.publish_dataset
    swapped = {}

    def swap_then_publish(*args, **kwargs):
        os.rename(out / TEMP_DIR, elsewhere)
        (out / TEMP_DIR).symlink_to(elsewhere)
        swapped["before"] = snapshot(elsewhere)
        return publish(*args, **kwargs)

    monkeypatch.setattr(transforms.output.describe, "publish_dataset", swap_then_publish)
    code = main_of(run, [f"--input_dir={small_tree}", f"--output_dir={out}", "--image_size=16", "--quiet", *FAST])

    assert code == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {refusal(out / TEMP_DIR, 'a symbolic link')}"]
    assert snapshot(elsewhere) == swapped["before"]  # nothing moved out of it, nothing deleted
    assert sorted(os.listdir(out)) == [TEMP_DIR]  # no shard took a final name; the lock went back


# --- 4. a full disk while publishing ----------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_full_disk_while_publishing_over_a_dataset_leaves_it_whole_and_says_so(small_tree, tmp_path, monkeypatch,
                                                                                  capsys):
    """Writing the new errors.jsonl fails with ENOSPC (deleting the old files would have freed nothing)."""
    out = tmp_path / "out"
    assert convert(small_tree, out, "--image_size=16") == 0
    before = dataset_bytes(out)
    real_create = FileSystems.create

    def create(path, *args, **kwargs):
        if os.path.basename(path).lstrip(".").startswith(ERRORS_FILE):  # errors.jsonl, or its temporary name
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_create(path, *args, **kwargs)

    monkeypatch.setattr(FileSystems, "create", create)
    code = main_of(run, [f"--input_dir={small_tree}", f"--output_dir={out}", "--image_size=24", "--overwrite",
                         "--quiet", *FAST])

    assert code == 1
    assert capsys.readouterr().err.splitlines() == [
        full_disk_line(out, "the dataset already in --output_dir is unchanged")]
    assert dataset_bytes(out) == before
    assert verify.verify_dataset(str(out), decode=True).problems == []
    assert not (out / LOCK_FILE).exists()


# --- 18. --overwrite deletes only the files the old description lists -------------------------------------

# Named like this tool's files, but not listed by the dataset's image_tfrecords.json: a user's, to keep.
LOOKALIKES = {
    "train00-100.tfrec": "a Kaggle-named shard of another dataset",
    "validation01-3.tfrec.gz": "another one",
    "test-00000-of-00003.array_record": "an ArrayRecord file of the user's",
    "train-00000-of-00009.idx": "an index the user made with tfrecord2idx",
    "train00-100.idx": "another index",
    "train-00003-of-00009.tfrecord": "a shard of another run, kept by hand",
}


@pytest.mark.timeout(300)
def test_overwrite_deletes_only_the_files_the_old_description_lists(small_tree, tmp_path):
    out = tmp_path / "out"
    assert convert(small_tree, out, "--image_size=16", "--num_shards=train=2,validation=1") == 0
    old_shards = shard_names(out)
    for name, text in LOOKALIKES.items():
        (out / name).write_text(text)

    assert convert(small_tree, out, "--image_size=24", "--num_shards=1", "--overwrite") == 0

    for name, text in LOOKALIKES.items():
        assert (out / name).read_text() == text, name
    assert not (old_shards - shard_names(out)) & set(os.listdir(out))  # the old dataset's own shards went
    assert json.loads((out / INFO_FILE).read_text())["image"]["height"] == 24


def _expand(pattern: str) -> list[str]:
    """The names a pattern of docs/guarantees.md stands for: {a,b} each, [x] with and without, N digits."""
    brace = re.search(r"\{([^}]*)\}", pattern)
    if brace:
        return [name for alt in brace.group(1).split(",")
                for name in _expand(pattern[:brace.start()] + alt + pattern[brace.end():])]
    optional = re.search(r"\[([^]]*)\]", pattern)
    if optional:
        return [name for part in ("", optional.group(1))
                for name in _expand(pattern[:optional.start()] + part + pattern[optional.end():])]
    name = pattern.replace("<32 hex digits>", HEX).replace("NNNNN", "00002").replace("NN", "01").replace("N", "7")
    return [name + "x.json" if name.endswith("/") else name]


def _documented(item: str, descriptions: list[str]) -> list[str]:
    """Every name the backquoted patterns of `item` (a part of docs/guarantees.md) stand for."""
    names = list(descriptions) if "the description files above" in item else []
    for pattern in re.findall(r"`([^`]+)`", item):
        if pattern == ".image-tfrecords-tmp/":
            names += [f"{TEMP_DIR}/{DEAD_RUN}/shards/a.tfrecord", f"{TEMP_DIR}/notes.txt"]
        elif "<description>" in pattern:
            names += [n for d in descriptions if d.endswith((".json", ".txt", ".jsonl"))
                      for n in _expand(pattern.replace("<description>", d))]
        elif not pattern.startswith("--"):
            names += _expand(pattern.replace("<run id>", DEAD_RUN))
    return names


def documented_names() -> tuple[list[str], list[str]]:
    """docs/guarantees.md's list of the tool's own files: (the leftovers a rerun deletes, the final names it never
    deletes in a folder without a dataset)."""
    text = open(os.path.join(REPO, "docs", "guarantees.md")).read()
    descriptions = re.findall(r"`([^`]+)`", text.split("- by `--overwrite`", 1)[1].split("\n  - ", 1)[0])
    item = text.split("- leftovers of interrupted runs, in any folder, by name:", 1)[1].split("\n\n", 1)[0]
    finals = text.split("Those names, by pattern:", 1)[1].split("A shard, index or description file among them", 1)[0]
    return _documented(item, descriptions), _documented(finals, descriptions)


@pytest.mark.timeout(60)
def test_the_documented_list_of_the_tools_own_files_is_what_a_rerun_deletes(tmp_path):
    """docs/guarantees.md's leftovers, and only they, are removed from a folder with or without a dataset."""
    names, finals = documented_names()
    assert f".labels.txt.tmp-{HEX}" in names and f"{TEMP_DIR}/{DEAD_RUN}/shards/a.tfrecord" in names
    assert set(DESCRIPTION_FILES) <= set(finals) and len(finals) > 30 and "train01-7.tfrec.gz" in finals
    names = sorted(set(names))
    out = tmp_path / "out"
    write_files(out, [*USER_FILES, *names])
    removed = prepare_output(settings_for(out), RUN).paths
    assert sorted(os.path.relpath(p, out) for p in removed) == names
    assert_user_files_intact(out)
    write_files(out, [*names, INFO_FILE])  # with a complete dataset: the same (its own files go when one publishes)
    removed = prepare_output(settings_for(out), RUN).paths
    assert sorted(os.path.relpath(p, out) for p in removed) == names


@pytest.mark.timeout(60)
def test_the_documented_final_names_are_never_deleted_from_a_folder_without_a_dataset(tmp_path):
    """Each of docs/guarantees.md's final names, alone in a folder without a dataset, stops the run (a sources file
    is left with a warning); nothing in the folder changes."""
    _, finals = documented_names()
    for name in sorted(set(finals) - {INFO_FILE}):  # the marker would make the folder a complete dataset
        out = tmp_path / name.replace(".", "_")
        write_files(out, [*USER_FILES, name])
        before = snapshot(out)
        if name.startswith("sources-"):
            prepare_output(settings_for(out), RUN)
            assert (out / name).read_text() == "leftover"
        else:
            with pytest.raises(UserError, match=re.escape(f"but 1 file(s) named as this run names its own ({name})")):
                prepare_output(settings_for(out), RUN)
            assert snapshot(out) == before, name


# --- 19. a kill inside publishing ---------------------------------------------------------------------------


def killed_run(*args, env: dict) -> subprocess.CompletedProcess:
    """The converter as a user runs it (one in-process worker), killed with SIGKILL where $KILL_AT says."""
    return subprocess.run([sys.executable, "-m", "tests.killed_publish_main", *args, *FAST, "--quiet"], cwd=REPO,
                          capture_output=True, text=True, timeout=240, env=dict(os.environ, **env))


@pytest.mark.timeout(600)
def test_a_kill_before_the_window_leaves_the_old_dataset_whole(small_tree, tmp_path):
    """Killed while it writes the new descriptions: nothing of the old dataset has changed."""
    out = tmp_path / "out"
    assert convert(small_tree, out, "--image_size=16", "--num_shards=train=2,validation=1") == 0
    before = dataset_bytes(out)
    killed = killed_run(f"--input_dir={small_tree}", f"--output_dir={out}", "--image_size=24", "--num_shards=1",
                        "--overwrite", env={"KILL_AT": "create:" + ERRORS_FILE})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert dataset_bytes(out) == before
    assert verify.verify_dataset(str(out), decode=True).problems == []


@pytest.mark.timeout(600)
def test_a_kill_inside_the_window_is_finished_by_the_next_run(small_tree, tmp_path, capsys):
    """Killed after the old marker went and some files took their names: the next run publishes the rest."""
    out = tmp_path / "out"
    assert convert(small_tree, out, "--image_size=16", "--num_shards=train=3,validation=2") == 0
    write_files(out, USER_FILES)
    args = [f"--input_dir={small_tree}", f"--output_dir={out}", "--image_size=24", "--num_shards=1"]
    killed = killed_run(*args, "--overwrite", env={"KILL_AT": "rename:2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / INFO_FILE).exists()  # inside the window

    # The same options again (a scheduler's retry, without --overwrite): the publishing is finished, not redone.
    assert main_of(lambda argv: convert(small_tree, out, *argv[1:]), ["", *args[2:]]) == 0
    said = capsys.readouterr().out
    assert "was stopped while it published its dataset" in said and "nothing more to do" in said
    assert json.loads((out / INFO_FILE).read_text())["image"]["height"] == 24
    assert_complete(out, images=16, shards=1)  # verified, the old run's shards gone, the user's files intact
    assert not (out / TEMP_DIR).exists() and not (out / LOCK_FILE).exists()


@pytest.mark.timeout(300)
def test_on_gcs_publishing_replaces_only_the_listed_files_and_a_stopped_one_is_finished(gcs_emulator, monkeypatch):
    """On gs:// (the emulator): the old dataset's listed files go, a lookalike stays; stopped just before the
    marker, the plan left behind is found and carried out."""
    from transforms.output import ownership, publishing

    bucket = "publish-window"
    gcs_emulator.create_bucket(bucket)
    out = f"gs://{bucket}/out"
    old_shards = [{"file": f"train-0000{i}-of-00003.tfrecord"} for i in range(3)]
    old = {"files": {}, "splits": {"train": {"shards": old_shards}}}
    for shard in old["splits"]["train"]["shards"]:
        gcs_emulator.write(f"{out}/{shard['file']}", b"old")
    gcs_emulator.write(f"{out}/{INFO_FILE}", json.dumps(old))
    gcs_emulator.write(f"{out}/train00-100.tfrec", b"the user's")
    new_shards = ["train-00000-of-00001.tfrecord"]
    gcs_emulator.write(f"{ownership.shards_dir(out, RUN)}/{new_shards[0]}", b"new")
    new = {"files": {}, "splits": {"train": {"shards": [{"file": new_shards[0]}]}}}
    descriptions = {ERRORS_FILE: ["\n"], "labels.txt": ["cat\n"], INFO_FILE: [json.dumps(new)]}
    real_move = publishing.move_files

    def stopped_at_the_marker(moves):
        if moves and moves[-1][1].endswith("/" + INFO_FILE):
            raise KeyboardInterrupt("stopped")
        real_move(moves)

    with monkeypatch.context() as patch:
        patch.setattr(publishing, "move_files", stopped_at_the_marker)
        with pytest.raises(KeyboardInterrupt):
            publishing.publish_dataset(out, RUN, new_shards, descriptions)
    assert ownership.completion_marker(out) is None  # inside the window
    plan = publishing.interrupted_publish(out)
    assert plan is not None and plan["run_id"] == RUN
    publishing.finish_publish(out, plan)

    assert json.loads(gcs_emulator.read(f"{out}/{INFO_FILE}")) == new
    names = set(gcs_emulator.list_names(out))
    assert {"train-00000-of-00001.tfrecord", "train00-100.tfrec", ERRORS_FILE, "labels.txt", INFO_FILE} <= names
    assert not {"train-00001-of-00003.tfrecord", "train-00002-of-00003.tfrecord"} & names
    assert gcs_emulator.read(f"{out}/train-00000-of-00001.tfrecord") == b"new"
