"""Cost of the guard: `NanScope(mode="sentinel")` and the default full mode against a plain `fit`, interleaved.

Each round runs, for each variant, a 2-epoch `fit` (verbose=0) of the same model on the
same data and times the second epoch (the first one traces the step), by this process's
CPU time by default (a machine shared with other work disturbs it less than the wall
clock). The ratios are medians over rounds of (variant) / (plain) in the same round.
Variants: plain `fit`; `NanScope()` (full mode, forensics on); `NanScope(mode="sentinel")`
(forensics on: the state before each step is still copied on the device); and, to show
what that copy costs, sentinel with `forensics=False` (no copy: no skip, rollback,
replay or verdict).

Models: the bench MLP, CNN and LSTM (as in callback_overhead.py and trace_overhead.py)
and a 12-block transformer encoder (d_model 160, 4 heads, feed-forward 320, 32 tokens,
about 2.5M parameters).

    .venv/bin/python bench/guard_overhead.py [--rounds 5] [--steps 100] [--models mlp,cnn,lstm,transformer]
"""

import argparse
import io
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from _common import CLOCKS, median, median_ratio
from rich.console import Console

from nanscope.keras import NanScope
from nanscope.runtime import tensorflow

tf, keras = tensorflow()


def mlp():
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                             keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)]), (784,), 128


def cnn():
    return keras.Sequential([
        keras.Input((28, 28, 1)), keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(), keras.layers.Flatten(),
        keras.layers.Dense(10),
    ]), (28, 28, 1), 64


def lstm():
    return keras.Sequential([keras.Input((50, 16)), keras.layers.LSTM(64), keras.layers.Dense(10)]), (50, 16), 64


def transformer(blocks=12, width=160, heads=4, hidden=320, tokens=32, features=16):
    inputs = keras.Input((tokens, features))
    h = keras.layers.Dense(width)(inputs)
    for _ in range(blocks):
        attended = keras.layers.MultiHeadAttention(heads, width // heads)(h, h)
        h = keras.layers.LayerNormalization()(h + attended)
        fed = keras.layers.Dense(width)(keras.layers.Dense(hidden, activation="gelu")(h))
        h = keras.layers.LayerNormalization()(h + fed)
    outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model(inputs, outputs), (tokens, features), 32


CASES = {"mlp": ("MLP 784-256-256-10", mlp), "cnn": ("CNN conv32-conv64-pool-dense", cnn),
         "lstm": ("LSTM(64) 50x16", lstm), "transformer": ("Transformer encoder, 12 blocks", transformer)}
VARIANTS = {"plain": None, "full": {}, "sentinel": {"mode": "sentinel"},
            "sentinel, no state": {"mode": "sentinel", "forensics": False}}


class EpochTimes(keras.callbacks.Callback):
    """Seconds of each epoch of one fit call, by `clock`."""

    def __init__(self, clock):
        super().__init__()
        self.seconds, self.now = [], CLOCKS[clock]

    def on_epoch_begin(self, epoch, logs=None):
        self._start = self.now()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(self.now() - self._start)


def fit_variant(build, steps, arguments, clock):
    """callable() -> ms of the second epoch of a 2-epoch fit, with NanScope(**arguments) (None: without)."""
    keras.utils.set_random_seed(0)
    model, shape, batch = build()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * batch, *shape)).astype(np.float32)
    y = rng.integers(0, 10, steps * batch).astype(np.int32)
    quiet = Console(file=io.StringIO())

    def run():
        timer = EpochTimes(clock)
        callbacks = [timer] + ([NanScope(console=quiet, verbose=0, **arguments)] if arguments is not None else [])
        model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        return 1000.0 * timer.seconds[-1]

    return run, model.count_params()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100, help="batches per timed epoch (default 100)")
    parser.add_argument("--models", default="mlp,cnn,lstm,transformer")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    args = parser.parse_args(argv)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.machine()}, {cpus} CPUs, load {load:.1f}; TensorFlow "
          f"{tf.__version__}, Keras {keras.__version__}; rounds={args.rounds} steps={args.steps} clock={args.clock}; "
          f"devices: {', '.join(d.device_type for d in tf.config.list_physical_devices())}")
    print("\n| model | params | plain ms/epoch | full / plain | sentinel / plain | sentinel without the state copy "
          "/ plain |")
    print("|---|---:|---:|---:|---:|---:|")
    for key in args.models.split(","):
        name, build = CASES[key.strip()]
        runs, params = {}, 0
        for variant, arguments in VARIANTS.items():
            runs[variant], params = fit_variant(build, args.steps, arguments, args.clock)
        for run in runs.values():  # warm up every variant
            run()
        times = {variant: [] for variant in runs}
        for _ in range(args.rounds):
            for variant, run in runs.items():
                times[variant].append(run())
        print(f"| {name} | {params / 1e6:.2f}M | {median(times['plain']):.0f} | "
              f"{median_ratio(times, 'full', 'plain'):.3f}x | {median_ratio(times, 'sentinel', 'plain'):.3f}x | "
              f"{median_ratio(times, 'sentinel, no state', 'plain'):.3f}x |", flush=True)


if __name__ == "__main__":
    main()
