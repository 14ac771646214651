"""One table of op domains: where each op, and its gradient, is finite, and a guarded form of it.

The op rules (`safe_pow`, `inverse_trig`, `poles`, `finite_logits`) and the fallback
`guard-op` read it to say how the operand the forensic replay measured (`inputs`: min, max,
the zero and negative fractions) falls outside the op's domain.
"""

import math
from dataclasses import dataclass
from typing import Any

from nanscope.rules.facts import FirstNonfinite


@dataclass(frozen=True)
class Domain:
    """Where an op is finite.

    Args:
        forward: str. The operand values for which the op's value is finite ("x > 0").
        gradient: str. Those for which its gradient is finite.
        guarded: str. The op written so that its operand stays inside both (a code snippet).
    """

    forward: str
    gradient: str
    guarded: str


OP_DOMAINS = {
    "Log": Domain("x > 0", "x > 0 (1/x)", "tf.math.log(tf.maximum(x, 1e-7))"),
    "Log1p": Domain("x > -1", "x > -1 (1/(1+x))", "tf.math.log1p(tf.maximum(x, -1.0 + 1e-6))"),
    "Xlogy": Domain("y > 0 wherever x != 0", "y > 0", "tf.math.xlogy(x, tf.maximum(y, 1e-7))"),
    "Xlog1py": Domain("y > -1 wherever x != 0", "y > -1", "tf.math.xlog1py(x, tf.maximum(y, -1.0 + 1e-6))"),
    "Sqrt": Domain("x >= 0", "x > 0 (0.5/sqrt(x))", "tf.sqrt(tf.maximum(x, 1e-12))"),
    "Rsqrt": Domain("x > 0", "x > 0", "tf.math.rsqrt(tf.maximum(x, 1e-12))"),
    "RealDiv": Domain("denominator != 0", "denominator != 0", "a / tf.where(tf.equal(b, 0.0), 1.0, b)"),
    "Reciprocal": Domain("x != 0", "x != 0", "1.0 / tf.where(tf.equal(x, 0.0), 1.0, x)"),
    "Exp": Domain("x < log(dtype max): 88.7 in float32, 11.1 in float16", "the same",
              "tf.exp(x - tf.stop_gradient(tf.reduce_max(x)))  # or softplus / logsumexp"),
    "Pow": Domain("x > 0 for a non-integer exponent; x != 0 for a negative one", "x > 0 for an exponent below 1 "
              "(y * x^(y-1) is infinite at x = 0)", "tf.pow(tf.maximum(x, 1e-6), y)"),
    "Acos": Domain(
        "-1 <= x <= 1", "-1 < x < 1 (-1/sqrt(1-x^2))", "tf.acos(tf.clip_by_value(x, -1.0 + 1e-7, 1.0 - 1e-7))"),
    "Asin": Domain(
        "-1 <= x <= 1", "-1 < x < 1 (1/sqrt(1-x^2))", "tf.asin(tf.clip_by_value(x, -1.0 + 1e-7, 1.0 - 1e-7))"),
    "Atanh": Domain(
        "-1 < x < 1", "-1 < x < 1 (1/(1-x^2))", "tf.atanh(tf.clip_by_value(x, -1.0 + 1e-7, 1.0 - 1e-7))"),
    "Acosh": Domain("x >= 1", "x > 1", "tf.acosh(tf.maximum(x, 1.0 + 1e-6))"),
    "Lgamma": Domain("x not 0, -1, -2, ...", "x not 0, -1, -2, ... (digamma)",
                     "tf.math.lgamma(tf.nn.softplus(raw) + 1e-6)  # a positive parameter, not a relu output"),
    "Digamma": Domain("x not 0, -1, -2, ...", "x not 0, -1, -2, ... (polygamma)",
                  "tf.math.digamma(tf.nn.softplus(raw) + 1e-6)"),
    "Softmax": Domain("finite logits (inf - inf = NaN)", "finite logits",
                  "tf.nn.softmax(tf.where(tf.math.is_inf(logits), tf.sign(logits) * 1e9, logits))"),
    "LogSoftmax": Domain("finite logits (inf - inf = NaN)", "finite logits",
                     "tf.nn.log_softmax(tf.where(tf.math.is_inf(logits), tf.sign(logits) * 1e9, logits))"),
    "Tan": Domain("x != pi/2 + k pi", "the same", "tf.tan(tf.clip_by_value(x, -1.57, 1.57))"),
    "Prod": Domain("|product| <= the dtype's max (3.4e38 in float32)", "the same",
               "log_prod = tf.reduce_sum(tf.math.log(x), axis=-1, keepdims=True)  # the product's axis, in log space"),
    "Cumprod": Domain("|product| <= the dtype's max (3.4e38 in float32)", "the same",
                  "log_cumprod = tf.math.cumsum(tf.math.log(x), axis=-1)  # keep the product in log space"),
}
for _alias, _op in (("Div", "RealDiv"), ("Inv", "Reciprocal"), ("Xdivy", "RealDiv"), ("Expm1", "Exp")):
    OP_DOMAINS[_alias] = OP_DOMAINS[_op]
