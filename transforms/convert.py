"""ConvertImages: read, decode, resize and encode each image, and wrap it in a tf.train.Example.

Bad images never fail the job: they leave on the REJECTED output with the
reason from the image layer, and are counted. Each image gets at most
--image_timeout_s seconds (see `imaging.TimedConverter`).
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms import counters
from transforms.examples import build_example
from transforms.imaging import DECODE_ERROR, READ_ERROR, ImageRejected, ImageSettings, TimedConverter
from transforms.records import ExampleRecord, ImageRef, Rejection

REJECTED = "rejected"


def read_bytes(path: str) -> bytes:
    """The whole file at `path`, through Beam's file systems (local or gs://)."""
    with FileSystems.open(path, compression_type="uncompressed") as f:
        return f.read()


class _ConvertImage(beam.DoFn):
    def __init__(self, settings: ImageSettings, schema: str):
        self._settings = settings
        self._schema = schema
        self._convert = None

    def setup(self):
        # The time limit runs each conversion on a helper thread: Beam calls
        # process() on its own worker threads, where SIGALRM cannot reach.
        self._convert = TimedConverter(self._settings)

    def _reject(self, ref: ImageRef, reason: str, detail: str):
        counters.inc(f"rejected_{reason}")
        return beam.pvalue.TaggedOutput(REJECTED, Rejection(ref.relpath, "rejected", reason, detail))

    def process(self, ref: ImageRef):
        try:
            data = read_bytes(ref.path)
        except Exception as e:  # a vanished or unreadable file is this file's problem only
            yield self._reject(ref, READ_ERROR, f"{type(e).__name__}: {e}")
            return
        try:
            image = self._convert(data)
        except ImageRejected as e:
            yield self._reject(ref, e.reason, e.detail)
            return
        except Exception as e:  # convert_image maps every decoder error; this is a last line of defence
            yield self._reject(ref, DECODE_ERROR, f"{type(e).__name__}: {e}")
            return
        serialized = build_example(
            image=image.data,
            image_format=image.format,
            label=ref.label,
            class_name=ref.class_name,
            height=image.height,
            width=image.width,
            source_path=ref.relpath,
            schema=self._schema,
        )
        counters.inc("images_converted")
        yield ExampleRecord(ref.split, ref.label, ref.relpath, ref.shuffle_key, image.upscaled, serialized)


class ConvertImages(beam.PTransform):
    """ImageRef -> ExampleRecord, plus a REJECTED output of Rejection."""

    def __init__(self, settings: ImageSettings, schema: str):
        super().__init__()
        self._fn = _ConvertImage(settings, schema)

    def expand(self, refs):
        return refs | "ConvertImage" >> beam.ParDo(self._fn).with_outputs(REJECTED, main="examples")
