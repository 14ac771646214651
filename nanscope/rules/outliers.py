"""Rows that hold a glitch: a missing-value code (a target of 9999) or another value far outside its column.

A value's robust z-score is its distance from its column's median in units of
1.4826 x the median absolute deviation (MAD), which estimates the standard deviation
of normal data without being moved by the outliers themselves (Iglewicz and Hoaglin,
"How to Detect and Handle Outliers", 1993). A few rows far out, in a batch whose loss
spiked or went non-finite, are the cause to fix: drop or repair those rows. Standardising
the column instead would divide the real signal by a scale the glitch inflated.
"""

import warnings
from collections.abc import Callable, Collection
from typing import TypeAlias

import numpy as np

from nanscope.data import inputs, targets
from nanscope.data.targets import Arrays
from nanscope.rules.fixes import DataChange, LoadedData, Session

# 1.4826 x MAD estimates the standard deviation of normal data.
MAD_TO_STD = 1.4826
# A value this many robust standard deviations from its column's median is a glitch candidate: a
# normal sample of a billion values stays within about 6.
EXTREME_Z = 10.0
# Glitches are rare. More values than this fraction that far out are a heavy tail (a log transform's
# case), not a few bad rows.
MAX_FRACTION = 0.01
# Rows named in the evidence.
SHOWN_ROWS = 5
# One far value of a row: (column, value, robust z, the column's median, its robust std).
Cell: TypeAlias = tuple[int, float, float, float, float]
# {array label ("x", "y", "<input>"): {row: its far values}} (`glitches_in`).
Glitches: TypeAlias = dict[str, dict[int, list[Cell]]]
# A value this many rows share exactly, far out and apart from the rest, is a missing-value code (9999, -999).
CODE_ROWS = 2


def detached(far: dict[float, int], inner_low: float, inner_high: float, scale: float) -> dict[float, int]:
    """The far values that stand apart from their column: beyond a gap of EXTREME_Z robust std.

    A long tail (exponential, lognormal) reaches its far values through a run of values in
    between; a glitch or a missing-value code sits alone, far from everything else. Walking out
    from the bulk on each side, every value past the first gap wider than EXTREME_Z robust
    standard deviations is detached.

    Args:
        far: dict. {value: rows} of the values over EXTREME_Z robust std from the median.
        inner_low, inner_high: float. The smallest and largest values that are not far (the bulk's edges).
        scale: float. The column's robust standard deviation.

    Returns:
        dict: {value: rows} of the detached values.
    """
    found = {}
    for side, edge in ((1, inner_high), (-1, inner_low)):
        values = sorted((v for v in far if (v > edge if side > 0 else v < edge)), key=lambda v: side * v)
        previous, apart = edge, False
        for value in values:
            apart = apart or abs(value - previous) > EXTREME_Z * scale
            if apart:
                found[value] = far[value]
            previous = value
    return found


def missing_value_codes(values: dict[float, int]) -> dict[float, int]:
    """{value: rows} of the detached values that CODE_ROWS or more rows share exactly."""
    return {value: rows for value, rows in values.items() if rows >= CODE_ROWS}


def robust_scale(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(median, robust std) per column of a 2-D float array, over its finite values (NaN where none).

    The robust std is 1.4826 x MAD; where the MAD is 0 (a column mostly of one value) it falls
    back to 1.2533 x the mean absolute deviation from the median, and is 0 when that is 0 too.
    """
    with np.errstate(all="ignore"):
        values = np.where(np.isfinite(values), values, np.nan).astype(np.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
            median = np.nanmedian(values, axis=0)
            deviation = np.abs(values - median)
            scale = MAD_TO_STD * np.nanmedian(deviation, axis=0)
            mean_dev = 1.2533 * np.nanmean(deviation, axis=0)
    return median, np.where(scale > 0, scale, mean_dev)


def glitch_rows(array: np.ndarray) -> dict[int, list[Cell]]:
    """{row: [(column, value, z)]} of the values over EXTREME_Z robust standard deviations from their
    column's median; {} when there are none or too many to be glitches (a heavy tail)."""
    flat = np.asarray(array).reshape(len(array), -1)
    if not np.issubdtype(flat.dtype, np.floating) or len(flat) < 8:
        return {}
    median, scale = robust_scale(flat)
    with np.errstate(all="ignore"):
        z = np.abs(flat.astype(np.float64) - median) / scale
    z = np.where(np.isfinite(z) & (scale > 0), z, 0.0)
    far = z > EXTREME_Z
    if len(np.unique(np.nonzero(far)[0])) > MAX_FRACTION * len(flat):  # many values far out: a heavy tail
        return {}
    for column in np.flatnonzero(far.any(axis=0)):  # a far value that a long tail leads up to is no glitch
        values = flat[:, column].astype(np.float64)
        inner = values[~far[:, column] & np.isfinite(values)]
        if not len(inner):
            continue
        apart = detached(dict(zip(*np.unique(values[far[:, column]], return_counts=True))), inner.min(), inner.max(),
                         scale[column])
        far[:, column] &= np.isin(values, list(apart))
    rows, columns = np.nonzero(far)
    if len(rows) == 0 or len(np.unique(rows)) > MAX_FRACTION * len(flat):
        return {}
    found: dict[int, list[Cell]] = {}
    for row, col in zip(rows.tolist(), columns.tolist()):
        found.setdefault(row, []).append((col, float(flat[row, col]), float(z[row, col]), float(median[col]),
                                          float(scale[col])))
    return found


def glitches_in(x: Arrays, y: Arrays, ids: Collection[str] = ()) -> Glitches:
    """{array label: glitch_rows} over the float regression targets and the float inputs that are not `ids`."""
    found = {}
    for label, part in inputs.named(x):
        if label not in ids:
            found[label] = glitch_rows(part)
    for label, part in targets.named(y):
        found[label] = glitch_rows(part)
    return {label: rows for label, rows in found.items() if rows}


def repaired(session: Session) -> DataChange:
    """A data change for --verify: every glitch value replaced by its column's training median (rows kept, so
    the batch order stays), in the training and the validation rows alike."""
    glitches = glitches_in(session.train.x, session.train.y, inputs.ids_of(session.train, session.model.keras_model))
    thresholds = {}
    for label, found in glitches.items():
        for cells in found.values():
            for column, _, _, median, scale in cells:
                thresholds[(label, column)] = (median, EXTREME_Z * scale)

    def fix(part: np.ndarray, label: str) -> np.ndarray:
        mine = {c: t for (name, c), t in thresholds.items() if name == label}
        if not mine:
            return part
        flat = part.reshape(len(part), -1).copy()
        for column, (median, limit) in mine.items():
            bad = np.abs(flat[:, column].astype(np.float64) - median) > limit
            flat[bad, column] = median
        return flat.reshape(part.shape).astype(part.dtype)

    def change(data: LoadedData) -> LoadedData:
        from dataclasses import replace

        x = _relabelled(data.x, "x", fix)
        y = _relabelled(data.y, "y", fix)
        return replace(data, x=x, y=y)

    return change


def _relabelled(value: Arrays, label: str, fix: Callable[[np.ndarray, str], np.ndarray]) -> Arrays:
    named = targets.named(value, label)
    if isinstance(value, dict):
        return {k: fix(part, name) for k, (name, part) in zip(value, named)}
    if isinstance(value, (tuple, list)):
        return tuple(fix(part, name) for name, part in named)
    return fix(value, label)
