"""`clamp-inverse-trig`: acos, asin or atanh fed values outside (-1, 1), as angular-margin losses (ArcFace,
CosFace) do when a cosine rounds to 1.0000001 or reaches exactly 1 (the gradient -1/sqrt(1 - x^2) is infinite)."""

from typing import Any

from nanscope.rules.domains import measured
from nanscope.rules.facts import Facts, FirstNonfinite
from nanscope.rules.operand import finding_data, operand, source_fix
from nanscope.rules.rule import Fixtures, Recommendation, Rule

CLAMP_INVERSE_TRIG = Rule(
    "clamp-inverse-trig",
    "Clamp the argument of acos, asin and atanh inside (-1, 1)",
    "An Acos, Asin or Atanh fed values outside its domain (a cosine that rounds past 1 is NaN), or exactly at "
    "-1 or 1, where its gradient is infinite.",
    "cos = tf.clip_by_value(cos, -1.0 + 1e-7, 1.0 - 1e-7)  # 1e-3 in float16\ntheta = tf.acos(cos)",
)
RULES = (CLAMP_INVERSE_TRIG,)
FIXTURES = Fixtures(fires=("arcface-2d-unclamped",), quiet=("arcface-2d-clamped",))
OPS = {"Acos", "Asin", "Atanh"}
CALLS = {"Acos": "tf.acos", "Asin": "tf.asin", "Atanh": "tf.atanh"}


def matches(first: FirstNonfinite, inputs: dict[str, Any], op: str | None) -> bool:
    """True for an inverse-trigonometric producer."""
    del first, inputs  # Unused
    return op in OPS


def finding(facts: Facts, first: FirstNonfinite, where: str, inputs: dict[str, Any]) -> Recommendation:
    """The Recommendation for an inverse-trigonometric op outside (-1, 1)."""
    del facts  # Unused
    op, name, domain = measured(first, inputs)
    assert op is not None  # `matches` took the producer for one of OPS
    extremes = f" (min {inputs.get('min', float('nan')):.9g}, max {inputs.get('max', float('nan')):.9g})"
    evidence = [f"{where}: {name} fed {operand(inputs)}{extremes}; "
                f"{domain}: "
                "a cosine computed from normalised vectors can round past 1, and reaches exactly 1 when an "
                "embedding lines up with its class centre"]
    eps = "1e-3" if inputs.get("dtype") == "float16" else "1e-7"
    snippet = f"x = tf.clip_by_value(x, -1.0 + {eps}, 1.0 - {eps})\ny = {CALLS.get(op, 'tf.acos')}(x)"
    return CLAMP_INVERSE_TRIG.recommend("error", evidence, source_fix(first, snippet), finding_data(first, inputs))
