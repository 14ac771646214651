"""Loss and gradient-norm spikes: a robust z-score over the last steps, as OLMo-core and Levanter skip them.

The score is (v - median) / (1.4826 * MAD) over the last `window` healthy steps,
upward only, where v is the log of the value while the value and the window are
positive (a loss, a norm), else the value itself. The median and the median absolute
deviation, unlike the mean and the standard deviation, are not dragged by the spikes
themselves. The log makes the score a ratio: a minibatch loss is skewed (a small
batch's squared error is chi-square-like), and 6 robust sigmas of its raw values are
crossed by healthy batches a few times in a thousand, while a large batch's loss, with a
narrow spread, still flags a jump of a few percent. Nothing fires until the window is
full, spikes and non-finite steps are left out of it, and the spread has a floor of
0.01 (1% of the median on the log scale), so a flat loss does not turn rounding into a
spike.
"""

import math

import numpy as np

from nanscope.engine.records import StepRecord

METRICS = ("loss", "grad_global_norm")
MAD_TO_SIGMA = 1.4826
SPREAD_FLOOR = 0.01


REFRESH = 16  # healthy steps between two computations of a window's median and spread


class SpikeDetector:
    """Scores each healthy step's loss and global gradient norm against the last `window` steps.

    The window's median and spread are recomputed every REFRESH steps that join it, not on
    every step: a step then costs a comparison with the value each threshold stands for,
    and a step past it is scored exactly against the window as it is.

    Args:
        sigma: float. The z-score a spike exceeds.
        window: int. Steps kept (a ring: memory is flat at any run length).
    """

    def __init__(self, sigma: float = 6.0, window: int = 128) -> None:
        self.sigma, self.window = float(sigma), int(window)
        self._values = np.zeros((len(METRICS), self.window), np.float64)
        self._counts = [0] * len(METRICS)
        self._limits: list[float | None] = [None] * len(METRICS)  # the value each metric's z-score reaches sigma at

    def score(self, record: StepRecord) -> tuple[str, float, float, float] | None:
        """(metric, value, median, z) of the highest-scoring metric past `sigma`, or None.

        The step's values join the window only when it is no spike.
        """
        values = [_value(record, metric) for metric in METRICS]
        found = None
        for column, (metric, value) in enumerate(zip(METRICS, values)):
            if value is None or self._counts[column] < self.window:
                continue
            bound = self._limits[column]
            if bound is None or self._counts[column] % REFRESH == 0:
                bound = self._limits[column] = limit(self.sigma, self._values[column])
            if value <= bound:
                continue
            history = self._values[column]
            z = robust_z(value, history)
            if z > self.sigma and (found is None or z > found[3]):
                found = (metric, value, float(np.median(history)), z)
        if found is None:
            for column, value in enumerate(values):
                if value is not None:
                    self._values[column, self._counts[column] % self.window] = value
                    self._counts[column] += 1
        return found


def limit(sigma: float, history: np.ndarray) -> float:
    """The smallest value whose robust z-score against `history` is `sigma` (inf when none reaches it)."""
    positive = float(history.min()) > 0
    values = np.log(history) if positive else history
    median = float(np.median(values))
    floor = SPREAD_FLOOR if positive else SPREAD_FLOOR * abs(median)
    spread = max(MAD_TO_SIGMA * float(np.median(np.abs(values - median))), floor)
    if spread <= 0:
        return math.inf
    edge = median + sigma * spread
    if positive and edge >= 700:  # exp would overflow: no float value reaches it
        return math.inf
    raw = math.exp(edge) if positive else edge
    return raw - abs(raw) * 1e-9  # just under the edge: a value at it is scored exactly, never lost to rounding


def robust_z(value: float, history: np.ndarray) -> float:
    """How many robust standard deviations `value` is above the median of `history` (log scale when positive)."""
    if value > 0 and float(history.min()) > 0:
        value, history, floor = math.log(value), np.log(history), SPREAD_FLOOR
    else:
        floor = SPREAD_FLOOR * abs(float(np.median(history)))
    median = float(np.median(history))
    spread = max(MAD_TO_SIGMA * float(np.median(np.abs(history - median))), floor)
    return (value - median) / spread if spread > 0 else 0.0


def _value(record: StepRecord, metric: str) -> float | None:
    value = getattr(record, metric)
    if metric == "loss" and record.loss_missing:
        return None
    return float(value) if value is not None and math.isfinite(value) else None
