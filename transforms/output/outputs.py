"""The output folder: which of its files are this tool's, and how a finished run publishes its files.

The names themselves (the shards', the descriptions', the lock's) are in transforms/base/dataset_format.py.

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
checked with lstat first (`check_own_path`): a link, a special file or another device
is refused (UnsafePath), so nothing outside --output_dir is ever changed.

Each run works in a folder of its own (its run id), and removes only that
folder: a second run, or a scheduler's retry, can never delete a running job's
temporary files.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from apache_beam.io.filesystems import FileSystems

from transforms.base import bounded
from transforms.base.dataset_format import (
    DESCRIPTION_FILES,
    ERRORS_FILE,
    INDEX_NAME,
    INFO_FILE,
    KAGGLE_NAME,
    LEGACY_INFO_FILE,
    PUBLISH_DIR,
    PUBLISH_PLAN,
    SHARD_NAME,
    SOURCES_NAME,
    SPLITS,
    TEMP_DIR,
    is_legacy_description,
    is_shard_name,
)
from transforms.base.paths import is_local, relative_to
from transforms.inputs.listing import gcs_client

_LOG = logging.getLogger(__name__)

# Publishing on gs:// (copies, deletions): Cloud Storage's batches of at most 100 operations, up to 64 of them at
# once, as Beam's FileBasedSink finalizes with up to 64 rename threads.
GCS_BATCH = 100
PUBLISH_THREADS = 64

_SPLITS = "|".join(SPLITS)
_DESCRIPTIONS = "|".join(re.escape(name) for name in DESCRIPTION_FILES)
# Beam's temporary folders of earlier versions of this tool, which wrote next to the shards.
_BEAM_TEMP_DIR = r"beam-temp-(?:" + _SPLITS + "|" + re.escape(os.path.splitext(ERRORS_FILE)[0]) + r")-[0-9a-f]{32}"
BEAM_TEMP_DIR = re.compile(_BEAM_TEMP_DIR)
# The final names of a run's files: replaced when a new run publishes.
_FINAL_NAME = re.compile(re.sub(r"\?P<\w+>", "?:", "|".join([SHARD_NAME.pattern, KAGGLE_NAME.pattern,
                                                             INDEX_NAME.pattern, SOURCES_NAME.pattern,
                                                             _DESCRIPTIONS])))
# Every name this tool writes, relative to --output_dir, except the lock. Nothing else there is ever
# removed, also not names that merely look alike (train-notes.txt, beam-temp-mine/, .notes.tmp-1).
_OWN_NAME = re.compile(
    "|".join(
        [
            _FINAL_NAME.pattern,
            r"\.(?:" + _DESCRIPTIONS + r")\.tmp-[0-9a-f]{32}",  # the temporary names of older versions' descriptions
            _BEAM_TEMP_DIR + r"/.+",
            re.escape(TEMP_DIR) + r"/.+",  # runs' temporary folders
        ]
    )
)


def new_run_id() -> str:
    """A run's id: the UTC time (readable in listings) and 8 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def run_dir(output_dir: str, run_id: str) -> str:
    """The temporary folder of one run."""
    return FileSystems.join(output_dir, TEMP_DIR, run_id)


def shards_dir(output_dir: str, run_id: str) -> str:
    return FileSystems.join(run_dir(output_dir, run_id), "shards")


class UnsafePath(RuntimeError):
    """A path under the output folder that this tool would delete, move or write into is not one it made.

    A symbolic link, something that is not a regular file or folder, or a folder on another device (a mount
    point): acting on it could change files outside --output_dir.
    """


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


def _refuse(path: str, what: str) -> UnsafePath:
    return UnsafePath(f"{path} is {what}, which this tool never makes, so it stopped before changing anything "
                      "(it acts only on its own files and folders inside --output_dir): remove or move it out of "
                      "the output folder and run again")


