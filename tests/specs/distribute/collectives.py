"""The cross-replica collectives fit's step launches under MirroredStrategy, without and with NanScope; prints JSON.

Counts the calls of `tf.distribute.ReplicaContext.all_reduce` and `all_gather` (each goes on to
the real one) while each fit traces its step, per way to compile (argv[1:], default `plain`):
`plain` (Adam), `clipnorm` (Adam with clipnorm=1: the optimizer sums the clipped gradients, not
the ones the statistics are of); `fit-guard`: `plain` with the callback's guard (skip, a ring every step);
`trace`: trace-steps under `distribute: mirrored` (tests/specs/healthy.yaml,
2 steps), whose step is nanscope's own; and `trace-guard`: the same under the guard (skip, a ring every step) on
nan-second-half.yaml, whose step 1 is non-finite: the state kept before every step, the verdicts' re-runs and
the skip. Run with NANSCOPE_CPU_REPLICAS=2.
"""

import collections
import functools
import json
import sys

import numpy as np
from rich.console import Console

from nanscope.keras import NanScope
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
calls = collections.Counter()


def counted(name):
    method = getattr(tf.distribute.ReplicaContext, name)

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        calls[name] += 1
        return method(self, *args, **kwargs)

    return call


for method in ("all_reduce", "all_gather"):
    setattr(tf.distribute.ReplicaContext, method, counted(method))

strategy = tf.distribute.MirroredStrategy(devices=[d.name for d in tf.config.list_logical_devices("CPU")])
x = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)


def launched(optimizer, nanscope, **guard):
    """The collectives one trace of fit's step launches, per method (`optimizer`: a function that makes one;
    `guard`: the callback's guard arguments)."""
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer=optimizer(), loss="mse")
    callbacks = [NanScope(console=Console(quiet=True), verbose=0, **guard)] if nanscope else []
    calls.clear()
    model.fit(x, y, batch_size=16, epochs=1, steps_per_epoch=2, callbacks=callbacks, verbose=0)
    if nanscope:
        assert callbacks[0].report.steps_run == 2, callbacks[0].report.notes
    return dict(calls)


def traced():
    """The collectives trace-steps' step launches (its traces, every replica's)."""
    from pathlib import Path

    import yaml

    from nanscope.spec.options import TraceOptions

    from nanscope.run.trace import run_trace
    from nanscope.spec.load import parse_spec

    path = Path(__file__).resolve().parent.parent / "healthy.yaml"
    document = yaml.safe_load(path.read_text())
    document["train"].update(steps=2, distribute="mirrored")
    calls.clear()
    report = run_trace(parse_spec(document, source=str(path)), TraceOptions())
    assert report.steps_run == 2
    return dict(calls)


def guarded():
    """The collectives trace-steps' step launches under the guard, with its verdicts and a skip."""
    from pathlib import Path

    import yaml

    from nanscope.guard import GuardOptions
    from nanscope.run.trace import run_trace
    from nanscope.spec.load import parse_spec
    from nanscope.spec.options import TraceOptions

    path = Path(__file__).resolve().parent / "nan-second-half.yaml"
    document = yaml.safe_load(path.read_text())
    document["train"]["optimizer"] = {"name": "adam", "learning_rate": 0.001}
    calls.clear()
    report = run_trace(parse_spec(document, source=str(path)),
                       TraceOptions(keep_going=True, guard=GuardOptions(on_nonfinite="skip", snapshot_every=1)))
    assert report.steps_run == 4 and report.first_nonfinite.origin == "batch", report.notes
    assert [i["action"] for i in report.interventions] == ["skip"]
    return dict(calls)


def fit_guarded():
    """The collectives fit's step launches with the callback's guard: each replica's state copied before each step."""
    return launched(optimizers["plain"], True, on_nonfinite="skip", snapshot_every=1)


WAYS = {"trace": traced, "trace-guard": guarded, "fit-guard": fit_guarded}
optimizers = {"plain": lambda: keras.optimizers.Adam(1e-3),
              "clipnorm": lambda: keras.optimizers.Adam(1e-3, clipnorm=1.0)}
ways = sys.argv[1:] or ["plain"]
launches = {way: WAYS[way]() if way in WAYS else {"without": launched(optimizers[way], False),
                                                  "with": launched(optimizers[way], True)} for way in ways}
print(json.dumps(launches))
