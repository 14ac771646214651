"""`finite-logits`: a Softmax or LogSoftmax fed infinite logits (+inf - inf = NaN), as a mask filled with +inf
(a sign slip) or a score forced with `float("inf")` gives. A row masked at every position with -inf is
`masked-softmax`'s."""

from typing import Any

from nanscope.rules.facts import Facts, FirstNonfinite
from nanscope.rules.operand import finding_data, operand, source_fix
from nanscope.rules.rule import Fixtures, Recommendation, Rule

FINITE_LOGITS = Rule(
    "finite-logits",
    "Keep the logits finite before a softmax",
    "A Softmax or LogSoftmax whose logits hold +inf (or -inf in a row that is not fully masked): the "
    "max-subtraction inside it gives inf - inf = NaN.",
    "scores = tf.where(mask, scores, -1e9)  # masked positions: a large negative finite fill, never +inf\n"
    "weights = tf.nn.softmax(scores, axis=-1)",
)
RULES = (FINITE_LOGITS,)
FIXTURES = Fixtures(fires=("attention-pooling-plus-inf-fill",), quiet=("attention-pooling-finite-fill",))
OPS = {"Softmax", "LogSoftmax"}


def matches(first: FirstNonfinite, inputs: dict[str, Any], op: str | None) -> bool:
    """True for a softmax fed non-finite logits."""
    del first  # Unused
    return op in OPS and inputs.get("nonfinite", 0) > 0


def finding(facts: Facts, first: FirstNonfinite, where: str, inputs: dict[str, Any]) -> Recommendation:
    """The Recommendation for a softmax of infinite logits."""
    del facts  # Unused
    evidence = [f"{where}: {first.op} fed {inputs.get('nonfinite')} non-finite logits ({operand(inputs)} over the "
                "finite ones); softmax subtracts the row's max, and inf - inf is NaN"]
    snippet = ("scores = tf.where(mask, scores, -1e9)  # a finite fill (float16: -32752), never +inf\n"
               "weights = tf.nn.softmax(scores, axis=-1)  # a score to force: a large finite one (1e4), not inf")
    return FINITE_LOGITS.recommend("error", evidence, source_fix(first, snippet), finding_data(first, inputs))
