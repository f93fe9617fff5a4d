"""PublishDataset, the graph's last step: the run's description (errors.jsonl, labels.txt, TFDS's files and, last,
image_tfrecords.json) written, the run's files published under their final names (transforms.output.publishing)
and the lock released.

`image_tfrecords.json` is this tool's description of the dataset and the marker
that it is complete: it is written only after every shard is final and its
record count matches what was converted, and it is written under a temporary
name and renamed into place. Before it: TFDS's label.labels.txt, features.json
and dataset_info.json (transforms/output/tfds_metadata.py), so that
`tfds.builder_from_directory` loads the folder.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms.base import bounded
from transforms.base.dataset_format import (
    DETECTION,
    ERRORS_FILE,
    FORMAT_VERSION,
    INFO_FILE,
    LABEL_MAP_FILE,
    LABELS_FILE,
    SPLITS,
    UNPUBLISHED_DIR,
    index_name,
    parse_description,
)
from transforms.base.examples import detection_feature_description, feature_description
from transforms.base.features import describe as describe_features
from transforms.detection.conversion import (
    ALREADY_IN_DATASET,
    ANNOTATION,
    CLASS_OBJECTS,
    NO_OBJECTS,
    annotations_problem,
    detection_section,
    grown_section,
    per_class,
)
from transforms.detection.records import label_map_text
from transforms.images import stats as pixel_stats
from transforms.images.imaging import converter_libraries
from transforms.inputs import append
from transforms.inputs import duplicates as dup
from transforms.labels.groups import SummariseGroups
from transforms.output import tfds_metadata
from transforms.output.files import read_text, write_file
from transforms.output.lock import release_lock
from transforms.output.ownership import check_own_paths, run_dir
from transforms.output.publishing import publish_dataset, remove_run_dir

__all__ = ["Accounting", "PublishDataset", "MergeStats", "check_accounting", "dataset_info", "summarise"]
FOUND, WRITTEN = "found", "written"  # tally keys; the others are (stage, reason) of a Rejection
RESUMED = "resumed"  # tally key: ("resumed", run id), records taken from that interrupted run's chunks
LINES = "sources_lines"  # tally key: ("sources_lines", split), this run's sources lines of the split
HELD = "held_lines"  # tally key: ("held_lines", split), --if_exists=append: the dataset's sources lines

_LOG = logging.getLogger(__name__)


class DatasetIncomplete(RuntimeError):
    """The shards written do not hold exactly the records converted."""


def _summary(values: list[int]) -> dict:
    if not values:
        return {"min": 0, "median": 0, "max": 0}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _published_by(info_path: str, run_id: str) -> dict | None:
    """The dataset description at `info_path` if run `run_id` wrote it, else None."""
    try:
        info = parse_description(read_text(info_path), info_path, check=False, lenient=True)
    except Exception:  # none there (the usual case), or not readable: not this run's
        return None
    return info if isinstance(info, dict) and info.get("run_id") == run_id else None


class Accounting(NamedTuple):
    """What a run did, from the tallies and shard statistics of PublishDataset's inputs."""

    splits: dict  # split -> {"records", "class_counts", "shards", "bytes"}, in SPLITS order
    files: dict  # "found", "written", "rejected", "skipped", "upscaled"
    rejected_by_reason: dict  # reason -> count, sorted by reason
    skipped_by_reason: dict
    renamed: dict  # final name -> its name in the run's folder, when they differ (--shard_names=kaggle)
    annotations_rejected: dict = {}  # --task=detection: reason -> annotations set aside (errors.jsonl's 'annotation')


