"""Tiny models and data for the tf.distribute tests: a healthy regression, NaN rows in one replica's half."""

import keras
import numpy as np

FEATURES = 4


def mlp():
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])


def regression(rows=64):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, FEATURES)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) * 0.1).astype("float32")


def nan_in_second_half(rows=64, batch=16, bad_row=12):
    """NaN in feature 1 of row `bad_row` of step 1's batch: with 2 replicas, only replica 1 sees it."""
    x, y = regression(rows)
    x[batch + bad_row, 1] = np.nan
    return x, y


def nan_at(rows=64, row=60):
    """NaN in feature 1 of dataset row `row` (default: row 12 of step 3's batch of 16, replica 1's half)."""
    x, y = regression(rows)
    x[row, 1] = np.nan
    return x, y


def steep(rows=64, scale=30.0):
    """The regression with targets `scale` times larger: SGD at a high learning rate diverges on it."""
    x, y = regression(rows)
    return x, y * scale


FAULT = "NANSCOPE_TEST_FAULT"  # set: the next call of the flaky layer on that replica returns NaN


class FlakyOnce(keras.layers.Layer):
    """Returns NaN on the one call after os.environ[FAULT] is set to its replica's id (a transient fault there),
    else its input. Read through `tf.py_function`, so the compiled step decides at run time."""

    def call(self, x):
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        replica = tf.get_static_value(context.replica_id_in_sync_group) if context is not None else None
        if replica is None:
            return x
        fired = tf.py_function(lambda: _fire(int(replica)), [], tf.bool)
        fired.set_shape([])
        return tf.where(fired, tf.fill(tf.shape(x), float("nan")), x)


def _fire(replica):
    import os

    if os.environ.get(FAULT) != str(replica):
        return False
    del os.environ[FAULT]
    return True


def flaky_mlp():
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="relu"),
                             FlakyOnce(name="flaky"), keras.layers.Dense(1)])
