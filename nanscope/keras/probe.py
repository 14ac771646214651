"""The compiled side of NanScope: an instrumented `train_step` that writes one row of statistics per step.

Under `tf.distribute` (a model compiled under `strategy.scope()`), Keras runs
`train_step` once per replica. Each replica then sums the gradients it hands the
optimizer with the others' (one all-reduce, for the statistics only), gathers every
replica's row, and writes all of them into its own copy of an on-read buffer with a
replica axis; the host reads replica 0's copy and merges the rows with
`combine_replicas`, keeping per-replica non-finite counts. On one device none of
this is traced: the step is the same as without a strategy.
"""

import contextlib
import functools
import threading

from nanscope.engine.distributed import combine_replicas
from nanscope.engine.variable_stats import any_nonfinite_count, variable_rows
from nanscope.engine.probes import LayerRecorder
from nanscope.engine.records import StepRecord
from nanscope.engine.schema import OUTPUT, SCALARS, VARIABLE, Columns, StepLayout, join
from nanscope.engine.step import layer_loss_terms, probed_layers, relative_variable_names
from nanscope.keras.outputs import output_terms
from nanscope.internals import clip_gradients_hook, compile_loss, override, overridden, restore
from nanscope.runtime import tensorflow

tf, keras = tensorflow()


class StepProbe:
    """Wraps a Keras model's `train_step` so the compiled step also writes a row of statistics.

    Args:
        model: keras.Model, compiled. Its `train_step` and `train_function` are replaced
            by `attach()` and put back by `detach()`.
    """

    def __init__(self, model):
        self.model = model
        self.layers = probed_layers(model)
        self.trainable = list(model.trainable_variables)
        self.variable_names = relative_variable_names(self.trainable, model)
        self.per_execution = int(getattr(model, "steps_per_execution", 1) or 1)
        self.recorder = LayerRecorder(self.layers)
        self.output_names = multi_output_names(model)
        self.layout = StepLayout(outputs=len(self.output_names), layers=len(self.layers), terms=len(self.layers) + 1,
                                 variables=len(self.trainable))
        # A buffer row: HEAD, then the step's outputs flattened (engine/schema.py).
        self.width = len(HEAD) + self.layout.width
        self.strategy = model.distribute_strategy
        self.replicas = self.strategy.num_replicas_in_sync
        if self.replicas == 1:
            self.buffer = tf.Variable(tf.fill([self.per_execution, self.width], -1.0), trainable=False,
                                      name="nanscope_rows")
            self.counter = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="nanscope_step")
        else:
            self._distributed_buffer()
        self._saved = None
        self._next_step = 0

    def _distributed_buffer(self):
        """Buffer and counter that each replica writes in its own copy; reads return replica 0's."""
        on_read = {"trainable": False, "synchronization": tf.VariableSynchronization.ON_READ,
                   "aggregation": tf.VariableAggregation.ONLY_FIRST_REPLICA}
        # A row per replica, each one column wider: its own gradients' non-finite count.
        with self.strategy.scope():
            self.buffer = tf.Variable(tf.fill([self.per_execution, self.replicas, self.width + 1], -1.0),
                                      name="nanscope_rows", **on_read)
            self.counter = tf.Variable(tf.constant(0, tf.int64), name="nanscope_step", **on_read)

    def attach(self):
        """Replace `train_step` with the instrumented one and rebuild the train function around it."""
        model = self.model
        self._saved = (override(model, "train_step", self._instrumented(model.train_step)), model.train_function)
        model.make_train_function(force=True)
        if self.replicas > 1:
            model.train_function = self._hooked_per_call(model.train_function)
        model.train_function = self._detaching_on_error(model.train_function)

    def detach(self):
        """Put `train_step` and the train function back as they were found."""
        if self._saved is None:
            return
        step, function = self._saved
        self._saved = None
        restore(step)
        self.model.train_function = function

    def _hooked_per_call(self, function):
        """The train function with the layer and optimizer hooks attached for each call (under tf.distribute)."""
        self._hub = StepCapture(self.model, self.trainable)
        self._hub._thread = threading.local()

        @functools.wraps(function)
        def train_function(iterator):
            with self.recorder.attached(), self._hub.attached():
                return function(iterator)

        return train_function

    def _detaching_on_error(self, function):
        # Keras calls on_train_end only when fit returns: an error inside a step must
        # still leave the model as it was found. StopIteration ends every epoch.
        @functools.wraps(function)
        def train_function(iterator):
            try:
                return function(iterator)
            except StopIteration:
                raise
            except BaseException:
                self.detach()
                raise

        return train_function

    def read(self):
        """StepRecord inputs for the steps finished since the last read: list of (step, row) pairs.

        Under tf.distribute a row holds every replica's row (a leading replica axis).
        """
        # `value()` is one read; `numpy()` on the variable adds an identity op, which costs as
        # much again on every step. Under tf.distribute, `numpy()` reads replica 0's copy.
        rows = self.buffer.value().numpy() if self.replicas == 1 else self.buffer.numpy()
        fresh = sorted(((int(row.flat[0]), row) for row in rows if row.flat[0] >= self._next_step),
                       key=lambda pair: pair[0])
        if fresh:
            self._next_step = fresh[-1][0] + 1
        return fresh

    def record(self, step, row):
        """A StepRecord from one buffer row (under tf.distribute: one row per replica, merged)."""
        if row.ndim == 2:
            return self._replica_record(step, row)
        scalars, layer_stats, terms, var_stats = self.layout.split(row[len(HEAD):])
        return StepRecord.from_arrays(step, int(row[HEAD.at("batch_rows")]), scalars, layer_stats, terms, var_stats)

    def _replica_record(self, step, rows):
        # Each replica's row ends in one more column: its own gradients' non-finite count.
        scalars, layer_stats, terms, var_stats = self.layout.split(rows[:, len(HEAD):-1])
        counts = rows[:, [HEAD.at("batch_rows"), -1]]
        return combine_replicas(step, int(counts[:, 0].sum()), scalars, layer_stats, terms, var_stats, counts)

    def _instrumented(self, original):
        if self.replicas > 1:
            return self._instrumented_per_replica(original)

        @functools.wraps(original)
        def train_step(data):
            capture = StepCapture(self.model, self.trainable, outputs=len(self.output_names))
            self.recorder.begin()
            with self.recorder.attached(), capture.attached():
                logs = original(data)
            self._write_row(capture.row(data, logs, self.recorder.stats_matrix(), self.layers))
            return logs

        return train_step

    def _instrumented_per_replica(self, original):
        # Replica threads take turns while one step is traced: the layer and optimizer hooks
        # are attached once, around the train function (`_hooked_per_call`), and each
        # thread's hooks write into that thread's own capture.
        @functools.wraps(original)
        def train_step(data):
            context = tf.distribute.get_replica_context()
            self.recorder.begin_replica(int(tf.get_static_value(context.replica_id_in_sync_group)))
            capture = StepCapture(self.model, self.trainable, context, self.replicas, outputs=len(self.output_names))
            self._hub._thread.capture = capture
            logs = original(data)
            row = capture.row(data, logs, self.recorder.stats_matrix(), self.layers)
            self._write_replica_rows(context, tf.concat([row, tf.stack([capture.local_nonfinite])], axis=0))
            return logs

        return train_step

    def _write_replica_rows(self, context, row):
        rows = context.all_gather(row[None], axis=0)
        step = self.counter.assign_add(1) - 1
        rows = tf.concat([tf.fill([self.replicas, 1], tf.cast(step, tf.float32)), rows], axis=1)
        slot = tf.reshape(step % self.per_execution, [1, 1])
        # On-read variables take whole assignments only (no scatter) in a replica.
        self.buffer.assign(tf.tensor_scatter_nd_update(tf.convert_to_tensor(self.buffer), slot, rows[None]))

    def _write_row(self, stats):
        step = self.counter.assign_add(1) - 1
        row = tf.concat([tf.cast(tf.stack([step]), tf.float32), stats], axis=0)
        slot = tf.reshape(step % self.per_execution, [1, 1])
        self.buffer.scatter_nd_update(slot, row[None])

    @property
    def call_order(self):
        """Probed layer names in execution order, as seen when the step was traced."""
        return [self.layers[i].name for i in self.recorder.call_order]


