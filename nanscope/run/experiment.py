"""The one experiment runner: re-run training from the same start with one change.

Fix verification (`trace-steps --verify`) and `compare-clipping` both ask the same
question: with this change, from the same initial weights and the same batch order,
does training stay finite, and how low does the loss get? `run_experiment` answers
it for one change; every run resets the weights first, so runs are comparable.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope import interrupt
from nanscope.data import targets
from nanscope.engine.loss_scale import LossScaleWatch
from nanscope.engine.records import StepRecord
from nanscope.store.history import StepHistory
from nanscope.jsonio import jsonable
from nanscope.rules.fixes import Change as Change  # re-exported: the Change an experiment runs, declared with the rules
from nanscope.store.series import ScalarColumns

if TYPE_CHECKING:
    from nanscope.model.models import LoadedModel
    from nanscope.run.session import Session

# The scalar columns an experiment's result reads of every step (its verdict, its JSON, the report's overview).
RESULT_COLUMNS = ("phase", "loss", "grad_global_norm", "loss_scale", "update_skipped", "loss_missing")


@dataclass
class ExperimentResult:
    """What one run with a change did, in memory that does not hold a Python object per step.

    Args:
        name, params: from the Change.
        history: StepHistory. Every step's scalars (float32 columns), the full rows of a bounded
            set of steps (every step of a short run) and exact per-layer and per-variable aggregates.
        first_nonfinite_step: int or None.
        final_loss, best_loss: float or None. Training loss at the last step / lowest over finite steps.
        val_loss: float or None. Validation loss after the last step (None when non-finite or no validation part).
        start_fingerprint: float or None. Sum of |w| over the model's state as the run started (fingerprint=True).
        batches_fingerprint: int or None. CRC32 of the bytes of every batch fed, in order (fingerprint=True).
        first_nonfinite_phase: str or None. The phase of the first non-finite step.
        first_loss: float or None. The training loss of the first step.
        first_healthy: StepRecord or None. The full row of the first finite step whose update was applied and
            whose global gradient norm is finite.
    """

    name: str
    params: dict[str, Any]
    history: StepHistory
    first_nonfinite_step: int | None
    final_loss: float | None
    best_loss: float | None
    val_loss: float | None
    start_fingerprint: float | None = None
    batches_fingerprint: int | None = None
    first_nonfinite_phase: str | None = None
    first_loss: float | None = None
    first_healthy: StepRecord | None = None

    @property
    def finite(self) -> bool:
        return self.first_nonfinite_step is None

    @property
    def steps_run(self) -> int:
        return self.history.count

    @property
    def records(self) -> list[StepRecord]:
        """The kept full rows (StepRecord), in step order: every step of a run shorter than 2 * keep steps."""
        return self.history.kept()

    @property
    def losses(self) -> list[float]:
        """Every step's training loss."""
        return self.history.column("loss").tolist()

    @property
    def grad_global_norms(self) -> list[float]:
        """Every step's global gradient norm."""
        return self.history.column("grad_global_norm").tolist()

    def healthy_grad_norms(self) -> np.ndarray:
        """The finite global gradient norms of the finite steps whose update was applied, as a float64 array."""
        norms = self.history.column("grad_global_norm")
        applied = self.history.column("update_skipped") == 0
        return norms[(self.history.phases() == 0) & applied & np.isfinite(norms)]

    @property
    def skipped_updates(self) -> int:
        """Updates a LossScaleOptimizer skipped on steps that stayed finite: its scaled gradients overflowed
        float16, which dynamic loss scaling absorbs (the step is not a failure, but no weight changed)."""
        return int(np.count_nonzero((self.history.column("update_skipped") != 0) & (self.history.phases() == 0)))

    @property
    def stalled(self) -> bool:
        """True when loss scaling skipped so many updates that the run did not train: every one of them, or so
        many after its warm-up that the scale collapsed (`rules.precision.collapsed_window`). Such a run can
        stay finite only because no weight changed."""
        from nanscope.engine.loss_scale import collapsed_window
        from nanscope.rules.precision import BEFORE_GRADIENTS

        skipped = self.history.column("update_skipped") != 0
        if not skipped.any():
            return False
        scaled, before = self.history.column("loss_scale") != 0, np.isin(self.history.phases(), BEFORE_GRADIENTS)
        return bool(skipped.all()) or collapsed_window(skipped, scaled, before) is not None

    def to_json(self) -> Any:
        return jsonable({
            "name": self.name, "params": self.params, "first_nonfinite_step": self.first_nonfinite_step,
            "final_loss": self.final_loss, "best_loss": self.best_loss, "val_loss": self.val_loss,
            "steps_run": self.steps_run, "skipped_updates": self.skipped_updates, "stalled": self.stalled,
            "losses": self.losses,
        })


