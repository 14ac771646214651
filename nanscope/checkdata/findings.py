"""Turn scanned statistics into recommendations, with the same rule ids as trace-steps.

`clean-input-data` for NaN/Inf the spec does not allow, `normalize-inputs` and
`normalize-targets` for columns far from unit scale, `fix-labels` for targets that
do not fit the loss (one per output of a multi-output model), and
`drop-constant-features` (info) for constant features. Evidence names the output a
target column belongs to.
"""

import re
from collections.abc import Collection
from typing import Any

import numpy as np

from nanscope.checkdata.labels import LabelReport
from nanscope.checkdata.result import ColumnReport

from nanscope.rules import drop_constant_features, fix_labels
from nanscope.rules.catalogue import RULES, recommend
from nanscope.rules.outliers import EXTREME_Z
from nanscope.rules.rule import Recommendation

LARGE_SCALE = 10.0
SMALL_SCALE = 1e-3
EVIDENCE_LINES = 5


def column_scale(stats_mean: np.ndarray, stats_std: np.ndarray, count: np.ndarray) -> list[str | None]:
    """"large", "small" or None per column, from max(|mean|, std) of the finite values."""
    scale = np.maximum(np.abs(stats_mean), stats_std)
    with np.errstate(invalid="ignore"):
        return [
            None if n == 0 or not np.isfinite(s) else "large" if s > LARGE_SCALE else
            "small" if d > 0 and s < SMALL_SCALE else None
            for s, d, n in zip(scale, stats_std, count)
        ]


def recommendations(inputs: list[ColumnReport], targets: list[ColumnReport], label_checks: list[LabelReport],
                    regression_arrays: Collection[str]) -> list[Recommendation]:
    """The recommendations for a scan's columns and label checks, most severe first.

    Args:
        inputs, targets: list of ColumnReport.
        label_checks: list of LabelReport. One per target array checked against its loss.
        regression_arrays: set of str. Target arrays whose output is a regression (their scale matters).
    """
    found: list[Recommendation] = []
    for role, columns in (("input", inputs), ("target", targets)):
        bad = [c for c in columns if c.is_problem]
        if bad:
            found.append(_clean(role, bad))
    glitched = [c for c in (*inputs, *targets) if _glitches(c)]
    if glitched:
        found.append(_outlier_rows(glitched, "warning", inputs, targets))
    tails = [c for c in (*inputs, *targets) if c.outliers and c.outliers > (c.detached_rows or 0)]
    if tails:
        found.append(_outlier_rows(tails, "info", inputs, targets))
    large_inputs = [c for c in inputs if c.scale and not c.constant]
    if large_inputs:
        found.append(_scale("normalize-inputs", large_inputs))
    large_targets = [c for c in targets if c.scale == "large" and c.array in regression_arrays]
    if large_targets:
        found.append(_scale("normalize-targets", large_targets))
    found.extend(_fix_labels(labels) for labels in label_checks if labels.problems)
    constant = [c for c in inputs if c.constant]
    if constant:
        evidence = [f"{c.name} = {c.min:.6g} in every row" for c in constant[:EVIDENCE_LINES]]
        found.append(recommend("drop-constant-features", "info", evidence + _more(constant),
                               fix=_constant_fix(constant, inputs), data={"features": [c.name for c in constant]}))
    return found


def _glitches(column: ColumnReport) -> bool:
    """True when some of the column's values stand apart from the rest (`rules.outliers.detached`): a
    missing-value code that rows share, or glitch values in a column with few far values (the scan
    counts none as detached in a column with more than MAX_FRACTION far out: a heavy tail)."""
    return bool(column.detached_rows)


def _robust(column: ColumnReport) -> tuple[float, float]:
    """(median, robust std) of a column with outliers: the scan sets both on every column it counts them in."""
    assert column.median is not None and column.robust_std is not None
    return column.median, column.robust_std


def _outlier_rows(columns: list[ColumnReport], severity: str, inputs: list[ColumnReport],
                  targets: list[ColumnReport]) -> Recommendation:
    def line(c: ColumnReport) -> str:
        median, scale = _robust(c)
        if severity == "warning" and c.codes:
            value, rows = c.codes[0]
            z = abs(value - median) / scale
            return (f"{_named(c)}: {rows} rows hold exactly {value:.6g}, {z:.3g} robust std from the median "
                    f"{median:.4g} (robust std {scale:.3g}) and apart from every other value: a "
                    "missing-value code?")
        worst = ", ".join(f"{row} ({value:.6g}, z {z:.3g})" for row, value, z in c.outlier_rows)
        count = c.detached_rows if severity == "warning" else (c.outliers or 0) - (c.detached_rows or 0)
        where = ("apart from the rest of the column, " if severity == "warning" else "")
        return (f"{_named(c)}: {count} value(s) {where}over {EXTREME_Z:g} robust std from the median "
                f"{median:.4g} (robust std {scale:.3g}); worst rows {worst}")

    evidence = [line(c) for c in columns[:EVIDENCE_LINES]] + _more(columns)
    if severity == "info":
        evidence.append("values in between lead out to them: a heavy tail of the data, not a few bad rows "
                        "(a log transform is the usual fix)")
    rows = sorted({row for c in columns for row, _, _ in c.outlier_rows})
    data = {"columns": [c.name for c in columns], "rows": rows, **_outputs(columns)}
    fix = _outlier_fix(columns[0], inputs, targets) if severity == "warning" else _tail_fix(columns[0], inputs,
                                                                                             targets)
    return recommend("drop-outlier-rows", severity, evidence, fix=fix, data=data)


