"""Pick the tf.distribute strategy to benchmark on: a TPU, else the GPUs, else the CPU.

    choice = select_strategy(tpu=None)     # auto-detect; 'local' on a TPU VM; or a TPU name
    choice.strategy.run(...)

Auto-detection must never hang or crash on a machine without a TPU (or
without network access): a TPU is only tried when there is a sign of one
(a TPU environment variable, or TPU device files), the Cloud TPU client's
metadata requests get a short socket timeout, a remote TPU's gRPC port is
probed before TensorFlow retries it for minutes, and any failure falls back
to the GPUs or the CPU with a note saying why.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urlparse

import tensorflow as tf

from pipeline.errors import UserError

# Set by Cloud TPU Nodes, GKE and Colab/Kaggle-style hosts; TPUClusterResolver reads them itself.
TPU_ENV_VARS = ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_CONFIG")
# TPU chips attached to a TPU VM: /dev/accel* (v2-v4) or VFIO devices (v5e and later).
TPU_DEVICE_GLOBS = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")
# Seconds for each metadata/API request and for the gRPC port probe.
CONNECT_TIMEOUT_S = 10.0


@dataclass
class StrategyChoice:
    """The strategy, what it is ('tpu', 'gpu', 'cpu'), and why it was chosen."""

    strategy: tf.distribute.Strategy
    kind: str
    description: str
    notes: list[str] = field(default_factory=list)

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync


def tpu_devices(device_globs: Iterable[str] = TPU_DEVICE_GLOBS) -> list[str]:
    """TPU device files of this machine (empty on anything but a TPU VM)."""
    return sorted(path for pattern in device_globs for path in glob.glob(pattern))


def detect_tpu(environ=None, device_paths: list[str] | None = None) -> tuple[str | None, str] | None:
    """What to pass to TPUClusterResolver without --tpu, and why; None when there is no sign of a TPU.

    Returns (tpu, reason): tpu is None to let the resolver read the environment
    variable itself, or 'local' for TPU devices attached to this VM.
    """
    # Chips attached to this machine come first: a TPU VM is 'local' whatever its environment says.
    devices = tpu_devices() if device_paths is None else device_paths
    if devices:
        return "local", f"TPU devices {', '.join(devices[:2])}{' ...' if len(devices) > 2 else ''}"
    environ = os.environ if environ is None else environ
    for name in TPU_ENV_VARS:
        if environ.get(name):
            value = environ[name]
            return ("local" if value == "local" else None), f"{name}={value}"
    return None


@contextlib.contextmanager
def _socket_timeout(seconds: float):
    """Bound the Cloud TPU client's urllib calls, which have no timeout of their own."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def _probe_grpc(master: str, timeout_s: float) -> None:
    """Raise ConnectionError when a remote TPU's gRPC endpoint does not accept connections."""
    if not master.startswith("grpc://"):
        return
    address = urlparse(master)
    try:
        with socket.create_connection((address.hostname, address.port or 8470), timeout=timeout_s):
            pass
    except OSError as e:
        raise ConnectionError(f"{master} does not answer ({e})") from None


def _first_line(error: BaseException, limit: int = 160) -> str:
    """'Type: first sentence' of an error, without TensorFlow's node names."""
    text = re.sub(r"\{\{[^}]*\}\}", "", str(error)).strip()
    text = text.splitlines()[0] if text else ""
    text = re.split(r"(?<=[a-z])\. ", text)[0]
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(error).__name__}: {text}".strip().rstrip(":")


def _reset_runtime() -> None:
    """Undo a failed experimental_connect_to_cluster, which leaves TensorFlow unusable for local devices."""
    try:
        from tensorflow.python.eager import context

        context._reset_context()
    except (ImportError, AttributeError):  # a TensorFlow without this private helper: nothing to undo with
        pass


def connect_tpu(tpu: str | None, resolver_factory: Callable | None = None,
                timeout_s: float = CONNECT_TIMEOUT_S) -> tf.distribute.Strategy:
    """Connect to and initialise a TPU the standard way; returns its TPUStrategy.

    `tpu` is a TPU name, a grpc:// address, 'local' (a TPU VM), or None (read
    from TPU_NAME and friends). Raises whatever the resolver or TensorFlow raises.
    """
    factory = resolver_factory or tf.distribute.cluster_resolver.TPUClusterResolver
    with _socket_timeout(timeout_s):
        resolver = factory(tpu=tpu)
        if tpu != "local":
            _probe_grpc(resolver.master(), timeout_s)
    try:
        tf.config.experimental_connect_to_cluster(resolver)
    except Exception:
        if tpu != "local":
            _reset_runtime()  # a failed remote connection leaves TensorFlow unusable for local devices
        raise
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def fallback_strategy(notes: list[str] | None = None) -> StrategyChoice:
    """MirroredStrategy over every GPU, else the default strategy (one CPU replica)."""
    notes = list(notes or [])
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        strategy = tf.distribute.MirroredStrategy([gpu.name for gpu in gpus])
        return StrategyChoice(strategy, "gpu", f"MirroredStrategy on {len(gpus)} GPU(s)", notes)
    return StrategyChoice(tf.distribute.get_strategy(), "cpu", "default strategy on the CPU", notes)


def select_strategy(tpu: str | None = None, *, environ=None, device_paths: list[str] | None = None,
                    resolver_factory: Callable | None = None) -> StrategyChoice:
    """The strategy for `--tpu` (a name, 'local', or None to auto-detect).

    Raises:
        UserError: when the TPU named by --tpu cannot be connected. Without
            --tpu a TPU that cannot be connected only adds a note and falls back.
    """
    if tpu:
        try:
            strategy = connect_tpu(tpu, resolver_factory)
        except Exception as e:  # the resolver and TensorFlow raise many unrelated types
            hint = ("is this a TPU VM? " if tpu == "local" else
                    "on a TPU VM pass --tpu=local, otherwise check the TPU name and zone; ")
            raise UserError(f"could not connect to the TPU {tpu!r} ({_first_line(e)}); {hint}"
                            "leave --tpu out to use the GPUs or the CPU") from None
        return StrategyChoice(strategy, "tpu", f"TPUStrategy on {tpu} ({strategy.num_replicas_in_sync} cores)")

    detected = detect_tpu(environ, device_paths)
    if detected is None:
        return fallback_strategy()
    tpu_arg, reason = detected
    try:
        strategy = connect_tpu(tpu_arg, resolver_factory)
    except Exception as e:  # any failure means: no usable TPU here
        return fallback_strategy([f"found {reason} but no usable TPU ({_first_line(e)}); falling back"])
    name = tpu_arg or reason
    return StrategyChoice(strategy, "tpu", f"TPUStrategy on {name} ({strategy.num_replicas_in_sync} cores)",
                          [f"TPU detected from {reason}"])
