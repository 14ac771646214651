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

from dataclasses import dataclass, field

import numpy as np

# Optimizer settings a live run can take: a float learning rate is a variable (no retrace); the others are read
# when the step is traced, so the step is traced again.
IN_PROCESS = ("learning_rate", "global_clipnorm", "clipnorm", "clipvalue", "epsilon")


@dataclass
class Candidate:
    """One fix a live run can take: the rule it comes from, its name and settings."""

    rule: str
    name: str
    overrides: dict
    params: dict = field(default_factory=dict)


class FixProver:
    """Finds and applies the proven fix at a trace-steps rollback.

    Args:
        engine: InstrumentedStep.
        session: Session. Its batches by step, its data for the rules' evidence.
        report: TraceReport. The run so far (its history and first non-finite step).
        expected: list of int. Layers whose non-finite outputs are intended.
    """

    def __init__(self, engine, session, report, expected=()):
        self.engine, self.session, self.report, self.expected = engine, session, report, list(expected)

    def candidates(self):
        """The in-process fixes of the recommendations for the run so far, in their order."""
        from nanscope.rules.diagnose import diagnose
        from nanscope.rules.evidence import evidence_from_session
        from nanscope.run.verify import changes_for

        found = []
        for rec in diagnose(self.report, evidence_from_session(self.session)):
            for change in changes_for(rec, self.session, self.report):
                if in_process(change):
                    found.append(Candidate(rec.id, change.name, dict(change.optimizer_overrides), dict(change.params)))
        return found

    def prove(self, start, failing, exclude=()):
        """From the state now (the one restored, before step `start`): the first candidate (not named in
        `exclude`) under which steps `start..failing` stay finite and the loss does not grow, applied.

        Returns:
            (fix, tried): the intervention's entry for the fix applied ({} when none is proven; nothing is then
            changed), and per candidate tried its name, rule and what its trial did.
        """
        tried, steps = [], range(start, failing + 1)
        before = self._loss_on(steps)
        for candidate in self.candidates():
            if candidate.name in exclude:
                continue
            with self.engine.state_kept():
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

    def _trial(self, steps, before):
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

    def _loss_on(self, steps):
        """The mean loss, in inference mode, of the batches of `steps` with the weights now."""
        from nanscope.data import inputs
        from nanscope.run.session import evaluate_loss

        losses = []
        for step in steps:
            x, y = self.session.batch(step)
            rows = inputs.rows(x)
            losses.append(evaluate_loss(self.engine, _Batch(x, y, rows), rows))
        return sum(losses) / len(losses)


@dataclass
class _Batch:
    """One batch as `evaluate_loss` reads data."""

    x: object
    y: object
    rows: int


def in_process(change):
    """True for a Change that only sets optimizer settings a live run can take (a float learning rate)."""
    overrides = change.optimizer_overrides
    if not overrides or any(getattr(change, part) is not None for part in ("grad_transform", "model", "data",
                                                                              "loss_scaling")):
        return False
    if not set(overrides) <= set(IN_PROCESS):
        return False
    return not ("learning_rate" in overrides and not isinstance(overrides["learning_rate"], (int, float)))


def set_overrides(optimizer, overrides, retrace):
    """Set `overrides` on `optimizer` (the inner one under loss scaling), calling `retrace()` where the step's graph
    reads them (every setting but a float learning rate); return the callable that puts the settings back."""
    from nanscope.model.learning_rate import inner_optimizer

    optimizer = inner_optimizer(optimizer)
    before = {key: _read(optimizer, key) for key in overrides}
    _set(optimizer, overrides, retrace)
    return lambda: _set(optimizer, before, retrace)


def _read(optimizer, key):
    value = getattr(optimizer, key, None)
    return float(np.asarray(value)) if key == "learning_rate" else value


def _set(optimizer, values, retrace):
    for key, value in values.items():
        setattr(optimizer, key, value)
    if set(values) - {"learning_rate"}:
        retrace()
