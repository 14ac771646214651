"""The rule catalogue: every diagnosis nanscope can make, with a stable id."""

from nanscope.rules.catalogue import RULES, Recommendation, recommend

__all__ = ["RULES", "Recommendation", "recommend"]
