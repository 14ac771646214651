"""`lower-learning-rate`: updates far larger than healthy training makes, or a loss growing geometrically."""

from collections.abc import Callable
from typing import Any

import numpy as np

from nanscope.tf_types import KerasModel
from nanscope.model.learning_rate import (Schedule, inner_optimizer, lowered_learning_rate_fix, scaled_schedule,
                                          schedule_of)
from nanscope.rules.facts import Facts, HealthySteps
from nanscope.rules.fixes import Bundle, Change, ModelChange, Session, StepFix, optimizer_setting
from nanscope.rules.rule import Finding, Fixtures, Recommendation, Rule
from nanscope.rules.trends import geometric_growth

LOWER_LEARNING_RATE = Rule(
    "lower-learning-rate",
    "Lower the learning rate",
    "Update ratio |dw|/|w| far above what the optimizer normally makes, or loss and gradient norm growing "
    "geometrically from the start.",
    "train:\n  optimizer: {learning_rate: 0.001}",
)
RULES = (LOWER_LEARNING_RATE,)
FIXTURES = Fixtures(fires=("learning-rate-too-high",), quiet=("tabular-regression-adam",))

# |dw|/|w| around 1e-3 per step is the usual healthy range (Karpathy, "A Recipe for
# Training Neural Networks"); ten times that, sustained, is far above normal.
UPDATE_RATIO_LIMIT = 1e-2
# Adaptive optimizers divide each gradient element by its running RMS, so every weight moves by about the
# learning rate a step whatever its gradient: |dw|/|w| is then about lr / rms(w), and small models' weights
# (rms 0.1-1) give 1e-3 to 1e-2 at Adam's default rate 1e-3 (the realistic corpus' healthy Adam runs at 3e-3 and
# 1e-2 measure 0.012-0.028, their loss falling). Far above that normal band is twice its top.
ADAPTIVE_UPDATE_RATIO_LIMIT = 2e-2
# The optimizers (class names, as the run header gives them) whose step is normalised that way.
ADAPTIVE_OPTIMIZERS = {"Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adafactor", "Lion", "Lamb"}
# A run whose late loss is below this fraction of its early loss is making progress. A
# classifier starting at chance (log 2 = 0.69) that reaches 0.62 within 40 steps is
# learning, even if slowly: large Adam steps on a fresh Embedding are how it starts, so
# the update-ratio rule only warns when the loss has not fallen at all.
LOSS_PROGRESS_FRACTION = 0.98
# Loss growing by more than 20% a step, by 100x overall: training is diverging.
LOSS_GROWTH_RATE = 1.2
LOSS_GROWTH_MIN_TOTAL = 100.0
# Below this median |dw|/|w| (a hundredth of the ~1e-3 of healthy training) the weights
# hardly move, so a growing loss cannot be the learning rate's doing.
UPDATE_RATIO_NEGLIGIBLE = 1e-5
# Lower the learning rate by these factors (one experiment each).
LR_FACTORS = (10, 100)
RULE_FIX_LR = LOWER_LEARNING_RATE.fix


def detect_update_ratio(facts: Facts) -> list[Finding]:
    """(score, Recommendation) pairs for a median update ratio far above healthy training's."""
    healthy = facts.healthy
    ratios = healthy.update_ratio[1:]
    if len(ratios) < 2:
        return []
    median = float(np.median(ratios))
    limit, normal = update_ratio_limit(facts.run)
    if median <= limit:
        return []
    evidence = [f"median update ratio |dw|/|w| (all weights) over {len(ratios)} healthy steps: {median:.3g} "
                f"({normal}; limit {limit:g})"]
    # Large steps while the loss still falls are how small models start: only a finding
    # when the run also failed or stopped making progress.
    severity = "error" if facts.failed else "warning" if not loss_falling(healthy) else "info"
    fix = lowered_learning_rate_fix(facts.run) or RULE_FIX_LR
    return [(0.75, LOWER_LEARNING_RATE.recommend(severity, evidence, fix, {"median_update_ratio": median}))]