def run_experiment(session: Session, change: Change, steps: int | None = None, stop_at_nonfinite: bool = True,
                   on_step: Callable[[StepRecord], object] | None = None, fingerprint: bool = False
                   ) -> ExperimentResult:
    """Train from the session's initial weights with `change` applied and summarise the run.

    Args:
        session: Session.
        change: Change.
        steps: int, optional. Default: the spec's `train.steps`.
        stop_at_nonfinite: bool, default True. Stop at the first non-finite step.
        on_step: callable(StepRecord), optional. Progress callback.
        fingerprint: bool, default False. Record fingerprints of the start weights and of the batches fed,
            so callers can check that runs started alike and saw the same data.
    """
    with session.using_data(change.data):
        return _run(session, change, steps, stop_at_nonfinite, on_step, fingerprint)


def _run(session: Session, change: Change, steps: int | None, stop_at_nonfinite: bool,
         on_step: Callable[[StepRecord], object] | None, fingerprint: bool) -> ExperimentResult:
    model = change.model or session.model
    session.reset_weights(model)
    start = _state_fingerprint(model) if fingerprint else None
    crc = 0
    engine = session.instrumented_step(change.optimizer_overrides, change.grad_transform, model=model,
                                       loss_scaling=change.loss_scaling)
    scale_watch = LossScaleWatch()
    run, first_bad = _RunSummary([info.dtype for info in getattr(engine, "layer_info", [])]), None
    runner, step, total = session.chunk_runner(engine), 0, steps or session.spec.train.steps
    while step < total and not (stop_at_nonfinite and first_bad is not None):
        interrupt.check()
        done, error = session.next_records(engine, runner, step, total, first_bad is None)
        for record in done:
            scale_watch.see(record)
            if fingerprint:
                x, y = session.batch(record.step)
                for array in (*targets.parts(x), *targets.parts(y)):
                    crc = zlib.crc32(array.tobytes(), crc)
            run.add(record)
            if on_step is not None:
                on_step(record)
            if record.phase is not None and first_bad is None:
                first_bad = record.step
                if stop_at_nonfinite:
                    break
        if error is not None:
            raise error
        step += len(done)
    val_loss = session.evaluate(engine) if first_bad is None and run.history.count else None
    return ExperimentResult(
        name=change.name, params=dict(change.params), history=run.history, first_nonfinite_step=first_bad,
        final_loss=run.final_loss, best_loss=run.best_loss, val_loss=val_loss, start_fingerprint=start,
        batches_fingerprint=crc if fingerprint else None, first_nonfinite_phase=run.first_nonfinite_phase,
        first_loss=run.first_loss, first_healthy=run.first_healthy,
    )


class _RunSummary:
    """Folds a run's records into a StepHistory and the few exact values a verdict reads."""

    def __init__(self, layer_dtypes: list[str]) -> None:
        self.layer_dtypes = layer_dtypes
        self.history = StepHistory(0, 0)
        self.final_loss: float | None = None
        self.best_loss: float | None = None
        self.first_loss: float | None = None
        self.first_nonfinite_phase: str | None = None
        self.first_healthy: StepRecord | None = None

    def add(self, record: StepRecord) -> None:
        if not self.history.count:
            self.history = StepHistory(len(record.layers), len(record.variables), len(record.outputs),
                                       series=lambda columns: ScalarColumns(columns, only=RESULT_COLUMNS),
                                       layer_dtypes=self.layer_dtypes)
            self.first_loss = record.loss
        self.history.add(record)
        self.final_loss = record.loss
        if record.phase is None:
            if self.first_healthy is None and not record.update_skipped and math.isfinite(record.grad_global_norm):
                self.first_healthy = record
            if math.isfinite(record.loss) and (self.best_loss is None or record.loss < self.best_loss):
                self.best_loss = record.loss
        elif self.first_nonfinite_phase is None:
            self.first_nonfinite_phase = record.phase


def _state_fingerprint(model: LoadedModel) -> float:
    variables = model.keras_model.variables if model.keras_model is not None else model.variables
    return float(sum(abs(v.numpy().astype("float64")).sum() for v in variables))