def summarise(tallies: Iterable[tuple[tuple, int]], shard_stats: Iterable[tuple], class_names) -> Accounting:
    """Add up the run's tallies and list its shards per split.

    `tallies`: (key, count) with key ("found",), ("written", split, label, upscaled) or (stage, reason); the stage
    'annotation' (a detection dataset's annotation set aside) counts no file;
    `shard_stats`: ShardInfos (split, file name, records, bytes, index file name or '', name in the run's folder or '').
    """
    records = Counter()
    per_class = defaultdict(Counter)
    no_class = Counter()  # --multi_label: images of no class, per split
    by_reason = {"skipped": Counter(), "rejected": Counter(), ANNOTATION: Counter()}
    found_total = upscaled = 0
    for key, count in tallies:
        if key[0] == FOUND:
            found_total += count
        elif key[0] == WRITTEN:
            _, split, label, was_upscaled = key
            records[split] += count
            if isinstance(label, list | tuple):  # --multi_label: an image counts once for each of its classes
                for i in label:
                    per_class[split][class_names[i]] += count
                if not label:
                    no_class[split] += count
            elif label is not None:  # None: an image of an unlabeled set (--unlabeled), of no class
                per_class[split][class_names[label]] += count
            upscaled += count if was_upscaled else 0
        else:  # (stage, reason)
            by_reason[key[0]][key[1]] += count

    shards = defaultdict(list)
    renamed = {}  # final name -> its name in the run's folder, when they differ (--shard_names=kaggle)
    # In shard order: by the name in the run's folder (train-00000-of-00004...), which every shard has.
    for split, name, count, size, index, temp in sorted(shard_stats, key=_shard_order):
        entry = {"file": name, "records": count, "bytes": size}
        if index:
            entry["index"] = index
        if temp:
            renamed[name] = temp
        shards[split].append(entry)

    splits = {}
    for split in SPLITS:
        if split not in shards and not records[split]:
            continue
        splits[split] = {
            "records": records[split],
            "class_counts": {name: per_class[split][name] for name in class_names if per_class[split][name]},
            "shards": shards[split],
            "bytes": sum(s["bytes"] for s in shards[split]),
        }
        if no_class[split]:
            splits[split]["images_without_labels"] = no_class[split]
    files = {
        "found": found_total,
        "written": sum(records.values()),
        "rejected": sum(by_reason["rejected"].values()),
        "skipped": sum(by_reason["skipped"].values()),
        "upscaled": upscaled,
    }
    return Accounting(splits, files, dict(sorted(by_reason["rejected"].items())),
                      dict(sorted(by_reason["skipped"].items())), renamed, dict(sorted(by_reason[ANNOTATION].items())))


def check_accounting(counts: Accounting) -> None:
    """Nothing lost: each split's shards hold its converted images, and found = written + rejected + skipped.

    Raises:
        DatasetIncomplete: naming the first difference.
    """
    for split, split_info in counts.splits.items():
        written = sum(s["records"] for s in split_info["shards"])
        if written != split_info["records"]:
            raise DatasetIncomplete(
                f"split {split!r}: the shards hold {written} records but {split_info['records']} images were "
                f"converted; the dataset is incomplete, so {INFO_FILE} was not written. Run again."
            )
    files = counts.files
    if files["found"] != files["written"] + files["rejected"] + files["skipped"]:
        raise DatasetIncomplete(
            f"accounting mismatch: {files['found']} files found but {files['written']} written + "
            f"{files['rejected']} rejected + {files['skipped']} skipped; {INFO_FILE} was not written"
        )


def check_lines(lines: dict, splits: dict) -> None:
    """This run's sources lines per split (one per record it wrote, resumed ones from their done records) against
    its records per split.

    Raises:
        DatasetIncomplete: they differ: the dataset would not know which images it holds (an append would write
            them again).
    """
    for split in sorted(set(lines) | set(splits)):
        listed, records = lines.get(split, 0), (splits.get(split) or {}).get("records", 0)
        if listed != records:
            raise DatasetIncomplete(
                f"split {split!r}: the run wrote {records} records but lists {listed} in its sources files, which "
                f"say what the dataset holds; nothing was published ({INFO_FILE} was not written). Run again.")


