"""The tf.where gradient trap: a branch whose forward value tf.where throws away still gets a gradient.

`tf.where(count > 0, total / count, 0.0)` is finite forward, but for count == 0 the
gradient of the untaken `total / count` is 0 * inf = NaN. The op whose gradient turns
NaN is tagged `# producer: <variant>`; the tf.where that discards it, `# where: <variant>`.
"""

import numpy as np
import keras
import tensorflow as tf

EMPTY_ROWS = (4, 11)


class PositiveMean(keras.layers.Layer):
    """Mean (or log of the sum) of the positive entries of each row, 0 for a row with none.

    Args:
        variant: str. "divide" (mean: total / count under a tf.where), "log" (log of the
            total, 0 where the tf.where does not take it), "double" (the fix: make the
            input safe inside the branch before dividing).
    """

    def __init__(self, variant="divide", **kwargs):
        super().__init__(**kwargs)
        self.variant = variant

    def call(self, h):
        positive = tf.cast(h > 0, h.dtype)
        total = tf.reduce_sum(h * positive, axis=-1, keepdims=True)
        count = tf.reduce_sum(positive, axis=-1, keepdims=True)
        if self.variant == "divide":
            mean = total / count  # producer: divide
            return tf.where(count > 0, mean, 0.0)  # where: divide
        if self.variant == "log":
            log_total = tf.math.log(total)  # producer: log
            return tf.where(total > 0, log_total, 0.0)  # where: log
        safe = tf.where(count > 0, count, 1.0)
        return tf.where(count > 0, total / safe, 0.0)


def trap_model(variant="divide", features=4):
    x = keras.Input((features,))
    h = keras.layers.Dense(6, name="hidden")(x)
    pooled = PositiveMean(variant, name="pool")(h)
    return keras.Model(x, keras.layers.Dense(1, name="head")(pooled))


def rows_with_empty_groups(rows=32, features=4):
    """Inputs whose EMPTY_ROWS are all zero: the hidden layer's bias (zero at start) makes no entry positive there."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((rows, features)).astype("float32")
    x[list(EMPTY_ROWS)] = 0.0
    return x, rng.standard_normal((rows, 1)).astype("float32")
