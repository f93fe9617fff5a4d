"""Plain functions that decide, from a file's relative path alone, its class, split and order.

No bytes are read here: these run in the launcher (planning) and in the graph
(labelling), and must give the same answer in both.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import unicodedata
from collections.abc import Iterable
from typing import NamedTuple

import regex

from transforms.base.dataset_format import SPLITS, split_of
from transforms.base.paths import IMAGE_EXTENSIONS, display_path, name_bytes

# --unlabeled: the one split of a set of images without labels (a test set to predict).
UNLABELED_SPLIT = "test"

# Skip reasons (stage 'skipped': the file is never opened).
HIDDEN = "hidden_file"
NOT_AN_IMAGE_EXTENSION = "not_an_image_extension"
NO_CLASS_FOLDER = "no_class_folder"
UNKNOWN_CLASS = "unknown_class"
OUTSIDE_SPLIT_FOLDERS = "outside_split_folders"
IN_A_SUBFOLDER = "in_a_subfolder"  # --unlabeled takes the images directly in the input folder
NO_LABEL_IN_PATH = "no_label_in_path"  # --label_from does not match the path, or its label group captures nothing
# Rejection reason: the label --label_from finds is one labels.txt cannot hold (class_name_problem).
BAD_LABEL_IN_PATH = "bad_label_in_path"
# Rejection reason (stage 'rejected'): --group_by found no answer on this path within its time limit.
GROUP_BY_TIMEOUT = "group_by_timeout"
LABEL_FROM_TIMEOUT = "label_from_timeout"  # the same, for --label_from
# Rejection reason: a label found in the job that differs from a class's name only in letter case or Unicode normal
# form (kept_spellings), from --label_from or a manifest without --labels_file.
SAME_LABEL_OTHER_SPELLING = "same_label_other_spelling"
# A match on one path takes microseconds; a pattern that backtracks (nested repeats such as (a|aa)+$) can take
# longer than the age of the universe. The `regex` engine (re's syntax) stops a match at this limit.
GROUP_BY_TIMEOUT_S = 1.0


class Placement(NamedTuple):
    """Where a file goes: its split and class name, and its --group_by group ('' for none)."""

    split: str
    class_name: str
    group: str = ""


def hidden_reason(relpath: str) -> tuple[str, str] | None:
    """(reason, detail) when a part of `relpath` is hidden (starts with '.'), else None."""
    hidden = [p for p in relpath.split("/") if p.startswith(".")]
    if hidden:
        return HIDDEN, f"hidden name {display_path(hidden[0])!r} (names starting with '.' are skipped)"
    return None


def class_name_problem(name: str) -> str | None:
    """Why a class folder name cannot be written to labels.txt and read back exactly, else None.

    labels.txt holds one name per line and --labels_file strips each line, so a
    name must be UTF-8, hold no line break or other control character, and have
    no leading or trailing whitespace. A backslash is refused too: other systems
    read it as a path separator (as this tool once did).
    """
    if name_bytes(name).decode("utf-8", "replace") != name:
        return "a name that is not UTF-8, which labels.txt (UTF-8 text) cannot hold"
    if any(c in name for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"):
        return "a line break in its name, which labels.txt (one class per line) cannot hold"
    if any(unicodedata.category(c) == "Cc" for c in name):
        return "a control character in its name, which labels.txt cannot hold exactly"
    if name != name.strip() or name.startswith("\ufeff"):
        return "leading or trailing whitespace in its name, which --labels_file would strip"
    if "\\" in name or "/" in name:
        return "a backslash in its name, which other systems read as a path separator"
    return None


def _folded(name: str) -> str:
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", name).casefold())


def same_class_names(names: Iterable[str]) -> tuple[str, str, str] | None:
    """Two of `names` that differ only in letter case or Unicode normal form (`Dog` and `dog`; `café` written
    with é or with e and a combining accent), and how they differ, else None: the first pair in sorted order.

    Such names look like one class but would be two: a case-insensitive file system (macOS, Windows) holds
    them as one folder, and a copy there merges or loses them; NFC and NFD forms print the same.
    """
    seen: dict[str, str] = {}
    for name in sorted(names):
        key = _folded(name)
        if key in seen:
            first = seen[key]
            how = ("differ only in their Unicode normal form (the same letters, composed or with combining marks)"
                   if unicodedata.normalize("NFC", first) == unicodedata.normalize("NFC", name)
                   else "differ only in letter case")
            return first, name, how
        seen[key] = name
    return None


def spelling_key(name: str) -> str:
    """What two names that differ only in letter case or Unicode normal form (`same_class_names`) share."""
    return _folded(name)


def kept_spellings(counted: Iterable[tuple[str, int]]) -> list[str]:
    """The sorted class names of (label, number of images) pairs when labels found in the job may differ only in
    letter case or Unicode normal form ('Cat' and 'cat'): of each such set the label of the most images is kept
    (on a tie the first in sorted order); the images of the others are rejected (SAME_LABEL_OTHER_SPELLING), never
    made a second class that reads as the first."""
    best: dict[str, tuple[int, str]] = {}
    for name, count in counted:
        key = _folded(name)
        if key not in best or (-count, name) < (-best[key][0], best[key][1]):
            best[key] = (count, name)
    return class_order(name for _, name in best.values())


_INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits only: int() also takes other scripts' digits, '+1' and '1_0'


def _integer_names(names: list[str]) -> bool:
    return bool(names) and all(_INTEGER.fullmatch(name) for name in names)


def _same_number(names: list[str]) -> tuple[str, str] | None:
    """Two of `names` (all integers) that are the same number ('01' and '1'), else None."""
    seen: dict[int, str] = {}
    for name in sorted(names):
        if int(name) in seen:
            return seen[int(name)], name
        seen[int(name)] = name
    return None


def class_order(names: Iterable[str]) -> list[str]:
    """The class names in the order of their ids (line i of labels.txt is id i), when no --labels_file gives it.

    Text order, except when every name is an integer: then numeric order (1, 2, ..., 10, not 1, 10, 2), so that
    class "10" gets id 9. Should two names be the same number ('01' and '1'), neither order is clear, and the
    text order stays (`class_order_note` says so). Every place that orders class names (class folders, a
    manifest's labels found in the job) calls this one function; an append keeps its dataset's order.
    """
    names = sorted(set(names))
    if not _integer_names(names) or _same_number(names):
        return names
    return sorted(names, key=int)


def class_order_note(names: Iterable[str]) -> str | None:
    """The line that says how integer class names were ordered, when it is not plain text order, or when two names
    are the same number; else None."""
    names = sorted(set(names))
    if not _integer_names(names):
        return None
    same = _same_number(names)
    if same:
        return (f"class names are all integers, but {same[0]!r} and {same[1]!r} are the same number: ids follow "
                "their text order (" + ", ".join(f"{n} -> {i}" for i, n in enumerate(names[:4])) + ", ...); "
                "rename one of them, or give --labels_file for the order you want")
    ordered = class_order(names)
    if ordered == names:
        return None
    shown = [f"{n} -> {i}" for i, n in enumerate(ordered)]
    shown = shown if len(shown) <= 4 else [*shown[:3], "...", shown[-1]]
    first = next(i for i, (text, number) in enumerate(zip(names, ordered, strict=True)) if text != number)
    return (f"class names are all integers: ids follow their numeric order, {', '.join(shown)} (not their text "
            f"order, where {names[first]} comes before {ordered[first]}); give --labels_file for another order")


def skip_reason(relpath: str) -> tuple[str, str] | None:
    """Why a file is skipped by its name alone, as (reason, detail); None for a candidate image."""
    parts = relpath.split("/")
    hidden = hidden_reason(relpath)
    if hidden:
        return hidden
    ext = posixpath.splitext(parts[-1])[1].lower()
    if ext not in IMAGE_EXTENSIONS:
        shown = ext or "(none)"
        return NOT_AN_IMAGE_EXTENSION, f"extension {shown} is not an image extension"
    return None


def split_folder_layout(top_level_folders: Iterable[str]) -> bool:
    """True when the top-level folders are split folders (train/, validation/ or val/, test/, or another name of
    transforms.base.dataset_format.SPLIT_NAMES: training_set/, test_set/, dev/, ...).

    Raises ValueError when split folders are mixed with other folders, because
    then neither reading of the tree is safe.
    """
    names = set(top_level_folders)
    split_like = {n for n in names if split_of(n)}
    if "train" not in {split_of(n) for n in split_like}:
        return False
    others = sorted(names - split_like)
    if others:
        raise ValueError(
            f"the input folder mixes split folders ({', '.join(sorted(split_like))}) with other "
            f"folders ({', '.join(others[:5])}); use either <input>/<split>/<class>/<image> "
            "or <input>/<class>/<image>"
        )
    canonical = [split_of(n) for n in split_like]
    dupes = sorted({c for c in canonical if canonical.count(c) > 1})
    if dupes:
        raise ValueError(
            f"the input folder has more than one folder for the split {dupes[0]!r} "
            f"({', '.join(sorted(n for n in split_like if split_of(n) == dupes[0]))}); keep one"
        )
    return True


def _hash64(*parts: str) -> int:
    # A name that is not UTF-8 hashes by its bytes; a UTF-8 name hashes exactly as it always did.
    digest = hashlib.blake2b(name_bytes("\0".join(parts)), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def shuffle_key(relpath: str, seed: int) -> int:
    """A stable pseudo-random 64-bit key: sorting by it shuffles the dataset reproducibly."""
    return _hash64("order", str(seed), relpath)


def hash_split(relpath: str, seed: int, validation_split: float, test_split: float) -> str:
    """The split of a file by a hash of its relative path and the seed.

    A file's split depends on nothing but its own path, so it keeps its split
    when other files are added or removed in a later run.
    """
    u = _hash64("split", str(seed), relpath) / 2.0**64
    if u < validation_split:
        return "validation"
    if u < validation_split + test_split:
        return "test"
    return "train"


class GroupByTimeout(ValueError):
    """--group_by did not finish on one path within GROUP_BY_TIMEOUT_S; str() says so, for errors.jsonl."""


def compile_group_by(pattern: str) -> regex.Pattern:
    """--group_by compiled for `group_of`, by the `regex` engine (re's syntax, matches with a time limit).

    Raises:
        regex.error: `pattern` is not a regular expression.
    """
    return regex.compile(pattern)


def group_of(relpath: str, group_by: regex.Pattern | None) -> str:
    """The --group_by group of `relpath`: the regex's first capture group where it is found in the path (the
    whole match when it has no group), or '' when it is not found or captures nothing.

    Raises:
        GroupByTimeout: the match took over GROUP_BY_TIMEOUT_S (a pattern that backtracks on this path).
    """
    if group_by is None:
        return ""
    match = _search(group_by, relpath, "--group_by")
    if match is None:
        return ""
    return (match.group(1) if group_by.groups else match.group(0)) or ""


def _search(pattern: regex.Pattern, relpath: str, flag: str) -> regex.Match | None:
    try:
        return pattern.search(relpath, timeout=GROUP_BY_TIMEOUT_S)
    except TimeoutError:
        raise GroupByTimeout(
            f"{flag}={pattern.pattern!r} found no answer on this path within {GROUP_BY_TIMEOUT_S:g} s: the "
            "pattern backtracks (nested repeats such as (a+)+ or (a|aa)+); simplify it") from None


LABEL_GROUP, GROUP_GROUP = "label", "group"  # --label_from's named groups: the class name, and the image's group
LABEL_FROM_EXAMPLE = r"'(?P<label>[^/]+)_\d+\.[^/.]+$' (Abyssinian_12.jpg -> Abyssinian)"


def label_from_problem(pattern: str) -> str | None:
    """Why `pattern` cannot be --label_from, as the end of a sentence ('is not a regular expression (...)'), else
    None: it must compile (`compile_group_by`'s engine) and have a named group `label`."""
    try:
        compiled = compile_group_by(pattern)
    except regex.error as e:
        return f"is not a regular expression ({e})"
    if LABEL_GROUP not in compiled.groupindex:
        return "has no named group label, which says which part of the path is the class name"
    return None


def has_group_capture(pattern: str | None) -> bool:
    """Whether --label_from `pattern` names a group `group` (the image's --group_by group)."""
    return bool(pattern) and GROUP_GROUP in compile_group_by(pattern).groupindex


class PathLabel(NamedTuple):
    """What --label_from and the layout give an image: its split ('' for the hash split), class name and group."""

    split: str
    class_name: str
    group: str = ""


def place_by_path(relpath: str, label_from: regex.Pattern, *, split_folders: bool
                  ) -> PathLabel | tuple[str, str]:
    """The split folder's split (with split folders; else '', for the hash split), the class name and group that
    --label_from finds in `relpath` (the path below the input folder, split folder included), or a (reason,
    detail) skip: outside the split folders, or no match or an empty label (NO_LABEL_IN_PATH); LABEL_FROM_TIMEOUT
    is a rejection. Class folders play no part: the pattern decides the class wherever the image is."""
    split = ""
    if split_folders:
        split = split_of(relpath.split("/")[0]) if "/" in relpath else None
        if split is None:
            return OUTSIDE_SPLIT_FOLDERS, "not inside a train/, validation/ (or val/, dev/) or test/ folder"
    try:
        match = _search(label_from, relpath, "--label_from")
    except GroupByTimeout as e:
        return LABEL_FROM_TIMEOUT, str(e)
    label = match.group(LABEL_GROUP) if match else None
    if not label:
        how = "does not match the path" if match is None else "matches, but its group label captures nothing"
        return NO_LABEL_IN_PATH, f"--label_from='{label_from.pattern}' {how}: no class name in it"
    group = (match.group(GROUP_GROUP) or "") if GROUP_GROUP in label_from.groupindex else ""
    return PathLabel(split, label, group)


# --label_from patterns the flat-folder error suggests, tried in this order on the folder's first names: a label, a
# separator, a number, the extension ('cat.123.jpg', 'Abyssinian_12.jpg', 'rose-7.png', 'img 3.jpg').
LABEL_FROM_SUGGESTIONS = (
    r"(?P<label>[^/.]+)\.\d+\.[^/.]+$",
    r"(?P<label>[^/]+)_\d+\.[^/.]+$",
    r"(?P<label>[^/]+)-\d+\.[^/.]+$",
    r"(?P<label>[^/]+) \d+\.[^/.]+$",
)


def suggest_label_from(relpaths: list[str]) -> tuple[str, list[tuple[str, str]]] | None:
    """The --label_from pattern of LABEL_FROM_SUGGESTIONS that finds a label in the most of `relpaths` (a folder's
    first image names, below the input folder), at least half of them, with (name, label) for the first name of
    each of up to three labels; None when none fits."""
    best: list[tuple[str, str]] = []
    chosen = ""
    for pattern in LABEL_FROM_SUGGESTIONS:
        compiled = compile_group_by(pattern)
        labels = [(path, match.group(LABEL_GROUP)) for path in relpaths
                  for match in [_search(compiled, path, "--label_from")] if match]
        if len(labels) > len(best):
            best, chosen = labels, pattern
    if not best or 2 * len(best) < len(relpaths):
        return None
    shown: dict[str, str] = {}
    for path, label in best:
        if label not in shown and len(shown) < 3:
            shown[label] = posixpath.basename(path)
    return chosen, [(name, label) for label, name in shown.items()]


def place(
    relpath: str,
    *,
    split_folders: bool,
    seed: int,
    validation_split: float,
    test_split: float,
    group_by: regex.Pattern | None = None,
    unlabeled: bool = False,
    split: str | None = None,
) -> Placement | tuple[str, str]:
    """The split and class of an image from its relative path, or a (reason, detail) skip (GROUP_BY_TIMEOUT: a
    rejection).

    With `group_by`, the split hash takes the image's group instead of its path, so every image of a group
    lands in the same split; a path without a group is its own group (its split is the one it has without
    `group_by`). Split folders keep their images: the group is only recorded (to check for leakage); so does
    `split`, the split a --split_lists list gives the image (no hash is taken then).
    With `unlabeled`, an image directly in the input folder goes to UNLABELED_SPLIT, of no class ('').
    """
    parts = relpath.split("/")
    if unlabeled:
        if len(parts) > 1:
            return IN_A_SUBFOLDER, "in a folder below the input folder; --unlabeled takes the images directly in it"
        return Placement(UNLABELED_SPLIT, "")
    if split_folders:
        split = split_of(parts[0])
        if split is None:
            return OUTSIDE_SPLIT_FOLDERS, "not inside a train/, validation/ (or val/, dev/) or test/ folder"
        parts = parts[1:]
    if len(parts) < 2:
        where = "the split folder" if split_folders else "the input folder"
        return NO_CLASS_FOLDER, f"image directly in {where}, not in a class folder"
    class_name = parts[0]
    try:
        group = group_of(relpath, group_by)
    except GroupByTimeout as e:
        return GROUP_BY_TIMEOUT, str(e)
    if split is None:
        split = hash_split(group or relpath, seed, validation_split, test_split)
    return Placement(split, class_name, group)


def split_folder_note(top_level_folders: Iterable[str]) -> str:
    """The one line that says which folder became which split: 'split folders: test_set/ -> test, ...'."""
    pairs = sorted((split_of(n) or "", n) for n in top_level_folders)
    order = {name: i for i, name in enumerate(SPLITS)}
    pairs.sort(key=lambda pair: order.get(pair[0], len(SPLITS)))
    return "split folders: " + ", ".join(f"{name}/ -> {split}" for split, name in pairs)


def nested_class_folders(image_relpaths: Iterable[str], split_folders: bool) -> dict[str, set[str]] | None:
    """When every image seen sits in a folder inside its class folder (set_a/cats/1.jpg), the class folders
    and the folders found in them ({'set_a': {'cats', 'dogs'}}), else None: such "classes" are folders of
    class folders, most likely split folders under names this tool does not know."""
    base = 2 if split_folders else 1
    found: dict[str, set[str]] = {}
    for relpath in image_relpaths:
        parts = relpath.split("/")
        if len(parts) <= base + 1:
            return None  # an image directly in its class folder: a real class
        found.setdefault("/".join(parts[:base]), set()).add(parts[base])
    return found or None
