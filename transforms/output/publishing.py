"""Publishing: how a finished run's files replace the output folder's previous dataset, and how a stopped one ends.

The names themselves (the shards', the descriptions', the lock's) are in transforms/base/dataset_format.py; which
files of the output folder are this tool's, and the checks before any is changed, in ownership.py; the file
operations in files.py; the lock in lock.py.

Layout of --output_dir while a run is going on:

    .image-tfrecords.lock                     who is writing here (one run at a time)
    .image-tfrecords-tmp/<run id>/shards/     the run's shards, each written once under its standard name
    .image-tfrecords-tmp/<run id>/publish/    its descriptions and publishing.json, written before publishing
    <the previous complete dataset, if any>   untouched until this run has finished

A run's files take their final names only when it publishes them (`publish_dataset`),
after every shard is written and counted. Publishing claims its space first: every
description (errors.jsonl, labels.txt, TFDS's files, image_tfrecords.json) is written
in full into the run's folder, with the plan of the publishing, before the previous
dataset is touched. Then, in the window without a complete dataset, the old marker
goes, the files are renamed into place (under their Kaggle names with
--shard_names=kaggle), the old dataset's files that none replaced are deleted (as its
description lists them: `dataset_files`), and the new image_tfrecords.json, the
completion marker, comes last. A run stopped inside the window leaves its plan, and
the next run finishes it (`interrupted_publish`, `finish_publish`). (Format version 1
of this tool wrote its own description as dataset_info.json, the marker then:
`completion_marker` knows both.)

Every local path this tool deletes, moves or writes into below the output folder is
checked with lstat first (`ownership.check_own_path`): a link, a special file or another device
is refused (UnsafePath), so nothing outside --output_dir is ever changed.

Each run works in a folder of its own (its run id), and removes only that
folder: a second run, or a scheduler's retry, can never delete a running job's
temporary files.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable

from apache_beam.io.filesystems import FileSystems

from transforms.base.dataset_format import INFO_FILE, PUBLISH_DIR, PUBLISH_PLAN, TEMP_DIR
from transforms.base.paths import is_local, relative_to
from transforms.output.files import (
    delete_files,
    delete_tree,
    exists,
    list_folder,
    move_files,
    present,
    read_json,
    write_file,
)
from transforms.output.ownership import (
    UnsafePath,
    check_own_path,
    check_own_paths,
    check_own_tree,
    completion_marker,
    dataset_files,
    is_final_path,
    run_dir,
    shards_dir,
)

_LOG = logging.getLogger(__name__)


class ShardSizeMismatch(RuntimeError):
    """A shard's file in the run's folder does not hold the bytes its writer reported (its ShardInfo): the run
    publishes nothing."""


def check_shard_sizes(folder: str, sizes: dict[str, int]) -> None:
    """Each file of `sizes` (name in `folder` -> the bytes its writer reported) is there with that size: one
    listing of `folder`.

    Raises:
        ShardSizeMismatch: naming the first file that differs, and how many more.
    """
    listed = list_folder(folder)
    wrong = [(name, listed.get(FileSystems.join(folder, name)), size) for name, size in sorted(sizes.items())
             if listed.get(FileSystems.join(folder, name)) != size]
    if wrong:
        name, found, size = wrong[0]
        held = "is missing" if found is None else f"holds {found} bytes"
        raise ShardSizeMismatch(f"the shard file {name} in {folder} {held}, but its writer reported {size} bytes"
                                f"{f' (and {len(wrong) - 1} more shards differ)' if len(wrong) > 1 else ''}: "
                                "nothing was published, and the dataset already in --output_dir (if any) is "
                                "unchanged; run the same command again")


def publish_dataset(output_dir: str, run_id: str, shard_files: list, descriptions: dict,
                    sizes: dict[str, int] | None = None, renames: list | None = None,
                    keep: Iterable[str] = ()) -> None:
    """Replace the folder's previous dataset (if any) with this run's shards and `descriptions`.

    `shard_files` names every file of the run's shards folder to publish (the
    shards and their index files): a name, or a (name in the run's folder,
    final name) pair for a file whose final name differs (--shard_names=kaggle).
    `descriptions`: file name -> its lines (streamed), the completion marker INFO_FILE last.
    `sizes`: name in the run's shards folder -> the bytes its writer reported, checked first
    (`check_shard_sizes`: ShardSizeMismatch, and nothing published).
    `renames` (an append, `transforms.inputs.append`): (old final name, new final name) of the previous dataset's files
    that take new names (train-00000-of-00004 -> train-00000-of-00006), in the same window; `keep`: the final
    names of its files that stay as they are. Neither is deleted.

    1. The space is claimed first: every description is written in full into the
       run's folder (`publish/`), the marker last, while the previous dataset is
       untouched. A full disk fails here, and the previous dataset stays whole.
    2. The plan (what moves where, and which files of the previous dataset go, as
       its description lists them) is written there too: a retry of this step,
       or the next run after this one was killed, finishes publishing from it.
    3. The window without a complete dataset (`finish_publish`): the old marker
       goes, the files take their final names, the old dataset's files that no
       new file replaces are deleted, and the new marker comes last.
    """
    staging = FileSystems.join(run_dir(output_dir, run_id), PUBLISH_DIR)
    plan_path = FileSystems.join(staging, PUBLISH_PLAN)
    if is_local(output_dir):
        check_own_path(output_dir, staging, folder=True)
    plan = _publish_plan(output_dir, run_id, read_json(plan_path) if exists(plan_path) else None)
    if plan is None:  # the first attempt (a retry finds the plan of an earlier one)
        if sizes:
            check_shard_sizes(shards_dir(output_dir, run_id), sizes)
        for name, lines in descriptions.items():
            check_own_paths(output_dir, [FileSystems.join(staging, name)])
            write_file(FileSystems.join(staging, name), lines)
        pairs = [(entry, entry) if isinstance(entry, str) else tuple(entry) for entry in shard_files]
        source = shards_dir(output_dir, run_id)
        moves = [(FileSystems.join(source, temp), FileSystems.join(output_dir, final)) for temp, final in pairs]
        renamed = [(FileSystems.join(output_dir, old), FileSystems.join(output_dir, new))
                   for old, new in renames or () if old != new]
        moves = renamed + moves  # the old files first: no new name is an old one (see transforms.inputs.append)
        moves += [(FileSystems.join(staging, name), FileSystems.join(output_dir, name)) for name in descriptions]
        replaced = {dst for _, dst in moves} | {src for src, _ in renamed}
        replaced |= {FileSystems.join(output_dir, name) for name in keep}
        marker = completion_marker(output_dir)
        plan = {"run_id": run_id, "moves": [list(move) for move in moves], "old_marker": marker,
                "delete": [p for p in dataset_files(output_dir) if p not in replaced and p != marker]}
        check_own_paths(output_dir, [plan_path])
        write_file(plan_path, [json.dumps(plan) + "\n"])
        plan = _publish_plan(output_dir, run_id, plan)
    finish_publish(output_dir, plan)


def _publish_plan(output_dir: str, run_id: str, plan) -> dict | None:
    """`plan` (as read from a run's publish/ folder) if it is a valid plan of run `run_id`, else None.

    Only this tool's names may be in it: sources in that run's folder, destinations and deletions under a
    final name of this tool's in `output_dir`, the marker last; a plan that says anything else is not this
    tool's, and is never carried out.
    """
    if not isinstance(plan, dict) or plan.get("run_id") != run_id:
        return None
    mine = run_dir(output_dir, run_id) + "/"
    moves, delete, marker = plan.get("moves"), plan.get("delete"), plan.get("old_marker")
    valid = (isinstance(moves, list) and moves and isinstance(delete, list)
             and (marker is None or is_final_path(output_dir, marker))
             and all(isinstance(m, list) and len(m) == 2 and isinstance(m[0], str)
                     and (m[0].startswith(mine) or is_final_path(output_dir, m[0]))  # an append's renames
                     and ".." not in m[0].split("/") and is_final_path(output_dir, m[1]) for m in moves)
             and all(is_final_path(output_dir, path) for path in delete)
             and moves[-1][1] == FileSystems.join(output_dir, INFO_FILE))
    return plan if valid else None


def finish_publish(output_dir: str, plan: dict) -> None:
    """Carry out a publish plan (`publish_dataset`); a step already done is skipped.

    Inside the window there is nothing but the deletions and the renames (or copies): which files are there is
    found out before it opens, in one listing per folder.

    Raises:
        UnsafePath: before anything changes, when a path of the plan is not this tool's to act on.
    """
    moves, delete, old_marker = plan["moves"], plan["delete"], plan["old_marker"]
    *files, marker = moves
    every = [path for move in moves for path in move] + delete + ([old_marker] * bool(old_marker))
    check_own_paths(output_dir, every)
    found = present(every)
    # The window without a complete dataset opens: the old marker goes first, so that the folder is visibly
    # incomplete while its files change.
    if old_marker in found:
        FileSystems.delete([old_marker])
    move_files([(src, dst) for src, dst in files if src in found])
    # An append's old files that took new names: on gs:// a move is a copy, so their old names go now, before the
    # marker (locally the renames took them; the run's own files go with its folder, `remove_run_dir`).
    renamed = [src for src, _ in files if src in found and is_final_path(output_dir, src) and not is_local(src)]
    delete_files([path for path in delete if path in found] + renamed)
    move_files([marker])  # the window closes: the new dataset is complete


def interrupted_publish(output_dir: str) -> dict | None:
    """The publish plan of a run that was stopped inside its window (no marker, its plan written), if any.

    Call it only while holding the folder's lock: the plan's run has ended then.
    """
    if completion_marker(output_dir) is not None:
        return None
    temp = FileSystems.join(output_dir, TEMP_DIR)
    if is_local(output_dir):
        if not check_own_path(output_dir, temp, folder=True):
            return None
        with os.scandir(temp) as entries:
            runs = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    else:
        found = FileSystems.match([FileSystems.join(temp, "*", PUBLISH_DIR, PUBLISH_PLAN)])[0].metadata_list
        runs = sorted({relative_to(m.path, temp).split("/")[0] for m in found})
    for run_id in reversed(runs):  # run ids sort by their start time: the latest first
        path = FileSystems.join(run_dir(output_dir, run_id), PUBLISH_DIR, PUBLISH_PLAN)
        check_own_paths(output_dir, [path])
        plan = _publish_plan(output_dir, run_id, read_json(path) if exists(path) else None)
        if plan is not None and exists(plan["moves"][-1][0]):
            return plan
    return None


def remove_run_dir(output_dir: str, run_id: str) -> None:
    """Delete a run's temporary folder, and the folder of all runs' when it is left empty.

    One that holds what this tool never makes (a link, a FIFO, a mount point) is left in place, with a
    warning: the run itself is done.
    """
    folder = run_dir(output_dir, run_id)
    try:
        if not is_local(folder) or check_own_tree(output_dir, folder):  # a missing one is fine
            delete_tree(folder)
    except UnsafePath as e:
        _LOG.warning("Left this run's temporary folder in place: %s", e)
        return
    if is_local(output_dir):
        try:
            os.rmdir(os.path.join(output_dir, TEMP_DIR))  # a link is never removed: rmdir refuses it
        except OSError:
            pass  # another run's folder (a leftover, or being deleted) is in it
