"""Plain functions that decide, from a file's relative path alone, its class, split and order.

No bytes are read here: these run in the launcher (planning) and in the graph
(labelling), and must give the same answer in both.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterable
from typing import NamedTuple

# Extensions recognised as images (case-insensitive). Decoding goes by content,
# so a PNG behind a .jpg name is fine; a file with another extension is skipped.
IMAGE_EXTENSIONS = frozenset(
    {
        ".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".gif", ".bmp", ".dib",
        ".webp", ".tif", ".tiff", ".mpo",
    }
)

SPLIT_FOLDER_NAMES = {
    "train": "train",
    "training": "train",
    "validation": "validation",
    "valid": "validation",
    "val": "validation",
    "test": "test",
    "testing": "test",
}

SPLITS = ("train", "validation", "test")

# Skip reasons (stage 'skipped': the file is never opened).
HIDDEN = "hidden_file"
NOT_AN_IMAGE_EXTENSION = "not_an_image_extension"
NO_CLASS_FOLDER = "no_class_folder"
UNKNOWN_CLASS = "unknown_class"
OUTSIDE_SPLIT_FOLDERS = "outside_split_folders"


class Placement(NamedTuple):
    """Where a file goes: its split and class name."""

    split: str
    class_name: str


def relative_path(path: str, input_dir: str) -> str:
    """The path of `path` below `input_dir`, with '/' separators."""
    base = input_dir.rstrip("/\\")
    if not path.startswith(base):
        raise ValueError(f"{path!r} is not below {input_dir!r}")
    return path[len(base):].lstrip("/\\").replace("\\", "/")


def skip_reason(relpath: str) -> tuple[str, str] | None:
    """Why a file is skipped by its name alone, as (reason, detail); None for a candidate image."""
    parts = relpath.split("/")
    hidden = [p for p in parts if p.startswith(".")]
    if hidden:
        return HIDDEN, f"hidden name {hidden[0]!r} (names starting with '.' are skipped)"
    ext = posixpath.splitext(parts[-1])[1].lower()
    if ext not in IMAGE_EXTENSIONS:
        shown = ext or "(none)"
        return NOT_AN_IMAGE_EXTENSION, f"extension {shown} is not an image extension"
    return None


def split_folder_layout(top_level_folders: Iterable[str]) -> bool:
    """True when the top-level folders are split folders (train/, validation/ or val/, test/).

    Raises ValueError when split folders are mixed with other folders, because
    then neither reading of the tree is safe.
    """
    names = set(top_level_folders)
    split_like = {n for n in names if n.lower() in SPLIT_FOLDER_NAMES}
    if "train" not in {SPLIT_FOLDER_NAMES[n.lower()] for n in split_like}:
        return False
    others = sorted(names - split_like)
    if others:
        raise ValueError(
            f"the input folder mixes split folders ({', '.join(sorted(split_like))}) with other "
            f"folders ({', '.join(others[:5])}); use either <input>/<split>/<class>/<image> "
            "or <input>/<class>/<image>"
        )
    canonical = [SPLIT_FOLDER_NAMES[n.lower()] for n in split_like]
    dupes = sorted({c for c in canonical if canonical.count(c) > 1})
    if dupes:
        raise ValueError(
            f"the input folder has more than one folder for the split {dupes[0]!r} "
            f"({', '.join(sorted(n for n in split_like if SPLIT_FOLDER_NAMES[n.lower()] == dupes[0]))}); keep one"
        )
    return True


def _hash64(*parts: str) -> int:
    digest = hashlib.blake2b("\0".join(parts).encode("utf-8"), digest_size=8).digest()
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


def place(
    relpath: str,
    *,
    split_folders: bool,
    seed: int,
    validation_split: float,
    test_split: float,
) -> Placement | tuple[str, str]:
    """The split and class of an image from its relative path, or a (reason, detail) skip."""
    parts = relpath.split("/")
    if split_folders:
        split = SPLIT_FOLDER_NAMES.get(parts[0].lower())
        if split is None:
            return OUTSIDE_SPLIT_FOLDERS, "not inside a train/, validation/ (or val/) or test/ folder"
        parts = parts[1:]
    if len(parts) < 2:
        where = "the split folder" if split_folders else "the input folder"
        return NO_CLASS_FOLDER, f"image directly in {where}, not in a class folder"
    class_name = parts[0]
    if not split_folders:
        split = hash_split(relpath, seed, validation_split, test_split)
    return Placement(split, class_name)


def class_folder_names(relpaths: Iterable[str], split_folders: bool) -> list[str]:
    """The sorted class names that image paths imply."""
    names = set()
    for relpath in relpaths:
        parts = relpath.split("/")
        if split_folders:
            parts = parts[1:]
        if len(parts) >= 2:
            names.add(parts[0])
    return sorted(names)
