"""WriteShards: every shard converted in chunks on any worker, then assembled from its pieces, never read back.

The images arrive with their shard assigned (`transforms.labels.sharding`). Grouping
them by shard moves only their references (a few hundred bytes each), never
image bytes. Each shard's references are sorted into rank order and cut into
chunks of at most 64 images (and about 64 MB of source files): the unit of
conversion work, so a dataset of one shard keeps every core busy as well as
one of a hundred. The chunks are spread over the workers (a shuffle), and each
is converted there and written to its own piece file in the run's temporary
folder, under a name unique to the attempt: a retried chunk writes a new
piece, and only the committed attempt's piece is used.

Then each shard is assembled from its pieces, in chunk order, by the file
system itself (`transforms.output.concat`): TFRecord records and gzip members
concatenate, locally in the kernel and on GCS by a server-side compose, so no
record is read back. The records keep their rank order, and a shard is the
same bytes however many workers ran (its chunks depend on its images only).
Its size, its record count and, with index files, its `offset length` index
come from the pieces' records as they were written. ArrayRecord files cannot
be concatenated: an ArrayRecord shard is one chunk, converted in one place.

Each converted chunk leaves a done record beside its piece (`transforms.output.resume`), and a chunk that an
interrupted run of the same plan converted is taken from that run's folder, checked (its piece's size and
SHA-256, its images' SHA-256), instead of converted again: Convert does it where the chunk arrives.

Shards are assembled in the run's own temporary folder, each attempt under a
name of its own (train-00000-of-00004-<attempt>.tfrecord): a retried and a
stale attempt of one shard never write the same file, and the ShardInfo that
is committed names the file that is published. The dataset description
publishes them into the output folder, under their final names, once every
count and each file's size is checked. A final name can depend on what the
shard holds (--shard_names=kaggle puts its record count in it), so ShardInfo
carries both. The file itself is TFRecord or ArrayRecord
(`transforms.output.shardfiles`).
"""

from __future__ import annotations

import collections
import functools
import uuid
from collections import Counter
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from transforms.base import counters
from transforms.base.dataset_format import (
    KAGGLE,
    SHARD_FORMATS,
    STANDARD,
    TFRECORD,
    index_name,
    kaggle_name,
    shard_name,
    shard_suffix,
)
from transforms.base.paths import display_path
from transforms.base.records import label_of
from transforms.detection.conversion import (
    DetectionRecords,
    add_class_counts,
    lost_annotations,
    objects_tally,
    record_classes,
)
from transforms.images.convert import ReadPacing, collect_in_order, read_room, start_conversions
from transforms.images.pool import ConversionPool, time_limit
from transforms.images.settings import ImageSettings
from transforms.images.stats import SplitStats, StatsTally
from transforms.images.stats import merge as merge_stats
from transforms.labels.sharding import ShardKey, rank_order
from transforms.output.concat import concatenate, file_size
from transforms.output.ownership import shards_dir
from transforms.output.resume import Resume, file_sha256
from transforms.output.shardfiles import open_writer

__all__ = ["HASHES", "REJECTED", "RESUMED", "STATS", "WRITTEN", "ChunkKey", "PieceInfo", "ShardInfo", "WriteShards",
           "assemble", "cut_chunks", "index_text", "write_index", "write_piece"]
REJECTED = "rejected"
WRITTEN = "written"
HASHES = "hashes"  # (sha256, (split, label, relpath)) of every written image, for the duplicate report
STATS = "stats"  # (split, transforms.images.stats.SplitStats): one per shard, its images' pixel sums and source sizes
RESUMED = "resumed"  # (run id, records) of each piece taken from an interrupted run (transforms.output.resume)
OBJECTS = "objects"  # --task=detection: one objects tally per shard (transforms.detection.conversion.objects_tally)


