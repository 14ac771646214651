"""Turn scanned statistics into recommendations, with the same rule ids as trace-steps.

`clean-input-data` for NaN/Inf the spec does not allow, `normalize-inputs` and
`normalize-targets` for columns far from unit scale, `fix-labels` for targets that
do not fit the loss (one per output of a multi-output model), and
`drop-constant-features` (info) for constant features. Evidence names the output a
target column belongs to.
"""

import re

import numpy as np

from nanscope.rules.catalogue import RULES, recommend
from nanscope.rules.outliers import EXTREME_Z, MAX_FRACTION

LARGE_SCALE = 10.0
SMALL_SCALE = 1e-3
EVIDENCE_LINES = 5


def column_scale(stats_mean, stats_std, count):
    """"large", "small" or None per column, from max(|mean|, std) of the finite values."""
    scale = np.maximum(np.abs(stats_mean), stats_std)
    with np.errstate(invalid="ignore"):
        return [
            None if n == 0 or not np.isfinite(s) else "large" if s > LARGE_SCALE else
            "small" if d > 0 and s < SMALL_SCALE else None
            for s, d, n in zip(scale, stats_std, count)
        ]


def recommendations(inputs, targets, label_checks, regression_arrays):
    """The recommendations for a scan's columns and label checks, most severe first.

    Args:
        inputs, targets: list of ColumnReport.
        label_checks: list of LabelReport. One per target array checked against its loss.
        regression_arrays: set of str. Target arrays whose output is a regression (their scale matters).
    """
    found = []
    for role, columns in (("input", inputs), ("target", targets)):
        bad = [c for c in columns if c.is_problem]
        if bad:
            found.append(_clean(role, bad))
    glitched = [c for c in (*inputs, *targets) if _glitches(c)]
    if glitched:
        found.append(_outlier_rows(glitched, "warning"))
    tails = [c for c in (*inputs, *targets) if c.outliers and not _glitches(c)]
    if tails:
        found.append(_outlier_rows(tails, "info"))
    large_inputs = [c for c in inputs if c.scale and not c.constant and not _scale_from_glitches(c)]
    if large_inputs:
        found.append(_scale("normalize-inputs", large_inputs))
    large_targets = [c for c in targets if c.scale == "large" and c.array in regression_arrays
                     and not _scale_from_glitches(c)]
    if large_targets:
        found.append(_scale("normalize-targets", large_targets))
    found.extend(_fix_labels(labels) for labels in label_checks if labels.problems)
    constant = [c for c in inputs if c.constant]
    if constant:
        evidence = [f"{c.name} = {c.min:.6g} in every row" for c in constant[:EVIDENCE_LINES]]
        found.append(recommend("drop-constant-features", "info", evidence + _more(constant),
                               data={"features": [c.name for c in constant]}))
    return found


def _glitches(column):
    """True when a few of the column's values (at most MAX_FRACTION) lie over EXTREME_Z robust std out."""
    return bool(column.outliers) and column.outliers <= MAX_FRACTION * column.values


def _scale_from_glitches(column):
    """True when the column looks far from unit scale only because of its glitch values."""
    return _glitches(column) and max(abs(column.median), column.robust_std) <= LARGE_SCALE


def _outlier_rows(columns, severity):
    def line(c):
        worst = ", ".join(f"{row} ({value:.6g}, z {z:.3g})" for row, value, z in c.outlier_rows)
        return (f"{_named(c)}: {c.outliers} value(s) over {EXTREME_Z:g} robust std from the median {c.median:.4g} "
                f"(robust std {c.robust_std:.3g}); worst rows {worst}")

    evidence = [line(c) for c in columns[:EVIDENCE_LINES]] + _more(columns)
    if severity == "info":
        evidence.append(f"more than {MAX_FRACTION:.0%} of the values lie that far out: a heavy tail, not a few bad "
                        "rows (a log transform is the usual fix)")
    rows = sorted({row for c in columns for row, _, _ in c.outlier_rows})
    data = {"columns": [c.name for c in columns], "rows": rows, **_outputs(columns)}
    return recommend("drop-outlier-rows", severity, evidence, data=data)


def _clean(role, columns):
    evidence = [
        f"{role} {_named(c)}: {c.nan} NaN, {c.posinf} +Inf, {c.neginf} -Inf (first rows {c.first_nonfinite_rows})"
        for c in columns[:EVIDENCE_LINES]
    ]
    fix = None if role == "input" else re.sub(r"\bx\b", "y", RULES["clean-input-data"].fix)
    data = {"role": role, "columns": [c.name for c in columns], "nonfinite": sum(c.nonfinite for c in columns)}
    data = {**data, **_outputs(columns)}
    return recommend("clean-input-data", "error", evidence + _more(columns), fix=fix, data=data)


def _fix_labels(labels):
    where = "" if labels.output is None else f"output {labels.output}: "
    evidence = [f"{where}{labels.loss}: {p}" for p in labels.problems] + [f"{where}first rows: {labels.first_bad_rows}"]
    data = {"bad_rows": labels.bad_rows, **({} if labels.output is None else {"output": labels.output})}
    return recommend("fix-labels", "error", evidence, data=data)


def _named(column):
    """A column's name, with the output it belongs to where the name does not already say it."""
    output = column.output
    if output is None or column.name == str(output) or column.name.startswith(f"{output}["):
        return column.name
    return f"{column.name} (output {output})"


def _outputs(columns):
    outputs = list(dict.fromkeys(c.output for c in columns if c.output is not None))
    return {"outputs": outputs} if outputs else {}


def _scale(rule_id, columns):
    evidence = [f"{_named(c)}: mean {c.mean:.4g}, std {c.std:.4g} ({c.scale} scale)" for c in columns[:EVIDENCE_LINES]]
    data = {"columns": [c.name for c in columns], **_outputs(columns)}
    return recommend(rule_id, "warning", evidence + _more(columns), data=data)


def _more(columns):
    return [f"... and {len(columns) - EVIDENCE_LINES} more"] if len(columns) > EVIDENCE_LINES else []
