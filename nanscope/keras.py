"""`NanScope`: nanscope's per-step measurements inside `model.fit`, as a Keras callback.

A callback cannot see gradients, so `NanScope` wraps the model's `train_step` for the
duration of `fit`. The wrapper calls the original `train_step` (Keras' own or the
user's override, so `compute_loss`, metrics, clipping and loss scaling stay Keras'),
and while it is traced it listens in on `compute_loss` (loss, model output),
`optimizer.apply` (gradients, weights before and after), `_clip_gradients` (the
gradients actually applied) and every layer's `call` (`LayerRecorder`). The compiled
step writes one row of reduced statistics into a buffer variable with one row per
step of an execution, so `steps_per_execution > 1` still records every step;
`on_train_batch_end` reads the buffer (one small host transfer) and turns its new
rows into `StepRecord`s. When `fit` ends, `train_step` and `train_function` are put
back and the trace-steps report is built, printed and written.
"""

import contextlib
import functools
from pathlib import Path

import numpy as np

from nanscope.engine.probes import LAYER_COLUMNS, LayerRecorder, nonfinite_count
from nanscope.engine.records import StepRecord, expected_layer_indices
from nanscope.engine.step import SCALAR_COLUMNS, VARIABLE_COLUMNS, probed_layers, variable_name
from nanscope.report import FirstNonfinite, TraceReport
from nanscope.runtime import tensorflow

tf, keras = tensorflow()

__all__ = ["NanScope"]


class NanScope(keras.callbacks.Callback):
    """Record nanscope's per-step statistics during `fit`, stop at the first NaN/Inf, report why.

    Per step it records what `nanscope trace-steps` records: loss, gradient norms per
    variable and overall, per-layer output statistics and non-finite counts per phase.
    When training ends it attributes the first non-finite value to a phase and a layer
    or variable, runs the rule catalogue, prints the report and writes the
    `nanscope.trace/1` JSON. The model is left as it was found.

    Args:
        report: str or Path, default None. Write the JSON report here.
        stop_on_nonfinite: bool, default True. Stop training after the first non-finite step.
        verbose: int, default 1. 0 prints nothing; 1 prints the Rich report when training ends.
        console: rich.console.Console, default None. Where to print (default: stderr).
        tensorboard: str or Path, default None. Write per-step scalars to this TensorBoard log folder.
        trace: str or Path, default None. Write every step's record to this JSON-lines trace.
        expect_nonfinite: list of str, default (). fnmatch patterns of layer names whose
            non-finite outputs are intended (attention masks): reported, not counted.

    Example:
        model.fit(x, y, epochs=3, callbacks=[NanScope(report="nanscope.json")])
        callback.report.first_nonfinite   # FirstNonfinite or None
    """

    def __init__(self, report=None, stop_on_nonfinite=True, verbose=1, console=None, tensorboard=None, trace=None,
                 expect_nonfinite=()):
        super().__init__()
        if isinstance(expect_nonfinite, str):
            raise ValueError("`expect_nonfinite` must be a list of layer-name patterns. "
                             f"Received: expect_nonfinite={expect_nonfinite!r}")
        self.report_path = Path(report) if report else None
        self.stop_on_nonfinite = stop_on_nonfinite
        self.verbose = verbose
        self.console = console
        self.tensorboard = tensorboard
        self.trace = trace
        self.expect_nonfinite = list(expect_nonfinite)
        self.report = None
        self._probe = None

    def on_train_begin(self, logs=None):
        self._probe = StepProbe(self.model)
        self._log = FitLog(self, self._probe)
        self._probe.attach()

    def on_train_batch_end(self, batch, logs=None):
        if self._probe is None:
            return
        self._log.collect(self._probe.read())
        if self._log.first_nonfinite is not None and self.stop_on_nonfinite:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        if self._probe is not None:
            self._log.last_epoch_logs = dict(logs or {})

    def on_train_end(self, logs=None):
        if self._probe is None:
            return
        try:
            self._log.collect(self._probe.read())
        finally:
            self._probe.detach()
            self._probe = None
        self.report = self._log.finish()


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
        self.variable_names = _relative_names([variable_name(v) for v in self.trainable], model.name)
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
        var_rows, grad_sq = self._variable_rows()
        total = self.loss if self.loss is not None else logs.get("loss", tf.constant(float("nan")))
        total = tf.cast(tf.reduce_sum(total), tf.float32)
        terms = _layer_loss_terms(layers, self.model)
        applied = [tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in self.applied] if self.applied else grad_sq
        values = {
            "loss": total, "data_loss": total - tf.add_n(terms), "x_nonfinite": _count(flat_x),
            "y_nonfinite": _count(tf.nest.flatten(y) if y is not None else []),
            "output_nonfinite": _count(tf.nest.flatten(self.y_pred) if self.y_pred is not None else []),
            "loss_nonfinite": tf.cast(tf.logical_not(tf.math.is_finite(total)), tf.float32),
            "grad_global_norm": _root_sum(grad_sq),
            "grad_nonfinite": tf.add_n([r[1] for r in var_rows]) if var_rows else tf.constant(0.0),
            "weights_nonfinite": tf.add_n([r[5] for r in var_rows]) if var_rows else tf.constant(0.0),
            "applied_grad_global_norm": _root_sum(applied),
        }
        # Columns this probe does not measure (loss scaling) are 0, which records read as "not known".
        scalars = tf.stack([values.get(column, tf.constant(0.0)) for column in SCALAR_COLUMNS])
        parts = [tf.stack([rows]), scalars, tf.reshape(layer_stats, [-1]), tf.stack(terms)]
        if var_rows:
            parts.append(tf.reshape(tf.stack(var_rows), [-1]))
        return tf.concat(parts, axis=0)

    def _variable_rows(self):
        rows, grad_sq = [], []
        for variable in self.trainable:
            key = id(variable)
            after = tf.cast(self.after.get(key, tf.convert_to_tensor(variable)), tf.float32)
            before = tf.cast(self.before.get(key, after), tf.float32)
            grad = self.grads.get(key)
            sq = tf.reduce_sum(tf.square(tf.cast(grad, tf.float32))) if grad is not None else tf.constant(0.0)
            grad_sq.append(sq)
            rows.append(tf.stack([
                tf.sqrt(sq), nonfinite_count(grad) if grad is not None else tf.constant(0.0), tf.norm(before),
                tf.norm(after), tf.norm(after - before), nonfinite_count(after),
            ]))
        return rows, grad_sq


