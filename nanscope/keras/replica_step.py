"""The fit probe's step under `tf.distribute`: each replica writes its own row; the guard's re-run of a held step.

Keras runs `train_step` once per replica. Replica threads take turns while one step is traced: the layer and
optimizer hooks are attached once, around the train function (`StepProbe`'s per-call hooks), and each thread's
hooks write into that thread's own capture. Under the guard each replica first copies its state and its share of
the batch on its own device (`ReplicaStepSnapshot`). A re-run for the verdicts hands every replica its own held
share again (`experimental_distribute_values_from_function`), so its record counts each replica's non-finite
values as the step's did; it launches only the collectives of the user's step (Keras' own sum of the gradients),
on the first non-finite step only, never on a healthy one.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope.engine.model_view import LayerInfo
from nanscope.engine.probes import LayerRecorder
from nanscope.engine.schema import VARIABLE, join
from nanscope.keras.capture import StepCapture
from nanscope.keras.rows import SHARED_SCALARS, RowBuffer
from nanscope.keras.snapshot import StepSnapshot
from nanscope.keras.step_row import Data, Logs, TrainStep, batch_rows, logged_loss
from nanscope.runtime import tensorflow
from nanscope.tf_types import KerasModel, Optimizer, Tensor

if TYPE_CHECKING:
    from nanscope.engine.records import StepRecord

tf, keras = tensorflow()


class ReplicaSteps:
    """The per-replica step of one fit and its re-run.

    Args:
        model: keras.Model, compiled under a strategy's scope.
        optimizers: list of Optimizer. Those the step trains with.
        layers: list of LayerInfo. The probed layers, in record order.
        recorder: LayerRecorder. Their hooks.
        rows: RowBuffer. Where each replica's row goes.
        outputs: int. Outputs of a multi-output model (0 for one).
        snapshot: StepSnapshot (a ReplicaStepSnapshot), optional. Kept under the guard only.
        original: callable(data) -> logs. The user's `train_step`, which `rerun` runs.
    """

    def __init__(self, model: KerasModel, optimizers: Sequence[Optimizer], layers: Sequence[LayerInfo],
                 recorder: LayerRecorder, rows: RowBuffer, outputs: int, snapshot: StepSnapshot | None,
                 original: TrainStep) -> None:
        self.model, self.optimizers, self.layers, self.layer_probe = model, list(optimizers), list(layers), recorder
        self.trainable = list(model.trainable_variables)
        self.rows, self.outputs, self.snapshot, self.original = rows, outputs, snapshot, original
        self.strategy = model.distribute_strategy
        self.replicas = self.strategy.num_replicas_in_sync
        self.hub: StepCapture | None = None
        self._rerun: Any = None

    def shared_capture(self) -> StepCapture:
        """A new hub for the replica threads' captures, for one train function."""
        self.hub = StepCapture(self.model, self.optimizers, self.trainable).shared_by_threads()
        return self.hub

    def instrumented(self, original: TrainStep) -> TrainStep:
        """`original` with the snapshot (under the guard) before it and this replica's row after it."""
        def train_step(data: Data) -> Logs:
            if self.snapshot is not None:
                self.snapshot.remember_structure(data)
                self.snapshot.take(data, self.rows.counter.read_value())
            context = tf.distribute.get_replica_context()
            logs, row, folded = self._row(original, data, context, fold=self.rows.gathered)
            self.rows.write_replicas(context, row, folded)
            return logs

        return train_step

    def _row(self, original: TrainStep, data: Data, context: Any, fold: bool = False
             ) -> tuple[Logs, Tensor, Tensor | None]:
        """The step's logs, this replica's row (without its step) and, where `fold` and the optimizer's all-reduce
        carried them, every replica's rows with their shared columns 0 (`RowBuffer.write_replicas`)."""
        self.layer_probe.begin_replica(int(tf.get_static_value(context.replica_id_in_sync_group)))
        capture = StepCapture(self.model, self.optimizers, self.trainable, replica_context=context,
                              replicas=self.replicas, outputs=self.outputs)
        assert self.hub is not None  # made with the train function, before its first trace
        self.hub.for_this_thread(capture)
        if fold and len(self.optimizers) == 1:  # one optimizer's gradients, one count of the replica's own
            capture.ride = lambda: self._replica_part(capture, data, context)
        logs = original(data)
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        values, var_rows, terms = capture.values(x, y, logged_loss(capture, logs), self.layers)
        return logs, self._joined(capture, data, values, terms, var_rows), capture.folded

    def _joined(self, capture: StepCapture, data: Data, values: dict[str, Tensor], terms: list[Tensor],
                var_rows: Tensor) -> Tensor:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        return tf.concat([tf.stack([batch_rows(x)]),
                          join([capture.scalars(values, y, sample_weight), self.layer_probe.stats_matrix(),
                                tf.stack(terms), var_rows]), tf.stack([capture.local_nonfinite])], axis=0)

    def _replica_part(self, capture: StepCapture, data: Data, context: Any) -> Tensor | None:
        """At the optimizer's all-reduce, before the update: this replica's row with the columns shared by every
        replica 0, `slotted`; None where the loss is not known yet (a custom step that only logs it)."""
        if capture.loss is None:
            return None
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        values, terms = capture.replica_values(x, y, None, self.layers)
        shared = {name: tf.constant(0.0) for name in SHARED_SCALARS}
        var_rows = tf.zeros([self.rows.layout.variables, len(VARIABLE)])
        return self.rows.slotted(context, self._joined(capture, data, {**values, **shared}, terms, var_rows))

    def forget_rerun(self) -> None:
        self._rerun = None

    def rerun(self, batches: tuple, step: int = -1) -> "StepRecord":
        """The step again, compiled, each replica on its own batch of `batches` (the held ones, in replica
        order), from the variables as they are: its StepRecord. It writes no row; the variables it changes
        are the caller's to put back."""
        strategy = self.strategy
        if self._rerun is None:
            def measured(data: Any) -> Tensor:
                per_replica = strategy.run(self._measured, args=(data,))
                return tf.stack(strategy.experimental_local_results(per_replica))

            self._rerun = tf.function(measured, autograph=False)  # unconverted, as Keras runs the step
        data = strategy.experimental_distribute_values_from_function(
            lambda context: batches[context.replica_id_in_sync_group])
        assert self.hub is not None  # made with the train function, which ran the step being re-run
        with self.layer_probe.attached(), self.hub.attached():
            rows = self._rerun(data).numpy()
        return self.rows.record(step, np.concatenate([np.full((len(rows), 1), float(step)), rows], axis=1))

    def _measured(self, data: Data) -> Tensor:
        return self._row(self.original, data, tf.distribute.get_replica_context())[1]
