"""Which files and folders of --output_dir are this tool's, and the lstat checks before any of them is changed."""

from __future__ import annotations

import os
import re
import stat
import time
import uuid

from apache_beam.io.filesystems import FileSystems

from transforms.base.dataset_format import (
    DESCRIPTION_FILES,
    ERRORS_FILE,
    INDEX_NAME,
    INFO_FILE,
    KAGGLE_NAME,
    LEGACY_INFO_FILE,
    SHARD_NAME,
    SOURCES_NAME,
    SPLITS,
    TEMP_DIR,
    is_legacy_description,
    is_shard_name,
)
from transforms.base.paths import is_local, relative_to
from transforms.output.files import present, read_json, read_text

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


def is_final_path(output_dir: str, path) -> bool:
    """Whether `path` is `output_dir`/<a final name of this tool's files>."""
    if not isinstance(path, str) or not path.startswith(output_dir.rstrip("/") + "/"):
        return False
    name = relative_to(path, output_dir)
    return FileSystems.join(output_dir, name) == path and _FINAL_NAME.fullmatch(name) is not None


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


def existing_description(output_dir: str) -> tuple[str, dict] | None:
    """(path, its JSON object) of `output_dir`'s description (`completion_marker`), None when there is none.

    Read leniently, as the converter's bookkeeping wants: {} for a description that is unreadable or not a JSON
    object (a damaged description is no dataset of this run's, and names no files). The read side checks it
    instead (`dataset_format.load_description`).
    """
    marker = completion_marker(output_dir)
    if marker is None:
        return None
    info = read_json(marker)
    return marker, info if isinstance(info, dict) else {}


def dataset_files(output_dir: str) -> list[str]:
    """The files of the complete dataset in `output_dir`, as its description lists them; [] when there is none.

    Its shards and their index files (each named as this tool names them: a listed notes.txt is not one),
    and the description files under their fixed names (DESCRIPTION_FILES, and a version-1 dataset's
    dataset_info.json). A file of the same kind of name that the description does not list is not the
    dataset's, and `--overwrite` leaves it alone.
    """
    found = existing_description(output_dir)
    if found is None:
        return []
    marker, info = found  # leniently: a damaged description still names its files
    splits = info.get("splits")
    names = set(DESCRIPTION_FILES) | {os.path.basename(marker)}
    for split in splits.values() if isinstance(splits, dict) else ():
        shards = split.get("shards") if isinstance(split, dict) else None
        for shard in shards if isinstance(shards, list) else ():
            if isinstance(shard, dict):
                names.update(shard.get(key) for key in ("file", "index") if isinstance(shard.get(key), str))
    sources = info.get("sources")
    names.update(name for name in (sources.get("files") if isinstance(sources, dict) else None) or ()
                 if isinstance(name, str) and SOURCES_NAME.fullmatch(name))
    listed = [name for name in names if name in DESCRIPTION_FILES or name == os.path.basename(marker)
              or is_shard_name(name) or INDEX_NAME.fullmatch(name) or SOURCES_NAME.fullmatch(name)]
    paths = [FileSystems.join(output_dir, name) for name in sorted(listed)]
    found = present(paths)  # one listing of the folder, not a request per file
    return [p for p in paths if p in found]
