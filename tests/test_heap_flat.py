"""A fit with the NanScope callback keeps no Python object per execution besides the scalar columns.

The one thing nanscope keeps per step is its scalar columns (`nanscope.store.series`, 77 B a
step); the full rows it keeps are bounded (`keep_steps`, `sample_steps`). With both
bounds small and full, tracemalloc, filtered to nanscope's own files, sees any other
list, dict or closure that grows with the steps (bench/soak.py measures the same over
100k steps, where a few bytes an execution add up).

TensorFlow's own memory is out of tracemalloc's sight. Under tf.distribute it grows with
every execution of a cross-replica collective (~1.5 KB each, an all-gather ~3 KB, for good:
on two logical CPUs a bare step with one all-reduce grows 1.46 KB a step, with none 0),
so the callback must launch none of its own where Keras' own all-reduce already summed
what it needs. Before, it launched two all-reduces and an all-gather a replica and a step:
fit under MirroredStrategy grew 5.8 KB a step with it, 0.95 without (3,000 steps).
trace-steps under `mirrored` sums the gradients once, where it summed them twice.

A library caller replaying a repro bundle in a loop (`replay_repro`) opens a session and traces its
step on every replay; each replay's step graphs must go when it returns. Keras' optimizer sums the
gradients through the replica context's all-reduce even without a strategy, and that sum, traced,
registers a gradient function in TensorFlow's global registry that holds the graph for good: ~3 MB
a replay (bench/README.md, `soak.py`). The same held the train functions the callback builds in
every fit, which a caller that fits one model again and again (a fit per epoch) met.
"""

