"""Trend fits over the steps of a run: is a quantity growing geometrically, and since when?"""

import math

import numpy as np
from numpy.typing import ArrayLike


def geometric_growth(steps: ArrayLike, values: ArrayLike, rate_limit: float, min_steps: int,
                     min_total: float) -> tuple[float, int] | None:
    """(per-step growth factor, onset step) of a geometric rise that lasts to the last value, or None.

    For every start step, fits log(value) against step by least squares over the values
    from that start to the end, and returns the earliest start whose fitted growth factor
    exceeds `rate_limit` and over which the value grew more than `min_total` times. All
    fits come from suffix sums in one vectorised pass, so a run of thousands of steps
    costs what a handful of `polyfit` calls would.

    The rise must also be sustained: the median step-to-step factor from the start, and
    over the first third of the steps from the start, must exceed sqrt(`rate_limit`), and
    without its largest single jump the value must still grow by sqrt(`min_total`). A
    value that was flat until one spike fits a steep line over a window that ends at the
    spike, but it did not grow geometrically from that window's start, and claiming so
    would send the user after the wrong cause.
    """
    series, times = np.asarray(values, dtype=np.float64), np.asarray(steps, dtype=np.float64)
    if not len(series) or not (np.isfinite(series[-1]) and series[-1] > 0):
        return None  # a value that ends at 0 (a perfect fit) or non-finite is no rise lasting to the end
    ok = np.isfinite(series) & (series > 0)
    series, times = series[ok], times[ok]
    window = fit_window(float(series.max() / series.min()) if len(series) else 1.0, rate_limit)
    if window is not None:  # earlier starts cannot qualify: the same answer, in memory that does not grow with the run
        series, times = series[-window:], times[-window:]
    if len(series) < max(min_steps, 2):
        return None
    x = times - times.mean()  # a shift leaves every slope as it is and keeps the sums small
    y = np.log(series)

    def suffix(a: np.ndarray) -> np.ndarray:
        return np.cumsum(a[::-1])[::-1]

    count, sx, sy, sxx, sxy = suffix(np.ones_like(x)), suffix(x), suffix(y), suffix(x * x), suffix(x * y)
    starts = np.arange(0, len(series) - min_steps + 1)
    denominator = count[starts] * sxx[starts] - sx[starts] ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = (count[starts] * sxy[starts] - sx[starts] * sy[starts]) / denominator
    rate = np.exp(np.clip(slope, -700, 700))
    total = series[-1] / series[starts]
    hits = np.flatnonzero((denominator > 0) & (rate > rate_limit) & (total > min_total))
    for hit in hits[::max(1, len(hits) // SUSTAIN_CHECKS)]:
        start = starts[hit]
        factors = np.diff(y[start:]) / np.diff(times[start:])
        head = factors[:max(2, len(factors) // 3)]
        jumps = np.diff(y[start:])
        without_largest = jumps.sum() - jumps.max()
        if min(np.median(factors), np.median(head)) > 0.5 * math.log(rate_limit) and \
                without_largest > 0.5 * math.log(min_total):
            return float(rate[hit]), int(times[start])
    return None


def fit_window(spread: float, rate_limit: float) -> int | None:
    """The most trailing points a fit can span whose growth exceeds `rate_limit`, for values on distinct integer steps
    whose largest is `spread` times their smallest.

    A least-squares slope is cov(x, y) / var(x) <= sd(y) / sd(x). The log values span at most
    D = ln(spread), so sd(y) <= D / 2; m distinct integer steps have sd(x) >= sqrt((m^2 - 1) / 12).
    A fit over m points therefore has a slope of at most sqrt(3) D / sqrt(m^2 - 1), which stays
    below ln(rate_limit) once m - 1 >= sqrt(3) D / ln(rate_limit). For float32 values (D <= 191)
    and a limit of 1.2 that is 1,817 points, whatever the run's length.
    """
    if rate_limit <= 1 or not math.isfinite(spread):
        return None
    return int(math.sqrt(3) * math.log(max(spread, 1.0)) / math.log(rate_limit)) + 2


# At most this many candidate starts are checked for a sustained rise (each check is one pass
# over the steps after it), spread evenly over the candidates.
SUSTAIN_CHECKS = 200
