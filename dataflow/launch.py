"""Entry point of the Flex Template launcher (FLEX_TEMPLATE_PYTHON_PY_FILE); the same as `python -m pipeline.main`.

The template's parameters arrive as --name=value flags. The launcher submits the
job and returns without waiting for it (pipeline.cloud sees FLEX_TEMPLATE_PYTHON_PY_FILE).
"""

import sys

from pipeline.cli import main_of
from pipeline.launcher import run

if __name__ == "__main__":
    sys.exit(main_of(run))
