"""Mergeable per-column statistics of a data array, exact over any number of chunks.

`ColumnStats` holds, for every column (the last axis of an array), the counts of
NaN, +Inf, -Inf and zeros, and the min, max, mean and variance of the finite
values. Each chunk is reduced to the same statistics and merged with Chan, Golub
and LeVeque's parallel update, so the mean and variance are numerically stable
however the data is split. A chunk without non-finite values takes a fast path of
a handful of vectorised passes; only chunks that hold NaN/Inf pay for masking.

Example:
    stats = ColumnStats(columns=3)
    for first_row, chunk in chunks:
        stats.update(chunk.reshape(-1, 3), np.arange(first_row, first_row + len(chunk)), positions=1)
    stats.std()
"""

import warnings

import numpy as np

FIRST_ROWS_KEPT = 5
SUM_BLOCK = 512

# (count, min, max, mean, m2) per column of a block.
Moments = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class ColumnStats:
    """Running statistics of the columns of a 2-D block stream.

    Args:
        columns: int. Number of columns (the size of the array's last axis).

    Attributes are float64/int64 vectors of length `columns`: `count` (finite
    values), `nan`, `posinf`, `neginf`, `zeros`, `min`, `max`, `mean`, `m2`
    (sum of squared deviations from the mean), and `first_nonfinite_rows`, a list
    per column of the first few row indices holding a non-finite value.
    """

    def __init__(self, columns: int) -> None:
        self.columns = columns
        self.count = np.zeros(columns, np.int64)
        self.nan = np.zeros(columns, np.int64)
        self.posinf = np.zeros(columns, np.int64)
        self.neginf = np.zeros(columns, np.int64)
        self.zeros = np.zeros(columns, np.int64)
        self.min = np.full(columns, np.inf)
        self.max = np.full(columns, -np.inf)
        self.mean = np.zeros(columns)
        self.m2 = np.zeros(columns)
        self.first_nonfinite_rows: list[list[int]] = [[] for _ in range(columns)]

    def update(self, block: np.ndarray, row_ids: np.ndarray, positions: int = 1) -> None:
        """Add a block of values: shape (rows * positions, columns), row-major by row.

        Args:
            block: np.ndarray, 2-D. Values; row `i // positions` of the block is data row `row_ids[i // positions]`.
            row_ids: np.ndarray of int. The data row index of each of the block's rows.
            positions: int, default 1. Values per column per data row (pixels, time steps).
        """
        if block.shape[0] == 0:
            return
        block = _as_float(block)
        finite = np.isfinite(block)
        if finite.all():
            chunk = _finite_moments(block, self._shift(block))
        else:
            self._count_nonfinite(block, finite, row_ids, positions)
            chunk = _masked_moments(block, finite, self._shift(block, finite))
        is_zero = block == 0
        if is_zero.any():
            self.zeros += np.add.reduce(is_zero, axis=0, dtype=np.int64)
        self._merge_moments(*chunk)

    def merge(self, other: "ColumnStats") -> None:
        """Fold another ColumnStats over the same columns into this one (Chan et al.)."""
        self.nan += other.nan
        self.posinf += other.posinf
        self.neginf += other.neginf
        self.zeros += other.zeros
        for mine, theirs in zip(self.first_nonfinite_rows, other.first_nonfinite_rows):
            mine[:] = sorted(mine + theirs)[:FIRST_ROWS_KEPT]
        self._merge_moments(other.count, other.min, other.max, other.mean, other.m2)

    def std(self) -> np.ndarray:
        """Population standard deviation of the finite values (NaN where a column has none)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > 0, np.sqrt(np.maximum(self.m2, 0) / np.maximum(self.count, 1)), np.nan)

    def finite_mean(self) -> np.ndarray:
        """Mean of the finite values (NaN where a column has none)."""
        return np.where(self.count > 0, self.mean, np.nan)

    def finite_min(self) -> np.ndarray:
        """Smallest finite value (NaN where a column has none)."""
        return np.where(self.count > 0, self.min, np.nan)

    def finite_max(self) -> np.ndarray:
        """Largest finite value (NaN where a column has none)."""
        return np.where(self.count > 0, self.max, np.nan)

    def _shift(self, block: np.ndarray, finite: np.ndarray | None = None) -> np.ndarray:
        """A per-column value near the mean; subtracting it keeps the sums of squares well-conditioned."""
        if self.count.any():
            return np.where(self.count > 0, self.mean, 0.0).astype(block.dtype)
        head = block[:64] if finite is None else np.where(finite[:64], block[:64], np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            shift = np.nanmean(head, axis=0)
        return np.nan_to_num(shift, nan=0.0, posinf=0.0, neginf=0.0).astype(block.dtype)

    def _count_nonfinite(self, block: np.ndarray, finite: np.ndarray, row_ids: np.ndarray, positions: int) -> None:
        self.nan += np.add.reduce(np.isnan(block), axis=0, dtype=np.int64)
        self.posinf += np.add.reduce(block == np.inf, axis=0, dtype=np.int64)
        self.neginf += np.add.reduce(block == -np.inf, axis=0, dtype=np.int64)
        flat_rows, cols = np.nonzero(~finite)
        for column in np.unique(cols):
            kept = self.first_nonfinite_rows[column]
            if len(kept) >= FIRST_ROWS_KEPT:
                continue
            rows = np.unique(row_ids[flat_rows[cols == column] // positions])
            kept[:] = sorted(set(kept) | {int(r) for r in rows[:FIRST_ROWS_KEPT]})[:FIRST_ROWS_KEPT]

    def _merge_moments(self, count: np.ndarray, low: np.ndarray, high: np.ndarray, mean: np.ndarray,
                       m2: np.ndarray) -> None:
        total = self.count + count
        safe_total = np.maximum(total, 1)
        delta = mean - self.mean
        self.mean = self.mean + delta * (count / safe_total)
        self.m2 = self.m2 + m2 + delta * delta * (self.count * count / safe_total)
        self.count = total
        self.min = np.minimum(self.min, low)
        self.max = np.maximum(self.max, high)


def _as_float(block: np.ndarray) -> np.ndarray:
    if block.dtype in (np.float32, np.float64):
        return block
    if block.dtype == np.float16 or (block.dtype.kind in "iub" and block.dtype.itemsize <= 2):
        return block.astype(np.float32)
    return block.astype(np.float64)


def _finite_moments(block: np.ndarray, shift: np.ndarray) -> Moments:
    """(count, min, max, mean, m2) of an all-finite block, in a few vectorised passes."""
    n = block.shape[0]
    low, high = np.fmin.reduce(block, axis=0), np.fmax.reduce(block, axis=0)
    s1, s2 = _shifted_sums(np.subtract(block, shift))
    mean = shift + s1 / n
    m2 = np.maximum(s2 - s1 * s1 / n, 0.0)
    return np.full(block.shape[1], n, np.int64), low, high, mean, m2


def _masked_moments(block: np.ndarray, finite: np.ndarray, shift: np.ndarray) -> Moments:
    """(count, min, max, mean, m2) over the finite values of a block that holds NaN/Inf."""
    count = np.add.reduce(finite, axis=0, dtype=np.int64)
    low = np.where(finite, block, np.inf).min(axis=0)
    high = np.where(finite, block, -np.inf).max(axis=0)
    with np.errstate(invalid="ignore"):
        deviation = np.where(finite, block - shift, 0).astype(block.dtype)
    s1, s2 = _shifted_sums(deviation)
    safe = np.maximum(count, 1)
    mean = shift + s1 / safe
    m2 = np.maximum(s2 - s1 * s1 / safe, 0.0)
    return count, low, high, np.where(count > 0, mean, 0.0), np.where(count > 0, m2, 0.0)


def _shifted_sums(deviation: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column float64 sum and sum of squares of `deviation`.

    Summed in blocks of SUM_BLOCK rows in the data's own precision, then across blocks
    in float64: as accurate as a float64 sum for centred values, at float32 speed.
    """
    rows, columns = deviation.shape
    full = rows - rows % SUM_BLOCK
    s1, s2 = np.zeros(columns), np.zeros(columns)
    if full:
        blocks = deviation[:full].reshape(-1, SUM_BLOCK, columns)
        s1 += np.add.reduce(np.add.reduce(blocks, axis=1), axis=0, dtype=np.float64)
        s2 += np.add.reduce(np.einsum("bij,bij->bj", blocks, blocks), axis=0, dtype=np.float64)
    if full < rows:
        rest = deviation[full:]
        s1 += np.add.reduce(rest, axis=0, dtype=np.float64)
        s2 += np.add.reduce(np.square(rest, dtype=np.float64), axis=0)
    return s1, s2
