"""How much nanscope's instrumented train step costs against a plain one, and end to end against fit.

Part 1, per step. For an MLP, a small CNN and an LSTM, three variants of one train
step, each on a fresh model and optimizer built from the same seed, jit_compile=False:

  plain          a tf.function: forward, loss, tape.gradient, apply_gradients; returns the loss
  instrumented   nanscope's InstrumentedStep.run, pulling its small stats tensors to numpy
  check_numerics the plain step traced under tf.debugging.enable_check_numerics()

Every round times `--steps` steps of each variant in turn; the table shows the median
ms/step over rounds and the median of the per-round ratios against plain.

Part 2, end to end. `nanscope trace-steps SPEC --keep-going` against `model.fit` on the
same model, data and optimizer for the same number of steps (batch 32).

Usage:
    .venv/bin/python bench/trace_overhead.py            # defaults: --rounds 7 --steps 20
    .venv/bin/python bench/trace_overhead.py --rounds 9 --steps 40 --skip-e2e
"""

import argparse
import importlib.util
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nanscope.runtime import tensorflow

tf, keras = tensorflow()

from _common import interleaved_rounds, median, median_ratio, wall_seconds  # noqa: E402

from nanscope.engine.step import InstrumentedStep  # noqa: E402
from nanscope.models import _keras  # noqa: E402
from nanscope.objectives import Loss  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SEED = 1234
BATCHES = 4  # distinct random batches, cycled, so no step sees a cached input


@dataclass
class ModelCase:
    """One model of the per-step benchmark: how to build it and its random data."""

    name: str
    build: object  # callable() -> keras.Model
    x_shape: tuple  # per row
    batch: int
    classes: int = 10


def mlp():
    return keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])


def cnn():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ])


def lstm():
    return keras.Sequential([
        keras.Input((50, 16)),
        keras.layers.LSTM(64),
        keras.layers.Dense(10, activation="softmax"),
    ])


CASES = (
    ModelCase("MLP 784-256-256-10", mlp, (784,), 128),
    ModelCase("CNN conv32-conv64-pool-dense", cnn, (28, 28, 1), 64),
    ModelCase("LSTM(64) 50x16", lstm, (50, 16), 64),
)


def random_batches(case):
    rng = np.random.default_rng(SEED)
    return [
        (rng.standard_normal((case.batch, *case.x_shape)).astype(np.float32),
         rng.integers(0, case.classes, case.batch).astype(np.int32))
        for _ in range(BATCHES)
    ]


def fresh_model_and_optimizer(case):
    """The same initial weights every time: the seed is set right before building."""
    keras.utils.set_random_seed(SEED)
    model = case.build()
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    return model, optimizer


