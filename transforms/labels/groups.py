"""SummariseGroups: what --group_by found, for image_tfrecords.json and the summary.

AssignLabels emits (group, split, relpath) for every labelled image ('' as the
group when the regex is not found in the path: the image is then its own group).
The images of each group are brought together by group over the workers, and one
combine reduces them to a small dict: the number of groups, the images without a
group (counted, the first few by path), and the groups found in more than one
split. With hash splits that number is 0 by construction; with split folders it
is leakage that the folders hold (a subject in train and in validation).
"""

from __future__ import annotations

import heapq

import apache_beam as beam

MAX_EXAMPLES = 10


def empty_summary() -> dict:
    return {"groups": 0, "grouped_images": 0, "ungrouped_images": 0, "ungrouped_examples": [],
            "groups_in_several_splits": 0, "several_splits_examples": []}


def _per_group(group: str, splits) -> tuple:
    counts: dict[str, int] = {}
    for split in splits:
        counts[split] = counts.get(split, 0) + 1
    return ("group", group, tuple(sorted(counts.items())))


class _Summarise(beam.CombineFn):
    """('group', name, ((split, images), ...)) and ('ungrouped', relpath) -> the summary dict."""

    def create_accumulator(self):
        return empty_summary()

    def add_input(self, acc, element):
        if element[0] == "ungrouped":
            acc["ungrouped_images"] += 1
            acc["ungrouped_examples"] = heapq.nsmallest(MAX_EXAMPLES, [*acc["ungrouped_examples"], element[1]])
            return acc
        _, group, per_split = element
        acc["groups"] += 1
        acc["grouped_images"] += sum(n for _, n in per_split)
        if len(per_split) > 1:
            acc["groups_in_several_splits"] += 1
            entry = {"group": group, "images": dict(per_split)}
            acc["several_splits_examples"] = heapq.nsmallest(
                MAX_EXAMPLES, [*acc["several_splits_examples"], entry], key=lambda e: e["group"])
        return acc

    def merge_accumulators(self, accs):
        out = self.create_accumulator()
        for acc in accs:
            for key in ("groups", "grouped_images", "ungrouped_images", "groups_in_several_splits"):
                out[key] += acc[key]
            out["ungrouped_examples"] = heapq.nsmallest(MAX_EXAMPLES,
                                                        [*out["ungrouped_examples"], *acc["ungrouped_examples"]])
            out["several_splits_examples"] = heapq.nsmallest(
                MAX_EXAMPLES, [*out["several_splits_examples"], *acc["several_splits_examples"]],
                key=lambda e: e["group"])
        return out

    def extract_output(self, acc):
        return acc


class SummariseGroups(beam.PTransform):
    """(group or '', split, relpath) per labelled image -> one summary dict (see `empty_summary`)."""

    def expand(self, placed):
        grouped = (
            placed
            | "WithGroup" >> beam.Filter(lambda e: bool(e[0]))
            | "GroupSplit" >> beam.Map(lambda e: (e[0], e[1]))
            # (group, [split of each image]): spread over the workers by group
            | "ByGroup" >> beam.GroupByKey()
            | "PerGroup" >> beam.MapTuple(_per_group)
        )
        ungrouped = (
            placed
            | "WithoutGroup" >> beam.Filter(lambda e: not e[0])
            | "Ungrouped" >> beam.Map(lambda e: ("ungrouped", e[2]))
        )
        return (
            (grouped, ungrouped)
            | "Both" >> beam.Flatten()
            | "Summarise" >> beam.CombineGlobally(_Summarise())
        )
