"""Whether a fix makes the run train, not only stay finite: its horizon, its learning, its loss against the others.

`trace-steps --verify` judges each fix it re-runs against the unfixed run on three counts:

- horizon: it stays finite for the run's steps, for HORIZON_FACTOR times the unfixed run's
  failing step, and, for a fix that slows training (a learning rate lowered k times), for k
  times that step, so that it travels as far as the failing run did. The verification run is
  extended to that horizon, up to MAX_HORIZON_STEPS (or the run's own steps when longer).
  A fix that goes non-finite within it only delays the failure.
- learning: its final loss (on the validation rows when there are some) ends below the trivial
  baseline, the loss of a constant prediction (`clipping.baseline`), by the margin that shows
  learning. A fix that stays finite without that has learned nothing.
- quality: its final loss relative to its baseline (unit-free: standardised targets change the
  loss's units), against the best fix's; verified fixes are ranked by it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from nanscope.run.clipping.baseline import Baseline, trivial_baseline

if TYPE_CHECKING:
    from nanscope.rules.fixes import Change
    from nanscope.rules.rule import Recommendation
    from nanscope.run.experiment import ExperimentResult
    from nanscope.run.session import Session

# A fix must stay finite at least this many times past the unfixed run's failing step: a failure
# that comes back at 2x or 3x the step was delayed, not fixed.
HORIZON_FACTOR = 4
# Verification runs are extended to their horizon up to this many steps (or the run's own steps,
# when longer): a rate lowered 100 times from a failure at step 45 would want 4500.
MAX_HORIZON_STEPS = 2000


def horizon(steps: int, failing_step: int | None, slowdown: float = 1.0) -> tuple[int, int]:
    """(steps to run, steps the horizon wants) for a fix of a run of `steps` that failed at `failing_step`.

    Args:
        steps: int. The run's own steps (`train.steps`).
        failing_step: int or None. The unfixed run's first non-finite step; None when it stayed finite.
        slowdown: float, default 1. How many times slower the fix trains (a learning rate lowered k times: k).
    """
    wanted = steps
    if failing_step is not None:
        wanted = max(steps, HORIZON_FACTOR * failing_step, math.ceil(slowdown * failing_step))
    return min(wanted, max(steps, MAX_HORIZON_STEPS)), wanted


def slowdown(change: Change, run: dict[str, Any]) -> float:
    """k when `change` lowers the run's learning rate k times, else 1."""
    before = (run.get("optimizer_config") or {}).get("learning_rate")
    after = change.optimizer_overrides.get("learning_rate")
    if not (isinstance(before, (int, float)) and isinstance(after, (int, float)) and 0 < after < before):
        return 1.0
    return before / after


def baseline_of(session: Session, change: Change | None = None) -> Baseline | None:
    """The trivial Baseline of the session's loss on the data `change` trains on (its own units when it rescales
    the targets), or None when nanscope has no constant for the loss or computing it failed."""
    try:
        with session.using_data(change.data if change is not None and change.rescales_loss else None):
            return trivial_baseline(session)
    except Exception:  # a baseline is evidence: without it a fix is judged on the horizon and its own losses
        return None


def judge(result: ExperimentResult, baseline: Baseline | None, steps: tuple[int, int], unfixed_step: int | None,
          fallback_reference: float | None) -> dict[str, Any]:
    """The verification row's verdict fields for one fix's ExperimentResult.

    Args:
        result: ExperimentResult of the fixed run.
        baseline: Baseline or None.
        steps: (run, wanted) from `horizon`.
        unfixed_step: int or None. The unfixed run's first non-finite step.
        fallback_reference: float or None. Without a baseline, the loss the fix must end below to count as
            learning (the unfixed run's final loss, or its first when that was not finite).
    """
    run_steps, wanted = steps
    metric_name, metric = ("validation", result.val_loss) if result.val_loss is not None else (
        "training", result.final_loss)
    if baseline is not None:
        learns = bool(baseline.beaten_by(metric))
    else:
        learns = bool(metric is not None and math.isfinite(metric) and (
            fallback_reference is None or not math.isfinite(fallback_reference) or metric < fallback_reference))
    relative = None
    if baseline is not None and baseline.value and learns and metric is not None:  # a fix that learns has a loss
        relative = metric / abs(baseline.value)
    if not result.finite:
        step = result.first_nonfinite_step
        later = unfixed_step is not None and step is not None and step > unfixed_step
        verdict = f"delays the failure to step {step}" if later else f"fails at step {step}"
    elif result.stalled:
        verdict = "stays finite only because loss scaling skipped its updates: it does not train"
    elif not learns:
        verdict = "stays finite but does not learn"
    else:
        verdict = "trains"
    return {
        "verdict": verdict, "helped": verdict == "trains", "learns": learns if result.finite else None,
        "horizon": run_steps, "horizon_wanted": wanted, "horizon_capped": run_steps < wanted,
        "loss_rows": metric_name, "judged_loss": metric, "relative_loss": relative,
        "baseline": baseline.value if baseline is not None else None,
        "baseline_rows": baseline.rows if baseline is not None else None,
    }


def score(rec: Recommendation) -> float:
    """A verified recommendation's rank key among the verified: its best fix's loss relative to its baseline
    (or its loss, without a baseline); lower is better."""
    values = [row.get("relative_loss") if row.get("relative_loss") is not None else row.get("judged_loss")
              for row in rec.verification if row.get("helped")]
    values = [v for v in values if v is not None and math.isfinite(v)]
    return min(values) if values else math.inf


def mark_best(recommendations: list[Recommendation]) -> None:
    """On every fix that trains: `vs_best`, its relative loss over the best such fix's (1.0 for the best)."""
    rows = [row for rec in recommendations for row in rec.verification
            if row.get("helped") and row.get("relative_loss") is not None]
    best = min((row["relative_loss"] for row in rows), default=None)
    for row in rows:
        row["vs_best"] = row["relative_loss"] / best if best else None
