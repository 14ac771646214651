"""A train step's scalar row: the SCALARS columns of one step, then the OUTPUT columns of each output.

Traced inside the step (engine/step.py and engine/distributed.py): the loss, the non-finite counts of the
inputs, targets, predictions and loss, the gradient and weight columns the step measured, and the loss
scale, before the update and after it, with whether a LossScaleOptimizer skipped the update.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nanscope.engine.schema import OUTPUT, SCALARS
from nanscope.engine.variable_stats import any_nonfinite_count
from nanscope.runtime import tensorflow
from nanscope.tf_types import Tensor


@dataclass(frozen=True)
class StepTensors:
    """What one traced step computed, that its scalars are taken of.

    Args:
        x, y, y_pred: the batch's inputs and targets, and the model's outputs (tensors or nests of them).
        total: Tensor. The loss the step minimised (the data loss and the layers' loss terms).
        data_loss: Tensor. The loss of the outputs alone.
        applied: list of Tensor. The gradients handed to the optimizer, unscaled (after any clipping).
        scale: Tensor, optional. The loss scale the step's loss was multiplied by (None without loss scaling).
        output_losses: list of Tensor. Each output's loss.
    """

    x: Any
    y: Any
    y_pred: Any
    total: Tensor
    data_loss: Tensor
    applied: list[Tensor]
    scale: Tensor | None
    output_losses: list[Tensor]


def scalar_row(step: StepTensors, measured: dict[str, Tensor], scale_after: Tensor | None, multi_output: bool,
               prediction_nonfinite: Callable[[Tensor], Tensor]) -> Tensor:
    """The step's scalar row (SCALARS, then OUTPUT per output when `multi_output`), a float32 vector.

    Args:
        step: StepTensors.
        measured: dict of name -> Tensor. The gradient and weight columns (SCALARS names).
        scale_after: Tensor, optional. The loss scale after the update (None without loss scaling).
        multi_output: bool. Add the per-output columns.
        prediction_nonfinite: callable(Tensor) -> Tensor. Non-finite entries of one output.
    """
    tf, _ = tensorflow()
    target_counts = [any_nonfinite_count(t) for t in tf.nest.flatten(step.y)]
    prediction_counts = [prediction_nonfinite(t) for t in tf.nest.flatten(step.y_pred)]
    per_output = [OUTPUT.pack({"loss": loss, "target_nonfinite": target, "prediction_nonfinite": prediction})
                  for loss, target, prediction in zip(step.output_losses, target_counts, prediction_counts)]
    scaled = step.scale is not None
    return tf.stack(SCALARS.pack({
        "loss": tf.cast(step.total, tf.float32), "data_loss": step.data_loss,
        "x_nonfinite": _total([any_nonfinite_count(t) for t in tf.nest.flatten(step.x)]),
        "y_nonfinite": _total(target_counts), "output_nonfinite": _total(prediction_counts),
        "loss_nonfinite": tf.cast(tf.logical_not(tf.math.is_finite(step.total)), tf.float32),
        **measured,
        "loss_scale": tf.cast(tf.convert_to_tensor(scale_after), tf.float32) if scale_after is not None else 0.0,
        "update_skipped": update_skipped(step.applied, step.scale),
        "loss_scale_before": step.scale if scaled else 0.0,
        "loss_missing": 0.0,
    }) + [column for row in (per_output if multi_output else []) for column in row])


def update_skipped(applied: list[Tensor], scale: Tensor | None) -> Tensor:
    """1.0 when a LossScaleOptimizer skipped this update (its scaled gradients were not finite); 0.0 without
    loss scaling (`scale` None)."""
    tf, _ = tensorflow()
    if scale is None:
        return tf.constant(0.0)
    finite = [tf.reduce_all(tf.math.is_finite(g * tf.cast(scale, g.dtype))) for g in applied]
    return tf.cast(tf.logical_not(tf.reduce_all(tf.stack(finite))), tf.float32)


def _total(counts: list[Tensor]) -> Tensor:
    """The sum of a list of scalar tensors; one is returned as it is (no op)."""
    tf, _ = tensorflow()
    return counts[0] if len(counts) == 1 else tf.add_n(counts)
