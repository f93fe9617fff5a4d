"""Resuming an interrupted run: the chunks it converted are taken, checked, instead of converted again.

Every run writes, at its start, `plan.json` into its temporary folder: the
fingerprint of everything that decides its records (`pipeline.plan.plan_record`:
every option that decides a record's bytes, the class names, how shards are
sized, the code's version and the converting libraries' versions). Each chunk it
converts (`transforms.output.write`) leaves, once its piece file is complete, a
done record `done/<digest>.json` beside it, written atomically. The digest is the
SHA-256 of the plan's fingerprint, the versions of the libraries that convert on
the worker (`converter_libraries`), the chunk's key (split, shard, chunk) and each
of its images' relative path, size, label, split and extra features: a chunk of
another plan, another shard assignment or other
members never has the same digest, so two plans are never mixed.

A rerun with the same fingerprint (the launcher keeps those run folders,
`pipeline.output_folder`) looks up the digest of each chunk it is about to convert in
them. It takes the earlier piece when its done record is there, the piece file
holds the recorded bytes (size and SHA-256, checked while it is copied into the
new run's folder) and each image's source file still has the SHA-256 recorded
when it was converted (read and hashed, never decoded): a file changed in
place, even to the same size, is converted again. The record must also say of
each image what the chunk is: its path, split, label and that SHA-256 in its
hash entry (which becomes its sources line), or a rejection of its path; a
record that does not (edited, or another chunk's) is converted again. Everything the rest of the job
takes from a piece (record sizes, tallies, statistics, rejections, hashes) comes
from the done record, so the dataset is the one a fresh run makes, byte for byte.

All of it runs where the chunk is converted (on the workers), never on the launcher.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import NamedTuple

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.base import bounded, counters
from transforms.base.records import Rejection
from transforms.images.imaging import converter_libraries
from transforms.images.stats import SplitStats
from transforms.output.files import write_atomically

__all__ = ["DONE_DIR", "PLAN_FILE", "RESUMED", "Resume", "chunk_digest", "fingerprint", "read_done", "read_plan",
           "write_done", "write_plan"]

PLAN_FILE = "plan.json"  # in a run's temporary folder: {"fingerprint", "run_id", "record"}
DONE_DIR = "done"  # in a run's temporary folder: one <digest>.json per converted chunk
RESUMED = counters.RESUMED  # the counter of records taken from an interrupted run's pieces
_READ = 1 << 20


def fingerprint(record: dict) -> str:
    """The SHA-256 of a plan record (`pipeline.plan.plan_record`), its keys sorted."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode("utf-8")).hexdigest()


def _read_json(path: str, limit: int = 64 << 20):
    """The JSON at `path`; None when there is none, or it cannot be read or parsed (never trusted)."""
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            data = f.read(limit + 1)
        return None if len(data) > limit else bounded.loads(data)
    except Exception:  # noqa: BLE001 - missing, cut short, damaged: not resumable, converted again
        return None


def write_plan(run_folder: str, run_id: str, record: dict) -> None:
    """Write `plan.json` into a run's temporary folder (the launcher, at the run's start)."""
    body = {"fingerprint": fingerprint(record), "run_id": run_id, "record": record}
    write_atomically(FileSystems.join(run_folder, PLAN_FILE), json.dumps(body, indent=1).encode("utf-8"))


def read_plan(run_folder: str) -> dict | None:
    """A run folder's plan.json, None when it has none (an older version's run, or one stopped at its start)."""
    plan = _read_json(FileSystems.join(run_folder, PLAN_FILE), 16 << 20)
    if not isinstance(plan, dict) or not isinstance(plan.get("fingerprint"), str) or not plan.get("run_id"):
        return None
    return plan


# What each part of a plan record's "plan" is, in a refusal's words (`plan_differences`).
PLAN_PARTS = {
    "class_names": "the class names",
    "split_folders": "the layout (split folders or not)",
    "sizing": "the record size measured from a sample of the input's images, which sizes the shards",
    "manifest_format": "the manifest's format",
    "manifest_file_size": "the manifest's sampled file sizes",
    "features": "the extra features",
    "metadata_format": "the metadata file's format",
    "manifest_groups": "the manifest's group column",
    "detection": "the detection export (its layout, or an annotation file's size or time)",
}


def _flat_code(code) -> dict:
    """A plan record's "code", each library's version under its own name (pillow, ...)."""
    code = dict(code) if isinstance(code, dict) else {}
    libraries = code.pop("libraries", None)
    return {**code, **(libraries if isinstance(libraries, dict) else {})}