def _cell(column: ColumnReport, inputs: list[ColumnReport], targets: list[ColumnReport]) -> tuple[str, str, int]:
    """("x[:, 3]", "x", 3): how a training script indexes the column, by its role, array and position."""
    role, columns = ("x", inputs) if column in inputs else ("y", targets)
    arrays = list(dict.fromkeys(c.array for c in columns))
    array = role if len(arrays) == 1 else f"{role}[{column.array!r}]"
    index = [c for c in columns if c.array == column.array].index(column)
    return f"{array}[:, {index}]", array, index


def _tail_fix(column: ColumnReport, inputs: list[ColumnReport], targets: list[ColumnReport]) -> str:
    cell, _, _ = _cell(column, inputs, targets)
    return (f"{cell} = np.sign({cell}) * np.log1p(np.abs({cell}))   # {column.name}: compress the long tail "
            "(keep the rows)")


def _outlier_fix(column: ColumnReport, inputs: list[ColumnReport], targets: list[ColumnReport]) -> str:
    """The snippet for the first glitched column: its own array and column index, its code or its bound."""
    cell, array, index = _cell(column, inputs, targets)
    if column.codes:
        value, rows = column.codes[0]
        test = f"bad = {cell} == {value:.6g}   # {column.name}: the code in {rows} rows"
    else:
        median, scale = _robust(column)
        test = (f"bad = np.abs({cell} - {median:.6g}) > {EXTREME_Z * scale:.4g}   "
                f"# {column.name}: robust z > {EXTREME_Z:g}")
    return (f"{test}\nx, y = x[~bad], y[~bad]   # or repair them ({array}[bad, {index}] = np.nan, then impute); "
            "do not standardise instead")


def _clean(role: str, columns: list[ColumnReport]) -> Recommendation:
    evidence = [
        f"{role} {_named(c)}: {c.nan} NaN, {c.posinf} +Inf, {c.neginf} -Inf (first rows {c.first_nonfinite_rows})"
        for c in columns[:EVIDENCE_LINES]
    ]
    fix = None if role == "input" else re.sub(r"\bx\b", "y", RULES["clean-input-data"].fix)
    data = {"role": role, "columns": [c.name for c in columns], "nonfinite": sum(c.nonfinite for c in columns)}
    data = {**data, **_outputs(columns)}
    return recommend("clean-input-data", "error", evidence + _more(columns), fix=fix, data=data)


def _fix_labels(labels: LabelReport) -> Recommendation:
    where = "" if labels.output is None else f"output {labels.output}: "
    evidence = [f"{where}{labels.loss}: {problem} (first rows {rows})"
                for problem, rows in zip(labels.problems, labels.problem_rows)]
    data = {"bad_rows": labels.bad_rows, **({} if labels.output is None else {"output": labels.output})}
    # A multi-output model's targets are a dict or a list, which `fix_for`'s `y[keep]` does not index.
    fix = fix_labels.fix_for(labels.kind, labels.classes, labels.bad_rows) if labels.output is None else None
    return recommend("fix-labels", "error", evidence, fix=fix, data=data)


def _constant_fix(constant: list[ColumnReport], inputs: list[ColumnReport]) -> str:
    """One `np.delete` line per input array with constant columns, by their positions in the array."""
    arrays: dict[str, tuple[list[int], list[str]]] = {}
    for column in constant:
        _, array, index = _cell(column, inputs, [])
        indices, names = arrays.setdefault(array, ([], []))
        indices.append(index)
        names.append(column.name)
    return "\n".join(drop_constant_features.fix_for(array, indices, names)
                     for array, (indices, names) in arrays.items())


def _named(column: ColumnReport) -> str:
    """A column's name, with the output it belongs to where the name does not already say it."""
    output = column.output
    if output is None or column.name == str(output) or column.name.startswith(f"{output}["):
        return column.name
    return f"{column.name} (output {output})"


def _outputs(columns: list[ColumnReport]) -> dict[str, Any]:
    outputs = list(dict.fromkeys(c.output for c in columns if c.output is not None))
    return {"outputs": outputs} if outputs else {}


def _scale(rule_id: str, columns: list[ColumnReport]) -> Recommendation:
    def line(c: ColumnReport) -> str:
        if c.clean_std is None:
            return f"{_named(c)}: mean {c.mean:.4g}, std {c.std:.4g} ({c.scale} scale)"
        return (f"{_named(c)}: mean {c.clean_mean:.4g}, std {c.clean_std:.4g} without its {c.detached_rows} "
                f"detached row(s) (std {c.std:.4g} with them) ({c.scale} scale)")

    evidence = [line(c) for c in columns[:EVIDENCE_LINES]]
    data = {"columns": [c.name for c in columns], **_outputs(columns)}
    return recommend(rule_id, "warning", evidence + _more(columns), data=data)


def _more(columns: list[ColumnReport]) -> list[str]:
    return [f"... and {len(columns) - EVIDENCE_LINES} more"] if len(columns) > EVIDENCE_LINES else []
