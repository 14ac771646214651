"""`loss-scaling` and `float32-layer`: float16 overflow and underflow, and a loss scale that has collapsed.

Keras' LossScaleOptimizer halves its scale and skips the update whenever the scaled
gradients overflow, and doubles it after a run of good steps; the scale has no floor and
may go below 1. Occasional skips are how it works; skipping most updates means no training
happens at all (keras#16100): `engine.loss_scale` judges that.
"""

from typing import Any

import numpy as np

from nanscope.engine import loss_scale
from nanscope.engine.loss_scale import collapsed_window
from nanscope.engine.schema import PHASES
from nanscope.rules.facts import Facts, FirstNonfinite
from nanscope.rules.fixes import Change, Session
from nanscope.rules.operand import finding_data, operand
from nanscope.rules.rule import Finding, Fixtures, Recommendation, Rule

LOSS_SCALING = Rule(
    "loss-scaling",
    "Scale the loss under mixed precision",
    "Without a LossScaleOptimizer: a float16 gradient overflowing (> 65504) or float16 outputs underflowing.",
    "optimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # dynamic loss scaling\n"
    "# or keep the overflowing layer in float32: keras.layers.Dense(..., dtype='float32')",
)
FLOAT32_LAYER = Rule(
    "float32-layer",
    "Keep the overflowing layer in float32",
    "A float16 value overflowing (> 65504) in the forward pass or the loss, which loss scaling cannot reach (it "
    "scales the gradients), or any float16 overflow with a LossScaleOptimizer already in use; a loss scale that "
    "collapses because the gradient overflows at every scale.",
    "keras.layers.Dense(..., dtype='float32')  # the layer that overflows keeps float32 under mixed_float16\n"
    "# or compute the op in float32: tf.exp(tf.cast(x, tf.float32))",
)
RULES = (LOSS_SCALING, FLOAT32_LAYER)
BY_ID = {rule.id: rule for rule in RULES}
FIXTURES = {
    "loss-scaling": Fixtures(fires=("float16-gradient-overflow-no-loss-scaling",),
                             quiet=("float16-denoiser-loss-scaling", "float16-loss-scaling")),
    "float32-layer": Fixtures(fires=("float16-overflow-no-loss-scaling",), quiet=("float16-loss-scaling",)),
}

# Largest finite float16 (numpy.finfo(float16).max). Outputs within a factor of 2 of it
# overflow on the next doubling of the activations.
FLOAT16_MAX = float(np.finfo(np.float16).max)
FLOAT16_NEAR_OVERFLOW = FLOAT16_MAX / 2
# More than a tenth of a layer's non-zero float16 outputs below the smallest normal
# (6.1e-5) means their precision is gone and the next step flushes them to zero.
UNDERFLOW_FRACTION_LIMIT = 0.1
# The phases (as history's scalar columns number them) of a value that went non-finite before any gradient existed.
BEFORE_GRADIENTS = tuple(PHASES.index(phase) for phase in loss_scale.BEFORE_GRADIENTS)


def detect(facts: Facts) -> list[Finding]:
    """(score, Recommendation) pairs for float16 layers and loss scaling."""
    found = []
    found.extend(_skipped_updates(facts))
    found.extend(_float16_layers(facts))
    return found


def overflow_rule(run: dict[str, Any], phase: str) -> Rule:
    """The rule for a float16 value that overflows in `phase`: keeping the layer in float32 when the value came
    before any gradient (the forward pass, the loss: loss scaling multiplies only the loss it differentiates, so it
    cannot stop a forward overflow) or when a LossScaleOptimizer is already in use (`run["loss_scaling"]`: scaling
    again cannot help); loss scaling for a gradient that overflows without one."""
    return FLOAT32_LAYER if run.get("loss_scaling") or phase in loss_scale.BEFORE_GRADIENTS else LOSS_SCALING


