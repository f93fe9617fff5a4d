"""The kinds of duplicate groups and their words, without Beam: the converter's FindDuplicates
(transforms/inputs/duplicates.py), its summary and pipeline.verify count and name them alike.

A group is one of three kinds:

- `within_split`: every copy has the same label and the same split (harmless, but weights the image twice);
- `across_splits`: the same label in two splits (leakage: the model is evaluated on what it trained on);
- `conflicting_labels`: the copies carry different labels (a conflict: no label is right for both).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import NamedTuple

WITHIN_SPLIT = "within_split"
ACROSS_SPLITS = "across_splits"
CONFLICTING_LABELS = "conflicting_labels"
KINDS = (WITHIN_SPLIT, ACROSS_SPLITS, CONFLICTING_LABELS)
MAX_EXAMPLES = 20  # groups listed in image_tfrecords.json, the largest first; the counts cover every group
EXAMPLE_COPIES = 5  # copies listed per group, the first by path; the group's "count" has them all
# How the converter's summary and pipeline.verify name each kind: one set of words for both.
KIND_WORDS = {WITHIN_SPLIT: "within a split", ACROSS_SPLITS: "across splits (leakage)",
              CONFLICTING_LABELS: "with different labels (conflict)"}


class DuplicateGroup(NamedTuple):
    """Byte-identical source files: their hash and copies' (split, label, relpath), sorted by path.

    Built from a stream (`duplicate_groups`), `copies` holds the first EXAMPLE_COPIES only, `count` all of them
    and `kind` their kind; built from every copy (pipeline.verify), the defaults say so.
    """

    sha256: str
    copies: tuple[tuple[str, int, str], ...]
    count: int = 0  # copies in all; 0: len(copies)
    kind: str = ""  # of all the copies; "": from `copies`

    @property
    def size(self) -> int:
        return self.count or len(self.copies)


def kind(group: DuplicateGroup) -> str:
    """The group's kind: conflicting_labels before across_splits before within_split."""
    if group.kind:
        return group.kind
    if len({label for _, label, _ in group.copies}) > 1:
        return CONFLICTING_LABELS
    if len({split for split, _, _ in group.copies}) > 1:
        return ACROSS_SPLITS
    return WITHIN_SPLIT


def label_value(label) -> int | tuple[int, ...] | None:
    """A copy's label: a class id, or (--multi_label) a tuple of class ids, compared as a set (sorted)."""
    if isinstance(label, list | tuple):
        return tuple(sorted({int(i) for i in label}))
    return None if label is None else int(label)  # None: an unlabeled set's image (--unlabeled)


def label_text(label, class_names: list[str]) -> str:
    """A copy's label as its class name; a multi-label set as its names joined by ';'."""
    if isinstance(label, list | tuple):
        return ";".join(label_text(i, class_names) for i in label)
    if label is None:  # an unlabeled set's image (--unlabeled)
        return ""
    return class_names[label] if 0 <= label < len(class_names) else str(label)


def duplicate_groups(sha256: str, copies: Iterable[tuple[str, int, str]]) -> list[DuplicateGroup]:
    """[the group] when `copies` holds two or more files, else []. One pass over `copies`, in bounded memory:
    the group keeps its count, its kind and its first EXAMPLE_COPIES copies by path."""
    seen = {"count": 0, "labels_differ": False, "splits_differ": False}
    first: list[tuple] = []

    def stream():
        for s, label, path in copies:
            copy = (str(s), label_value(label), str(path))
            seen["count"] += 1
            if not first:
                first.append(copy)
            seen["labels_differ"] = seen["labels_differ"] or copy[1] != first[0][1]
            seen["splits_differ"] = seen["splits_differ"] or copy[0] != first[0][0]
            yield copy

    examples = tuple(heapq.nsmallest(EXAMPLE_COPIES, stream(), key=_by_path))  # holds EXAMPLE_COPIES at most
    if not sha256 or seen["count"] < 2:
        return []
    found = (CONFLICTING_LABELS if seen["labels_differ"] else ACROSS_SPLITS if seen["splits_differ"]
             else WITHIN_SPLIT)
    return [DuplicateGroup(sha256, examples, seen["count"], found)]


def _by_path(copy: tuple[str, int | tuple, str]):
    return copy[2], copy


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
        counts["copies"] += group.size
        counts[kind(group)] += 1
    return counts


def empty_summary() -> dict:
    return {"groups": 0, "copies": 0, **{k: 0 for k in KINDS}, "examples": []}
