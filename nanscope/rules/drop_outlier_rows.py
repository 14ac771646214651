"""`drop-outlier-rows`: a few training rows far outside their column, in a batch whose loss spiked or went
non-finite. The statistics (robust z-scores) are in `rules/outliers.py`, which check-data shares."""

import math
from typing import Any

import numpy as np

from nanscope.engine.limits import SPIKE_FACTOR, SPIKE_WINDOW
from nanscope.rules.evidence import BatchRows
from nanscope.rules.facts import Facts
from nanscope.rules.fixes import Change, Session
from nanscope.rules.outliers import CODE_ROWS, EXTREME_Z, SHOWN_ROWS, Cell, Glitches, repaired
from nanscope.rules.rule import Finding, Fixtures, Recommendation, Rule

DROP_OUTLIER_ROWS = Rule(
    "drop-outlier-rows",
    "Drop or repair the rows that hold glitches",
    "A few rows with values far outside their column (a missing-value code such as 9999), "
    "in a batch whose loss spiked or went non-finite.",
    "bad = np.abs(y[:, 0] - np.median(y[:, 0])) > 10 * 1.4826 * mad   # robust z > 10\n"
    "x, y = x[~bad], y[~bad]   # or repair them (y[bad] = np.nan, then impute); do not standardise instead",
)
RULES = (DROP_OUTLIER_ROWS,)
FIXTURES = Fixtures(fires=("missing-value-code-9999",), quiet=("tabular-regression-adam",))


def detect(facts: Facts) -> list[Finding]:
    """(score, Recommendation) pairs for training rows that hold glitches, tied to the step they hit."""
    glitches = facts.glitches
    if not glitches or not facts.kept:
        return []
    rows = sorted({row for found in glitches.values() for row in found})
    hit = _step_hit(facts, set(rows), facts.batch_rows) if facts.batch_rows is not None else None
    lines = [_row_line(label, row, cells) for label, found in glitches.items() for row, cells in found.items()]
    evidence = [f"{len(rows)} training row(s) hold values over {EXTREME_Z:g} robust standard deviations from their "
                f"column's median (median and MAD of the column): " + "; ".join(lines[:SHOWN_ROWS])
                + (f"; ... and {len(lines) - SHOWN_ROWS} more" if len(lines) > SHOWN_ROWS else "")]
    severity, score = "info", 0.3
    data: dict[str, Any] = {"rows": rows[:100], "values": {
        label: {str(r): [c[1] for c in cells] for r, cells in found.items()} for label, found in glitches.items()}}
    if hit is not None:
        step, how, batch_rows = hit
        evidence.insert(0, f"step {step}: {how}; its batch held row(s) {', '.join(map(str, batch_rows))}")
        # The run went non-finite at that step or after it: the glitch is the first thing that went wrong.
        severity = "error" if facts.first is not None and facts.first.step >= step else "warning"
        score = 0.97
        data["step"] = step
    return [(score, DROP_OUTLIER_ROWS.recommend(severity, evidence, _fix(glitches), data))]


def verify_fixes(rec: Recommendation, session: Session, run: dict[str, Any]) -> list[Change]:
    """Every glitch value replaced by its column's training median (`outliers.repaired`)."""
    del rec, run  # Unused
    return [Change("repair outlier rows", {"repair": "glitch values -> their column's training median"},
                   data=repaired(session))]


def _step_hit(facts: Facts, rows: set[int], batch_rows: BatchRows) -> tuple[int, str, list[int]] | None:
    """(step, what happened, the glitch rows in its batch) for the first step whose batch held glitch rows and
    whose loss spiked or went non-finite; None when no such step ran."""
    losses: list[float] = []
    first = facts.first
    first_bad = first.step if first is not None else None
    for step, loss in facts.kept:
        in_batch = sorted(rows.intersection(batch_rows(step).tolist()))
        spiked = _spike(loss, losses)
        if in_batch and (spiked or step == first_bad):
            window = min(len(losses), SPIKE_WINDOW)
            how = (f"the first non-finite value ({first.phase} phase)" if first is not None and step == first_bad
                   else f"the loss spiked to {loss:.4g}, {spiked:.3g}x the median of the {window} steps before")
            return step, how, in_batch
        if math.isfinite(loss):
            losses.append(loss)
    return None


def _spike(loss: float, before: list[float]) -> float | None:
    if not before or not math.isfinite(loss):
        return None
    median = float(np.median(before[-SPIKE_WINDOW:]))
    return loss / median if median > 0 and loss > SPIKE_FACTOR * median else None


def _row_line(label: str, row: int, cells: list[Cell]) -> str:
    column, value, z, median, scale = max(cells, key=lambda c: c[2])
    return f"row {row}: {label}[{column}] = {value:.6g} (robust z {z:.3g}; median {median:.4g}, robust std {scale:.3g})"


def _fix(glitches: Glitches) -> str:
    label, found = next(iter(glitches.items()))
    column, value, _, median, scale = next(iter(found.values()))[0]
    array = label.split("[")[0]
    shared = sum(1 for cells in found.values() for c in cells if c[0] == column and c[1] == value)
    code = f" in {shared} rows (a missing-value code?)" if shared >= CODE_ROWS else ""
    return (f"# rows {', '.join(map(str, list(found)[:SHOWN_ROWS]))}: {label}[{column}] = {value:.6g}{code}\n"
            f"bad = np.abs({label}[:, {column}] - {median:.4g}) > {EXTREME_Z * scale:.4g}   # robust z>{EXTREME_Z:g}\n"
            f"x, y = x[~bad], y[~bad]   # drop the rows; or repair: {array}[bad, {column}] = np.nan, then impute\n"
            "# do not standardise instead: the glitch inflates the std and squashes the real signal")