class ShardInfo(NamedTuple):
    """One final shard: its split, final file name, record count, size in bytes, final index file name ('' for
    none) and its file's name in the run's temporary folder (its attempt's: `attempt_name`; '' when the same
    as its final name)."""

    split: str
    file: str
    records: int
    bytes: int
    index: str = ""
    temp: str = ""


def index_text(sizes: list[int]) -> str:
    """An index file's text: `offset length` per record, as DALI's and the tfrecord package's tfrecord2idx write."""
    lines, offset = [], 0
    for size in sizes:
        lines.append(f"{offset} {size}\n")
        offset += size
    return "".join(lines)


def write_index(folder: str, name: str, sizes: list[int]) -> None:
    """Write the index of a shard whose records have framed `sizes` to `folder/name`."""
    with FileSystems.create(FileSystems.join(folder, name), mime_type="text/plain",
                            compression_type=CompressionTypes.UNCOMPRESSED) as out:
        out.write(index_text(sizes).encode("ascii"))


# The unit of conversion work: at most this many images, and about this many bytes of source files.
CHUNK_IMAGES = 64
CHUNK_SOURCE_BYTES = 64_000_000
# With many workers, the images are cut into at least this many chunks per worker where chunks of MIN_CHUNK_IMAGES
# allow: the runner hands each worker its share of a stage's chunks by count, and with several each, all of about
# one size (the limit comes from the images of every split together), the shares even out (4,000 images on 96
# workers: 500 chunks of 8 instead of 63 of 64, which left a third of the workers idle).
CHUNKS_PER_WORKER = 8
MIN_CHUNK_IMAGES = 8


