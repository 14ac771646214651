"""Timing helpers shared by the benchmarks: interleaved rounds, medians of ratios.

Timing variants one after another lets a drift in the machine (another process,
CPU frequency, a warm cache) land on one variant only. Interleaving them (every
round times each variant in turn) and taking the median of per-round ratios
against a baseline keeps such drift out of the ratio.
"""

import statistics
import time


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def seconds_per_call(fn, calls, clock="wall"):
    """Mean seconds of `fn(i)` over `calls` calls, i = 0 .. calls-1.

    `clock` is "wall" (elapsed time) or "cpu" (CPU time of this process, all its
    threads): on a machine shared with other work the CPU time moves less.
    """
    now = CLOCKS[clock]
    start = now()
    for i in range(calls):
        fn(i)
    return (now() - start) / calls


def interleaved_rounds(variants, rounds, calls, clock="wall"):
    """Per variant, the ms per call of each round; every round times every variant in turn.

    Args:
        variants: dict of name -> callable(i). One call is one unit of work (a train step).
        rounds: int. Rounds; the variants run in the same order in each.
        calls: int. Calls per variant per round.
        clock: str, default "wall". "wall" or "cpu", see `seconds_per_call`.

    Returns:
        dict of name -> list of float, ms per call, one entry per round.
    """
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            times[name].append(1000.0 * seconds_per_call(fn, calls, clock))
    return times


def median_ratio(times, name, baseline):
    """Median over rounds of times[name][r] / times[baseline][r]."""
    return statistics.median(a / b for a, b in zip(times[name], times[baseline]))


def median(values):
    """The median of a non-empty sequence of numbers."""
    return statistics.median(values)


def wall_seconds(fn, clock="wall"):
    """(seconds, result) of one call of `fn()`, by the wall or the CPU clock (see `seconds_per_call`)."""
    now = CLOCKS[clock]
    start = now()
    result = fn()
    return now() - start, result


# The bench models of the fit benchmarks (callback_overhead.py, guard_overhead.py): each builder returns
# (model, one row's input shape, batch size). Keras is imported when one is built, not with this module.
def mlp():
    """MLP 784-256-256-10, batch 128."""
    keras = _keras()
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                             keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)]), (784,), 128


def cnn():
    """CNN conv32-conv64-pool-dense10 on 28x28x1, batch 64."""
    keras = _keras()
    return keras.Sequential([
        keras.Input((28, 28, 1)), keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(), keras.layers.Flatten(),
        keras.layers.Dense(10),
    ]), (28, 28, 1), 64


def fit_timer(build, steps, scope_arguments, clock="wall"):
    """(callable(*ignored) -> ms of the second epoch of a 2-epoch fit, the model's parameter count).

    The model from `build()` is compiled with Adam and sparse cross-entropy from logits and trained on random
    data (`steps` batches an epoch, seeded), with `NanScope(**scope_arguments)` (quiet) or, for None, without
    it. The first epoch traces the step (NanScope's too) and is not timed; the second is, by `clock`.
    """
    import io

    import numpy as np
    from rich.console import Console

    from nanscope.keras import NanScope

    keras = _keras()
    keras.utils.set_random_seed(0)
    model, shape, batch = build()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * batch, *shape)).astype(np.float32)
    y = rng.integers(0, 10, steps * batch).astype(np.int32)
    quiet = Console(file=io.StringIO())

    def run(*_):
        timer = _epoch_times(keras, clock)
        scope = [NanScope(console=quiet, verbose=0, **scope_arguments)] if scope_arguments is not None else []
        model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=[timer, *scope])
        return 1000.0 * timer.seconds[-1]

    return run, model.count_params()


def _keras():
    from nanscope.runtime import tensorflow

    return tensorflow()[1]


def _epoch_times(keras, clock):
    """A callback that keeps the seconds of each epoch of one fit, by `clock` (wall or cpu)."""

    class EpochTimes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds, self.now = [], CLOCKS[clock]

        def on_epoch_begin(self, epoch, logs=None):
            self._start = self.now()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(self.now() - self._start)

    return EpochTimes()
