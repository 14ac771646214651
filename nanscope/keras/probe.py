"""The compiled side of NanScope: an instrumented `train_step` that writes one row of statistics per step."""

import contextlib
import functools

from nanscope.engine.flat import any_nonfinite_count, variable_rows
from nanscope.engine.probes import LAYER_COLUMNS, LayerRecorder
from nanscope.engine.records import StepRecord
from nanscope.engine.step import (
    SCALAR_COLUMNS, VARIABLE_COLUMNS, layer_loss_terms, probed_layers, relative_variable_names,
)
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
        self.width = (len(HEAD) + len(SCALAR_COLUMNS) + len(self.layers) * len(LAYER_COLUMNS) + len(self.layers) + 1
                      + len(self.trainable) * len(VARIABLE_COLUMNS))
        self.buffer = tf.Variable(tf.fill([self.per_execution, self.width], -1.0), trainable=False, name="nanscope_rows")
        self.counter = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="nanscope_step")
        self._saved = None
        self._next_step = 0

    def attach(self):
        """Replace `train_step` with the instrumented one and rebuild the train function around it."""
        model = self.model
        self._saved = (model.__dict__.get("train_step"), model.train_function)
        object.__setattr__(model, "train_step", self._instrumented(model.train_step))
        model.make_train_function(force=True)
        model.train_function = self._detaching_on_error(model.train_function)

    def detach(self):
        """Put `train_step` and the train function back as they were found."""
        if self._saved is None:
            return
        step, function = self._saved
        self._saved = None
        if step is None:
            object.__delattr__(self.model, "train_step")
        else:
            object.__setattr__(self.model, "train_step", step)
        self.model.train_function = function

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
        """StepRecord inputs for the steps finished since the last read: list of (step, row) pairs."""
        rows = self.buffer.numpy()
        fresh = sorted((int(row[0]), row) for row in rows if row[0] >= self._next_step)
        if fresh:
            self._next_step = fresh[-1][0] + 1
        return fresh

    def record(self, step, row):
        """A StepRecord from one buffer row."""
        n_layers, n_vars = len(self.layers), len(self.trainable)
        at = len(HEAD)
        scalars, at = row[at:at + len(SCALAR_COLUMNS)], at + len(SCALAR_COLUMNS)
        layer_stats, at = row[at:at + n_layers * len(LAYER_COLUMNS)], at + n_layers * len(LAYER_COLUMNS)
        terms, at = row[at:at + n_layers + 1], at + n_layers + 1
        var_stats = row[at:]
        return StepRecord.from_arrays(step, int(row[1]), scalars, layer_stats.reshape(n_layers, len(LAYER_COLUMNS)),
                                      terms, var_stats.reshape(n_vars, len(VARIABLE_COLUMNS)))

    def _instrumented(self, original):
        @functools.wraps(original)
        def train_step(data):
            capture = StepCapture(self.model, self.trainable)
            self.recorder.begin()
            with self.recorder.attached(), capture.attached():
                logs = original(data)
            self._write_row(capture.row(data, logs, self.recorder.stats_matrix(), self.layers))
            return logs

        return train_step

    def _write_row(self, stats):
        step = self.counter.assign_add(1) - 1
        row = tf.concat([tf.cast(tf.stack([step]), tf.float32), stats], axis=0)
        slot = tf.reshape(step % self.per_execution, [1, 1])
        self.buffer.scatter_nd_update(slot, row[None])

    @property
    def call_order(self):
        """Probed layer names in execution order, as seen when the step was traced."""
        return [self.layers[i].name for i in self.recorder.call_order]


HEAD = ("step", "batch_rows")


