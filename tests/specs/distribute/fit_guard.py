"""The callback's guard in model.fit under MirroredStrategy: the fits tests/test_distribute.py checks.

Run with NANSCOPE_CPU_REPLICAS=2, through verdicts.py (its `fit-*` scenarios, FITS here), or on its own: argv[1:]
names the fits (default: all), and it prints one JSON object. Each fit trains the same seeded model on 64 rows in
batches of 16 (8 rows a replica), with shuffle=False, and gives its losses, metrics, weights and, under
nanscope, the callback's JSON report (written in the working folder):

- `fit-skip`: a NaN in row 28 (step 1 of every epoch, row 12 of 16: replica 1's half) under on_nonfinite="skip",
  beside `fit-clean`, the same fit without that step's 16 rows and without nanscope;
- `fit-verdicts`: a NaN in row 44 (step 2, replica 1's half) under the default stop mode with snapshot_every=1;
- `fit-rollback`: the NaN of `fit-skip` under on_nonfinite="rollback" with snapshot_every=1;
- `fit-plain` and `fit-default`: the healthy rows without nanscope and with the default callback.
"""

import functools
import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console

from nanscope.keras import NanScope
from nanscope.runtime import tensorflow

rng = np.random.default_rng(0)
X = rng.standard_normal((64, 4)).astype("float32")
Y = (X.sum(axis=1, keepdims=True) + 0.1 * rng.standard_normal((64, 1))).astype("float32")


@functools.cache
def mirrored():
    """The strategy over the logical CPUs, made once for every fit."""
    tf, _ = tensorflow()
    return tf.distribute.MirroredStrategy(devices=[d.name for d in tf.config.list_logical_devices("CPU")])


def fit(x, y, epochs=3, **options):
    _, keras = tensorflow()
    with mirrored().scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    name = options.pop("name", None)
    report = Path.cwd() / f"{name}.json"
    scope = NanScope(report=report, console=Console(quiet=True), **options) if name else None
    history = model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, callbacks=[scope] if scope else [],
                        verbose=0)
    weights = [w.tolist() for w in model.get_weights()]
    return {"loss": history.history["loss"], "mae": history.history["mae"], "weights": weights,
            "epochs": len(history.history["loss"]), "train_step_restored": "train_step" not in model.__dict__} | (
        {"report": json.loads(report.read_text())} if name else {})


def poisoned(row):
    x = X.copy()
    x[row, 1] = np.nan
    return x


KEEP = np.r_[0:16, 32:64]
FITS = {
    "fit-skip": lambda: fit(poisoned(28), Y, on_nonfinite="skip", name="skip"),
    "fit-clean": lambda: fit(X[KEEP], Y[KEEP]),
    "fit-verdicts": lambda: fit(poisoned(44), Y, epochs=1, snapshot_every=1, name="verdicts"),
    "fit-rollback": lambda: fit(poisoned(28), Y, epochs=2, on_nonfinite="rollback", snapshot_every=1,
                                name="rollback"),
    "fit-plain": lambda: fit(X, Y),
    "fit-default": lambda: fit(X, Y, name="default"),
}

if __name__ == "__main__":
    print(json.dumps({name: FITS[name]() for name in sys.argv[1:] or FITS}))
