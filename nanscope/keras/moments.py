"""Per-feature running statistics of a guest step's inputs and targets, measured inside the step.

The callback never sees the training arrays, so the data-scale rules (`normalize-inputs`,
`normalize-targets`) would have nothing to read. Instead the compiled step adds, per
column of each float input and each float or integer target, the count of finite entries, their sum, sum of
squares and sum of magnitudes into variables on the device (four small reductions over
the batch); the host reads them once, when the report is built, and turns them into
the same `FeatureScale` and `TargetScale` numbers trace-steps measures on the arrays.
Sums are float32: fine for telling unit scale from a scale of 10 or more.
"""

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from nanscope.data import targets
from nanscope.internals import untraced_variable
from nanscope.rules.evidence import FeatureScale, TargetScale
from nanscope.runtime import tensorflow
from nanscope.tf_types import Tensor, Variable

tf, keras = tensorflow()



class FeatureMoments:
    """Running sums per column of the float parts of x and y, kept on the device."""

    def __init__(self) -> None:
        # label -> tf.Variable [4, columns]: finite count, sum, sum of squares, sum of |x|
        self._sums: dict[str, Variable] = {}

    def add(self, x: Tensor, y: Tensor) -> None:
        """In the traced step: add this batch's columns."""
        for label, part in _measured_parts(x, "x") + _measured_parts(y, "y", integers=True):
            flat = tf.reshape(tf.cast(part, tf.float32), [tf.shape(part)[0], -1])
            finite = tf.math.is_finite(flat)
            clean = tf.where(finite, flat, tf.zeros_like(flat))
            row = tf.stack([tf.reduce_sum(tf.cast(finite, tf.float32), 0), tf.reduce_sum(clean, 0),
                            tf.reduce_sum(tf.square(clean), 0), tf.reduce_sum(tf.abs(clean), 0)])
            variable = self._variable(label, row.shape[1])
            if variable is not None:
                variable.assign_add(row)

    def _variable(self, label: str, columns: int | None) -> Variable | None:
        if columns is None:
            return None
        if label not in self._sums:
            with tf.init_scope():  # not counted by the tracing step: it is traced as often as without nanscope
                self._sums[label] = untraced_variable(tf.zeros([4, columns]), trainable=False,
                                                      name="nanscope_moments")
        return self._sums[label] if self._sums[label].shape[1] == columns else None

    def labels(self) -> list[str]:
        """The labels of the parts measured so far ("x", "x[0]", "y", ...)."""
        return list(self._sums)

    def scales(self, ids: Collection[str] = (), loss: str | None = None, outputs: Sequence[Any] = ()
               ) -> tuple[list[FeatureScale], list[TargetScale]]:
        """(features, targets): FeatureScale per input column and TargetScale per target, from the sums so far.

        Args:
            ids: labels of the inputs that are ids (left out).
            loss: str. The compiled loss's name (one output).
            outputs: list of {name, loss}, the run header's `outputs`: a multi-output model's targets are
                judged under their own output's loss, as trace-steps judges them.
        """
        features: list[FeatureScale] = []
        targets: list[TargetScale] = []
        for label, variable in self._sums.items():
            count, total, squares, magnitude = (np.asarray(row, np.float64) for row in variable.numpy())
            if label.startswith("y"):
                n = max(count.sum(), 1.0)
                mean = total.sum() / n
                output, output_loss = _output_of(label, outputs, loss)
                targets.append(TargetScale(output, output_loss or "",
                                           float(np.sqrt(max(squares.sum() / n - mean ** 2, 0.0))),
                                           float(magnitude.sum() / n)))
                continue
            if label in ids:
                continue
            n = np.maximum(count, 1.0)
            mean = total / n
            std = np.sqrt(np.maximum(squares / n - mean ** 2, 0.0))
            features += [FeatureScale(f"{label}[{i}]", i if label == "x" else f"{label}[{i}]", float(std[i]),
                                      float(magnitude[i] / n[i])) for i in range(len(std)) if count[i] > 0]
        return features, targets


def _output_of(label: str, outputs: Sequence[Any], loss: str | None) -> tuple[str | None, str | None]:
    """(output name or None, its loss name) of the target labelled `label` ("y", "y['price']", "y[0]")."""
    if label == "y":
        return None, loss
    key = label[2:-1]
    named = {str(o.get("name")): o for o in outputs or [] if isinstance(o, dict)}
    if key.startswith("'") and key.strip("'") in named:
        found = named[key.strip("'")]
    elif key.isdigit() and int(key) < len(outputs or []):
        found = outputs[int(key)]
    else:
        return label, loss
    return found.get("name"), found.get("loss") or loss


def _measured_parts(value: Tensor, label: str, integers: bool = False) -> list[tuple[str, Tensor]]:
    """The float parts of `value` (and with `integers` its integer ones: targets read from a file as whole dollars
    are int64, and trace-steps measures them as the float32 it trains on; integer inputs are ids, left out)."""
    if value is None:
        return []
    return [(name, part) for name, part in targets.named(value, label) if tf.is_tensor(part)
            and (part.dtype.is_floating or (integers and part.dtype.is_integer))
            and part.shape.rank is not None and part.shape.rank >= 1]
