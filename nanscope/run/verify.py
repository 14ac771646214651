"""Verify recommendations by applying them: `trace-steps --verify`.

For each recommendation nanscope can apply itself (a lower learning rate, gradient
clipping at the computed threshold, relu -> relu6, a larger optimizer epsilon, loss
scaling, standardised inputs or regression targets) it
re-runs training from the same initial weights and batch order
with the fix applied, through `nanscope.run.experiment.run_experiment`, and judges it
against the unfixed run (`nanscope.run.fix_verdict`): it must stay finite to its horizon
(at least 4x the unfixed run's failing step, k times for a rate lowered k times) and
learn (end below the loss of a constant prediction). A recommendation is `verified: true`
when at least one of its fixes trains, `false` when none does, and stays `null` when
nanscope cannot apply it (a Log in the user's own loss: the evidence then names the line to change).
"""


from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope.run.experiment import Change, ExperimentResult, run_experiment
from nanscope.run.fix_verdict import baseline_of, horizon, judge, mark_best, score, slowdown
from nanscope.rules.bounded_activation import relu6_model
from nanscope.rules.learning_rate import LR_FACTORS
from nanscope.rules.optimizer_epsilon import SAFE_EPSILON
from nanscope.rules.registry import verify_fixers
from nanscope.rules.scale import standardized_inputs, standardized_targets

if TYPE_CHECKING:
    from nanscope.report.model import TraceReport
    from nanscope.rules.rule import Recommendation
    from nanscope.run.session import Session
    from nanscope.run.sources import LoadedData

__all__ = ["FIXES", "LR_FACTORS", "SAFE_EPSILON", "changes_for", "combined", "ranked_by_verification", "relu6_model",
           "standardized_inputs", "standardized_targets", "verify_recommendations"]


def verify_recommendations(session: Session, report: TraceReport) -> TraceReport:
    """Run the fix experiments for `report.recommendations`, record the results on each, rank by them.

    Each fix is judged by `fix_verdict`: it must stay finite to its horizon (extended past the
    run's steps when the unfixed run failed early or the fix slows training), and learn (end
    below the trivial baseline). When every fix that was tried failed on its own, natural
    combinations of them are tried (`COMBINATIONS`: standardised inputs and targets together, a
    data fix with a lower learning rate, clipping with a lower learning rate). Afterwards the
    fixes that train rank first, by their loss relative to their baseline; untried ones keep their
    place below them, and fixes that were tried and failed (or only delayed the failure, or did not
    learn) rank last; within the last two groups the order of the diagnosis stays.
    """
    judging = _Judging(session, report)
    tried: dict[str, tuple[Recommendation, list[Change]]] = {}
    for rec in report.recommendations:
        changes = changes_for(rec, session, report)
        if not changes:
            continue
        rec.verification = [judging.row(change) for change in changes]
        rec.verified = any(row["helped"] for row in rec.verification)
        tried[rec.id] = (rec, changes)
    if tried and not any(rec.verified for rec, _ in tried.values()):
        _verify_combinations(tried, judging)
    session.reset_weights()
    mark_best(report.recommendations)
    report.recommendations = ranked_by_verification(report.recommendations)
    return report


class _Judging:
    """Runs one fix to its horizon and judges it against the unfixed run (`fix_verdict.judge`)."""

    def __init__(self, session: Session, report: TraceReport) -> None:
        self.session, self.run = session, report.run
        self.unfixed = _baseline(report)
        self.failing_step = report.first_nonfinite.step if report.first_nonfinite is not None else None
        self.baseline = baseline_of(session)

    def row(self, change: Change) -> dict[str, Any]:
        steps = horizon(self.session.spec.train.steps, self.failing_step, slowdown(change, self.run))
        result = run_experiment(self.session, change, steps=steps[0])
        baseline = baseline_of(self.session, change) if change.rescales_loss else self.baseline
        reference = result.first_loss if change.rescales_loss else (
            self.unfixed["final_loss"] if self.unfixed["finite"] else self.unfixed["start_loss"])
        row = _row(result, self.unfixed)
        row.update(judge(result, baseline, steps, self.failing_step, reference))
        return row


