"""What a report shows of every step's scalars, in bounded size: the Overview, and the fold that makes it.

The report's sparklines, first and last values, last loss scale, skipped updates and first
non-finite step (`Overview`) are folded from the scalar rows as they come (`OverviewFold`), in
constant memory: a curve is at most 2 * OVERVIEW_WIDTH buckets whose size doubles as steps come.
The run's in-memory columns and a trace streaming past (nanscope/store/series.py) fold with the
same code, so a report redrawn from its trace shows what the run showed.

Example:
    fold = OverviewFold(series_columns(0))
    fold.add(steps, values)
    fold.overview().curves["loss"].points      # at most 2 * OVERVIEW_WIDTH values
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from nanscope.engine.schema import Columns

# Points of an overview curve (the report's sparkline width).
OVERVIEW_WIDTH = 60
CURVES = ("loss", "grad_global_norm")


class Chunked(Protocol):
    """Scalar rows in step order, in chunks (`ScalarColumns`, `TraceColumns`)."""

    columns: Columns

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]: ...


@dataclass
class Curve:
    """A column over the whole run, for a sparkline.

    Args:
        points: list of float. At most 2 * width buckets of consecutive steps, all of one
            power-of-two size (one step each for a run of at most 2 * width steps), each its
            largest |value|, or NaN where it holds a non-finite value; render.format.sparkline
            resamples them to `width`.
        first_finite: float or None. The first finite value (the first value when none is finite).
        last: float or None. The last value.
    """

    points: list = field(default_factory=list)
    first_finite: float | None = None
    last: float | None = None


@dataclass
class Overview:
    """What a report shows of every step's scalars, in bounded size.

    Args:
        steps: int. Rows folded.
        curves: dict of str -> Curve. The CURVES columns.
        last_loss_scale: float or None. The last non-zero loss scale (0 is a step without loss scaling).
        skipped_updates: int. Steps whose update was skipped.
        loss_missing: int. Steps that gave no loss to record (`instrument` around a step that returns none).
        first_nonfinite: (int, int) or None. (step, phase code) of the first step with a non-zero phase.
    """

    steps: int = 0
    curves: dict = field(default_factory=dict)
    last_loss_scale: float | None = None
    skipped_updates: int = 0
    loss_missing: int = 0
    first_nonfinite: tuple | None = None


def fold_overview(series: Chunked, width: int = OVERVIEW_WIDTH) -> Overview:
    """The Overview of `series` (anything with `columns` and `chunks()`), in one pass over its chunks."""
    fold = OverviewFold(series.columns, width)
    for steps, values in series.chunks():
        fold.add(steps, values)
    return fold.overview()


class OverviewFold:
    """Folds chunks of scalar rows, in step order, into an Overview, in constant memory.

    Args:
        columns: Columns. The names of a row's values.
        width: int, default OVERVIEW_WIDTH. The sparkline's width.
    """

    first_finite: float | None
    first: float | None
    last: float | None

    def __init__(self, columns: Columns, width: int = OVERVIEW_WIDTH) -> None:
        self.width = width
        self._at = {name: columns.at(name) for name in ("loss_scale", "update_skipped", "phase")}
        self._curves = {name: _CurveFold(columns.at(name), 2 * width) for name in CURVES}
        # A trace written before the loss_missing column existed has none.
        self._missing = columns.at("loss_missing") if "loss_missing" in columns else None
        self._result = Overview()

    def add(self, steps: np.ndarray, values: np.ndarray) -> None:
        """Fold (steps int64, values float32 [rows, columns])."""
        result = self._result
        for curve in self._curves.values():
            curve.add(values)
        scales = values[:, self._at["loss_scale"]]
        nonzero = np.flatnonzero(scales != 0)
        if len(nonzero):
            result.last_loss_scale = float(scales[nonzero[-1]])
        result.skipped_updates += int(np.count_nonzero(values[:, self._at["update_skipped"]] != 0))
        if self._missing is not None:
            result.loss_missing += int(np.count_nonzero(values[:, self._missing] != 0))
        bad = np.flatnonzero(values[:, self._at["phase"]] != 0)
        if result.first_nonfinite is None and len(bad):
            result.first_nonfinite = (int(steps[bad[0]]), int(values[bad[0], self._at["phase"]]))
        result.steps += len(steps)

    def overview(self) -> Overview:
        """The Overview of the rows folded so far."""
        return Overview(self._result.steps, {name: curve.curve() for name, curve in self._curves.items()},
                        self._result.last_loss_scale, self._result.skipped_updates, self._result.loss_missing,
                        self._result.first_nonfinite)


class _CurveFold:
    """One column's Curve: its values' largest |value| in `capacity` buckets whose size doubles as steps come."""

    def __init__(self, index: int, capacity: int) -> None:
        self.index, self.capacity = index, capacity
        self.size, self.count = 1, 0
        self.peak, self.bad = np.zeros(capacity), np.zeros(capacity, bool)
        self.first_finite = self.first = self.last = None

    def add(self, rows: np.ndarray) -> None:
        values = rows[:, self.index].astype(np.float64)
        if not len(values):
            return
        self.first = values[0] if self.first is None else self.first
        self.last = values[-1]
        finite = np.isfinite(values)
        if self.first_finite is None and finite.any():
            self.first_finite = values[np.argmax(finite)]
        while (self.count + len(values) - 1) // self.size >= self.capacity:
            self._halve()
        bucket = np.arange(self.count, self.count + len(values)) // self.size
        starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
        at = bucket[starts]
        self.peak[at] = np.maximum(self.peak[at], np.maximum.reduceat(np.where(finite, np.abs(values), 0.0), starts))
        self.bad[at] |= np.logical_or.reduceat(~finite, starts)
        self.count += len(values)

    def _halve(self) -> None:
        """Merge neighbouring buckets pairwise: twice the steps per bucket, half the buckets."""
        half = self.capacity // 2
        self.peak = np.r_[np.maximum(self.peak[0::2], self.peak[1::2]), np.zeros(half)]
        self.bad = np.r_[self.bad[0::2] | self.bad[1::2], np.zeros(half, bool)]
        self.size *= 2

    def curve(self) -> Curve:
        used = -(-self.count // self.size)
        first = self.first_finite if self.first_finite is not None else self.first
        return Curve(np.where(self.bad[:used], math.nan, self.peak[:used]).tolist(),
                     None if first is None else float(first), None if self.last is None else float(self.last))
