"""Outliers per column for check-data: a robust z-score from the median and the MAD.

One pass cannot know a column's median before it has seen the column, so the scan keeps
a thinned, deterministic sample of the rows of every tabular array (`RowSample`, every
k-th row, k doubling as the rows grow) and estimates each column's median and robust
standard deviation (1.4826 x MAD, `rules.outliers.robust_scale`) from it. The exact
minimum and maximum the scan already has then bound the largest robust z of the column.
Only a column whose bound passes `EXTREME_Z` is read a second time (`OutlierCount`), to
count exactly how many values lie that far out and to name the worst rows, so data
without glitches pays for the sample alone.
"""

import heapq
from collections import Counter
from typing import Any

import numpy as np

from nanscope.rules.outliers import EXTREME_Z, detached, robust_scale

# Rows kept per array for the median and MAD (the estimate's error shrinks as 1/sqrt(rows)).
SAMPLE_ROWS = 20000
WORST_ROWS = 5
# Distinct far values counted per column; a column with more has a tail, not a few glitches or a code.
MAX_FAR_VALUES = 256

# What OutlierCount found in one column: (count, [(row, value, z)] worst first, {detached value: rows},
# (mean, std) without the detached values).
ColumnOutliers = tuple[int, list[tuple[int, float, float]], dict[float, int], tuple[float | None, float | None]]
# A (count, mean, m2) summary: per column (arrays), or of one column (floats).
Summary = tuple[Any, Any, Any]