def check_own_path(output_dir: str, path: str, folder: bool | None = None) -> bool:
    """Check a local path below `output_dir` before this tool acts on it; whether it exists.

    `output_dir` itself is the user's choice (it may be a link); below it, every part of `path` must be a
    real folder on `output_dir`'s device, and `path` itself a real folder or a regular file (`folder` says
    which one when it matters). Checked with lstat, so no link is ever followed.

    Raises:
        UnsafePath: naming the first part that is not.
    """
    device = os.stat(output_dir).st_dev
    parts = os.path.relpath(path, output_dir).split(os.sep)
    if parts[0] in ("..", "."):
        raise _refuse(path, "not inside --output_dir")
    current = output_dir
    for depth, part in enumerate(parts, 1):
        current = os.path.join(current, part)
        try:
            found = os.lstat(current)
        except FileNotFoundError:
            return False
        last = depth == len(parts)
        if stat.S_ISLNK(found.st_mode):
            raise _refuse(current, "a symbolic link")
        if found.st_dev != device:
            raise _refuse(current, "on another device than --output_dir (a mount point)")
        is_folder = stat.S_ISDIR(found.st_mode)
        if not is_folder and not (last and stat.S_ISREG(found.st_mode)):
            raise _refuse(current, "not a regular file or folder" if last else "not a folder")
        if last and folder is not None and folder != is_folder:
            raise _refuse(current, "a regular file where this tool keeps a folder" if folder else
                          "a folder where this tool keeps a file")
    return True


def check_own_paths(output_dir: str, paths) -> None:
    """`check_own_path` for every local path of `paths`, before any is acted on (nothing for gs://)."""
    if is_local(output_dir):
        for path in paths:
            check_own_path(output_dir, path)


def check_own_tree(output_dir: str, folder: str) -> bool:
    """`check_own_path(folder)` and every entry below it (no link, device or mount point); whether it exists."""
    if not check_own_path(output_dir, folder, folder=True):
        return False
    device = os.lstat(folder).st_dev
    stack = [folder]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                found = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(found.st_mode):
                    raise _refuse(entry.path, "a symbolic link")
                if found.st_dev != device:
                    raise _refuse(entry.path, "on another device than --output_dir (a mount point)")
                if stat.S_ISDIR(found.st_mode):
                    stack.append(entry.path)
                elif not stat.S_ISREG(found.st_mode):
                    raise _refuse(entry.path, "not a regular file or folder")
    return True


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


def temporary_outputs(output_dir: str) -> list[str]:
    """Paths of `own_outputs` that no complete dataset holds: temporary names and folders."""
    return [p for p in own_outputs(output_dir) if not _FINAL_NAME.fullmatch(relative_to(p, output_dir))]


def final_outputs(output_dir: str) -> list[str]:
    """Files in `output_dir` under the final names of this tool's files (shards and descriptions), by name."""
    if is_local(output_dir):
        if not os.path.isdir(output_dir):
            return []
        names = [n for n in os.listdir(output_dir) if os.path.isfile(os.path.join(output_dir, n))]
        return sorted(os.path.join(output_dir, n) for n in names if _FINAL_NAME.fullmatch(n))
    pattern = FileSystems.join(output_dir, "*")
    found = FileSystems.match([pattern])[0].metadata_list
    return sorted(m.path for m in found if _FINAL_NAME.fullmatch(relative_to(m.path, output_dir)))


def dataset_files(output_dir: str) -> list[str]:
    """The files of the complete dataset in `output_dir`, as its description lists them; [] when there is none.

    Its shards and their index files (each named as this tool names them: a listed notes.txt is not one),
    and the description files under their fixed names (DESCRIPTION_FILES, and a version-1 dataset's
    dataset_info.json). A file of the same kind of name that the description does not list is not the
    dataset's, and `--overwrite` leaves it alone.
    """
    marker = completion_marker(output_dir)
    if marker is None:
        return []
    info = _read_json(marker)  # leniently: a damaged description still names its files
    splits = info.get("splits") if isinstance(info, dict) else None
    names = set(DESCRIPTION_FILES) | {os.path.basename(marker)}
    for split in splits.values() if isinstance(splits, dict) else ():
        shards = split.get("shards") if isinstance(split, dict) else None
        for shard in shards if isinstance(shards, list) else ():
            if isinstance(shard, dict):
                names.update(shard.get(key) for key in ("file", "index") if isinstance(shard.get(key), str))
    sources = info.get("sources") if isinstance(info, dict) else None
    names.update(name for name in (sources.get("files") if isinstance(sources, dict) else None) or ()
                 if isinstance(name, str) and SOURCES_NAME.fullmatch(name))
    listed = [name for name in names if name in DESCRIPTION_FILES or name == os.path.basename(marker)
              or is_shard_name(name) or INDEX_NAME.fullmatch(name) or SOURCES_NAME.fullmatch(name)]
    paths = [FileSystems.join(output_dir, name) for name in sorted(listed)]
    present = _present(paths)  # one listing of the folder, not a request per file
    return [p for p in paths if p in present]


