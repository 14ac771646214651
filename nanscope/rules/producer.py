"""The op rules: the rule for the op that produced the first non-finite value.

The forensic replay names the op (Log, Exp, RealDiv, Sqrt, their gradients, an optimizer
update) and the statistics of its operand (`rules/operand.py`). Each op rule module says
which producers it `matches` and words its `finding`; this module asks them in order of
precedence, so that one producer gets the rule that fixes it, citing the op, the layer, the
source line and the values. A producer that no rule explains gets `guard-op` (a fallback,
`registry.FALLBACKS`): the op's operand against its domain (`rules/domains.py`) and a guarded form.
"""

from types import ModuleType

from nanscope.rules import (double_where, finite_logits, inverse_trig, masked_softmax, optimizer_epsilon, poles,
                            precision, safe_division, safe_pow, safe_sqrt, stable_exp, stable_log)
from nanscope.rules.facts import Facts
from nanscope.rules.operand import where
from nanscope.rules.rule import Finding

# The op rules for an ordinary producer, in order: the first that matches gives the finding.
OP_RULES = (stable_log, stable_exp, safe_division, safe_sqrt, safe_pow, inverse_trig, poles, finite_logits)
# The rules this family can fire.
RULE_IDS = ("masked-softmax", "double-where", "stable-log", "stable-exp", "safe-division", "safe-sqrt",
            "loss-scaling", "float32-layer", "optimizer-epsilon", "safe-pow", "clamp-inverse-trig", "avoid-poles",
            "finite-logits")


def detect(facts: Facts) -> list[Finding]:
    """(score, Recommendation) pairs for the op that produced the first non-finite value."""
    first = facts.first
    units = explaining(facts)
    if first is None or not units:
        return []
    inputs, at = first.inputs or {}, where(first)
    found = []
    for unit in units:
        if unit is precision:
            found.append((0.95, precision.float16_finding(facts, first, at, inputs)))
        elif unit is masked_softmax:
            found.append((1.0, masked_softmax.finding(facts, first, at)))
        else:
            found.append((1.0, unit.finding(facts, first, at, inputs)))
    return found


def explaining(facts: Facts) -> list[ModuleType]:
    """The op rule modules that explain the producer of the first non-finite value, in finding order; empty when
    the run stayed finite, failed in its data, or no op rule knows the producer (guard-op's case)."""
    first = facts.first
    if first is None or first.phase == "data":
        return []
    inputs = first.inputs or {}
    op = inputs.get("op") or first.op
    if masked_softmax.matches(first):
        return [masked_softmax]
    if double_where.matches(first):
        return [double_where]
    found = [precision] if precision.matches_float16(first, inputs) else []
    if first.phase == "update" and optimizer_epsilon.matches(facts, first):
        return [*found, optimizer_epsilon]
    return found + [rule for rule in OP_RULES if rule.matches(first, inputs, op)][:1]
