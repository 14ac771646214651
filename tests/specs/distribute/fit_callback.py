"""model.fit under MirroredStrategy with the NanScope callback: what the test checks.

Run with NANSCOPE_CPU_REPLICAS=2 so the strategy has two replicas on a CPU-only machine, through verdicts.py
(its `fit-callback` scenario) or on its own; prints one JSON object: the replicas, the steps recorded, whether
the model's train_step was put back, and the callback's JSON report (written in the working folder).
"""

import json
from pathlib import Path

import numpy as np
from rich.console import Console

from nanscope.keras import NanScope
from nanscope.runtime import tensorflow


def fit_callback():
    tf, keras = tensorflow()
    strategy = tf.distribute.MirroredStrategy(devices=[d.name for d in tf.config.list_logical_devices("CPU")])
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    x[16 + 12, 1] = np.nan  # step 1, row 12 of 16: replica 1's half
    report = Path.cwd() / "fit-callback.json"
    scope = NanScope(report=report, console=Console(quiet=True))
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, callbacks=[scope], verbose=0)
    return {
        "replicas": strategy.num_replicas_in_sync,
        "steps": [r.step for r in scope.report.records],
        "train_step_restored": "train_step" not in model.__dict__,
        "report": json.loads(report.read_text()),
    }


if __name__ == "__main__":
    print(json.dumps(fit_callback()))
