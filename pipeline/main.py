"""Entry point of the converter.

    python -m pipeline.main --input_dir=photos/ --output_dir=tfrecords/ [options] [Beam options]
    python -m pipeline.main --runner=DataflowRunner --input_dir=gs://... --output_dir=gs://... ...
"""

import sys

from pipeline.cli import main_of
from pipeline.launcher import run

if __name__ == "__main__":
    sys.exit(main_of(run))
