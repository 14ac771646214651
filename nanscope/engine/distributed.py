"""The instrumented train step under `tf.distribute.MirroredStrategy`: one row of statistics per replica.

`DistributedStep` has `InstrumentedStep`'s interface. Its compiled function takes
the snapshot in cross-replica context, then runs one replica function per device
with `strategy.run`. Each replica takes its share of the batch (rows
`[n * r // R, n * (r + 1) // R)`), weights its mean loss by that share and sums the
gradients of all replicas with one all-reduce, so every replica sees the gradient
of the whole batch: statistics, `grad_transform` and the optimizer's own clipping
act on it exactly as on one device. Every replica hands that gradient to the
optimizer, whose own all-reduce of the replicas' gradients is skipped: every execution
of a cross-replica collective keeps ~1.5 KB in TensorFlow for good, so the step runs
one. (An optimizer without that all-reduce to skip gets the gradient from replica 0 and
zeros from the others, which it sums.) Each replica returns its own reductions; `combine_replicas`
merges them into one `StepRecord` on the host and keeps, per replica, how many
non-finite values its batch, its outputs and its own gradients held.

Under `MultiWorkerMirroredStrategy` (W workers, R replicas each) every worker holds
the whole batch: worker `w` takes rows `[n * w // W, n * (w + 1) // W)` and its
replicas split that range as above. A worker sees only its own replicas' results, so
each replica writes what differs between replicas (losses, non-finite counts, layer
rows) into its own slot of a zero matrix that rides the gradients' all-reduce: the
gradients and every replica's row cross the cluster in one collective, and every worker
builds the same record of the whole step. The row also carries each worker's stop
request (Ctrl-C), so every worker stops after the same step.

The state before the update (the weights, and under the guard the optimizer's variables) is
copied into mirrored variables, every device its own values (`_take_snapshots`), so the guard's
skip, rollback and re-runs work as on one device, and each re-run gives each replica its rows.
"""

from typing import Any

import numpy as np

from nanscope import interrupt
from nanscope.data import inputs
from nanscope.data.targets import Arrays
from nanscope.engine.variable_stats import any_nonfinite_count
from nanscope.engine.records import StepRecord
from nanscope.engine.schema import LAYER, OUTPUT, SCALARS, combined_layer_rows, output_offsets
from nanscope.engine.step import InstrumentedStep, StepLoss
from nanscope.tf_types import GradTransform
from nanscope.engine.model_view import keras_gradients, layer_loss_terms
from nanscope.tf_types import Optimizer, Tensor
from nanscope.internals import overridden
from nanscope.model.models import LoadedModel
from nanscope.runtime import tensorflow


def mirrored_strategy() -> Any:
    """A MirroredStrategy over every GPU, or over every logical CPU when there is no GPU."""
    tf, _ = tensorflow()
    if tf.config.list_logical_devices("GPU"):
        return tf.distribute.MirroredStrategy()
    devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(devices=devices)


