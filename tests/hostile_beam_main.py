"""`python -m tests.hostile_beam_main ARGS`: the converter, on a Beam whose private names it once used are gone or
changed (issue 46), so that a run shows whether anything of the tool still leans on them.

- `worker_handlers.ExternalWorkerHandler` is deleted (the runner finds its handler by URN, registered at import);
- `fn_runner.ProgressRequester` refuses to be subclassed or given a callback;
- `fn_runner.BundleManager.process_bundle` takes one more keyword;
- `core.get_function_arguments` takes one more keyword (lean_beam's memoizing then stays out, with one warning).
"""

from __future__ import annotations

import sys


def break_private_beam() -> None:
    from apache_beam.runners.portability.fn_api_runner import fn_runner, worker_handlers
    from apache_beam.transforms import core

    del worker_handlers.ExternalWorkerHandler

    class ProgressRequester(fn_runner.ProgressRequester):
        def __init_subclass__(cls, **kwargs):
            raise TypeError("fn_runner.ProgressRequester is private: not to be subclassed")

        def __init__(self, worker_handler, instruction_id, frequency, callback=None):
            if callback is not None:
                raise TypeError("fn_runner.ProgressRequester is private: no callback")
            super().__init__(worker_handler, instruction_id, frequency)

    fn_runner.ProgressRequester = ProgressRequester
    process_bundle = fn_runner.BundleManager.process_bundle

    def process_bundle_with_more(self, inputs, expected_outputs, fired_timers, expected_output_timers,
                                 dry_run=False, *, a_new_keyword=None):
        return process_bundle(self, inputs, expected_outputs, fired_timers, expected_output_timers, dry_run)

    fn_runner.BundleManager.process_bundle = process_bundle_with_more
    get_function_arguments = core.get_function_arguments

    def changed(obj, func, *, a_new_keyword=None):
        return get_function_arguments(obj, func)

    core.get_function_arguments = changed


def main(argv: list[str]) -> int:
    from pipeline import lean_beam

    lean_beam.import_beam()
    break_private_beam()  # before the launcher is imported: the tool meets this Beam from its first import
    from pipeline.cli import main_of
    from pipeline.launcher import run

    return main_of(run, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
