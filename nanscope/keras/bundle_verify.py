"""`nanscope replay DIR --verify` on a fit bundle: each fix nanscope can apply, tried on the saved step.

Every fix starts from the saved state before the step and runs the model's own
`train_step` once on the saved batch (changed, for a data fix), under the op watch
(`bundle_step.run_saved_step`). A fix is `helped` when the step's loss, its gradients
and its update stay finite and the loss on the same batch after the update is finite
too; a recommendation is `verified` when one of its fixes helped, `false` when none did.

What one step shows, and what it cannot: it shows whether a fix keeps THIS step
finite. It cannot show that training stays finite afterwards (`trace-steps --verify`
trains whole runs for that). When the weights from before the step already give a
non-finite forward pass or loss, a fix that acts only on the gradients or the update
(learning rate, clipping, epsilon) cannot change this step: it is not tried, and its
`verified` stays null (undecided), never a false "no". Past step 0 those weights are what
the earlier steps made of them, without the fix: a fix of the data or the model that
still fails on this step is undecided too (null), not "no".
"""

from typing import Any

from nanscope.keras.bundle_load import FitBundle
from nanscope.keras.bundle_step import StepOutcome, run_saved_step
from nanscope.report.model import TraceReport
from nanscope.rules.rule import Recommendation
from nanscope.rules.fixes import StepFix
from nanscope.rules.registry import bundle_fixers
from nanscope.run.verify import ranked_by_verification

__all__ = ["FIXES", "StepFix", "fixes_for", "verify_saved_step"]

# Phases in which the weights before the step already gave a non-finite value: a fix to the update comes too late.
BEFORE_UPDATE = ("forward", "loss")


def verify_saved_step(bundle: FitBundle, report: TraceReport, unfixed: StepOutcome) -> TraceReport:
    """Try the fixes of `report.recommendations` on the saved step; record `verification` and `verified` on each.

    Args:
        bundle: FitBundle.
        report: TraceReport of the replay.
        unfixed: StepOutcome of the replay without any fix.
    """
    step = int(bundle.document["step"])
    report.notes.append("--verify on a fit bundle tries each fix on the saved step only: it shows whether that one "
                        "step (its loss, gradients, update, and the loss after it) stays finite, not that training "
                        "stays finite afterwards nor that it learns (trace-steps --verify trains whole runs for that)")
    if unfixed.finite:
        report.notes.append(f"--verify: step {step} stayed finite when replayed without a fix, so one step cannot "
                            "tell a fix apart; no fix was tried")
        return report
    phase = unfixed.event.phase if unfixed.event is not None else None
    too_late = phase in BEFORE_UPDATE
    # Past step 0 the weights are what the run's earlier steps made of them: when they already give a non-finite
    # forward pass, a fix that fails on this step may still have prevented it from the start.
    inherited = step > 0 and report.first_nonfinite is not None and report.first_nonfinite.phase in BEFORE_UPDATE
    for rec in report.recommendations:
        fixes = fixes_for(rec, bundle, report)
        skipped = [fix.name for fix in fixes if too_late and fix.acts_on == "update"]
        fixes = [fix for fix in fixes if fix.name not in skipped]
        if skipped:
            report.notes.append(f"--verify: {', '.join(skipped)} ({rec.id}) not tried: the weights before step {step} "
                                f"already give a non-finite {phase}, which no change to the update can "
                                "undo on this step; whether it prevents the blow-up needs the steps before "
                                "(trace-steps --verify, or a new fit)")
        if not fixes:
            continue
        rec.verification = [_row(fix, _tried(bundle, fix), unfixed, step) for fix in fixes]
        rec.verified = any(row["helped"] for row in rec.verification)
        if not rec.verified and inherited:
            rec.verified = None
            report.notes.append(f"--verify: {rec.id}: step {step} stays non-finite with the fix, but its weights "
                                "come from the earlier steps, which ran without it: undecided")
    bundle.restore()
    report.recommendations = ranked_by_verification(report.recommendations)
    return report


def _tried(bundle: FitBundle, fix: StepFix) -> StepOutcome:
    return run_saved_step(bundle, fix.batch, fix.change)


def _row(fix: StepFix, outcome: StepOutcome, unfixed: StepOutcome, step: int) -> dict[str, Any]:
    event = outcome.event
    return {
        "fix": fix.name, "params": fix.params, "finite": outcome.finite,
        "first_nonfinite_step": None if outcome.finite else step, "steps_run": 1,
        "final_loss": outcome.loss_after, "best_loss": None, "val_loss": None,
        "unfixed_finite": unfixed.finite, "unfixed_final_loss": unfixed.loss_after, "unfixed_best_loss": None,
        "helped": outcome.finite, "one_step": True, "loss": outcome.loss, "unfixed_loss": unfixed.loss,
        # One step cannot show learning, nor a horizon: the row says so rather than calling a finite step fixed.
        "horizon": 1, "learns": None, "baseline": None,
        "verdict": ("the saved step stays finite; one step cannot show that it trains" if outcome.finite
                    else "the saved step is still non-finite"),
        "nonfinite_phase": event.phase if event is not None else None,
        "nonfinite_op": event.op if event is not None else None,
    }


def fixes_for(rec: Recommendation, bundle: FitBundle, report: TraceReport) -> list[StepFix]:
    """The StepFixes that apply `rec` to the saved step; [] when nanscope cannot apply it itself."""
    build = FIXES.get(rec.id)
    return build(rec, bundle, report.run) if build is not None else []


# The rules whose fix nanscope can apply to a saved fit step, by rule id: each rule module's `bundle_fixes`
# (rules/registry.py); a rule without one stays unverified.
FIXES = bundle_fixers()
