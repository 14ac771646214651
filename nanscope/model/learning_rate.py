"""A run's learning rate as the report describes it: a constant, or a schedule and its value where it matters.

A Keras optimizer takes a float, a `LearningRateSchedule` (ExponentialDecay, CosineDecay
with warm-up, a user's own) or a callable. The run header keeps `optimizer_config.
learning_rate` a number whatever the optimizer was given: under a schedule it is the rate in
effect at `learning_rate_schedule.step` (the first non-finite step, else the last step run),
which is what the rules bound a clip threshold with and lower. `learning_rate_schedule`
holds the schedule itself (`class_name`, `config`, as a spec's `learning_rate` takes it) and
its rate at the run's first step. A lowered rate under a schedule is the same schedule
scaled (`scaled_schedule`), never a constant that would change the run's shape.

Example:
    view = LearningRateView(model.optimizer)    # when the run starts
    run.update(view.header_fields())            # the schedule and its rate at the first step
    settle_learning_rate(report, view)          # the rate in effect at the first non-finite step
"""

import contextlib
import logging
from typing import Any, Protocol

import numpy as np

from nanscope import internals
from nanscope.runtime import tensorflow
from nanscope.tf_types import Optimizer

log = logging.getLogger("nanscope")

__all__ = ["LearningRateView", "lowered_learning_rate_fix", "peak_learning_rate", "scaled_schedule", "schedule_fields",
           "schedule_of",
           "settle_learning_rate"]

# The config keys of Keras' own schedules that are learning rates (scaled by a lower rate); the
# others (decay_steps, alpha, power, ...) are shapes, left as they are.
RATE_KEYS = ("initial_learning_rate", "warmup_target", "end_learning_rate", "values")

# Keras LearningRateSchedules: Keras ships no types, so they are Any to mypy.
Schedule = Any


class _StepOf(Protocol):
    """Where the first non-finite value appeared, as far as the rate needs it (report.model.FirstNonfinite)."""

    @property
    def step(self) -> int: ...


class _Steps(Protocol):
    """The steps of a run, as far as the rate needs them (store.history.StepHistory)."""

    @property
    def count(self) -> int: ...

    def steps(self) -> np.ndarray: ...

    def column(self, name: str) -> np.ndarray: ...


class _Report(Protocol):
    """The report whose rate is settled (report.model.TraceReport; this layer sits below it)."""

    @property
    def run(self) -> dict[str, Any]: ...

    @property
    def history(self) -> _Steps | None: ...

    @property
    def first_nonfinite(self) -> _StepOf | None: ...

    @property
    def notes(self) -> list[str]: ...


def inner_optimizer(optimizer: Optimizer) -> Optimizer:
    """The optimizer that holds the learning rate: the inner one of a LossScaleOptimizer."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def schedule_of(optimizer: Optimizer) -> Schedule | None:
    """The optimizer's LearningRateSchedule, or None for a constant (or callable) learning rate."""
    _, keras = tensorflow()
    if optimizer is None:
        return None
    given = internals.given_learning_rate(inner_optimizer(optimizer))
    return given if isinstance(given, keras.optimizers.schedules.LearningRateSchedule) else None


def schedule_value(schedule: Schedule, iteration: int) -> float:
    """The schedule's learning rate at raw optimizer iteration `iteration`, as a float."""
    _, keras = tensorflow()
    return float(keras.ops.convert_to_numpy(schedule(keras.ops.convert_to_tensor(iteration, dtype="int64"))))


def peak_learning_rate(schedule: Schedule, steps: int) -> float | None:
    """The schedule's largest rate over iterations 0 .. steps - 1 (None when it cannot be evaluated eagerly)."""
    _, keras = tensorflow()
    try:
        with contextlib.suppress(Exception):  # most Keras schedules take every step at once
            values = keras.ops.convert_to_numpy(schedule(keras.ops.arange(steps, dtype="int64")))
            if values.shape == (steps,):
                return float(values.max())
        return max(schedule_value(schedule, step) for step in range(steps))
    except Exception:  # a user's schedule that does not run eagerly
        log.debug("the learning rate schedule could not be evaluated", exc_info=True)
        return None


