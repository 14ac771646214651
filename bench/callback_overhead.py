"""Overhead of the NanScope callback in model.fit, and of nanscope.instrument on a custom step, interleaved rounds.

Each round runs a 2-epoch `fit` (verbose=0) for each variant on the same model and
data and times the second epoch, so the (re)tracing that every `fit` with NanScope
does in its first step is not counted; the ratio printed is the median over rounds
of (with callback) / (without). The callback runs with its defaults: forensics on
(the weights, the optimizer's slots and the batch copied on the device every step).

The second table times a custom `tf.function` train step (forward, loss, tape,
apply_gradients, the loss pulled to Python each step) against the same step under
`nanscope.instrument` (forensics on), `--steps` calls per round after warm-up.

`--clock cpu` times by this process's CPU time (all its threads) instead of the wall
clock: a busy machine disturbs it less, and it counts the work nanscope adds even where
`fit`'s threads would otherwise wait (a plain `fit` of the CNN on 2 cores can take longer
by the wall clock than one with the callback).

    .venv/bin/python bench/callback_overhead.py [--rounds 7] [--steps 100] [--clock wall|cpu]
"""

import argparse
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from _common import CLOCKS, cnn, fit_timer, median, median_ratio, mlp

from nanscope.runtime import tensorflow

tf, keras = tensorflow()


CASES = {"mlp": ("MLP 784-256-256-10", mlp), "cnn": ("CNN conv32-conv64-pool-dense", cnn)}


def step_variant(build, steps, instrumented, clock="wall"):
    """callable(i) -> ms of `steps` calls of a custom train step, with or without nanscope.instrument."""
    import nanscope

    keras.utils.set_random_seed(0)
    model, shape, batch = build()
    optimizer = keras.optimizers.Adam()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((batch, *shape)).astype(np.float32), rng.integers(0, 10, batch).astype(np.int32))
               for _ in range(4)]

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step = nanscope.instrument(model, optimizer, verbose=0)(train_step) if instrumented else train_step

    now = CLOCKS[clock]

    def run(i):
        start = now()
        for k in range(steps):
            float(step(*batches[k % len(batches)]))
        return 1000.0 * (now() - start)

    return run


def timed_rounds(variants, rounds):
    """Per variant, ms of the timed epoch in each round; every round runs every variant in turn."""
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            times[name].append(run(0))
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=100, help="batches per timed fit epoch (default 100)")
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall (default) or cpu: this process's CPU time, which a busy machine disturbs less")
    args = parser.parse_args(argv)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.machine()}, {cpus} CPUs; TensorFlow {tf.__version__}, "
          f"Keras {keras.__version__}; rounds={args.rounds} steps={args.steps} clock={args.clock}; devices: "
          f"{', '.join(d.device_type for d in tf.config.list_physical_devices())}")
    print("\n| model | fit ms/epoch | fit + NanScope ms/epoch | ratio (median of per-round ratios) |")
    print("|---|---:|---:|---:|")
    for key in args.models.split(","):
        name, build = CASES[key.strip()]
        variants = {"plain": fit_timer(build, args.steps, None, args.clock)[0],
                    "nanscope": fit_timer(build, args.steps, {}, args.clock)[0]}
        for run in variants.values():  # warm up both
            run(0)
        times = timed_rounds(variants, args.rounds)
        print(f"| {name} | {median(times['plain']):.0f} | {median(times['nanscope']):.0f} | "
              f"{median_ratio(times, 'nanscope', 'plain'):.2f}x |", flush=True)
    print(f"\n| model | step ms/{args.steps} steps | instrument ms/{args.steps} steps | ratio (median of per-round "
          "ratios) |")
    print("|---|---:|---:|---:|")
    for key in args.models.split(","):
        name, build = CASES[key.strip()]
        variants = {"plain": step_variant(build, args.steps, False, args.clock),
                    "instrument": step_variant(build, args.steps, True, args.clock)}
        for run in variants.values():  # warm up (and trace) both
            run(0)
        times = timed_rounds(variants, args.rounds)
        print(f"| {name} | {median(times['plain']):.0f} | {median(times['instrument']):.0f} | "
              f"{median_ratio(times, 'instrument', 'plain'):.2f}x |", flush=True)


if __name__ == "__main__":
    main()
