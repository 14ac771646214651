"""One central table of rules, keyed by stable kebab-case ids.

A rule says what it detects, its title and its default fix; each is declared in its own
module (`rules/registry.py` lists them). A detector that finds evidence for a rule calls
`recommend(rule_id, ...)` (or the Rule's own `recommend`), which returns a
`Recommendation`: the rule's id and title plus the evidence measured in this run.
"""

from collections.abc import Iterable
from typing import Any

from nanscope.rules.registry import rules
from nanscope.rules.rule import SEVERITIES, Recommendation, Rule

RULES = {rule.id: rule for rule in rules()}

__all__ = ["RULES", "SEVERITIES", "Recommendation", "Rule", "recommend"]


def recommend(rule_id: str, severity: str, evidence: Iterable[str], fix: str | None = None,
              data: dict[str, Any] | None = None) -> Recommendation:
    """A Recommendation for `rule_id` with this run's evidence; `fix` defaults to the rule's."""
    return RULES[rule_id].recommend(severity, evidence, fix, data)
