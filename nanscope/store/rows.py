"""A step's scalar row: the columns `StepHistory` keeps for every step and the trace's `scalars` lines hold."""

from __future__ import annotations

import functools
import math

import numpy as np

from nanscope.engine.records import StepRecord
from nanscope.engine.schema import OUTPUT, PHASES, SCALARS, Columns

FLOAT32_MAX = float(np.finfo(np.float32).max)
# The columns kept for every step, before SCALARS (and the per-output columns).
HEAD = ("batch_rows", "phase", "weight_norm", "update_ratio")


@functools.cache
def series_columns(outputs: int) -> Columns:
    """The per-step scalar columns for a model with `outputs` outputs (0: one output)."""
    per_output = [f"output{i}/{name}" for i in range(outputs) for name in OUTPUT]
    return Columns(*HEAD, *SCALARS, *per_output)


def global_update_ratio(record: StepRecord) -> float:
    """|dw|/|w| over all trainable weights together (small bias vectors alone would dominate a per-variable max)."""
    # hypot, not sqrt(sum(x ** 2)): a float ** 2 past 1.3e154 raises OverflowError, hypot returns inf.
    weights = math.hypot(*(v.weight_norm for v in record.variables))
    updates = math.hypot(*(v.update_ratio * v.weight_norm for v in record.variables if math.isfinite(v.update_ratio)))
    return updates / weights if weights > 0 else 0.0


def overall_norms(record: StepRecord) -> tuple[float, float]:
    """(|w|, |dw|/|w|) over all trainable weights: from the per-variable rows, or a sentinel step's own pair."""
    if record.overall_norms is not None and not record.variables:
        weights, update = record.overall_norms
        return weights, (update / weights if weights > 0 else 0.0)
    return math.hypot(*(v.weight_norm for v in record.variables)), global_update_ratio(record)


def scalar_row(record: StepRecord) -> list[float | None]:
    """The SERIES values of one record, in column order (without the step), each put by its column's name."""
    # The two norms taken here, in float64, are kept as float32 like the step's own values: capped at its max.
    weight_norm, update_ratio = overall_norms(record)
    values = {
        "batch_rows": record.batch_rows, "phase": PHASES.index(record.phase),
        "weight_norm": min(weight_norm, FLOAT32_MAX), "update_ratio": min(update_ratio, FLOAT32_MAX),
        "loss": record.loss, "data_loss": record.data_loss, "x_nonfinite": record.x_nonfinite,
        "y_nonfinite": record.y_nonfinite, "output_nonfinite": record.output_nonfinite,
        "loss_nonfinite": float(record.loss_nonfinite), "grad_global_norm": record.grad_global_norm,
        "grad_nonfinite": record.grad_nonfinite, "weights_nonfinite": record.weights_nonfinite,
        "applied_grad_global_norm": record.applied_grad_global_norm,
        # 0 is "no loss scaling" (a StepRecord's None), as the step writes it.
        "loss_scale": record.loss_scale or 0.0, "update_skipped": float(record.update_skipped),
        "loss_scale_before": record.loss_scale_before or 0.0, "loss_missing": float(record.loss_missing),
    }
    for index, output in enumerate(record.outputs):
        values.update({f"output{index}/loss": output.loss, f"output{index}/target_nonfinite": output.target_nonfinite,
                       f"output{index}/prediction_nonfinite": output.prediction_nonfinite})
    return series_columns(len(record.outputs)).pack(values)