def plan_differences(old: dict, new: dict) -> str:
    """Why an interrupted run's plan record is not this run's, in a few words: the options that differ (every option
    that decides a record's bytes is one, `pipeline.options.Settings.as_dict`), else the code, else what the
    launcher found in the input."""
    old_options, new_options = old.get("options") or {}, new.get("options") or {}
    names = sorted(n for n in set(old_options) | set(new_options) if old_options.get(n) != new_options.get(n))
    if names:
        shown = "; ".join(f"{n}: {old_options.get(n)!r} -> {new_options.get(n)!r}" for n in names[:3])
        return f"its options differ ({shown}{'; ...' if len(names) > 3 else ''})"
    old_code, new_code = _flat_code(old.get("code")), _flat_code(new.get("code"))
    if old_code != new_code:
        parts = sorted(n for n in set(old_code) | set(new_code) if old_code.get(n) != new_code.get(n))
        shown = "; ".join(f"{n}: {old_code.get(n)!r} -> {new_code.get(n)!r}" for n in parts[:3])
        return f"it ran another version of the code ({shown})"
    old_plan, new_plan = old.get("plan") or {}, new.get("plan") or {}
    what = sorted(n for n in set(old_plan) | set(new_plan) if old_plan.get(n) != new_plan.get(n))
    if not what:
        return "its plan differs"
    return f"what the launcher found in the input differs: {'; '.join(PLAN_PARTS.get(n, n) for n in what)}"


def chunk_digest(plan_fingerprint: str, key: tuple, refs, class_names=None) -> str:
    """The SHA-256 that names a chunk's done record: the plan, the versions of the libraries that convert on this
    worker (a worker of other versions never takes it), the chunk's key and each image as listed (a detection
    image with its annotations as parsed). `class_names`: a detection run's class names when the job found them
    (their ids are in its records, and one annotation file anywhere can change them); None otherwise."""
    digest = hashlib.sha256(plan_fingerprint.encode("ascii"))
    digest.update(json.dumps(converter_libraries(), sort_keys=True).encode("utf-8"))
    digest.update(repr(tuple(key)).encode("utf-8"))
    if class_names is not None:
        digest.update(b"\0classes" + json.dumps(list(class_names)).encode("utf-8"))
    for ref in refs:  # everything but the full path (the input folder is in the plan): relpath, size, label, split...
        digest.update(b"\0" + repr(tuple(ref)[1:]).encode("utf-8", "backslashreplace"))
    return digest.hexdigest()


def _label(value):
    return tuple(value) if isinstance(value, list) else value


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


def done_record(digest: str, run_id: str, piece, piece_sha256: str, members: list[str]) -> dict:
    """A converted chunk's done record: its piece file and everything the job takes from it (a PieceInfo)."""
    return {
        "digest": digest,
        "run_id": run_id,
        "file": piece.file,
        "bytes": piece.bytes,
        "sha256": piece_sha256,
        "members": members,  # each image's source SHA-256, in chunk order ('' when it could not be hashed)
        "sizes": list(piece.sizes),
        "written": [[split, _jsonable(label), upscaled, count] for (split, label, upscaled), count in piece.written],
        "stats": None if piece.stats is None else [_jsonable(v) for v in piece.stats],
        "rejections": [list(r) for r in piece.rejections],
        "hashes": [[sha256, split, _jsonable(label), relpath] for sha256, (split, label, relpath) in piece.hashes],
        # --task=detection: the annotations its records do not hold (errors.jsonl lines of stage 'annotation') and
        # its objects tally (objects written, records without objects, the most in one record); [] otherwise
        "annotations": [list(r) for r in piece.annotations],
        "objects": list(piece.objects),
        "classes": [list(c) for c in piece.classes],  # detection's [class name, objects, records holding one]
    }


def piece_of(record: dict, file: str, resumed_from: str, piece_type, digest: str = ""):
    """The `piece_type` (output.write.PieceInfo) of a done record whose piece is now `file` in this run's folder."""
    stats = record["stats"]
    return piece_type(
        tuple(record["shard"]), record["chunk"], record["chunks"], file, record["bytes"], tuple(record["sizes"]),
        tuple(((split, _label(label), upscaled), count) for split, label, upscaled, count in record["written"]),
        None if stats is None else SplitStats(*(tuple(v) if isinstance(v, list) else v for v in stats)),
        tuple(Rejection(*r) for r in record["rejections"]),
        tuple((sha256, (split, _label(label), relpath)) for sha256, split, label, relpath in record["hashes"]),
        resumed_from, digest, annotations=tuple(Rejection(*r) for r in record["annotations"]),
        objects=tuple(int(n) for n in record["objects"]),
        classes=tuple((name, int(objects), int(records)) for name, objects, records in record["classes"]))


