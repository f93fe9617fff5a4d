"""What the crash and output-safety tests share: a user's files in the output folder, run settings, a dataset check."""

from __future__ import annotations

import fnmatch
import json
import os
import re

from apache_beam.options.pipeline_options import PipelineOptions

from pipeline import verify
from pipeline.options import validate
from tests.conftest import REPO
from transforms.base.dataset_format import INFO_FILE, SHARD_NAME

HEX = "0123456789abcdef0123456789abcdef"
RUN = "20261130-120000-0123abcd"  # the id of the run that prepares the folder in these tests

# A user's own files in the output folder, several named like this tool's: every one must survive.
USER_FILES = {
    "notes.txt": "my notes",
    "train-notes.txt": "looks like a split's file",
    "train-00000-of-00001.tfrecord.bak": "a backup the user made",
    "my-train-00000-of-00001.tfrecord": "another tool's shard",
    "train-1-of-2.tfrecord": "not this tool's shard name",
    "labels.txt.orig": "the user's labels",
    ".notes.tmp-1": "an editor's temporary file",
    ".hidden": "hidden",
    "beam-temp-mine/keep.txt": "a folder named like Beam's",
    "beam-temp-train-notes/keep.txt": "not Beam's uuid",
    ".image-tfrecords-tmp-old/keep.txt": "named like this tool's temporary folder",
    "keep/train-00000-of-00001.tfrecord": "a shard in a subfolder: not this run's",
    "keep/image_tfrecords.json": "{}",
}


def write_files(folder, names) -> None:
    """Create `names` in `folder`: a user's file with its USER_FILES text, any other name as a leftover."""
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(USER_FILES.get(name, "leftover"))


def assert_user_files_intact(folder) -> None:
    """Every one of USER_FILES is still in `folder`, with its text."""
    for name, text in USER_FILES.items():
        assert (folder / name).read_text() == text, name


def settings_for(output_dir, *args):
    """The validated settings of a run that writes to `output_dir` (with `args`)."""
    return validate(PipelineOptions([f"--input_dir={REPO}", f"--output_dir={output_dir}", *args]))


def assert_complete(out, images: int, shards: int, user_files: bool = True) -> None:
    """A verified dataset of `images` records in `shards` shards per split, no stale file, user files intact."""
    report = verify.verify_dataset(str(out), decode=False)
    if not user_files:
        assert report.problems == []
        user_files = {}
    else:
        user_files = USER_FILES
    # The user's files that a shard glob reads are verify's problems (a reader that globs would read them), and
    # the only ones.
    strays = sorted(name for name in user_files if fnmatch.fnmatchcase(name, "train-*.tfrecord*"))
    assert [problem.split(": ")[0] for problem in report.problems] == strays
    assert all("the shard glob train-*.tfrecord* matches it" in problem for problem in report.problems)
    info = json.loads((out / INFO_FILE).read_text())
    assert info["files"]["written"] == images == sum(s["records"] for s in info["splits"].values())
    listed = {shard["file"] for split in info["splits"].values() for shard in split["shards"]}
    assert {name for name in os.listdir(out) if SHARD_NAME.fullmatch(name)} == listed
    assert all(name.endswith(f"-of-{shards:05d}.tfrecord") for name in listed)
    leftovers = [name for name in os.listdir(out) if name.startswith((".", "beam-temp-"))
                 and name not in {n.split("/")[0] for n in user_files}]
    assert leftovers == []
    if user_files:
        assert_user_files_intact(out)


class Stopped(RuntimeError):
    """The converter's stand-in for a crash: raised once enough chunks are done (`stop_after_chunks`)."""


def stop_after_chunks(monkeypatch, after: int) -> None:
    """Make the conversion raise Stopped once `after` chunks of the run have their done record
    (transforms/output/resume.py); undo with `monkeypatch.undo()` or the fixture's end."""
    from transforms.output import resume

    real = resume.write_done

    def write_done(run_folder, record, key):
        real(run_folder, record, key)
        names = os.listdir(os.path.join(run_folder, resume.DONE_DIR))
        if len([name for name in names if name.count(".") == 1]) >= after:
            raise Stopped(f"stopped after {after} chunks")

    monkeypatch.setattr(resume, "write_done", write_done)


def done_records(out, suffix: str = ".json") -> dict[str, dict]:
    """digest -> done record (or with suffix ".at.json", where its piece is in its shard's file), of every run
    folder left in `out`."""
    from transforms.base.dataset_format import TEMP_DIR
    from transforms.output import resume

    found = {}
    temp = out / TEMP_DIR
    for run in os.listdir(temp) if temp.is_dir() else ():
        done = temp / run / resume.DONE_DIR
        for name in os.listdir(done) if done.is_dir() else ():
            digest = name.removesuffix(suffix)
            if name.endswith(suffix) and "." not in digest:
                found[digest] = json.loads((done / name).read_text())
    return found


# What differs between two runs of the same dataset: when, which run, how fast; and the resume's own account.
RUN_FIELDS = {"created", "run_id", "elapsed_seconds", "images_per_second", "resumed", "sources", "tfds"}


def dataset_files(out) -> dict[str, bytes]:
    """Every file of the dataset but its sources files (named after their run), by name; the description without
    its run's own fields (RUN_FIELDS), and TFDS's dataset_info.json without the run it names."""
    files = {}
    for name in sorted(os.listdir(out)):
        if name.startswith("sources-") or not os.path.isfile(os.path.join(out, name)):
            continue
        with open(os.path.join(out, name), "rb") as f:
            data = f.read()
        if name == INFO_FILE:
            info = json.loads(data)
            data = json.dumps({k: v for k, v in info.items() if k not in RUN_FIELDS}, sort_keys=True).encode()
        if name == "dataset_info.json":  # TFDS's: it names the run in its description
            data = re.sub(rb"\(run [0-9a-f-]+\)", b"(run)", data)
        files[name] = data
    return files
