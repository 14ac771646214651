"""The compiled side of the fit probe: the user's `train_step`, instrumented, writing one row of statistics a step.

`StepProbe` (keras/probe.py) builds the train functions Keras calls and puts them in place; the steps inside
them are built here. On one device the step takes the snapshot of the state and the batch, runs the user's
`train_step` with the layer and optimizer hooks, and writes its row into the `RowBuffer`; under the sentinel's
light train function it writes a short row instead (`guard.sentinel`). Under `tf.distribute` each replica runs
the step and writes its own row with a replica axis, and under the guard keeps its own state and batch
(`keras.replica_step`).

Under `jit_compile=True` the step is compiled by XLA on its own, and the snapshot (a variable of any shape,
which XLA cannot compile) is taken around it, outside XLA.
"""

import functools
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING

import numpy as np

from nanscope.engine.model_view import LayerInfo, keras_sum_skipped
from nanscope.engine.probes import LayerRecorder
from nanscope.engine.schema import join
from nanscope.internals import overridden
from nanscope.keras.capture import StepCapture
from nanscope.keras.guest_step import as_guest
from nanscope.keras.moments import FeatureMoments
from nanscope.keras.replica_step import ReplicaSteps
from nanscope.keras.rows import RowBuffer
from nanscope.keras.snapshot import StepSnapshot, not_absorbed, unexpected_layer_nonfinite
from nanscope.keras.step_row import Data, Logs, TrainStep, batch_rows, logged_loss
from nanscope.keras.trace_count import FirstTrace
from nanscope.runtime import tensorflow
from nanscope.tf_types import KerasModel, Optimizer, Tensor, Variable

if TYPE_CHECKING:
    from nanscope.engine.records import StepRecord
    from nanscope.guard.sentinel import SentinelRows

tf, keras = tensorflow()

