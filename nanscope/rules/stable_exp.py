"""`stable-exp`: an Exp fed values past log(dtype max)."""

import math

import numpy as np

from nanscope.rules.operand import finding_data, operand, source_fix
from nanscope.rules.rule import Fixtures, Rule

STABLE_EXP = Rule(
    "stable-exp",
    "Keep exp() below its overflow bound",
    "An Exp op fed values past log(dtype max) (88.7 in float32, 11.1 in float16).",
    "y = tf.nn.softplus(x)  # instead of log(1 + exp(x))\n"
    "# or: tf.reduce_logsumexp(x)  /  tf.exp(x - tf.reduce_max(x))\n"
    "# or: tf.exp(tf.minimum(x, 80.0))  # 11.0 in float16 (log(65504) = 11.09)",
)
RULES = (STABLE_EXP,)
FIXTURES = Fixtures(fires=("exp-overflow-layer",), quiet=("tabular-regression-adam",))
OPS = {"Exp", "Expm1"}
# exp(x) overflows once x exceeds log(dtype max): 88.72 for float32, 11.09 for float16.
EXP_OVERFLOW = {name: math.log(float(np.finfo(name).max)) for name in ("float16", "float32", "float64")}
EXP_OVERFLOW["bfloat16"] = EXP_OVERFLOW["float32"]
# A clamp for exp's argument that stays below the bound: exp(11) = 59874 < 65504 in float16.
EXP_CLAMP = {"float16": 11.0, "float32": 80.0, "float64": 80.0, "bfloat16": 80.0}


def matches(first, inputs, op):
    """True for an exp-like producer fed a value past its dtype's overflow bound."""
    return op in OPS and inputs.get("max", 0.0) > EXP_OVERFLOW.get(inputs.get("dtype"), EXP_OVERFLOW["float32"])


def finding(facts, first, where, inputs):
    """The Recommendation for an exp that overflowed."""
    bound = EXP_OVERFLOW.get(inputs.get("dtype"), EXP_OVERFLOW["float32"])
    evidence = [f"{where}: {first.op} fed {operand(inputs)}; exp overflows {inputs.get('dtype', 'float32')} "
                f"past {bound:.4g} (log of the dtype's max)"]
    clamp = EXP_CLAMP.get(inputs.get("dtype"), EXP_CLAMP["float32"])
    fix = source_fix(first, "tf.nn.softplus(x)  # for log(1 + exp(x)); or tf.reduce_logsumexp, "
                            f"or tf.exp(tf.minimum(x, {clamp}))")
    return STABLE_EXP.recommend("error", evidence, fix, finding_data(first, inputs))