# The columns a buffer row starts with, before the step's outputs.
HEAD = Columns("step", "batch_rows")


class StepCapture:
    """What one traced train step computed, caught from `compute_loss` and the optimizer.

    Only tensors of the step's own graph are kept: a call from inside a nested graph
    (a `cond` branch under gradient accumulation) cannot hand its tensors out.
    """

    def __init__(self, model, trainable, replica_context=None, replicas=1, outputs=0):
        self.model, self.trainable, self.outputs = model, trainable, outputs
        self.replica_context, self.replicas = replica_context, replicas
        self.local_nonfinite = tf.constant(0.0)
        self._thread = None  # a threading.local naming each replica thread's capture, on the shared hooks
        self.optimizer = model.optimizer
        self.loss = self.y_pred = self.applied = None
        self.grads, self.before, self.after = {}, {}, {}
        self.graph = tf.compat.v1.get_default_graph()

    @contextlib.contextmanager
    def attached(self):
        targets = [(self.model, "compute_loss", self._on_compute_loss)]
        if self.optimizer is not None:
            targets += [(self.optimizer, "apply", self._on_apply), clip_gradients_hook(self.optimizer, self._on_clip)]
        with overridden(targets):
            yield self

    def _here(self):
        return tf.compat.v1.get_default_graph() is self.graph

    def _active(self):
        """The capture of the calling replica thread (see `StepProbe`), or this one on one device."""
        return getattr(self._thread, "capture", self) if self._thread is not None else self

    def _on_compute_loss(self, compute_loss):
        @functools.wraps(compute_loss)
        def hooked(*args, **kwargs):
            loss = compute_loss(*args, **kwargs)
            c = self._active()
            if c._here():
                c.loss = loss
                c.y_pred = kwargs["y_pred"] if "y_pred" in kwargs else (args[2] if len(args) > 2 else None)
            return loss

        return hooked

    def _on_apply(self, apply):
        @functools.wraps(apply)
        def hooked(grads, trainable_variables=None):
            grads = list(grads)
            c = self._active()
            variables = list(trainable_variables) if trainable_variables is not None else list(c.trainable)
            if c._here():
                scale = c.optimizer.loss_scale_factor
                for g, v in zip(c._summed(grads), variables):
                    if g is not None:
                        c.grads[id(v)] = g if scale is None else g / scale
                    c.before[id(v)] = tf.convert_to_tensor(v)
            result = apply(grads, trainable_variables)
            if c._here():
                c.after = {id(v): tf.convert_to_tensor(v) for v in variables}
            return result

        return hooked

    def _summed(self, grads):
        """Under tf.distribute, the gradient of the whole batch (all replicas summed), for the statistics.

        The replica's own non-finite gradient entries are counted first. The optimizer
        still gets the replica's own gradients, and sums them itself.
        """
        if self.replica_context is None:
            return grads
        present = [g for g in grads if g is not None]
        self.local_nonfinite = _count(present)
        summed = iter(self.replica_context.all_reduce(tf.distribute.ReduceOp.SUM, present) if present else [])
        return [None if g is None else next(summed) for g in grads]

    def _on_clip(self, clip):
        @functools.wraps(clip)
        def hooked(grads):
            clipped = clip(grads)
            c = self._active()
            if c._here():
                c.applied = [g for g in c._summed(clipped) if g is not None]
            return clipped

        return hooked

    def row(self, data, logs, layer_stats, layers):
        """[batch rows, then the step's outputs joined as engine/schema.py lays them out]: one float32 row."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        flat_x = [t for t in tf.nest.flatten(x) if t is not None]
        rows = tf.cast(tf.shape(flat_x[0])[0], tf.float32) if flat_x else tf.constant(0.0)
        var_rows, grad_norm, applied_norm = self._variable_rows()
        total = self.loss if self.loss is not None else logs.get("loss", tf.constant(float("nan")))
        total = tf.cast(tf.reduce_sum(total), tf.float32)
        if self.replicas > 1:
            total = total * self.replicas  # Keras divides each replica's loss by the replica count
        terms = layer_loss_terms(layers, self.model)
        values = {
            "loss": total, "data_loss": total - tf.add_n(terms), "x_nonfinite": _count(flat_x),
            "y_nonfinite": _count(tf.nest.flatten(y) if y is not None else []),
            "output_nonfinite": _count(tf.nest.flatten(self.y_pred) if self.y_pred is not None else []),
            "loss_nonfinite": tf.cast(tf.logical_not(tf.math.is_finite(total)), tf.float32),
            "grad_global_norm": grad_norm,
            "grad_nonfinite": tf.reduce_sum(var_rows[:, VARIABLE.at("grad_nonfinite")]),
            "weights_nonfinite": tf.reduce_sum(var_rows[:, VARIABLE.at("weight_nonfinite")]),
            "applied_grad_global_norm": applied_norm,
        }
        # Columns this probe does not measure (loss scaling) are 0, which records read as "not known".
        scalars = tf.stack(SCALARS.pack(values, default=tf.constant(0.0)) + self._output_columns(y, sample_weight))
        return tf.concat([tf.stack([rows]), join([scalars, layer_stats, tf.stack(terms), var_rows])], axis=0)

    def _output_columns(self, y, sample_weight):
        """OUTPUT's columns per output of a multi-output model: its own loss, non-finite targets and prediction."""
        if not self.outputs:
            return []
        terms = output_terms(self.model, y, self.y_pred, sample_weight)
        if len(terms) != self.outputs:  # targets that cannot be paired with the outputs: nothing to split
            return [tf.constant(0.0)] * (self.outputs * len(OUTPUT))
        return [column for loss, target, prediction in terms for column in OUTPUT.pack({
            "loss": loss, "target_nonfinite": _count(tf.nest.flatten(target)),
            "prediction_nonfinite": _count(tf.nest.flatten(prediction))})]

    def _variable_rows(self):
        """variable_rows over what the optimizer saw; a variable without a gradient counts as unchanged."""
        after = [self.after.get(id(v), v) for v in self.trainable]
        before = [self.before.get(id(v), a) for v, a in zip(self.trainable, after)]
        grads = [self.grads.get(id(v), tf.zeros_like(tf.convert_to_tensor(v))) for v in self.trainable]
        return variable_rows(grads, before, after, self.applied)


def _count(tensors):
    counts = [any_nonfinite_count(t) for t in tensors if t is not None]
    return tf.add_n(counts) if counts else tf.constant(0.0)


def multi_output_names(model):
    """Names of a compiled multi-output model's outputs, in Keras' flattened order; [] for one output.

    Known before the first step only for models with symbolic outputs (functional,
    Sequential with an Input); a subclassed model's outputs are not split.
    """
    try:
        count = len(model.outputs or [])
    except (AttributeError, ValueError):
        return []
    if count < 2 or compile_loss(model) is None:
        return []
    names = list(getattr(model, "output_names", None) or [])
    return names if len(names) == count else [f"output_{i}" for i in range(count)]

