"""What the callback's guard costs per step in `model.fit` under MirroredStrategy (2 logical CPUs).

Fits the MLP 784-256-256-10 (batch 128, Adam, 20 random rows a class) three ways, in interleaved
rounds, each way a model of its own compiled under the strategy's scope:

- **plain**: `fit` without nanscope;
- **default**: with `NanScope()` (the default mode: under a strategy no state is kept);
- **skip**: with `NanScope(on_nonfinite="skip")`: each replica copies its weights, Adam's counter and
  slots, the metrics' totals and its share of the batch on its own device before each step.

A round fits each way for `--epochs` epochs of `--steps` steps and times each epoch after the first
(which traces the step) on the chosen clock; the medians are over every timed epoch of every round.

Usage:
    PYTHONPATH=. .venv/bin/python bench/mirrored_fit_guard.py [--rounds 3] [--epochs 4] [--steps 50] [--clock cpu]
"""

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("NANSCOPE_CPU_REPLICAS", "2")  # before nanscope starts TensorFlow
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import CLOCKS, median


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args()

    import numpy as np
    from rich.console import Console

    from nanscope.keras import NanScope
    from nanscope.runtime import tensorflow

    tf, keras = tensorflow()
    strategy = tf.distribute.MirroredStrategy(devices=[d.name for d in tf.config.list_logical_devices("CPU")])
    rng = np.random.default_rng(0)
    rows = 128 * args.steps
    x = rng.standard_normal((rows, 784)).astype("float32")
    y = rng.integers(0, 10, rows)
    clock = CLOCKS[args.clock]

    class EpochClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.started = clock()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(clock() - self.started)

    ways = {"plain": lambda: [], "default": lambda: [NanScope(verbose=0, console=Console(quiet=True))],
            "skip": lambda: [NanScope(verbose=0, console=Console(quiet=True), on_nonfinite="skip")]}
    times = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, callbacks in ways.items():
            with strategy.scope():
                keras.utils.set_random_seed(0)
                model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                                          keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
                model.compile(optimizer="adam",
                              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            timer = EpochClock()
            model.fit(x, y, batch_size=128, epochs=args.epochs, shuffle=False, verbose=0,
                      callbacks=[*callbacks(), timer])
            times[name].extend(1000 * s / args.steps for s in timer.seconds[1:])
    print(f"MLP 784-256-256-10, batch 128, Adam, fit under MirroredStrategy over {strategy.num_replicas_in_sync} "
          f"devices; {args.rounds} rounds x {args.epochs - 1} timed epochs x {args.steps} steps, {args.clock} clock")
    for name in ways:
        print(f"  {name:8s} {median(times[name]):8.3f} ms/step  ({median(times[name]) / median(times['plain']):.3f}x "
              "plain)")


if __name__ == "__main__":
    main()