# Fixes that address different causes and are applied together when each fails alone, as a
# user would: scale both ends of a regression, or scale the data and slow the steps. At most
# MAX_COMBINATIONS are run (each is one more training run).
COMBINATIONS = (
    ("normalize-inputs", "normalize-targets"),
    ("normalize-targets", "lower-learning-rate"),
    ("normalize-inputs", "lower-learning-rate"),
    ("clip-gradients", "lower-learning-rate"),
    ("normalize-inputs", "normalize-targets", "lower-learning-rate"),
)
MAX_COMBINATIONS = 3


def _verify_combinations(tried: dict[str, tuple[Recommendation, list[Change]]], judging: _Judging) -> None:
    runs = 0
    for ids in COMBINATIONS:
        if runs == MAX_COMBINATIONS:
            return
        if not all(rule_id in tried for rule_id in ids):
            continue
        members = [tried[rule_id] for rule_id in ids]
        change = combined([changes[0] for _, changes in members])
        runs += 1
        row = judging.row(change)
        for rec, _ in members:
            rec.verification.append({**row, "together_with": [other for other in ids if other != rec.id]})
            if row["helped"]:
                rec.verified = True
                rec.data["verified_with"] = [other for other in ids if other != rec.id]
        if row["helped"]:
            return


def combined(changes: list[Change]) -> Change:
    """One Change that applies every change in `changes`: their data changes in turn, their optimizer
    overrides merged, the first changed model; its loss is rescaled when any member's is."""
    def data(loaded: LoadedData) -> LoadedData:
        for change in changes:
            if change.data is not None:
                loaded = change.data(loaded)
        return loaded

    overrides: dict[str, Any] = {}
    params: dict[str, Any] = {}
    for change in changes:
        overrides.update(change.optimizer_overrides)
        params.update(change.params)
    return Change(
        " + ".join(change.name for change in changes), params, overrides,
        grad_transform=next((c.grad_transform for c in changes if c.grad_transform is not None), None),
        model=next((c.model for c in changes if c.model is not None), None),
        loss_scaling=next((c.loss_scaling for c in changes if c.loss_scaling is not None), None),
        data=data if any(c.data is not None for c in changes) else None,
        rescales_loss=any(c.rescales_loss for c in changes),
    )


def ranked_by_verification(recommendations: list[Recommendation]) -> list[Recommendation]:
    """Fixes that train first, by their best fix's loss relative to its baseline (`fix_verdict.score`); then those
    not tried; then those tried that did not train; stable within the last two."""
    rank = {True: 0, None: 1, False: 2}
    return sorted(recommendations, key=lambda rec: (rank[rec.verified], score(rec) if rec.verified else 0.0))


def changes_for(rec: Recommendation, session: Session, report: TraceReport) -> list[Change]:
    """The Changes that apply `rec` to this run; [] when nanscope cannot apply it itself."""
    fix = FIXES.get(rec.id)
    return fix(rec, session, report.run) if fix is not None else []


# The rules whose fix nanscope can apply itself and re-run (`--verify`), by rule id: each rule module's
# `verify_fixes` (rules/registry.py); a rule without one stays unverified.
FIXES = verify_fixers()


def _baseline(report: TraceReport) -> dict[str, Any]:
    history = report.history
    losses = history.column("loss") if history is not None else np.empty(0)
    phases = history.phases() if history is not None else np.empty(0, np.int64)
    finite = losses[(phases == 0) & np.isfinite(losses)]
    return {
        "finite": report.first_nonfinite is None,
        "final_loss": float(losses[-1]) if len(losses) else None,
        "best_loss": float(finite.min()) if len(finite) else None,
        "steps_run": len(losses),
        "start_loss": float(losses[0]) if len(losses) else None,
    }


def _row(result: ExperimentResult, baseline: dict[str, Any]) -> dict[str, Any]:
    """The measured part of a verification row: what the fixed run did, next to the unfixed run."""
    return {
        "fix": result.name, "params": result.params, "finite": result.finite,
        "first_nonfinite_step": result.first_nonfinite_step, "steps_run": result.steps_run,
        "final_loss": result.final_loss, "best_loss": result.best_loss, "val_loss": result.val_loss,
        "unfixed_finite": baseline["finite"], "unfixed_final_loss": baseline["final_loss"],
        "unfixed_best_loss": baseline["best_loss"], "unfixed_steps_run": baseline["steps_run"],
        # A run that stayed finite only because loss scaling skipped its updates trained nothing: no help.
        "skipped_updates": result.skipped_updates, "stalled": result.stalled,
    }
