"""Import TensorFlow and Keras quietly, only when a command needs them.

`nanscope --help` must stay fast, so nothing at module level imports TensorFlow;
commands call `tensorflow()` inside the function that needs it. TensorFlow's C++
start-up lines (oneDNN, CUDA probing, CPU features) are written to file
descriptor 2 before its log level is read, so the import and device start-up run
with descriptor 2 pointed at /dev/null; Python-level errors still propagate.
"""

import contextlib
import logging
import os
import sys
import warnings

_modules = None


def tensorflow():
    """Return (tf, keras), importing them quietly on first use."""
    global _modules
    if _modules is None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        warnings.filterwarnings("ignore", module=r"(tensorflow|keras)")
        quiet = os.environ.get("NANSCOPE_DEBUG") != "1"
        with _silenced_stderr_fd() if quiet else contextlib.nullcontext():
            import keras
            import tensorflow as tf

            tf.config.list_logical_devices()
        tf.get_logger().setLevel(logging.ERROR)
        logging.getLogger("absl").setLevel(logging.ERROR)
        _modules = (tf, keras)
    return _modules


@contextlib.contextmanager
def _silenced_stderr_fd():
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
