"""What `import pipeline.reader` costs beyond TensorFlow's own import.

    python -m benchmarks.reader_import [--repeats 5]

Each measurement is a fresh interpreter: one imports TensorFlow alone, the other TensorFlow and then
pipeline.reader. The difference of their medians is what the reader adds (its own modules, and Apache Beam
while the read side imported it). It also says whether apache_beam was imported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_PROBE = """
import json, sys, time
start = time.perf_counter()
import tensorflow
tf_done = time.perf_counter()
{extra}
end = time.perf_counter()
print(json.dumps({{"tensorflow_s": tf_done - start, "after_tf_s": end - tf_done,
                  "beam": "apache_beam" in sys.modules}}))
"""


def _run(extra: str) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", _PROBE.format(extra=extra)], capture_output=True, text=True,
                         env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(repeats: int) -> dict:
    alone = [_run("")["after_tf_s"] for _ in range(repeats)]
    runs = [_run("import pipeline.reader") for _ in range(repeats)]
    reader = [r["after_tf_s"] for r in runs]
    return {"repeats": repeats,
            "tensorflow_import_s": statistics.median(r["tensorflow_s"] for r in runs),
            "reader_beyond_tensorflow_s": statistics.median(reader) - statistics.median(alone),
            "apache_beam_imported": any(r["beam"] for r in runs)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    result = measure(parser.parse_args(argv).repeats)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