import gc
import json
import os
import subprocess
import sys
import tracemalloc
import weakref
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from nanscope.keras import NanScope
from nanscope.replay import replay_repro
from nanscope.run.trace import run_trace
from nanscope.spec.load import load_spec
from nanscope.spec.options import TraceOptions
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
FIRST, LAST = 50, 250  # the steps between the two snapshots: 200 executions
COLUMNS = "*/nanscope/store/series.py"  # every step's scalars, in chunks that double
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def growth():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    x = np.random.default_rng(1).standard_normal((64, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True) * 0.1)).repeat().batch(16)
    snapshots = {}

    class Snapshots(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 in (FIRST, LAST):
                gc.collect()
                own = [tracemalloc.Filter(True, "*/nanscope/*"), tracemalloc.Filter(False, COLUMNS)]
                snapshots[batch + 1] = tracemalloc.take_snapshot().filter_traces(own)

    scope = NanScope(keep_steps=2, sample_steps=2, verbose=0, console=Console(quiet=True))
    tracemalloc.start(1)
    try:
        model.fit(data, epochs=1, steps_per_epoch=LAST, callbacks=[scope, Snapshots()], verbose=0)
    finally:
        tracemalloc.stop()
    assert scope.report.steps_run == LAST
    return snapshots[LAST].compare_to(snapshots[FIRST], "lineno")


def test_no_line_of_nanscope_keeps_memory_per_execution(growth):
    # 8 bytes an execution (one list entry) would be 1.6 KB here; a bounded set that was full before the first
    # snapshot only swaps one record for another.
    grown = {str(stat.traceback): stat.size_diff for stat in growth if stat.size_diff > 1024}
    assert grown == {}


def test_under_mirrored_strategy_nanscope_launches_no_collective_it_can_do_without(tmp_path):
    script = REPO / "tests" / "specs" / "distribute" / "collectives.py"
    ways = ["plain", "clipnorm", "fit-guard", "trace", "trace-guard"]
    done = subprocess.run([sys.executable, str(script), *ways], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "NANSCOPE_CPU_REPLICAS": "2", "TF_CPP_MIN_LOG_LEVEL": "3",
                               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    assert done.returncode == 0, done.stderr[-3000:]
    launched = json.loads(done.stdout.strip().splitlines()[-1])
    assert launched["plain"]["without"] == {"all_reduce": 2}  # Keras sums the gradients: one a replica
    assert launched["plain"]["with"] == launched["plain"]["without"]
    # Keras sums the clipped gradients; the statistics are of the unclipped ones: one all-reduce a replica more.
    assert launched["clipnorm"]["without"] == {"all_reduce": 2}
    assert launched["clipnorm"]["with"] == {"all_reduce": 4}
    # The callback's guard copies each replica's state and batch on its device (a merge_call, no collective), and
    # its variables are made without a second trace of the step: Keras' own all-reduce, one a replica, only.
    assert launched["fit-guard"] == {"all_reduce": 2}
    # trace-steps' own step sums the gradients once, the optimizer's own sum skipped, and is traced once: one
    # all-reduce a replica (before, two a replica in each of two traces: 8; then one in each of two traces: 4).
    assert launched["trace"] == {"all_reduce": 2}
    # Under the guard the step copies the optimizer's state too, each device its own, and the verdicts and the skip
    # re-run the traced step: still one all-reduce a replica, in one trace.
    assert launched["trace-guard"] == {"all_reduce": 2}


def test_under_multi_worker_strategy_the_callback_launches_only_keras_own_collective(tmp_path, monkeypatch):
    # Each replica's row rides on Keras' own all-reduce of the gradients, before the update; before, it had an
    # all-reduce of its own every step (1.8 KB a step kept, bench/README.md's soak). The same losses as without it.
    from test_multi_worker import SPECS, finish, free_ports, start_workers

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    runs = {}
    for way in ("--bare", "--with"):
        (folder := tmp_path / way.strip("-")).mkdir()
        workers = start_workers([str(SPECS / "fit_callback.py"), str(folder), way, "--healthy"], folder, free_ports(2))
        try:
            done = finish(workers, timeout=240)
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
        assert [code for code, _, _ in done] == [0, 0], done[0][2][-2000:] + done[1][2][-2000:]
        runs[way] = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in done]
    for bare, seen in zip(runs["--bare"], runs["--with"]):
        assert bare["collectives"] == {"all_reduce": 1}  # Keras sums the gradients: one a replica
        assert seen["collectives"] == bare["collectives"]
        assert len(seen["losses"]) == 4 and seen["losses"] == bare["losses"]
        assert seen["steps"] == [0, 1, 2, 3] and seen["first"] is None


def live_graphs():
    """Every traced graph (FuncGraph) alive after a full collection."""
    from tensorflow.python.framework.func_graph import FuncGraph

    gc.collect()
    return [weakref.ref(o) for o in gc.get_objects() if isinstance(o, FuncGraph)]


MIXED_FLOAT16 = f"""\
model: {{factory: {REPO / 'tests' / 'specs' / 'precision_models.py'}:exp_late_overflow}}
data: {{factory: {REPO / 'tests' / 'specs' / 'data_factories.py'}:late_spike, batch_size: 16, shuffle: false,
       args: {{spike: 40.0, target_scale: 3.0}}}}
train: {{loss: mse, optimizer: {{name: sgd, learning_rate: 0.01}}, steps: 6, seed: 0, mixed_precision: mixed_float16}}
"""


@pytest.mark.parametrize("spec", ["division-by-zero.yaml", "mixed_float16"])
def test_a_loop_of_replays_keeps_no_graph(spec, tmp_path):
    # Before, each replay kept its step graphs: 2 a replay, 10 under mixed_float16 (a LossScaleOptimizer's
    # inner optimizer sums the gradients, inside the graphs of its finite-or-skip branch).
    source = REPO / "tests" / "specs" / spec
    if spec == "mixed_float16":
        (source := tmp_path / "mixed.yaml").write_text(MIXED_FLOAT16)
    bundle = tmp_path / "repro"
    run_trace(load_spec(source), TraceOptions(trace_path=tmp_path / "t.jsonl", save_repro=bundle))
    first = replay_repro(bundle).first_nonfinite  # anything cached once a process is in place after one replay
    kept = {id(ref()) for ref in live_graphs()}
    replayed = [replay_repro(bundle).first_nonfinite for _ in range(2)]
    assert [(f.step, f.phase, f.op) for f in replayed] == [(first.step, first.phase, first.op)] * 2
    assert sorted(ref().name for ref in live_graphs() if ref() is not None and id(ref()) not in kept) == []


def test_a_loop_of_fits_with_the_callback_keeps_no_graph():
    # Each fit with the callback builds its train functions anew (the full one, the sentinel's light one); before,
    # each fit kept two graphs. Without nanscope Keras traces its train function once for the model.
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")

    def fit():
        scope = NanScope(verbose=0, console=Console(quiet=True))
        model.fit(x, x[:, :1], batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[scope])
        return scope.report.steps_run

    assert fit() == 4
    kept = {id(ref()) for ref in live_graphs()}
    assert [fit(), fit()] == [4, 4]
    assert sorted(ref().name for ref in live_graphs() if ref() is not None and id(ref()) not in kept) == []
