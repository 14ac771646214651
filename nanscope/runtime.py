"""Import TensorFlow and Keras quietly, only when a command needs them.

`nanscope --help` must stay fast, so nothing at module level imports TensorFlow;
commands call `tensorflow()` inside the function that needs it.
"""

import logging
import os
import warnings


def tensorflow():
    """Return (tf, keras) with TensorFlow's C++ and Python log noise turned down."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    warnings.filterwarnings("ignore", module=r"(tensorflow|keras)")
    import tensorflow as tf
    import keras

    tf.get_logger().setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)
    return tf, keras