class DistributedStep(InstrumentedStep):
    """A compiled, instrumented train step whose batch is split over the replicas of a strategy.

    The model and the optimizer must have been created under `strategy.scope()`.

    Args:
        strategy: tf.distribute.MirroredStrategy.
        model: LoadedModel.
        loss: losses.Loss.
        optimizer: keras.Optimizer. Built here, under the strategy's scope.
        sample_x: np.ndarray. A batch of inputs, used for shapes and to build the model.
        sample_y: np.ndarray. The matching targets.
        grad_transform: callable(list of grads) -> list of grads, optional. Applied to the
            whole batch's gradients, on every replica.
        workers: int, default 1. Workers of a MultiWorkerMirroredStrategy, each with the same
            number of replicas.

    Example:
        with strategy.scope():
            model, optimizer = ...
        step = DistributedStep(strategy, model, loss, optimizer, x[:32], y[:32])
        record = step.run(0, x[:32], y[:32])
        record.replica_nonfinite   # [0, 0]
    """

    # Each step goes through `strategy.run` with host-split batches: one call per step.
    chunkable = False
    # The inherited light step would train outside `strategy.run`, on one device: every step runs in full.
    runs_light = False

    def __init__(self, strategy: Any, model: LoadedModel, loss: StepLoss, optimizer: Optimizer, sample_x: Arrays,
                 sample_y: Arrays, grad_transform: GradTransform | None = None, source: str | None = None,
                 workers: int = 1) -> None:
        tf, _ = tensorflow()
        self.strategy = strategy
        self.replicas = strategy.num_replicas_in_sync
        self.workers = workers
        self.local_replicas = self.replicas // workers
        # 1.0 when this worker was asked to stop; gathered with the counts (multi-worker only).
        self._stop = tf.Variable(0.0, trainable=False, name="nanscope_stop") if workers > 1 else None
        self.stop_requested_by: list[int] = []  # the workers whose stop request the last step carried
        # The optimizer's slots and the snapshot must be mirrored variables.
        with strategy.scope():
            super().__init__(model, loss, optimizer, sample_x, sample_y, jit_compile=False,
                             grad_transform=grad_transform, source=source)

    def _step(self, x: Any, y: Any) -> tuple[Tensor, ...]:
        tf, _ = tensorflow()
        self._recorder.begin()
        self._take_snapshots()
        with overridden(self._keras_sum_skipped):
            per_replica = self.strategy.run(self._replica_step, args=(x, y))
        if self.workers > 1:  # every replica holds the gathered rows: this worker's first one's are enough
            return tuple(self.strategy.experimental_local_results(part)[0] for part in per_replica)
        return tuple(tf.stack(self.strategy.experimental_local_results(part)) for part in per_replica)

    def keep_optimizer_state(self) -> None:
        """As InstrumentedStep's; the copies are mirrored variables, as the optimizer's, made under the
        strategy's scope and taken with the weights' (`_take_snapshots`)."""
        with self.strategy.scope():
            super().keep_optimizer_state()

    def _take_snapshots(self) -> None:
        """Copy the state before the update, in cross-replica context: every device copies its own component of
        each variable into its own component of the copy, so the copy moves nothing between devices and launches
        no collective (a plain `assign` would send the first device's value to every other)."""
        tf, _ = tensorflow()

        def copy_local(copy: Any, variable: Any) -> Any:
            return copy.assign(tf.convert_to_tensor(variable))  # read in the update context: this device's value

        for snapshot in self.state.snapshots():
            for copy, variable in zip(snapshot.copies, snapshot.variables):
                self.strategy.extended.update(copy, copy_local, args=(variable,), group=False)

    def replica_rows(self, rows: Any, replica: int) -> tuple[Any, Any]:
        """(start, end) of `replica`'s rows in a batch of `rows`: its worker's range, split over its replicas."""
        worker, local = divmod(replica, self.local_replicas)
        first, last = self.worker_rows(rows, worker)
        share, count = last - first, self.local_replicas
        return first + share * local // count, first + share * (local + 1) // count

    def worker_rows(self, rows: Any, worker: int) -> tuple[Any, Any]:
        """(start, end) of `worker`'s rows in a batch of `rows`: `[n * w // W, n * (w + 1) // W)`."""
        return rows * worker // self.workers, rows * (worker + 1) // self.workers

    def _replica_step(self, x: Any, y: Any) -> tuple[Tensor, ...]:
        tf, _ = tensorflow()
        context = tf.distribute.get_replica_context()
        replica = int(tf.get_static_value(context.replica_id_in_sync_group))
        self._recorder.begin_replica(replica)
        rows = tf.shape(tf.nest.flatten(x)[0])[0]
        start, end = self.replica_rows(rows, replica)
        x, y = (tf.nest.map_structure(lambda t: t[start:end], part) for part in (x, y))
        share = tf.cast(end - start, tf.float32) / tf.cast(rows, tf.float32)
        with tf.GradientTape() as tape:
            with self.raised_by("model"):
                y_pred = self.predictions(self.model.call(x, training=True))
            with self.raised_by("train.loss"):
                output_losses = self.loss.terms(y, y_pred)  # each the replica's own mean loss
                data_loss = self.loss.total(output_losses)
            own_terms = layer_loss_terms(self.layers, self.model.keras_model)
            terms = tf.add_n([tf.reduce_sum(t) for t in own_terms]) if own_terms else 0.0
            total = data_loss + terms
            # Summed over replicas: the whole batch's mean loss, and the loss terms once.
            objective = data_loss * share + terms / self.replicas
        raw = tape.gradient(objective, self.trainable)
        local = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(raw, self.trainable)]
        local_nonfinite = tf.add_n([any_nonfinite_count(g) for g in local]) if local else tf.constant(0.0)
        counts = tf.stack([tf.cast(end - start, tf.float32), local_nonfinite])
        # Without a transform the optimizer gets an Embedding's IndexedSlices, summed over the replicas as such, as
        # in Keras' own distributed step (a dense sum of zeros would move the rows no batch used by their moments).
        sent = keras_gradients(raw, local) if self.grad_transform is None else local
        if self.workers > 1:
            # What differs between replicas rides the gradients' all-reduce, each replica's row in its own slot
            # of a zero matrix: one collective a step carries the gradients and every replica's row.
            row = self._replica_row(x, y, y_pred, total, data_loss, output_losses, counts)
            slotted = tf.scatter_nd([[replica]], row[None], [self.replicas, row.shape[0]])
            *summed, gathered = context.all_reduce(tf.distribute.ReduceOp.SUM, [*sent, slotted])
        else:
            summed = context.all_reduce(tf.distribute.ReduceOp.SUM, sent)
        grads = [tf.convert_to_tensor(g) for g in summed]  # dense, for the statistics
        applied = self.grad_transform(grads) if self.grad_transform is not None else grads
        handed = keras_gradients(summed, applied) if self.grad_transform is None else applied
        handed = handed if replica == 0 or self._keras_sum_skipped else [_zeros_like(g) for g in handed]
        with self.raised_by("train.optimizer"):
            self.optimizer.apply_gradients(zip(handed, self.trainable))
        # Replica threads take turns only inside the all-reduce and the optimizer: set here, read by _outputs.
        self._loss_terms = own_terms
        scalars, layer_stats, layer_terms, var_stats = self._outputs(
            x, y, y_pred, total, data_loss, grads, applied, None, output_losses)
        if self.workers == 1:
            return scalars, layer_stats, layer_terms, var_stats, counts
        return gathered, scalars, layer_terms, var_stats

    def _replica_row(self, x: Any, y: Any, y_pred: Any, total: Tensor, data_loss: Tensor, output_losses: list[Tensor],
                     counts: Tensor) -> Tensor:
        """This replica's own measurements, flat: REPLICA_SCALARS, per-output columns, layer stats, counts, stop."""
        tf, _ = tensorflow()
        targets = [any_nonfinite_count(t) for t in tf.nest.flatten(y)]
        predictions = [self._prediction_nonfinite(t) for t in tf.nest.flatten(y_pred)]
        total = tf.cast(total, tf.float32)
        own = [total, tf.cast(data_loss, tf.float32), tf.add_n([any_nonfinite_count(t) for t in tf.nest.flatten(x)]),
               tf.add_n(targets), tf.add_n(predictions), tf.cast(tf.logical_not(tf.math.is_finite(total)), tf.float32)]
        if self.loss.multi_output:
            own += [tf.cast(c, tf.float32) for row in zip(output_losses, targets, predictions) for c in row]
        return tf.concat([tf.stack(own), tf.reshape(self._recorder.stats_matrix(), [-1]), counts,
                          tf.reshape(self._stop, [1])], axis=0)

    def run(self, step: int, x: Arrays, y: Arrays) -> StepRecord:
        """Run one train step on a batch split over the replicas and return its StepRecord."""
        if self.workers > 1:
            return self._run_gathered(step, x, y)
        scalars, layer_stats, layer_terms, var_stats, counts = (t.numpy() for t in self._traced()(x, y))
        return combine_replicas(step, inputs.rows(x), scalars, layer_stats, layer_terms, var_stats, counts)

    def _run_gathered(self, step: int, x: Arrays, y: Arrays) -> StepRecord:
        assert self._stop is not None  # made for every step with more than one worker, the steps gathered
        self._stop.assign(1.0 if interrupt.requested() else 0.0)
        gathered, scalars, layer_terms, var_stats = (t.numpy() for t in self._traced()(x, y))
        own = [SCALARS.at(name) for name in REPLICA_SCALARS]
        if self.loss.multi_output:
            own += list(range(len(SCALARS), len(SCALARS) + len(OUTPUT) * len(self.loss.outputs)))  # OUTPUT per output
        per_replica = np.tile(scalars, (len(gathered), 1))  # what the summed gradient gives is the same everywhere
        per_replica[:, own] = gathered[:, :len(own)]
        layers = len(self.layers)
        layer_stats = gathered[:, len(own):len(own) + layers * len(LAYER)].reshape(len(gathered), layers, len(LAYER))
        counts, stops = gathered[:, -3:-1], gathered[:, -1]
        record = combine_replicas(step, inputs.rows(x), per_replica, layer_stats, layer_terms[None], var_stats[None],
                                  counts)
        per_worker = [slice(w * self.local_replicas, (w + 1) * self.local_replicas) for w in range(self.workers)]
        record.worker_nonfinite = [int(sum(record.replica_nonfinite[part])) for part in per_worker]
        self.stop_requested_by = [w for w, part in enumerate(per_worker) if stops[part].any()]
        return record


