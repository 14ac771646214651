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


def sigmoid_classifier(features=4):
    """`mlp` with a sigmoid output, for a binary cross-entropy."""
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(8, activation="relu", name="hidden"),
                             keras.layers.Dense(1, activation="sigmoid", name="out", dtype="float32")])


def infinite_gradient(features=4):
    return keras.Sequential([keras.Input((features,)),
                             keras.layers.Dense(3, kernel_initializer="zeros", bias_initializer="zeros", name="hidden"),
                             SqrtAtZero(name="sqrt"), keras.layers.Dense(1, name="out", dtype="float32")])


def float16_layers(features=4):
    """float16 layers built without the mixed-precision policy: nothing scales the loss."""
    return keras.Sequential([keras.Input((features,)),
                             keras.layers.Dense(8, activation="relu", name="hidden", dtype="mixed_float16"),
                             keras.layers.Dense(1, name="out", dtype="float32")])


class Exp(keras.layers.Layer):
    """exp of its input, in the layer's compute dtype: float16 overflows above log(65504) ~ 11.09."""

    def call(self, x):
        return ops.exp(x)


def exp_late_overflow(features=4):
    """A float16 Exp whose inputs grow with the data: it overflows once a batch's pre-activations pass 11.09."""
    return keras.Sequential([
        keras.Input((features,)),
        keras.layers.Dense(2, kernel_initializer=keras.initializers.Constant(0.25), bias_initializer="zeros",
                           name="hidden"),
        Exp(name="exp"),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(0.5), name="out", dtype="float32")])


def float16_infinite_gradient(features=4):
    """`infinite_gradient` in float16 layers built without the mixed-precision policy: nothing scales the loss."""
    return keras.Sequential([keras.Input((features,)),
                             keras.layers.Dense(3, kernel_initializer="zeros", bias_initializer="zeros", name="hidden",
                                                dtype="mixed_float16"),
                             SqrtAtZero(name="sqrt", dtype="mixed_float16"),
                             keras.layers.Dense(1, name="out", dtype="float32")])


def raw_input_mlp(features=4, width=32):
    """float16 hidden layers and a float32 output layer. Fed raw inputs in the thousands, its float16 kernel
    gradients overflow at a loss scale of 1: the LossScaleOptimizer trains it at a scale below 1."""
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(width, activation="relu", name="hidden"),
                             keras.layers.Dense(width, activation="relu", name="hidden2"),
                             keras.layers.Dense(1, name="out", dtype="float32")])


class ExpRate(keras.layers.Layer):
    """A rate head, exp(x @ w + b), computed in the layer's dtype: in float16 it overflows once x @ w + b passes
    log(65504) ~ 11.09."""

    def build(self, shape):
        self.kernel = self.add_weight(shape=(shape[-1], 1), initializer="glorot_uniform", name="kernel")
        self.bias = self.add_weight(shape=(1,), initializer="zeros", name="bias")

    def call(self, x):
        return ops.exp(ops.matmul(x, self.kernel) + self.bias)


def exp_rate(features=4):
    """A regression on counts near e^11.5 whose float16 output layer is exp: training pushes its input past 11.09."""
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(16, activation="relu", name="hidden"),
                             ExpRate(name="rate")])
