"""The output folder: every name this tool writes there, its lock, and how a finished run publishes its files.

Layout of --output_dir while a run is going on:

    .image-tfrecords.lock                     who is writing here (one run at a time)
    .image-tfrecords-tmp/<run id>/shards/     the run's shards, each written once under its standard name
    <the previous complete dataset, if any>   untouched until this run has finished

A run's files take their final names only when it publishes them, after every
shard is written and counted: the previous dataset's files are removed, the new
shards renamed into place (under their Kaggle names with --shard_names=kaggle),
then errors.jsonl, labels.txt, TFDS's files (label.labels.txt, features.json,
dataset_info.json) and, last, image_tfrecords.json, the completion marker. A
folder without image_tfrecords.json therefore never holds a file named like a
shard of a complete run, and `--overwrite` never loses the old dataset before the
new one is complete. (Format version 1 of this tool wrote its own description as
dataset_info.json, the marker then: `completion_marker` knows both.)

Each run works in a folder of its own (its run id), and removes only that
folder: a second run, or a scheduler's retry, can never delete a running job's
temporary files.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid

from apache_beam.io.filesystems import FileSystems

from transforms import bounded, tfds_metadata
from transforms.examples import SCHEMAS
from transforms.layout import SPLITS
from transforms.listing import is_local

# This tool's description of the dataset (counts, shards, options), the completion marker: written last.
INFO_FILE = "image_tfrecords.json"
LABELS_FILE = "labels.txt"
ERRORS_FILE = "errors.jsonl"
# TensorFlow Datasets' files (transforms/tfds_metadata.py), so that tfds.builder_from_directory loads the folder.
TFDS_INFO_FILE = tfds_metadata.TFDS_INFO_FILE
FEATURES_FILE = tfds_metadata.TFDS_FEATURES_FILE
TFDS_LABELS_FILES = tuple(sorted({tfds_metadata.labels_file(schema) for schema in SCHEMAS}))
# Format version 1's description, under TFDS's name: a folder holding one is a complete dataset of that version.
LEGACY_INFO_FILE = "dataset_info.json"
# In the order they are published.
DESCRIPTION_FILES = (ERRORS_FILE, LABELS_FILE, *TFDS_LABELS_FILES, FEATURES_FILE, TFDS_INFO_FILE, INFO_FILE)

# Everything temporary lives in this one folder, which this tool alone writes.
TEMP_DIR = ".image-tfrecords-tmp"
LOCK_FILE = ".image-tfrecords.lock"

_SPLITS = "|".join(SPLITS)
SHARD_NAME = re.compile(r"(?P<split>" + _SPLITS + r")-(?P<index>\d{5,})-of-(?P<count>\d{5,})"
                        r"\.(?:tfrecord(?:\.gz)?|array_record)")
# --shard_names=kaggle: the shard's index and record count, as Kaggle's notebooks count them (train00-2071.tfrec).
KAGGLE_NAME = re.compile(r"(?P<split>" + _SPLITS + r")(?P<index>\d{2,})-(?P<records>\d+)"
                         r"\.(?:tfrec(?:\.gz)?|array_record)")
# --index_files: a shard's index for DALI and the tfrecord package, beside it (train-00000-of-00004.idx,
# train00-2071.idx).
INDEX_NAME = re.compile(r"(?:" + _SPLITS + r")(?:-\d{5,}-of-\d{5,}|\d{2,}-\d+)\.idx")
_DESCRIPTIONS = "|".join(re.escape(name) for name in DESCRIPTION_FILES)
# Beam's temporary folders of earlier versions of this tool, which wrote next to the shards.
_BEAM_TEMP_DIR = r"beam-temp-(?:" + _SPLITS + "|" + re.escape(os.path.splitext(ERRORS_FILE)[0]) + r")-[0-9a-f]{32}"
BEAM_TEMP_DIR = re.compile(_BEAM_TEMP_DIR)
# The final names of a run's files: replaced when a new run publishes.
_FINAL_NAME = re.compile(re.sub(r"\?P<\w+>", "?:", "|".join([SHARD_NAME.pattern, KAGGLE_NAME.pattern,
                                                             INDEX_NAME.pattern, _DESCRIPTIONS])))
# Every name this tool writes, relative to --output_dir, except the lock. Nothing else there is ever
# removed, also not names that merely look alike (train-notes.txt, beam-temp-mine/, .notes.tmp-1).
_OWN_NAME = re.compile(
    "|".join(
        [
            _FINAL_NAME.pattern,
            r"\.(?:" + _DESCRIPTIONS + r")\.tmp-[0-9a-f]{32}",  # describe.write_lines' temporary names
            _BEAM_TEMP_DIR + r"/.+",
            re.escape(TEMP_DIR) + r"/.+",  # runs' temporary folders
        ]
    )
)


def new_run_id() -> str:
    """A run's id: the UTC time (readable in listings) and 8 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def relative_to(path: str, folder: str) -> str:
    return path[len(folder.rstrip("/")):].lstrip("/")


