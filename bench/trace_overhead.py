"""How much nanscope's instrumented train step costs against a plain one, and end to end against fit.

Part 1, per step. For an MLP, a small CNN and an LSTM, three variants of one train
step, each on a fresh model and optimizer built from the same seed, jit_compile=False:

  plain          a tf.function: forward, loss, tape.gradient, apply_gradients; returns the loss
  instrumented   nanscope's InstrumentedStep.run, pulling its small stats tensors to numpy
  check_numerics the plain step traced under tf.debugging.enable_check_numerics()

Every round times at least `--steps` steps of each variant in turn (more for fast models,
see `--min-block-ms`); the table shows the median ms/step over rounds and the median of
the per-round ratios against plain. `--clock cpu` times by this process's CPU time,
which a busy machine disturbs less than the wall clock.

Part 2, end to end. `nanscope trace-steps SPEC --keep-going` against `model.fit` on the
same model, data and optimizer for the same number of steps (batch 32). A spec that
run_trace runs one compiled call per step (fewer than trace.CHUNK_MIN_STEPS steps) is
also timed forced into chunks, the like-for-like column.

Usage:
    .venv/bin/python bench/trace_overhead.py            # defaults: --rounds 7 --steps 20 --clock wall
    .venv/bin/python bench/trace_overhead.py --rounds 9 --steps 40 --skip-e2e
"""

import argparse
import contextlib
import importlib
import importlib.util
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nanscope.runtime import tensorflow

tf, keras = tensorflow()

from _common import CLOCKS, interleaved_rounds, median, median_ratio, seconds_per_call, wall_seconds  # noqa: E402

from nanscope.engine.step import InstrumentedStep  # noqa: E402
from nanscope.model.models import from_keras  # noqa: E402
from nanscope.run.losses import Loss  # noqa: E402

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
    """The baseline: a compiled forward, loss, backward and update that returns the loss.

    Compiled as InstrumentedStep compiles its step (input signature with a free batch
    axis, jit_compile=False, autograph=False), so only the instrumentation differs.
    """
    specs = [tf.TensorSpec([None, *x.shape[1:]], x.dtype), tf.TensorSpec([None, *y.shape[1:]], y.dtype)]

    @tf.function(input_signature=specs, jit_compile=False, autograph=False)
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
    step = InstrumentedStep(from_keras(model, case.name), Loss(loss_fn, "scce"), optimizer, x, y, jit_compile=False)
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


def bench_case(case, rounds, steps, warmup, min_block_ms, clock="wall"):
    """(steps per round, per variant ms/step per round), all variants interleaved.

    Fast models get more than `steps` steps, so one timed block lasts at least
    `min_block_ms` and timer and scheduler noise stay small against it.
    """
    batches = random_batches(case)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    runs = {name: make(case, batches, loss_fn) for name, make in VARIANTS.items()}
    for fn in runs.values():
        for i in range(warmup):
            fn(i)
    plain_ms = 1000.0 * seconds_per_call(runs["plain"], warmup)
    steps = max(steps, math.ceil(min_block_ms / plain_ms))
    return steps, interleaved_rounds(runs, rounds, steps, clock)


# --- end to end -------------------------------------------------------------------------


def run_trace_available():
    """True when the in-process `nanscope.run.trace.run_trace` library function exists."""
    if importlib.util.find_spec("nanscope.run.trace") is None:
        return False
    from nanscope.run import trace

    return hasattr(trace, "run_trace") and hasattr(trace, "TraceOptions")


def nanscope_seconds(config, clock):
    """(seconds, how) of one nanscope trace-steps run with --keep-going (a CLI run is timed by the wall clock)."""
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "trace.jsonl"
        if run_trace_available():
            from nanscope.spec.load import load_spec
            from nanscope.run.trace import run_trace
            from nanscope.spec.options import TraceOptions

            seconds, _ = wall_seconds(
                lambda: run_trace(load_spec(config), TraceOptions(keep_going=True, trace_path=trace_path)), clock
            )
            return seconds, "in-process run_trace: spec, data, model build, trace, all steps, report"
        command = [str(REPO / ".venv/bin/nanscope"), "trace-steps", str(config), "--keep-going", "--trace",
                   str(trace_path)]
        seconds, done = wall_seconds(lambda: subprocess.run(command, capture_output=True, text=True, cwd=REPO))
        if done.returncode not in (0, 1):
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
        return seconds, "CLI subprocess: Python + TensorFlow start-up included, nothing subtracted"


