"""Run many instrumented steps in one compiled call.

Calling a compiled function from Python costs a fixed ~0.2 ms (argument binding, the
numpy-to-tensor copies of the batch, four output transfers), which on a small model
is as much as the step itself. `ChunkRunner` keeps the training arrays on the device
and runs up to `CHUNK_STEPS` steps per call in a `tf.while_loop`, gathering each batch
by its row indices inside the graph. Every step is still the same instrumented step
with its snapshot and statistics; the loop stops right after the first step that shows
a non-finite value, so the snapshot then holds the weights from before that step.

Each step writes its statistics into a buffer variable, one row per step, as it
finishes, so when an op fails in the middle of a chunk the steps finished before it
are still read back.
"""

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope.data import inputs, targets
from nanscope.data.targets import Arrays
from nanscope.engine.records import StepRecord
from nanscope.engine.schema import LAYER, SCALAR_COUNTS, SCALARS, join
from nanscope.runtime import tensorflow
from nanscope.tf_types import Tensor

if TYPE_CHECKING:
    from nanscope.engine.step import InstrumentedStep

# Steps per compiled call: enough to amortise the call, few enough that Ctrl-C, the
# progress display and the trace file hear about steps within a fraction of a second.
CHUNK_STEPS = 32
# Training arrays up to this size are copied to the device once; larger ones are fed per step.
DEVICE_DATA_LIMIT_BYTES = 256 * 2**20


def fits_on_device(x: Arrays, y: Arrays) -> bool:
    """True when the training arrays are small enough to keep on the device for chunked runs."""
    return inputs.nbytes(x) + targets.nbytes(y) <= DEVICE_DATA_LIMIT_BYTES


