"""`safe-pow`: a Pow outside its domain: a negative base with a non-integer exponent, a zero base with a negative
exponent, or in the backward pass a zero base with an exponent below 1 (its gradient y * x^(y-1) is infinite)."""

import math
from typing import Any

from nanscope.rules.domains import measured
from nanscope.rules.facts import Facts, FirstNonfinite
from nanscope.rules.operand import finding_data, operand, source_fix
from nanscope.rules.rule import Fixtures, Recommendation, Rule

SAFE_POW = Rule(
    "safe-pow",
    "Keep pow()'s base positive where its exponent needs it",
    "A Pow fed a negative base with a non-integer exponent (NaN), a zero base with a negative exponent (inf), or, "
    "in the backward pass, a zero base with an exponent below 1 (its gradient y * x^(y-1) is infinite).",
    "tf.pow(tf.maximum(x, 1e-6), p)  # the base floored above 0, as GeM pooling clamps it\n"
    "# a focal loss with gamma < 1: tf.pow(tf.maximum(1.0 - p_t, 1e-6), gamma)",
)
RULES = (SAFE_POW,)
FIXTURES = Fixtures(fires=("gem-pooling-without-clamp", "focal-loss-gamma-half"),
                    quiet=("gem-pooling-clamped", "focal-loss-gamma-half-floored"))
OPS = {"Pow"}


def matches(first: FirstNonfinite, inputs: dict[str, Any], op: str | None) -> bool:
    """True for a Pow producer."""
    del first, inputs  # Unused
    return op in OPS


def finding(facts: Facts, first: FirstNonfinite, where: str, inputs: dict[str, Any]) -> Recommendation:
    """The Recommendation for a Pow outside its domain."""
    del facts  # Unused
    backward = first.phase == "backward"
    said = _exponent(inputs)
    if backward:
        why = ("the gradient y * x^(y-1) is infinite at x = 0 for an exponent y below 1"
               if inputs.get("zero_fraction", 0.0) > 0 else "its gradient is not finite")
    elif inputs.get("negative_fraction", 0.0) > 0:
        why = "a negative base to a non-integer power is NaN"
    elif inputs.get("zero_fraction", 0.0) > 0:
        why = "0 to a negative power is inf"
    else:
        why = "the power overflows the dtype"
    _, name, domain = measured(first, inputs, "Pow")
    evidence = [f"{where}: {name} fed base {operand(inputs)}"
                + (f"; exponent {said}" if said else "") + f"; {why} ({domain})"]
    snippet = ("tf.pow(tf.maximum(x, 1e-6), y)  # floor the base: the gradient stays finite (y * 1e-6^(y-1))"
               if backward else "tf.pow(tf.maximum(x, 1e-6), y)  # the base floored above 0\n"
               "# or, to keep the sign: tf.sign(x) * tf.pow(tf.abs(x) + 1e-6, y)")
    data = finding_data(first, inputs)
    return SAFE_POW.recommend("error", evidence, source_fix(first, snippet), data)


def _exponent(inputs: dict[str, Any]) -> str:
    """"0.5" or "from 2.9 to 3.1" of the exponent's range the replay measured; "" when it was not."""
    low, high = inputs.get("exponent_min"), inputs.get("exponent_max")
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return ""
    integral = low == high and float(low).is_integer()
    return (f"{low:.4g}" if low == high else f"from {low:.4g} to {high:.4g}") + ("" if integral else
                                                                                  " (not an integer)")