def matches_float16(first: FirstNonfinite, inputs: dict[str, Any]) -> bool:
    """True when the producing op computed in float16 before the update."""
    return inputs.get("dtype") == "float16" and first.phase != "update"


def float16_finding(facts: Facts, first: FirstNonfinite, where: str, inputs: dict[str, Any]) -> Recommendation:
    """The Recommendation for an op whose float16 value overflowed."""
    evidence = [f"{where}: {first.op} overflowed float16 (largest finite value {FLOAT16_MAX:g}); "
                f"{operand(inputs)}"]
    rule = overflow_rule(facts.run, first.phase)
    if facts.run.get("loss_scaling"):
        evidence.append("a LossScaleOptimizer is already in use: loss scaling protects the gradients, not this value")
    elif rule is FLOAT32_LAYER:
        evidence.append(f"the value overflowed in the {first.phase} pass, before any gradient: loss scaling "
                        "multiplies the loss's gradients, so it cannot stop it; the layer must compute in float32")
    fix = _keep_float32(first.layer_class) if rule is FLOAT32_LAYER and first.layer_class else None
    return rule.recommend("error", evidence, fix, data=finding_data(first, inputs))


def _skipped_updates(facts: Facts) -> list[Finding]:
    columns = facts.steps
    if columns is None:
        return []
    steps, skips, scales, before = (columns["step"], columns["update_skipped"], columns["loss_scale"],
                                    columns["loss_scale_before"])
    window = collapsed_window(skips != 0, scales != 0, np.isin(columns["phase"], BEFORE_GRADIENTS))
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
    return [(0.9, overflow_rule(facts.run, "backward").recommend("error", evidence, fix, data={
        "skipped": len(skipped), "window": len(window), "loss_scale": last_scale}))]


def _float16_layers(facts: Facts) -> list[Finding]:
    found = []
    dtypes = facts.run.get("layer_dtypes") or {}
    for layer in facts.layers:
        name, cls = layer.name, layer.cls
        if dtypes.get(name) != "float16" or not layer.called_steps:
            continue
        peak, underflow = layer.max_abs, layer.underflow_max
        if peak > FLOAT16_NEAR_OVERFLOW:
            found.append((0.65, overflow_rule(facts.run, "forward").recommend("warning", [
                f"layer {name} ({cls}, float16) output max |x| reached {peak:.4g}, within 2x of float16's "
                f"largest finite value {FLOAT16_MAX:g}"], _keep_float32(cls), data={"layer": name, "max_abs": peak})))
        if underflow > UNDERFLOW_FRACTION_LIMIT and not facts.run.get("loss_scaling"):
            found.append((0.5, LOSS_SCALING.recommend("warning", [
                f"layer {name} ({cls}, float16): {underflow:.0%} of its non-zero outputs are below float16's "
                "smallest normal 6.1e-05 and lose precision"], _keep_float32(cls),
                data={"layer": name, "underflow_fraction": underflow})))
    return found


def _keep_float32(cls: str | None) -> str:
    return (f"keras.layers.{cls}(..., dtype='float32')   # keep this layer in float32 under mixed precision\n"
            "# and keep loss scaling on: keras.optimizers.LossScaleOptimizer(optimizer)")


def verify_fixes(rec: Recommendation, session: Session, run: dict[str, Any]) -> list[Change]:
    """The run again under a LossScaleOptimizer (loss-scaling), when some layer computes in float16 without one."""
    del session  # Unused
    if rec.id != "loss-scaling" or not _float16_without_loss_scaling(run):
        return []
    return [Change("loss scaling", {"optimizer": "LossScaleOptimizer"}, loss_scaling=True)]


def _float16_without_loss_scaling(run: dict[str, Any]) -> bool:
    """True when some layer computes in float16 and the run's optimizer does not scale the loss."""
    dtypes = (run.get("layer_dtypes") or {}).values()
    return "float16" in dtypes and not run.get("loss_scaling")
