"""The guard inside `trace-steps`: the state it puts back is the instrumented step's own snapshot.

trace-steps runs nanscope's own compiled step (`engine/step.py`), which copies the
model's weights (and the loss scale) on the device before each update. Under the guard
it copies the optimizer's variables too (`InstrumentedStep.keep_optimizer_state`), so a
skip undoes the whole step. The batches are the session's, drawn by step on the host,
so nothing of the batch is copied. A step's logs, metrics and callbacks do not exist
here: a skipped step stays in the history, with its intervention.

Under `train.distribute` the step is a `DistributedStep`: its copies are mirrored variables, taken on
every device before `strategy.run`, and a re-run for the verdicts splits the batch over the replicas
again, so each replica gets its own rows back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

from nanscope.guard.host import GuestGuard
from nanscope.guard.state import LearningRates

if TYPE_CHECKING:
    from nanscope.data.targets import Arrays
    from nanscope.engine.records import StepRecord
    from nanscope.engine.step import InstrumentedStep
    from nanscope.guard.options import GuardOptions
    from nanscope.report.model import FirstNonfinite, TraceReport
    from nanscope.run.session import Session


class TraceState(LearningRates):
    """What the guard can read and put back in a trace-steps run.

    Args:
        engine: InstrumentedStep whose `keep_optimizer_state()` was called before it was traced.
        batch_of: callable(step) -> (x, y). The batch the session draws at a step.
    """

    def __init__(self, engine: InstrumentedStep, batch_of: Callable[[int], tuple[Arrays, Arrays]]) -> None:
        super().__init__([engine.optimizer])
        self.engine, self.batch_of = engine, batch_of
        self.variables = engine.state.variables()
        self.held = -1

    def ran(self, records: list[StepRecord]) -> None:
        """After an execution: the snapshot holds the state before its last step."""
        if records:
            self.held = records[-1].step

    def held_step(self) -> int:
        return self.held

    def batch(self) -> tuple[Arrays, Arrays]:
        return self.batch_of(self.held)

    def current(self) -> list[np.ndarray]:
        """The guarded variables' values now, as numpy arrays (a ring entry)."""
        return [np.array(v.numpy(), copy=True) for v in self.variables]

    def put(self, values: Iterable[np.ndarray]) -> None:
        for variable, value in zip(self.variables, values):
            variable.assign(value)

    def restore_before_step(self) -> None:
        """Put back the weights and the optimizer's variables as they were before the held step."""
        self.engine.state.restore(optimizer=True)

    def restore_metrics(self) -> None:
        """trace-steps keeps no metrics."""

    def thaw(self) -> None:
        """trace-steps' snapshot never freezes (one step at a time, or a chunk that stops at the step)."""

    @contextlib.contextmanager
    def before_step(self, values: Iterable[np.ndarray] | None = None) -> Iterator[None]:
        """For the block: the state before the held step (or the ring entry `values`); afterwards every variable
        and the snapshot's copies as they were (a re-run through the engine copies the state again)."""
        with self.engine.state.kept():
            self.restore_before_step()
            if values is not None:
                self.put(values)
            yield

    def nbytes(self) -> int:
        return sum(int(v.shape.num_elements() or 0) * v.dtype.size for v in self.variables)


class TraceView:
    """What `GuestGuard` reads of a run (its first non-finite step, its expected layers), for a trace-steps report.

    Args:
        report: TraceReport.
        expected: list of int. Layers whose non-finite outputs are intended.
    """

    def __init__(self, report: TraceReport, expected: Iterable[int]) -> None:
        self.report, self.expected = report, list(expected)

    @property
    def first_nonfinite(self) -> FirstNonfinite | None:
        return self.report.first_nonfinite


def active(options: GuardOptions | None) -> TypeGuard[GuardOptions]:
    """True when trace-steps needs a guard: it may skip or roll back, or it keeps a ring (`snapshot_every`)."""
    return options is not None and (options.intervenes or bool(options.ring_every))


def prepare_guard(options: GuardOptions | None, engine: InstrumentedStep) -> None:
    """Before the step is traced: under a guard, the step copies the optimizer's variables too."""
    if active(options):
        engine.keep_optimizer_state()


def trace_guard(options: GuardOptions | None, engine: InstrumentedStep, session: Session, report: TraceReport,
                expected: Iterable[int]) -> TraceGuard | None:
    """The TraceGuard of one trace-steps run, or None when the guard has nothing to do (stop or continue, no ring)."""
    from nanscope.guard.guard import Guard
    from nanscope.guard.host import attributed
    from nanscope.run.proven_fix import FixProver

    if not active(options):
        return None
    view = TraceView(report, expected)
    state = TraceState(engine, session.batch)

    def rerun(batch: tuple[Arrays, Arrays]) -> Any:
        return attributed(engine.run(-1, *batch), view)

    # Under multi_worker every worker would prove a fix on its own report, and only the chief's has the forensic
    # replay: their candidates could differ, and so would the collectives of their trials. They lower the rate.
    proves = options.on_nonfinite == "rollback" and session.cluster is None
    fixer = FixProver(engine, session, report, expected) if proves else None
    guard = Guard(options, state, rerun, variable_names=engine.variable_names, fixer=fixer)
    if guard.ring is not None:  # the state before step 0: a chunk of steps can fail before the ring's first turn
        guard.ring.take(0, state.current())
    made = TraceGuard(guard, view)
    if options.on_nonfinite == "rollback" and options.apply_fix and not proves:
        made.note("guard: under train.distribute: multi_worker a rollback lowers the learning rate; it proves no "
                  "fix (each worker's report differs: only the chief replays the step)")
    return made


class TraceGuard(GuestGuard):
    """A GuestGuard fed by the trace-steps loop: it learns which step the snapshot holds from the records."""

    def observe(self, records: list[StepRecord]) -> Any:
        if isinstance(self.guard.state, TraceState):
            self.guard.state.ran(records)
        return super().observe(records)
