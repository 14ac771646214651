"""Import TensorFlow and Keras quietly, only when a command needs them.

`nanscope --help` must stay fast, so nothing at module level imports TensorFlow;
commands call `tensorflow()` inside the function that needs it. TensorFlow's C++
start-up lines (oneDNN, CUDA probing, CPU features) are written to file
descriptor 2 before its log level is read, so the import and device start-up run
with descriptor 2 pointed at /dev/null; Python-level errors still propagate.

`NANSCOPE_CPU_REPLICAS=N` splits the first CPU into N logical devices before
TensorFlow starts its devices, so `train.distribute: mirrored` can be tried, and
tested, on a machine without GPUs. It has to be set before the first `tensorflow()`
call of the process: logical devices cannot be changed once they are in use.
"""

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

# nanscope's own version (pyproject's), here at the bottom of the package so a module that records it (a fit
# bundle's `versions`) need not import the package root, which imports the Keras guest.
VERSION = "0.1.0"
_modules = None


def tensorflow(before_devices: Callable[[Any], object] | None = None) -> tuple[Any, Any]:
    """Return (tf, keras), importing them quietly on first use.

    Args:
        before_devices: callable(tf), optional. Run once TensorFlow is imported and before it
            starts its devices (MultiWorkerMirroredStrategy must be created then); its stderr
            is not silenced. Given after TensorFlow has started, it raises RuntimeError.
    """
    global _modules
    if _modules is not None and before_devices is not None:
        raise RuntimeError("TensorFlow has started its devices already")
    if _modules is None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        warnings.filterwarnings("ignore", module=r"(tensorflow|keras)")
        quiet = os.environ.get("NANSCOPE_DEBUG") != "1"
        with _silenced_stderr_fd() if quiet else contextlib.nullcontext():
            import keras
            import tensorflow as tf

            _split_cpu(tf, os.environ.get("NANSCOPE_CPU_REPLICAS"))
        if before_devices is not None:
            before_devices(tf)
        with _silenced_stderr_fd() if quiet else contextlib.nullcontext():
            tf.config.list_logical_devices()
        tf.get_logger().setLevel(logging.ERROR)
        logging.getLogger("absl").setLevel(logging.ERROR)
        _modules = (tf, keras)
    return _modules


@contextlib.contextmanager
def quiet_user_imports() -> Iterator[None]:
    """Run a block that may import TensorFlow the user's way (a factory module's `import keras`) quietly.

    TensorFlow writes its start-up lines when it is first imported, whoever imports it;
    a user's module that imports it before nanscope does would print them. Until
    TensorFlow is loaded, the block runs with descriptor 2 pointed at /dev/null (so a
    user's own stderr output while their module imports is lost too; their exceptions
    still propagate); if it loaded TensorFlow, `tensorflow()` then finishes the quiet
    set-up. `NANSCOPE_DEBUG=1` shows everything.
    """
    if _modules is not None or "tensorflow" in sys.modules or os.environ.get("NANSCOPE_DEBUG") == "1":
        yield
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with _silenced_stderr_fd():
        yield
    if "tensorflow" in sys.modules:
        tensorflow()


def _split_cpu(tf: Any, replicas: str | None) -> None:
    """Configure `replicas` logical CPU devices (a string from the environment; unset or "1": leave one)."""
    if not replicas:
        return
    try:
        count = int(replicas)
    except ValueError:
        raise ValueError(f"`NANSCOPE_CPU_REPLICAS` must be a whole number >= 1. Received: {replicas!r}") from None
    if count < 1:
        raise ValueError(f"`NANSCOPE_CPU_REPLICAS` must be a whole number >= 1. Received: {replicas!r}")
    if count > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)


@contextlib.contextmanager
def _silenced_stderr_fd() -> Iterator[None]:
    """Point file descriptor 2 at /dev/null for the block, restoring it afterwards."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
