"""What a rule's fix applier returns: a `Change` for a re-run (`trace-steps --verify`, compare-clipping) or a
`StepFix` for a saved fit step (`replay DIR --verify`), and the moments both standardise with.

A rule module that can apply its own fix defines `verify_fixes(rec, session, run)` -> list of Change and/or
`bundle_fixes(rec, bundle, run)` -> list of StepFix (`run` is the run description, `report.run`).
"""

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np

from nanscope.tf_types import GradTransform

from nanscope.tf_types import KerasModel
from nanscope.model.optimizers import set_overrides

if TYPE_CHECKING:
    from nanscope.data.batches import BatchOrder
    from nanscope.model.models import LoadedModel
    from nanscope.spec.sections import RunSpec

# A session's training rows (run.sources.LoadedData) and its loss (run.losses.Loss) are defined a layer up, and
# reach into further types of that layer: to mypy they are Any here.
LoadedData: TypeAlias = Any
Loss: TypeAlias = Any
# A fix's change of the training and validation rows (`Change.data`).
DataChange: TypeAlias = Callable[[LoadedData], LoadedData]
# A fix's change of the saved step's model or optimizer: it returns what puts them back (`StepFix.change`).
ModelChange: TypeAlias = Callable[[KerasModel], Callable[[], None]]


class Session(Protocol):
    """The trace-steps session a fix re-runs, as far as the rules read it (run.session.Session, a layer up)."""

    @property
    def spec(self) -> "RunSpec": ...

    @property
    def train(self) -> LoadedData: ...

    @property
    def loss(self) -> Loss: ...

    @property
    def model(self) -> "LoadedModel": ...

    @property
    def order(self) -> "BatchOrder": ...

    def initial_weight_norm(self) -> float: ...


class Bundle(Protocol):
    """A saved fit step (keras.bundle_load.FitBundle, a layer up), as far as its fixes read it."""

    @property
    def model(self) -> KerasModel: ...

    @property
    def batch(self) -> Any: ...


@dataclass
class Change:
    """One change to try.

    Args:
        name: str. Short label ("clipnorm=1", "lr/10").
        params: dict. What the change sets, for the report.
        optimizer_overrides: dict. Optimizer arguments to override (learning_rate, clipnorm, epsilon, ...).
        grad_transform: callable(list of grads) -> list of grads, optional. Applied before the optimizer.
        model: LoadedModel, optional. A changed model (e.g. relu -> relu6); its weights must match the session's.
        loss_scaling: bool, optional. Wrap the optimizer in a LossScaleOptimizer (None: as the spec says).
        data: callable(LoadedData) -> LoadedData, optional. Changed training and validation data
            (standardised inputs or targets); the batch order stays the same.
        rescales_loss: bool, default False. The change puts the loss in other units (standardised
            targets), so it is judged against its own first loss, not the unfixed run's.
    """

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    optimizer_overrides: dict[str, Any] = field(default_factory=dict)
    grad_transform: GradTransform | None = None
    model: "LoadedModel | None" = None
    loss_scaling: bool | None = None
    data: DataChange | None = None
    rescales_loss: bool = False


@dataclass
class StepFix:
    """One fix applied to the saved step.

    Args:
        name: str. Short label ("lr/10", "drop 2 non-finite rows").
        params: dict. What it sets, for the report.
        acts_on: str. "update" (the optimizer: too late when the forward pass is already non-finite) or "step".
        change: callable(model) -> callable undo, optional. Changes the model or optimizer after the state is put back.
        batch: the batch to run on instead of the saved one, optional.
    """

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    acts_on: str = "update"
    change: ModelChange | None = None
    batch: Any = None


def moments(array: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per last-axis feature: (mean, std) over every other axis, NaN-aware, std 0 taken as 1."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
        values = array.astype(np.float64)
        axes = tuple(range(values.ndim - 1)) or None
        shift, scale = np.nanmean(values, axis=axes), np.nanstd(values, axis=axes)
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
    return np.nan_to_num(shift), scale


def optimizer_setting(name: str, value: Any, also: dict[str, Any] | None = None) -> ModelChange:
    """A StepFix change that sets optimizer attributes (the inner optimizer under loss scaling) and puts them back."""
    values = {name: value, **(also or {})}

    def change(model: KerasModel) -> Callable[[], None]:
        return set_overrides(model.optimizer, values)

    return change
