"""Entry point of the converter (`image-tfrecords convert` runs it too).

    image-tfrecords convert --input_dir=photos/ --output_dir=tfrecords/ [options] [Beam options]
    python -m pipeline.main --input_dir=photos/ --output_dir=tfrecords/ [options] [Beam options]
    python -m pipeline.main --runner=DataflowRunner --input_dir=gs://... --output_dir=gs://... ...
"""

import gc
import os
import sys

# Beam imports NumPy, whose OpenBLAS starts a thread per core that spins while
# idle and restarts around every fork of a worker; nothing here does linear
# algebra. With one thread, importing Beam takes about 0.2 s less and the
# launcher about 0.3 s less CPU (measured on 2 cores, 5 alternating pairs).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pipeline.cli import main_of  # noqa: E402  (after the variable above)


def main(argv: list[str] | None = None) -> int:
    """Run the converter on `argv` (default: sys.argv[1:]); returns the exit code. The process should exit right
    after."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        # The options are defined without Beam: the help page needs no Beam import (seconds on a cold disk).
        from pipeline.flags import help_text

        print(help_text())
        return 0
    from pipeline import lean_beam

    lean_beam.import_beam()  # first: Beam without the integrations a run never uses (a second of CPU)
    from pipeline.launcher import run

    code = main_of(run, argv)
    # Beam, gRPC and protobuf leave millions of objects behind; the interpreter's
    # last garbage collection over them took about 0.9 s of every run. Frozen
    # objects are skipped, and the process ends now anyway.
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(main())
