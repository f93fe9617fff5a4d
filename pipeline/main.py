"""Entry point of the converter.

    python -m pipeline.main --input_dir=photos/ --output_dir=tfrecords/ [options] [Beam options]
    python -m pipeline.main --runner=DataflowRunner --input_dir=gs://... --output_dir=gs://... ...
"""

import gc
import sys

from pipeline.cli import main_of
from pipeline.launcher import run

if __name__ == "__main__":
    code = main_of(run)
    # Beam, gRPC and protobuf leave millions of objects behind; the interpreter's
    # last garbage collection over them took about 0.9 s of every run. Frozen
    # objects are skipped, and the process ends now anyway.
    gc.freeze()
    sys.exit(code)
