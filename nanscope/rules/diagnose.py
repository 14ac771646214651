"""Turn a run's measurements into recommendations from the rule catalogue.

`diagnose` takes the report and the run's evidence apart once into `facts.Facts`; each
detector (`registry.DETECTORS`, one rule module each) looks at one kind of evidence in
them and returns zero or more `(score, Recommendation)` pairs; `diagnose` orders them by
score, most direct evidence first. The same evidence always gives the same
recommendations, and a healthy run gets nothing above `info`.
"""

from nanscope.finishing import optional_part
from nanscope.rules import registry
from nanscope.rules.clip_gradients import (CLIP_PERCENTILE, CLIP_UPDATE_FRACTION, FLOAT32_MAX, GROWTH_MIN_STEPS,
                                           GROWTH_MIN_TOTAL, GROWTH_RATE_LIMIT, clip_threshold, growth,
                                           projected_overflow_step, round_threshold)
from nanscope.rules.evidence import RunEvidence
from nanscope.rules.facts import Report, facts_from
from nanscope.rules.learning_rate import LOSS_PROGRESS_FRACTION, RULE_FIX_LR, UPDATE_RATIO_LIMIT
from nanscope.rules.registry import Detector
from nanscope.rules.rule import Recommendation
from nanscope.rules.scale import EXTREME_SCALE, MSE_LIKE_LOSSES, SCALE_LIMIT

__all__ = ["CLIP_PERCENTILE", "CLIP_UPDATE_FRACTION", "EXTREME_SCALE", "FLOAT32_MAX", "GROWTH_MIN_STEPS",
           "GROWTH_MIN_TOTAL", "GROWTH_RATE_LIMIT", "LOSS_PROGRESS_FRACTION", "MSE_LIKE_LOSSES", "RULE_FIX_LR",
           "SCALE_LIMIT", "UPDATE_RATIO_LIMIT", "clip_threshold", "detectors", "diagnose", "growth",
           "projected_overflow_step", "round_threshold"]


def diagnose(report: Report, evidence: RunEvidence) -> list[Recommendation]:
    """Recommendations for a TraceReport, most likely cause first.

    A detector that raises is a bug in nanscope, not in the user's run: its rules are
    left out, `report.notes` names them, and the rest of the report stands.

    Args:
        report: TraceReport.
        evidence: RunEvidence (`rules.evidence`). The model and the training data's scale.
    """
    facts = facts_from(report, evidence)
    found = []
    for rule_ids, detector in detectors():
        with optional_part(report.notes, f"rule {', '.join(rule_ids)}"):
            found.extend(detector(facts))
    if not any(rec.severity != "info" for _, rec in found):  # nothing explains the run: the fallbacks speak
        for rule_ids, detector in registry.fallbacks():
            with optional_part(report.notes, f"rule {', '.join(rule_ids)}"):
                found.extend(detector(facts))
    # Findings that fired above info come first, then by how directly the evidence implicates
    # them. Stable sort: equal keys keep detector order, so the same evidence gives the same order.
    found.sort(key=lambda pair: (pair[1].severity == "info", -pair[0]))
    by_id: dict[str, Recommendation] = {}
    ordered: list[Recommendation] = []
    for _, rec in found:
        if rec.id in by_id:
            by_id[rec.id].evidence.extend(line for line in rec.evidence if line not in by_id[rec.id].evidence)
            continue
        by_id[rec.id] = rec
        ordered.append(rec)
    return calibrated(ordered)


def calibrated(ordered: list[Recommendation]) -> list[Recommendation]:
    """`ordered` with every trajectory finding (`registry.TRAJECTORY_RULES`) at most a warning where another finding
    at error level names the producer of the first non-finite value: an error is a finding that explains that value
    and whose fix would stop its producer, and lowering the rate or bounding a norm does not stop an Exp overflow,
    a NaN row or a float16 MatMul that overflows."""
    cause = next((rec.id for rec in ordered if rec.severity == "error" and rec.id not in registry.TRAJECTORY_RULES),
                 None)
    if cause is None:
        return ordered
    for rec in ordered:
        if rec.severity == "error" and rec.id in registry.TRAJECTORY_RULES:
            rec.severity = "warning"
            rec.evidence.append(f"secondary, so a warning: {cause} names what produced the first non-finite value; "
                                "this fix acts on the run's trajectory, not on that producer")
            rec.data["secondary_to"] = cause
    return ordered


def detectors() -> tuple[tuple[tuple[str, ...], Detector], ...]:
    """(rule ids it can fire, detector(facts)) for every detector, in the order their findings tie-break."""
    return registry.detectors()
