"""The one exception type for user errors: printed as one line, exit code 2, no traceback."""


class UserError(Exception):
    """A problem with the user's input or options that the user can fix.

    The message says what is wrong and what to do about it.
    """

    exit_code = 2


class DatasetError(UserError):
    """A dataset folder that cannot be read: no image_tfrecords.json, missing or corrupt shards."""


class OutOfSpace(UserError):
    """The output folder's disk filled up during a run."""

    exit_code = 1


class OutputLost(UserError):
    """The output folder was deleted, moved or made unwritable while a local run wrote into it."""

    exit_code = 1


class WorkerDied(UserError):
    """A local worker process died during a run (most often killed by the out-of-memory killer)."""

    exit_code = 1


class TransientReadFailed(UserError):
    """A read kept failing with transient errors (429, 5xx, resets) after every retry during a local run."""

    exit_code = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, Kubernetes or systemd stopping the run): handled as Ctrl-C is, exit code 143.

    A KeyboardInterrupt, so that every clean-up of an interrupted run (its lock,
    its worker processes, its quiet logs) applies to it unchanged.
    """

    exit_code = 128 + 15


class InputDamaged(UserError):
    """An input found cut short or damaged during a run (a compressed manifest or metadata file, a dataset's sources
    files), or a run whose records do not add up: nothing was published."""

    exit_code = 1