def _count(tensors):
    counts = [nonfinite_count(t) for t in tensors if t is not None]
    return tf.add_n(counts) if counts else tf.constant(0.0)


def _root_sum(squares):
    return tf.sqrt(tf.add_n(squares)) if squares else tf.constant(0.0)


def _layer_loss_terms(layers, model):
    """Per probed layer, then for the model itself, the sum of the loss terms it owns (add_loss, regularizers)."""
    rows = []
    for layer in [*layers, model]:
        own = list(layer._get_own_losses())
        if layer is not model:
            own += [v.regularizer(v) for v in getattr(layer, "_trainable_variables", []) if getattr(v, "regularizer", None)]
        rows.append(tf.add_n([tf.cast(tf.reduce_sum(t), tf.float32) for t in own]) if own else tf.constant(0.0))
    return rows


def _relative_names(names, model_name):
    prefix = f"{model_name}/"
    if names and all(n.startswith(prefix) for n in names):
        return [n[len(prefix):] for n in names]
    return names


class FitLog:
    """The host side of a NanScope run: records as they arrive, the first non-finite step, the report.

    Args:
        callback: NanScope. Its options (stop, verbose, console, outputs, expected layers).
        probe: StepProbe. The attached probe, for names and buffer rows.
    """

    def __init__(self, callback, probe):
        self.callback, self.probe = callback, probe
        self.model = callback.model
        self.records, self.first_nonfinite, self.dropped = [], None, 0
        self.last_epoch_logs = {}
        self.expected = expected_layer_indices(callback.expect_nonfinite, [layer.name for layer in probe.layers])
        self.report = TraceReport(
            run=describe_fit(self.model, callback.params or {}, probe), records=self.records,
            layers=[(layer.name, type(layer).__name__) for layer in probe.layers], layer_order=[],
            variables=probe.variable_names, trace_path=str(callback.trace) if callback.trace else None,
        )
        self.board = self._open_board() if callback.tensorboard else None
        self.writer = None

    def _open_board(self):
        from nanscope.tensorboard import TensorBoardLog

        return TensorBoardLog(self.callback.tensorboard, self.report.layers, self.report.variables)

    def collect(self, rows):
        """Turn fresh buffer rows into records; attribute the first non-finite one."""
        for step, row in rows:
            if self.first_nonfinite is not None and self.callback.stop_on_nonfinite:
                self.dropped += 1
                continue
            record = self.probe.record(step, row)
            record.expected_nonfinite = list(self.expected)
            self.records.append(record)
            self._write(record)
            if record.phase is not None and self.first_nonfinite is None:
                self.first_nonfinite = self._attribute(record)

    def _write(self, record):
        if self.board is not None:
            self.board.write(record)
        if self.callback.trace:
            from nanscope.trace import _record_json
            from nanscope.tracefile import TraceWriter

            if self.writer is None:
                self.report.layer_order = self.probe.call_order
                self.writer = TraceWriter(self.callback.trace, self.report.trace_header())
            self.writer.write({"kind": "step", **_record_json(record)})

    def _attribute(self, record):
        from nanscope.trace import _attribute_from_record

        if record.phase == "data":
            detail = [f"{name}: {count} non-finite value(s) in the batch"
                      for name, count in (("x", record.x_nonfinite), ("y", record.y_nonfinite)) if count]
            return FirstNonfinite(step=record.step, phase="data", detail=detail)
        return _attribute_from_record(record, _Layout(self.probe), None, None, None)

    def finish(self):
        """Build the report, print it and write its JSON; close the outputs."""
        from nanscope.rules.diagnose import diagnose

        report = self.report
        report.layer_order = self.probe.call_order
        report.first_nonfinite = self.first_nonfinite
        val_loss = self.last_epoch_logs.get("val_loss")
        if self.first_nonfinite is None and val_loss is not None:
            report.validation_loss = float(val_loss)
        report.notes.extend(self._notes())
        report.recommendations = diagnose(report, FitEvidence(report.run["loss"], self.model))
        self._close(report)
        if self.callback.verbose:
            from rich.console import Console

            from nanscope.render.trace_report import render_trace_report

            render_trace_report(report, self.callback.console or Console(stderr=True, soft_wrap=False))
        if self.callback.report_path is not None:
            from nanscope.jsonio import write_json

            write_json(str(self.callback.report_path), report.to_json())
        return report

    def _close(self, report):
        if self.board is not None:
            self.board.close()
        if self.writer is not None:
            from nanscope.trace import _summary_json

            self.writer.write({"kind": "summary", **_summary_json(report)})
            self.writer.close()

    def _notes(self):
        notes = ["recorded inside model.fit by nanscope.keras.NanScope; the failing step is not replayed op by op "
                 "(the callback keeps no batch), and the data-scale rules need the training arrays, which a callback "
                 "does not see: run `nanscope trace-steps` on a spec for those"]
        if self.probe.per_execution > 1:
            notes.append(f"steps_per_execution={self.probe.per_execution}: every step was recorded (a buffer row per "
                         "step of an execution)")
        if self.dropped:
            notes.append(f"{self.dropped} step(s) after the first non-finite one ran in the same execution "
                         "(steps_per_execution) before training could stop; their records are left out")
        for index in self.expected:
            bad = sum(1 for r in self.records if r.layers[index].nonfinite)
            if bad:
                notes.append(f"layer {self.probe.layers[index].name}: non-finite outputs on {bad} step(s), expected "
                             "(expect_nonfinite), not counted as a problem")
        return notes