class ChunkRunner:
    """Runs an InstrumentedStep over runs of consecutive steps, one compiled call per run.

    Args:
        engine: InstrumentedStep.
        x, y: np.ndarray. The training arrays the batch indices refer to (y: a tuple of
            arrays for a multi-output model).
        expected: list of int, default (). Layers whose non-finite outputs are intended
            (`train.expect_nonfinite`): they alone do not end a chunk.

    Example:
        runner = ChunkRunner(engine, train.x, train.y)
        records = runner.run(0, [order.indices(s) for s in range(32)], stop_on_nonfinite=True)
    """

    def __init__(self, engine: "InstrumentedStep", x: Arrays, y: Arrays, expected: Collection[int] = ()) -> None:
        tf, _ = tensorflow()
        self.engine = engine
        self._watched = tf.constant([0.0 if i in set(expected) else 1.0 for i in range(len(engine.layers))])
        self._x, self._y = tf.nest.map_structure(tf.constant, x), tf.nest.map_structure(tf.constant, y)
        self.layout = engine.layout
        # One row per step: the step's outputs flattened and joined (engine/schema.py), so
        # each step is one write and each chunk one read back.
        self._buffer = tf.Variable(tf.zeros([CHUNK_STEPS, self.layout.width]), trainable=False, name="nanscope_chunk")
        self._done = tf.Variable(0, trainable=False, name="nanscope_chunk_done")
        self._trace()

    def _trace(self) -> None:
        tf, _ = tensorflow()
        compiled = tf.function(
            self._chunk, input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.bool)],
            jit_compile=self.engine.jit_compile, autograph=False,
        )
        with self.engine.probes_attached():
            self._concrete = compiled.get_concrete_function()
        self._generation = getattr(self.engine, "generation", 0)

    def run(self, first_step: int, index_rows: list[np.ndarray], stop_on_nonfinite: bool) -> list[StepRecord]:
        """StepRecords of the steps run: all of `index_rows` (equal-length batches, at most CHUNK_STEPS), or up to
        and including the first step that shows a non-finite value.

        Raises:
            ChunkFailure: an op failed inside a step; it carries the records of the steps finished before it.
        """
        tf, _ = tensorflow()
        if getattr(self.engine, "generation", 0) != self._generation:  # the step was traced again (`retrace`)
            self._trace()
        indices = np.stack(index_rows).astype(np.int32)
        try:
            self._concrete(indices, stop_on_nonfinite)
        except tf.errors.OpError as exc:
            raise ChunkFailure(self._records(first_step, indices.shape[1]), exc) from exc
        return self._records(first_step, indices.shape[1])

    def _records(self, first_step: int, rows: int) -> list[StepRecord]:
        count = int(self._done.numpy())
        scalars, layers, terms, variables = self.layout.split(self._buffer[:count].numpy())
        return [
            StepRecord.from_arrays(first_step + i, rows, scalars[i], layers[i], terms[i], variables[i])
            for i in range(count)
        ]

    def _chunk(self, indices: Tensor, stop_on_nonfinite: Tensor) -> Tensor:
        # A step's record is stored at the start of the next iteration (or after the
        # loop), which runs only once every op of that step has succeeded: when an op
        # fails, the stored records are exactly the steps that finished. The store needs
        # no tf.cond: before the first step it writes zeros to row 0 and leaves done at 0.
        tf, _ = tensorflow()
        steps = tf.shape(indices)[0]
        self._done.assign(0)
        empty = [tf.zeros(shape) for shape in self.layout.shapes]

        def keep_going(i: Tensor, bad: Tensor, *previous: Tensor) -> Tensor:
            del previous  # Unused: tf.while_loop hands the condition every loop variable
            return tf.logical_and(i < steps, tf.logical_not(tf.logical_and(stop_on_nonfinite, bad)))

        def body(i: Tensor, bad: Tensor, *previous: Tensor) -> tuple[Tensor, ...]:
            del bad  # Unused: tf.while_loop hands the body every loop variable
            with tf.control_dependencies([self._store(i, previous)]):
                rows = indices[i]
            x = tf.nest.map_structure(lambda t: tf.gather(t, rows), self._x)
            y = tf.nest.map_structure(lambda t: tf.gather(t, rows), self._y)
            outputs = self.engine.step_outputs(x, y)
            scalars, layer_stats, *_ = outputs  # the loss terms and variable rows are not judged here
            return (i + 1, _suspicious(scalars, layer_stats, self._watched), *outputs)

        # The steps depend on each other through the weights: no iterations to overlap.
        count, _, *last = tf.while_loop(keep_going, body, (tf.constant(0), tf.constant(False), *empty),
                                        parallel_iterations=1)
        with tf.control_dependencies([self._store(count, last)]):
            return self._done.value()

    def _store(self, done: Tensor, outputs: Any) -> Tensor:
        """Write the outputs of step done - 1 (of none when done is 0) and mark `done` steps finished."""
        tf, _ = tensorflow()
        row = join(outputs)
        slot = tf.reshape(tf.maximum(done - 1, 0), [1, 1])
        with tf.control_dependencies([self._buffer.scatter_nd_update(slot, row[None])]):
            return self._done.assign(done).op


class ChunkFailure(Exception):
    """An op failed inside a chunk: `records` are the steps finished before it, `error` the TensorFlow error."""

    def __init__(self, records: list[StepRecord], error: BaseException) -> None:
        super().__init__(str(error))
        self.records, self.error = records, error


def _suspicious(scalars: Tensor, layer_stats: Tensor, watched: Tensor) -> Tensor:
    """True when a step shows any non-finite count or value outside the expected layers; the host decides the rest.

    Conservative on purpose: a model output made non-finite by an expected layer, or an
    update a LossScaleOptimizer skipped, also ends the chunk, and the host carries on.
    """
    tf, _ = tensorflow()
    counts = tf.concat([tf.stack([scalars[SCALARS.at(name)] for name in SCALAR_COUNTS]),
                        layer_stats[:, LAYER.at("nonfinite")] * watched], axis=0)
    values = tf.stack([scalars[SCALARS.at("loss")], scalars[SCALARS.at("grad_global_norm")]])
    return tf.logical_or(tf.reduce_any(counts > 0), tf.logical_not(tf.reduce_all(tf.math.is_finite(values))))
