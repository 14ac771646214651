"""The compiled side of NanScope: an instrumented `train_step` that writes one row of statistics per step.

Under `tf.distribute` (a model compiled under `strategy.scope()`), Keras runs
`train_step` once per replica. Each replica then sums the gradients it hands the
optimizer with the others' (one all-reduce, for the statistics only), gathers every
replica's row, and writes all of them into its own copy of an on-read buffer with a
replica axis (`RowBuffer`). On one device none of this is traced: the step is the
same as without a strategy.

Under `jit_compile=True` the train function Keras builds around the step is left
without XLA, and the instrumented step is compiled by XLA on its own: the snapshot of
the state and the batch (a variable of any shape, which XLA cannot compile) is taken
between the two, outside XLA.

nanscope is a guest in the user's `fit`: a failure of its own code while the step is
traced is caught, kept in `failure`, and the step goes on uninstrumented.
"""

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from nanscope.engine.probes import LayerRecorder
from nanscope.engine.schema import join
from nanscope.engine.model_view import keras_sum_skipped, probed_layers, relative_variable_names
from nanscope.internals import (
    overridden, rebuild_train_function, replace_train_step, restore, set_train_function,
)
from nanscope.keras.capture import StepCapture
from nanscope.keras.model_parts import multi_output_names, training_optimizers
from nanscope.keras.moments import FeatureMoments
from nanscope.keras.rows import RowBuffer
from nanscope.keras.snapshot import StepSnapshot, not_absorbed, unexpected_layer_nonfinite
from nanscope.keras.trace_count import FirstTrace, makes_variables
from nanscope.runtime import tensorflow
from nanscope.tf_types import KerasModel, Optimizer, Tensor

if TYPE_CHECKING:
    from nanscope.engine.records import StepRecord
    from nanscope.guard.sentinel import SentinelRows

tf, keras = tensorflow()

# A step's batch as fit hands it to `train_step`, and what the step returns (its logs).
Data: TypeAlias = Any
Logs: TypeAlias = Any
# Keras' `train_step` (data -> logs) and train function (iterator -> logs).
TrainStep: TypeAlias = Callable[[Data], Logs]
TrainFunction: TypeAlias = Callable[[Any], Logs]


