"""The kinds of duplicate groups and their words, without Beam: the converter's FindDuplicates
(transforms/duplicates.py), its summary and pipeline.verify count and name them alike.

A group is one of three kinds:

- `within_split`: every copy has the same label and the same split (harmless, but weights the image twice);
- `across_splits`: the same label in two splits (leakage: the model is evaluated on what it trained on);
- `conflicting_labels`: the copies carry different labels (a conflict: no label is right for both).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

WITHIN_SPLIT = "within_split"
ACROSS_SPLITS = "across_splits"
CONFLICTING_LABELS = "conflicting_labels"
KINDS = (WITHIN_SPLIT, ACROSS_SPLITS, CONFLICTING_LABELS)
MAX_EXAMPLES = 20  # groups listed in image_tfrecords.json; the counts cover every group
# How the converter's summary and pipeline.verify name each kind: one set of words for both.
KIND_WORDS = {WITHIN_SPLIT: "within a split", ACROSS_SPLITS: "across splits (leakage)",
              CONFLICTING_LABELS: "with different labels (conflict)"}


class DuplicateGroup(NamedTuple):
    """Byte-identical source files: their hash and each copy's (split, label, relpath), sorted by path."""

    sha256: str
    copies: tuple[tuple[str, int, str], ...]


def kind(group: DuplicateGroup) -> str:
    """The group's kind: conflicting_labels before across_splits before within_split."""
    if len({label for _, label, _ in group.copies}) > 1:
        return CONFLICTING_LABELS
    if len({split for split, _, _ in group.copies}) > 1:
        return ACROSS_SPLITS
    return WITHIN_SPLIT


def label_value(label) -> int | tuple[int, ...]:
    """A copy's label: a class id, or (--multi_label) a tuple of class ids, compared as a set (sorted)."""
    if isinstance(label, list | tuple):
        return tuple(sorted({int(i) for i in label}))
    return int(label)


def label_text(label, class_names: list[str]) -> str:
    """A copy's label as its class name; a multi-label set as its names joined by ';'."""
    if isinstance(label, list | tuple):
        return ";".join(label_text(i, class_names) for i in label)
    return class_names[label] if 0 <= label < len(class_names) else str(label)


def duplicate_groups(sha256: str, copies: Iterable[tuple[str, int, str]]) -> list[DuplicateGroup]:
    """[the group] when `copies` holds two or more files, else []."""
    copies = sorted(((str(s), label_value(label), str(path)) for s, label, path in copies), key=lambda c: (c[2], c))
    if not sha256 or len(copies) < 2:
        return []
    return [DuplicateGroup(sha256, tuple(copies))]


def summary_line(found: dict) -> str:
    """'Duplicates: N groups of identical source files (M files): a within a split, b across splits (leakage),
    c with different labels (conflict)': the words of the converter's summary and of pipeline.verify."""
    kinds = ", ".join(f"{found.get(k, 0)} {KIND_WORDS[k]}" for k in KINDS)
    return f"Duplicates: {found['groups']} groups of identical source files ({found['copies']} files): {kinds}"


def count_groups(groups: Iterable[DuplicateGroup]) -> dict:
    """The counts of `groups` as image_tfrecords.json's "duplicates" holds them (groups, copies, each kind)."""
    counts = {"groups": 0, "copies": 0, **dict.fromkeys(KINDS, 0)}
    for group in groups:
        counts["groups"] += 1
        counts["copies"] += len(group.copies)
        counts[kind(group)] += 1
    return counts


def empty_summary() -> dict:
    return {"groups": 0, "copies": 0, **{k: 0 for k in KINDS}, "examples": []}