def plain_step(model, optimizer, loss_fn, x, y):
    """The baseline: a compiled forward, loss, backward and update that returns the loss."""
    specs = [tf.TensorSpec([None, *x.shape[1:]], x.dtype), tf.TensorSpec([None, *y.shape[1:]], y.dtype)]

    @tf.function(input_signature=specs, jit_compile=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step.get_concrete_function()


def stepper(fn, batches):
    """callable(i) running one step on batch i (cycled); the loss is pulled to Python every call."""
    def call(i):
        x, y = batches[i % len(batches)]
        return fn(x, y)
    return call


def plain_variant(case, batches, loss_fn):
    model, optimizer = fresh_model_and_optimizer(case)
    step = plain_step(model, optimizer, loss_fn, *batches[0])
    return stepper(lambda x, y: float(step(x, y)), batches)


def instrumented_variant(case, batches, loss_fn):
    model, optimizer = fresh_model_and_optimizer(case)
    x, y = batches[0]
    step = InstrumentedStep(_keras(model, case.name), Loss(loss_fn, "scce"), optimizer, x, y, jit_compile=False)
    return stepper(lambda x, y: step.run(0, x, y), batches)


def check_numerics_variant(case, batches, loss_fn):
    """The plain step traced with check_numerics on; the checks stay in the traced graph after disabling."""
    model, optimizer = fresh_model_and_optimizer(case)
    tf.debugging.enable_check_numerics()
    try:
        step = plain_step(model, optimizer, loss_fn, *batches[0])
    finally:
        tf.debugging.disable_check_numerics()
    assert_raises_on_nan(step, model.variables + optimizer.variables, batches[0])
    return stepper(lambda x, y: float(step(x, y)), batches)


def assert_raises_on_nan(step, state, batch):
    """Prove the traced step really checks: a NaN input must raise.

    The checks run beside the update, not before it, so the update of the failing
    call may still land: the state is put back as it was afterwards.
    """
    x, y = batch
    bad = x.copy()
    bad.flat[0] = np.nan
    saved = [v.numpy() for v in state]
    try:
        step(bad, y)
    except tf.errors.InvalidArgumentError:
        pass
    else:
        raise RuntimeError("check_numerics is not active in the traced step: a NaN input did not raise")
    finally:
        for variable, value in zip(state, saved):
            variable.assign(value)


VARIANTS = {"plain": plain_variant, "instrumented": instrumented_variant, "check_numerics": check_numerics_variant}


def bench_case(case, rounds, steps, warmup):
    """Per variant, ms/step per round, all variants interleaved."""
    batches = random_batches(case)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    runs = {name: make(case, batches, loss_fn) for name, make in VARIANTS.items()}
    for fn in runs.values():
        for i in range(warmup):
            fn(i)
    return interleaved_rounds(runs, rounds, steps)


# --- end to end -------------------------------------------------------------------------


def run_trace_available():
    """True when the in-process `nanscope.trace.run_trace` library function exists."""
    if importlib.util.find_spec("nanscope.trace") is None:
        return False
    from nanscope import trace

    return hasattr(trace, "run_trace") and hasattr(trace, "TraceOptions")


def nanscope_seconds(config):
    """(seconds, how) of one nanscope trace-steps run with --keep-going."""
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "trace.jsonl"
        if run_trace_available():
            from nanscope.spec import load_spec
            from nanscope.trace import TraceOptions, run_trace

            seconds, _ = wall_seconds(
                lambda: run_trace(load_spec(config), TraceOptions(keep_going=True, trace_path=trace_path))
            )
            return seconds, "in-process run_trace: spec, data, model build, trace, all steps, report"
        command = [str(REPO / ".venv/bin/nanscope"), "trace-steps", str(config), "--keep-going", "--trace", str(trace_path)]
        seconds, done = wall_seconds(lambda: subprocess.run(command, capture_output=True, text=True, cwd=REPO))
        if done.returncode not in (0, 1):
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
        return seconds, "CLI subprocess: Python + TensorFlow start-up included, nothing subtracted"


def fit_seconds(config):
    """Seconds of compile + model.fit (first trace included) for the spec's steps, batch 32.

    Model and data construction are not timed. The dataset repeats, so steps_per_epoch
    can be any divisor of the spec's steps; epochs * steps_per_epoch == train.steps.
    """
    from nanscope.objectives import build_optimizer
    from nanscope.session import open_session
    from nanscope.spec import load_spec

    spec = load_spec(config)
    session = open_session(spec)
    model, total = session.model.keras_model, spec.train.steps
    per_epoch = max(d for d in range(1, session.order.steps_per_epoch + 1) if total % d == 0)
    data = (
        tf.data.Dataset.from_tensor_slices((session.train.x, session.train.y))
        .shuffle(session.train.rows, seed=spec.train.seed).repeat().batch(32)
    )

    def train():
        model.compile(optimizer=build_optimizer(spec, session.model), loss=session.loss.fn)
        model.fit(data, epochs=total // per_epoch, steps_per_epoch=per_epoch, verbose=0)

    seconds, _ = wall_seconds(train)
    return seconds, total, per_epoch


def startup_seconds():
    """Seconds to start Python and import nanscope + TensorFlow, for reading the CLI timing."""
    command = [sys.executable, "-c", "from nanscope.runtime import tensorflow; tensorflow()"]
    seconds, _ = wall_seconds(lambda: subprocess.run(command, capture_output=True, cwd=REPO, check=True))
    return seconds


@dataclass
class EndToEnd:
    config: str
    steps: int
    fit_layout: str
    nanscope_s: float
    fit_s: float
    how: str


def bench_end_to_end(config, repeats):
    """Median seconds of nanscope and of model.fit over `repeats` alternating runs, or None if the config is missing."""
    path = REPO / config
    if not path.exists():
        return None
    ours, theirs, how, steps, per_epoch = [], [], "", 0, 0
    for _ in range(repeats):
        seconds, how = nanscope_seconds(path)
        ours.append(seconds)
        seconds, steps, per_epoch = fit_seconds(path)
        theirs.append(seconds)
    layout = f"{steps // per_epoch} epochs x {per_epoch} steps"
    return EndToEnd(config, steps, layout, median(ours), median(theirs), how)


# --- report ----------------------------------------------------------------------------


def step_table(results):
    lines = [
        "| model | batch | plain ms/step | instrumented ms/step | check_numerics ms/step | instrumented/plain | check_numerics/plain |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for case, times in results:
        lines.append(
            f"| {case.name} | {case.batch} | {median(times['plain']):.2f} | {median(times['instrumented']):.2f} | "
            f"{median(times['check_numerics']):.2f} | {median_ratio(times, 'instrumented', 'plain'):.2f}x | "
            f"{median_ratio(times, 'check_numerics', 'plain'):.2f}x |"
        )
    return "\n".join(lines)


def e2e_table(rows, skipped, startup):
    lines = [
        "| spec | steps | nanscope s | model.fit s | nanscope/fit | fit layout |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.config} | {row.steps} | {row.nanscope_s:.2f} | {row.fit_s:.2f} | "
            f"{row.nanscope_s / row.fit_s:.2f}x | {row.fit_layout} |"
        )
    notes = [f"- nanscope timing: {rows[0].how}." if rows else None]
    notes.append("- model.fit timing: in-process compile + fit, first trace included; model and data construction not timed.")
    if startup is not None:
        notes.append(f"- for reference, starting Python and importing nanscope + TensorFlow takes {startup:.2f} s (not subtracted).")
    notes += [f"- skipped {config}: not in configs/ yet." for config in skipped]
    return "\n".join(lines + [""] + [n for n in notes if n])


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per model (default 7)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant per round (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant after tracing (default 3)")
    parser.add_argument("--e2e-repeats", type=int, default=3, help="end-to-end runs of each side (default 3)")
    parser.add_argument("--skip-e2e", action="store_true", help="only the per-step benchmark")
    parser.add_argument("--models", default="mlp,cnn,lstm", help="comma list of mlp, cnn, lstm")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    print(f"# {platform.node()}: {platform.processor() or platform.machine()}, {_cpus()} CPUs, "
          f"TensorFlow {tf.__version__}, Keras {keras.__version__}; rounds={args.rounds} steps={args.steps}")
    chosen = {name.strip() for name in args.models.split(",")}
    cases = [case for case, key in zip(CASES, ("mlp", "cnn", "lstm")) if key in chosen]
    results = []
    for case in cases:
        results.append((case, bench_case(case, args.rounds, args.steps, args.warmup)))
        print(f"  done: {case.name}", file=sys.stderr)
    print("\nPer train step (median over rounds; ratios are medians of per-round ratios):\n")
    print(step_table(results))
    if args.skip_e2e:
        return
    rows, skipped = [], []
    for config in ("configs/exploding-regression.yaml", "configs/exploding-regression-clipnorm.yaml"):
        row = bench_end_to_end(config, args.e2e_repeats)
        (rows.append(row) if row else skipped.append(config))
    startup = startup_seconds() if rows and rows[0].how.startswith("CLI") else None
    print(f"\nEnd to end (median of {args.e2e_repeats} alternating runs each):\n")
    print(e2e_table(rows, skipped, startup))


def _cpus():
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


if __name__ == "__main__":
    main()