def index_name(shard_file: str) -> str:
    """The index file of a shard: its name without .tfrecord (or .tfrec), plus .idx (train-00000-of-00004.idx).

    Not `<shard>.tfrecord.idx`: the shard glob `train-*.tfrecord*` would read it as a shard.
    """
    stem = shard_file
    for suffix in (".tfrecord", ".tfrec"):
        if shard_file.endswith(suffix):
            stem = shard_file[:-len(suffix)]
            break
    return stem + ".idx"


def run_dir(output_dir: str, run_id: str) -> str:
    """The temporary folder of one run."""
    return FileSystems.join(output_dir, TEMP_DIR, run_id)


def shards_dir(output_dir: str, run_id: str) -> str:
    return FileSystems.join(run_dir(output_dir, run_id), "shards")


def _all_files(folder: str) -> list[str]:
    """Every file below `folder`: local folders by walking them, others through FileSystems."""
    if is_local(folder):
        found = []
        for root, dirs, files in os.walk(folder):
            found.extend(os.path.join(root, name) for name in files)
            # Links to folders are listed, not followed: they are never this tool's.
            found.extend(os.path.join(root, d) for d in dirs if os.path.islink(os.path.join(root, d)))
        return found
    pattern = FileSystems.join(folder, "**")
    return [m.path for m in FileSystems.match([pattern])[0].metadata_list]


def own_outputs(output_dir: str) -> list[str]:
    """Paths in `output_dir` that this tool writes (final files, descriptions, temporary files and folders)."""
    return sorted(p for p in _all_files(output_dir) if _OWN_NAME.fullmatch(relative_to(p, output_dir)))


def final_outputs(output_dir: str) -> list[str]:
    """The files of a complete dataset in `output_dir` (shards and descriptions), as a run publishes them."""
    if is_local(output_dir):
        if not os.path.isdir(output_dir):
            return []
        names = [n for n in os.listdir(output_dir) if os.path.isfile(os.path.join(output_dir, n))]
        return sorted(os.path.join(output_dir, n) for n in names if _FINAL_NAME.fullmatch(n))
    pattern = FileSystems.join(output_dir, "*")
    found = FileSystems.match([pattern])[0].metadata_list
    return sorted(m.path for m in found if _FINAL_NAME.fullmatch(relative_to(m.path, output_dir)))


def delete_tree(folder: str) -> None:
    """Delete `folder` and everything below it (local or gs://); a missing folder is fine."""
    if is_local(folder):
        shutil.rmtree(folder, ignore_errors=True)
        return
    paths = [m.path for m in FileSystems.match([FileSystems.join(folder, "**")])[0].metadata_list]
    if paths:
        FileSystems.delete(paths)


def remove_run_dir(output_dir: str, run_id: str) -> None:
    """Delete a run's temporary folder, and the folder of all runs' when it is left empty."""
    delete_tree(run_dir(output_dir, run_id))
    if is_local(output_dir):
        try:
            os.rmdir(os.path.join(output_dir, TEMP_DIR))
        except OSError:
            pass  # another run's folder (a leftover, or being deleted) is in it


def _read_json(path: str):
    try:
        with FileSystems.open(path, compression_type="uncompressed") as f:
            return bounded.loads(f.read().decode("utf-8"))
    except Exception:  # none there, or not readable
        return None


def completion_marker(output_dir: str) -> str | None:
    """The file that marks `output_dir`'s dataset complete, None when there is none.

    image_tfrecords.json; or, for a dataset of format version 1, its dataset_info.json (this
    tool's format, with a format_version, not TFDS's).
    """
    marker = FileSystems.join(output_dir, INFO_FILE)
    if FileSystems.exists(marker):
        return marker
    legacy = FileSystems.join(output_dir, LEGACY_INFO_FILE)
    if FileSystems.exists(legacy):
        info = _read_json(legacy)
        if isinstance(info, dict) and "format_version" in info:
            return legacy
    return None


def publish_shards(output_dir: str, run_id: str, shard_files: list) -> None:
    """Replace the folder's previous dataset with this run's shards; the descriptions follow, by the caller.

    `shard_files` names every file of the run's shards folder to publish (the
    shards and their index files): a name, or a (name in the run's folder,
    final name) pair for a file whose final name differs (--shard_names=kaggle).
    Each file is renamed once, from the run's folder to its final name.

    The completion marker goes first (image_tfrecords.json, or an earlier version's
    dataset_info.json), so that from here until the caller writes the new one, the
    folder is visibly incomplete.
    """
    pairs = [(entry, entry) if isinstance(entry, str) else tuple(entry) for entry in shard_files]
    for name in (INFO_FILE, LEGACY_INFO_FILE):
        marker = FileSystems.join(output_dir, name)
        if FileSystems.exists(marker):
            FileSystems.delete([marker])
    new = {final for _, final in pairs}
    old = [p for p in final_outputs(output_dir) if relative_to(p, output_dir) not in new]
    if old:
        FileSystems.delete(old)
    source = shards_dir(output_dir, run_id)
    # A retried attempt of this step finds the files an earlier attempt renamed already in place.
    moves = [(FileSystems.join(source, temp), FileSystems.join(output_dir, final)) for temp, final in pairs]
    moves = [(src, dst) for src, dst in moves if FileSystems.exists(src) or not FileSystems.exists(dst)]
    if moves:
        FileSystems.rename([src for src, _ in moves], [dst for _, dst in moves])
