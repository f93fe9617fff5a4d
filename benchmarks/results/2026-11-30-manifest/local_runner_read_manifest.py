"""Peak RSS of the local runner (in memory, one worker) running ReadManifest alone on a manifest of N rows.

    PYTHONPATH=. .venv/bin/python benchmarks/results/2026-11-30-manifest/local_runner_read_manifest.py M N
"""

import resource
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from transforms.inputs.manifest import ReadManifest

path, rows = sys.argv[1], int(sys.argv[2])
opts = PipelineOptions(["--direct_running_mode=in_memory", "--direct_num_workers=1"])
start = time.time()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with beam.Pipeline(options=opts) as p:
    read = p | ReadManifest(path, "csv", "/base", None, seed=1, validation_split=0.1, test_split=0.0, size=1000)
    read["images"] | beam.combiners.Count.Globally() | beam.Map(lambda n: print("images", n))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(rows, "rows", round(time.time() - start, 1), "s", "peak RSS MB", peak // 1024, "before", before // 1024)
