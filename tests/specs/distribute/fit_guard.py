"""The callback's guard in model.fit under MirroredStrategy; prints what tests/test_distribute.py checks as JSON.

Run with NANSCOPE_CPU_REPLICAS=2. argv[1]: a folder for the JSON reports. Each fit trains the same seeded model
on 64 rows in batches of 16 (8 rows a replica), with shuffle=False:

- `skip`: a NaN in row 28 (step 1 of every epoch, row 12 of 16: replica 1's half) under on_nonfinite="skip",
  beside `clean`, the same fit without that step's 16 rows and without nanscope;
- `verdicts`: a NaN in row 44 (step 2, replica 1's half) under the default stop mode with snapshot_every=1;
- `rollback`: the NaN of `skip` under on_nonfinite="rollback" with snapshot_every=1;
- `plain` and `default`: the healthy rows without nanscope and with the default callback.
"""

import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console

from nanscope.keras import NanScope
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
strategy = tf.distribute.MirroredStrategy(devices=[d.name for d in tf.config.list_logical_devices("CPU")])
rng = np.random.default_rng(0)
X = rng.standard_normal((64, 4)).astype("float32")
Y = (X.sum(axis=1, keepdims=True) + 0.1 * rng.standard_normal((64, 1))).astype("float32")
folder = Path(sys.argv[1])


def fit(x, y, epochs=3, **options):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    name = options.pop("name", None)
    scope = NanScope(report=folder / f"{name}.json", console=Console(quiet=True), **options) if name else None
    history = model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, callbacks=[scope] if scope else [],
                        verbose=0)
    weights = [w.tolist() for w in model.get_weights()]
    return {"loss": history.history["loss"], "mae": history.history["mae"], "weights": weights,
            "epochs": len(history.history["loss"]), "train_step_restored": "train_step" not in model.__dict__}


def poisoned(row):
    x = X.copy()
    x[row, 1] = np.nan
    return x


keep = np.r_[0:16, 32:64]
print(json.dumps({
    "skip": fit(poisoned(28), Y, on_nonfinite="skip", name="skip"),
    "clean": fit(X[keep], Y[keep]),
    "verdicts": fit(poisoned(44), Y, epochs=1, snapshot_every=1, name="verdicts"),
    "rollback": fit(poisoned(28), Y, epochs=2, on_nonfinite="rollback", snapshot_every=1, name="rollback"),
    "plain": fit(X, Y),
    "default": fit(X, Y, name="default"),
}))
