"""Did the clipping take effect? Checked on real gradients, never taken on trust.

Two checks, reported per strategy:

1. `verify_optimizer_clip` (Keras optimizer modes): on the first batch, at the
   initial weights, three fresh copies of the run's optimizer each apply one update:
   the one with the clip option on the raw gradient, one without it on the gradient
   clipped by `keras_clip` (Keras' documented semantics), one without it on the raw
   gradient. The clipped optimizer's realised update Δw must equal the reference
   one; if it equals the unclipped one instead, the option was silently ignored. The
   gradient is scaled up first when needed so the threshold bites. Under loss scaling
   the clipped optimizer is wrapped in a LossScaleOptimizer and handed the scaled
   gradient, as in training: its inner optimizer must clip the unscaled one.
2. `step_effect` (every strategy): on each step where the raw gradient exceeded
   the threshold, the gradient the update used must be within it. Updates that a
   LossScaleOptimizer skipped are left out: nothing was applied.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope.run.clipping.transforms import STAT_COLUMNS, keras_clip
from nanscope.model.optimizers import build_optimizer
from nanscope.runtime import tensorflow
from nanscope.spec.sections import CLIP_FIELDS
from nanscope.tf_types import Tensor

if TYPE_CHECKING:
    from nanscope.run.clipping.strategies import Strategy
    from nanscope.run.session import Session

# float32 rounding of a clipped norm: the clipped value may exceed the threshold by a few ulps.
WITHIN_TOLERANCE = 1e-4
MATCH_RTOL, MATCH_ATOL = 1e-4, 1e-6
# The loss scale the first-step check hands a LossScaleOptimizer's gradients at (its own initial scale).
LOSS_SCALE_CHECKED = 2.0 ** 15


def clip_overrides(kind: str | None = None, threshold: float | None = None) -> dict[str, float | None]:
    """Optimizer overrides that switch every Keras clip option off, then `kind` on (a spec's own clip is dropped)."""
    overrides: dict[str, float | None] = {field: None for field in CLIP_FIELDS}
    if kind is not None:
        overrides[kind] = threshold
    return overrides


@dataclass
class OptimizerCheck:
    """The first-step check of a Keras optimizer clip option.

    Args:
        verified: bool or None. The realised update equals the reference-clipped one (None: could not test).
        ignored: bool. The realised update equals the unclipped one instead: the option had no effect.
        max_error: float. Largest |Δw - Δw_reference| over all weights.
        gradient_scale: float. Factor the real gradient was scaled by so the threshold bites.
        detail: str. One line for the report.
    """

    verified: bool | None
    ignored: bool
    max_error: float
    gradient_scale: float
    detail: str


def verify_optimizer_clip(session: Session, strategy: Strategy) -> OptimizerCheck:
    """Check on the first batch that the optimizer's clip option changes the update as Keras documents."""
    tf, _ = tensorflow()
    session.reset_weights()
    variables = list(session.model.trainable_variables)
    x, y = session.batch(0)
    with tf.GradientTape() as tape:
        loss = session.loss.total(session.loss.terms(y, session.model.call(x, training=True)))
    raw = tape.gradient(loss, variables)
    grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(raw, variables)]
    measure = _measure(grads, strategy.measure)
    if not math.isfinite(measure) or measure == 0.0:
        return OptimizerCheck(None, False, math.nan, 1.0,
                              f"not tested: the first gradient's {strategy.measure} is {measure:g}")
    assert strategy.threshold is not None  # set (given or derived) before a clipping strategy runs
    scale = max(1.0, 4.0 * strategy.threshold / measure)
    grads = [g * scale for g in grads]
    clipped = _update(session, *_as_trained(session, build_optimizer(
        session.spec, session.model, clip_overrides(strategy.kind, strategy.threshold)), grads))
    plain = build_optimizer(session.spec, session.model, clip_overrides())
    reference = _update(session, plain, keras_clip(grads, strategy.kind, strategy.threshold))
    unclipped = _update(session, build_optimizer(session.spec, session.model, clip_overrides()), grads)
    session.reset_weights()
    error = max(float(np.max(np.abs(a - b))) if a.size else 0.0 for a, b in zip(clipped, reference))
    matches = all(np.allclose(a, b, rtol=MATCH_RTOL, atol=MATCH_ATOL, equal_nan=True)
                  for a, b in zip(clipped, reference))
    ignored = not matches and all(np.allclose(a, b, rtol=MATCH_RTOL, atol=MATCH_ATOL)
                                  for a, b in zip(clipped, unclipped))
    scaled = f" (gradient scaled x{scale:.3g} so the threshold bites)" if scale > 1 else ""
    if session.scales_loss:
        scaled += (f"; applied through a LossScaleOptimizer, handed the gradient times its loss scale "
                   f"{LOSS_SCALE_CHECKED:g}, which it unscales before its inner optimizer clips")
    if matches:
        detail = ("the optimizer's first update equals an unclipped optimizer's update on the Keras-clipped "
                  f"gradient{scaled}")
    elif ignored:
        detail = f"the optimizer ignored {strategy.kind}: its update equals the unclipped one{scaled}"
    else:
        detail = f"first-step update differs from the Keras-clipped reference by up to {error:.3g}{scaled}"
    return OptimizerCheck(matches, ignored, error, scale, detail)