def dataset_info(counts: Accounting, run_id, class_names, schema, options, image_info, start_time,
                 tool_version, tfds: dict, split_by: str = "path_hash", groups: dict | None = None,
                 duplicates: dict | None = None, statistics: dict | None = None, extra_features: tuple = (),
                 metadata: dict | None = None, manifest: dict | None = None, split_lists: dict | None = None,
                 detection: dict | None = None) -> dict:
    """The dataset description, INFO_FILE's content, of a run whose accounting is `counts`.

    `tfds`: TensorFlow Datasets' files in the folder, or why there are none (tfds.builder_from_directory).
    `split_by`: how the splits were made; `groups`: what --group_by found (None without it);
    `duplicates`: the groups of identical source files (`transforms.inputs.duplicates.describe`);
    `statistics`: pixel mean and std, source sizes and upscaling per split (`transforms.images.stats.describe`);
    `extra_features`: the typed extra features (transforms.base.features.FeatureType); `metadata`: what the --metadata
    join found (None without it); `manifest`: what the --manifest's reading found (its rows that span lines;
    None without one); `split_lists`: the --split_lists, their rule and lines (None without them); `detection`: a
    detection dataset's section (transforms.detection.conversion.detection_section; None for classification).
    """
    all_shards = [s for info in counts.splits.values() for s in info["shards"]]
    elapsed = max(time.time() - start_time, 1e-9)
    return {
        "format_version": FORMAT_VERSION,
        "tool": {"name": "image-tfrecords", "version": tool_version},
        # the versions of the libraries that decoded, resized and encoded (those of the worker that publishes)
        "libraries": converter_libraries(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run_id": run_id,
        "options": options,
        **({"task": DETECTION} if detection is not None else {}),
        "schema": schema,
        "features": detection_feature_description(detection["instance_masks"], detection["semantic_masks"])
        if detection is not None else feature_description(schema, bool(options.get("multi_label")),
                                                          extras=describe_features(extra_features),
                                                          unlabeled=bool(options.get("unlabeled"))),
        **({"detection": detection} if detection is not None else {}),
        **({"multi_label": True} if options.get("multi_label") else {}),
        # --unlabeled: records of no class, with an id; no class_names, one split
        **({"unlabeled": True} if options.get("unlabeled") else {}),
        "image": image_info,
        "compression": options["compression"],
        "class_names": list(class_names),
        "num_classes": len(class_names),
        "split_by": split_by,
        "splits": counts.splits,
        "files": counts.files,
        **({"statistics": statistics} if statistics is not None else {}),
        **({"groups": groups} if groups is not None else {}),
        **({"duplicates": duplicates} if duplicates is not None else {}),
        **({"metadata": metadata} if metadata is not None else {}),
        **({"manifest": manifest} if manifest is not None else {}),
        **({"split_lists": split_lists} if split_lists is not None else {}),
        "rejected_by_reason": counts.rejected_by_reason,
        "skipped_by_reason": counts.skipped_by_reason,
        "shard_bytes": _summary([s["bytes"] for s in all_shards]),
        "total_bytes": sum(s["bytes"] for s in all_shards),
        "error_report": ERRORS_FILE,
        "elapsed_seconds": round(elapsed, 3),
        "images_per_second": round(counts.files["written"] / elapsed, 2),
        "tfds": tfds,
    }


class _WriteInfo(beam.DoFn):
    """Assemble and write the dataset description once every input has arrived."""

    def __init__(self, output_dir, run_id, class_names, schema, options, image_info, start_time, tool_version,
                 split_by="path_hash", extra_features=(), base=None, earlier_runs=(), detection=None):
        self._output_dir = output_dir
        self._detection = detection  # --task=detection: first_id, instance_masks, semantic_masks, input_format
        self._earlier_runs = list(earlier_runs)  # interrupted runs' folders kept for this run: go once it publishes
        self._base = base  # --if_exists=append: the description of the dataset this run grows
        self._split_by = split_by
        self._extra_features = tuple(extra_features)
        self._run_id = run_id
        self._class_names = class_names
        self._schema = schema
        self._options = options
        self._image_info = image_info
        self._start_time = start_time
        self._tool_version = tool_version

    def process(self, _, tallies, shard_stats, rejections, duplicates=None, groups=None, stats=None,
                metadata=None, class_names=None, manifest=None, sources=(), present=None, lines=False, held=False,
                split_lists=None, detection=None):
        if class_names is not None:  # found in the job (a manifest without --labels_file): a side input
            self._class_names = class_names
        aside = {RESUMED: {}, LINES: {}, HELD: {}}  # per run, or per split of the sources lines
        for key, count in tallies:
            if key[0] in aside:
                aside[key[0]][key[1]] = count
        resumed = aside[RESUMED]
        tallies = [(key, count) for key, count in tallies if key[0] not in aside]
        counts = summarise(tallies, shard_stats, self._class_names)
        if self._base is not None and held:  # before anything is written: the dataset's own account
            append.check_held(aside[HELD], self._base["splits"])
        if lines:
            check_lines(aside[LINES], counts.splits)
        sources = sorted(FileSystems.split(path)[1] for path in sources)  # this run's, in its shards folder
        grown = None
        if self._detection is not None:  # a detection dataset counts objects per class (an append's add up below)
            objects = per_class(detection or {}, CLASS_OBJECTS, list(self._class_names))
            for split, split_info in counts.splits.items():
                split_info["class_counts"] = objects.get(split, {})
        if self._base is not None:
            run = counts._replace(files={**counts.files, "found": counts.files["found"] - sum(present or ())})
            check_accounting(run)  # this run's images: found = already there + written + rejected + skipped
            if not run.files["written"] and _reported_already(self._output_dir, self._base, run, rejections):
                # Nothing new, and every file not written is in the dataset's errors.jsonl already, for the same
                # reason: the dataset stays as it is, byte for byte.
                remove_run_dir(self._output_dir, self._run_id)
                release_lock(self._output_dir, self._run_id)
                yield self._base
                return
            counts, grown = grow(self._base, run, sum(present or ()), self._options, self._run_id)
            stats = [(split, pixel_stats.merge([part, *old])) for split, part, old in
                     _with_old_stats(self._base, dict(stats or ()), counts.splits)]
        else:
            check_accounting(counts)
        section = None
        if self._detection is not None:  # every annotation found: written, or in errors.jsonl
            section = detection_section(detection or {}, counts.annotations_rejected,
                                        counts.skipped_by_reason.get(NO_OBJECTS, 0), **self._detection,
                                        class_names=list(self._class_names))
            if grown is not None:  # an append: this run's figures in its history entry, the dataset's grown
                grown.history[-1]["annotations"] = {
                    **section["annotations"], "rejected": sum(section["annotations"]["rejected"].values()),
                    "already_in_dataset": (detection or {}).get(ALREADY_IN_DATASET, 0)}
                section = grown_section(self._base.get("detection") or {}, section, list(self._class_names))
            problem = annotations_problem(section)
            if problem:
                raise DatasetIncomplete(f"annotations unaccounted for: {problem}; {INFO_FILE} was not written. "
                                        "Run again.")
        statistics = None
        if stats is not None:  # (split, SplitStats), one per split
            statistics = pixel_stats.describe(
                dict(stats), self._image_info.get("width"), self._image_info.get("height"),
                self._options.get("resize_mode", ""), sum(s["bytes"] for s in counts.splits.values()))
        tfds_files, tfds_note = tfds_metadata.tfds_files(
            counts.splits, self._schema, self._image_info, list(self._class_names), self._options["compression"],
            description=f"Images converted by image-tfrecords {self._tool_version} (run {self._run_id}).",
            multi_label=bool(self._options.get("multi_label")), features=self._extra_features,
            unlabeled=bool(self._options.get("unlabeled")))
        info = dataset_info(counts, self._run_id, self._class_names, self._schema, self._options,
                            self._image_info, self._start_time, self._tool_version,
                            tfds={"files": list(tfds_files), "note": tfds_note}, split_by=self._split_by,
                            groups=groups, duplicates=dup.describe(duplicates, self._class_names),
                            statistics=statistics, extra_features=self._extra_features, metadata=metadata,
                            manifest=manifest, split_lists=split_lists, detection=section)
        old_sources = list(((self._base or {}).get("sources") or {}).get("files") or [])
        info["sources"] = {"files": old_sources + sources,
                           "format": "one JSON list a line: [relpath, sha256, split, label]"}
        if grown is not None:
            info["appends"] = grown.history
        if sum(resumed.values()):
            info["resumed"] = {"images": sum(resumed.values()), "from_runs": sorted(resumed),
                               "converted": counts.files["written"] - sum(resumed.values())}
        all_shards = [s for split in info["splits"].values() for s in split["shards"]]
        renamed = counts.renamed
        join = lambda name: FileSystems.join(self._output_dir, name)  # noqa: E731
        published = _published_by(join(INFO_FILE), self._run_id)
        if published is not None:
            # A retry of this step after an attempt that published and then failed (Dataflow retries a
            # failed bundle): the dataset is complete, so only the cleaning up is left to do.
            self._remove_earlier_runs()
            remove_run_dir(self._output_dir, self._run_id)
            release_lock(self._output_dir, self._run_id)
            yield published
            return
        no_class = not self._options.get("unlabeled") and not list(self._class_names)  # --multi_label, no labels
        if grown is None and (not counts.files[WRITTEN] or no_class):
            # No image converted, or no class to learn: the run failed, and a failed run publishes nothing (an
            # earlier dataset stays as it is, and the corrected command is not refused). Its report stays in its
            # folder for the launcher (pipeline.report.summarise_run).
            self._keep_unpublished(info, rejections)
            self._remove_earlier_runs()
            release_lock(self._output_dir, self._run_id)
            yield info
            return
        if grown is not None:  # only the new shards come from the run's folder
            all_shards = [s for s in all_shards if s["file"] in renamed]
        shard_files = ([(renamed.get(s["file"], s["file"]), s["file"]) for s in all_shards]
                       + [(index_name(renamed.get(s["file"], s["file"])), s["index"]) for s in all_shards
                          if "index" in s] + sources)
        descriptions = {
            # Streamed from the side input, never held in memory: a messy folder may have millions.
            ERRORS_FILE: (json.dumps(r.to_json(), ensure_ascii=False) + "\n" for r in rejections),
            LABELS_FILE: ["".join(f"{name}\n" for name in self._class_names)],
            # a detection dataset's label map, in the TF Object Detection API's text format
            **({LABEL_MAP_FILE: [label_map_text(self._class_names, section["first_id"])]} if section else {}),
            **{name: [text] for name, text in tfds_files.items()},  # TFDS's: label.labels.txt, features.json, ...
            INFO_FILE: [json.dumps(info, indent=2) + "\n"],  # last: the completion marker
        }
        # Each shard's file (its committed attempt's) must hold the bytes its ShardInfo reports.
        sizes = {renamed.get(s["file"], s["file"]): s["bytes"] for s in all_shards}
        # Written in full first, then the previous dataset (if any) gives way: transforms/output/publishing.py.
        publish_dataset(self._output_dir, self._run_id, shard_files, descriptions, sizes,
                        renames=grown.renames if grown else None, keep=grown.keep + old_sources if grown else ())
        # This run's own temporary folder and lock, and the interrupted runs' it resumed; no other run's.
        self._remove_earlier_runs()
        remove_run_dir(self._output_dir, self._run_id)
        release_lock(self._output_dir, self._run_id)
        yield info

    def _keep_unpublished(self, info: dict, rejections) -> None:
        """Write the errors.jsonl and image_tfrecords.json of a run that failed (no image converted, or no class)
        into its own folder
        (`UNPUBLISHED_DIR`), the description last: what the launcher's summary reads, and where the user finds each
        file's reason. Nothing in the output folder itself changes."""
        folder = FileSystems.join(run_dir(self._output_dir, self._run_id), UNPUBLISHED_DIR)
        files = {ERRORS_FILE: (json.dumps(r.to_json(), ensure_ascii=False) + "\n" for r in rejections),
                 INFO_FILE: [json.dumps(info, indent=2) + "\n"]}
        for name, lines in files.items():
            check_own_paths(self._output_dir, [FileSystems.join(folder, name)])
            write_file(FileSystems.join(folder, name), lines)

    def _remove_earlier_runs(self) -> None:
        """The folders of the interrupted runs that the launcher kept for this run to resume: done with."""
        for run_id in self._earlier_runs:
            if run_id != self._run_id:
                try:
                    remove_run_dir(self._output_dir, run_id)
                except Exception as e:  # noqa: BLE001 - the dataset is published; the next run removes them
                    _LOG.warning("Could not remove the folder of the resumed run %s (%s): the next run removes it",
                                 run_id, e)


def _rejection_keys(rows) -> Counter:
    """(relpath, stage, reason) of each errors.jsonl row (dicts as `Rejection.to_json` writes them)."""
    return Counter((row.get("relpath"), row.get("stage"), row.get("reason")) for row in rows)


def _reported_already(output_dir: str, base: dict, run: Accounting, rejections) -> bool:
    """An append that wrote nothing: whether the dataset already reports each of this run's rejected and skipped
    files (its counts, then each errors.jsonl line: path, stage and reason), so that publishing again would change
    nothing. A new rejected file (an HTML page saved as .jpg, an id that is taken, a changed file) is not: the
    dataset is published again with it counted and in errors.jsonl, as a first run reports it."""
    if run.rejected_by_reason.get(append.CHANGED):
        return False
    if (dict(run.rejected_by_reason) != dict(base.get("rejected_by_reason") or {})
            or dict(run.skipped_by_reason) != dict(base.get("skipped_by_reason") or {})):
        return False
    if not sum(run.rejected_by_reason.values()) + sum(run.skipped_by_reason.values()):
        return True
    try:
        text = read_text(FileSystems.join(output_dir, ERRORS_FILE))
        old = [bounded.loads(line) for line in (text or "").splitlines() if line.strip()]
    except Exception:  # noqa: BLE001 - missing or unreadable: published again, with this run's report
        return False
    if not all(isinstance(row, dict) for row in old):
        return False
    return _rejection_keys(old) == _rejection_keys(r.to_json() for r in rejections)


class Grown(NamedTuple):
    """What an append changes besides the new shards: the old files' renames, those kept, the history."""

    renames: list  # (old final name, new final name) of the old shards and index files whose names change
    keep: list  # the old shards' and index files' names that stay
    history: list  # the description's "appends": one entry per append, this one last


def grow(base: dict, run: Accounting, present: int, options: dict, run_id: str = "") -> tuple[Accounting, Grown]:
    """The accounting of the dataset `base` (its description) grown by this run's images (`run`, of this run's
    shards), and what publishing it changes. Counts add up across appends: found = written + rejected + skipped,
    with `found` the dataset's records before this run plus the images this run found that it did not hold;
    rejected and skipped are this run's (errors.jsonl lists them)."""
    new_shards = [(split, s["file"], s["records"], s["bytes"], s.get("index", ""), run.renamed.get(s["file"], ""))
                  for split, info in run.splits.items() for s in info["shards"]]
    shards, renames = append.appended_shards(base["splits"], new_shards, options["compression"],
                                             options.get("file_format", "tfrecord"), options.get("shard_names", ""))
    splits, renamed = {}, {}
    for split in SPLITS:
        old, new = base["splits"].get(split), run.splits.get(split)
        if old is None and new is None:
            continue
        old, new = old or {}, new or {}
        entries = []
        for split_, name, records, size, index, temp, kind in shards:
            if split_ == split:
                entries.append({"file": name, "records": records, "bytes": size, **({"index": index} if index else {})})
                if kind == "new":
                    renamed[name] = temp
        counts = Counter(old.get("class_counts") or {}) + Counter(new.get("class_counts") or {})
        splits[split] = {
            "records": old.get("records", 0) + new.get("records", 0),
            # the dataset's classes in their order, then an append's new ones (a detection append adds classes)
            "class_counts": {name: counts[name] for name in dict.fromkeys([*base["class_names"], *counts])
                             if counts[name]},
            "shards": entries,
            "bytes": sum(s["bytes"] for s in entries),
        }
        without = old.get("images_without_labels", 0) + new.get("images_without_labels", 0)
        if without:
            splits[split]["images_without_labels"] = without
    old_files = base.get("files") or {}
    written = old_files.get("written", 0) + run.files["written"]
    files = {"found": written + run.files["rejected"] + run.files["skipped"], "written": written,
             "rejected": run.files["rejected"], "skipped": run.files["skipped"],
             "upscaled": old_files.get("upscaled", 0) + run.files["upscaled"]}
    history = list(base.get("appends") or []) + [{
        "run_id": run_id, "converted": run.files["written"], "already_in_dataset": present,
        "changed": run.rejected_by_reason.get(append.CHANGED, 0), "found": run.files["found"] + present,
        "libraries": converter_libraries()}]
    grown = Grown([(old, new) for old, new in renames if old != new],
                  [old for old, new in renames if old == new], history)
    return Accounting(splits, files, run.rejected_by_reason, run.skipped_by_reason, renamed,
                      run.annotations_rejected), grown


def _with_old_stats(base: dict, stats: dict, splits: dict):
    """(split, this run's SplitStats, [the dataset's]) for every split of the grown dataset."""
    old = ((base.get("statistics") or {}).get("splits")) or {}
    for split in splits:
        recorded = pixel_stats.from_description(old[split]) if split in old else None
        yield split, stats.get(split, pixel_stats.SplitStats()), [recorded] if recorded else []


def _shard_order(shard: tuple) -> tuple[str, str]:
    """A ShardInfo's place in the dataset: its split and its name in the run's folder (its final name when the
    same)."""
    temp = shard[5] if len(shard) > 5 else ""
    return shard[0], temp or shard[1]


class MergeStats(beam.CombineFn):
    """SplitStats of some shards -> their sum (exact integers: the same in any order)."""

    def create_accumulator(self):
        return pixel_stats.SplitStats()

    def add_input(self, accumulator, element):
        return pixel_stats.merge([accumulator, element])

    def merge_accumulators(self, accumulators):
        return pixel_stats.merge(accumulators)

    def extract_output(self, accumulator):
        return accumulator


class PublishDataset(beam.PTransform):
    """Write the error report and the dataset description, then publish the run's files; outputs the info dict.

    Inputs (a dict): 'written' (((split, label, upscaled), records) from WriteShards),
    'rejections' (Rejection), 'shards' (ShardInfo of every final shard), 'found' (numbers
    of files listed, from ListImages), and optionally 'hashes' ((sha256, (split, label, relpath))
    of every written image, from WriteShards) for the duplicate report, and 'groups' ((group, split,
    relpath) of every labelled image, from AssignLabels with --group_by), and 'stats' ((split, SplitStats)
    per shard, from WriteShards) for the pixel and size statistics, 'sources' (the paths of the run's
    sources files, from transforms.inputs.append.WriteSources) and 'lines' (the hashes WriteSources wrote, counted
    per split against the records), and, with `base` (the description of the dataset an --if_exists=append grows),
    'present' (1 per image already in it, from SkipPresent) and 'held' (its sources lines, from ReadSources, counted
    per split against its description before anything is written), and 'split_lists' (one dict: the
    --split_lists, their rule and lines, from transforms.inputs.split_lists.JoinSplitLists), and 'detection' (one
    dict: a detection dataset's annotation tally, with `detection` its settings: first_id, instance_masks,
    semantic_masks, input_format). `split_by` says
    how the splits were made: split_folders, split_lists, path_hash or group_hash.
    """

    def __init__(self, output_dir, run_id, class_names, schema, options, image_info, start_time, tool_version,
                 split_by="path_hash", extra_features=(), base=None, earlier_runs=(), detection=None):
        super().__init__()
        self._output_dir = output_dir
        # a list, or a PCollection of one list (the class names found in the job): a side input
        self._names = class_names if isinstance(class_names, beam.PCollection) else None
        given = [] if self._names is not None else class_names
        self._info_fn = _WriteInfo(output_dir, run_id, given, schema, options, image_info, start_time,
                                   tool_version, split_by, extra_features=extra_features, base=base,
                                   earlier_runs=earlier_runs, detection=detection)

    def expand(self, inputs):
        rejections = inputs["rejections"]
        # errors.jsonl is written by WriteDatasetInfo, from `rejections` as a streamed side input.
        # One count per kind of event, summed in one combine: ("found",), ("written", split,
        # label, upscaled) or (stage, reason). Listing and conversion count their files
        # themselves, per bundle, so no per-image tally leaves them.
        tallies = (
            (
                inputs["found"] | "TallyFound" >> beam.Map(lambda n: ((FOUND,), n)),
                inputs["written"] | "TallyWritten" >> beam.MapTuple(lambda key, n: ((WRITTEN, *key), n)),
                rejections | "TallyRejected" >> beam.Map(lambda r: ((r.stage, r.reason), 1)),
                *([inputs["resumed"] | "TallyResumed" >> beam.MapTuple(lambda run, n: ((RESUMED, run), n))]
                  if "resumed" in inputs else []),
                # this run's sources lines, (sha256, (split, label, relpath)): counted per split
                *([inputs["lines"] | "TallyLines" >> beam.Map(lambda line: ((LINES, line[1][0]), 1))]
                  if "lines" in inputs else []),
                # --if_exists=append: the dataset's sources lines, (relpath, (sha256, split, label)), per split
                *([inputs["held"] | "TallyHeld" >> beam.Map(lambda line: ((HELD, line[1][1]), 1))]
                  if "held" in inputs else []),
            )
            | "AllTallies" >> beam.Flatten()
            # (event, count)
            | "CountTallies" >> beam.CombinePerKey(sum)
        )
        # (split, file name, records, bytes, index file name or '')
        shard_stats = inputs["shards"] | "ShardStats" >> beam.Map(tuple)
        side = {}
        if "hashes" in inputs:  # one small dict: the counts and the first groups of identical source files
            side["duplicates"] = beam.pvalue.AsSingleton(inputs["hashes"] | "FindDuplicates" >> dup.FindDuplicates(),
                                                         default_value=None)  # None: no duplicates
        if "stats" in inputs:  # one SplitStats per split: its pixel sums, upscaled count and size histograms
            side["stats"] = beam.pvalue.AsList(inputs["stats"] | "CombineStats" >> beam.CombinePerKey(MergeStats()))
        if "groups" in inputs:  # one small dict: what --group_by found
            side["groups"] = beam.pvalue.AsSingleton(inputs["groups"] | "SummariseGroups" >> SummariseGroups())
        if "metadata" in inputs:  # one small dict: what the --metadata join found
            side["metadata"] = beam.pvalue.AsSingleton(inputs["metadata"])
        if "manifest" in inputs:  # one small dict: what the --manifest's reading found
            side["manifest"] = beam.pvalue.AsSingleton(inputs["manifest"])
        if "split_lists" in inputs:  # one small dict: the --split_lists and their lines
            side["split_lists"] = beam.pvalue.AsSingleton(inputs["split_lists"])
        if "detection" in inputs:  # one small dict: the annotations' tally (parsers' and objects written)
            side["detection"] = beam.pvalue.AsSingleton(inputs["detection"])
        if self._names is not None:  # one list: the class names
            side["class_names"] = beam.pvalue.AsSingleton(self._names)
        if "sources" in inputs:  # the paths of this run's sources files (transforms.inputs.append.WriteSources)
            side["sources"] = beam.pvalue.AsList(inputs["sources"])
        if "lines" in inputs:  # counted in the tallies
            side["lines"] = True
        if "held" in inputs:
            side["held"] = True
        if "present" in inputs:  # --if_exists=append: 1 per image already in the dataset
            side["present"] = beam.pvalue.AsList(inputs["present"] | "CountPresent" >> beam.CombineGlobally(sum))
        return (
            rejections.pipeline
            | "Once" >> beam.Impulse()  # one element: the description is written once
            | "WriteDatasetInfo" >> beam.ParDo(
                self._info_fn,
                tallies=beam.pvalue.AsList(tallies),
                shard_stats=beam.pvalue.AsList(shard_stats),
                rejections=beam.pvalue.AsIter(rejections),
                **side,
            )
        )
