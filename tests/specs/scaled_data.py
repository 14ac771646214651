"""Regression data whose inputs and targets each have their own scale, and a small MLP for it."""

import numpy as np

from nanscope.runtime import tensorflow

tf, keras = tensorflow()


def arrays(rows=256, features=8, x_scale=1.0, y_scale=1.0, y_shift=0.0, seed=0, glitch_rows=(), glitch=9999.0):
    """x ~ N(0, x_scale^2); y a linear function of the standardised x with std ~y_scale, shifted by y_shift;
    the targets of `glitch_rows` hold the missing-value code `glitch`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, features))
    w = rng.standard_normal((features, 1)) / np.sqrt(features)
    y = x @ w + 0.1 * rng.standard_normal((rows, 1))
    y = y_shift + y_scale * y
    y[list(glitch_rows)] = glitch
    return (x_scale * x).astype(np.float32), y.astype(np.float32)


def mlp(features=8, units=16):
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(units, activation="relu"),
                             keras.layers.Dense(units, activation="relu"), keras.layers.Dense(1)])
