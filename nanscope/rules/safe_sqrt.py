"""`safe-sqrt`: Sqrt of 0 (its gradient is infinite) or of negative values (NaN)."""

from typing import Any

from nanscope.rules.facts import Facts, FirstNonfinite
from nanscope.rules.operand import finding_data, operand, source_fix
from nanscope.rules.rule import Fixtures, Recommendation, Rule

SAFE_SQRT = Rule(
    "safe-sqrt",
    "Keep sqrt() away from zero and negatives",
    "Sqrt of 0 (its gradient 0.5/sqrt(x) is infinite) or of negative values (NaN).",
    "y = tf.sqrt(x + 1e-7)  # or tf.sqrt(tf.maximum(x, 1e-7))",
)
RULES = (SAFE_SQRT,)
FIXTURES = Fixtures(fires=("norm-of-zero-activations",), quiet=("tabular-regression-adam",))
OPS = {"Sqrt"}


def matches(first: FirstNonfinite, inputs: dict[str, Any], op: str | None) -> bool:
    """True for a Sqrt producer."""
    del first, inputs  # Unused
    return op in OPS


def finding(facts: Facts, first: FirstNonfinite, where: str, inputs: dict[str, Any]) -> Recommendation:
    """The Recommendation for a sqrt at 0 or of a negative value."""
    del facts  # Unused
    why = ("its gradient 0.5/sqrt(x) is infinite at x = 0" if first.phase == "backward"
           else "sqrt of a negative value is NaN")
    evidence = [f"{where}: {first.op} ({'gradient of Sqrt' if first.phase == 'backward' else 'Sqrt'}) fed "
                f"{operand(inputs)}; {why}"]
    fix = source_fix(first, "tf.sqrt(x + 1e-7)  # or tf.sqrt(tf.maximum(x, 1e-7))")
    return SAFE_SQRT.recommend("error", evidence, fix, finding_data(first, inputs))
