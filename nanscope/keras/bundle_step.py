"""One run of a fit bundle's saved step: the state before it put back, the model's own `train_step` run eagerly
under the op watch (`forensics.guest.replay_call`).

`nanscope replay DIR` (keras/bundle_replay.py) runs it once; `--verify` (keras/bundle_verify.py)
runs it once per fix. Both import it from here, so neither imports the other's module back.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope.engine.model_view import probed_layers
from nanscope.forensics.guest import replay_call
from nanscope.internals import compile_loss
from nanscope.tf_types import Batch, KerasModel

if TYPE_CHECKING:
    from nanscope.forensics.events import OpEvent
    from nanscope.keras.bundle_load import FitBundle



@dataclass
class StepOutcome:
    """What one run of the saved step did.

    Args:
        event: OpEvent or None. The first non-finite op (None: the step, its gradients and its update stayed finite).
        loss: float or None. The loss the step logged (on the weights before the step).
        loss_after: float or None. The loss on the same batch with the weights after the step (None: not measured,
            a model without a compiled loss).
        seconds: float.
    """

    event: "OpEvent | None"
    loss: float | None
    loss_after: float | None
    seconds: float

    @property
    def finite(self) -> bool:
        values = [v for v in (self.loss, self.loss_after) if v is not None]
        return self.event is None and all(math.isfinite(v) for v in values)


def run_saved_step(bundle: "FitBundle", batch: Batch = None,
                   change: Callable[[KerasModel], Callable[[], None]] | None = None) -> StepOutcome:
    """Put the state before the step back and run `train_step` once, eagerly, under the op watch.

    Args:
        bundle: FitBundle.
        batch: the batch to run on, default the saved one.
        change: callable(model) -> callable undo, optional. A fix applied once the state is back, undone after.
    """
    model, batch = bundle.model, bundle.batch if batch is None else batch
    bundle.restore()
    _reset_metrics(model)
    undo = change(model) if change is not None else None
    logs: dict[str, Any] = {}

    def step(data: Batch) -> Any:
        result = model.train_step(data)
        logs.update(result if isinstance(result, dict) else {"loss": result})
        return result

    started = time.perf_counter()
    try:
        found = replay_call(step, (batch,), probed_layers(model), [model], [model.optimizer],
                            model.trainable_variables)
        return StepOutcome(found.event, _scalar(logs.get("loss")), _loss_on(model, batch),
                           time.perf_counter() - started)
    finally:
        if undo is not None:
            undo()


def _loss_on(model: KerasModel, batch: Batch) -> float | None:
    """The compiled loss on `batch` with the model's current weights; None for a model without a compiled loss."""
    if compile_loss(model) is None:
        return None
    _reset_metrics(model)
    return _scalar(model.test_step(batch).get("loss"))


def _reset_metrics(model: KerasModel) -> None:
    for metric in model.metrics:
        metric.reset_state()


def _scalar(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(np.asarray(value))
    except (TypeError, ValueError):
        return None
