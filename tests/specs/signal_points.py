"""Factories that tell a test where a run is, so a signal lands at a known point instead of after a sleep.

`blocking_arrays` writes a marker while the data loads (start-up) and waits there;
`gated_model` writes a marker at its `at`-th training call and holds that step until
the test writes the release file, so the signal arrives during that very step.
"""

import time
from pathlib import Path

import keras
import numpy as np

WAIT_LIMIT = 120.0


def _wait_for(path):
    deadline = time.monotonic() + WAIT_LIMIT
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def blocking_arrays(marker, rows=64, features=4):
    """Write `marker`, then wait (up to WAIT_LIMIT s) as if the data took long to load; then return (x, y)."""
    Path(marker).write_text("loading data\n")
    deadline = time.monotonic() + WAIT_LIMIT
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return arrays(rows, features)


def arrays(rows=64, features=4):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, features)).astype(np.float32)
    return x, x[:, :1] * 2.0


class Gate(keras.layers.Layer):
    """Counts training calls (Python, inside the step); at call `at` writes `marker` and waits for `release`."""

    def __init__(self, marker, release, at, **kwargs):
        super().__init__(**kwargs)
        self.marker, self.release, self.at, self.calls = marker, release, at, 0

    def call(self, x, training=False):
        import tensorflow as tf

        if not training:
            return x

        def body(t):
            self.calls += 1
            if self.calls == self.at:
                Path(self.marker).write_text(f"training call {self.calls}\n")
                _wait_for(self.release)
            return t

        out = tf.py_function(body, [x], x.dtype)
        out.set_shape(x.shape)
        return out


def gated_model(marker, release, at, features=4):
    """Dense(3, relu) -> Dense(1) behind a Gate."""
    return keras.Sequential([keras.Input((features,)), Gate(marker, release, at, name="gate"),
                             keras.layers.Dense(3, activation="relu", name="hidden"),
                             keras.layers.Dense(1, name="out")])
