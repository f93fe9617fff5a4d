"""Entry point of the Flex Template launcher (FLEX_TEMPLATE_PYTHON_PY_FILE); the same as `python -m pipeline.main`.

The template's parameters arrive as --name=value flags, with the launch request's
Dataflow options and --template_location: the program plans the dataset, takes the
output folder's lock, and writes the job description there; the template launcher
then submits the job, which releases the lock when it finishes (see pipeline.cloud).
"""

import sys

from pipeline.cli import main_of
from pipeline.launcher import run

if __name__ == "__main__":
    sys.exit(main_of(run))
