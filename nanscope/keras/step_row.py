"""What every instrumented fit step shares, on one device or per replica: its types, its batch's rows, its loss."""

from collections.abc import Callable
from typing import Any, TypeAlias

from nanscope.keras.capture import StepCapture
from nanscope.runtime import tensorflow
from nanscope.tf_types import Tensor

tf, keras = tensorflow()

# A step's batch as fit hands it to `train_step`, and what the step returns (its logs).
Data: TypeAlias = Any
Logs: TypeAlias = Any
# Keras' `train_step` (data -> logs) and train function (iterator -> logs).
TrainStep: TypeAlias = Callable[[Data], Logs]
TrainFunction: TypeAlias = Callable[[Any], Logs]


def logged_loss(capture: StepCapture, logs: Logs) -> Tensor | None:
    """The loss `compute_loss` returned (caught by the capture), or else the "loss" a custom train_step logs."""
    if capture.loss is not None or not isinstance(logs, dict):
        return None
    return logs.get("loss")


def batch_rows(x: Any) -> Tensor:
    """Rows of the step's batch: the leading size of its first tensor (0 when it has none)."""
    flat = [t for t in tf.nest.flatten(x) if t is not None]
    return tf.cast(tf.shape(flat[0])[0], tf.float32) if flat else tf.constant(0.0)
