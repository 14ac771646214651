"""Every rule module, in catalogue order, and what each one provides.

A rule module (one rule, or a small family) declares `RULES` (its catalogue entries),
`FIXTURES` (its cases in tests/realistic/cases.py: one `Fixtures`, or one per rule id),
and where it has them: its detector(s) over `facts.Facts` (listed in DETECTORS, in the
order their findings tie-break), `verify_fixes(rec, session, run)` for `trace-steps
--verify` and `bundle_fixes(rec, bundle, run)` for `replay DIR --verify`.
"""

from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeAlias

from nanscope.rules import (bounded_activation, clean_input_data, clip_gradients, double_where,
                            drop_constant_features, drop_outlier_rows, finite_logits, fix_labels, guard_op,
                            inverse_trig, learning_rate, masked_softmax, optimizer_epsilon, poles, precision, producer,
                            safe_division, safe_pow, safe_sqrt, scale, stable_exp, stable_log, weight_constraint)
from nanscope.rules.facts import Facts
from nanscope.rules.fixes import Bundle, Change, Session, StepFix
from nanscope.rules.rule import Finding, Fixtures, Recommendation, Rule

# A detector: the findings it makes of a run's Facts.
Detector: TypeAlias = Callable[[Facts], list[Finding]]
# A rule module's `verify_fixes(rec, session, run)` and `bundle_fixes(rec, bundle, run)`.
VerifyFixer: TypeAlias = Callable[[Recommendation, Session, dict[str, Any]], list[Change]]
BundleFixer: TypeAlias = Callable[[Recommendation, Bundle, dict[str, Any]], list[StepFix]]

# Catalogue order: the order `nanscope rules`, docs/rules/ and the README table list the rules in.
UNITS = (clean_input_data, drop_outlier_rows, scale, learning_rate, clip_gradients, bounded_activation, stable_log,
         stable_exp, safe_division, masked_softmax, double_where, safe_sqrt, precision, optimizer_epsilon, fix_labels,
         drop_constant_features, weight_constraint, safe_pow, inverse_trig, poles, finite_logits, guard_op)

# (rule ids it can fire, module, name of its detector(facts)) for every detector, in the order their findings
# tie-break. Looked up when the rules run (`detectors`), so a detector is one attribute of its module.
DETECTORS = (
    (("clean-input-data",), clean_input_data, "detect"),
    (("drop-outlier-rows",), drop_outlier_rows, "detect"),
    (producer.RULE_IDS, producer, "detect"),
    (("loss-scaling", "float32-layer"), precision, "detect"),
    (("clip-gradients",), clip_gradients, "detect"),
    (("lower-learning-rate",), learning_rate, "detect_update_ratio"),
    (("lower-learning-rate",), learning_rate, "detect_loss_growth"),
    (("bounded-activation",), bounded_activation, "detect"),
    (("weight-constraint",), weight_constraint, "detect"),
    (("normalize-targets",), scale, "detect_targets"),
    (("normalize-inputs",), scale, "detect_inputs"),
)
# (rule ids, module, detector name) of the fallbacks: run only when the detectors found nothing at warning or error
# level, for a run that would otherwise end without advice.
FALLBACKS = (
    (("guard-op",), guard_op, "detect"),
)
# Rules whose evidence is the run's trajectory (updates too large, a gradient, output or weight norm growing): their
# fix slows or bounds training. When a rule that names what produced the first non-finite value (an op rule, a data
# rule, a scale at the root of it) is an error, these are secondary: their fix would not have stopped that producer,
# so they are at most warnings (`diagnose`).
TRAJECTORY_RULES = ("lower-learning-rate", "clip-gradients", "bounded-activation", "weight-constraint")
# Rules of a family whose applier does not apply to every member (it returns no fix for the others).
_NO_VERIFY_FIX = {"float32-layer"}


def detectors() -> tuple[tuple[tuple[str, ...], Detector], ...]:
    """(rule ids it can fire, detector(facts)) for every detector, in the order their findings tie-break."""
    return tuple((rule_ids, getattr(module, name)) for rule_ids, module, name in DETECTORS)


def fallbacks() -> tuple[tuple[tuple[str, ...], Detector], ...]:
    """(rule ids it can fire, detector(facts)) for every fallback, in order."""
    return tuple((rule_ids, getattr(module, name)) for rule_ids, module, name in FALLBACKS)


def unit_of(rule_id: str) -> ModuleType:
    """The module that declares `rule_id`."""
    return next(unit for unit in UNITS if any(rule.id == rule_id for rule in unit.RULES))


def rules() -> list[Rule]:
    """Every Rule, in catalogue order."""
    return [rule for unit in UNITS for rule in unit.RULES]


def fixtures(rule_id: str) -> Fixtures:
    """The rule's Fixtures."""
    declared = unit_of(rule_id).FIXTURES
    return declared[rule_id] if isinstance(declared, dict) else declared


def verify_fixers() -> dict[str, VerifyFixer]:
    """{rule id: verify_fixes(rec, session, run)} of every rule whose fix `trace-steps --verify` can apply."""
    return {rule.id: unit.verify_fixes for unit in UNITS if hasattr(unit, "verify_fixes") for rule in unit.RULES
            if rule.id not in _NO_VERIFY_FIX}


def bundle_fixers() -> dict[str, BundleFixer]:
    """{rule id: bundle_fixes(rec, bundle, run)} of every rule whose fix `replay DIR --verify` can apply."""
    return {rule.id: unit.bundle_fixes for unit in UNITS if hasattr(unit, "bundle_fixes") for rule in unit.RULES}
