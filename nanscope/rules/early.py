"""Early warnings: trends that end in NaN/Inf if nothing changes, found before they do.

Loss growing geometrically, layer outputs approaching the overflow bound of their
dtype, weight norms growing without bound. Each detector reads the healthy steps only
(history.Healthy: every healthy step's scalars, and the kept full rows of them); a
healthy run shows none of these.
"""

import itertools
import math

import numpy as np

from nanscope.engine.step import probed_layers
from nanscope.rules.catalogue import recommend
from nanscope.rules.limits import activation_limit
from nanscope.rules.trends import geometric_growth

# Layer outputs growing by more than 50% a step over at least 5 steps and by 1e4
# overall: healthy outputs settle within a small factor of their start.
OUTPUT_GROWTH_RATE = 1.5
OUTPUT_GROWTH_MIN_STEPS = 5
OUTPUT_GROWTH_MIN_TOTAL = 1e4
# Loss growing by more than 20% a step, by 100x overall: training is diverging.
LOSS_GROWTH_RATE = 1.2
LOSS_GROWTH_MIN_TOTAL = 100.0
# All weights' norm ten times its start, and still rising over the last quarter of
# the run: healthy training moves weights by a fraction of their initial norm.
WEIGHT_GROWTH_LIMIT = 10.0
# Below this median |dw|/|w| (a hundredth of the ~1e-3 of healthy training) the weights
# hardly move, so a growing loss cannot be the learning rate's doing.
UPDATE_RATIO_NEGLIGIBLE = 1e-5
RELU_NAMES = {"relu", "leaky_relu", "elu", "linear", "relu6"}


def early_findings(report, evidence, healthy):
    """(score, Recommendation) pairs for trends toward overflow in the healthy steps."""
    severity = "error" if report.first_nonfinite is not None else "warning"
    return _loss_growth(healthy, severity) + _activation_limits(report, evidence, healthy, severity) + \
        _weight_growth(healthy, severity)


def _loss_growth(healthy, severity):
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
    return [(0.74, recommend("lower-learning-rate", severity, evidence, data={"loss_growth_rate": rate,
                                                                                 "onset_step": onset}))]


def _activation_limits(report, evidence, healthy, severity):
    layers = {layer.name: layer for layer in probed_layers(evidence.keras_model)}
    found = []
    for index, (name, cls) in enumerate(report.layers):
        layer = layers.get(name)
        dtype = getattr(layer, "compute_dtype", "float32") if layer is not None else "float32"
        limit = activation_limit(dtype)
        # The largest value is exact over every healthy step, and so is the trend (see history.TREND_WINDOW).
        history = report.history
        peak = history.layers[index].max_abs_healthy if index < len(history.layers) else None
        if peak is None:
            continue
        steps, values = history.layer_trend(index)
        trend = geometric_growth(steps, values, OUTPUT_GROWTH_RATE, OUTPUT_GROWTH_MIN_STEPS, OUTPUT_GROWTH_MIN_TOTAL)
        if peak <= limit and (trend is None or not _relu_like(layer)):
            continue
        evidence = [f"layer {name} ({cls}, {dtype}) output max |x| reached {peak:.3g} "
                    f"(warning bound {limit:.3g} for {dtype})"]
        if trend is not None:
            evidence.append(f"it grew {trend[0]:.3g}x per step from step {trend[1]}")
        data = {"layer": name, "max_abs": peak, "limit": limit, "relu": _relu_like(layer)}
        found.append((0.65, recommend("bounded-activation", severity, evidence, data=data)))
    return found[:1]


def _relu_like(layer):
    activation = getattr(layer, "activation", None)
    name = getattr(activation, "__name__", "") if activation is not None else ""
    return name in RELU_NAMES - {"linear"} or type(layer).__name__ in ("ReLU", "LeakyReLU")


def _weight_growth(healthy, severity):
    norms = healthy.weight_norm.tolist()
    if len(norms) < 8 or not all(math.isfinite(n) for n in norms) or norms[0] <= 0:
        return []
    tail = norms[-max(2, len(norms) // 4):]
    if norms[-1] / norms[0] <= WEIGHT_GROWTH_LIMIT or any(b < a for a, b in itertools.pairwise(tail)):
        return []
    evidence = [f"weight norm (all weights) grew from {norms[0]:.3g} to {norms[-1]:.3g} over {len(norms)} steps "
                f"and is still rising (limit {WEIGHT_GROWTH_LIMIT:g}x)"]
    return [(0.5, recommend("weight-constraint", severity, evidence, data={"first": norms[0], "last": norms[-1]}))]
