"""ListImages: every file under the input folder, through Beam's file systems (local or gs://)."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from transforms import counters
from transforms.layout import relative_path, skip_reason
from transforms.records import FileRef, Rejection

SKIPPED = "skipped"
FOUND = "found"


def listing_pattern(input_dir: str) -> str:
    """The glob that matches every file below `input_dir`, recursively."""
    return FileSystems.join(input_dir, "**")


def list_files(input_dir: str) -> list[FileMetadata]:
    """Metadata (path, size) of every file below `input_dir`; never reads file contents."""
    result = FileSystems.match([listing_pattern(input_dir)])[0]
    return sorted(result.metadata_list, key=lambda m: m.path)


class _FilterByName(beam.DoFn):
    """FileMetadata -> FileRef for candidate images; others go to SKIPPED with a reason.

    FOUND gets the number of files seen, once per bundle.
    """

    def __init__(self, input_dir: str):
        self._input_dir = input_dir
        self._found = 0

    def start_bundle(self):
        self._found = 0

    def finish_bundle(self):
        if self._found:
            yield beam.pvalue.TaggedOutput(FOUND, GlobalWindows.windowed_value(self._found))

    def process(self, metadata: FileMetadata):
        self._found += 1
        relpath = relative_path(metadata.path, self._input_dir)
        skip = skip_reason(relpath)
        if skip is not None:
            counters.inc("files_skipped")
            yield beam.pvalue.TaggedOutput(SKIPPED, Rejection(relpath, "skipped", *skip))
            return
        counters.inc("files_listed")
        yield FileRef(metadata.path, relpath, metadata.size_in_bytes)


class ListImages(beam.PTransform):
    """PBegin -> FileRef for every candidate image, plus a SKIPPED output of Rejection.

    FOUND counts every file listed (an int per bundle): the dataset description
    checks that each one was written, rejected or skipped.

    Listing runs inside the graph, so on Dataflow it needs nothing from the
    launcher's machine but the folder name.
    """

    def __init__(self, input_dir: str):
        super().__init__()
        self._input_dir = input_dir

    def expand(self, pbegin):
        return (
            pbegin
            | "Pattern" >> beam.Create([listing_pattern(self._input_dir)])
            | "MatchFiles" >> fileio.MatchAll()
            # FileMetadata -> FileRef (images) | Rejection (skipped)
            | "FilterByName" >> beam.ParDo(_FilterByName(self._input_dir)).with_outputs(SKIPPED, FOUND, main="images")
        )