def describe_schedule(schedule: Schedule) -> dict[str, Any]:
    """{"class_name", "config"} of a schedule, the form a spec's `learning_rate` takes; config None when the
    schedule has no get_config."""
    try:
        config = schedule.get_config()
    except NotImplementedError:
        config = None
    return {"class_name": type(schedule).__name__, "config": config}


def schedule_fields(optimizer: Optimizer, step: int) -> dict[str, Any]:
    """`learning_rate_schedule` of a header whose optimizer is at `step` now (a replayed bundle's): its
    `optimizer_config.learning_rate` is the rate there. Empty for a constant rate."""
    schedule = schedule_of(optimizer)
    return {} if schedule is None else {"learning_rate_schedule": {**describe_schedule(schedule), "step": step}}


class LearningRateView:
    """The learning rate of one run's optimizer, read when the run starts and settled when it ends.

    Args:
        optimizer: a Keras optimizer (a LossScaleOptimizer is looked through), or None.
    """

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = inner_optimizer(optimizer)
        self.schedule = schedule_of(optimizer)
        self.start = internals.raw_iterations(self.optimizer) if self.schedule is not None else 0
        # A constant rate that a callback (ReduceLROnPlateau, a user's own) may assign during the run: read
        # where the run starts and where its first non-finite step is seen.
        self.start_rate = self.current_rate()
        self.marked_rate: float | None = None

    def current_rate(self) -> float | None:
        """The optimizer's constant learning rate now, as a float; None under a schedule or without one."""
        if self.schedule is not None or self.optimizer is None:
            return None
        try:
            _, keras = tensorflow()
            return float(keras.ops.convert_to_numpy(self.optimizer.learning_rate))
        except Exception:  # a callable rate, or none to read: the header's rate stands
            log.debug("the learning rate could not be read", exc_info=True)
            return None

    def mark(self) -> None:
        """Read the constant rate where the first non-finite step is seen (the report's step)."""
        if self.marked_rate is None:
            self.marked_rate = self.current_rate()

    def header_fields(self) -> dict[str, Any]:
        """The run header's `learning_rate_schedule` (empty for a constant rate): the schedule at the first step."""
        if self.schedule is None:
            return {}
        try:
            first = schedule_value(self.schedule, self.start)
        except Exception:  # a user's schedule that cannot be evaluated eagerly: the header says so with None
            log.debug("the learning rate schedule could not be evaluated", exc_info=True)
            first = None
        return {"learning_rate_schedule": {**describe_schedule(self.schedule), "first_step_learning_rate": first,
                                           "step": 0}}

    def settle(self, run: dict[str, Any], step: int, applied: int) -> None:
        """Set `run`'s learning rate to the schedule's value in effect at `step` (nothing for a constant rate).

        Args:
            run: dict. The run header, changed in place.
            step: int. The run's step the rate is wanted at.
            applied: int. Updates the optimizer applied since the run started, before `step` (a loss-scale
                optimizer's skipped updates do not advance the schedule).
        """
        if self.schedule is None:
            self._settle_constant(run, step)
            return
        if "learning_rate_schedule" not in run:
            return
        value = schedule_value(self.schedule, self.start + applied)
        run["learning_rate_schedule"]["step"] = int(step)
        run.setdefault("optimizer_config", {})["learning_rate"] = value


    def _settle_constant(self, run: dict[str, Any], step: int) -> None:
        """A constant rate changed during the run: the header's rate becomes the one at `step`, and says so."""
        now = self.marked_rate if self.marked_rate is not None else self.current_rate()
        if now is None or self.start_rate is None or now == self.start_rate:
            return
        run.setdefault("optimizer_config", {})["learning_rate"] = now
        run["learning_rate_changed"] = {"start": self.start_rate, "at_step": now, "step": int(step)}