@contextlib.contextmanager
def forced_chunking():
    """Make run_trace chunk every run, however short (trace.CHUNK_MIN_STEPS = 0), for the like-for-like column."""
    from nanscope.run import trace

    saved = trace.CHUNK_MIN_STEPS
    trace.CHUNK_MIN_STEPS = 0
    try:
        yield
    finally:
        trace.CHUNK_MIN_STEPS = saved


def chunking_switch_available():
    """True when run_trace decides between chunked and one-call-per-step runs by `trace.CHUNK_MIN_STEPS`."""
    return run_trace_available() and hasattr(importlib.import_module("nanscope.run.trace"), "CHUNK_MIN_STEPS")


def run_path(steps):
    """How run_trace runs a spec of `steps` steps: in chunks, or one compiled call per step."""
    if not chunking_switch_available():
        return "chunked"
    from nanscope.run.trace import CHUNK_MIN_STEPS

    return "chunked" if steps >= CHUNK_MIN_STEPS else "one call per step"


def fit_seconds(config, clock):
    """(seconds with setup, seconds of compile + fit, steps, steps per epoch) of model.fit for the spec's steps.

    "With setup" also times what run_trace does before its first step: spec loading,
    data generation and model building (nanscope's own `open_session`). The dataset
    repeats, so steps_per_epoch can be any divisor of train.steps; epochs *
    steps_per_epoch == train.steps, batch 32, verbose=0, no validation.
    """
    from nanscope.model.optimizers import build_optimizer
    from nanscope.run.session import open_session
    from nanscope.spec.load import load_spec

    now = CLOCKS[clock]
    start = now()
    spec = load_spec(config)
    session = open_session(spec)
    model, total = session.model.keras_model, spec.train.steps
    per_epoch = max(d for d in range(1, session.order.steps_per_epoch + 1) if total % d == 0)
    data = (
        tf.data.Dataset.from_tensor_slices((session.train.x, session.train.y))
        .shuffle(session.train.rows, seed=spec.train.seed).repeat().batch(32)
    )
    setup_done = now()
    model.compile(optimizer=build_optimizer(spec, session.model), loss=session.loss.fn)
    model.fit(data, epochs=total // per_epoch, steps_per_epoch=per_epoch, verbose=0)
    end = now()
    return end - start, end - setup_done, total, per_epoch


def startup_seconds():
    """Seconds to start Python and import nanscope + TensorFlow, for reading the CLI timing."""
    command = [sys.executable, "-c", "from nanscope.runtime import tensorflow; tensorflow()"]
    seconds, _ = wall_seconds(lambda: subprocess.run(command, capture_output=True, cwd=REPO, check=True))
    return seconds


@dataclass
class EndToEnd:
    """One spec's end-to-end runs: median seconds, and medians of the per-run ratios to fit."""

    config: str
    steps: int
    fit_layout: str
    nanscope_s: float
    fit_setup_s: float
    fit_s: float
    how: str
    ratio_setup: float
    ratio_fit: float
    path: str
    chunked_s: float | None = None  # forced chunking, when run_trace would not chunk this spec
    chunked_ratio_setup: float | None = None


def bench_end_to_end(config, repeats, clock):
    """Medians over `repeats` alternating nanscope and model.fit runs, or None if the config is missing.

    When run_trace runs the spec one call per step, each repeat also times it forced
    into chunks, so the table shows the like-for-like comparison too.
    """
    path = REPO / config
    if not path.exists():
        return None
    ours, chunked, with_setup, fit_only, how = [], [], [], [], ""
    steps = load_steps(path)
    compare_chunked = run_path(steps) != "chunked"
    for _ in range(repeats):
        seconds, how = nanscope_seconds(path, clock)
        ours.append(seconds)
        if compare_chunked:
            with forced_chunking():
                chunked.append(nanscope_seconds(path, clock)[0])
        setup_s, fit_s, steps, per_epoch = fit_seconds(path, clock)
        with_setup.append(setup_s)
        fit_only.append(fit_s)
    layout = f"{steps // per_epoch} epochs x {per_epoch} steps"
    result = EndToEnd(config, steps, layout, median(ours), median(with_setup), median(fit_only), how,
                      median(a / b for a, b in zip(ours, with_setup)), median(a / b for a, b in zip(ours, fit_only)),
                      run_path(steps))
    if chunked:
        result.chunked_s = median(chunked)
        result.chunked_ratio_setup = median(a / b for a, b in zip(chunked, with_setup))
    return result


def load_steps(config):
    """train.steps of a spec file."""
    from nanscope.spec.load import load_spec

    return load_spec(config).train.steps


# --- report ----------------------------------------------------------------------------


def step_table(results):
    """Markdown table of the per-step benchmark."""
    lines = [
        "| model | batch | steps/round | plain ms/step | instrumented ms/step | check_numerics ms/step "
        "| instrumented/plain | check_numerics/plain |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case, steps, times in results:
        lines.append(
            f"| {case.name} | {case.batch} | {steps} | {median(times['plain']):.2f} | "
            f"{median(times['instrumented']):.2f} | {median(times['check_numerics']):.2f} | "
            f"{median_ratio(times, 'instrumented', 'plain'):.2f}x | "
            f"{median_ratio(times, 'check_numerics', 'plain'):.2f}x |"
        )
    return "\n".join(lines)


def e2e_table(rows, skipped, startup):
    """Markdown table of the end-to-end benchmark, with what each timing includes."""
    lines = [
        ("| spec | steps | nanscope path | nanscope s | fit s (setup+compile+fit) | fit s (compile+fit) "
         "| nanscope / fit+setup | nanscope / fit | nanscope chunked s | chunked / fit+setup | fit layout |"),
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        chunked = (f"{r.chunked_s:.2f} | {r.chunked_ratio_setup:.2f}x" if r.chunked_s is not None
                   else "(same run) | (same)")
        lines.append(
            f"| {r.config} | {r.steps} | {r.path} | {r.nanscope_s:.2f} | {r.fit_setup_s:.2f} | {r.fit_s:.2f} | "
            f"{r.ratio_setup:.2f}x | {r.ratio_fit:.2f}x | {chunked} | {r.fit_layout} |"
        )
    notes = [f"- nanscope: {rows[0].how}." if rows else ""]
    notes.append("- nanscope chunked: the same run forced into chunks of steps (trace.CHUNK_MIN_STEPS = 0).")
    notes.append("- fit, setup: load_spec + open_session (data generation, seeded model build), as run_trace does.")
    notes.append("- fit, compile+fit: model.compile + model.fit in-process, first trace included; no validation.")
    notes.append("- ratios: medians of the per-run ratios (runs alternate nanscope, chunked, fit).")
    if startup is not None:
        notes.append(f"- starting Python and importing nanscope + TensorFlow alone takes {startup:.2f} s "
                     "(not subtracted).")
    notes += [f"- skipped {config}: not in configs/ yet." for config in skipped]
    return "\n".join(lines + [""] + [n for n in notes if n])


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per model (default 7)")
    parser.add_argument("--steps", type=int, default=20,
                        help="timed steps per variant per round, at least (default 20)")
    parser.add_argument("--min-block-ms", type=float, default=200.0,
                        help="fast models get more steps so one timed block of plain steps lasts this long "
                             "(default 200)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time by elapsed time or by this process's CPU time, all threads (default wall)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant after tracing (default 3)")
    parser.add_argument("--e2e-repeats", type=int, default=3, help="end-to-end runs of each side (default 3)")
    parser.add_argument("--skip-e2e", action="store_true", help="only the per-step benchmark")
    parser.add_argument("--models", default="mlp,cnn,lstm", help="comma list of mlp, cnn, lstm (default all)")
    return parser.parse_args(argv)


def machine_line(args):
    load = f", load average {os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else ""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.machine()}, {cpus} CPUs{load}; "
            f"Python {platform.python_version()}, TensorFlow {tf.__version__}, Keras {keras.__version__}; "
            f"rounds={args.rounds} steps>={args.steps} min-block-ms={args.min_block_ms:g} clock={args.clock}")


def main(argv=None):
    args = parse_args(argv)
    print(machine_line(args))
    chosen = {name.strip() for name in args.models.split(",")}
    results = []
    for case, key in zip(CASES, ("mlp", "cnn", "lstm")):
        if key in chosen:
            results.append((case,
                            *bench_case(case, args.rounds, args.steps, args.warmup, args.min_block_ms, args.clock)))
            print(f"  done: {case.name}", file=sys.stderr)
    print(f"\nPer train step, {args.clock} clock (median over rounds; ratios are medians of per-round ratios):\n")
    print(step_table(results))
    if args.skip_e2e:
        return
    rows, skipped = [], []
    for config in ("configs/exploding-regression.yaml", "configs/exploding-regression-clipnorm.yaml"):
        row = bench_end_to_end(config, args.e2e_repeats, args.clock)
        (rows.append(row) if row else skipped.append(config))
    startup = startup_seconds() if rows and rows[0].how.startswith("CLI") else None
    print(f"\nEnd to end, {args.clock} clock (median of {args.e2e_repeats} alternating runs each):\n")
    print(e2e_table(rows, skipped, startup))


if __name__ == "__main__":
    main()
