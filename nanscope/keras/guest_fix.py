"""A guest rollback (`NanScope`, `instrument`) that applies the fix verification proves on the saved step.

trace-steps proves a fix on the rolled-back steps (`run/proven_fix.py`); a guest run has
only the failing step's batch, kept with the state before it (the step snapshot), as
`replay DIR --verify` has in a bundle. So at a rollback the guard asks the rule catalogue
what the run so far means (`rules.diagnose`), takes the saved-step fixes of its
recommendations that a live run can take (`proven_fix.IN_PROCESS`: a float learning rate,
clipping, epsilon), and tries each, in the order of the recommendations, on the saved
step's batch: from the restored state, the compiled step on that batch with the fix, as
many times as steps were rolled back, then once more for the loss after the last update.
(From the state before the saved step itself a fix of the update often comes too late:
that state's forward pass or loss is already non-finite, as `replay --verify` notes.)
Proven: every step stays finite and the batch's loss falls. The first proven fix is applied for the rest of the run,
from the restored state (clipping and epsilon are read when the step is traced: the step
is traced again). Every trial leaves every variable and setting as it found it.
"""

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from nanscope.guard.guard import Rerun
from nanscope.guard.options import GuardOptions
from nanscope.guard.state import GuestState
from nanscope.model.optimizers import set_overrides
from nanscope.run.proven_fix import IN_PROCESS
from nanscope.tf_types import Batch, KerasModel, Optimizer

if TYPE_CHECKING:
    from nanscope.report.model import FirstNonfinite, TraceReport
    from nanscope.rules.evidence import RunEvidence
    from nanscope.rules.fixes import StepFix



class _Recorder(Protocol):
    """The guest's StepRecorder (keras/recorder.py), as far as the prover reads it."""

    @property
    def report(self) -> "TraceReport": ...

    @property
    def first_nonfinite(self) -> "FirstNonfinite | None": ...

CLIPPING = ("global_clipnorm", "clipnorm", "clipvalue")


@dataclass
class SavedStep:
    """What a rule's saved-step fix reads (`bundle_fixes(rec, bundle, run)`): the model (with its optimizer) and
    the batch."""

    model: KerasModel
    batch: Batch


class GuestFixProver:
    """Finds and applies the proven fix at a guest rollback.

    Args:
        state: GuestState. The step snapshot (the state before the held step and its batch).
        rerun: callable(batch) -> StepRecord. The compiled step again, from the variables as they are.
        optimizer: keras.Optimizer. Whose settings a fix changes.
        model: object with an `optimizer` attribute (the keras.Model in `fit`), for the rules' fixes.
        report: TraceReport being built; recorder: StepRecorder (its first non-finite step).
        evidence: callable() -> RunEvidence for the rules.
        retrace: callable(). After a change to a setting read at trace time: trace the step again.
    """

    def __init__(self, state: GuestState, rerun: Rerun, optimizer: Optimizer, model: KerasModel, report: "TraceReport",
                 recorder: _Recorder, evidence: Callable[[], "RunEvidence"], retrace: Callable[[], object]) -> None:
        self.state, self.rerun, self.optimizer, self.model = state, rerun, optimizer, model
        self.report, self.recorder, self.evidence, self.retrace = report, recorder, evidence, retrace

    def candidates(self, batch: Batch) -> list[tuple[str, str, dict[str, Any]]]:
        """(rule id, fix name, overrides) of the recommendations' in-process saved-step fixes, in their order."""
        from nanscope.keras.bundle_verify import FIXES
        from nanscope.rules.diagnose import diagnose

        report = self.report
        notes, first = list(report.notes), report.first_nonfinite
        report.first_nonfinite = first or self.recorder.first_nonfinite
        try:
            recommendations = diagnose(report, self.evidence())
        finally:
            report.notes[:], report.first_nonfinite = notes, first
        found, saved = [], SavedStep(self.model, batch)
        for rec in recommendations:
            build = FIXES.get(rec.id)
            try:
                fixes = build(rec, saved, report.run) if build is not None else []
            except Exception:  # a fix that does not fit this run's shape: not one a live run can take
                fixes = []
            for fix in fixes:
                overrides = in_process(fix)
                if overrides is not None:
                    found.append((rec.id, fix.name, overrides))
        return found

    def prove(self, start: int, failing: int, exclude: Collection[str] = ()
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """From the state now (the one restored, before step `start`): the first candidate (not named in
        `exclude`) under which the saved step's batch, trained on as many times as steps were rolled back, stays
        finite and its loss falls; applied.

        Returns:
            (fix, tried), as `proven_fix.FixProver.prove`.
        """
        if self.state.held_step() != failing:
            return {}, []
        batch, steps = self.state.batch(), failing - start + 1
        tried: list[dict[str, Any]] = []
        for rule, name, overrides in self.candidates(batch):
            if name in exclude:
                continue
            live = self.state.live()
            undo = self._set(overrides)
            try:
                proven, outcome = self._trial(batch, steps)
            finally:
                undo()
                self.state.put_live(live)
            tried.append({"fix": name, "rule": rule, "outcome": outcome})
            if proven:
                self._set(overrides)
                return {"rule": rule, "name": name, "params": overrides,
                        "why": f"from the restored state, {steps} step(s) on the saved batch of step {failing} with "
                               f"it: {outcome}; without it step {failing} was non-finite"}, tried
        return {}, tried

    def _trial(self, batch: Batch, steps: int) -> tuple[bool, str]:
        losses: list[float] = []
        for _ in range(steps):
            record = self.rerun(batch)
            if record.phase is not None:
                return False, f"non-finite at its step {len(losses) + 1} of {steps} ({record.phase} pass)"
            losses.append(record.loss)
        after = self.rerun(batch).loss  # the loss after the last fixed update
        change = f"its loss {losses[0]:.4g} -> {after:.4g}"
        if not (math.isfinite(after) and after < losses[0]):
            return False, f"finite, but its loss does not fall ({change})"
        return True, f"finite, and its loss falls ({change})"

    def _set(self, overrides: dict[str, Any]) -> Callable[[], None]:
        """Set `overrides` on the optimizer; the callable that puts them back."""
        return set_overrides(self.optimizer, overrides, self.retrace)


def in_process(fix: "StepFix") -> dict[str, Any] | None:
    """The optimizer overrides of a saved-step fix a live run can take (float settings of IN_PROCESS), or None.
    A clipping fix clears the other clipping modes, as Keras takes one at most."""
    params = fix.params
    if fix.acts_on != "update" or not params or not set(params) <= set(IN_PROCESS):
        return None
    if not all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in params.values()):
        return None
    overrides: dict[str, float | None] = {key: float(value) for key, value in params.items()}
    if set(overrides) & set(CLIPPING):
        overrides = {**{key: None for key in CLIPPING}, **overrides}
    return overrides


def guest_fixer(options: GuardOptions, state: GuestState, rerun: Rerun, optimizers: Sequence[Optimizer | None],
                model: KerasModel, recorder: _Recorder, evidence: Callable[[], "RunEvidence"],
                retrace: Callable[[], object]) -> GuestFixProver | None:
    """The GuestFixProver of a guest rollback (`GuardOptions.apply_fix`), or None: not under rollback, or no
    optimizer."""
    if options.on_nonfinite != "rollback" or not options.apply_fix or not optimizers or optimizers[0] is None:
        return None
    return GuestFixProver(state, rerun, optimizers[0], model, recorder.report, recorder, evidence, retrace)
