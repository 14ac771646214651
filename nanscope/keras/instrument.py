"""`nanscope.instrument`: nanscope's per-step records around the user's own compiled train step.

The decorator wraps the step's Python function in a `tf.function` of its own that
runs it with the same hooks the `NanScope` callback uses inside `fit` (`StepCapture`:
each optimizer's `apply`, every layer's `call`) and writes one row of statistics per
call into the same on-device buffer (`RowBuffer`). The host side is the callback's
`StepRecorder`. At the first non-finite step it replays that step from the on-device
snapshot, writes the report and raises `NonFiniteError`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import types
import weakref

import numpy as np
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from nanscope.engine.records import expected_layer_indices
from nanscope.engine.schema import join
from nanscope.engine.step import probed_layers, relative_variable_names
from nanscope.errors import NonFiniteError, first_line
from nanscope.guard.options import GuardOptions, guard_options, resolve_on_nonfinite
from nanscope.forensics.random_state import random_state_kept
from nanscope.keras.capture import StepCapture, not_absorbed, unexpected_layer_nonfinite
from nanscope.keras.forensics import GuestForensics, labelled_arguments
from nanscope.keras.header import UNKNOWN_TO_GUESTS, parameter_count, precision
from nanscope.run.attribution import StepNames
from nanscope.keras.recorder import GuestOptions, StepRecorder
from nanscope.keras.rows import RowBuffer
from nanscope.keras.snapshot import StepSnapshot
from nanscope.keras.trace_count import FirstTrace, makes_variables
from nanscope.internals import jit_compile_of
from nanscope.model.learning_rate import LearningRateView
from nanscope.model.optimizers import optimizer_settings
from nanscope.report.model import run_header
from nanscope.rules.evidence import RunEvidence
from nanscope.runtime import tensorflow

if TYPE_CHECKING:
    from keras import Model
    from rich.console import Console

    from nanscope.engine.probes import LayerRecorder
    from nanscope.engine.records import StepRecord
    from nanscope.guard.host import GuestGuard
    from nanscope.guard.sentinel import SentinelRows
    from nanscope.report.model import TraceReport

# TensorFlow and Keras objects: they ship no types, so they are Any to mypy.
Tensor: TypeAlias = Any
Variable: TypeAlias = Any
Layer: TypeAlias = Any
Optimizer: TypeAlias = Any
# A step's arguments as the snapshot keeps them: (args, kwargs).
Arguments: TypeAlias = tuple[Sequence[Any], dict[str, Any]]

tf, keras = tensorflow()
log = logging.getLogger("nanscope")


def instrument(models: Model | Sequence[Model], optimizers: Any = (),
               report: str | os.PathLike | None = None, stop_on_nonfinite: bool | None = None, verbose: int = 1,
               console: Console | None = None, tensorboard: str | os.PathLike | None = None,
               trace: str | os.PathLike | None = None, expect_nonfinite: Sequence[str] = (),
               forensics: bool = True, on_nonfinite: str | None = None, max_skips: int | tuple | None = None,
               snapshot_every: int | None = None, skip_spikes: bool | None = None, mode: str | None = None,
               guard: GuardOptions | None = None) -> Callable[[Callable[..., Any]], InstrumentedFunction]:
    """Record nanscope's per-step statistics around a custom training step; raise at the first NaN/Inf.

    Decorate the step function (a `tf.function`, or a plain function that TensorFlow can
    trace). Each call records what the `NanScope` callback records in `fit`: the loss (the
    function's return value, its first element, or its `"loss"` key), every layer of the
    models, the gradients as they reach each optimizer, the updates, and the batch from
    the function's tensor arguments. At the first non-finite step it replays that step,
    writes the report and raises `NonFiniteError`, whose message is the diagnosis.

    Args:
        models: keras.Model or list of them. Whose layers and weights are recorded.
        optimizers: keras.Optimizer or list of them, default (). Whose `apply` gives the gradients.
        report: str or Path, default None. Write the `nanscope.trace/1` JSON here (at the first
            non-finite step, and at interpreter exit).
        stop_on_nonfinite: bool, default None. Alias of `on_nonfinite`: True "stop" (raise `NonFiniteError`
            at the first non-finite step), False "continue" (record it and go on).
        verbose: int, default 1. 1 prints the report when it is written.
        console, tensorboard, trace, expect_nonfinite, forensics: as for `NanScope`.
        on_nonfinite, max_skips, snapshot_every, skip_spikes, mode, guard: as for `NanScope`. A skip puts the
            models' and optimizers' variables back as they were before the step; the step's return value
            is still what it returned. Past `max_skips` it raises `NonFiniteError`. `mode="sentinel"` compiles
            a light step next to the full one (the loss, the global gradient norm, the non-finite counts, the
            state before the step) and runs the full one every `GuardOptions.sample_every`-th call and after
            an event.

    Example:
        @nanscope.instrument(model, optimizer, report="nanscope.json")
        @tf.function
        def train_step(x, y):
            ...
            return loss
        train_step.nanscope.report   # the TraceReport so far
    """
    models = _as_list(models)
    optimizers = _as_list(optimizers)
    if not models or not all(isinstance(m, keras.Model) for m in models):
        raise ValueError(f"`models` must be a keras.Model or a list of them. Received: models={models!r}")
    if isinstance(expect_nonfinite, str):
        raise ValueError("`expect_nonfinite` must be a list of layer-name patterns. "
                         f"Received: expect_nonfinite={expect_nonfinite!r}")
    guard = guard_options(guard, on_nonfinite=resolve_on_nonfinite(on_nonfinite, stop_on_nonfinite),
                          max_skips=max_skips, snapshot_every=snapshot_every, skip_spikes=skip_spikes, mode=mode)
    options = GuestOptions(report=report, stop_on_nonfinite=guard.stops, verbose=verbose, console=console,
                           tensorboard=tensorboard, trace=trace, expect_nonfinite=list(expect_nonfinite),
                           forensics=forensics, guard=guard)

    def decorate(function: Callable[..., Any]) -> InstrumentedFunction:
        return InstrumentedFunction(function, models, optimizers, options)

    return decorate


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


class InstrumentedFunction:
    """A train step under `instrument`: call it as the step it wraps; `.nanscope.report` is its TraceReport.

    Args:
        function: the step (a tf.function or a plain function).
        models, optimizers: lists.
        options: GuestOptions.
    """

    def __init__(self, function: Callable[..., Any], models: list[Model], optimizers: list[Optimizer],
                 options: GuestOptions) -> None:
        functools.update_wrapper(self, getattr(function, "python_function", function), updated=())
        self.function = function
        self.python_function = getattr(function, "python_function", function)
        self.models, self.optimizers, self.options = models, optimizers, options
        self.nanscope = self
        self.report: TraceReport | None = None
        self.notes: list[str] = []
        self.steps_seen = 0
        self.recording = True
        self._run: GuestRun | None = None
        self._raised = False
        atexit.register(_finish_at_exit, weakref.ref(self))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.recording:
            return self.function(*args, **kwargs)
        if self._run is None and not self._guarded("setup", lambda: self._start(args, kwargs)):
            return self.function(*args, **kwargs)
        assert self._run is not None  # made by the setup that did not fail
        result = self._run.call(*args, **kwargs)
        if self._guarded("recording", self._collect) and self._should_raise():
            self._raised = True
            report = self.finish()
            assert report is not None  # `finish` has a report for a run that started
            raise NonFiniteError(report.diagnosis_line(), report)
        return result

    def _start(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self._run = GuestRun(self.python_function, self.models, self.optimizers, self.options,
                             jit_compile_of(self.function),
                             getattr(self.function, "python_function", None) is not None, args, kwargs)
        self.report = self._run.recorder.report

    def _collect(self) -> None:
        assert self._run is not None  # called after the setup made it
        records = self._run.guard.complete(self._run.read())
        self.steps_seen += len(records)
        self._run.recorder.collect(records)
        if self._run.failure is not None:
            raise self._run.failure
        self._run.guard.observe(records)

    def _should_raise(self) -> bool:
        if self._raised or self._run is None:
            return False
        return self._run.guard.stopped or (self.options.stop_on_nonfinite
                                           and self._run.recorder.first_nonfinite is not None)

    def _guarded(self, what: str, action: Callable[[], object]) -> bool:
        try:
            action()
        except Exception as exc:
            log.warning("nanscope: instrument stopped %s at step %d (%s: %s); training goes on without it",
                        what, self.steps_seen, type(exc).__name__, first_line(exc))
            self.notes.append(f"nanscope's own {what} failed at step {self.steps_seen} ({type(exc).__name__}: "
                              f"{first_line(exc)}); recording stopped there and training went on without it")
            self.recording = False
            return False
        return True

    def finish(self) -> TraceReport | None:
        """Build, print and write the report of the steps so far; the TraceReport.

        Never raises into the user's loop: a failure of nanscope's own is one warning line, and the report
        as far as it was built is returned.
        """
        if self._run is None:
            return None
        try:
            self.report = self._run.finish(self.notes)
        except Exception as exc:
            log.warning("nanscope: the instrument report could not be built (%s: %s); training was not affected",
                        type(exc).__name__, first_line(exc))
            self.report = self._run.recorder.report
            self.report.notes.append(f"nanscope's own report failed ({type(exc).__name__}: {first_line(exc)}); "
                                     "the report is as far as it was built")
        return self.report


def _finish_at_exit(reference: weakref.ref[InstrumentedFunction]) -> None:
    instrumented = reference()
    if instrumented is None or instrumented._run is None or instrumented._raised:
        return
    try:
        instrumented.finish()
    except Exception as exc:
        log.warning("nanscope: the instrument report could not be written at exit (%s)", first_line(exc))


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
        self.layer_probe = _layer_probe(self.layers)
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
        hooks = contextlib.ExitStack()
        try:
            self.first_trace.made_in_trace()
            capture = StepCapture(None, self.optimizers, self.trainable, keras_models=self.models)
            self.layer_probe.begin()
            if self.snapshot is not None:
                self._take(args, kwargs)
            hooks.enter_context(self.layer_probe.attached())
            hooks.enter_context(capture.attached())
        except Exception as exc:  # nanscope's own failure: the user's step runs as it would without it
            hooks.close()
            self.failure = self.failure or exc
            return self.python_function(*args, **kwargs)
        with hooks:
            result = self.python_function(*args, **kwargs)
        try:
            self._write(capture, args, kwargs, result)
        except Exception as exc:
            self.failure = self.failure or exc
        return result

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

        hooks = contextlib.ExitStack()
        try:
            self.first_trace.made_in_trace()
            capture = SentinelCapture(None, self.optimizers, self.trainable, keras_models=self.models)
            if self.snapshot is not None:
                self._take(args, kwargs)
            hooks.enter_context(capture.attached())
        except Exception as exc:  # nanscope's own failure: the user's step runs as it would without it
            hooks.close()
            self.failure = self.failure or exc
            return self.python_function(*args, **kwargs)
        with hooks:
            result = self.python_function(*args, **kwargs)
        try:
            batch = [t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t)]
            values, _, _ = capture.values([t for t in batch if t.dtype.is_floating], None, returned_loss(result),
                                          self.layers)
            assert self.sentinel is not None  # the light step runs only in sentinel mode
            self.sentinel.write(_batch_rows(batch), capture.scalars(values, None, None))
        except Exception as exc:
            self.failure = self.failure or exc
        return result

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
    seen: set[int] = set()
    out: list[Variable] = []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _layer_probe(layers: Sequence[Layer]) -> LayerRecorder:
    from nanscope.engine.probes import LayerRecorder

    return LayerRecorder(layers)