class _Layout:
    """The names `trace._attribute_from_record` reads from an engine, taken from a StepProbe."""

    def __init__(self, probe):
        self.layer_info = [_LayerInfo(layer.name, type(layer).__name__) for layer in probe.layers]
        self.layer_call_order = probe.call_order
        self.variable_names = probe.variable_names


class _LayerInfo:
    def __init__(self, name, cls):
        self.name, self.cls = name, cls


class FitEvidence:
    """What `diagnose` reads from a Session, for a run that only saw `fit`: the loss name, no arrays.

    The data-scale detectors look at the training arrays; here they see one finite
    zero, so they find nothing rather than guess.
    """

    def __init__(self, loss_name, keras_model):
        self.loss = _Named(loss_name)
        self.model = _ModelView(keras_model)
        self.train = _NoArrays()


class _Named:
    def __init__(self, name):
        self.name = name


class _ModelView:
    def __init__(self, keras_model):
        self.keras_model = keras_model


class _NoArrays:
    x = np.zeros((1, 1), np.float32)
    y = np.zeros((1, 1), np.float32)
    feature_names = []


def describe_fit(model, params, probe):
    """The run header of a `fit` run, with the fields trace-steps' header has where they are known."""
    optimizer = model.optimizer
    config = optimizer.get_config() if optimizer is not None else {}
    shown = {k: config[k] for k in ("learning_rate", "momentum", "beta_1", "beta_2", "epsilon", "clipnorm",
                                     "global_clipnorm", "clipvalue") if config.get(k) is not None}
    epochs, steps = params.get("epochs"), params.get("steps")
    return {
        "spec": "model.fit (nanscope.keras.NanScope)",
        "model": f"{model.name} ({type(model).__name__}, {len(probe.layers)} layers)",
        "model_kind": "keras-fit",
        "parameters": int(model.count_params()),
        "data": "as given to fit",
        "train_rows": None,
        "validation_rows": None,
        "batch_size": None,
        "shuffle": None,
        "loss": _loss_name(getattr(model, "loss", None)),
        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
        "optimizer_config": {k: float(v) if isinstance(v, (int, float)) else v for k, v in shown.items()},
        "steps_requested": epochs * steps if epochs and steps else None,
        "seed": None,
        "jit_compile": bool(model.jit_compile),
        "steps_per_execution": probe.per_execution,
    }


def _loss_name(loss):
    if loss is None:
        return "compute_loss"
    if isinstance(loss, str):
        return loss
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__
