"""A model whose forward pass takes the log of zero: NaN/Inf before any gradient exists."""

import keras


class Log(keras.layers.Layer):
    """y = log(x), unguarded: the bug clipping cannot fix."""

    def call(self, x):
        return keras.ops.log(x)


def log_of_zero_mlp(features=4):
    """Dense(relu, zero kernel and bias) -> Log -> Dense: the Log sees exact zeros on the first step."""
    return keras.Sequential([
        keras.Input(shape=(features,)),
        keras.layers.Dense(4, activation="relu", kernel_initializer="zeros", bias_initializer="zeros"),
        Log(),
        keras.layers.Dense(1),
    ])
