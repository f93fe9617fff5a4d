"""ListImages: every entry under the input folder, local or gs://, as a candidate file or a reported problem.

Local folders are walked here (os.scandir, lstat/stat), not through Beam's
glob: a glob drops what it cannot follow (dangling and looping symlinks,
unreadable folders) without a word, and reads '[', ']', '*' and '?' in the
folder's own name as patterns. The walk reports every entry it cannot use as
an `Entry` with a problem, which becomes a line of errors.jsonl.

Symlink policy: a symlink whose target is inside the input folder is followed
(a link to a folder lists that folder's files under the link's name); one whose
target is outside it is reported as `symlink_outside_input` unless
`follow_symlinks` is set. A link back to a folder on its own path is a
`symlink_loop`, one to nothing a `dangling_symlink`.

gs:// has no symlinks or special files: there the listing is Beam's match,
with the folder's own glob characters escaped.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from transforms import counters
from transforms.layout import NOT_AN_IMAGE_EXTENSION, hidden_reason, relative_path, skip_reason
from transforms.records import FileRef, Rejection

SKIPPED = "skipped"
FOUND = "found"

# Reasons of entries the listing cannot use (stage 'rejected': the user meant them as input, probably).
SYMLINK_LOOP = "symlink_loop"
DANGLING_SYMLINK = "dangling_symlink"
SYMLINK_OUTSIDE_INPUT = "symlink_outside_input"
UNREADABLE_FOLDER = "unreadable_folder"
UNREADABLE_ENTRY = "unreadable_entry"
NOT_A_REGULAR_FILE = "not_a_regular_file"

_FILE_TYPES = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
)


def file_kind(mode: int) -> str:
    """What a path of this st_mode is, in words, for the entries that are not regular files."""
    return next((name for test, name in _FILE_TYPES if test(mode)), "not a regular file")


class Entry(NamedTuple):
    """One entry under the input folder: a regular file (problem None) or one that cannot be used."""

    path: str  # full path or URL; a local name that is not UTF-8 keeps its bytes as surrogates (os.fsdecode)
    size: int  # bytes; 0 for a problem
    problem: str | None = None  # reason, e.g. 'dangling_symlink'
    detail: str = ""
    is_folder: bool | None = None  # for a problem: True, False, or None when unknown (a dangling link)

    @property
    def size_in_bytes(self) -> int:  # the name Beam's FileMetadata uses, which list_files once returned
        return self.size


def is_local(path: str) -> bool:
    return "://" not in path


def escape_glob(path: str) -> str:
    """`path` as a Beam match pattern that matches only itself: '[', '*' and '?' in brackets."""
    return "".join(f"[{c}]" if c in "[*?" else c for c in path)


def listing_pattern(input_dir: str) -> str:
    """The glob that matches every file below `input_dir` (a gs:// folder), recursively."""
    return FileSystems.join(escape_glob(input_dir), "**")


def _kind(mode: int) -> str | None:
    """None for what the listing walks or lists (files and folders), else what the entry is."""
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else file_kind(mode)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _entries_of(folder: str, root: str, follow_symlinks: bool, ancestors: frozenset,
                subfolders: list) -> Iterator[Entry]:
    """The entries of one folder, sorted by name; folders to enter go to `subfolders` as (path, ancestors)."""
    try:
        with os.scandir(folder) as listing:
            names = sorted(entry.name for entry in listing)  # one folder's names at a time
    except OSError as e:
        yield Entry(folder, 0, UNREADABLE_FOLDER, f"the folder cannot be listed: {e.strerror or e}", True)
        return
    for name in names:
        path = os.path.join(folder, name)
        try:
            info = os.lstat(path)
        except OSError as e:
            yield Entry(path, 0, UNREADABLE_ENTRY, f"cannot be examined: {e.strerror or e}")
            continue
        if stat.S_ISLNK(info.st_mode):
            try:
                target = os.path.realpath(path, strict=True)
                info = os.stat(path)
            except FileNotFoundError:
                yield Entry(path, 0, DANGLING_SYMLINK, f"symlink to {os.readlink(path)!r}, which does not exist")
                continue
            except OSError as e:
                if e.errno == errno.ELOOP:
                    yield Entry(path, 0, SYMLINK_LOOP, "a chain of symlinks that never ends (a link to itself)")
                else:
                    yield Entry(path, 0, UNREADABLE_ENTRY, f"symlink that cannot be followed: {e.strerror or e}")
                continue
            if not follow_symlinks and not _inside(target, root):
                yield Entry(path, 0, SYMLINK_OUTSIDE_INPUT,
                            f"symlink to {target}, outside the input folder; pass --follow_symlinks to read it",
                            stat.S_ISDIR(info.st_mode))
                continue
        if stat.S_ISDIR(info.st_mode):
            identity = (info.st_dev, info.st_ino)
            if identity in ancestors:
                yield Entry(path, 0, SYMLINK_LOOP, "leads back to a folder that contains it", True)
            else:
                subfolders.append((path, ancestors | {identity}))
            continue
        kind = _kind(info.st_mode)
        if kind is not None:
            yield Entry(path, 0, NOT_A_REGULAR_FILE, f"{kind}, not a regular file", False)
            continue
        yield Entry(path, info.st_size)


def walk_local(input_dir: str, follow_symlinks: bool = False) -> Iterator[Entry]:
    """Every entry below the local folder `input_dir`, streamed, depth first.

    A loop, however it is made (symlinks, bind mounts), is found by the
    (st_dev, st_ino) of the folders on the current path. The walk keeps its own
    stack, so any depth of nesting works.

    Raises:
        OSError: when `input_dir` itself cannot be listed.
    """
    os.scandir(input_dir).close()  # the input folder itself: an error here is the caller's to report
    info = os.stat(input_dir)
    root = os.path.realpath(input_dir)
    stack = [(input_dir, frozenset({(info.st_dev, info.st_ino)}))]
    while stack:
        folder, ancestors = stack.pop()
        subfolders: list = []
        yield from _entries_of(folder, root, follow_symlinks, ancestors, subfolders)
        stack.extend(reversed(subfolders))


def list_entries(input_dir: str, follow_symlinks: bool = False) -> Iterator[Entry]:
    """Every entry below `input_dir` (local or gs://); never reads file contents."""
    if is_local(input_dir):
        yield from walk_local(input_dir, follow_symlinks)
        return
    for metadata in FileSystems.match([listing_pattern(input_dir)])[0].metadata_list:
        yield Entry(metadata.path, metadata.size_in_bytes)


def list_files(input_dir: str, follow_symlinks: bool = False) -> list[Entry]:
    """Every entry below `input_dir`, sorted by path (files and problems)."""
    return sorted(list_entries(input_dir, follow_symlinks), key=lambda e: e.path)


def classify(entry: Entry, input_dir: str) -> FileRef | Rejection:
    """A listed entry as a candidate image (FileRef) or a Rejection: skipped by name, or a problem."""
    relpath = relative_path(entry.path, input_dir)
    if entry.problem is None:
        skip = skip_reason(relpath)
        if skip is None:
            return FileRef(entry.path, relpath, entry.size)
        return Rejection(relpath, "skipped", *skip)
    skip = hidden_reason(relpath)
    if skip is None and entry.is_folder is False:
        skip = skip_reason(relpath)
        if skip is not None and skip[0] != NOT_AN_IMAGE_EXTENSION:
            skip = None
    if skip is not None:
        return Rejection(relpath, "skipped", *skip)
    return Rejection(relpath, "rejected", entry.problem, entry.detail)


class _FilterByName(beam.DoFn):
    """Entry -> FileRef for candidate images; others go to SKIPPED as a Rejection with a reason.

    FOUND gets the number of entries seen, once per bundle.
    """

    def __init__(self, input_dir: str):
        self._input_dir = input_dir
        self._found = 0

    def start_bundle(self):
        self._found = 0

    def finish_bundle(self):
        if self._found:
            yield beam.pvalue.TaggedOutput(FOUND, GlobalWindows.windowed_value(self._found))

    def process(self, entry: Entry):
        self._found += 1
        result = classify(entry, self._input_dir)
        if isinstance(result, Rejection):
            counters.inc("files_skipped" if result.stage == "skipped" else "files_rejected_at_listing")
            yield beam.pvalue.TaggedOutput(SKIPPED, result)
            return
        counters.inc("files_listed")
        yield result


class ListImages(beam.PTransform):
    """PBegin -> FileRef for every candidate image, plus a SKIPPED output of Rejection.

    SKIPPED holds the files skipped by name and the entries that cannot be used
    (stage 'rejected'). FOUND counts every entry listed (an int per bundle): the
    dataset description checks that each one was written, rejected or skipped.

    Listing runs inside the graph, so on Dataflow it needs nothing from the
    launcher's machine but the folder name; it follows the same rules as the
    launcher's plan (`list_entries`).
    """

    def __init__(self, input_dir: str, follow_symlinks: bool = False):
        super().__init__()
        self._input_dir = input_dir
        self._follow_symlinks = follow_symlinks

    def expand(self, pbegin):
        return (
            pbegin
            | "Folder" >> beam.Create([self._input_dir])
            # Entry, streamed from the walk (or Beam's match on gs://)
            | "ListEntries" >> beam.FlatMap(list_entries, self._follow_symlinks)
            # Entry -> FileRef (images) | Rejection (skipped, or a problem entry)
            | "FilterByName" >> beam.ParDo(_FilterByName(self._input_dir)).with_outputs(SKIPPED, FOUND, main="images")
        )
