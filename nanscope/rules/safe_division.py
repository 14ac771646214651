"""`safe-division`: a RealDiv, Reciprocal or Rsqrt whose denominator holds exact zeros."""

from nanscope.rules.operand import finding_data, operand, source_fix
from nanscope.rules.rule import Fixtures, Rule

SAFE_DIVISION = Rule(
    "safe-division",
    "Keep denominators away from zero",
    "A RealDiv, Reciprocal or Rsqrt whose denominator holds exact zeros.",
    "y = a / (b + 1e-7)  # or tf.math.divide_no_nan(a, b); tf.math.rsqrt(v + 1e-7)",
)
RULES = (SAFE_DIVISION,)
FIXTURES = Fixtures(fires=("share-of-a-zero-total", "loss-file-mean-over-zero-count"),
                    quiet=("tabular-regression-adam",))
OPS = {"RealDiv", "Div", "Reciprocal", "Inv", "Rsqrt", "FloorDiv", "TruncateDiv", "Xdivy", "RsqrtGrad"}


def matches(first, inputs, op):
    """True for a division-like producer."""
    return op in OPS


def finding(facts, first, where, inputs):
    """The Recommendation for a division by zero."""
    evidence = [f"{where}: {first.op} fed {operand(inputs)}; dividing by 0 gives inf or NaN"]
    fix = source_fix(first, "a / (b + 1e-7)  # or tf.math.divide_no_nan(a, b); tf.math.rsqrt(v + 1e-7)")
    return SAFE_DIVISION.recommend("error", evidence, fix, finding_data(first, inputs))
