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
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import CLOCKS, cnn, fit_timer, median, median_ratio, mlp

from nanscope.runtime import tensorflow

tf, keras = tensorflow()


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
            runs[variant], params = fit_timer(build, args.steps, arguments, args.clock)
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
