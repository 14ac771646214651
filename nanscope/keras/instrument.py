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
import functools
import logging
import os
import weakref

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from nanscope.errors import NonFiniteError, first_line
from nanscope.guard.options import GuardOptions, guard_options, resolve_on_nonfinite
from nanscope.keras.guest_run import GuestRun
from nanscope.keras.recorder import GuestOptions
from nanscope.internals import jit_compile_of
from nanscope.runtime import tensorflow
from nanscope.tf_types import Optimizer

if TYPE_CHECKING:
    from keras import Model
    from rich.console import Console

    from nanscope.report.model import TraceReport

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
