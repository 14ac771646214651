"""What the rules read beyond the step records: the model's layers and the scale of the training data.

trace-steps sees the training arrays and measures them once (`evidence_from_arrays`);
the `NanScope` callback and `instrument` never see the arrays, so they measure each
batch inside the step and merge the moments over the run (`keras/moments.py`). Both
hand the rules the same plain numbers.
"""

import warnings
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import ArrayLike

from nanscope.data import inputs
from nanscope.data.targets import Arrays
from nanscope.tf_types import KerasModel
from nanscope.rules.fixes import Session
from nanscope.rules.outliers import Glitches, glitch_rows, glitches_in

# The dataset rows of a step's batch, where the run knows its batch order.
BatchRows: TypeAlias = Callable[[int], np.ndarray]


@dataclass
class FeatureScale:
    """One input feature (a column of the last axis): its name, its key in findings, std and mean |x|.

    `key` is the column index for a model's single input, and `"<input>[i]"` for one of several.
    """

    name: str
    key: int | str
    std: float
    mean_abs: float


@dataclass
class TargetScale:
    """One output's float targets as a whole: output name (None for a single output), its loss, std and mean |y|."""

    output: str | None
    loss: str
    std: float
    mean_abs: float


@dataclass
class RunEvidence:
    """The run as the rules see it, besides the report.

    Args:
        keras_model: keras.Model or None. For the layers' dtypes and activations.
        features: list of FeatureScale, or None when the run's inputs were not measured.
        targets: list of TargetScale, or None when the run's targets were not measured.
        initial_weight_norm: callable() -> float, or None. The weights' norm before the first step
            (a run seen only through `fit` keeps no initial weights).
        batch_rows: callable(step) -> numpy int array, or None. The dataset rows of a step's batch,
            where the run knows its batch order.
        glitches: dict or None. {array label: {row: cells}} of training rows far outside their column
            (`outliers.glitches_in`); None when the run's arrays were not seen.
    """

    keras_model: KerasModel = None
    features: list[FeatureScale] | None = None
    targets: list[TargetScale] | None = None
    initial_weight_norm: Callable[[], float] | None = None
    batch_rows: BatchRows | None = None
    glitches: Glitches | None = None


def feature_scales(x: Arrays, feature_names: Sequence[str] = (), ids: Collection[str] = ()) -> list[FeatureScale]:
    """FeatureScale per column of each float input of `x` (an array, or one array per input).

    `ids` names the inputs that hold token or category ids (`inputs.id_inputs`): they have no scale to fix.
    """
    found = []
    for label, part in inputs.named(x):
        if label in ids or not np.issubdtype(part.dtype, np.floating):
            continue
        std, mean = finite_spread(without_glitches(part.reshape(len(part), -1)), axis=0)
        names = list(feature_names) if label == "x" else []
        found += [FeatureScale(names[i] if i < len(names) else f"{label}[{i}]", i if label == "x" else f"{label}[{i}]",
                               float(std[i]), float(mean[i])) for i in range(len(std))]
    return found


def target_scales(pairs: Iterable[tuple[str | None, str, np.ndarray]]) -> list[TargetScale]:
    """TargetScale per (output name or None, loss name, targets) whose targets are numbers: floats, or integers (whole
    dollars; class labels are judged by their loss, which the scale rule reads)."""
    found = []
    for output, loss, y in pairs:
        if np.issubdtype(y.dtype, np.floating) or np.issubdtype(y.dtype, np.integer):
            # A few glitch rows are drop-outlier-rows' finding, not a scale to standardise.
            std, mean = finite_spread(without_glitches(y))
            found.append(TargetScale(output, loss, float(std), float(mean)))
    return found


def without_glitches(array: np.ndarray) -> np.ndarray:
    """`array` without the rows that hold glitches (`outliers.glitch_rows`): the scale of the real data."""
    rows = glitch_rows(array)
    return np.delete(array, sorted(rows), axis=0) if rows else array


def finite_spread(values: ArrayLike, axis: int | None = None) -> tuple[Any, Any]:
    """(std, mean |x|) of the finite values, in float64; NaN where there are none.

    A NaN or Inf in the data is clean-input-data's evidence; a scale quoted from it
    ("std nan") says nothing, so the scale rules measure what is finite.
    """
    array = np.asarray(values, dtype=np.float64)
    array = np.where(np.isfinite(array), array, np.nan)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
        return np.nanstd(array, axis=axis), np.nanmean(np.abs(array), axis=axis)


def evidence_from_session(session: Session) -> RunEvidence:
    """RunEvidence of a trace-steps session: its Keras model and its training arrays, measured."""
    train, loss = session.train, session.loss
    known = {"keras_model": session.model.keras_model, "initial_weight_norm": session.initial_weight_norm,
             "batch_rows": session.order.indices if getattr(session, "order", None) is not None else None}
    if train is None:
        return RunEvidence(**known)
    if loss.multi_output:
        pairs = [(o.name, o.loss.name, y) for o, y in zip(loss.outputs, train.y)]
    else:
        pairs = [(None, loss.name, train.y)]
    ids = inputs.ids_of(train, session.model.keras_model)
    return RunEvidence(**known, features=feature_scales(train.x, train.feature_names, ids),
                       targets=target_scales(pairs), glitches=glitches_in(train.x, train.y, ids))
