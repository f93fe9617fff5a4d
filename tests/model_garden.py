"""TF Model Garden's TfExampleDecoder, a consumer of detection records that the tests decode them with."""

from __future__ import annotations

import importlib.util
import os
import sys
import types

# Where `make venv` installs tf-models-official, without its dependencies (Makefile: MODEL_GARDEN_VERSION).
MODEL_GARDEN = os.path.join(sys.prefix, "model-garden")


def model_garden_decoder():
    """Model Garden's TfExampleDecoder, loaded without its package's heavy __init__ (configs, tasks) and with a
    stand-in for tf_keras, which the module imports and does not use; from the folder `make venv` installs
    tf-models-official into (without its dependencies: MODEL_GARDEN below), or $MODEL_GARDEN_PATH. None when
    neither has it."""
    for extra in (os.environ.get("MODEL_GARDEN_PATH"), MODEL_GARDEN):
        if extra and os.path.isdir(extra) and extra not in sys.path:
            sys.path.append(extra)
    loaded = sys.modules.get("official")  # the stand-in package of an earlier call (its __spec__ is None)
    if loaded is not None and getattr(loaded, "__path__", None):
        root = list(loaded.__path__)[0]
    else:
        spec = importlib.util.find_spec("official")
        if spec is None or not spec.submodule_search_locations:
            return None
        root = list(spec.submodule_search_locations)[0]
    for name in ("official", "official.vision", "official.vision.dataloaders"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(root, *name.split(".")[1:])]
            sys.modules[name] = package
    sys.modules.setdefault("tf_keras", types.ModuleType("tf_keras"))
    from official.vision.dataloaders import tf_example_decoder

    return tf_example_decoder.TfExampleDecoder
