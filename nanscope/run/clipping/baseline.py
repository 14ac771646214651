"""The trivial baseline a clipping strategy must beat: the loss of a constant prediction.

A strategy that stays finite but ends no better than predicting a constant has learned
nothing, and clipping then only hides the problem. The constant is the one a model with
no inputs would learn from the training targets: their mean under a squared loss (the
baseline is then the targets' variance), their median under an absolute one, the label
prior under a cross-entropy (the baseline is then the prior's entropy). The baseline is
the run's own loss function evaluated on that constant, over the rows the strategies are
ranked on: the validation rows, or the training rows when there are none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope.checkdata.labels import label_kind
from nanscope.data import targets
from nanscope.runtime import tensorflow

if TYPE_CHECKING:
    from nanscope.run.session import Session

# A strategy learns when its loss ends at least this far below the baseline; a run that ends
# at the baseline, within float noise, predicts what a constant predicts.
BASELINE_MARGIN = 0.99
ABSOLUTE_LOSSES = {"mae", "meanabsoluteerror", "mape", "meanabsolutepercentageerror"}


@dataclass
class Baseline:
    """The loss of the trivial constant prediction.

    Args:
        value: float. The loss of the constant prediction.
        rows: str. "validation" or "training": the rows it was measured on.
        how: str. What the constant is, for the report.
    """

    value: float
    rows: str
    how: str

    def beaten_by(self, loss: float | None) -> bool:
        """True when `loss` is below the baseline by the margin that shows learning."""
        # The margin is a fraction of the baseline's size: a loss that can be negative (Poisson) must end below it too.
        return loss is not None and np.isfinite(loss) and loss < self.value - (1 - BASELINE_MARGIN) * abs(self.value)

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "rows": self.rows, "how": self.how, "margin": BASELINE_MARGIN}


def trivial_baseline(session: Session) -> Baseline | None:
    """The Baseline of a session's loss and data, or None for a loss whose constant nanscope does not know."""
    tf, _ = tensorflow()
    losses = [o.loss for o in session.loss.outputs] if session.loss.multi_output else [session.loss]
    names = [f"{o.name}: " for o in session.loss.outputs] if session.loss.multi_output else [""]
    data, rows = (session.validation, "validation") if session.validation is not None else (session.train, "training")
    widths = _output_widths(session)
    predictions: list[np.ndarray] = []
    hows: list[str] = []
    for name, loss, y_train, y_eval, width in zip(names, losses, targets.parts(session.train.y),
                                                  targets.parts(data.y), widths):
        constant = _constant(loss, np.asarray(y_train), len(y_eval), width)
        if constant is None:
            return None
        predictions.append(constant[0])
        hows.append(name + constant[1])
    y = data.y if session.loss.multi_output else targets.parts(data.y)[0]
    y_pred = tuple(predictions) if session.loss.multi_output else predictions[0]
    with np.errstate(all="ignore"):
        value = float(session.loss.total(session.loss.terms(
            tf.nest.map_structure(tf.constant, y), tf.nest.map_structure(tf.constant, y_pred))))
    return Baseline(value, rows, "; ".join(hows))


def _output_widths(session: Session) -> list[int]:
    """The last axis of each model output, from one forward pass on one training row."""
    tf, _ = tensorflow()
    from nanscope.data import inputs

    outputs = session.model.call(inputs.take(session.train.x, slice(0, 1)), False)
    return [int(t.shape[-1]) if len(t.shape) >= 2 else 1 for t in tf.nest.flatten(outputs)]


def _constant(loss: Any, y_train: np.ndarray, rows: int, width: int) -> tuple[np.ndarray, str] | None:
    """(prediction for `rows` rows, what it is) or None."""
    kind = label_kind(loss.name)
    key = (loss.name or "").lower().replace("_", "")
    finite = y_train[np.isfinite(y_train)] if np.issubdtype(y_train.dtype, np.floating) else y_train
    if kind == "regression" and finite.size:
        axis = 0 if y_train.ndim > 1 else None
        if key in ABSOLUTE_LOSSES:
            value, what = np.nanmedian(y_train, axis=axis), "the training targets' median"
        else:
            value, what = np.nanmean(y_train, axis=axis), "the training targets' mean"
        shape = (rows, *y_train.shape[1:])
        return np.broadcast_to(np.asarray(value, np.float32), shape).copy(), f"predicting {what}"
    if kind in ("sparse", "onehot"):
        labels = y_train.reshape(-1).astype(np.int64) if kind == "sparse" else np.argmax(y_train, axis=-1)
        classes = max(width, int(labels.max()) + 1 if labels.size else 1)
        counts = np.bincount(labels[labels >= 0], minlength=classes)[:classes].astype(np.float64)
        prior = (counts + 1.0) / (counts.sum() + classes)  # +1: a class unseen in training keeps a finite loss
        row = np.log(prior) if loss.from_logits else prior
        return np.tile(row.astype(np.float32), (rows, 1)), "predicting the label prior of the training rows"
    if kind == "binary" and finite.size:
        p = float(np.clip(np.mean(finite), 1e-7, 1 - 1e-7))
        value = np.log(p / (1 - p)) if loss.from_logits else p
        return np.full((rows, *y_train.shape[1:]), value, np.float32), \
            f"predicting the training rows' positive rate {p:.3g}"
    return None