def write_done(run_folder: str, record: dict, key: tuple) -> None:
    """Write a chunk's done record into `run_folder`/done/, after its piece file is complete (`write_location`
    adds where its bytes are once the piece is in its shard's file)."""
    body = {**record, "shard": list(key[:3]), "chunk": key[3], "chunks": key[4]}
    path = FileSystems.join(run_folder, DONE_DIR, f"{record['digest']}.json")
    write_atomically(path, json.dumps(body, ensure_ascii=True).encode("ascii"))


def read_done(run_folder: str, digest: str) -> dict | None:
    """The done record of chunk `digest` in an earlier run's folder, None when it has none (or an unusable one)."""
    record = _read_json(FileSystems.join(run_folder, DONE_DIR, f"{digest}.json"))
    if not isinstance(record, dict) or record.get("digest") != digest:
        return None
    needed = ("file", "bytes", "sha256", "members", "sizes", "written", "stats", "rejections", "hashes", "shard",
              "chunk", "chunks", "annotations", "objects", "classes")
    return record if all(name in record for name in needed) else None


def write_location(run_folder: str, digest: str, piece_file: str, shard_file: str, offset: int) -> None:
    """Record that chunk `digest`'s piece `piece_file` is now in `shard_file` (both in the run's shards folder)
    from byte `offset` on."""
    body = {"digest": digest, "piece": piece_file, "file": shard_file, "offset": offset}
    path = FileSystems.join(run_folder, DONE_DIR, f"{digest}.at.json")
    write_atomically(path, json.dumps(body, ensure_ascii=True).encode("ascii"))


def read_location(run_folder: str, digest: str, piece_file: str) -> tuple[str, int] | None:
    """(shard file, offset) where chunk `digest`'s piece `piece_file` was assembled, None when not recorded (or
    recorded for another attempt's piece, or unusable)."""
    record = _read_json(FileSystems.join(run_folder, DONE_DIR, f"{digest}.at.json"), limit=1 << 16)
    if not isinstance(record, dict) or record.get("digest") != digest or record.get("piece") != piece_file:
        return None
    file, offset = record.get("file"), record.get("offset")
    if not isinstance(file, str) or not file or "/" in file or type(offset) is not int or offset < 0:
        return None
    return file, offset


def file_sha256(path: str) -> str:
    """The hex SHA-256 of a file (local or gs://), read in 1 MB pieces."""
    digest = hashlib.sha256()
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        while piece := f.read(_READ):
            digest.update(piece)
    return digest.hexdigest()


def copy_checked(source: str, dest: str, size: int, sha256: str, offset: int | None = None) -> bool:
    """Copy `source` to `dest` if it holds exactly `size` bytes of SHA-256 `sha256`, or with an `offset`, if it
    holds such `size` bytes from that offset on; False (nothing left at `dest`) when not, or it cannot be read."""
    digest, total = hashlib.sha256(), 0
    try:
        with FileSystems.open(source, compression_type=CompressionTypes.UNCOMPRESSED) as f, FileSystems.create(
                dest, mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED) as out:
            if offset is not None:
                f.seek(offset)
            while piece := f.read(_READ if offset is None else min(_READ, size - total)):
                total += len(piece)
                if total > size:
                    break
                digest.update(piece)
                out.write(piece)
    except Exception:  # noqa: BLE001 - a piece that is gone or unreadable: converted again
        total = -1
    if total == size and digest.hexdigest() == sha256:
        return True
    try:
        FileSystems.delete([dest])
    except Exception:  # noqa: BLE001 - not there
        pass
    return False


def _consistent(record: dict, key: tuple, images: int) -> bool:
    """Whether a done record is of chunk `key` of `images` images, and its figures add up (never trusted)."""
    try:
        return ([*record["shard"], record["chunk"], record["chunks"]] == list(key)
                and len(record["members"]) == images
                and len(record["sizes"]) + len(record["rejections"]) == images
                and sum(count for *_, count in record["written"]) == len(record["sizes"]) == len(record["hashes"])
                and isinstance(record["bytes"], int) and isinstance(record["sha256"], str)
                and isinstance(record["file"], str) and "/" not in record["file"].removeprefix("pieces/")
                and all(len(r) == 4 for r in record["annotations"])  # detection's: Rejections, and its tally
                and len(record["objects"]) in (0, 3) and all(type(n) is int for n in record["objects"])
                and all(len(c) == 3 and isinstance(c[0], str) and type(c[1]) is int and type(c[2]) is int
                        for c in record["classes"]))
    except (TypeError, ValueError):
        return False


