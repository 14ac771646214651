"""Tiny model and data for the multi-worker tests: a healthy regression, and NaN in a row that worker 1 trains on."""

import keras
import numpy as np

FEATURES = 4


def mlp():
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])


def regression(rows=64):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, FEATURES)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) * 0.1).astype("float32")


def nan_on_worker_1(rows=64, batch=16, bad_row=13):
    """NaN in feature 2 of dataset row 16 + 13 = 29 (step 1's batch, row 13: worker 1 of 2 takes rows 8-15)."""
    x, y = regression(rows)
    x[batch + bad_row, 2] = np.nan
    return x, y
