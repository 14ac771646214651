"""Ops outside every layer: a producer inside the loss, for a Keras loss and a `file.py:function` loss.

The loss's producing line is tagged `# producer: <tag>`.
"""

import numpy as np
import keras
import tensorflow as tf

ZERO_ROWS = (2, 9)


def projection(features=4, width=3, scale=None):
    """One Dense projection with no bias: a row of zero inputs projects to exactly 0."""
    init = keras.initializers.Constant(scale) if scale is not None else "glorot_uniform"
    return keras.Sequential([keras.Input((features,)),
                             keras.layers.Dense(width, use_bias=False, kernel_initializer=init, name="projection")])


def distance_loss(y_true, y_pred):
    """Mean Euclidean distance: tf.norm is finite at 0 but its gradient there is 0/0."""
    return tf.reduce_mean(tf.norm(y_pred - y_true, axis=-1))  # producer: norm


def matched_rows(rows=32, features=4, width=3):
    """Inputs and targets whose ZERO_ROWS are all zero: the projection hits those targets exactly."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((rows, features)).astype("float32")
    y = rng.standard_normal((rows, width)).astype("float32")
    x[list(ZERO_ROWS)] = 0.0
    y[list(ZERO_ROWS)] = 0.0
    return x, y
