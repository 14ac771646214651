"""`stable-exp`: an Exp fed values past log(dtype max)."""

import math
from typing import Any

import numpy as np

from nanscope.rules.facts import Facts, FirstNonfinite
from nanscope.rules.operand import finding_data, operand, source_fix
from nanscope.rules.rule import Fixtures, Recommendation, Rule

STABLE_EXP = Rule(
    "stable-exp",
    "Keep exp() below its overflow bound",
    "An Exp op fed values past log(dtype max) (88.7 in float32, 11.1 in float16).",
    "y = tf.nn.softplus(x)  # instead of log(1 + exp(x)); a positive scale: tf.nn.softplus(raw) + 1e-6\n"
    "# or: tf.reduce_logsumexp(x)  /  tf.exp(x - tf.stop_gradient(tf.reduce_max(x)))\n"
    "# a clamp last, below log(dtype max) less log(n) for a sum of n exps: tf.exp(tf.minimum(x, 80.0))  "
    "# 11.0 in float16",
)
RULES = (STABLE_EXP,)
FIXTURES = Fixtures(fires=("exp-overflow-layer",), quiet=("tabular-regression-adam",))
OPS = {"Exp", "Expm1"}
# exp(x) overflows once x exceeds log(dtype max): 88.72 for float32, 11.09 for float16.
EXP_OVERFLOW = {name: math.log(float(np.finfo(name).max)) for name in ("float16", "float32", "float64")}
EXP_OVERFLOW["bfloat16"] = EXP_OVERFLOW["float32"]
# A clamp for exp's argument that stays below the bound: exp(11) = 59874 < 65504 in float16.
EXP_CLAMP = {"float16": 11.0, "float32": 80.0, "float64": 80.0, "bfloat16": 80.0}
# An operand past this many times the bound is a scale problem, not an exp to clamp.
FAR_PAST = 2.0


def matches(first: FirstNonfinite, inputs: dict[str, Any], op: str | None) -> bool:
    """True for an exp-like producer fed a value past its dtype's overflow bound."""
    del first  # Unused
    bound = EXP_OVERFLOW.get(inputs.get("dtype", "float32"), EXP_OVERFLOW["float32"])
    return op in OPS and inputs.get("max", 0.0) > bound


def finding(facts: Facts, first: FirstNonfinite, where: str, inputs: dict[str, Any]) -> Recommendation:
    """The Recommendation for an exp that overflowed."""
    del facts  # Unused
    bound = EXP_OVERFLOW.get(inputs.get("dtype", "float32"), EXP_OVERFLOW["float32"])
    evidence = [f"{where}: {first.op} fed {operand(inputs)}; exp overflows {inputs.get('dtype', 'float32')} "
                f"past {bound:.4g} (log of the dtype's max)"]
    clamp = EXP_CLAMP.get(inputs.get("dtype", "float32"), EXP_CLAMP["float32"])
    high = inputs.get("max", 0.0)
    if high > FAR_PAST * bound:
        # A clamp this far below the operand saturates it: exp(clamp) everywhere, no gradient, nothing learned.
        evidence.append(f"its operand reaches {high:.4g}, {high / bound:.0f}x the bound: a clamp there saturates "
                        "every value; bring the inputs to unit scale first (normalize-inputs)")
    fix = source_fix(first, "tf.nn.softplus(x)  # for log(1 + exp(x)); a positive scale: tf.nn.softplus(raw) + 1e-6\n"
                            "# a log of a sum of exps: tf.reduce_logsumexp(x, axis); a ratio of exps: "
                            "tf.exp(x - tf.stop_gradient(tf.reduce_max(x, axis, keepdims=True)))\n"
                            f"# a clamp last: tf.exp(tf.minimum(x, {clamp}))  # {inputs.get('dtype', 'float32')}: "
                            f"log(max) = {bound:.4g}; less log(n) for a sum of n exps")
    return STABLE_EXP.recommend("error", evidence, fix, finding_data(first, inputs))