class ProbedSteps:
    """The instrumented train steps of one fit, and the first failure of nanscope's own code inside them.

    Args:
        model: keras.Model, compiled and built.
        optimizers: list of Optimizer. Those the step trains with (`model_parts.training_optimizers`).
        layers: list of LayerInfo. The probed layers, in record order.
        recorder: LayerRecorder. Their hooks.
        rows: RowBuffer. Where each step's row goes.
        outputs: int. Outputs of a multi-output model (0 for one).
        expected: list of int. Indices of layers whose non-finite outputs are intended.
        snapshot: StepSnapshot, optional. The state and batch before each step (under tf.distribute, per replica).
        sentinel: SentinelRows, optional. The light step's short rows (`mode="sentinel"`, one device).
        first_trace: FirstTrace. Told when the step is traced.
        xla_inside: bool. The user's step is compiled by XLA, the snapshot taken outside it.
        original: callable(data) -> logs. The user's `train_step`, which `rerun` measures.
    """

    failure: Exception | None

    def __init__(self, model: KerasModel, optimizers: Sequence[Optimizer], layers: Sequence[LayerInfo],
                 recorder: LayerRecorder, rows: RowBuffer, outputs: int, expected: Sequence[int],
                 snapshot: StepSnapshot | None, sentinel: "SentinelRows | None", first_trace: FirstTrace,
                 xla_inside: bool, original: TrainStep) -> None:
        self.model, self.optimizers, self.layers, self.layer_probe = model, list(optimizers), list(layers), recorder
        self.trainable: list[Variable] = list(model.trainable_variables)
        self.rows, self.outputs, self.expected = rows, outputs, list(expected)
        self.snapshot, self.sentinel, self.first_trace, self.xla_inside = snapshot, sentinel, first_trace, xla_inside
        self.replicas = model.distribute_strategy.num_replicas_in_sync
        self.moments = FeatureMoments() if self.replicas == 1 else None
        self.original, self.failure = original, None
        self._rerun: Callable[[Data], Tensor] | None = None
        self.replica_steps: ReplicaSteps | None = None
        if self.replicas > 1:
            self.replica_steps = ReplicaSteps(model, self.optimizers, self.layers, recorder, rows, outputs, snapshot,
                                              original)

    def failed(self, exc: Exception) -> None:
        """Keep the first failure of nanscope's own code (the step went on without it)."""
        self.failure = self.failure or exc

    def instrumented(self, original: TrainStep) -> TrainStep:
        """`original` (the user's `train_step`) with the hooks, the snapshot and the row around it."""
        if self.replica_steps is not None:
            return self.replica_steps.instrumented(original)
        if self.xla_inside:
            # autograph=False: Keras runs `train_step` unconverted (its step function is `do_not_convert`), and
            # converting nanscope's own code on every trace costs seconds of CPU.
            full = tf.function(self._step(original, snapshot=False), reduce_retracing=True,
                               jit_compile=True, autograph=False)
            # Sentinel mode: a second XLA function, or the light train function would reuse the full one's trace.
            light = (tf.function(functools.partial(self._sentinel_step, original, snapshot=False),
                                 reduce_retracing=True, jit_compile=True, autograph=False)
                     if self.sentinel is not None else None)
            return sums_skipped(self._snapshot_around(full, original, light), self.optimizers)
        return sums_skipped(self._step(original, snapshot=self.snapshot is not None), self.optimizers)

    def shared_capture(self) -> StepCapture:
        """A new hub for the replica threads' captures (under tf.distribute), for one train function."""
        assert self.replica_steps is not None  # the train function is hooked per call under tf.distribute only
        return self.replica_steps.shared_capture()

    def forget_rerun(self) -> None:
        """Trace the rerun again on its next call (the step was retraced)."""
        self._rerun = None
        if self.replica_steps is not None:
            self.replica_steps.forget_rerun()

    def rerun(self, data: Data, step: int = -1) -> "StepRecord":
        """The step again, compiled, on `data` from the variables as they are: its StepRecord.

        It runs the user's `train_step` with the same hooks and builds the same row, but writes
        nothing: no buffer row, no snapshot, no feature moments. The variables it changes are
        the caller's to put back. Under tf.distribute `data` is the replicas' held batches (`ReplicaSteps`).
        """
        if self.replica_steps is not None:
            return self.replica_steps.rerun(data, step)
        if self._rerun is None:
            self._rerun = tf.function(self._measured, autograph=False)  # unconverted, as Keras runs the step
        row = self._rerun(data).numpy()
        return self.rows.record(step, np.concatenate([[float(step)], row]))

    def _snapshot_around(self, step: TrainStep, original: TrainStep, light: TrainStep | None = None) -> TrainStep:
        """`step` (compiled by XLA), after the snapshot of its state and batch, taken outside XLA; in the
        sentinel's light train function, `light` instead."""
        @functools.wraps(original)
        def train_step(data: Data) -> Logs:
            try:
                self._take(data)
            except Exception as exc:  # nanscope's own failure: the step runs, without a snapshot
                self.failed(exc)
            # `light` is made with the sentinel only.
            if light is not None and self.sentinel is not None and not self.sentinel.full_now:
                return light(data)
            return step(data)

        return train_step

    def _take(self, data: Data) -> None:
        assert self.snapshot is not None  # taken only with a snapshot
        self.snapshot.remember_structure(data)
        self.snapshot.take(data, self.rows.counter.read_value())

    def _capture(self) -> StepCapture:
        return StepCapture(self.model, self.optimizers, self.trainable, outputs=self.outputs)

    def _step(self, original: TrainStep, snapshot: bool) -> TrainStep:
        @functools.wraps(original)
        def train_step(data: Data) -> Logs:
            if self.sentinel is not None and not self.sentinel.full_now:
                return self._sentinel_step(original, data)

            def attach(hooks: ExitStack) -> StepCapture:
                self.first_trace.made_in_trace()
                capture = self._capture()
                self.layer_probe.begin()
                if snapshot:
                    self._take(data)
                hooks.enter_context(self.layer_probe.attached())
                hooks.enter_context(capture.attached())
                return capture

            return as_guest(attach, lambda: original(data),
                            lambda capture, logs: self._write(capture, data, logs), self.failed)

        return train_step

    def _write(self, capture: StepCapture, data: Data, logs: Logs) -> None:
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        row, values, stats = self._row(capture, data, logs)
        self.rows.write(row)
        if self.moments is not None:
            self.moments.add(x, y)
        if self.snapshot is not None:
            layer_bad = unexpected_layer_nonfinite(stats, len(self.layers), self.expected)
            self.snapshot.freeze(not_absorbed(values, layer_bad))

    def _row(self, capture: StepCapture, data: Data, logs: Logs) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """The step's row (without its step number), its SCALARS by name and its layer statistics."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        stats = self.layer_probe.stats_matrix()
        values, var_rows, terms = capture.values(x, y, logged_loss(capture, logs), self.layers)
        row = tf.concat([tf.stack([batch_rows(x)]),
                         join([capture.scalars(values, y, sample_weight), stats, tf.stack(terms), var_rows])], axis=0)
        return row, values, stats

    def _measured(self, data: Data) -> Tensor:
        capture = self._capture()
        self.layer_probe.begin()
        with self.layer_probe.attached(), capture.attached():
            logs = self.original(data)
        return self._row(capture, data, logs)[0]

    def _sentinel_step(self, original: TrainStep, data: Data, snapshot: bool = True) -> Logs:
        """The light step: the snapshot (unless taken outside XLA), the optimizer and loss hooks, one short row
        (`SentinelRows`)."""
        from nanscope.guard.sentinel import SentinelCapture

        def attach(hooks: ExitStack) -> SentinelCapture:
            capture = SentinelCapture(self.model, self.optimizers, self.trainable, outputs=self.outputs)
            if self.snapshot is not None and snapshot:
                self._take(data)
            hooks.enter_context(capture.attached())
            return capture

        def write(capture: SentinelCapture, logs: Logs) -> None:
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            values, _, _ = capture.values(x, y, logged_loss(capture, logs), self.layers)
            assert self.sentinel is not None  # the light step runs only in sentinel mode
            self.sentinel.write(batch_rows(x), capture.scalars(values, y, sample_weight))
            if self.snapshot is not None:
                self.snapshot.freeze(not_absorbed(values, tf.constant(0.0)))

        return as_guest(attach, lambda: original(data), write, self.failed)


def sums_skipped(step: TrainStep, optimizers: Sequence[Optimizer]) -> TrainStep:
    """`step`, a train step on one replica, with the optimizers' own sum of the replicas' gradients skipped while it
    is traced: on one replica that sum is the gradients themselves, and Keras' all-reduce, traced, keeps the graph
    for the life of the process (engine/step.py), so every train function nanscope built (two a fit) was kept."""
    hooks = [hook for optimizer in optimizers for hook in keras_sum_skipped(optimizer)]

    @functools.wraps(step)
    def train_step(data: Data) -> Logs:
        with overridden(hooks):
            return step(data)

    return train_step
