"""`double-where`: a NaN gradient from an op whose forward value a tf.where threw away."""

from typing import Any

from nanscope.rules.facts import Facts, FirstNonfinite
from nanscope.rules.operand import finding_data, operand
from nanscope.rules.rule import Fixtures, Recommendation, Rule

DOUBLE_WHERE = Rule(
    "double-where",
    "Make the op's input safe inside the tf.where branch (the double where)",
    "A NaN gradient from an op whose forward value a tf.where threw away (e.g. `total / count` where "
    "count is 0): the untaken branch gets a zero gradient, and 0 times an infinite derivative is NaN.",
    "safe = tf.where(count > 0, count, 1.0)\nmean = tf.where(count > 0, total / safe, 0.0)",
)
RULES = (DOUBLE_WHERE,)
FIXTURES = Fixtures(fires=("tf-where-gradient-trap",), quiet=("tabular-regression-adam",))
# Divisions of two operands (`total / count`): the denominator is made safe inside the branch.
DIVISIONS = {"RealDiv", "Div", "Xdivy", "FloorDiv", "TruncateDiv", "DivNoNan"}
# Ops of one operand: (the call, the guard that keeps it inside its domain).
UNARY = {"Log": ("tf.math.log", "x > 0"), "Sqrt": ("tf.sqrt", "x > 0"), "Rsqrt": ("tf.math.rsqrt", "x > 0"),
         "Reciprocal": ("tf.math.reciprocal", "x != 0"), "Inv": ("tf.math.reciprocal", "x != 0")}


def matches(first: FirstNonfinite) -> bool:
    """True for a backward-pass producer whose forward value a tf.where discarded."""
    return first.phase == "backward" and bool((first.context or {}).get("discarded_by"))


def finding(facts: Facts, first: FirstNonfinite, where: str, inputs: dict[str, Any]) -> Recommendation:
    """The Recommendation for the gradient of an op inside the untaken branch of a tf.where."""
    del facts  # Unused
    context = first.context or {}
    forward_op = inputs.get("op") or first.op
    select = context["discarded_by"]
    at = f" at {select['source']}" if select.get("source") else ""
    thrown = context.get("forward_nonfinite")
    evidence = [f"{where}: the gradient of {forward_op} is not finite, though the forward value of that "
                f"{forward_op} was thrown away by a tf.where ({select['op']}{at})"
                + (f"; {thrown} of its forward values were non-finite" if thrown else ""),
                f"{forward_op} fed {operand(inputs)}; the tf.where passes a zero gradient to the branch it did not "
                f"take, and 0 times the op's infinite local derivative is NaN"]
    if forward_op in DIVISIONS:
        snippet = ("safe = tf.where(count > 0, count, 1.0)  # make the input safe inside the branch first\n"
                   "mean = tf.where(count > 0, total / safe, 0.0)")
    else:
        op_call, guard = UNARY.get(forward_op, ("f", "x > 0")) if forward_op is not None else ("f", "x > 0")
        snippet = (f"safe = tf.where({guard}, x, 1.0)  # make the input safe inside the branch first\n"
                   f"y = tf.where({guard}, {op_call}(safe), 0.0)")
    lines = [f"# {first.source}: the op" if first.source else None,
             f"# {select['source']}: the tf.where" if select.get("source") else None, snippet]
    data = {**finding_data(first, inputs), "discarded_by": select, "forward_nonfinite": thrown}
    return DOUBLE_WHERE.recommend("error", evidence, "\n".join(line for line in lines if line), data)
