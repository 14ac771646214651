"""`GuestRun`: the probe, the buffer, the snapshot and the recorder of one step function under `instrument`.

`nanscope.keras.instrument` holds the public decorator and the `InstrumentedFunction` the user calls;
this module holds the run it starts at the first call: the step traced in nanscope's own
`tf.function` (full or sentinel rows), the on-device snapshot of each step's state, the replay
of the first non-finite step and the report.
"""

from __future__ import annotations

import contextlib
import logging
import types

import numpy as np
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from nanscope.engine.probes import LayerRecorder
from nanscope.engine.records import expected_layer_indices
from nanscope.engine.schema import join
from nanscope.engine.model_view import probed_layers, relative_variable_names
from nanscope.forensics.random_state import random_state_kept
from nanscope.keras.capture import StepCapture
from nanscope.keras.guest_step import as_guest
from nanscope.keras.forensics import GuestForensics, labelled_arguments
from nanscope.keras.header import UNKNOWN_TO_GUESTS, parameter_count, precision
from nanscope.run.attribution import StepNames
from nanscope.keras.recorder import GuestOptions, StepRecorder
from nanscope.keras.rows import RowBuffer
from nanscope.keras.snapshot import StepSnapshot, not_absorbed, unexpected_layer_nonfinite
from nanscope.keras.trace_count import FirstTrace, makes_variables
from nanscope.model.learning_rate import LearningRateView
from nanscope.model.optimizers import optimizer_settings
from nanscope.report.header import run_header
from nanscope.rules.evidence import RunEvidence
from nanscope.runtime import tensorflow
from nanscope.tf_types import Optimizer, Tensor, Variable

if TYPE_CHECKING:
    from keras import Model

    from nanscope.engine.records import StepRecord
    from nanscope.guard.host import GuestGuard
    from nanscope.guard.sentinel import SentinelRows
    from nanscope.report.model import TraceReport

# A step's arguments as the snapshot keeps them: (args, kwargs).
Arguments: TypeAlias = tuple[Sequence[Any], dict[str, Any]]

tf, keras = tensorflow()
log = logging.getLogger("nanscope")


