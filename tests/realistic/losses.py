"""A loss file with the bug users report most in hand-written losses: a mean over a count that can be 0."""

import tensorflow as tf


def large_target_mse(y_true, y_pred):
    """MSE over the rows whose target is above 5, divided by how many there are: 0 / 0 when none is."""
    mask = tf.cast(y_true > 5.0, y_pred.dtype)
    return tf.reduce_sum(mask * tf.square(y_true - y_pred)) / tf.reduce_sum(mask)
