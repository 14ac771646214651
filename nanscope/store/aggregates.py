"""A run's exact aggregates, per layer, variable and output: extremes, last values and non-finite steps over
every step (`StepHistory` keeps one of each; the tables and the rules read them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nanscope.engine.records import LayerStats, OutputStats, VariableStats


@dataclass
class LayerAggregate:
    """One layer over the whole run: extremes and last values of its called steps, its non-finite steps."""

    called_steps: int = 0
    max_abs: float = 0.0
    min_abs: float | None = None
    max_abs_healthy: float | None = None
    underflow_max: float = 0.0
    last: LayerStats | None = None
    zero_fraction_last: float | None = None
    nonfinite_steps: int = 0
    first_nonfinite_step: int | None = None
    last_nonfinite_step: int | None = None

    def add(self, step: int, stats: LayerStats, healthy: bool) -> None:
        if stats.called:
            self.called_steps += 1
            self.max_abs = max(self.max_abs, stats.max_abs)
            self.min_abs = stats.max_abs if self.min_abs is None else min(self.min_abs, stats.max_abs)
            if healthy:
                self.max_abs_healthy = _max(self.max_abs_healthy, stats.max_abs)
            self.underflow_max = max(self.underflow_max, stats.underflow_fraction)
            self.last = stats
            if stats.zero_fraction is not None:
                self.zero_fraction_last = stats.zero_fraction
        if stats.nonfinite:
            self.nonfinite_steps += 1
            self.first_nonfinite_step = step if self.first_nonfinite_step is None else self.first_nonfinite_step
            self.last_nonfinite_step = step


@dataclass
class VariableAggregate:
    """One variable over the whole run: finite extremes of its gradient norm and update ratio, its last row."""

    steps: int = 0
    max_grad_norm: float | None = None
    min_grad_norm: float | None = None
    first_update_ratio: float | None = None
    max_update_ratio_after_first: float | None = None
    last: VariableStats | None = None
    nonfinite_steps: int = 0
    first_nonfinite_step: int | None = None
    last_nonfinite_step: int | None = None

    def add(self, step: int, stats: VariableStats, absorbed: bool = False) -> None:
        if math.isfinite(stats.grad_norm):
            self.max_grad_norm = _max(self.max_grad_norm, stats.grad_norm)
            self.min_grad_norm = stats.grad_norm if self.min_grad_norm is None else min(self.min_grad_norm,
                                                                                        stats.grad_norm)
        ratio = stats.update_ratio if math.isfinite(stats.update_ratio) else None
        if self.steps == 0:
            self.first_update_ratio = ratio
        elif ratio is not None:
            self.max_update_ratio_after_first = _max(self.max_update_ratio_after_first, ratio)
        self.steps += 1
        self.last = stats
        if (stats.grad_nonfinite and not absorbed) or stats.weight_nonfinite:
            self.nonfinite_steps += 1
            self.first_nonfinite_step = step if self.first_nonfinite_step is None else self.first_nonfinite_step
            self.last_nonfinite_step = step

    @property
    def max_update_ratio(self) -> float | None:
        """The largest finite |dw|/|w| after the first step (the first one's, for a one-step run)."""
        return self.max_update_ratio_after_first if self.steps > 1 else self.first_update_ratio


@dataclass
class OutputAggregate:
    """One output of a multi-output model over the whole run: first, last and largest finite loss, non-finite steps."""

    first: OutputStats | None = None
    last: OutputStats | None = None
    max_loss: float | None = None
    min_loss: float | None = None
    nonfinite_steps: int = 0
    first_nonfinite_step: int | None = None
    last_nonfinite_step: int | None = None

    def add(self, step: int, stats: OutputStats) -> None:
        self.first = self.first or stats
        self.last = stats
        if math.isfinite(stats.loss):
            self.max_loss = _max(self.max_loss, stats.loss)
            self.min_loss = stats.loss if self.min_loss is None else min(self.min_loss, stats.loss)
        if not math.isfinite(stats.loss) or stats.target_nonfinite or stats.prediction_nonfinite:
            self.nonfinite_steps += 1
            self.first_nonfinite_step = step if self.first_nonfinite_step is None else self.first_nonfinite_step
            self.last_nonfinite_step = step


def _max(current: float | None, value: float) -> float:
    return value if current is None else max(current, value)