def _as_trained(session: Session, optimizer: Any, grads: list[Tensor]) -> tuple[Any, list[Tensor]]:
    """(optimizer, gradients) as a training step hands them over: under loss scaling, the optimizer wrapped in a
    LossScaleOptimizer and the gradients multiplied by its scale. The inner optimizer must clip the unscaled
    gradient; one that clipped the scaled one would update by a factor of the scale less."""
    if not session.scales_loss:
        return optimizer, grads
    _, keras = tensorflow()
    wrapped = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=LOSS_SCALE_CHECKED)
    return wrapped, [g * LOSS_SCALE_CHECKED for g in grads]


def _measure(grads: list[Tensor], measure: str | None) -> float:
    norms = [float(np.linalg.norm(g.numpy())) for g in grads]
    if measure == "max_abs":
        return max(float(np.max(np.abs(g.numpy()))) if g.shape.num_elements() else 0.0 for g in grads)
    if measure == "max_variable_norm":
        return max(norms)
    return math.sqrt(sum(n * n for n in norms))


def _update(session: Session, optimizer: Any, grads: list[Tensor]) -> list[np.ndarray]:
    """Δw of one optimizer step on `grads` from the initial weights (the weights are put back afterwards)."""
    session.reset_weights()
    variables = list(session.model.trainable_variables)
    before = [v.numpy() for v in variables]
    optimizer.build(variables)
    optimizer.apply_gradients(zip(grads, variables))
    return [v.numpy() - b for v, b in zip(variables, before)]


@dataclass
class StepEffect:
    """How clipping acted over a run (finite steps whose update was applied: not skipped by loss scaling).

    Args:
        clipped_fraction: float or None. Fraction of steps where the raw gradient exceeded the threshold.
        norm_removed: float or None. Mean fraction of the global gradient norm removed, over those steps.
        steps_bit: int. Steps where the threshold bit.
        steps_within: int. Of those, steps where the gradient the update used was within the threshold.
    """

    clipped_fraction: float | None
    norm_removed: float | None
    steps_bit: int
    steps_within: int

    @property
    def took_effect(self) -> bool | None:
        """True when every step where the threshold bit used a gradient within it (None when it never bit)."""
        return None if self.steps_bit == 0 else self.steps_within == self.steps_bit


def step_effect(strategy: Strategy, stats: np.ndarray | None, finite_steps: int, skipped: Iterable[bool] = ()
                ) -> StepEffect:
    """Summarise a ClipMonitor's per-step statistics for the first `finite_steps` steps.

    `skipped` flags, per step, the updates a LossScaleOptimizer skipped: their gradients overflowed
    float16 when scaled, so no clipped gradient was applied and their statistics (inf, NaN) say
    nothing about the clipping; they are left out.
    """
    if strategy.kind == "none" or finite_steps == 0:
        return StepEffect(None, None, 0, 0)
    # A clipping strategy: its monitor's statistics, its threshold (given or derived) and what it bounds.
    assert stats is not None and strategy.threshold is not None and strategy.measure is not None
    applied = np.ones(finite_steps, bool)
    flags = np.asarray(list(skipped)[:finite_steps], bool)
    applied[:len(flags)] = ~flags
    stats = stats[:finite_steps][applied]
    if len(stats) == 0:
        return StepEffect(None, None, 0, 0)
    raw = stats[:, STAT_COLUMNS.index("raw_" + strategy.measure)]
    used = stats[:, STAT_COLUMNS.index(strategy.measure)]
    bit = raw > strategy.threshold * (1 + WITHIN_TOLERANCE)
    within = used <= strategy.threshold * (1 + WITHIN_TOLERANCE)
    raw_global, used_global = stats[bit, 0], stats[bit, 3]
    removed = float(np.mean(1.0 - used_global / raw_global)) if bit.any() else 0.0
    return StepEffect(float(bit.mean()), removed, int(bit.sum()), int((bit & within).sum()))