class StepProbe:
    """Wraps a Keras model's `train_step` so the compiled step also writes a row of statistics.

    Args:
        model: keras.Model, compiled and built. Its `train_step` and `train_function` are
            replaced by `attach()` and put back by `detach()`.
        expected: list of int. Indices of layers whose non-finite outputs are intended.
        forensics: bool, default True. Keep the state before each step and its batch on the
            device (one copy of the weights and of the optimizer's slots), for the replay.
        metrics: bool, default False. Copy the metrics' totals with that state (the guard puts
            them back with a skipped step).
        sentinel: int, default None. `mode="sentinel"`: every Nth execution runs the full step, the
            others only what detection needs (`nanscope.guard.sentinel`). One device only.
        built_ahead: bool, default False. nanscope made variables of the model (or of the optimizers) from the
            first batch, before the step's first trace would have (`keras.trace_count`).
    """

    sentinel: "SentinelRows | None"  # set in __init__ (where SentinelRows is imported only under mode="sentinel")

    def __init__(self, model: KerasModel, expected: Iterable[int] = (), forensics: bool = True, metrics: bool = False,
                 sentinel: int | None = None, built_ahead: bool = False) -> None:
        self.model = model
        self.optimizers = training_optimizers(model)
        optimizer = model.optimizer
        if optimizer in self.optimizers and not optimizer.built:
            # What Keras does on the first step, done before it.
            built_ahead = makes_variables(lambda: optimizer.build(model.trainable_variables)) or built_ahead
        self.first_trace = FirstTrace(built_ahead)
        self.layers = probed_layers(model)
        self.trainable = list(model.trainable_variables)
        self.variable_names = relative_variable_names(self.trainable, model)
        self.per_execution = int(getattr(model, "steps_per_execution", 1) or 1)
        self.layer_probe = LayerRecorder(self.layers)
        self.output_names = multi_output_names(model)
        self.strategy = model.distribute_strategy
        self.replicas = self.strategy.num_replicas_in_sync
        self.rows = RowBuffer(len(self.layers), len(self.trainable), len(self.output_names), self.per_execution,
                              self.strategy if self.replicas > 1 else None)
        self.expected = list(expected)
        self.snapshot: StepSnapshot | None = None
        self.forensics_off = "tf.distribute" if self.replicas > 1 else None
        if forensics and self.forensics_off is None:
            state = list(model.variables) + [v for optimizer in self.optimizers for v in optimizer.variables]
            self.snapshot = StepSnapshot(state, freezing=self.per_execution > 1,
                                         extra=list(model.metrics_variables) if metrics else ())
        # XLA compiles fixed shapes and the batch copy is a variable of any shape: under jit_compile=True
        # the snapshot is taken in a step of nanscope's own, not compiled, around the user's step compiled by XLA.
        self.xla_inside = bool(model.jit_compile) and self.snapshot is not None
        self.moments = FeatureMoments() if self.replicas == 1 else None
        self.original_step = model.train_step
        self.failure: Exception | None = None
        # Run on the host after each execution (the guard).
        self.after_execution: Callable[[Logs], Logs] | None = None
        self.sentinel = None
        if sentinel and self.replicas == 1:
            from nanscope.guard.sentinel import SentinelRows

            self.sentinel = SentinelRows(self.rows.counter, len(self.output_names), self.per_execution, sentinel)
        self._last_full = True
        self._saved: tuple[tuple[Any, str, Any], TrainFunction] | None = None  # (the train step's, the function)
        self._rerun: Callable[[Data], Tensor] | None = None

    def attach(self) -> None:
        """Replace `train_step` with the instrumented one and rebuild the train function around it."""
        model = self.model
        self._saved = (replace_train_step(model, self._instrumented(self.original_step)), model.train_function)
        with xla_outside_off(model, self.xla_inside):
            function = rebuild_train_function(model)
        if self.sentinel is not None:
            function = self._sampling(function)
        if self.replicas > 1:
            function = self._hooked_per_call(function)
        set_train_function(model, self._detaching_on_error(function))

    def detach(self) -> None:
        """Put `train_step` and the train function back as they were found."""
        if self._saved is None:
            return
        step, function = self._saved
        self._saved = None
        restore(step)
        set_train_function(self.model, function)

    @property
    def attached(self) -> bool:
        return self._saved is not None

    def retrace(self) -> None:
        """Trace the step again on its next call (an optimizer setting read at trace time changed: clipping)."""
        self._rerun = None
        if self.attached:
            self.detach()
            self.attach()

    def _sampling(self, full: TrainFunction) -> TrainFunction:
        """Sentinel mode: the full train function on sampled executions and after events, else the light one."""
        sentinel = self.sentinel
        assert sentinel is not None  # `attach` samples only with a sentinel
        with xla_outside_off(self.model, self.xla_inside):
            light = rebuild_train_function(self.model)

        @functools.wraps(full)
        def train_function(iterator: Any) -> Logs:
            self._last_full = sentinel.full_now = sentinel.due_full()  # read again if a step is traced
            return (full if self._last_full else light)(iterator)

        return train_function

    def _hooked_per_call(self, function: TrainFunction) -> TrainFunction:
        """The train function with the layer and optimizer hooks attached for each call (under tf.distribute)."""
        self._hub = StepCapture(self.model, self.optimizers, self.trainable).shared_by_threads()

        @functools.wraps(function)
        def train_function(iterator: Any) -> Logs:
            with self.layer_probe.attached(), self._hub.attached():
                return function(iterator)

        return train_function

    def _detaching_on_error(self, function: TrainFunction) -> TrainFunction:
        # Keras calls on_train_end only when fit returns: an error inside a step must
        # still leave the model as it was found. StopIteration ends every epoch.
        # A count, not a list of calls: the function runs once per execution for the whole fit.
        calls = 0

        @functools.wraps(function)
        def train_function(iterator: Any) -> Logs:
            nonlocal calls
            calls += 1
            try:
                logs = function(iterator)
            except StopIteration:
                raise
            except Exception as exc:
                original = self._saved[1] if self._saved is not None else None
                self.detach()
                if calls > 1 or original is None:
                    raise
                # The first call compiles the step: when the instrumented step cannot run (a
                # compiler that rejects nanscope's ops) but the user's own step can, the
                # failure is nanscope's, and fit goes on without it.
                logs = original(iterator)
                self.failure = self.failure or exc
                return logs
            except BaseException:
                self.detach()
                raise
            return self.after_execution(logs) if self.after_execution is not None else logs

        return train_function

    def read(self) -> list["StepRecord"]:
        """StepRecords of the steps finished since the last read, in step order."""
        if not self._last_full:
            assert self.sentinel is not None  # only a sentinel runs the light train function
            records = self.sentinel.read(self.rows.next_step)
            if records:
                self.rows.next_step = records[-1].step + 1
            return records
        return [self.rows.record(step, row) for step, row in self.rows.read()]

    def _instrumented(self, original: TrainStep) -> TrainStep:
        if self.replicas > 1:
            return self._instrumented_per_replica(original)

        if self.xla_inside:
            # autograph=False: Keras runs `train_step` unconverted (its step function is `do_not_convert`), and
            # converting nanscope's own code on every trace costs seconds of CPU.
            full = tf.function(self._instrumented_step(original, snapshot=False), reduce_retracing=True,
                               jit_compile=True, autograph=False)
            # Sentinel mode: a second XLA function, or the light train function would reuse the full one's trace.
            light = (tf.function(functools.partial(self._sentinel_step, original, snapshot=False),
                                 reduce_retracing=True, jit_compile=True, autograph=False)
                     if self.sentinel is not None else None)
            return sums_skipped(self._snapshot_around(full, original, light), self.optimizers)
        return sums_skipped(self._instrumented_step(original, snapshot=self.snapshot is not None), self.optimizers)

    def _snapshot_around(self, step: TrainStep, original: TrainStep, light: TrainStep | None = None) -> TrainStep:
        """`step` (compiled by XLA), after the snapshot of its state and batch, taken outside XLA; in the
        sentinel's light train function, `light` instead."""
        @functools.wraps(original)
        def train_step(data: Data) -> Logs:
            try:
                self._take(data)
            except Exception as exc:  # nanscope's own failure: the step runs, without a snapshot
                self.failure = self.failure or exc
            # `light` is made with the sentinel only.
            if light is not None and self.sentinel is not None and not self.sentinel.full_now:
                return light(data)
            return step(data)

        return train_step

    def _take(self, data: Data) -> None:
        assert self.snapshot is not None  # taken only with a snapshot
        self.snapshot.remember_structure(data)
        self.snapshot.take(data, self.rows.counter.read_value())

    def _instrumented_step(self, original: TrainStep, snapshot: bool) -> TrainStep:
        @functools.wraps(original)
        def train_step(data: Data) -> Logs:
            if self.sentinel is not None and not self.sentinel.full_now:
                return self._sentinel_step(original, data)
            hooks = contextlib.ExitStack()
            try:
                self.first_trace.made_in_trace()
                capture = StepCapture(self.model, self.optimizers, self.trainable,
                                      outputs=len(self.output_names))
                self.layer_probe.begin()
                if snapshot:
                    self._take(data)
                hooks.enter_context(self.layer_probe.attached())
                hooks.enter_context(capture.attached())
            except Exception as exc:  # nanscope's own failure: the user's step runs as it would without it
                hooks.close()
                self.failure = self.failure or exc
                return original(data)
            with hooks:
                logs = original(data)
            try:
                self._write(capture, data, logs)
            except Exception as exc:
                self.failure = self.failure or exc
            return logs

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
        values, var_rows, terms = capture.values(x, y, _logged_loss(capture, logs), self.layers)
        row = tf.concat([tf.stack([_batch_rows(x)]),
                         join([capture.scalars(values, y, sample_weight), stats, tf.stack(terms), var_rows])], axis=0)
        return row, values, stats

    def rerun(self, data: Data, step: int = -1) -> "StepRecord":
        """The step again, compiled, on `data` from the variables as they are: its StepRecord (one device).

        It runs the user's `train_step` with the same hooks and builds the same row, but writes
        nothing: no buffer row, no snapshot, no feature moments. The variables it changes are
        the caller's to put back.
        """
        if self._rerun is None:
            self._rerun = tf.function(self._measured, autograph=False)  # unconverted, as Keras runs the step
        row = self._rerun(data).numpy()
        return self.rows.record(step, np.concatenate([[float(step)], row]))

    def _measured(self, data: Data) -> Tensor:
        capture = StepCapture(self.model, self.optimizers, self.trainable, outputs=len(self.output_names))
        self.layer_probe.begin()
        with self.layer_probe.attached(), capture.attached():
            logs = self.original_step(data)
        return self._row(capture, data, logs)[0]

    def _sentinel_step(self, original: TrainStep, data: Data, snapshot: bool = True) -> Logs:
        """The light step: the snapshot (unless taken outside XLA), the optimizer and loss hooks, one short row
        (`SentinelRows`)."""
        from nanscope.guard.sentinel import SentinelCapture

        try:
            capture = SentinelCapture(self.model, self.optimizers, self.trainable,
                                      outputs=len(self.output_names))
            if self.snapshot is not None and snapshot:
                self._take(data)
            hooks = capture.attached()
            hooks.__enter__()
        except Exception as exc:  # nanscope's own failure: the user's step runs as it would without it
            self.failure = self.failure or exc
            return original(data)
        try:
            logs = original(data)
        finally:
            hooks.__exit__(None, None, None)
        try:
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            values, _, _ = capture.values(x, y, _logged_loss(capture, logs), self.layers)
            assert self.sentinel is not None  # the light step runs only in sentinel mode
            self.sentinel.write(_batch_rows(x), capture.scalars(values, y, sample_weight))
            if self.snapshot is not None:
                self.snapshot.freeze(not_absorbed(values, tf.constant(0.0)))
        except Exception as exc:
            self.failure = self.failure or exc
        return logs

    def _instrumented_per_replica(self, original: TrainStep) -> TrainStep:
        # Replica threads take turns while one step is traced: the layer and optimizer hooks
        # are attached once, around the train function (`_hooked_per_call`), and each
        # thread's hooks write into that thread's own capture.
        @functools.wraps(original)
        def train_step(data: Data) -> Logs:
            context = tf.distribute.get_replica_context()
            self.layer_probe.begin_replica(int(tf.get_static_value(context.replica_id_in_sync_group)))
            capture = StepCapture(self.model, self.optimizers, self.trainable, replica_context=context,
                                  replicas=self.replicas, outputs=len(self.output_names))
            self._hub.for_this_thread(capture)
            logs = original(data)
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            values, var_rows, terms = capture.values(x, y, _logged_loss(capture, logs), self.layers)
            row = tf.concat([tf.stack([_batch_rows(x)]),
                             join([capture.scalars(values, y, sample_weight), self.layer_probe.stats_matrix(),
                                   tf.stack(terms), var_rows]), tf.stack([capture.local_nonfinite])], axis=0)
            self.rows.write_replicas(context, row)
            return logs

        return train_step

    @property
    def call_order(self) -> list[str]:
        """Probed layer names in execution order, as seen when the step was traced."""
        return [self.layers[i].name for i in self.layer_probe.call_order]


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


@contextlib.contextmanager
def xla_outside_off(model: KerasModel, off: bool) -> Iterator[None]:
    """While Keras builds the train function: without XLA around `train_step` when `off` (it compiles its own)."""
    if not off:
        yield
        return
    model.jit_compile = False
    try:
        yield
    finally:
        model.jit_compile = True


def _logged_loss(capture: StepCapture, logs: Logs) -> Tensor | None:
    """The loss `compute_loss` returned (caught by the capture), or else the "loss" a custom train_step logs."""
    if capture.loss is not None or not isinstance(logs, dict):
        return None
    return logs.get("loss")


def _batch_rows(x: Any) -> Tensor:
    flat = [t for t in tf.nest.flatten(x) if t is not None]
    return tf.cast(tf.shape(flat[0])[0], tf.float32) if flat else tf.constant(0.0)
