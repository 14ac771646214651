"""`weight-constraint`: the weights' norm growing steadily without bound."""

import itertools
import math
from typing import Any

import numpy as np

from nanscope.rules.facts import Facts
from nanscope.rules.rule import Finding, Fixtures, Rule

WEIGHT_CONSTRAINT = Rule(
    "weight-constraint",
    "Constrain the weight norms",
    "Weight norms growing steadily without bound.",
    "keras.layers.Dense(units, kernel_constraint=keras.constraints.MaxNorm(3.0))\n"
    "# or weight decay: train: {optimizer: {name: adamw, weight_decay: 1.0e-4}}",
)
RULES = (WEIGHT_CONSTRAINT,)
FIXTURES = Fixtures(fires=("wgan-critic-without-weight-clipping",),
                    quiet=("tabular-regression-adam", "wgan-critic-max-norm"))

# All weights' norm ten times its start, and still rising over the last quarter of
# the run: healthy training moves weights by a fraction of their initial norm.
WEIGHT_GROWTH_LIMIT = 10.0
# A loss below 0 whose mean over the last quarter of the healthy steps is at least twice that of the quarter before
# (more negative) is falling without bound: a loss with a minimum levels off. With the weights growing, the loss has
# no minimum they can reach (one linear in the outputs, as a WGAN critic's without its weight clipping), so bounding
# the weights is the cure and the finding ranks above the gradient and learning-rate rules (0.8, 0.75), whose fixes
# only slow the growth; below the op and float16 rules, which name a producer.
UNBOUNDED_LOSS_FACTOR = 2.0
UNBOUNDED_LOSS_SCORE = 0.85


def detect(facts: Facts) -> list[Finding]:
    """(score, Recommendation) pairs for a weight norm ten times its start and still rising."""
    norms = facts.healthy.weight_norm.tolist()
    if len(norms) < 8 or not all(math.isfinite(n) for n in norms) or norms[0] <= 0:
        return []
    tail = norms[-max(2, len(norms) // 4):]
    if norms[-1] / norms[0] <= WEIGHT_GROWTH_LIMIT or any(b < a for a, b in itertools.pairwise(tail)):
        return []
    evidence = [f"weight norm (all weights) grew from {norms[0]:.3g} to {norms[-1]:.3g} over {len(norms)} steps "
                f"and is still rising (limit {WEIGHT_GROWTH_LIMIT:g}x)"]
    data: dict[str, Any] = {"first": norms[0], "last": norms[-1]}
    falling = unbounded_loss(facts.healthy.loss)
    if falling is not None:
        evidence.append(f"the loss fell below 0 and keeps falling with them (mean {falling[0]:.3g}, then "
                        f"{falling[1]:.3g} over the last two quarters of the steps): it has no minimum the weights "
                        "can reach, so bounding them bounds it")
        data["unbounded_loss"] = True
    score = UNBOUNDED_LOSS_SCORE if falling is not None else 0.5
    return [(score, WEIGHT_CONSTRAINT.recommend("error" if facts.failed else "warning", evidence, data=data))]


def unbounded_loss(losses: np.ndarray) -> tuple[float, float] | None:
    """(mean of the next-to-last quarter, mean of the last quarter) of `losses` when they are below 0 and the last is
    UNBOUNDED_LOSS_FACTOR times the one before or more; else None."""
    quarter = len(losses) // 4
    if quarter < 2 or not np.isfinite(losses).all():
        return None
    before, last = float(np.mean(losses[-2 * quarter:-quarter])), float(np.mean(losses[-quarter:]))
    return (before, last) if before < 0 and last <= UNBOUNDED_LOSS_FACTOR * before else None
