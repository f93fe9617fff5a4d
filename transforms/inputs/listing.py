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
`symlink_loop`, one to nothing a `dangling_symlink`. A file reached twice, through a link (to it, or to a
folder on its path) and under its own name, or through two links, is one record: the other names are skipped
as `symlink_alias` (`OnePerFile`).

gs:// has no symlinks or special files: there the listing is the bucket's
own, page by page (no glob, so a folder's own glob characters mean nothing).
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from collections.abc import Iterator
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.gcp import gcsio
from apache_beam.transforms.window import GlobalWindows

from transforms.base import counters, gcs
from transforms.base.paths import file_kind, is_local, name_bytes, quoted_name, relative_path, text_name
from transforms.base.records import FileRef, Rejection
from transforms.inputs.folder_parts import (
    WIDTH,
    FolderPart,
    largest_name_start,
    list_part,
    plan_parts,
    reports_subfolder,
)
from transforms.labels.layout import NOT_AN_IMAGE_EXTENSION, hidden_reason, skip_reason

SKIPPED = "skipped"
FOUND = "found"
FOLDERS = "folders"
PARTS = "parts"
SMALL_FOLDER_PAGES = 10  # a gs:// class folder listed whole by its worker when it ends within these pages

# Reasons of entries the listing cannot use (stage 'rejected': the user meant them as input, probably).
SYMLINK_LOOP = "symlink_loop"
DANGLING_SYMLINK = "dangling_symlink"
SYMLINK_OUTSIDE_INPUT = "symlink_outside_input"
UNREADABLE_FOLDER = "unreadable_folder"
UNREADABLE_ENTRY = "unreadable_entry"
NOT_A_REGULAR_FILE = "not_a_regular_file"
# Skip reason (stage 'skipped'): a name that reaches, through a symlink, a file the dataset reads under another name.
SYMLINK_ALIAS = "symlink_alias"
ALIASES = "aliases"  # (real path, FileRef) of every candidate image whose path goes through a symlink


class Entry(NamedTuple):
    """One entry under the input folder: a regular file (problem None) or one that cannot be used."""

    path: str  # full path or URL; a local name that is not UTF-8 keeps its bytes as surrogates (os.fsdecode)
    size: int  # bytes; 0 for a problem
    problem: str | None = None  # reason, e.g. 'dangling_symlink'
    detail: str = ""
    is_folder: bool | None = None  # for a problem: True, False, or None when unknown (a dangling link)
    real: str = ""  # a file whose path goes through a symlink (to it, or to a folder on it): its real path

    @property
    def size_in_bytes(self) -> int:  # the name Beam's FileMetadata uses, which list_files once returned
        return self.size


def _kind(mode: int) -> str | None:
    """None for what the listing walks or lists (files and folders), else what the entry is."""
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else file_kind(mode)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


SORTED_NAMES = 10_000  # a local folder of at most this many names is listed in name order, a larger one as it comes


def _names(listing) -> Iterator[str]:
    """A local folder's names from its os.scandir: sorted when they are at most SORTED_NAMES, else streamed in
    the file system's order (a flat folder of millions of names is never held in one list)."""
    first = [entry.name for entry in itertools.islice(listing, SORTED_NAMES + 1)]
    if len(first) <= SORTED_NAMES:
        yield from sorted(first)
        return
    yield from first
    yield from (entry.name for entry in listing)


def _entries_of(folder: str, root: str, follow_symlinks: bool, ancestors: frozenset, input_dir: str
                ) -> Iterator[Entry | Folder]:
    """The entries of one local folder, streamed (in name order when it is small: `_names`); a folder to enter
    comes as a `Folder` with the (st_dev, st_ino) of the folders on its path."""
    try:
        listing = os.scandir(folder)
    except OSError as e:
        yield Entry(folder, 0, UNREADABLE_FOLDER, f"the folder cannot be listed: {e.strerror or e}", True)
        return
    # The folder's real path, and whether a symlink on its path leads there (then its files are reached twice?)
    below = relative_path(folder, input_dir)
    folder_real = os.path.realpath(folder)
    linked_folder = folder_real != (os.path.join(root, below) if below else root)
    with listing:
        names = _names(listing)
        while True:
            try:
                name = next(names)
            except StopIteration:
                return
            except OSError as e:
                yield Entry(folder, 0, UNREADABLE_FOLDER, f"the folder cannot be listed to its end: "
                            f"{e.strerror or e}", True)
                return
            yield _entry_of(os.path.join(folder, name), os.path.join(folder_real, name) if linked_folder else "",
                            root, follow_symlinks, ancestors)


def _entry_of(path: str, real: str, root: str, follow_symlinks: bool, ancestors: frozenset) -> Entry | Folder:
    """One local name as an Entry (a file, or a problem) or a Folder to enter; `real`: its real path when a
    symlink on its folder's path leads there."""
    try:
        info = os.lstat(path)
    except OSError as e:
        return Entry(path, 0, UNREADABLE_ENTRY, f"cannot be examined: {e.strerror or e}")
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.path.realpath(path, strict=True)
            info = os.stat(path)
        except FileNotFoundError:
            return Entry(path, 0, DANGLING_SYMLINK, f"symlink to {os.readlink(path)!r}, which does not exist")
        except OSError as e:
            if e.errno == errno.ELOOP:
                return Entry(path, 0, SYMLINK_LOOP, "a chain of symlinks that never ends (a link to itself)")
            return Entry(path, 0, UNREADABLE_ENTRY, f"symlink that cannot be followed: {e.strerror or e}")
        if not follow_symlinks and not _inside(target, root):
            return Entry(path, 0, SYMLINK_OUTSIDE_INPUT,
                         f"symlink to {target}, outside the input folder; pass --follow_symlinks to read it",
                         stat.S_ISDIR(info.st_mode))
        real = target
    if stat.S_ISDIR(info.st_mode):
        identity = (info.st_dev, info.st_ino)
        if identity in ancestors:
            return Entry(path, 0, SYMLINK_LOOP, "leads back to a folder that contains it", True)
        return Folder(path, ancestors | {identity})
    kind = _kind(info.st_mode)
    if kind is not None:
        return Entry(path, 0, NOT_A_REGULAR_FILE, f"{kind}, not a regular file", False)
    return Entry(path, info.st_size, real=real)


class Folder(NamedTuple):
    """A folder whose whole tree one worker lists: its path and, for a local one, the (st_dev, st_ino) of the
    folders on its path, which find a symlink loop."""

    path: str
    ancestors: frozenset = frozenset()


def _walk(stack: list, root: str, follow_symlinks: bool, stop_depth: int | None, input_dir: str
          ) -> Iterator[Entry | Folder]:
    """Entries below the (folder, ancestors, depth) items of `stack`, depth first; the folders at `stop_depth`
    are yielded as a `Folder` instead of being entered.

    A loop, however it is made (symlinks, bind mounts), is found by the (st_dev, st_ino) of the folders on
    the current path. The walk keeps its own stack, so any depth of nesting works.
    """
    while stack:
        folder, ancestors, depth = stack.pop()
        subfolders: list[Folder] = []  # one folder's subfolders (a flat folder's files are streamed, not kept)
        for item in _entries_of(folder, root, follow_symlinks, ancestors, input_dir):
            if isinstance(item, Folder):
                subfolders.append(item)
            else:
                yield item
        if stop_depth is not None and depth + 1 >= stop_depth:
            yield from subfolders
        else:
            stack.extend((sub.path, sub.ancestors, depth + 1) for sub in reversed(subfolders))


def _local_start(input_dir: str) -> tuple[str, list]:
    os.scandir(input_dir).close()  # the input folder itself: an error here is the caller's to report
    info = os.stat(input_dir)
    return os.path.realpath(input_dir), [(input_dir, frozenset({(info.st_dev, info.st_ino)}), 0)]


def _gcs_prefix(folder: str) -> tuple[str, str]:
    bucket, prefix = gcsio.parse_gcs_path(folder, object_optional=True)
    return bucket, (prefix.rstrip("/") + "/") if prefix else ""


def gcs_list(folder: str, folders_too: bool = False, page_size: int | None = None) -> Iterator[Entry | Folder]:
    """The objects below the gs:// `folder`, streamed page by page (never all in memory).

    With `folders_too`, only one level: its objects, then its subfolders as `Folder`
    (the listing's prefixes). Folder placeholder objects (names ending in '/') are not files.
    `page_size` asks for smaller pages than the service's 1,000, for a caller that stops early.
    """
    bucket, prefix = _gcs_prefix(folder)
    pages = gcs.client().list_blobs(bucket, prefix=prefix, delimiter="/" if folders_too else None,
                                          page_size=page_size)
    for blob in pages:
        if not blob.name.endswith("/"):
            yield Entry(f"gs://{bucket}/{blob.name}", blob.size or 0)
    if folders_too:
        yield from (Folder(f"gs://{bucket}/{name}".rstrip("/")) for name in sorted(pages.prefixes))


def list_top(input_dir: str, follow_symlinks: bool, depth: int, below: Folder | None = None
             ) -> Iterator[Entry | Folder]:
    """The entries of `input_dir` (or of `below`, a folder in it) down to `depth` levels, and the folders at
    that depth as `Folder`.

    Depth 1 stops at the class folders (<input>/<class>/), depth 2 at the class
    folders of a split layout (<input>/<split>/<class>/); each `Folder` is then
    listed whole by `list_folder`, on any worker.
    """
    if is_local(input_dir):
        root, stack = _local_start(input_dir)
        if below is not None:
            stack = [(below.path, below.ancestors, 0)]
        yield from _walk(stack, root, follow_symlinks, depth, input_dir)
        return
    level = [input_dir if below is None else below.path]
    for current in range(depth):
        deeper = []
        for folder in level:
            for item in gcs_list(folder, folders_too=True):
                if isinstance(item, Folder) and current + 1 < depth:
                    deeper.append(item.path)
                else:
                    yield item
        level = deeper


def list_folder(folder: Folder, input_dir: str, follow_symlinks: bool = False, page_size: int | None = None
                ) -> Iterator[Entry]:
    """Every entry below `folder` (one that `list_top` gave), streamed; `page_size` as for `gcs_list`."""
    if is_local(folder.path):
        yield from _walk([(folder.path, folder.ancestors, 0)], os.path.realpath(input_dir), follow_symlinks, None,
                         input_dir)
    else:
        yield from gcs_list(folder.path, page_size=page_size)


def list_level(folder: Folder, input_dir: str, follow_symlinks: bool = False, page_size: int | None = None
               ) -> Iterator[Entry | Folder]:
    """The entries directly in `folder` and its subfolders (as `Folder`), in the listing's order, streamed, for a
    caller that stops early (the launcher's bounded look at the input's top level).

    Local: the folder's os.scandir (in name order when it is small, `_names`). gs://: pages of names with the
    delimiter '/', each page's subfolders (its prefixes) among its files in name order; `page_size` as for
    `gcs_list`.
    """
    if is_local(folder.path):
        ancestors = folder.ancestors
        if not ancestors:
            info = os.stat(folder.path)
            ancestors = frozenset({(info.st_dev, info.st_ino)})
        yield from _entries_of(folder.path, os.path.realpath(input_dir), follow_symlinks, ancestors, input_dir)
        return
    bucket, prefix = _gcs_prefix(folder.path)
    blobs = gcs.client().list_blobs(bucket, prefix=prefix, delimiter="/", page_size=page_size)
    seen: set[str] = set()
    for page in blobs.pages:
        yield from (item for _, item in _page_items(bucket, page, seen))


def _page_items(bucket: str, page, seen: set[str]) -> list[tuple[str, Entry | Folder | None]]:
    """(name, item) of one page of a gs:// listing, in name order: an Entry for a file, a Folder for a subfolder
    (a prefix, of a listing with a delimiter) not in `seen` (then added), None for a folder placeholder."""
    items: list[tuple[str, Entry | Folder | None]] = [
        (blob.name, None if blob.name.endswith("/") else Entry(f"gs://{bucket}/{blob.name}", blob.size or 0))
        for blob in page]
    for name in getattr(page, "prefixes", ()):
        if name not in seen:
            seen.add(name)
            items.append((name, Folder(f"gs://{bucket}/{name}".rstrip("/"))))
    return sorted(items, key=lambda item: item[0])


def _tagged(item: Entry | Folder):
    return beam.pvalue.TaggedOutput(FOLDERS, item) if isinstance(item, Folder) else item


def list_folder_or_parts(folder: Folder, input_dir: str, follow_symlinks: bool = False, level: bool = False):
    """Every entry below a class folder, or with `level` the entries directly in a gs:// level (the input
    folder, a split folder) and its subfolders, on FOLDERS.

    A gs:// folder is listed here page by page; one that is still not at its end after SMALL_FOLDER_PAGES pages
    is large: the rest goes, on PARTS, as the FolderParts that hold it (transforms.inputs.folder_parts), for any
    worker to list (`list_folder_part`). Planning parts costs a few dozen requests, so a folder of ImageNet's size
    (1,300 names) takes its 2 pages and nothing else. A level is listed with the delimiter '/' (GCS's startOffset
    and endOffset apply to it too), so its parts never descend into its subfolders: those are listed once, as
    class folders are."""
    if is_local(folder.path):
        yield from list_folder(folder, input_dir, follow_symlinks)
        return
    bucket, prefix = _gcs_prefix(folder.path)
    client = gcs.client()
    blobs = client.list_blobs(bucket, prefix=prefix, delimiter="/" if level else None)
    names: list[str] = []  # the names of the last page listed here that had any
    seen: set[str] = set()
    for number, page in enumerate(blobs.pages, 1):
        items = _page_items(bucket, page, seen)
        names = [name for name, _ in items] or names
        yield from (_tagged(item) for _, item in items if item is not None)
        if blobs.next_page_token is None or number >= SMALL_FOLDER_PAGES:
            break
    if not names or blobs.next_page_token is None:
        return

    def names_from(within: str, start: str, count: int) -> list[str]:
        return [b.name for b in client.list_blobs(bucket, prefix=within, start_offset=start, max_results=count)]

    largest = largest_name_start(names_from, prefix, names[-1][len(prefix):], WIDTH)
    for part in plan_parts(bucket, prefix, names, largest, names_from):
        counters.inc("folder_parts")
        yield beam.pvalue.TaggedOutput(PARTS, part._replace(delimiter="/") if level else part)


def list_folder_part(part: FolderPart):
    """The entries of one part of a large gs:// folder; of a level's part (`delimiter` '/'), also the subfolders
    that this part reports (`reports_subfolder`), on FOLDERS."""
    if not part.delimiter:
        for blob in list_part(gcs.client(), part):
            if not blob.name.endswith("/"):
                yield Entry(f"gs://{part.bucket}/{blob.name}", blob.size or 0)
        return
    client = gcs.client()

    def names_before(subfolder: str, start: str) -> bool:
        return any(True for _ in client.list_blobs(part.bucket, prefix=subfolder, end_offset=start, max_results=1))

    blobs = client.list_blobs(part.bucket, prefix=part.prefix, delimiter=part.delimiter,
                              start_offset=part.start or None, end_offset=part.end or None)
    seen: set[str] = set()
    for page in blobs.pages:
        for name, item in _page_items(part.bucket, page, seen):
            if isinstance(item, Folder):
                if reports_subfolder(part, name, names_before):
                    yield beam.pvalue.TaggedOutput(FOLDERS, item)
            elif item is not None and name != part.skip:
                yield item


def classify(entry: Entry, input_dir: str) -> FileRef | Rejection:
    """A listed entry as a candidate image (FileRef) or a Rejection: skipped by name, or a problem."""
    relpath = relative_path(entry.path, input_dir)
    if is_local(entry.path):  # the name's bytes read as UTF-8 in any locale, as labels.txt and manifests hold names
        relpath = text_name(relpath)
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
        if entry.real:  # reached through a symlink: one record per real file (OnePerFile)
            yield beam.pvalue.TaggedOutput(ALIASES, (entry.real, result))
            return
        yield result


def one_per_file(item: tuple[str, list[FileRef]], input_dir: str):
    """(real path, the FileRefs whose paths reach it through a symlink) -> the one to read, if any; the others
    as SKIPPED Rejections (symlink_alias). A file the listing also reaches under its own name (inside the input
    folder, a candidate image by name) is read there, and every alias is skipped; else the first alias by name
    is read."""
    real, refs = item
    refs = sorted(refs, key=lambda ref: name_bytes(ref.relpath))
    root = os.path.realpath(input_dir)
    own = text_name(real[len(root):].lstrip("/")) if _inside(real, root) and real != root else None
    if own is not None and skip_reason(own) is None:
        kept, others = own, refs
    else:
        kept, others = refs[0].relpath, refs[1:]
        yield refs[0]
    for ref in others:
        counters.inc("files_skipped")
        yield beam.pvalue.TaggedOutput(SKIPPED, Rejection(
            ref.relpath, "skipped", SYMLINK_ALIAS,
            f"a symlink (or a path through a linked folder) to {quoted_name(kept)}, which is read under that name: "
            "one file is one record"))


class ListImages(beam.PTransform):
    """PBegin -> {"images": FileRef for every candidate image, SKIPPED: Rejection, FOUND: int}.

    SKIPPED holds the files skipped by name, the entries that cannot be used
    (stage 'rejected') and, in a local folder, each name that reaches through a
    symlink a file read under another name (symlink_alias: one file, one record).
    FOUND counts every entry listed (an int per bundle): the dataset
    description checks that each one was written, rejected or skipped.

    Listing runs inside the graph, so on Dataflow it needs nothing from the
    launcher's machine but the folder name. Each class folder is listed on
    whichever worker gets it, and a gs:// class folder longer than
    SMALL_FOLDER_PAGES pages is cut into parts that other workers list
    (FolderPart), so a large input, even one huge class folder, is listed by
    every worker at once and never held in one place. The levels above the
    class folders (the input folder; with split folders, each split folder)
    are listed the same way on gs://: their first pages in one place, the
    rest of a flat folder of millions of files in parts, listed a level deep
    (delimiter '/'), whose subfolders go on to be listed as class folders.
    A local input's top is walked in one place, streamed (a local disk is one
    device: its listing is a small share of a run, see docs/dataflow.md).
    """

    def __init__(self, input_dir: str, follow_symlinks: bool = False, split_folders: bool = False):
        super().__init__()
        self._input_dir = input_dir
        self._follow_symlinks = follow_symlinks
        self._depth = 2 if split_folders else 1

    def expand(self, pbegin):
        impulse = pbegin | "InputFolder" >> beam.Impulse()
        if is_local(self._input_dir):
            top = (impulse
                   # Entry above the class folders; Folder for each class folder, on FOLDERS
                   | "ListTop" >> beam.FlatMap(_tag_folders, self._input_dir, self._follow_symlinks, self._depth
                                               ).with_outputs(FOLDERS, main="entries"))
            entries, folders = [top.entries], top[FOLDERS]
        else:
            entries, folders = self._gcs_levels(impulse)
        deeper = (
            folders
            | "SpreadFolders" >> beam.Reshuffle()
            # Entry, streamed from each class folder's walk (or its gs:// listing: the first pages, and on PARTS
            # the FolderParts of the rest of a large folder)
            | "ListFolders" >> beam.FlatMap(list_folder_or_parts, self._input_dir, self._follow_symlinks
                                            ).with_outputs(PARTS, main="entries")
        )
        entries.append(deeper.entries)
        if not is_local(self._input_dir):  # a local class folder is walked whole: it is never cut into parts
            entries.append(
                deeper[PARTS]
                | "SpreadParts" >> beam.Reshuffle()
                # Entry of each part of a large gs:// class folder, on whichever worker gets it
                | "ListParts" >> beam.FlatMap(list_folder_part)
            )
        filtered = (
            entries
            | "AllEntries" >> beam.Flatten()
            # Entry -> FileRef (images) | Rejection (skipped, or a problem entry)
            | "FilterByName" >> beam.ParDo(_FilterByName(self._input_dir)).with_outputs(
                SKIPPED, FOUND, ALIASES, main="images")
        )
        if not is_local(self._input_dir):  # gs:// has no symlinks
            return {"images": filtered.images, SKIPPED: filtered[SKIPPED], FOUND: filtered[FOUND]}
        # one record per real file: the names that reach a file through a symlink, together (a few, usually none)
        one = (filtered[ALIASES]
               | "GroupByRealPath" >> beam.GroupByKey()
               | "OnePerFile" >> beam.FlatMap(one_per_file, self._input_dir).with_outputs(SKIPPED, main="images"))
        return {
            "images": (filtered.images, one.images) | "AllImages" >> beam.Flatten(),
            SKIPPED: (filtered[SKIPPED], one[SKIPPED]) | "AllSkipped" >> beam.Flatten(),
            FOUND: filtered[FOUND],
        }

    def _gcs_levels(self, impulse) -> tuple[list, beam.PCollection]:
        """The levels above the class folders of a gs:// input: ([Entry PCollections], Folder of each class
        folder). Each level (the input folder; with split folders, each split folder) is listed as a class folder
        is, a level deep: its first pages where it is, the rest of a flat level in parts on any worker."""
        entries = []
        levels = impulse | "TopFolder" >> beam.Map(lambda _, path: Folder(path), self._input_dir)
        for depth in range(self._depth):
            name = "Top" if depth == 0 else "Splits"
            if depth:
                levels = levels | f"Spread{name}" >> beam.Reshuffle()
            listed = (
                levels
                # Entry directly in the level; Folder of each subfolder, on FOLDERS; the rest of a long level as
                # FolderParts, on PARTS
                | f"List{name}" >> beam.FlatMap(list_folder_or_parts, self._input_dir, level=True).with_outputs(
                    FOLDERS, PARTS, main="entries")
            )
            parts = (
                listed[PARTS]
                | f"Spread{name}Parts" >> beam.Reshuffle()
                # Entry in each part of a long level, and the subfolders the part reports (on FOLDERS)
                | f"List{name}Parts" >> beam.FlatMap(list_folder_part).with_outputs(FOLDERS, main="entries")
            )
            entries += [listed.entries, parts.entries]
            levels = (listed[FOLDERS], parts[FOLDERS]) | f"{name}Subfolders" >> beam.Flatten()
        return entries, levels


def _tag_folders(_impulse, input_dir: str, follow_symlinks: bool, depth: int):
    for item in list_top(input_dir, follow_symlinks, depth):
        yield beam.pvalue.TaggedOutput(FOLDERS, item) if isinstance(item, Folder) else item