# An op not in the table: its value must fit its dtype.
OVERFLOW = Domain("|result| <= the dtype's max (3.4e38 in float32, 65504 in float16)", "the same",
                  "x = tf.clip_by_value(x, -bound, bound)  # a bound under which the op stays finite in its dtype; "
                  "or normalise x first")


def domain_of(op: str | None) -> Domain:
    """The Domain of op type `op` (OVERFLOW for an op without an entry)."""
    return OP_DOMAINS.get(op, OVERFLOW) if op is not None else OVERFLOW


def domain_text(op: str | None, backward: bool) -> str:
    """The words of op's domain: its gradient's when `backward`, else its forward one."""
    domain = domain_of(op)
    return domain.gradient if backward else domain.forward


def producer(first: FirstNonfinite, op: str | None, backward: bool) -> str:
    """The producer as the evidence names it: `first.op`, and `(gradient of OP)` on the backward pass."""
    return f"{first.op}{f' (gradient of {op})' if backward else ''}"


def measured(first: FirstNonfinite, inputs: dict[str, Any], op: str | None = None) -> tuple[str | None, str, str]:
    """(op, the producer as the evidence names it, the operand against the domain in words) for the op that
    produced the first non-finite value: "outside ...'s domain ..." when min and max show it, else "domain ..." of the
    pass it failed in (the gradient's on the backward pass). `op` defaults to the op the replay measured."""
    op = op or inputs.get("op") or first.op
    backward = first.phase == "backward"
    return op, producer(first, op, backward), outside(op, inputs, backward) or f"domain {domain_text(op, backward)}"


def outside(op: str | None, inputs: dict[str, Any], backward: bool) -> str | None:
    """How the measured operand `inputs` falls outside op's (gradient's) domain, in words; None if min and max
    do not show it (the operand then looks in range, and the result overflowed)."""
    if op is None:
        return None
    low, high = inputs.get("min", math.nan), inputs.get("max", math.nan)
    zeros, negatives = inputs.get("zero_fraction", 0.0), inputs.get("negative_fraction", 0.0)
    checks = {
        "Log": negatives > 0 or zeros > 0, "Sqrt": negatives > 0 or (backward and zeros > 0),
        "Rsqrt": negatives > 0 or zeros > 0, "Log1p": low <= -1, "Xlog1py": low <= -1,
        "Xlogy": negatives > 0 or zeros > 0, "RealDiv": zeros > 0, "Reciprocal": zeros > 0,
        "Acos": low < -1 or high > 1 or (backward and (low <= -1 or high >= 1)),
        "Asin": low < -1 or high > 1 or (backward and (low <= -1 or high >= 1)),
        "Atanh": low <= -1 or high >= 1, "Acosh": low < 1 or (backward and low <= 1),
        "Lgamma": low <= 0 and (zeros > 0 or negatives > 0), "Digamma": low <= 0 and (zeros > 0 or negatives > 0),
        "Pow": negatives > 0 or zeros > 0,
    }
    canonical = {"Div": "RealDiv", "Xdivy": "RealDiv", "Inv": "Reciprocal"}.get(op, op)
    if not checks.get(canonical, False):
        return None
    return f"outside {'its gradient' if backward else op}'s domain {domain_text(op, backward)}"
