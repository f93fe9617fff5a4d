"""Shared command-line wrapper: user errors become one line on stderr and exit code 2."""

from __future__ import annotations

import sys
from collections.abc import Callable

from pipeline.errors import UserError


def main_of(run: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """Call `run(argv)` and turn a UserError into `error: <message>` and its exit code."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("error: interrupted; no image_tfrecords.json was written, so run the same command again",
              file=sys.stderr)
        return 130