def _exists(path: str) -> bool:
    """Whether `path` exists; a local link counts, also a dangling one (it is checked, never followed)."""
    return os.path.lexists(path) if is_local(path) else FileSystems.exists(path)


def delete_tree(folder: str, output_dir: str | None = None) -> None:
    """Delete `folder` and everything below it (local or gs://); a missing folder is fine.

    A local `folder` below `output_dir` is checked first (`check_own_tree`): UnsafePath, and nothing deleted,
    when a link, a device or a mount point is in it.
    """
    if is_local(folder):
        if output_dir is not None and not check_own_tree(output_dir, folder):
            return
        shutil.rmtree(folder, ignore_errors=True)
        return
    delete_files(sorted(list_folder(folder, recursive=True)))


def list_folder(folder: str, recursive: bool = False) -> dict[str, int]:
    """The files in `folder` (below it, with `recursive`) and their sizes in bytes: one listing.

    On gs://, one paged listing of the folder's prefix (with `recursive=False`, a delimited one, which does not
    descend into subfolders); locally, lstat of each entry (a link is listed, never followed, with its own size).
    A missing folder has none.
    """
    if is_local(folder):
        if not os.path.isdir(folder) or os.path.islink(folder):
            return {}
        found = {}
        for root, dirs, files in os.walk(folder) if recursive else [(folder, [], os.listdir(folder))]:
            for name in files:
                path = os.path.join(root, name)
                entry = os.lstat(path)
                if not stat.S_ISDIR(entry.st_mode):
                    found[path] = entry.st_size
            found.update((os.path.join(root, d), 0) for d in dirs if os.path.islink(os.path.join(root, d)))
        return found
    from apache_beam.io.gcp.gcsio import parse_gcs_path
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, prefix = parse_gcs_path(folder.rstrip("/") + "/", object_optional=True)
    blobs = gcs_client(folder).list_blobs(bucket, prefix=prefix, delimiter=None if recursive else "/",
                                          retry=DEFAULT_RETRY)
    return {f"gs://{bucket}/{blob.name}": blob.size or 0 for blob in blobs}


def _in_parallel(work: Callable[[list], list], items: list, chunk: int) -> list:
    """`work` on `items` in chunks of `chunk`, up to PUBLISH_THREADS chunks at once; their results, in order."""
    chunks = [items[start:start + chunk] for start in range(0, len(items), chunk)]
    if len(chunks) <= 1:
        return [result for part in chunks for result in work(part)]
    with ThreadPoolExecutor(min(PUBLISH_THREADS, len(chunks)), thread_name_prefix="publish") as pool:
        return [result for part in pool.map(work, chunks) for result in part]


def _gcsio(path: str):
    """Beam's GcsIO on the process's one storage client (`inputs.listing.gcs_client`), shared by the threads."""
    from apache_beam.io.gcp import gcsio

    return gcsio.GcsIO(storage_client=gcs_client(path))


def delete_files(paths: list[str]) -> None:
    """Delete files: locally one by one (each must exist); on gs://, in batches of 100, up to 64 at once (a
    missing one is fine there).

    Raises:
        OSError: naming the first file that could not be deleted, and how many more.
    """
    if not paths:
        return
    if is_local(paths[0]):
        FileSystems.delete(paths)
        return
    results = _in_parallel(lambda part: _gcsio(part[0]).delete_batch(part), paths, GCS_BATCH)
    failed = [(path, error) for path, error in results if error]
    if failed:
        path, error = failed[0]
        raise OSError(f"deleting {path} failed ({error}), and {len(failed) - 1} more")


def remove_run_dir(output_dir: str, run_id: str) -> None:
    """Delete a run's temporary folder, and the folder of all runs' when it is left empty.

    One that holds what this tool never makes (a link, a FIFO, a mount point) is left in place, with a
    warning: the run itself is done.
    """
    try:
        delete_tree(run_dir(output_dir, run_id), output_dir)
    except UnsafePath as e:
        _LOG.warning("Left this run's temporary folder in place: %s", e)
        return
    if is_local(output_dir):
        try:
            os.rmdir(os.path.join(output_dir, TEMP_DIR))  # a link is never removed: rmdir refuses it
        except OSError:
            pass  # another run's folder (a leftover, or being deleted) is in it


