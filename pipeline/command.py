"""The `image-tfrecords` command: the converter and the read-side tools under one name.

    image-tfrecords convert --input_dir=photos/ --output_dir=tfrecords/    # python -m pipeline.main
    image-tfrecords verify tfrecords/                                     # python -m pipeline.verify
    image-tfrecords preview tfrecords/ --contact_sheet=sheet.png          # python -m pipeline.preview
    image-tfrecords benchmark tfrecords/                                  # python -m pipeline.benchmark

Each subcommand takes the options of its `python -m` form and shows the same help page under its own name.
A subcommand's module is imported only when it runs: `image-tfrecords verify` imports what
`python -m pipeline.verify` imports, and no more.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from pipeline import __version__
from pipeline.cli import running_as

PROG = "image-tfrecords"


def _convert(argv: list[str]) -> int:
    from pipeline import main  # sets OPENBLAS_NUM_THREADS before Beam's import, as `python -m pipeline.main` does

    return main.main(argv)


def _verify(argv: list[str]) -> int:
    from pipeline import verify

    return verify.main(argv)  # its own main: its own line on Ctrl-C, not the converter's


def _preview(argv: list[str]) -> int:
    from pipeline import preview

    return preview.main(argv)  # its own main: its own line on Ctrl-C, not the converter's


def _benchmark(argv: list[str]) -> int:
    from pipeline import benchmark

    return benchmark.main(argv)  # its own main: its own line on Ctrl-C, not the converter's


# {subcommand: (its runner, its python -m form, one line for the help page)}
SUBCOMMANDS: dict[str, tuple[Callable[[list[str]], int], str, str]] = {
    "convert": (_convert, "python -m pipeline.main",
                "convert a folder of labeled images (or a manifest) into a sharded TFRecord dataset"),
    "verify": (_verify, "python -m pipeline.verify", "check a converted dataset against its image_tfrecords.json"),
    "preview": (_preview, "python -m pipeline.preview", "draw a contact sheet and a chart of images per class"),
    "benchmark": (_benchmark, "python -m pipeline.benchmark", "measure how fast a dataset feeds an accelerator"),
}
_CHOICES = ", ".join(SUBCOMMANDS)


def help_text() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"usage: {PROG} {{{','.join(SUBCOMMANDS)}}} [options]", f"       {PROG} --version", "",
             "Convert folders of labeled images into sharded TFRecord datasets with Apache Beam, locally or on "
             "Google Cloud Dataflow; check, preview and benchmark them.", "", "subcommands:"]
    lines += [f"  {name:<{width}}  {line} ({module_form})" for name, (_, module_form, line) in SUBCOMMANDS.items()]
    lines += ["", f"{PROG} SUBCOMMAND --help lists a subcommand's options.",
              "", "options:", "  -h, --help  show this help message and exit",
              "  --version   show the version and exit"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run `image-tfrecords` on `argv` (default: sys.argv[1:]); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        return _usage_error(f"give a subcommand: {_CHOICES} ({PROG} --help says what each does)")
    first, rest = argv[0], argv[1:]
    if first in ("-h", "--help"):
        print(help_text(), end="")
        return 0
    if first == "--version":
        print(f"{PROG} {__version__}")
        return 0
    if first not in SUBCOMMANDS:
        if first.startswith("-"):
            return _usage_error(f"{first} comes after a subcommand: {PROG} SUBCOMMAND [options], with SUBCOMMAND "
                                f"one of {_CHOICES}")
        return _usage_error(f"unknown subcommand {first!r}: give one of {_CHOICES} ({PROG} --help)")
    run = SUBCOMMANDS[first][0]
    try:
        with running_as(f"{PROG} {first}"):
            return run(rest)
    except SystemExit as e:  # argparse's --help (0) and usage errors (2): a code, also for in-process callers
        return e.code if isinstance(e.code, int) else 1 if e.code else 0


def _usage_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
