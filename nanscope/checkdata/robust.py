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

import numpy as np

from nanscope.rules.outliers import EXTREME_Z, robust_scale

# Rows kept per array for the median and MAD (the estimate's error shrinks as 1/sqrt(rows)).
SAMPLE_ROWS = 20000
WORST_ROWS = 5


class RowSample:
    """Every `stride`-th row of an array (by dataset row id), the stride doubling to keep at most 2 x SAMPLE_ROWS."""

    def __init__(self, total=None):
        self.stride = max(1, total // SAMPLE_ROWS) if total else 1  # a known row count sets it once
        self.ids, self.rows, self.kept = [], [], 0

    def update(self, block, row_ids):
        if len(row_ids) and row_ids[-1] - row_ids[0] == len(row_ids) - 1:  # consecutive rows: a strided slice
            keep = slice((-int(row_ids[0])) % self.stride, None, self.stride)
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

    def scale(self):
        """(median, robust std) per column of the sample."""
        return robust_scale(np.concatenate(self.rows) if self.rows else np.zeros((0, 1)))


def largest_z(median, scale, low, high):
    """The largest robust z any value of each column can have, from its exact min and max (0 where scale is 0)."""
    with np.errstate(all="ignore"):
        z = np.maximum(high - median, median - low) / scale
    return np.where(np.isfinite(z) & (scale > 0), z, 0.0)


class OutlierCount:
    """Exact count and worst rows of the values over EXTREME_Z robust std from the median, in chosen columns."""

    def __init__(self, columns, median, scale):
        self.columns = list(columns)
        self.median, self.scale = median[self.columns], scale[self.columns]
        self.count = np.zeros(len(self.columns), dtype=np.int64)
        self.worst = [[] for _ in self.columns]  # min-heaps of (z, row, value)

    def update(self, block, row_ids):
        with np.errstate(all="ignore"):
            z = np.abs(np.asarray(block[:, self.columns], dtype=np.float64) - self.median) / self.scale
        far = np.isfinite(z) & (z > EXTREME_Z)
        self.count += far.sum(axis=0)
        for index in np.flatnonzero(far.any(axis=0)):
            heap = self.worst[index]
            for position in np.flatnonzero(far[:, index]):
                item = (float(z[position, index]), int(row_ids[position]), float(block[position, self.columns[index]]))
                (heapq.heappush if len(heap) < WORST_ROWS else heapq.heappushpop)(heap, item)

    def results(self):
        """{column: (count, [(row, value, z)] worst first)}."""
        return {column: (int(self.count[i]), [(row, value, z) for z, row, value in sorted(self.worst[i], reverse=True)])
                for i, column in enumerate(self.columns)}
