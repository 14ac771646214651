"""Purpose-built tiny models and data for the rule tests: one bug each, and healthy ones.

Each bug sits on a line tagged `# producer` so tests can assert the reported source line.
"""

import numpy as np
import keras
import tensorflow as tf


class ExpFeatures(keras.layers.Layer):
    """exp(x) of unbounded inputs: overflows float32 past 88.7."""

    def call(self, x):
        return tf.exp(x)  # producer: exp


class RatioFeatures(keras.layers.Layer):
    """x / x[:, :1] after a relu: the denominator is 0 wherever the relu is off."""

    def call(self, x):
        return x / x[:, :1]  # producer: div


class RootFeatures(keras.layers.Layer):
    """sqrt(relu(x)): finite forward, infinite gradient at 0."""

    def call(self, x):
        return tf.sqrt(x)  # producer: sqrt


def exp_model(features=4):
    return keras.Sequential([keras.Input((features,)),
                             keras.layers.Dense(4, kernel_initializer=keras.initializers.Constant(10.0)),
                             ExpFeatures(), keras.layers.Dense(1)])


def ratio_model(features=4):
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(4, activation="relu"), RatioFeatures(),
                             keras.layers.Dense(1)])


def root_model(features=4):
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(4, activation="relu"), RootFeatures(),
                             keras.layers.Dense(1)])


def softmax_model(features=4, classes=3):
    return keras.Sequential([keras.Input((features,)),
                             keras.layers.Dense(classes,
                                                kernel_initializer=keras.initializers.RandomNormal(stddev=100.0,
                                                                                                   seed=0)),
                             keras.layers.Softmax()])


def handwritten_crossentropy(y_true, y_pred):
    """-sum(y * log(p)) with no clipping: log(0) once the softmax saturates."""
    y_true = tf.one_hot(tf.cast(tf.reshape(y_true, [-1]), tf.int32), tf.shape(y_pred)[-1])
    return -tf.reduce_mean(tf.reduce_sum(y_true * tf.math.log(y_pred), axis=-1))  # producer: log


def mlp(features=4):
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])


def data_with_nan(rows=64, features=4):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, features)).astype("float32")
    x[5, 2] = np.nan
    return x, (x[:, :1] * 2.0).astype("float32")


def wide_data(rows=64, features=4, scale=3.0, classes=0):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((rows, features)) * scale).astype("float32")
    if classes:
        return x, rng.integers(0, classes, rows).astype("int64")
    return x, (x.sum(axis=1, keepdims=True) * 0.1).astype("float32")
