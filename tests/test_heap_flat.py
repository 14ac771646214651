"""A fit with the NanScope callback keeps no Python object per execution besides the scalar columns.

The one thing nanscope keeps per step is its scalar columns (`nanscope.store.series`, 77 B a
step); the full rows it keeps are bounded (`keep_steps`, `sample_steps`). With both
bounds small and full, tracemalloc, filtered to nanscope's own files, sees any other
list, dict or closure that grows with the steps (bench/soak.py measures the same over
100k steps, where a few bytes an execution add up).
"""

import gc
import tracemalloc

import numpy as np
import pytest
from rich.console import Console

from nanscope.keras import NanScope
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
FIRST, LAST = 50, 450  # the steps between the two snapshots: 400 executions
COLUMNS = "*/nanscope/store/series.py"  # every step's scalars, in chunks that double


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
    # 8 bytes an execution (one list entry) would be 3.2 KB here; a bounded set that was full before the first
    # snapshot only swaps one record for another.
    grown = {str(stat.traceback): stat.size_diff for stat in growth if stat.size_diff > 1024}
    assert grown == {}