def _accounts(record: dict, refs) -> bool:
    """Whether a done record says of each of the chunk's images what the chunk is: a rejection of its path, or a
    record whose hash entry (what becomes its sources line) holds its SHA-256 as hashed here, its split, label and
    path, in chunk order, and tallies that count those entries (never trusted: a hand-edited path would otherwise
    reach the sources files, and the next append would write that image twice)."""
    from transforms.base.paths import display_path
    from transforms.base.records import label_of

    try:
        rejected = [rejection[0] for rejection in record["rejections"]]
        paths = [ref.relpath for ref in refs]
        if len(set(rejected)) != len(rejected) or not set(rejected) <= set(paths):
            return False
        expected = [[member, ref.split, _jsonable(label_of(ref)), display_path(ref.relpath)]
                    for ref, member in zip(refs, record["members"], strict=True) if ref.relpath not in rejected]
        if [list(entry) for entry in record["hashes"]] != expected:
            return False
        tallied = Counter()
        for split, label, _upscaled, count in record["written"]:
            tallied[(split, repr(_label(label)))] += count
        return +tallied == Counter((split, repr(_label(label))) for _, split, label, _ in expected)
    except (TypeError, ValueError, IndexError):
        return False


class Earlier(NamedTuple):
    """An interrupted run whose plan is this run's: its id, its temporary folder and its shards folder."""

    run_id: str
    folder: str
    shards: str


class Resume:
    """What the converter needs to take chunks from interrupted runs, and to leave its own done records.

    `fingerprint`: this run's plan; `folder`: this run's temporary folder; `earlier`: the interrupted runs of the
    same plan (Earlier), the newest first.
    """

    def __init__(self, fingerprint_: str, run_id: str, folder: str, earlier=(), max_file_bytes: int = 0,
                 throttled_s: float | None = None, start_rate: float | None = None):
        self.fingerprint = fingerprint_
        self.run_id = run_id
        self.folder = folder
        self.earlier = tuple(Earlier(*e) for e in earlier)
        self._max_file_bytes = max_file_bytes
        self._throttled_s = throttled_s
        self._start_rate = start_rate

    def member_hash(self, ref) -> str:
        """An image's source SHA-256 (read, not decoded); '' when it cannot be hashed."""
        from transforms.inputs.duplicates import hash_file

        return hash_file(ref.path, self._max_file_bytes, ref.size, self._throttled_s, self._start_rate)

    def record(self, key: tuple, refs, piece, members: list[str], piece_sha256: str, class_names=None) -> str:
        """Leave the done record of a chunk this run converted into `piece`; returns its digest. `class_names`:
        a detection run's (`chunk_digest`)."""
        digest = chunk_digest(self.fingerprint, key, refs, class_names)
        write_done(self.folder, done_record(digest, self.run_id, piece, piece_sha256, members), key)
        return digest

    def assembled(self, shards_folder: str, shard_file: str, pieces) -> None:
        """Leave, beside the done records of a shard's `pieces` (in order), where their bytes are in the shard's
        file, `shard_file` in `shards_folder`, now that the pieces are in it: a rerun takes them from there.

        A small record of its own per piece (`<digest>.at.json`), written without reading the done record back.
        """
        offset = 0
        for piece in pieces:
            if piece.digest:
                write_location(self.folder, piece.digest, piece.file, shard_file, offset)
            offset += piece.bytes

    def take(self, key: tuple, refs, piece_name: str, shards_folder: str, piece_type, class_names=None):
        """The `piece_type` (output.write.PieceInfo) of the chunk taken from an interrupted run (copied, checked,
        into `piece_name` in `shards_folder`, and recorded as done in this run), or None: convert it.
        `class_names`: a detection run's (`chunk_digest`)."""
        if not self.earlier:
            return None
        digest = chunk_digest(self.fingerprint, key, refs, class_names)
        for earlier in self.earlier:
            record = read_done(earlier.folder, digest)
            if record is None or not _consistent(record, key, len(refs)):
                continue
            if any(not old or old != self.member_hash(ref) for ref, old in zip(refs, record["members"], strict=True)):
                return None  # a file changed in place (the same name and size, other bytes): converted again
            if not _accounts(record, refs):
                continue  # its hashes, rejections or tallies are not this chunk's images: converted again
            dest = FileSystems.join(shards_folder, piece_name)
            places = [(record["file"], None)]  # its piece file, else its bytes in its shard's file
            located = read_location(earlier.folder, digest, record["file"])
            if located is not None:
                places.append(located)
            if not any(copy_checked(FileSystems.join(earlier.shards, file), dest, record["bytes"], record["sha256"],
                                    offset) for file, offset in places):
                continue  # the piece is gone, cut short or changed: another run's, or converted again
            try:
                piece = piece_of(record, piece_name, earlier.run_id, piece_type, digest)
            except (TypeError, ValueError, KeyError):  # a record this code cannot read: converted again
                FileSystems.delete([dest])
                continue
            write_done(self.folder, {**record, "run_id": self.run_id, "file": piece_name}, key)
            counters.inc(RESUMED, len(piece.sizes))
            for rejection in piece.rejections:  # the progress line: every image leaves conversion once
                counters.inc(counters.rejected(rejection.reason))
            return piece
        return None
