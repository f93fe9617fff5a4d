"""Import Apache Beam without the optional integrations a conversion never uses: a second off every run's start.

`import apache_beam` imports, besides Beam itself, every optional integration
it finds installed: pandas (for DataFrame batches), MongoDB's bson and pymongo,
the Pub/Sub and BigQuery IOs (`beam.io`'s namespace), and the Dataflow API
client. None of them converts an image, and together they were about a third of
the launcher's CPU before its first step (0.9-1.1 s of 3.0 s, measured with
5 alternating pairs on 2 cores). Beam imports each of them in a
`try: ... except ImportError:` and goes on without it, so:

- OPTIONAL modules are refused (ImportError) while Beam's package imports, and
  only then: Beam leaves those integrations out, and anything that asks for one
  later (the read side's pandas, say) imports it as usual;
- LAZY modules are loaded on first use (`importlib.util.LazyLoader`): the Dataflow
  runner holds the API client from its import on, and uses it only when a job is
  submitted; and every graph's `beam.io.Write` imports Beam's Pub/Sub IO (to ask
  whether its sink is Pub/Sub's), which imports the Pub/Sub client, 0.1-0.16 s that
  no conversion uses. So the Pub/Sub IO is imported here, with its client LAZY.

    from pipeline import lean_beam
    lean_beam.import_beam()  # before the first Beam import (pipeline/main.py)
    lean_beam.memoize_signatures()  # before a graph is built (pipeline/launcher.py)

`memoize_signatures` makes Beam read each DoFn method's signature once: building,
checking and translating a graph, Beam asks for the arguments of every method of
every DoFn about eight times over (`userstate.get_dofn_specs` wraps each of a
DoFn's ~80 methods), 0.3-0.4 s of a small local run's 1.2 s.

If Beam is imported already it does nothing. Leans on how Beam 2.77's
`apache_beam/__init__` imports its integrations (apache-beam is pinned in
setup.py); tests/test_lean_beam.py checks what stays out and that a Dataflow
submission and a local run still work.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import types
import weakref

# Refused while Beam's package imports; each is optional to Beam (imported in a try block).
OPTIONAL = (
    "pandas",  # apache_beam.typehints: DataFrame batch converters
    "bson",  # apache_beam.io.mongodbio: MongoDB IO (it imports pymongo after bson)
    "apache_beam.io.gcp.bigquery",  # apache_beam.io: BigQuery IO in beam.io's namespace
)
# Loaded on first use: the Dataflow runner's API client (google.cloud.dataflow), used when a job is submitted, and
# the Pub/Sub client, which Beam's Pub/Sub IO holds (for streaming jobs).
LAZY = ("google.cloud.dataflow", "google.cloud.pubsub")
# Imported with the LAZY modules deferred: iobase.Write.expand imports it in every graph.
DEFERRING = ("apache_beam.io.gcp.pubsub",)


# Set to 1, a run uses no hook into Beam at all: Beam imports as usual, signatures are read as Beam reads them, and
# a local run uses Beam's own multi_processing mode (docs/running-locally.md).
PLAIN_BEAM_ENV = "IMAGE_TFRECORDS_PLAIN_BEAM"
_LOG = logging.getLogger("pipeline")


def plain() -> bool:
    """Whether this run is to use Beam exactly as Beam ships it (IMAGE_TFRECORDS_PLAIN_BEAM=1)."""
    return os.environ.get(PLAIN_BEAM_ENV, "").strip().lower() in ("1", "true", "yes")


def _refused(name: str, names: tuple[str, ...]) -> bool:
    return any(name == refused or name.startswith(refused + ".") for refused in names)


def spec_past(finder, name: str):
    """The spec of module `name` as the finders of sys.meta_path other than `finder` (which is first) find it."""
    sys.meta_path.remove(finder)
    try:
        return importlib.util.find_spec(name)
    finally:
        sys.meta_path.insert(0, finder)


class _Finder:
    """A meta path finder: OPTIONAL modules are not found, LAZY ones load on first attribute access."""

    def find_spec(self, name, path=None, target=None):
        if _refused(name, OPTIONAL):
            raise ModuleNotFoundError(f"{name} is left out of this process's Beam import", name=name)
        if name not in LAZY:
            return None
        spec = spec_past(self, name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


def import_beam() -> None:
    """Import apache_beam with the OPTIONAL modules left out and the LAZY ones deferred (once per process)."""
    if "apache_beam" in sys.modules or plain():
        return
    finder = _Finder()
    # mongodbio logs a warning ("Could not find a compatible bson package") when bson is missing.
    mongo_log = logging.getLogger("apache_beam.io.mongodbio")
    level = mongo_log.level
    mongo_log.setLevel(logging.ERROR)
    sys.meta_path.insert(0, finder)
    try:
        import apache_beam  # noqa: F401

        for name in DEFERRING:
            importlib.import_module(name)
    except ImportError as e:  # this Beam needs one of them after all: forget the half import and import it all
        sys.meta_path.remove(finder)
        for name in [name for name in sys.modules if name == "apache_beam" or name.startswith("apache_beam.")]:
            del sys.modules[name]
        _LOG.warning("Beam did not import without its optional integrations (%s): importing all of it", e)
        import apache_beam  # noqa: F401, F811
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        mongo_log.setLevel(level)


def memoize_signatures() -> None:
    """Make Beam's `core.get_function_arguments` inspect each method's function once (once per process).

    For a method bound to a DoFn, Beam's answer (the argument names and defaults past `self`) depends only on the
    method's function, so it is kept per function: weakly, so that the functions a graph makes go with it. A DoFn's
    `_inspect_<method>` hook (beam.Map's, which answers for the callable it wraps) is still asked every time, and
    anything but a bound method is inspected as before.
    """
    from apache_beam.transforms import core

    if plain() or getattr(getattr(core, "get_function_arguments", None), "memoized", False):
        return
    if not _answers_as_expected(core):
        _LOG.warning("Beam's core.get_function_arguments is not as this tool knows it: DoFn signatures are read "
                     "as Beam reads them (a slower graph build)")
        return
    inspect = core.get_function_args_defaults
    known: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get_function_arguments(obj, func):
        hook = f"_inspect_{func}"
        if hasattr(obj, hook):
            return getattr(obj, hook)()
        method = getattr(obj, func)
        if type(method) is not types.MethodType:
            return inspect(method)
        try:
            answer = known.get(method.__func__)
            if answer is None:
                answer = known[method.__func__] = inspect(method)
        except TypeError:  # a callable that is not weakly referenceable
            return inspect(method)
        args, defaults = answer
        return list(args), list(defaults)

    get_function_arguments.memoized = True
    core.get_function_arguments = get_function_arguments


def _answers_as_expected(core) -> bool:
    """Whether Beam's `get_function_arguments(obj, func)` and `get_function_args_defaults(f)` are there and answer
    for a bound method as `memoize_signatures` keeps their answer: (argument names past self, defaults)."""
    import inspect

    ask, inspect_function = (getattr(core, name, None) for name in ("get_function_arguments",
                                                                     "get_function_args_defaults"))
    if not (callable(ask) and callable(inspect_function)):
        return False
    try:
        if list(inspect.signature(ask).parameters) != ["obj", "func"]:
            return False

        class Probe:
            def process(self, element, side=3):
                return element

        answer = ask(Probe(), "process")
        return (tuple(map(list, answer)) == (["element", "side"], [3])
                and tuple(map(list, inspect_function(Probe().process))) == (["element", "side"], [3]))
    except Exception:  # noqa: BLE001 (any failure means: not as known)
        return False
