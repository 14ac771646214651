"""`guard-op`: the fallback for a localized producer that no rule explains. It names the op, its line, its
operand's statistics against the op's domain (`rules/domains.py`) and a guarded form of it, so that no localized
NaN is left without advice. A fallback (`registry.FALLBACKS`): it runs only when no other rule found anything at
warning or error level, since guarding an op that overflows because training diverged (a MatMul under a too-large
learning rate) would only hide the divergence that the other rules name."""

from typing import Any

from nanscope.rules.domains import domain_of, domain_text, outside, producer
from nanscope.rules.facts import Facts, FirstNonfinite
from nanscope.rules.operand import finding_data, operand, source_fix, where
from nanscope.rules.rule import Finding, Fixtures, Recommendation, Rule

GUARD_OP = Rule(
    "guard-op",
    "Guard the op that produced the first non-finite value",
    "A localized producer op that no other rule explains (nothing else at warning or error): its operand "
    "measured against the op's domain, and a guarded form.",
    "x = tf.clip_by_value(x, -bound, bound)  # keep the op's operand inside its domain; or compute it in log space",
)
RULES = (GUARD_OP,)
FIXTURES = Fixtures(fires=("compound-growth-product",), quiet=("compound-growth-log-space",))
# Below every rule that names a cause (the scale, learning-rate and clipping rules score 0.6-0.8).
SCORE = 0.3


def detect(facts: Facts) -> list[Finding]:
    """(score, Recommendation) pairs for the producer op of the first non-finite value, when the replay named one."""
    first = facts.first
    if first is None or first.phase in ("data", "update"):
        return []
    inputs = first.inputs or {}
    if (inputs.get("op") or first.op) is None:
        return []
    return [(SCORE, finding(facts, first, where(first), inputs))]


def finding(facts: Facts, first: FirstNonfinite, where: str, inputs: dict[str, Any]) -> Recommendation:
    """The Recommendation for a producer op that no other rule covers."""
    del facts  # Unused
    op = inputs.get("op") or first.op
    backward = first.phase == "backward"
    domain = domain_of(op)
    found = outside(op, inputs, backward)
    against = found or (f"inside its domain as measured ({domain_text(op, backward)}): "
                        "the result overflowed")
    evidence = [f"{where}: {producer(first, op, backward)} fed {operand(inputs)}; "
                f"{against}"]
    return GUARD_OP.recommend("warning", evidence, source_fix(first, domain.guarded), finding_data(first, inputs))
