"""`safe-division`: a RealDiv, Reciprocal or Rsqrt whose denominator holds exact zeros."""

from typing import Any

from nanscope.rules.facts import Facts, FirstNonfinite
from nanscope.rules.operand import finding_data, operand, source_fix
from nanscope.rules.rule import Fixtures, Recommendation, Rule

SAFE_DIVISION = Rule(
    "safe-division",
    "Keep denominators away from zero",
    "A RealDiv, Reciprocal or Rsqrt whose denominator holds exact zeros.",
    "keep = tf.not_equal(b, 0.0)  # a mean over ratios: leave the zero denominators out of it\n"
    "ratio = tf.where(keep, a / tf.where(keep, b, 1.0), 0.0)\n"
    "mean = tf.reduce_sum(ratio) / tf.maximum(tf.reduce_sum(tf.cast(keep, ratio.dtype)), 1.0)\n"
    "# a ratio a layer passes on: tf.where(keep, a / tf.where(keep, b, 1.0), 0.0)  (0 where b is 0)\n"
    "# or floor b >= 0 at a unit that means something for the data: a / tf.maximum(b, 1.0) for a count",
)
RULES = (SAFE_DIVISION,)
FIXTURES = Fixtures(fires=("share-of-a-zero-total", "loss-file-mean-over-zero-count", "mape-over-zero-counts"),
                    quiet=("tabular-regression-adam", "mape-floored-at-the-unit"))
# `b + 1e-7` keeps a zero denominator finite but divides by 1e-7 there: a MAPE over targets that can be 0 then
# weighs those rows 1e7 times and the predictions collapse to 0. A mean that leaves the zero rows out, or a floor at
# the data's own unit, keeps every row's weight what it means. The inner tf.where keeps the gradient finite too
# (the double where: the untaken branch must not divide by 0 either).
MEAN = "mean = tf.reduce_sum(ratio) / tf.maximum(tf.reduce_sum(tf.cast(keep, ratio.dtype)), 1.0)"
FLOOR = "# or floor b >= 0 at a unit that means something for the data: a / tf.maximum(b, 1.0) for a count"
# In the loss the division is a term of a mean (a MAPE, a masked MSE): the mean leaves the zero rows out. In a layer
# it is a value passed on (a share of a total): 0 where there is nothing to divide.
SNIPPETS = {
    "loss": ("keep = tf.not_equal(b, 0.0)  # leave the zero denominators out of the mean\n"
             f"ratio = tf.where(keep, a / tf.where(keep, b, 1.0), 0.0)\n{MEAN}\n{FLOOR}"),
    "layer": ("keep = tf.not_equal(b, 0.0)\n"
              "ratio = tf.where(keep, a / tf.where(keep, b, 1.0), 0.0)  # 0 where b is 0; the inner where keeps "
              f"the gradient finite\n# in a mean over ratios, leave those rows out of it: {MEAN}\n{FLOOR}"),
}


def in_loss(first: FirstNonfinite) -> bool:
    """True when the division is in the loss (a term of its mean), not in a layer."""
    return first.phase == "loss" or bool(getattr(first, "loss", None))


OPS = {"RealDiv", "Div", "Reciprocal", "Inv", "Rsqrt", "FloorDiv", "TruncateDiv", "Xdivy", "RsqrtGrad"}


def matches(first: FirstNonfinite, inputs: dict[str, Any], op: str | None) -> bool:
    """True for a division-like producer."""
    del first, inputs  # Unused
    return op in OPS


def finding(facts: Facts, first: FirstNonfinite, where: str, inputs: dict[str, Any]) -> Recommendation:
    """The Recommendation for a division by zero."""
    del facts  # Unused
    evidence = [f"{where}: {first.op} fed {operand(inputs)}; dividing by 0 gives inf or NaN"]
    fix = source_fix(first, SNIPPETS["loss" if in_loss(first) else "layer"])
    return SAFE_DIVISION.recommend("error", evidence, fix, finding_data(first, inputs))
