"""The one experiment runner: re-run training from the same start with one change.

Fix verification (`trace-steps --verify`) and `compare-clipping` both ask the same
question: with this change, from the same initial weights and the same batch order,
does training stay finite, and how low does the loss get? `run_experiment` answers
it for one change; every run resets the weights first, so runs are comparable.
"""

import math
import zlib
from dataclasses import dataclass, field
from typing import Any

from nanscope import interrupt
from nanscope.data import targets
from nanscope.jsonio import jsonable


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
    params: dict = field(default_factory=dict)
    optimizer_overrides: dict = field(default_factory=dict)
    grad_transform: Any = None
    model: Any = None
    loss_scaling: bool | None = None
    data: Any = None
    rescales_loss: bool = False


@dataclass
class ExperimentResult:
    """What one run with a change did.

    Args:
        name, params: from the Change.
        records: list of StepRecord.
        first_nonfinite_step: int or None.
        final_loss, best_loss: float or None. Training loss at the last step / lowest over finite steps.
        val_loss: float or None. Validation loss after the last step (None when non-finite or no validation part).
        start_fingerprint: float or None. Sum of |w| over the model's state as the run started (fingerprint=True).
        batches_fingerprint: int or None. CRC32 of the bytes of every batch fed, in order (fingerprint=True).
    """

    name: str
    params: dict
    records: list
    first_nonfinite_step: int | None
    final_loss: float | None
    best_loss: float | None
    val_loss: float | None
    start_fingerprint: float | None = None
    batches_fingerprint: int | None = None

    @property
    def finite(self):
        return self.first_nonfinite_step is None

    @property
    def losses(self):
        return [r.loss for r in self.records]

    @property
    def skipped_updates(self):
        """Updates a LossScaleOptimizer skipped on steps that stayed finite: its scaled gradients overflowed
        float16, which dynamic loss scaling absorbs (the step is not a failure, but no weight changed)."""
        return sum(1 for r in self.records if r.update_skipped and r.phase is None)

    @property
    def stalled(self):
        """True when loss scaling skipped so many updates that the run did not train: every one of them, or so
        many after its warm-up that the scale collapsed (`rules.precision.collapsed_window`). Such a run can
        stay finite only because no weight changed."""
        from nanscope.rules.precision import collapsed_window, record_flags

        if not self.records or not any(r.update_skipped for r in self.records):
            return False
        return all(r.update_skipped for r in self.records) or collapsed_window(*record_flags(self.records)) is not None

    def to_json(self):
        return jsonable({
            "name": self.name, "params": self.params, "first_nonfinite_step": self.first_nonfinite_step,
            "final_loss": self.final_loss, "best_loss": self.best_loss, "val_loss": self.val_loss,
            "steps_run": len(self.records), "skipped_updates": self.skipped_updates, "stalled": self.stalled,
            "losses": self.losses,
        })


def run_experiment(session, change, steps=None, stop_at_nonfinite=True, on_step=None, fingerprint=False):
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


def _run(session, change, steps, stop_at_nonfinite, on_step, fingerprint):
    model = change.model or session.model
    session.reset_weights(model)
    start = _state_fingerprint(model) if fingerprint else None
    crc = 0
    engine = session.instrumented_step(change.optimizer_overrides, change.grad_transform, model=model,
                                       loss_scaling=change.loss_scaling)
    records, first_bad = [], None
    runner, step, total = session.chunk_runner(engine), 0, steps or session.spec.train.steps
    while step < total and not (stop_at_nonfinite and first_bad is not None):
        interrupt.check()
        done, error = session.next_records(engine, runner, step, total, first_bad is None)
        for record in done:
            if fingerprint:
                x, y = session.batch(record.step)
                for array in (*targets.parts(x), *targets.parts(y)):
                    crc = zlib.crc32(array.tobytes(), crc)
            records.append(record)
            if on_step is not None:
                on_step(record)
            if record.phase is not None and first_bad is None:
                first_bad = record.step
                if stop_at_nonfinite:
                    break
        if error is not None:
            raise error
        step += len(done)
    finite_losses = [r.loss for r in records if r.phase is None and math.isfinite(r.loss)]
    val_loss = session.evaluate(engine) if first_bad is None and records else None
    return ExperimentResult(
        name=change.name, params=dict(change.params), records=records, first_nonfinite_step=first_bad,
        final_loss=records[-1].loss if records else None, best_loss=min(finite_losses) if finite_losses else None,
        val_loss=val_loss, start_fingerprint=start, batches_fingerprint=crc if fingerprint else None,
    )


def _state_fingerprint(model):
    variables = model.keras_model.variables if model.keras_model is not None else model.variables
    return float(sum(abs(v.numpy().astype("float64")).sum() for v in variables))
