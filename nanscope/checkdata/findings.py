"""Turn scanned statistics into recommendations, with the same rule ids as trace-steps.

`clean-input-data` for NaN/Inf the spec does not allow, `normalize-inputs` and
`normalize-targets` for columns far from unit scale, `fix-labels` for targets that
do not fit the loss, and `drop-constant-features` (info) for constant features.
"""

import numpy as np

from nanscope.rules.catalogue import RULES, recommend

LARGE_SCALE = 10.0
SMALL_SCALE = 1e-3
EVIDENCE_LINES = 5

def column_scale(stats_mean, stats_std, count):
    """"large", "small" or None per column, from max(|mean|, std) of the finite values."""
    scale = np.maximum(np.abs(stats_mean), stats_std)
    with np.errstate(invalid="ignore"):
        return [
            None if n == 0 or not np.isfinite(s) else "large" if s > LARGE_SCALE else
            "small" if 0 < d and s < SMALL_SCALE else None
            for s, d, n in zip(scale, stats_std, count)
        ]


def recommendations(inputs, targets, labels, target_kind):
    """The recommendations for a scan's columns and label report, most severe first."""
    found = []
    for role, columns in (("input", inputs), ("target", targets)):
        bad = [c for c in columns if c.is_problem]
        if bad:
            found.append(_clean(role, bad))
    large_inputs = [c for c in inputs if c.scale and not c.constant]
    if large_inputs:
        found.append(_scale("normalize-inputs", large_inputs))
    if target_kind == "regression":
        large_targets = [c for c in targets if c.scale == "large"]
        if large_targets:
            found.append(_scale("normalize-targets", large_targets))
    if labels is not None and labels.problems:
        found.append(recommend("fix-labels", "error", [f"{labels.loss}: {p}" for p in labels.problems]
                            + [f"first rows: {labels.first_bad_rows}"], data={"bad_rows": labels.bad_rows}))
    constant = [c for c in inputs if c.constant]
    if constant:
        evidence = [f"{c.name} = {c.min:.6g} in every row" for c in constant[:EVIDENCE_LINES]]
        found.append(recommend("drop-constant-features", "info", evidence + _more(constant),
                               data={"features": [c.name for c in constant]}))
    return found


def _clean(role, columns):
    evidence = [
        f"{role} {c.name}: {c.nan} NaN, {c.posinf} +Inf, {c.neginf} -Inf (first rows {c.first_nonfinite_rows})"
        for c in columns[:EVIDENCE_LINES]
    ]
    fix = None if role == "input" else RULES["clean-input-data"].fix.replace("x", "y")
    data = {"role": role, "columns": [c.name for c in columns], "nonfinite": sum(c.nonfinite for c in columns)}
    return recommend("clean-input-data", "error", evidence + _more(columns), fix=fix, data=data)


def _scale(rule_id, columns):
    evidence = [f"{c.name}: mean {c.mean:.4g}, std {c.std:.4g} ({c.scale} scale)" for c in columns[:EVIDENCE_LINES]]
    return recommend(rule_id, "warning", evidence + _more(columns), data={"columns": [c.name for c in columns]})


def _more(columns):
    return [f"... and {len(columns) - EVIDENCE_LINES} more"] if len(columns) > EVIDENCE_LINES else []