def update_ratio_limit(run: dict[str, Any]) -> tuple[float, str]:
    """(limit, what is normal, in words) of the median update ratio for the run's optimizer."""
    name = run.get("optimizer")
    if name in ADAPTIVE_OPTIMIZERS:
        return ADAPTIVE_UPDATE_RATIO_LIMIT, f"normal for {name}: 1e-3 to 1e-2 at its default rate"
    return UPDATE_RATIO_LIMIT, "healthy runs: ~1e-3"


def loss_falling(healthy: HealthySteps) -> bool:
    """True when the mean loss over the last third of the healthy steps is below that of the first third."""
    losses = healthy.loss[np.isfinite(healthy.loss)]
    if len(losses) < 6:
        return False
    third = len(losses) // 3
    return float(np.mean(losses[-third:])) < LOSS_PROGRESS_FRACTION * float(np.mean(losses[:third]))


def detect_loss_growth(facts: Facts) -> list[Finding]:
    """(score, Recommendation) pairs for a loss growing geometrically while the weights move."""
    healthy = facts.healthy
    ratios = healthy.update_ratio[1:]
    if len(ratios) and float(np.median(ratios)) < UPDATE_RATIO_NEGLIGIBLE:
        return []  # the weights barely move: the loss grows with the data, not with the learning rate
    found = geometric_growth(healthy.steps, healthy.loss, LOSS_GROWTH_RATE, 4, LOSS_GROWTH_MIN_TOTAL)
    if found is None:
        return []
    rate, onset = found
    start = float(healthy.loss[healthy.steps == onset][0])
    evidence = [f"loss grew {rate:.3g}x per step from step {onset} ({start:.3g} -> {float(healthy.loss[-1]):.3g} "
                f"at step {int(healthy.steps[-1])})"]
    severity = "error" if facts.failed else "warning"
    return [(0.74, LOWER_LEARNING_RATE.recommend(severity, evidence, data={"loss_growth_rate": rate,
                                                                            "onset_step": onset}))]


def verify_fixes(rec: Recommendation, session: Session, run: dict[str, Any]) -> list[Change]:
    """The run again at the learning rate divided by each of LR_FACTORS (a schedule: the same one, scaled)."""
    del rec  # Unused
    lr = run.get("optimizer_config", {}).get("learning_rate")
    if run.get("learning_rate_schedule"):  # the same schedule, scaled: its shape is part of the run
        from nanscope.model.optimizers import build_optimizer

        schedule = schedule_of(build_optimizer(session.spec, session.model))
        name = type(schedule).__name__
        return [Change(f"lr/{f}", {"learning_rate": f"{name} x 1/{f}"},
                       {"learning_rate": scaled_schedule(schedule, 1 / f)}) for f in LR_FACTORS]
    return [Change(f"lr/{f}", {"learning_rate": lr / f}, {"learning_rate": lr / f}) for f in LR_FACTORS] if lr else []


def bundle_fixes(rec: Recommendation, bundle: Bundle, run: dict[str, Any]) -> list[StepFix]:
    """The saved step at the learning rate divided by each of LR_FACTORS (a schedule: the same one, scaled)."""
    del rec  # Unused
    schedule = schedule_of(bundle.model.optimizer)
    if schedule is not None:  # the same schedule, scaled
        return [StepFix(f"lr/{f}", {"learning_rate": f"{type(schedule).__name__} x 1/{f}"},
                        change=_schedule(schedule, scaled_schedule(schedule, 1 / f))) for f in LR_FACTORS]
    lr = run.get("optimizer_config", {}).get("learning_rate")
    if not isinstance(lr, float):
        return []
    return [StepFix(f"lr/{f}", {"learning_rate": lr / f}, change=optimizer_setting("learning_rate", lr / f))
            for f in LR_FACTORS]


def _schedule(original: Schedule, scaled: Schedule) -> ModelChange:
    """A change that gives the optimizer another schedule (Keras' public setter takes one) and puts the original
    back after."""
    def change(model: KerasModel) -> Callable[[], None]:
        inner = inner_optimizer(model.optimizer)
        inner.learning_rate = scaled

        def undo() -> None:
            inner.learning_rate = original

        return undo

    return change
