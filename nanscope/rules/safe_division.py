"""`safe-division`: a RealDiv, Reciprocal or Rsqrt whose denominator holds exact zeros."""

from nanscope.rules.operand import finding_data, operand, source_fix
from nanscope.rules.rule import Fixtures, Rule

SAFE_DIVISION = Rule(
    "safe-division",
    "Keep denominators away from zero",
    "A RealDiv, Reciprocal or Rsqrt whose denominator holds exact zeros.",
    "y = a / tf.maximum(b, unit)  # floor the denominator at a unit that means something for the data (a count: 1)\n"
    "# or leave zero denominators out of the mean: keep = tf.not_equal(b, 0.0)\n"
    "# mean = tf.reduce_sum(tf.where(keep, a / tf.where(keep, b, 1.0), 0.0)) / "
    "tf.maximum(tf.reduce_sum(tf.cast(keep, a.dtype)), 1.0)",
)
RULES = (SAFE_DIVISION,)
FIXTURES = Fixtures(fires=("share-of-a-zero-total", "loss-file-mean-over-zero-count", "mape-over-zero-counts"),
                    quiet=("tabular-regression-adam", "mape-floored-at-the-unit"))
# `b + 1e-7` keeps a zero denominator finite but divides by 1e-7 there: a MAPE over targets that can be 0 then
# weighs those rows 1e7 times and the predictions collapse to 0. A floor at the data's own unit, or a mean that
# leaves the zero rows out, keeps every row's weight what it means.
SNIPPET = ("a / tf.maximum(b, unit)  # a denominator >= 0 floored at a unit of the data (a count: 1; |y_true| in "
           "MAPE: its smallest real value)\n"
           "# or leave the zero denominators out of the mean:\n"
           "keep = tf.not_equal(b, 0.0)\n"
           "ratio = tf.where(keep, a / tf.where(keep, b, 1.0), 0.0)\n"
           "mean = tf.reduce_sum(ratio) / tf.maximum(tf.reduce_sum(tf.cast(keep, ratio.dtype)), 1.0)")
OPS = {"RealDiv", "Div", "Reciprocal", "Inv", "Rsqrt", "FloorDiv", "TruncateDiv", "Xdivy", "RsqrtGrad"}


def matches(first, inputs, op):
    """True for a division-like producer."""
    del first, inputs  # Unused
    return op in OPS


def finding(facts, first, where, inputs):
    """The Recommendation for a division by zero."""
    del facts  # Unused
    evidence = [f"{where}: {first.op} fed {operand(inputs)}; dividing by 0 gives inf or NaN"]
    fix = source_fix(first, SNIPPET)
    return SAFE_DIVISION.recommend("error", evidence, fix, finding_data(first, inputs))
