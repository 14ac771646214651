"""`weight-constraint`: the weights' norm growing steadily without bound."""

import itertools
import math

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
FIXTURES = Fixtures(fires=(), quiet=("tabular-regression-adam",))

# All weights' norm ten times its start, and still rising over the last quarter of
# the run: healthy training moves weights by a fraction of their initial norm.
WEIGHT_GROWTH_LIMIT = 10.0


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
    return [(0.5, WEIGHT_CONSTRAINT.recommend("error" if facts.failed else "warning", evidence,
                                              data={"first": norms[0], "last": norms[-1]}))]