class StepCapture:
    """What one traced train step computed, caught from `compute_loss` and the optimizer.

    Only tensors of the step's own graph are kept: a call from inside a nested graph
    (a `cond` branch under gradient accumulation) cannot hand its tensors out.
    """

    def __init__(self, model, trainable):
        self.model, self.trainable = model, trainable
        self.optimizer = model.optimizer
        self.loss = self.y_pred = self.applied = None
        self.grads, self.before, self.after = {}, {}, {}
        self.graph = tf.compat.v1.get_default_graph()

    @contextlib.contextmanager
    def attached(self):
        targets = [(self.model, "compute_loss", self._on_compute_loss)]
        if self.optimizer is not None:
            targets += [(self.optimizer, "apply", self._on_apply), (self.optimizer, "_clip_gradients", self._on_clip)]
        saved = []
        try:
            for owner, name, hook in targets:
                saved.append((owner, name, owner.__dict__.get(name)))
                object.__setattr__(owner, name, hook(getattr(owner, name)))
            yield self
        finally:
            for owner, name, previous in reversed(saved):
                if previous is None:
                    object.__delattr__(owner, name)
                else:
                    object.__setattr__(owner, name, previous)

    def _here(self):
        return tf.compat.v1.get_default_graph() is self.graph

    def _on_compute_loss(self, compute_loss):
        @functools.wraps(compute_loss)
        def hooked(*args, **kwargs):
            loss = compute_loss(*args, **kwargs)
            if self._here():
                self.loss = loss
                self.y_pred = kwargs["y_pred"] if "y_pred" in kwargs else (args[2] if len(args) > 2 else None)
            return loss

        return hooked

    def _on_apply(self, apply):
        @functools.wraps(apply)
        def hooked(grads, trainable_variables=None):
            grads = list(grads)
            variables = list(trainable_variables) if trainable_variables is not None else list(self.trainable)
            if self._here():
                scale = self.optimizer.loss_scale_factor
                for g, v in zip(grads, variables):
                    if g is not None:
                        self.grads[id(v)] = g if scale is None else g / scale
                    self.before[id(v)] = tf.convert_to_tensor(v)
            result = apply(grads, trainable_variables)
            if self._here():
                self.after = {id(v): tf.convert_to_tensor(v) for v in variables}
            return result

        return hooked

    def _on_clip(self, clip):
        @functools.wraps(clip)
        def hooked(grads):
            clipped = clip(grads)
            if self._here():
                self.applied = [g for g in clipped if g is not None]
            return clipped

        return hooked

    def row(self, data, logs, layer_stats, layers):
        """[batch rows, scalars, layer stats, layer loss terms, variable stats] flattened into one float32 row."""
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        flat_x = [t for t in tf.nest.flatten(x) if t is not None]
        rows = tf.cast(tf.shape(flat_x[0])[0], tf.float32) if flat_x else tf.constant(0.0)
        var_rows, grad_norm, applied_norm = self._variable_rows()
        total = self.loss if self.loss is not None else logs.get("loss", tf.constant(float("nan")))
        total = tf.cast(tf.reduce_sum(total), tf.float32)
        terms = layer_loss_terms(layers, self.model)
        values = {
            "loss": total, "data_loss": total - tf.add_n(terms), "x_nonfinite": _count(flat_x),
            "y_nonfinite": _count(tf.nest.flatten(y) if y is not None else []),
            "output_nonfinite": _count(tf.nest.flatten(self.y_pred) if self.y_pred is not None else []),
            "loss_nonfinite": tf.cast(tf.logical_not(tf.math.is_finite(total)), tf.float32),
            "grad_global_norm": grad_norm,
            "grad_nonfinite": tf.reduce_sum(var_rows[:, 1]),
            "weights_nonfinite": tf.reduce_sum(var_rows[:, 5]),
            "applied_grad_global_norm": applied_norm,
        }
        # Columns this probe does not measure (loss scaling) are 0, which records read as "not known".
        scalars = tf.stack([values.get(column, tf.constant(0.0)) for column in SCALAR_COLUMNS])
        parts = [tf.stack([rows]), scalars, tf.reshape(layer_stats, [-1]), tf.stack(terms), tf.reshape(var_rows, [-1])]
        return tf.concat(parts, axis=0)

    def _variable_rows(self):
        """variable_rows over what the optimizer saw; a variable without a gradient counts as unchanged."""
        after = [self.after.get(id(v), v) for v in self.trainable]
        before = [self.before.get(id(v), a) for v, a in zip(self.trainable, after)]
        grads = [self.grads.get(id(v), tf.zeros_like(tf.convert_to_tensor(v))) for v in self.trainable]
        return variable_rows(grads, before, after, self.applied)


def _count(tensors):
    counts = [any_nonfinite_count(t) for t in tensors if t is not None]
    return tf.add_n(counts) if counts else tf.constant(0.0)