def read_text(path: str) -> str | None:
    """The UTF-8 text of the file at `path` through Beam's file systems, None when there is none.

    Raises:
        ValueError: not UTF-8; OSError: what the file system says.
    """
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path, compression_type="uncompressed") as f:
        return f.read().decode("utf-8")


def _read_json(path: str):
    try:
        return bounded.loads(read_text(path))
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
    try:
        return legacy if is_legacy_description(read_text(legacy)) else None
    except (OSError, ValueError):  # not readable: no dataset this tool can name
        return None


def write_file(path: str, lines: Iterable[str]) -> None:
    """Write `lines` (streamed, each ending in a newline) to `path`."""
    with FileSystems.create(path, mime_type="application/octet-stream") as f:
        for line in lines:
            f.write(line.encode("utf-8"))


def write_atomically(path: str, data: bytes) -> None:
    """Write `data` to `path` under a temporary name first, then rename it: a reader finds the whole file or none
    (on GCS, one object write and a server-side copy)."""
    folder, name = path.rsplit("/", 1)
    temp = FileSystems.join(folder, f".{name}.tmp-{uuid.uuid4().hex}")
    with FileSystems.create(temp, mime_type="application/octet-stream", compression_type="uncompressed") as f:
        f.write(data)
    FileSystems.rename([temp], [path])


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
    plan = _publish_plan(output_dir, run_id, _read_json(plan_path) if _exists(plan_path) else None)
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


def _is_final_path(output_dir: str, path) -> bool:
    """Whether `path` is `output_dir`/<a final name of this tool's files>."""
    if not isinstance(path, str) or not path.startswith(output_dir.rstrip("/") + "/"):
        return False
    name = relative_to(path, output_dir)
    return FileSystems.join(output_dir, name) == path and _FINAL_NAME.fullmatch(name) is not None


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
             and (marker is None or _is_final_path(output_dir, marker))
             and all(isinstance(m, list) and len(m) == 2 and isinstance(m[0], str)
                     and (m[0].startswith(mine) or _is_final_path(output_dir, m[0]))  # an append's renames
                     and ".." not in m[0].split("/") and _is_final_path(output_dir, m[1]) for m in moves)
             and all(_is_final_path(output_dir, path) for path in delete)
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
    present = _present(every)
    # The window without a complete dataset opens: the old marker goes first, so that the folder is visibly
    # incomplete while its files change.
    if old_marker in present:
        FileSystems.delete([old_marker])
    _move([(src, dst) for src, dst in files if src in present])
    # An append's old files that took new names: on gs:// a move is a copy, so their old names go now, before the
    # marker (locally the renames took them).
    renamed = [src for src, _ in files if src in present and _is_final_path(output_dir, src) and not is_local(src)]
    delete_files([path for path in delete if path in present] + renamed)
    _move([marker])  # the window closes: the new dataset is complete


def _present(paths: list[str]) -> set[str]:
    """Which of `paths` exist (a local link counts): locally by lstat, elsewhere one listing per folder."""
    if not paths or is_local(paths[0]):
        return {path for path in paths if os.path.lexists(path)}
    listed = set()
    for folder in sorted({path.rsplit("/", 1)[0] for path in paths}):
        listed.update(list_folder(folder))
    return {path for path in paths if path in listed}


def _move(moves: list) -> None:
    """Give files their final names: renames locally; on gs://, server-side copies in batches of 100, up to 64
    batches at once (a rename there is a copy and a delete; the sources go with the run's folder, after the
    window)."""
    if not moves:
        return
    if is_local(moves[0][0]):
        FileSystems.rename([src for src, _ in moves], [dst for _, dst in moves])
        return
    pairs = [tuple(move) for move in moves]
    results = _in_parallel(lambda part: _gcsio(part[0][0]).copy_batch(part), pairs, GCS_BATCH)
    failed = [(src, dst, error) for src, dst, error in results if error]
    if failed:
        src, dst, error = failed[0]
        raise OSError(f"copying {src} to {dst} failed ({error}), and {len(failed) - 1} more")


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
        plan = _publish_plan(output_dir, run_id, _read_json(path) if _exists(path) else None)
        if plan is not None and _exists(plan["moves"][-1][0]):
            return plan
    return None