def settle_learning_rate(report: _Report, view: LearningRateView | None) -> None:
    """Settle `report.run`'s learning rate at the step the report is about: its first non-finite step, else the
    last step run. A failure leaves the rate of the first step and adds a note (the report still stands)."""
    if view is None or report.history is None or not report.history.count:
        return
    try:
        steps = report.history.steps()
        first = report.first_nonfinite
        step = int(first.step) if first is not None else int(steps[-1])
        before = steps < step
        skipped = int((report.history.column("update_skipped")[before] != 0).sum())
        view.settle(report.run, step, int(before.sum()) - skipped)
    except Exception as exc:  # a user's schedule that cannot be evaluated eagerly
        log.debug("the learning rate schedule could not be evaluated", exc_info=True)
        report.notes.append(f"the learning rate schedule could not be evaluated at the reported step "
                            f"({type(exc).__name__}: {exc}); the report gives its rate at the first step")


def scaled_schedule(schedule: Schedule, factor: float) -> Schedule:
    """`schedule` with every learning rate multiplied by `factor`: a Keras schedule rebuilt from its scaled config,
    a user's schedule wrapped (its shape kept, its rate scaled)."""
    config = scaled_config(describe_schedule(schedule), factor)
    if config is not None and type(schedule).__module__.startswith("keras."):
        return type(schedule).from_config(config)
    return _scaled_class()(schedule, factor)


def scaled_config(description: dict[str, Any], factor: float) -> dict[str, Any] | None:
    """A Keras schedule's config with its learning rates (RATE_KEYS) scaled by `factor`; None when it has none."""
    config = dict(description.get("config") or {})
    keys = [key for key in RATE_KEYS if key in config and config[key] is not None]
    if not keys:
        return None
    for key in keys:
        value = config[key]
        config[key] = [v * factor for v in value] if isinstance(value, (list, tuple)) else value * factor
    return config


def lowered_learning_rate_fix(run: dict[str, Any], factor: int = 10) -> str | None:
    """The spec snippet that lowers the run's learning rate `factor`x: the schedule scaled under a schedule."""
    lr = (run.get("optimizer_config") or {}).get("learning_rate")
    schedule = run.get("learning_rate_schedule")
    if schedule is None:
        return f"train:\n  optimizer: {{learning_rate: {lr / factor:g}}}   # {factor}x lower" if lr else None
    config = scaled_config(schedule, 1 / factor)
    if config is None:
        return (f"# scale the {schedule['class_name']} schedule {factor}x lower (it was at {lr:.3g} at step "
                f"{schedule.get('step')})")
    shown = ", ".join(f"{key}: {_number(value)}" for key, value in config.items() if key != "name")
    return (f"train:\n  optimizer:\n    learning_rate:   # {factor}x lower, the same {schedule['class_name']}\n"
            f"      class_name: {schedule['class_name']}\n      config: {{{shown}}}")


def _number(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_number(v) for v in value) + "]"
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value).lower() if isinstance(value, bool) else str(value)
    return f"{value:g}"


_SCALED: list[type] = []


def _scaled_class() -> type:
    """ScaledSchedule, defined once TensorFlow is loaded (it subclasses Keras' LearningRateSchedule)."""
    if _SCALED:
        return _SCALED[0]
    _, keras = tensorflow()
    # Keras' class, which mypy sees as Any: named by a variable, as a base must be.
    base: Any = keras.optimizers.schedules.LearningRateSchedule

    class ScaledSchedule(base):
        """A user's schedule with its rate multiplied by `factor`: `--verify`'s lowered learning rate."""

        def __init__(self, schedule: Schedule, factor: float) -> None:
            self.schedule, self.factor = schedule, float(factor)

        def __call__(self, step: Any) -> Any:
            return keras.ops.multiply(self.schedule(step), self.factor)

        def get_config(self) -> dict[str, Any]:
            return {"schedule": describe_schedule(self.schedule), "factor": self.factor}

    _SCALED.append(ScaledSchedule)
    return ScaledSchedule