def chunk_limit(images: int, workers: int | None, max_images: int = CHUNK_IMAGES) -> int:
    """The most images in a chunk when `images` images in all are converted by `workers` processes."""
    if not workers or workers < 1:
        return max_images
    wanted = -(-images // (workers * CHUNKS_PER_WORKER))
    return max(min(max_images, MIN_CHUNK_IMAGES), min(max_images, wanted))


PIECES_DIR = "pieces"  # below the run's shards folder


class ChunkKey(NamedTuple):
    """Chunk `chunk` of `chunks` of a shard; travels as a plain tuple, as ShardKey does."""

    split: str
    index: int
    count: int
    chunk: int
    chunks: int


class PieceInfo(NamedTuple):
    """One converted chunk: its piece file (in the run's shards folder), and everything the shard's accounting
    takes from its images, so that the shard's side outputs come from exactly the pieces it is made of."""

    shard: tuple  # (split, index, count) of its ShardKey
    chunk: int
    chunks: int
    file: str  # pieces/train-00000-of-00004.00003-<attempt>.tfrecord
    bytes: int  # the piece file's size
    sizes: tuple  # each record's framed size, in order
    written: tuple  # ((split, label, upscaled), records), ...
    stats: SplitStats | None  # its images' pixel sums and source sizes; None when none was written
    rejections: tuple  # Rejection, ...
    hashes: tuple  # (sha256, (split, label, relpath)), ...
    resumed_from: str = ""  # the interrupted run whose chunk this is (output.resume); '' when converted
    digest: str = ""  # the name of its done record (transforms.output.resume); '' for none
    # --task=detection: the annotations its images' records do not hold (Rejections of stage 'annotation'), and
    # its objects tally (objects written, records without objects, the most in one record); () otherwise
    annotations: tuple = ()
    objects: tuple = ()
    classes: tuple = ()  # ((class name, objects, records holding one), ...) of its records


def cut_chunks(keyed, file_format: str = TFRECORD, max_images: int = CHUNK_IMAGES,
               max_bytes: int = CHUNK_SOURCE_BYTES, workers: int | None = None, layouts: dict | None = None):
    """(ShardKey, [ImageRef]) -> (ChunkKey, [ImageRef]) of each chunk, in rank order.

    The shard's images in rank order are cut into the fewest chunks of at most
    `max_images` images (fewer with many `workers`: `chunk_limit`, from the
    images of every split in `layouts`, {split: SplitLayout}, or without them
    the shard's images times its split's shards) and about `max_bytes` of listed
    source bytes, as even as their counts allow. The cut depends on the images
    and the worker count only; the records' bytes never depend on it.
    An ArrayRecord shard is one chunk (its files do not concatenate).
    """
    key, refs = keyed
    ordered = sorted(refs, key=rank_order)  # one shard's references: thousands, not the dataset
    images = sum(layout.images for layout in layouts.values()) if layouts else len(ordered) * key[2]
    max_images = chunk_limit(images, workers, max_images)
    if not SHARD_FORMATS[file_format].concatenates:
        chunks = 1
    else:
        source = sum(ref.size or 0 for ref in ordered)
        chunks = max(1, -(-len(ordered) // max_images), min(len(ordered), -(-source // max_bytes)))
    for chunk in range(chunks):
        yield ((*key, chunk, chunks),
               ordered[chunk * len(ordered) // chunks:(chunk + 1) * len(ordered) // chunks])


def piece_name(key: ChunkKey, compression: str, file_format: str, attempt: str) -> str:
    """pieces/train-00000-of-00004.00003-<attempt>.tfrecord: the chunk's piece file, unique to the attempt."""
    suffix = shard_suffix(compression, file_format)
    stem = shard_name(key.split, key.index, key.count, compression, file_format)[:-len(suffix)]
    return f"{PIECES_DIR}/{stem}.{key.chunk:05d}-{attempt}{suffix}"


class _ConvertChunk(beam.DoFn):
    """(ChunkKey, [ImageRef]) -> PieceInfo: the chunk's images converted, in order, into its piece file.

    `threads` conversions run at once in the worker process (`core_slot`);
    more helpers read files ahead of them, as many as the measured read and
    conversion times ask for (`ReadPacing`), within the memory budget's room
    for files read ahead (`read_room`). The chunks of a bundle overlap: a
    chunk's images are handed to the helpers as soon as it arrives, and the
    chunk before it is collected and written meanwhile, so the reads never
    pause between chunks. The last one is written when the bundle finishes.
    """

    def __init__(self, folder: str, settings: ImageSettings, schema: str, threads: int, compression: str,
                 file_format: str = TFRECORD, resume: Resume | None = None, detection: DetectionRecords | None = None):
        self._folder = folder
        self._detection = detection  # --task=detection: how its records are built (with the class names)
        self._class_index: dict | None = None
        self._class_names = None
        self._resume = resume  # None: no done records (tests that drive the converter alone)
        self._settings = settings
        self._schema = schema
        self._threads = threads
        self._compression = compression
        self._file_format = file_format
        self._pool: ConversionPool | None = None
        self._pacing: ReadPacing | None = None
        self._read_ahead = False  # whether helpers may outnumber the conversions (room in the budget)
        self._started: collections.deque = collections.deque()  # (ChunkKey, [(ImageRef, Job)]) being converted

    def setup(self):
        self._pool = ConversionPool(time_limit(self._settings), threads=self._threads)
        self._pacing = ReadPacing(self._threads)
        # Without room in the budget for files read ahead, no more helpers than conversions.
        self._read_ahead = bool(read_room(self._settings)) or not self._settings.worker_memory_bytes

    def teardown(self):
        if self._pool is not None:
            self._pool.close()

    def _pace(self, outcomes):
        for outcome in outcomes:
            if self._read_ahead:
                self._pool.grow(self._pacing.helpers())
            yield outcome

    def start_bundle(self):
        self._drop_started()

    def _build(self, class_names):
        """A detection record builder bound to the class ids (a side input, the same list every time)."""
        if self._detection is None:
            return None
        if class_names is not self._class_names:
            self._class_names, self._class_index = class_names, {name: i for i, name in enumerate(class_names)}
        return functools.partial(self._detection.build, class_index=self._class_index)

    def process(self, element, class_names=None):
        key, refs = element
        build = self._build(class_names)
        taken = self._take(ChunkKey(*key), refs)
        if taken is not None:
            yield taken
            return
        self._started.append((ChunkKey(*key), start_conversions(self._pool, refs, self._settings, self._threads,
                                                                self._pacing, build)))
        while len(self._started) > 1:
            yield self._write_piece(*self._started.popleft())

    def finish_bundle(self):
        while self._started:
            yield GlobalWindows.windowed_value(self._write_piece(*self._started.popleft()))
        counters.flush_progress()  # the bundle's last counts reach a local run's progress line now

    def _drop_started(self) -> None:
        """Forget the chunks of a bundle that failed: their jobs that have not started never will."""
        for _, jobs in self._started:
            for _, job in jobs:
                job.cancelled = True
        self._started.clear()

    def _take(self, key: ChunkKey, refs) -> PieceInfo | None:
        """The chunk's piece taken from an interrupted run of the same plan, checked; None: convert it."""
        if self._resume is None:
            return None
        name = piece_name(key, self._compression, self._file_format, uuid.uuid4().hex[:16])
        return self._resume.take(tuple(key), refs, name, self._folder, PieceInfo, self._class_names)

    def _write_piece(self, key: ChunkKey, jobs) -> PieceInfo:
        try:
            done = {} if self._resume is not None else None
            piece = write_piece(self._folder, key, self._pace(collect_in_order(self._pool, jobs, self._schema)),
                                self._compression, self._file_format, done=done)
            if self._resume is not None:  # after the piece is complete: what a rerun may take instead
                # a member of no SHA-256 (never read whole) makes the chunk one a rerun converts again
                refs = [ref for ref, _ in jobs]
                piece_sha256 = done["sha256"] or file_sha256(FileSystems.join(self._folder, piece.file))
                piece = piece._replace(digest=self._resume.record(tuple(key), refs, piece, done["members"],
                                                                  piece_sha256, self._class_names))
            return piece
        except BaseException:
            self._drop_started()
            raise


def write_piece(folder: str, key: ChunkKey, outcomes, compression: str, file_format: str = TFRECORD,
                attempt: str | None = None, done: dict | None = None) -> PieceInfo:
    """Write a chunk's conversion `outcomes` (Converted, in order) to a new piece file in `folder`.

    With `done` (a dict), what the chunk's done record needs is put in it: 'members', each image's source SHA-256
    in order ('' for one rejected before it was read whole: a timeout, a read error), and 'sha256', the piece
    file's (None when it is not known without reading the file back: gzip-compressed TFRecord).
    """
    name = piece_name(key, compression, file_format, attempt or uuid.uuid4().hex[:16])
    out = open_writer(FileSystems.join(folder, name), file_format, compression)
    written: Counter = Counter()  # (split, label, upscaled) -> records
    sizes, rejections, hashes = [], [], []
    tally = StatsTally()  # one small element per shard leaves, not one per image
    members = []
    annotations, objects = [], None  # --task=detection: what its records do not hold; (objects, empty, most)
    classes: dict = {}  # --task=detection: {class name: [objects, records]}
    for outcome in outcomes:
        members.append(outcome.sha256)  # a rejected one's when it was read whole, else ''
        annotations.extend(outcome.set_aside)
        if outcome.rejection is not None:
            rejections.append(outcome.rejection)
            annotations.extend(lost_annotations(outcome.ref, outcome.rejection))
            continue
        if outcome.objects is not None:
            written_objects, empty, most = objects or (0, 0, 0)
            objects = (written_objects + outcome.objects, empty + (not outcome.objects), max(most, outcome.objects))
            add_class_counts(classes, record_classes(outcome.classes))
        sizes.append(out.write(outcome.example))
        label = label_of(outcome.ref)  # a tuple of class ids with --multi_label
        written[(key.split, label, outcome.upscaled)] += 1
        tally.add(outcome.stats, outcome.upscaled, outcome.kept)
        hashes.append((outcome.sha256, (key.split, label, display_path(outcome.ref.relpath))))
    size = out.close()
    if done is not None:
        done.update(members=members, sha256=getattr(out, "sha256", None))
    return PieceInfo((key.split, key.index, key.count), key.chunk, key.chunks, name, size, tuple(sizes),
                     tuple(written.items()), tally.result() if tally.images else None, tuple(rejections),
                     tuple(hashes), annotations=tuple(annotations), objects=objects or (),
                     classes=tuple((name, n, records) for name, (n, records) in sorted(classes.items())))


def chosen_pieces(pieces) -> list[PieceInfo]:
    """One piece per chunk, in chunk order: should a chunk come twice (two attempts), the same one every time.

    Raises:
        RuntimeError: a chunk of the shard is missing (an invariant of the graph is broken).
    """
    chosen: dict[int, PieceInfo] = {}
    for piece in pieces:
        if piece.chunk not in chosen or piece.file < chosen[piece.chunk].file:
            chosen[piece.chunk] = piece
    chunks = next(iter(chosen.values())).chunks
    missing = sorted(set(range(chunks)) - set(chosen))
    if missing:
        raise RuntimeError(f"shard {next(iter(chosen.values())).shard}: chunks {missing} of {chunks} never arrived")
    return [chosen[chunk] for chunk in range(chunks)]


def attempt_name(name: str, attempt: str) -> str:
    """An attempt's file of shard `name` in the run's folder: train-00000-of-00004-<attempt>.tfrecord."""
    stem, _, suffix = name.partition(".")
    return f"{stem}-{attempt}.{suffix}"


def _earlier_attempt(folder: str, name: str, expected: int) -> str | None:
    """The file of an earlier attempt at shard `name` that holds its pieces' `expected` bytes, if any."""
    pattern = FileSystems.join(folder, attempt_name(name, "*"))
    found = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list if m.size_in_bytes == expected)
    return found[0].rsplit("/", 1)[-1] if found else None


def assemble(folder: str, name: str, pieces: list[PieceInfo], attempt: str | None = None) -> tuple[str, int]:
    """Make shard `name`'s file in `folder` from its `pieces` (in order); returns its file's name and size. The
    pieces are removed.

    The file is the attempt's own (`attempt_name`; `name` itself without an `attempt`). A single piece is
    renamed; several are concatenated by the file system (`transforms.output.concat`), never read back. A retry after
    an earlier attempt removed the pieces finds that attempt's file whole (its size is the pieces' sum), and
    names it.

    Raises:
        OSError: the shard does not hold exactly its pieces' bytes.
    """
    own = attempt_name(name, attempt) if attempt else name
    dest = FileSystems.join(folder, own)
    sources = [FileSystems.join(folder, piece.file) for piece in pieces]
    expected = sum(piece.bytes for piece in pieces)
    if not FileSystems.exists(sources[0]):
        earlier = own if FileSystems.exists(dest) and file_size(dest) == expected else None
        earlier = earlier or (_earlier_attempt(folder, name, expected) if attempt else None)
        if earlier:
            return earlier, expected  # an earlier attempt assembled it and removed the pieces
    if len(sources) == 1:
        FileSystems.rename(sources, [dest])
        size = file_size(dest)
        if size != expected:
            raise OSError(f"{dest} holds {size} bytes, its piece {expected}: run the conversion again")
        return own, size
    size = concatenate(sources, dest, expected)
    FileSystems.delete(sources)
    return own, size


def shard_of_piece(piece: PieceInfo) -> tuple:
    return tuple(piece.shard)


class _AssembleShard(beam.DoFn):
    """(shard key, [PieceInfo]) -> ShardInfo; Rejection on REJECTED; ((split, label, upscaled), records) on WRITTEN;
    (sha256, (split, label, relpath)) of each written image on HASHES; (split, SplitStats) of the shard on STATS."""

    def __init__(self, folder: str, compression: str, index_files: bool, file_format: str = TFRECORD,
                 shard_names: str = STANDARD, resume: Resume | None = None):
        self._folder = folder
        self._resume = resume
        self._compression = compression
        self._index_files = index_files
        self._file_format = file_format
        self._shard_names = shard_names

    def process(self, element):
        key, pieces = element
        key = ShardKey(*key)
        pieces = chosen_pieces(pieces)
        name = shard_name(key.split, key.index, key.count, self._compression, self._file_format)
        # this attempt's own file: another attempt at the shard, retried or stale, never writes it
        temp, size = assemble(self._folder, name, pieces, attempt=uuid.uuid4().hex[:16])
        if self._resume is not None:  # the pieces are in the shard's file now: a rerun takes them from there
            self._resume.assembled(self._folder, temp, pieces)
        sizes = [record for piece in pieces for record in piece.sizes]
        written: Counter = Counter()
        objects, classes = None, {}  # --task=detection: the shard's objects tally, {class name: [objects, records]}
        for piece in pieces:
            if piece.resumed_from:
                yield beam.pvalue.TaggedOutput(RESUMED, (piece.resumed_from, len(piece.sizes)))
            written.update(dict(piece.written))
            for rejection in (*piece.rejections, *piece.annotations):
                yield beam.pvalue.TaggedOutput(REJECTED, rejection)
            for hashed in piece.hashes:
                yield beam.pvalue.TaggedOutput(HASHES, hashed)
            if piece.objects:
                total = objects or (0, 0, 0)
                objects = (total[0] + piece.objects[0], total[1] + piece.objects[1], max(total[2], piece.objects[2]))
                add_class_counts(classes, piece.classes)
        if objects is not None:
            yield beam.pvalue.TaggedOutput(OBJECTS, objects_tally(
                *objects, split=key.split, classes=[(name, n, records) for name, (n, records) in classes.items()]))
        final = name
        if self._shard_names == KAGGLE:  # the record count is known now; the file is renamed when published
            final = kaggle_name(key.split, key.index, key.count, len(sizes), self._compression, self._file_format)
        index = ""
        if self._index_files:
            index = index_name(temp)
            write_index(self._folder, index, sizes)
        for kind, count in written.items():
            yield beam.pvalue.TaggedOutput(WRITTEN, (kind, count))
        stats = [piece.stats for piece in pieces if piece.stats is not None]
        if stats:
            yield beam.pvalue.TaggedOutput(STATS, (key.split, merge_stats(stats)))
        yield ShardInfo(key.split, final, len(sizes), size, index_name(final) if index else "", temp)


class ConvertChunks(beam.PTransform):
    """(ShardKey, ImageRef) -> PieceInfo of every chunk: its images converted into a piece file, on any worker."""

    def __init__(self, fn: _ConvertChunk, file_format: str, chunk_images: int = CHUNK_IMAGES,
                 workers: int | None = None, layouts=None, class_names=None):
        super().__init__()
        self._fn = fn
        self._class_names = class_names  # --task=detection: a list, or a PCollection of one list (found in the job)
        self._file_format = file_format
        self._chunk_images = chunk_images
        self._workers = workers
        self._layouts = layouts

    def expand(self, placed):
        return (
            placed
            # (ShardKey, [ImageRef]): references only, a shard's worth each
            | "GroupByShard" >> beam.GroupByKey()
            # (ChunkKey, [ImageRef]): at most 64 images each (8 or more chunks a worker, all of about one size),
            # in rank order
            | "CutChunks" >> beam.FlatMap(cut_chunks, self._file_format, self._chunk_images, workers=self._workers,
                                          **({} if self._layouts is None else {"layouts": self._layouts}))
            # the same, spread over the workers: a shard's chunks convert in parallel
            | "SpreadChunks" >> beam.Reshuffle()
            | "Convert" >> beam.ParDo(self._fn, **self._side())
        )

    def _side(self) -> dict:
        if self._class_names is None:
            return {}
        if isinstance(self._class_names, beam.PCollection):
            return {"class_names": beam.pvalue.AsSingleton(self._class_names)}
        return {"class_names": list(self._class_names)}


class AssembleShards(beam.PTransform):
    """PieceInfo -> ShardInfo of every shard, made from its pieces; REJECTED, WRITTEN, HASHES and STATS aside."""

    def __init__(self, fn: _AssembleShard):
        super().__init__()
        self._fn = fn

    def expand(self, pieces):
        return (
            pieces
            # (shard key, [PieceInfo]): a shard's pieces, a few small elements
            | "GroupPieces" >> beam.GroupBy(shard_of_piece)
            | "Assemble" >> beam.ParDo(self._fn).with_outputs(REJECTED, WRITTEN, HASHES, STATS, RESUMED, OBJECTS,
                                                          main="shards")
        )


class WriteShards(beam.PTransform):
    """(ShardKey, ImageRef) -> ShardInfo of every shard; REJECTED (Rejection), WRITTEN (tallies), HASHES
    ((sha256, (split, label, relpath)) per written image), STATS ((split, SplitStats) per shard) and RESUMED
    ((run id, records) per chunk taken from an interrupted run) on the side; with `detection` (--task=detection:
    transforms.detection.conversion.DetectionRecords), each record is a detection record of the image's
    annotations, with the ids of `class_names` (a list, or a PCollection of one list), the annotations the records
    do not hold are REJECTED too (stage 'annotation'), and OBJECTS has one objects tally per shard.

    Shards are written to the run's own temporary folder under their standard
    names; the dataset description publishes them into `output_dir`, under
    their final names, once every count is checked. With `index_files`, each
    shard's index file is written beside it (uncompressed TFRecord shards only).
    `chunk_images`: the most images in one unit of conversion work, fewer so that each of `workers` processes
    gets several (`chunk_limit`; `layouts`, AssignShards' side input of {split: SplitLayout}, gives the total).
    `resume` (transforms.output.resume.Resume): each
    converted chunk leaves a done record, and a chunk an interrupted run of the same plan converted is taken
    from it, checked, instead of converted again.
    """

    def __init__(self, output_dir: str, run_id: str, settings: ImageSettings, schema: str, threads: int,
                 compression: str, index_files: bool = False, file_format: str = TFRECORD,
                 shard_names: str = STANDARD, chunk_images: int = CHUNK_IMAGES, resume: Resume | None = None,
                 workers: int | None = None, layouts=None, detection: DetectionRecords | None = None,
                 class_names=None):
        super().__init__()
        if index_files and (compression != "none" or not SHARD_FORMATS[file_format].index_files):
            raise ValueError("index files hold byte offsets into uncompressed TFRecord shards: not with "
                             "compression or another file format")
        if not SHARD_FORMATS[file_format].gzip and compression != "none":
            raise ValueError("ArrayRecord shards are not gzip-compressed")
        folder = shards_dir(output_dir, run_id)
        self._file_format = file_format
        self._chunk_images = chunk_images
        self._workers = workers
        self._layouts = layouts
        self._class_names = class_names
        self._convert = _ConvertChunk(folder, settings, schema, threads, compression, file_format, resume, detection)
        self._assemble = _AssembleShard(folder, compression, index_files, file_format, shard_names, resume)

    def expand(self, placed):
        return (
            placed
            # PieceInfo of every chunk
            | "ConvertChunks" >> ConvertChunks(self._convert, self._file_format, self._chunk_images, self._workers,
                                                 self._layouts, self._class_names)
            # ShardInfo of every shard, with the side outputs
            | "AssembleShards" >> AssembleShards(self._assemble)
        )