# Non-finite counts of a replica's own share of the step: its batch and its model outputs.
_REPLICA_COUNTS = ("x_nonfinite", "y_nonfinite", "output_nonfinite")
# The scalars that differ between replicas (the others come from the summed gradient), in `_replica_row`'s order.
REPLICA_SCALARS = ("loss", "data_loss", "x_nonfinite", "y_nonfinite", "output_nonfinite", "loss_nonfinite")


def combine_replicas(step: int, batch_rows: int, scalars: np.ndarray, layer_stats: np.ndarray, layer_terms: np.ndarray,
                     var_stats: np.ndarray, counts: np.ndarray) -> StepRecord:
    """One StepRecord from the replicas' outputs (a leading replica axis on every array).

    Losses are weighted by each replica's share of the batch; counts and sizes add up;
    a layer's max |x| is the largest of the replicas'. Gradient, weight and loss-term
    statistics are of the summed gradient and the shared weights, the same on every
    replica, and are taken from replica 0.

    Args:
        counts: np.ndarray [R, 2]. Per replica: its rows, its own gradients' non-finite entries.
    """
    share = counts[:, 0] / max(float(counts[:, 0].sum()), 1.0)
    outputs = (scalars.shape[1] - len(SCALARS)) // len(OUTPUT)
    weighted = [SCALARS.at("loss"), SCALARS.at("data_loss"), *output_offsets("loss", outputs)]
    summed = [SCALARS.at(name) for name in _REPLICA_COUNTS] + [
        offset for name in OUTPUT if name != "loss" for offset in output_offsets(name, outputs)]
    merged = scalars[0].copy()
    with np.errstate(invalid="ignore", over="ignore"):
        merged[weighted] = (share[:, None] * scalars[:, weighted]).sum(axis=0)
    merged[summed] = scalars[:, summed].sum(axis=0)
    merged[SCALARS.at("loss_nonfinite")] = scalars[:, SCALARS.at("loss_nonfinite")].max()
    layers = combined_layer_rows(layer_stats)
    record = StepRecord.from_arrays(step, batch_rows, merged, layers, layer_terms[0], var_stats[0])
    own = scalars[:, [SCALARS.at(name) for name in _REPLICA_COUNTS]].sum(axis=1)
    record.replica_nonfinite = [int(v) for v in own + counts[:, 1]]
    return record


def _zeros_like(gradient: Any) -> Any:
    """Zeros in the form of `gradient`: a dense tensor, or IndexedSlices of zeros at the same rows."""
    tf, _ = tensorflow()
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(tf.zeros_like(gradient.values), gradient.indices, gradient.dense_shape)
    return tf.zeros_like(gradient)
