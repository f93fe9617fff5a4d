"""Lines of the final report printed after a conversion: images per class and shard sizes.

Everything printed here is also in image_tfrecords.json (`splits.*.class_counts`,
`shard_bytes`, `total_bytes`, `statistics`), which is where scripts should read it.
"""

from __future__ import annotations

import statistics
import sys

from apache_beam.io.filesystems import FileSystems

from pipeline.reader import load_info
from transforms.base.dataset_format import (
    DETECTION,
    ERRORS_FILE,
    INFO_FILE,
    LABEL_MAP_FILE,
    SPLITS,
    TEMP_DIR,
    UNPUBLISHED_DIR,
)
from transforms.base.duplicate_kinds import summary_line
from transforms.inputs.manifest import GIVEN_SPLIT_ROWS, HASHED_SPLIT_ROWS
from transforms.labels.layout import class_order, class_order_note
from transforms.output.files import exists, read_text

# Up to this many classes the report shows every class; beyond, a summary per split.
MAX_LISTED_CLASSES = 20


def human_bytes(size: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{int(size)} B"


def class_count_lines(info: dict) -> list[str]:
    """Images per class and split: a table for a few classes, the spread and the smallest for many."""
    names = info["class_names"]
    splits = {split: s.get("class_counts", {}) for split, s in info["splits"].items()}
    if not names or not splits:
        return []
    what = "Objects" if info.get("task") == DETECTION else "Images"  # a detection record holds several
    if len(names) <= MAX_LISTED_CLASSES:
        title = f"{what} per class:"
        first_id = (info.get("detection") or {}).get("first_id", 1) if what == "Objects" else 0  # the records' ids
        id_width = len(str(len(names) - 1 + first_id))
        first = max(len(title), 2 + id_width + 1 + max(len(n) for n in names))
        widths = [max(len(split), 6) for split in splits]
        lines = [title.ljust(first) + "".join("  " + split.rjust(w) for split, w in zip(splits, widths, strict=True))]
        for label, name in enumerate(names):
            counts = "".join("  " + str(c.get(name, 0)).rjust(w) for c, w in zip(splits.values(), widths, strict=True))
            lines.append(f"  {str(label + first_id).rjust(id_width)} {name}".ljust(first) + counts)
        return lines
    lines = [f"{what} per class ({len(names)} classes; every count is in image_tfrecords.json):"]
    for split, counts in splits.items():
        values = sorted((counts.get(name, 0), name) for name in names)
        fewest = ", ".join(f"{name} {count}" for count, name in values[:3])
        lines.append(
            f"  {split:<10} {values[0][0]} to {values[-1][0]} (median {statistics.median(v for v, _ in values):g}); "
            f"fewest: {fewest}"
        )
    return lines


def detection_lines(info: dict) -> list[str]:
    """A detection dataset's annotations: found = written + rejected (per reason), the images without objects, and
    the most objects in one record."""
    detection = info.get("detection") or {}
    annotations = detection.get("annotations") or {}
    rejected = annotations.get("rejected") or {}
    reasons = ", ".join(f"{reason} {count}" for reason, count in rejected.items())
    without = detection.get("images_without_objects") or {}
    lines = [f"Annotations: {annotations.get('found', 0)} found: {annotations.get('written', 0)} written, "
             f"{sum(rejected.values())} rejected" + (f" ({reasons}; see {info['error_report']})" if reasons else "")
             + f". Class ids from {detection.get('first_id', 1)}"
             + (", with instance masks" if detection.get("instance_masks") else "") + ".",
             f"Images without objects: {without.get('kept', 0)} written, {without.get('dropped', 0)} dropped; "
             f"the most objects in one image: {detection.get('objects_per_image_max', 0)}."]
    if detection.get("semantic_masks_rejected"):
        lines.append(f"Semantic masks rejected: {detection['semantic_masks_rejected']} (see {info['error_report']}).")
    return lines


def class_order_line(info: dict) -> str:
    """For a manifest's class names found in the job (no --labels_file) that are all integers: how they were ordered
    (`class_order_note`), as the launcher says it for class folders; '' otherwise, and for an append onto a dataset
    whose labels.txt has another order (it keeps its ids)."""
    options, names = info.get("options") or {}, list(info.get("class_names") or ())
    if not options.get("manifest") or options.get("labels_file") or class_order(names) != names:
        return ""
    note = class_order_note(names)
    return f"Class ids: {note}." if note else ""


def shard_size_line(info: dict) -> str:
    """e.g. 'Shards: 6 files of 148.2 MB to 151.0 MB (median 150.3 MB), 901.1 MB in all.'"""
    count = sum(len(s["shards"]) for s in info["splits"].values())
    sizes = info.get("shard_bytes") or {}
    total = info["total_bytes"] if "total_bytes" in info else sum(s["bytes"] for s in info["splits"].values())
    if not count:
        return "Shards: none written."
    if count == 1:
        return f"Shards: 1 file, {human_bytes(total)}."
    return (f"Shards: {count} files of {human_bytes(sizes['min'])} to {human_bytes(sizes['max'])} "
            f"(median {human_bytes(sizes['median'])}), {human_bytes(total)} in all.")


def _percent(share: float) -> str:
    return f"{100 * share:.1f} %"


def split_shares_line(info: dict) -> str:
    """For splits made by a hash: the share of written images each split got, next to the share asked for; when
    every row of a manifest gave its split, only the shares."""
    options = info.get("options") or {}
    if info.get("split_by") not in ("path_hash", "group_hash") or "validation_split" not in options:
        return ""
    total = sum(s["records"] for s in info["splits"].values())
    if not total:
        return ""
    rows = info.get("manifest") or {}  # this run's rows: a grown dataset's older records may have been hashed
    if rows.get(GIVEN_SPLIT_ROWS) and not rows.get(HASHED_SPLIT_ROWS) and not info.get("appends"):
        parts = [f"{split} {_percent(s['records'] / total)}" for split, s in info["splits"].items()]
        return ("Splits from the manifest's split column (every row gives one), of the images written: "
                + ", ".join(parts) + ".")
    asked = {"validation": options["validation_split"], "test": options.get("test_split", 0.0)}
    asked["train"] = 1.0 - asked["validation"] - asked["test"]
    parts = [f"{split} {_percent(info['splits'].get(split, {}).get('records', 0) / total)} "
             f"(asked {100 * asked[split]:.3g} %)" for split in SPLITS
             if asked[split] or split in info["splits"]]
    return "Split shares of the images written: " + ", ".join(parts) + "."


def split_lists_line(info: dict) -> str:
    """With --split_lists, where the splits came from: the images written per split and the lines of each list,
    e.g. 'Splits from --split_lists: train 75, test 25 images written; lines listed: train 76, test 25 (read as
    paths relative to --input_dir without extensions).'; '' for splits made otherwise."""
    found = info.get("split_lists")
    if info.get("split_by") != "split_lists" or not isinstance(found, dict):
        return ""
    lists = found.get("lists") or {}
    written = ", ".join(f"{split} {info['splits'].get(split, {}).get('records', 0)}" for split in lists)
    listed = ", ".join(f"{split} {n}" for split, n in (found.get("lines") or {}).items())
    text = (f"Splits from --split_lists: {written} images written; lines listed: {listed} (read as "
            f"{found.get('match')}).")
    repeated = found.get("repeated_lines", 0)
    if repeated:
        text += (f" {repeated} {'line repeats' if repeated == 1 else 'lines repeat'} an image of its list (written "
                 "once); see \"split_lists\" in image_tfrecords.json.")
    return text


def group_lines(info: dict) -> list[str]:
    """What --group_by found: groups, images without a group, groups in two split folders."""
    groups = info.get("groups")
    if not groups:
        return []
    pattern = (info.get("options") or {}).get("group_by")
    source = f"--group_by={pattern}" if pattern else "the manifest's group column"
    lines = [f"Groups ({source}): {groups['groups']} groups of {groups['grouped_images']} images."]
    if groups["ungrouped_images"]:
        shown = ", ".join(repr(p) for p in groups["ungrouped_examples"][:3])
        lines.append(f"  {groups['ungrouped_images']} images {'matched' if pattern else 'have'} no group and are "
                     "each their own group "
                     f"(e.g. {shown}); check the pattern if they belong to one (\"groups\" in image_tfrecords.json).")
    if groups["groups_in_several_splits"]:
        first = groups["several_splits_examples"][0]
        where = ", ".join(f"{split} {n}" for split, n in first["images"].items())
        spread = groups["groups_in_several_splits"]
        where_from = {"split_folders": "split folder", "split_lists": "split list"}.get(
            info.get("split_by"), "split (the manifest's split column)")
        lines.append(f"  Groups with images in more than one {where_from} (leakage): {spread}, "
                     f"e.g. {first['group']!r} ({where}); see \"groups\" in image_tfrecords.json.")
    return lines


def spanning_line(info: dict) -> str:
    """One line on the manifest's rows whose quoted field holds line breaks, or '' when there is none."""
    found = info.get("manifest") or {}
    n = found.get("spanning_rows", 0)
    if not n:
        return ""
    shown = ", ".join(f"row {e['row']} ({e['detail']})" for e in (found.get("examples") or {}).get(
        "spanning_rows", [])[:3])
    return (f"Manifest: {n} {'row holds' if n == 1 else 'rows hold'} line breaks inside a quoted field, read as "
            f"one row each (legal CSV): {shown}{' ...' if n > 3 else ''}; check that each is meant (a stray \" "
            "makes a field take the lines after it); see \"manifest\" in image_tfrecords.json.")


def metadata_line(info: dict) -> str:
    """One line on what the --metadata join found, or '' when every row named an image (or no --metadata)."""
    found = info.get("metadata") or {}
    kinds = [(found.get("unmatched_rows", 0), ("names", "name"), "no image to convert (not found, or skipped)"),
             (found.get("duplicate_rows", 0), ("repeats", "repeat"), "a path (the first row is used)"),
             (found.get("bad_rows", 0), ("cannot", "cannot"), "be read (no path, another number of fields than the "
                                                              "header, not CSV or JSON)"),
             (found.get("spanning_rows", 0), ("holds", "hold"), "line breaks inside a quoted field (read as one row)")]
    parts = [f"{n} {'row' if n == 1 else 'rows'} {verb[n != 1]} {what}" for n, verb, what in kinds if n]
    if not parts:
        return ""
    return (f"Metadata: {found.get('joined', 0)} of {found.get('rows', 0)} rows joined to an image; "
            f"{'; '.join(parts)}: see \"metadata\" in image_tfrecords.json for the first of each.")


def duplicates_line(info: dict) -> str:
    """One line on the groups of byte-identical source files, or '' when there are none."""
    found = info.get("duplicates") or {}
    if not found.get("groups"):
        return ""
    dropped = (" --duplicates=drop wrote one copy of each group with one label and none of a conflict (see "
               "errors.jsonl)." if (info.get("options") or {}).get("duplicates") == "drop" else "")
    return f"{summary_line(found)}; see \"duplicates\" in image_tfrecords.json.{dropped}"


def _size_bucket(edges: list, index: int) -> str:
    if index == 0:
        return f"<={edges[0]}"
    if index >= len(edges):
        return f">{edges[-1]}"
    return f"{edges[index - 1] + 1}-{edges[index]}"


def statistics_lines(info: dict) -> list[str]:
    """Pixel mean and std per split, the source sizes, and a smaller --image_size when most images were upscaled."""
    stats = info.get("statistics") or {}
    splits = stats.get("splits") or {}
    if not splits:
        return []
    channels = " ".join(stats.get("channels") or ["R", "G", "B"])
    lines = [f"Pixel mean / std per channel ({channels}, 0-255, of the stored pixels; \"statistics\" in "
             "image_tfrecords.json):"]
    for split, s in splits.items():
        mean = " ".join(f"{v:6.2f}" for v in s["mean"])
        std = " ".join(f"{v:6.2f}" for v in s["std"])
        lines.append(f"  {split:<10} mean {mean}   std {std}")
    edges = stats.get("size_edges") or []
    for side in ("width", "height"):
        counts = [sum(col) for col in zip(*(s[f"source_{side}"] for s in splits.values()), strict=True)]
        parts = [f"{_size_bucket(edges, i)} {n}" for i, n in enumerate(counts) if n]
        if parts:
            lines.append(f"Source {side}s before resizing (px): " + ", ".join(parts))
    lines.extend(suggestion_lines(info))
    return lines


def suggestion_lines(info: dict) -> list[str]:
    """The smaller --image_size suggested when most images were upscaled, or nothing."""
    found = (info.get("statistics") or {}).get("suggested_image_size")
    if not found:
        return []
    current = (info.get("options") or {}).get("image_size", "")
    current = current.split("x")[0] if len(set(current.split("x"))) == 1 else current
    within = found["sources_within"]
    low, high = found["estimated_bytes"]
    sides = (f"{_percent(within['width'])} of the sources are at most {found['width']} px wide and "
             f"{_percent(within['height'])} at most {found['height']} px high")
    return [
        f"Suggestion: {_percent(found['upscaled_share'])} of the images were smaller than --image_size={current} and "
        f"were upscaled, which adds bytes but no detail; {sides}. With --image_size={found['image_size']} each "
        f"image would have {_percent(found['pixel_ratio'])} of the pixels, and the dataset would take roughly "
        f"{human_bytes(low)} to {human_bytes(high)} instead of {human_bytes(found['bytes'])} (an estimate)."
    ]


def read_info(output_dir: str) -> dict:
    """The image_tfrecords.json just written to `output_dir`, read by the one loader of the description, through
    Beam's file systems as the converter wrote it."""
    return load_info(output_dir, read_text=read_text)


def _upscaled_shares(info: dict) -> str:
    """' (58.8 % of the images; train 60.9 %, validation 45.5 %)', or '' without statistics."""
    splits = ((info.get("statistics") or {}).get("splits")) or {}
    written = info["files"].get("written")
    if not splits or not written:
        return ""
    shares = ", ".join(f"{split} {_percent(s['upscaled_share'])}" for split, s in splits.items())
    return f" ({_percent(info['files']['upscaled'] / written)} of the images; {shares})"


def kept_line(info: dict) -> str:
    """How many images were stored as they were (already at the output size), or '' for none."""
    splits = ((info.get("statistics") or {}).get("splits")) or {}
    kept = sum(s.get("kept", 0) for s in splits.values())
    if not kept:
        return ""
    return (f"Stored as they were: {kept} images already at the output size (upright baseline JPEGs), their image "
            "data as it was (no metadata), without a second JPEG generation; --reencode re-encodes them.")


def format_summary(info: dict) -> str:
    files = info["files"]
    lines = [
        f"Found {files['found']} files: {files['written']} written, {files['rejected']} rejected, "
        f"{files['skipped']} skipped.",
    ]
    resumed = info.get("resumed")
    if resumed:  # a rerun after an interrupted run: its converted chunks were taken (transforms/output/resume.py)
        runs = resumed.get("from_runs") or []
        lines.append(f"Resumed: {resumed.get('images')} images from the interrupted run{'s' if len(runs) > 1 else ''} "
                     f"{', '.join(runs)}, converted {resumed.get('converted')}.")
    for split, split_info in info["splits"].items():
        lines.append(
            f"  {split:<10} {split_info['records']:>8} images in {len(split_info['shards'])} shard(s), "
            f"{split_info['bytes'] / 1e6:.1f} MB"
        )
    lines.append(shard_size_line(info))
    lines.extend(detection_lines(info) if info.get("task") == DETECTION else [])
    lines.extend(class_count_lines(info))
    if class_order_line(info):
        lines.append(class_order_line(info))
    if info.get("multi_label"):
        without = {split: s.get("images_without_labels", 0) for split, s in info["splits"].items()}
        lines.append("Multi-label: an image counts once for each of its classes; images of no class: "
                     + ", ".join(f"{split} {n}" for split, n in without.items()) + ".")
    for title, key in (("Rejected", "rejected_by_reason"), ("Skipped", "skipped_by_reason")):
        if info[key]:
            reasons = ", ".join(f"{reason} {count}" for reason, count in info[key].items())
            lines.append(f"{title}: {reasons} (see {info['error_report']})")
    for line in (split_shares_line(info), split_lists_line(info), kept_line(info), *group_lines(info),
                 duplicates_line(info), metadata_line(info), spanning_line(info)):
        if line:
            lines.append(line)
    if files.get("upscaled"):
        lines.append(f"Upscaled (smaller than the output size): {files['upscaled']}{_upscaled_shares(info)}")
    lines.extend(statistics_lines(info))
    lines.append(
        f"Elapsed {info['elapsed_seconds']:.1f} s, {info['images_per_second']:.1f} images/s. "
        + ("An unlabeled set: no labels, each record's id is its file name without the extension."
           if info.get("unlabeled") else f"{info['num_classes']} classes; labels in labels.txt"
           + (f" and {LABEL_MAP_FILE}." if info.get("task") == DETECTION else "."))
    )
    if (info.get("tfds") or {}).get("note"):  # TFDS cannot load this folder: say why, once
        lines.append(f"Note: no TFDS files written: {info['tfds']['note']}.")
    return "\n".join(lines)


def unpublished_folder(output_dir: str, run_id: str) -> str:
    """Where run `run_id`, which converted no image, left its errors.jsonl and image_tfrecords.json unpublished."""
    return FileSystems.join(output_dir, TEMP_DIR, run_id, UNPUBLISHED_DIR)


def summarise_run(output_dir: str, run_id: str | None = None) -> int:
    """Print the summary of the dataset a finished run (local or on Dataflow) just wrote; the run's exit code: 1
    if no image could be converted, or if no written image has a class (a --multi_label manifest whose labels
    cells are all empty), each with one error line, and run `run_id` then published nothing (its report is in
    `unpublished_folder`); else 0."""
    unpublished = unpublished_folder(output_dir, run_id) if run_id else None
    if not unpublished or not exists(FileSystems.join(unpublished, INFO_FILE)):
        info = read_info(output_dir)
        print(format_summary(info))
        if not info["files"]["written"] or not (info.get("unlabeled") or info.get("num_classes",
                                                                                   len(info.get("class_names") or ()))):
            # (an append onto a dataset of an earlier version that published such a run)
            print("error: the dataset holds no records or no class; see its errors.jsonl", file=sys.stderr)
            return 1
        return 0
    errors = FileSystems.join(unpublished, ERRORS_FILE)
    info = {**load_info(unpublished, read_text=read_text), "error_report": errors}
    print(format_summary(info))
    files = info["files"]
    kept = (f"so nothing was published (a dataset already in --output_dir is unchanged); each file's reason is in "
            f"{errors}, which the next run into the folder removes")
    if not files["written"]:
        reasons = ", ".join(f"{reason} {count}" for reason, count in
                            {**info["rejected_by_reason"], **info["skipped_by_reason"]}.items())
        print(f"error: no image could be converted: every one of the {files['found']} files found was rejected or "
              f"skipped ({reasons or 'none found'}), {kept}: fix the input and run the command again",
              file=sys.stderr)
    elif info.get("task") == DETECTION:
        print("error: no object has a class: the annotations hold no object that was kept, so the dataset would have "
              f"no class to learn, {kept}: check the annotations' reasons and run the command again", file=sys.stderr)
    else:
        print("error: no image has a class: every labels cell of the manifest is empty, so the dataset would have no "
              f"class to learn, {kept}: fill the labels column (class names separated by ';'), or give "
              "--labels_file, and run the command again", file=sys.stderr)
    return 1
