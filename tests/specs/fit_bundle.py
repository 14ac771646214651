"""A user's own code for `NanScope(repro=DIR)` bundles: a loss in a file, a subclassed model, one Keras cannot save.

The producing line is tagged `# producer: <tag>`.
"""

import keras
import tensorflow as tf


def root_loss(y, p):
    """Mean square root of the residual: NaN wherever the prediction is below the target."""
    return tf.reduce_mean(tf.sqrt(p - y))  # producer: sqrt


class TwoLayer(keras.Model):
    """A subclassed model that Keras can save (it has a `get_config`)."""

    def __init__(self, width=8, **kwargs):
        super().__init__(**kwargs)
        self.width = width
        self.hidden = keras.layers.Dense(width, activation="relu", name="hidden")
        self.out = keras.layers.Dense(1, name="out")

    def call(self, x):
        return self.out(self.hidden(x))

    def get_config(self):
        return {**super().get_config(), "width": self.width}


class Unsaveable(keras.Model):
    """A subclassed model whose `__init__` takes an argument it does not put in a config: Keras cannot save it."""

    def __init__(self, width):
        super().__init__()
        self.out = keras.layers.Dense(width, name="out")

    def call(self, x):
        return self.out(x)


class Exp(keras.layers.Layer):
    """exp of its input, in the layer's compute dtype (float16 under mixed_float16)."""

    def call(self, x):
        return tf.exp(x)  # producer: exp
