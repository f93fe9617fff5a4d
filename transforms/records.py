"""Typed elements that flow through the graph, so steps never index tuples."""

from __future__ import annotations

from typing import NamedTuple

from transforms.layout import display_path


class FileRef(NamedTuple):
    """A file found under the input folder (metadata only, no bytes)."""

    path: str  # full path or URL, as the file system names it
    relpath: str  # path below input_dir, always with '/' separators; not-UTF-8 bytes as surrogates
    size: int  # bytes


class ImageRef(NamedTuple):
    """An image file with its label and split assigned; still no bytes read."""

    path: str
    relpath: str
    size: int
    split: str
    class_name: str
    label: int
    shuffle_key: int  # 64-bit hash of (seed, relpath): a stable random order
    extras: tuple = ()  # typed extra features, ((key, dtype, values), ...): see transforms.features


class Rejection(NamedTuple):
    """A file that is not in the dataset, and why. Feeds the error report."""

    relpath: str
    stage: str  # 'skipped' (by name, never opened) or 'rejected' (not converted, or an entry the listing cannot use)
    reason: str  # short machine-readable reason, e.g. 'truncated'
    detail: str  # human-readable message, e.g. the decoder's own

    def to_json(self) -> dict:
        """As written to errors.jsonl: a file name that is not UTF-8 shows its bytes as \\xNN."""
        return {key: display_path(value) if isinstance(value, str) else value for key, value in self._asdict().items()}
