"""Models for mixed-precision tests (built under the spec's dtype policy)."""

import keras
from keras import ops


class SqrtAtZero(keras.layers.Layer):
    """sqrt of a zero activation: finite output, infinite gradient at every loss scale."""

    def call(self, x):
        return ops.sqrt(ops.relu(x))


def mlp(features=4):
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(8, activation="relu", name="hidden"),
                             keras.layers.Dense(1, name="out", dtype="float32")])


def infinite_gradient(features=4):
    return keras.Sequential([keras.Input((features,)),
                             keras.layers.Dense(3, kernel_initializer="zeros", bias_initializer="zeros", name="hidden"),
                             SqrtAtZero(name="sqrt"), keras.layers.Dense(1, name="out", dtype="float32")])


def float16_layers(features=4):
    """float16 layers built without the mixed-precision policy: nothing scales the loss."""
    return keras.Sequential([keras.Input((features,)),
                             keras.layers.Dense(8, activation="relu", name="hidden", dtype="mixed_float16"),
                             keras.layers.Dense(1, name="out", dtype="float32")])