class RowSample:
    """Every `stride`-th row of an array (by dataset row id), the stride doubling to keep at most 2 x SAMPLE_ROWS."""

    def __init__(self, total: int | None = None) -> None:
        self.stride = max(1, total // SAMPLE_ROWS) if total else 1  # a known row count sets it once
        self.ids: list[np.ndarray] = []
        self.rows: list[np.ndarray] = []
        self.kept = 0

    def update(self, block: np.ndarray, row_ids: np.ndarray) -> None:
        if len(row_ids) and row_ids[-1] - row_ids[0] == len(row_ids) - 1:  # consecutive rows: a strided slice
            keep: slice | np.ndarray = slice((-int(row_ids[0])) % self.stride, None, self.stride)
        else:
            keep = row_ids % self.stride == 0
        ids = row_ids[keep]
        if len(ids):
            self.ids.append(ids)
            self.rows.append(np.asarray(block[keep], dtype=np.float64))
            self.kept += len(ids)
        if self.kept > 2 * SAMPLE_ROWS:
            self.stride *= 2
            kept = [ids % self.stride == 0 for ids in self.ids]
            self.ids = [ids[k] for ids, k in zip(self.ids, kept)]
            self.rows = [rows[k] for rows, k in zip(self.rows, kept)]
            self.kept = sum(len(ids) for ids in self.ids)

    def scale(self) -> tuple[np.ndarray, np.ndarray]:
        """(median, robust std) per column of the sample."""
        return robust_scale(np.concatenate(self.rows) if self.rows else np.zeros((0, 1)))


def largest_z(median: np.ndarray, scale: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The largest robust z any value of each column can have, from its exact min and max (0 where scale is 0)."""
    with np.errstate(all="ignore"):
        z = np.maximum(high - median, median - low) / scale
    return np.where(np.isfinite(z) & (scale > 0), z, 0.0)


class OutlierCount:
    """Exact count and worst rows of the values over EXTREME_Z robust std from the median, in chosen columns.

    It also keeps, per column, how many rows hold each far value (up to MAX_FAR_VALUES distinct ones: more
    is a tail, not a few glitches) and the edges of the values that are not far, which
    `rules.outliers.detached` needs to tell a glitch or a missing-value code from a long tail.
    """

    def __init__(self, columns: list[int], median: np.ndarray, scale: np.ndarray) -> None:
        self.columns = list(columns)
        self.median, self.scale = median[self.columns], scale[self.columns]
        self.count = np.zeros(len(self.columns), dtype=np.int64)
        self.worst: list[list[tuple[float, int, float]]] = [[] for _ in self.columns]  # min-heaps of (z, row, value)
        self.far_values: list[Counter[float] | None] = [Counter() for _ in self.columns]
        self.inner_low = np.full(len(self.columns), np.inf)
        self.inner_high = np.full(len(self.columns), -np.inf)
        # Count, mean and sum of squared deviations of the values that are not far, in float64 (Chan et al.).
        self.inner: Summary = (np.zeros(len(self.columns)), np.zeros(len(self.columns)), np.zeros(len(self.columns)))

    def update(self, block: np.ndarray, row_ids: np.ndarray) -> None:
        values = np.asarray(block[:, self.columns], dtype=np.float64)
        with np.errstate(all="ignore"):
            z = np.abs(values - self.median) / self.scale
        far = np.isfinite(z) & (z > EXTREME_Z)
        inner = np.isfinite(values) & ~far
        if len(values):
            self.inner_low = np.minimum(self.inner_low, np.where(inner, values, np.inf).min(axis=0))
            self.inner_high = np.maximum(self.inner_high, np.where(inner, values, -np.inf).max(axis=0))
            count = inner.sum(axis=0).astype(np.float64)
            mean = np.where(inner, values, 0.0).sum(axis=0) / np.maximum(count, 1)
            m2 = (np.where(inner, values - mean, 0.0) ** 2).sum(axis=0)
            self.inner = _merged(self.inner, (count, mean, m2))
        self.count += far.sum(axis=0)
        for index in np.flatnonzero(far.any(axis=0)):
            heap = self.worst[index]
            for position in np.flatnonzero(far[:, index]):
                item = (float(z[position, index]), int(row_ids[position]), float(block[position, self.columns[index]]))
                (heapq.heappush if len(heap) < WORST_ROWS else heapq.heappushpop)(heap, item)
            counted = self.far_values[index]
            if counted is not None:
                counted.update(values[far[:, index], index].tolist())
                if len(counted) > MAX_FAR_VALUES:
                    self.far_values[index] = None

    def results(self) -> dict[int, ColumnOutliers]:
        """{column: (count, [(row, value, z)] worst first, {detached value: rows}, (mean, std) without them)}."""
        found: dict[int, ColumnOutliers] = {}
        for i, column in enumerate(self.columns):
            apart = self._detached(i)
            worst = [(row, value, z) for z, row, value in sorted(self.worst[i], reverse=True)]
            found[column] = (int(self.count[i]), worst, apart, self._clean(i, apart))
        return found

    def _clean(self, index: int, apart: dict[float, int]) -> tuple[float | None, float | None]:
        """(mean, population std) of the column without its detached values; (None, None) when none are."""
        counted = self.far_values[index]
        if not apart or counted is None:  # values are detached only from a column whose far values were counted
            return None, None
        kept = {value: rows for value, rows in counted.items() if value not in apart}
        count, mean, m2 = (float(part[index]) for part in self.inner)
        if kept:
            values = np.array(list(kept), dtype=np.float64)
            rows = np.array(list(kept.values()), dtype=np.float64)
            tail_mean = float((rows * values).sum() / rows.sum())
            tail = (rows.sum(), tail_mean, float((rows * (values - tail_mean) ** 2).sum()))
            count, mean, m2 = _merged((count, mean, m2), tail)
        if count == 0:
            return None, None
        return float(mean), float(np.sqrt(m2 / count))

    def _detached(self, index: int) -> dict[float, int]:
        counted = self.far_values[index]
        if not counted or not np.isfinite(self.inner_high[index]):
            return {}
        return detached(dict(counted), float(self.inner_low[index]), float(self.inner_high[index]),
                        float(self.scale[index]))



def _merged(a: Summary, b: Summary) -> Summary:
    """Chan et al.'s merge of two (count, mean, m2) summaries (arrays or floats)."""
    (n_a, mean_a, m2_a), (n_b, mean_b, m2_b) = a, b
    n = n_a + n_b
    with np.errstate(invalid="ignore", divide="ignore"):
        delta = mean_b - mean_a
        mean = np.where(n > 0, mean_a + delta * n_b / np.maximum(n, 1), 0.0)
        m2 = m2_a + m2_b + delta ** 2 * n_a * n_b / np.maximum(n, 1)
    return n, mean, m2
