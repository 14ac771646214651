"""`guard-op`: the fallback for a producer that no op rule covers. It names the op, its line, its operand's
statistics against the op's domain (`rules/domains.py`) and a guarded form of it, so that no localized NaN is
left without advice. It ranks below every rule that names a cause."""

from nanscope.rules.domains import domain_of, outside
from nanscope.rules.operand import finding_data, operand, source_fix
from nanscope.rules.rule import Fixtures, Rule

GUARD_OP = Rule(
    "guard-op",
    "Guard the op that produced the first non-finite value",
    "A producer op that no other rule covers: its operand measured against the op's domain, and a guarded form.",
    "x = tf.clip_by_value(x, -bound, bound)  # keep the op's operand inside its domain; or compute it in log space",
)
RULES = (GUARD_OP,)
FIXTURES = Fixtures(fires=("compound-growth-product",), quiet=("compound-growth-log-space",))
# Below every rule that names a cause (the scale, learning-rate and clipping rules score 0.6-0.8).
SCORE = 0.3


def finding(facts, first, where, inputs):
    """The Recommendation for a producer op that no other rule covers."""
    op = inputs.get("op") or first.op
    backward = first.phase == "backward"
    domain = domain_of(op)
    found = outside(op, inputs, backward)
    against = found or (f"inside its domain as measured ({domain.gradient if backward else domain.forward}): "
                        "the result overflowed")
    evidence = [f"{where}: {first.op}{f' (gradient of {op})' if backward else ''} fed {operand(inputs)}; "
                f"{against}"]
    return GUARD_OP.recommend("warning", evidence, source_fix(first, domain.guarded), finding_data(first, inputs))
