"""A rollback that applies the proven fix: the rules' fixes tried on the rolled-back steps, in process.

At a rollback in trace-steps the guard asks the rule catalogue what the run so far
means (`rules.diagnose`, as the report will), takes the fixes of its recommendations
that a live run can take (`IN_PROCESS`: the optimizer's learning rate, clipping and
epsilon; not a changed model or changed data), and tries each, in the order of the
recommendations, on the steps it rolls back: from the restored state, steps
`restored..failing` again on their own batches, with the fix. The first fix under which
they all stay finite, with the loss no higher at the end than at the start, is proven
there, as `trace-steps --verify` proves a fix on a whole run and `replay --verify` on the
saved step: the guard applies it for the rest of the run, from the restored state. When
none is proven, the rollback lowers the learning rate instead. Every trial leaves every
variable as it found it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nanscope.data.targets import Arrays
from nanscope.model.optimizers import set_overrides

if TYPE_CHECKING:
    from nanscope.engine.step import InstrumentedStep
    from nanscope.report.model import TraceReport
    from nanscope.rules.fixes import Change
    from nanscope.run.session import Session

# Optimizer settings a live run can take: a float learning rate is a variable (no retrace); the others are read
# when the step is traced, so the step is traced again.
IN_PROCESS = ("learning_rate", "global_clipnorm", "clipnorm", "clipvalue", "epsilon")


@dataclass
class Candidate:
    """One fix a live run can take: the rule it comes from, its name and settings."""

    rule: str
    name: str
    overrides: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)


class FixProver:
    """Finds and applies the proven fix at a trace-steps rollback.

    Args:
        engine: InstrumentedStep.
        session: Session. Its batches by step, its data for the rules' evidence.
        report: TraceReport. The run so far (its history and first non-finite step).
        expected: list of int. Layers whose non-finite outputs are intended.
    """

    def __init__(self, engine: InstrumentedStep, session: Session, report: TraceReport,
                 expected: Iterable[int] = ()) -> None:
        self.engine, self.session, self.report, self.expected = engine, session, report, list(expected)

    def candidates(self) -> list[Candidate]:
        """The in-process fixes of the recommendations for the run so far, in their order."""
        from nanscope.rules.diagnose import diagnose
        from nanscope.rules.evidence import evidence_from_session
        from nanscope.run.verify import changes_for

        found: list[Candidate] = []
        for rec in diagnose(self.report, evidence_from_session(self.session)):
            for change in changes_for(rec, self.session, self.report):
                if in_process(change):
                    found.append(Candidate(rec.id, change.name, dict(change.optimizer_overrides), dict(change.params)))
        return found

    def prove(self, start: int, failing: int, exclude: Collection[str] = ()
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """From the state now (the one restored, before step `start`): the first candidate (not named in
        `exclude`) under which steps `start..failing` stay finite and the loss does not grow, applied.

        Returns:
            (fix, tried): the intervention's entry for the fix applied ({} when none is proven; nothing is then
            changed), and per candidate tried its name, rule and what its trial did.
        """
        tried: list[dict[str, Any]] = []
        steps = range(start, failing + 1)
        before = self._loss_on(steps)
        for candidate in self.candidates():
            if candidate.name in exclude:
                continue
            with self.engine.state.kept():
                undo = set_overrides(self.engine.optimizer, candidate.overrides, self.engine.retrace)
                try:
                    proven, outcome = self._trial(steps, before)
                finally:
                    undo()
            tried.append({"fix": candidate.name, "rule": candidate.rule, "outcome": outcome})
            if proven:
                set_overrides(self.engine.optimizer, candidate.overrides, self.engine.retrace)
                return {"rule": candidate.rule, "name": candidate.name, "params": candidate.params,
                        "why": f"steps {start}-{failing} again from the restored state with it: {outcome}; without "
                               f"it step {failing} was non-finite"}, tried
        return {}, tried

    def _trial(self, steps: range, before: float) -> tuple[bool, str]:
        """`steps` again from the state now: (proven, what they did in words). Proven: each step stays finite
        and the loss on their batches (in inference mode) falls from `before`."""
        for step in steps:
            record = self.engine.run(step, *self.session.batch(step))
            record.expected_nonfinite = list(self.expected)
            if record.phase is not None:
                return False, f"non-finite at step {step} ({record.phase} pass)"
        after = self._loss_on(steps)
        change = f"their batches' loss {before:.4g} -> {after:.4g}"
        if not after < before:  # NaN included
            return False, f"finite, but it does not learn ({change})"
        return True, f"finite, and it learns ({change})"

    def _loss_on(self, steps: range) -> float:
        """The mean loss, in inference mode, of the batches of `steps` with the weights now."""
        from nanscope.data import inputs
        from nanscope.run.session import evaluate_loss

        losses: list[float] = []
        for step in steps:
            x, y = self.session.batch(step)
            rows = inputs.rows(x)
            loss = evaluate_loss(self.engine, _Batch(x, y, rows), rows)
            assert loss is not None  # a batch has rows
            losses.append(loss)
        return sum(losses) / len(losses)


@dataclass
class _Batch:
    """One batch as `evaluate_loss` reads data."""

    x: Arrays
    y: Arrays
    rows: int


def in_process(change: Change) -> bool:
    """True for a Change that only sets optimizer settings a live run can take (a float learning rate)."""
    overrides = change.optimizer_overrides
    if not overrides or any(getattr(change, part) is not None for part in ("grad_transform", "model", "data",
                                                                              "loss_scaling")):
        return False
    if not set(overrides) <= set(IN_PROCESS):
        return False
    return not ("learning_rate" in overrides and not isinstance(overrides["learning_rate"], (int, float)))
