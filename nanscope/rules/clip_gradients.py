"""`clip-gradients`: the gradient norm growing geometrically toward float32's overflow."""

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from nanscope.rules.facts import Facts, HealthySteps
from nanscope.rules.fixes import Bundle, Change, Session, StepFix, optimizer_setting
from nanscope.rules.rule import Finding, Fixtures, Recommendation, Rule
from nanscope.rules.trends import geometric_growth

CLIP_GRADIENTS = Rule(
    "clip-gradients",
    "Clip the gradients",
    "Gradient norm spikes or geometric growth of the gradient norm.",
    "train:\n  optimizer: {global_clipnorm: 1.0}",
)
RULES = (CLIP_GRADIENTS,)
FIXTURES = Fixtures(fires=("sgd-momentum-exploding-regression",), quiet=("tabular-regression-adam",))

# A gradient norm that grows by more than 20% per step, sustained over at least
# GROWTH_MIN_STEPS steps and by GROWTH_MIN_TOTAL overall, is not noise: healthy
# SGD/Adam runs show norms that wander within a factor of a few.
GROWTH_RATE_LIMIT = 1.2
GROWTH_MIN_STEPS = 4
GROWTH_MIN_TOTAL = 100.0
# Largest finite float32 (numpy.finfo(float32).max): where a growing norm overflows.
FLOAT32_MAX = float(np.finfo(np.float32).max)
# Clipping threshold rule: the largest update an SGD-like step may make is about
# this fraction of the weights' norm.
CLIP_UPDATE_FRACTION = 0.01
# AutoClip (Seetharaman et al., 2020) clips at a low percentile of the observed norms.
CLIP_PERCENTILE = 10


def detect(facts: Facts) -> list[Finding]:
    """(score, Recommendation) pairs for a gradient norm growing geometrically to the last healthy step."""
    healthy = facts.healthy
    found = growth(healthy)
    if found is None:
        return []
    rate, onset = found
    last_step, last_norm = int(healthy.steps[-1]), float(healthy.grad_norm[-1])
    start_norm = float(healthy.grad_norm[healthy.steps == onset][0])
    overflow_step = projected_overflow_step(last_step, last_norm, rate)
    # A run seen only through fit keeps no initial weights: the first healthy step's norm stands in.
    initial = facts.initial_weight_norm
    threshold, how = clip_threshold(healthy.grad_norm, facts.run.get("optimizer_config", {}).get("learning_rate"),
                                    initial if initial is not None else float(healthy.weight_norm[0]))
    evidence = [
        f"gradient norm grew {rate:.2f}x per step from step {onset} "
        f"({start_norm:.3g} -> {last_norm:.3g} at step {last_step})",
        *([f"at that rate it overflows float32 around step {overflow_step:.0f}"] if overflow_step is not None else []),
        f"clip threshold {threshold:.3g}: {how}",
    ]
    fix = f"train:\n  optimizer: {{global_clipnorm: {threshold:.3g}}}   # or clipnorm / clipvalue"
    data = {"growth_rate": rate, "onset_step": onset, "projected_overflow_step": overflow_step,
            "threshold": threshold}
    return [(0.8, CLIP_GRADIENTS.recommend("error" if facts.failed else "warning", evidence, fix, data))]


def growth(healthy: HealthySteps) -> tuple[float, int] | None:
    """(per-step growth factor, onset step) of the gradient norm's geometric rise to the last healthy step, or None."""
    return geometric_growth(healthy.steps, healthy.grad_norm, GROWTH_RATE_LIMIT, GROWTH_MIN_STEPS, GROWTH_MIN_TOTAL)


def projected_overflow_step(step: int, norm: float, rate: float) -> float | None:
    """The step at which `norm`, growing `rate`x per step from `step`, passes float32's max; None if it cannot be said.

    A norm of exactly 0 (a run that fits its data perfectly) or a denormal one gives no
    finite projection, and a rate of at most 1 never overflows.
    """
    if not (norm > 0 and math.isfinite(norm) and rate > 1 and math.isfinite(rate)):
        return None
    steps_left = math.log(FLOAT32_MAX / norm) / math.log(rate)
    return step + steps_left if math.isfinite(steps_left) else None


def clip_threshold(grad_norms: ArrayLike, lr: float | None, weight_norm: float) -> tuple[float, str]:
    """A clipping threshold from the healthy steps' global gradient norms, and how it was chosen.

    Args:
        grad_norms: sequence of float. The healthy steps' global gradient norms.
        lr: float or None. The optimizer's learning rate; bounds the threshold so one step moves the weights
            by at most CLIP_UPDATE_FRACTION of their norm.
        weight_norm: float. The norm of the trainable weights before the first step where known, else after the
            first healthy step (which a first step that blew the weights up makes far too large); 0 when unknown.

    Returns:
        (float, str): the threshold, rounded to one significant digit, and why.
    """
    norms = np.asarray(grad_norms, dtype=np.float64)
    norms = norms[np.isfinite(norms)]
    percentile = float(np.percentile(norms, CLIP_PERCENTILE)) if len(norms) else 1.0
    if lr and weight_norm > 0:
        update_bound = CLIP_UPDATE_FRACTION * weight_norm / lr
        if update_bound < percentile:
            return round_threshold(update_bound), (
                f"so that one step of learning rate {lr:g} moves the weights (norm {weight_norm:.3g}) "
                f"by at most {CLIP_UPDATE_FRACTION:.0%}; the {CLIP_PERCENTILE}th percentile of healthy norms, "
                f"{percentile:.3g}, would allow larger steps"
            )
    return round_threshold(percentile), f"the {CLIP_PERCENTILE}th percentile of the healthy steps' gradient norms"


def round_threshold(value: float) -> float:
    """`value` to one significant digit (0.0347 -> 0.03); 1.0 for a value that is not positive and finite."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    digits = -math.floor(math.log10(value))
    return round(value, digits)


def verify_fixes(rec: Recommendation, session: Session, run: dict[str, Any]) -> list[Change]:
    """The run again with global clipping at the threshold the finding computed."""
    del session, run  # Unused
    threshold = rec.data.get("threshold") or 1.0
    return [Change(f"global_clipnorm={threshold:g}", {"global_clipnorm": threshold},
                   {"global_clipnorm": threshold, "clipnorm": None, "clipvalue": None})]


def bundle_fixes(rec: Recommendation, bundle: Bundle, run: dict[str, Any]) -> list[StepFix]:
    """The saved step with global clipping at the finding's threshold."""
    del bundle, run  # Unused
    threshold = rec.data.get("threshold") or 1.0
    return [StepFix(f"global_clipnorm={threshold:g}", {"global_clipnorm": threshold},
                    change=optimizer_setting("global_clipnorm", threshold, {"clipnorm": None, "clipvalue": None}))]
