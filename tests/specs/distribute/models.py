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
