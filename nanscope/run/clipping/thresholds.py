"""Thresholds for strategies given without one, derived from the unclipped run's healthy steps.

One global-norm bound G comes from trace-steps' own rule (`rules.diagnose.clip_threshold`):
the 10th percentile of the healthy steps' global gradient norms, lowered so that one
step of the learning rate moves the weights by at most 1% of their norm. The other
modes get the bound that caps the global norm at the same G:

  global_clipnorm, manual_clip_by_global_norm   G
  clipnorm, manual_clip_by_norm                 G / sqrt(number of variables)
  clipvalue                                     G / sqrt(number of parameters)

`auto` is AutoClip (Seetharaman et al., 2020): the 10th percentile of the healthy
steps' global norms, with no learning-rate bound, applied with `tf.clip_by_global_norm`.
With fewer than AUTO_MIN_HEALTHY_STEPS healthy steps there is no percentile to take
(a run that goes non-finite at step 1 has one norm, the one that blew it up), so `auto`
uses G instead and says so.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope.rules.diagnose import CLIP_PERCENTILE, clip_threshold, round_threshold

if TYPE_CHECKING:
    from nanscope.run.clipping.strategies import Strategy
    from nanscope.run.experiment import ExperimentResult

FALLBACK_THRESHOLD = 1.0
# The 10th percentile is a norm that one healthy step in ten lies below: it needs at least ten steps.
# From fewer it is an interpolation between the smallest few norms, and from one step it is that
# step's norm, however far it is from what training can take.
AUTO_MIN_HEALTHY_STEPS = math.ceil(100 / CLIP_PERCENTILE)


def derive_thresholds(strategies: list[Strategy], unclipped: ExperimentResult, learning_rate: float | None,
                      parameter_count: int, weight_norm: float | None = None) -> dict[str, Any]:
    """Set the threshold of every strategy that has none, from the unclipped run's healthy steps.

    Args:
        strategies: list of Strategy. Changed in place.
        unclipped: ExperimentResult. The `none` run.
        learning_rate: float or None. The optimizer's learning rate.
        parameter_count: int. Trainable parameters of the model.
        weight_norm: float, optional. Norm of the trainable weights before the first step (the learning-rate
            bound is a fraction of it); default: the norm after the first healthy step.

    Returns:
        dict: how the thresholds were chosen, for the report.
    """
    healthy = unclipped.healthy_grad_norms()
    if len(healthy):
        if weight_norm is None:
            first = unclipped.first_healthy
            assert first is not None  # the first of the healthy steps just found
            weight_norm = math.hypot(*(v.weight_norm for v in first.variables))
        bound, how = clip_threshold(healthy, learning_rate, weight_norm)
    else:
        bound = FALLBACK_THRESHOLD
        how = f"the unclipped run had no healthy step to measure; fell back to {FALLBACK_THRESHOLD:g}"
    auto, auto_how, auto_from = _auto_threshold(healthy, bound, how)
    variables = len(unclipped.history.variables) if unclipped.steps_run else 1
    derived = {
        "global_clipnorm": (bound, f"G = {bound:g}: {how}"),
        "manual_clip_by_global_norm": (bound, f"G = {bound:g}: {how}"),
        "clipnorm": (round_threshold(bound / math.sqrt(max(1, variables))),
                     f"G / sqrt({variables} variables), so all variables clipped together stay within G = {bound:g}"),
        "clipvalue": (round_threshold(bound / math.sqrt(max(1, parameter_count))),
                      f"G / sqrt({parameter_count} parameters), so a gradient at the bound in every element has "
                      f"norm G = {bound:g}"),
        "auto": (auto, auto_how),
    }
    derived["manual_clip_by_norm"] = derived["clipnorm"]
    for strategy in strategies:
        if strategy.kind != "none" and strategy.threshold is None:
            strategy.threshold, strategy.threshold_source = derived[strategy.kind]
    return {"global_norm_bound": bound, "how": how, "healthy_steps": len(healthy), "auto_from": auto_from,
            "auto_min_healthy_steps": AUTO_MIN_HEALTHY_STEPS}


def _auto_threshold(healthy: np.ndarray, bound: float, how: str) -> tuple[float, str, str]:
    """(threshold, how it was chosen, and from what: "percentile", "global_norm_bound" or "fallback") for `auto`."""
    if len(healthy) >= AUTO_MIN_HEALTHY_STEPS:
        return (round_threshold(float(np.percentile(healthy, CLIP_PERCENTILE))),
                f"AutoClip: the {CLIP_PERCENTILE}th percentile of the global gradient norms of the unclipped "
                f"run's {len(healthy)} healthy steps", "percentile")
    if not len(healthy):
        return bound, how, "fallback"
    return bound, (f"AutoClip's {CLIP_PERCENTILE}th percentile needs at least {AUTO_MIN_HEALTHY_STEPS} healthy "
                   f"steps and the unclipped run had {len(healthy)}, so auto uses G = {bound:g}: {how}"), \
        "global_norm_bound"