class GuestRun:
    """The probe, the buffer, the snapshot and the recorder of one instrumented step function.

    Models and optimizers that are not built yet are built by tracing the step once
    (no step runs), as its first call would.
    """

    def __init__(self, python_function: Callable[..., Any], models: list[Model], optimizers: list[Optimizer],
                 options: GuestOptions, jit: object, compiled: bool, args: Sequence[Any], kwargs: dict[str, Any]
                 ) -> None:
        self.python_function, self.models, self.optimizers, self.options = python_function, models, optimizers, options
        self.jit = bool(jit)
        built_ahead = False
        if not all(m.built for m in models) or not all(o.built for o in optimizers):
            with random_state_kept():  # a trace more than the user's: it must draw no seed
                built_ahead = makes_variables(
                    lambda: tf.function(python_function).get_concrete_function(*args, **kwargs))
        # A build that took the user's variables out of the step's first trace: TensorFlow would trace it twice.
        self.first_trace = FirstTrace(built_ahead and compiled)
        self.layers = [layer for model in models for layer in probed_layers(model)]
        self.trainable = _unique(v for model in models for v in model.trainable_variables)
        self.failure: Exception | None = None
        self.layer_probe = LayerRecorder(self.layers)
        self.rows = RowBuffer(len(self.layers), len(self.trainable))
        names = [layer.name for layer in self.layers]
        self.expected = expected_layer_indices(options.expect_nonfinite, names)
        state = _unique([v for model in models for v in model.variables]
                        + [v for optimizer in optimizers for v in optimizer.variables])
        # XLA compiles fixed shapes: the batch copy (a variable of any shape) cannot be compiled.
        self.snapshot = StepSnapshot(state) if options.forensics and not self.jit else None
        forensics = None
        if self.snapshot is not None:
            forensics = GuestForensics(self.snapshot, self._replay_call, labelled_arguments, self.layers, models,
                                       optimizers, self.trainable, expected=[names[i] for i in self.expected])
        variable_names = (relative_variable_names(self.trainable, models[0]) if len(models) == 1
                          else relative_variable_names(self.trainable, None))
        learning_rate = LearningRateView(self.optimizers[0] if self.optimizers else None)
        self.recorder = StepRecorder(options, self._header(compiled, learning_rate),
                                     StepNames(layers=[(layer.name, type(layer).__name__) for layer in self.layers],
                                               variables=variable_names), self._call_order,
                                     forensics.locate if forensics is not None else None,
                                     learning_rate=learning_rate)
        # The user's own jit_compile: a step recompiled without XLA would draw other random numbers (Dropout).
        self.compiled = tf.function(self._step, jit_compile=self.jit or None) if compiled else self._step
        self.sentinel: SentinelRows | None = None
        self.light: Callable[..., Any] | None = None
        self._last_full = True
        if options.guard.mode == "sentinel":
            from nanscope.guard.sentinel import SentinelRows

            self.sentinel = SentinelRows(self.rows.counter, 0, 1, options.guard.sample_every)
            self.light = (tf.function(self._sentinel_step, jit_compile=self.jit or None) if compiled
                          else self._sentinel_step)
        self.guard = self._guard(variable_names)
        self._rerun: Callable[..., Tensor] | None = None
        if self.sentinel is not None:
            self.guard.note(f"mode=sentinel: full statistics on every {options.guard.sample_every}th call and the 16 "
                            "after an event; the other steps recorded the scalars only (layer and variable tables "
                            "are over the full steps)")

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """One call of the user's step: the full instrumented step, or in sentinel mode the light one when due."""
        if self.sentinel is None:
            return self.compiled(*args, **kwargs)
        self._last_full = self.sentinel.due_full()
        light = self.light
        assert light is not None  # made with the sentinel
        return (self.compiled if self._last_full else light)(*args, **kwargs)

    def _guard(self, variable_names: list[str]) -> GuestGuard:
        from nanscope.guard.guard import Guard
        from nanscope.guard.host import GuestGuard, attributed
        from nanscope.keras.guest_fix import guest_fixer
        from nanscope.guard.state import GuestState

        options = self.options.guard
        if self.snapshot is None:
            made = GuestGuard(Guard(options), self.recorder)
            made.no_state(options, "jit_compile=True" if self.jit and self.options.forensics else "forensics=False")
            return made
        state = GuestState(self.snapshot, self.optimizers)

        def rerun(batch: Arguments) -> StepRecord:
            return attributed(self.rerun(batch), self.recorder)

        fixer = guest_fixer(options, state, rerun, self.optimizers, types.SimpleNamespace(
            optimizer=self.optimizers[0] if self.optimizers else None), self.recorder,
            lambda: RunEvidence(keras_model=self.models[0]), self.retrace)
        guard = Guard(options, state, rerun, variable_names=variable_names, fixer=fixer)
        return GuestGuard(guard, self.recorder, sentinel=self.sentinel)

    def retrace(self) -> None:
        """Trace the step again on its next call (an optimizer setting read at trace time changed: clipping)."""
        self._rerun = None
        if isinstance(self.compiled, tf.types.experimental.PolymorphicFunction):
            self.compiled = tf.function(self._step, jit_compile=self.jit or None)
        if isinstance(self.light, tf.types.experimental.PolymorphicFunction):
            self.light = tf.function(self._sentinel_step, jit_compile=self.jit or None)

    def rerun(self, batch: Arguments, step: int = -1) -> StepRecord:
        """The step again, compiled, on `batch` ((args, kwargs)) from the variables as they are: its StepRecord."""
        if self._rerun is None:
            self._rerun = tf.function(self._measured)
        args, kwargs = batch
        row = self._rerun(*args, **kwargs).numpy()
        return self.rows.record(step, np.concatenate([[float(step)], row]))

    def _measured(self, *args: Any, **kwargs: Any) -> Tensor:
        capture = StepCapture(None, self.optimizers, self.trainable, keras_models=self.models)
        self.layer_probe.begin()
        with self.layer_probe.attached(), capture.attached():
            result = self.python_function(*args, **kwargs)
        return self._row(capture, args, kwargs, result)[0]

    def _header(self, compiled: bool, learning_rate: LearningRateView) -> dict[str, Any]:
        name, config = optimizer_settings(self.optimizers[0] if self.optimizers else None)
        return run_header(
            **UNKNOWN_TO_GUESTS,
            spec=f"{getattr(self.python_function, '__qualname__', 'step')} (nanscope.instrument)",
            model=", ".join(f"{m.name} ({type(m).__name__})" for m in self.models) + f", {len(self.layers)} layers",
            model_kind="custom-loop", parameters=parameter_count(self.models), data="the step's arguments",
            loss="the step's return value", optimizer=name, optimizer_config=config,
            **learning_rate.header_fields(),
            steps_requested=None, jit_compile=None, compiled=compiled,
            **precision(self.layers, self.optimizers),
        )

    def _call_order(self) -> list[str]:
        return [self.layers[i].name for i in self.layer_probe.call_order]

    def _replay_call(self, batch: Arguments) -> Any:
        args, kwargs = batch
        return self.python_function(*args, **kwargs)

    def _step(self, *args: Any, **kwargs: Any) -> Any:
        def attach(hooks: contextlib.ExitStack) -> StepCapture:
            self.first_trace.made_in_trace()
            capture = StepCapture(None, self.optimizers, self.trainable, keras_models=self.models)
            self.layer_probe.begin()
            if self.snapshot is not None:
                self._take(args, kwargs)
            hooks.enter_context(self.layer_probe.attached())
            hooks.enter_context(capture.attached())
            return capture

        return as_guest(attach, lambda: self.python_function(*args, **kwargs),
                        lambda capture, result: self._write(capture, args, kwargs, result), self._failed)

    def _failed(self, exc: Exception) -> None:
        """Keep the first failure of nanscope's own code (the step went on without it)."""
        self.failure = self.failure or exc

    def _take(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """The snapshot of the state and the batch before this step (as the fit probe's `_take`)."""
        assert self.snapshot is not None  # called only with a snapshot
        self.snapshot.remember_structure((args, kwargs))
        self.snapshot.take((args, kwargs), self.rows.counter.read_value())

    def _write(self, capture: StepCapture, args: Sequence[Any], kwargs: dict[str, Any], result: Any) -> None:
        row, values, stats = self._row(capture, args, kwargs, result)
        self.rows.write(row)
        if self.snapshot is not None:
            layer_bad = unexpected_layer_nonfinite(stats, len(self.layers), self.expected)
            self.snapshot.freeze(not_absorbed(values, layer_bad))

    def _row(self, capture: StepCapture, args: Sequence[Any], kwargs: dict[str, Any], result: Any
             ) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """The step's row (without its step number), its SCALARS by name and its layer statistics."""
        batch = [t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t)]
        stats = self.layer_probe.stats_matrix()
        # A step that returns no loss records it as unknown (`loss_missing`), never as a value.
        values, var_rows, terms = capture.values([t for t in batch if t.dtype.is_floating], None,
                                                 returned_loss(result), self.layers)
        scalars = capture.scalars(values, None, None)
        row = tf.concat([tf.stack([_batch_rows(batch)]), join([scalars, stats, tf.stack(terms), var_rows])], axis=0)
        return row, values, stats

    def _sentinel_step(self, *args: Any, **kwargs: Any) -> Any:
        """The light step: the snapshot, the optimizer hooks, one short row (`SentinelRows`)."""
        from nanscope.guard.sentinel import SentinelCapture

        def attach(hooks: contextlib.ExitStack) -> SentinelCapture:
            self.first_trace.made_in_trace()
            capture = SentinelCapture(None, self.optimizers, self.trainable, keras_models=self.models)
            if self.snapshot is not None:
                self._take(args, kwargs)
            hooks.enter_context(capture.attached())
            return capture

        def write(capture: SentinelCapture, result: Any) -> None:
            batch = [t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t)]
            values, _, _ = capture.values([t for t in batch if t.dtype.is_floating], None, returned_loss(result),
                                          self.layers)
            assert self.sentinel is not None  # the light step runs only in sentinel mode
            self.sentinel.write(_batch_rows(batch), capture.scalars(values, None, None))

        return as_guest(attach, lambda: self.python_function(*args, **kwargs), write, self._failed)

    def read(self) -> list[StepRecord]:
        """StepRecords of the steps run since the last read (the sentinel's short rows after a light call)."""
        if not self._last_full:
            assert self.sentinel is not None  # only a sentinel runs the light step
            records = self.sentinel.read(self.rows.next_step)
            if records:
                self.rows.next_step = records[-1].step + 1
            return records
        return [self.rows.record(step, row) for step, row in self.rows.read()]

    def finish(self, notes: Iterable[str]) -> TraceReport:
        extra = ["recorded around a custom train step by nanscope.instrument"]
        if self.jit and self.options.forensics:
            extra.append("forensics off: the step is compiled with jit_compile=True, and XLA cannot compile the "
                         "batch copy the replay needs; a non-finite step is reported without its op")
        if self.snapshot is not None:
            extra.append(f"forensics: the weights and optimizer state before each step and its arguments were kept on "
                         f"the device ({self.snapshot.nbytes() / 2**20:.1f} MiB besides the batch)")
        self.guard.finish(self.recorder.report)
        return self.recorder.finish(RunEvidence(keras_model=self.models[0]), list(notes) + extra + self.guard.notes())


def returned_loss(result: Any) -> Tensor | None:
    """The loss a step returned: the value itself, its first element, or its "loss" key (None if none)."""
    if isinstance(result, dict):
        result = result.get("loss")
    elif isinstance(result, (list, tuple)):
        result = result[0] if result else None
    return result if tf.is_tensor(result) else None


def _batch_rows(batch: Sequence[Tensor]) -> Tensor:
    """Rows of the step's first tensor argument (0 when it has no batch axis)."""
    return tf.cast(tf.shape(batch[0])[0], tf.float32) if batch and batch[0].shape.rank else tf.constant(0.0)


def _unique(variables: Iterable[Variable]) -> list[Variable]:
    """`variables` without repeats (a variable two models share), in first-seen order."""
    return list({id(v): v for v in variables}.values())
