"""The local runner's machinery: worker processes, progress line, quiet consoles, failures in one line.

Everything here exists for the speed and the console of local runs, and leans
on Beam internals. Its one entry point is `LocalRun` (pipeline/local/runner.py),
and only `pipeline.launcher` imports this package (tests/test_architecture.py).
"""

from pipeline.local.runner import LocalRun

__all__ = ["LocalRun"]
