"""FindDuplicates: exact-duplicate source files (same SHA-256 of their bytes) among the written images.

Every written image comes with (sha256, (split, label, relpath)) from WriteShards.
Grouping by the hash spreads the hashes over the workers (no worker holds them
all); only the groups of two or more copies go on, and one combine reduces them
to the counts and the first groups (by their first path) that dataset_info.json
reports. A group is one of three kinds:

- `within_split`: every copy has the same label and the same split (harmless, but weights the image twice);
- `across_splits`: the same label in two splits (leakage: the model is evaluated on what it trained on);
- `conflicting_labels`: the copies carry different labels (a conflict: no label is right for both).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import NamedTuple

import apache_beam as beam

WITHIN_SPLIT = "within_split"
ACROSS_SPLITS = "across_splits"
CONFLICTING_LABELS = "conflicting_labels"
KINDS = (WITHIN_SPLIT, ACROSS_SPLITS, CONFLICTING_LABELS)
MAX_EXAMPLES = 20  # groups listed in dataset_info.json; the counts cover every group


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


def duplicate_groups(sha256: str, copies: Iterable[tuple[str, int, str]]) -> list[DuplicateGroup]:
    """[the group] when `copies` holds two or more files, else []."""
    copies = sorted((str(s), int(label), str(path)) for s, label, path in copies)
    if not sha256 or len(copies) < 2:
        return []
    return [DuplicateGroup(sha256, tuple(copies))]


def empty_summary() -> dict:
    return {"groups": 0, "copies": 0, **{k: 0 for k in KINDS}, "examples": []}


class _Summarise(beam.CombineFn):
    """DuplicateGroup -> the counts per kind and the first MAX_EXAMPLES groups by their first path."""

    def create_accumulator(self):
        return empty_summary()

    def add_input(self, acc, group):
        group = DuplicateGroup(group[0], tuple(tuple(c) for c in group[1]))
        acc["groups"] += 1
        acc["copies"] += len(group.copies)
        acc[kind(group)] += 1
        acc["examples"] = heapq.nsmallest(MAX_EXAMPLES, [*acc["examples"], (group.copies[0][2], group)])
        return acc

    def merge_accumulators(self, accs):
        out = self.create_accumulator()
        for acc in accs:
            for key in ("groups", "copies", *KINDS):
                out[key] += acc[key]
            out["examples"] = heapq.nsmallest(MAX_EXAMPLES, [*out["examples"], *acc["examples"]])
        return out

    def extract_output(self, acc):
        return acc


def describe(summary: dict | None, class_names: list[str]) -> dict:
    """The `duplicates` section of dataset_info.json from the combined summary (None: no duplicates)."""
    summary = summary or empty_summary()
    examples = []
    for _, (sha256, copies) in sorted(summary["examples"]):
        group = DuplicateGroup(sha256, tuple(tuple(c) for c in copies))
        examples.append({
            "sha256": sha256,
            "kind": kind(group),
            "copies": [{"relpath": path, "split": split,
                        "class_name": class_names[label] if 0 <= label < len(class_names) else str(label)}
                       for split, label, path in group.copies],
        })
    return {"groups": summary["groups"], "copies": summary["copies"],
            **{k: summary[k] for k in KINDS}, "examples": examples}


class FindDuplicates(beam.PTransform):
    """(sha256, (split, label, relpath)) of every written image -> one summary dict (see `describe`)."""

    def expand(self, hashes):
        return (
            hashes
            # (sha256, [(split, label, relpath)]): spread over the workers by hash
            | "GroupByHash" >> beam.GroupByKey()
            | "KeepCopies" >> beam.FlatMapTuple(duplicate_groups)
            | "Summarise" >> beam.CombineGlobally(_Summarise())
        )
