"""Mixed-precision findings: float16 overflow and underflow, and a loss scale that has collapsed.

Keras' LossScaleOptimizer halves its scale and skips the update whenever the scaled
gradients overflow, and doubles it after a run of good steps; the scale has no floor and
may go below 1. Occasional skips are how it works; skipping most updates means no training
happens at all (keras#16100): `engine.loss_scale` judges that.
"""

import numpy as np

from nanscope.engine import loss_scale
from nanscope.engine.loss_scale import collapsed_window
from nanscope.history import PHASES
from nanscope.rules.catalogue import recommend

# Largest finite float16 (numpy.finfo(float16).max). Outputs within a factor of 2 of it
# overflow on the next doubling of the activations.
FLOAT16_MAX = float(np.finfo(np.float16).max)
FLOAT16_NEAR_OVERFLOW = FLOAT16_MAX / 2
# More than a tenth of a layer's non-zero float16 outputs below the smallest normal
# (6.1e-5) means their precision is gone and the next step flushes them to zero.
UNDERFLOW_FRACTION_LIMIT = 0.1
# The phases (as history's scalar columns number them) of a value that went non-finite before any gradient existed.
BEFORE_GRADIENTS = tuple(PHASES.index(phase) for phase in loss_scale.BEFORE_GRADIENTS)


def precision_findings(report, evidence, healthy):
    """(score, Recommendation) pairs for float16 layers and loss scaling."""
    found = []
    found.extend(_skipped_updates(report))
    found.extend(_float16_layers(report))
    return found


def overflow_rule(report):
    """The rule for a float16 value that overflows: loss scaling, or when a LossScaleOptimizer is already in use,
    keeping the layer in float32 (scaling the loss again cannot help)."""
    return "float32-layer" if report.run.get("loss_scaling") else "loss-scaling"


def _skipped_updates(report):
    history = report.history
    if history is None or not history.count:
        return []
    steps, skips, scales, before = (history.steps(), history.column("update_skipped"), history.column("loss_scale"),
                                    history.column("loss_scale_before"))
    window = collapsed_window(skips != 0, scales != 0, np.isin(history.column("phase"), BEFORE_GRADIENTS))
    if window is None:
        return []
    skipped = window[skips[window] != 0]
    first = window[0]
    first_scale = float(before[first] or (2 * scales[first] if skips[first] else scales[first]))
    last_scale = float(scales[window[-1]])
    evidence = [
        f"the LossScaleOptimizer skipped {len(skipped)} of the last {len(window)} updates (steps "
        f"{steps[skipped[0]]}-{steps[skipped[-1]]}): the gradients overflow float16 at every scale it tried",
        f"loss scale fell from {first_scale:g} to {last_scale:.3g}; no weight changed on those steps",
    ]
    fix = ("# the gradient itself is not finite: find the op with `nanscope trace-steps` on float32\n"
           "train:\n  mixed_precision: null   # or keep the failing layer in float32: dtype='float32'")
    return [(0.9, recommend(overflow_rule(report), "error", evidence, fix,
                            data={"skipped": len(skipped), "window": len(window), "loss_scale": last_scale}))]


def _float16_layers(report):
    found = []
    dtypes = report.run.get("layer_dtypes") or {}
    for index, (name, cls) in enumerate(report.layers):
        if dtypes.get(name) != "float16":
            continue
        aggregate = report.history.layers[index] if index < len(report.history.layers) else None
        if aggregate is None or not aggregate.called_steps:
            continue
        peak, underflow = aggregate.max_abs, aggregate.underflow_max
        if peak > FLOAT16_NEAR_OVERFLOW:
            found.append((0.65, recommend(overflow_rule(report), "warning", [
                f"layer {name} ({cls}, float16) output max |x| reached {peak:.4g}, within 2x of float16's "
                f"largest finite value {FLOAT16_MAX:g}"], _keep_float32(cls), data={"layer": name, "max_abs": peak})))
        if underflow > UNDERFLOW_FRACTION_LIMIT and not report.run.get("loss_scaling"):
            found.append((0.5, recommend("loss-scaling", "warning", [
                f"layer {name} ({cls}, float16): {underflow:.0%} of its non-zero outputs are below float16's "
                "smallest normal 6.1e-05 and lose precision"], _keep_float32(cls),
                data={"layer": name, "underflow_fraction": underflow})))
    return found


def _keep_float32(cls):
    return (f"keras.layers.{cls}(..., dtype='float32')   # keep this layer in float32 under mixed precision\n"
            "# and keep loss scaling on: keras.optimizers.LossScaleOptimizer(optimizer)")
