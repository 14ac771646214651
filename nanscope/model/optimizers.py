"""Resolve the optimizer of a run from the spec or a compiled model.

The spec wins; a compiled model's optimizer fills what the spec leaves out. Names
Keras does not know are bad input, reported against the spec field. The loss is
resolved in `nanscope.run.losses`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope.errors import SpecError, did_you_mean, first_line
from nanscope.model.factory import load_callable
from nanscope.model.learning_rate import inner_optimizer, schedule_of
from nanscope.runtime import tensorflow

if TYPE_CHECKING:
    from nanscope.model.models import LoadedModel
    from nanscope.spec.sections import RunSpec, ScheduleSpec

__all__ = ["build_optimizer", "build_schedule", "optimizer_settings", "set_overrides"]


def build_optimizer(spec: RunSpec, loaded_model: LoadedModel, overrides: dict[str, Any] | None = None) -> Any:
    """A fresh Keras optimizer from `train.optimizer` (or the compiled model's config), with `overrides` applied.

    A fresh instance each call, so several runs never share optimizer state.
    """
    _, keras = tensorflow()
    opt_spec = spec.train.optimizer
    if opt_spec is None:
        compiled = loaded_model.compiled_optimizer
        if compiled is None:
            raise SpecError(f"{spec.source}: train.optimizer: missing, and the model is not compiled with an optimizer")
        config = compiled.get_config()
        schedule = schedule_of(compiled)
        if schedule is not None:  # the object itself: a user's schedule need not be registered with Keras
            config["learning_rate"] = schedule
        config.update(overrides or {})
        return type(compiled).from_config(config)
    kwargs = opt_spec.keras_kwargs()
    if opt_spec.learning_rate is not None and not isinstance(opt_spec.learning_rate, float):
        kwargs["learning_rate"] = build_schedule(spec, opt_spec.learning_rate)
    kwargs.update(overrides or {})
    class_name = _optimizer_class(keras, opt_spec.name)
    try:
        return keras.optimizers.get({"class_name": class_name, "config": kwargs})
    except (ValueError, TypeError) as exc:
        if not isinstance(getattr(keras.optimizers, class_name, None), type):
            raise SpecError(
                f"{spec.source}: train.optimizer.name: Keras has no optimizer {opt_spec.name!r}"
                + did_you_mean(opt_spec.name.lower(),
                               sorted(n.lower() for n in dir(keras.optimizers) if n[:1].isupper()))
                + "; expected a Keras optimizer name (sgd, adam, rmsprop, ...)"
            ) from exc
        raise SpecError(
            f"{spec.source}: train.optimizer: Keras cannot build optimizer {opt_spec.name!r} with {kwargs}: "
            f"{first_line(exc)}"
        ) from exc


def build_schedule(spec: RunSpec, schedule: ScheduleSpec) -> Any:
    """The LearningRateSchedule a ScheduleSpec names: a Keras schedule, or a user's class from `file.py:Class`."""
    _, keras = tensorflow()
    field = f"{spec.source}: train.optimizer.learning_rate"
    if ":" in schedule.class_name:
        cls: Callable[..., Any] = load_callable(schedule.class_name, spec.base_dir, f"{field}.class_name", SpecError)
    else:
        known = {n: getattr(keras.optimizers.schedules, n) for n in dir(keras.optimizers.schedules)
                 if isinstance(getattr(keras.optimizers.schedules, n), type)
                 and issubclass(getattr(keras.optimizers.schedules, n), keras.optimizers.schedules.LearningRateSchedule)
                 and n != "LearningRateSchedule"}
        found = known.get(schedule.class_name)
        if found is None:
            raise SpecError(f"{field}.class_name: Keras has no learning-rate schedule {schedule.class_name!r}"
                            + did_you_mean(schedule.class_name, sorted(known))
                            + "; expected a Keras schedule (ExponentialDecay, CosineDecay, ...) or file.py:Class")
        cls = found
    try:
        built = cls(**schedule.config)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{field}.config: {schedule.class_name} cannot be built with {schedule.config}: "
                        f"{first_line(exc)}") from exc
    if not isinstance(built, keras.optimizers.schedules.LearningRateSchedule):
        raise SpecError(f"{field}.class_name: {schedule.class_name} is not a keras LearningRateSchedule. "
                        f"Received: a {type(built).__name__}")
    return built


SHOWN_OPTIMIZER_SETTINGS = ("learning_rate", "momentum", "beta_1", "beta_2", "epsilon", "clipnorm", "global_clipnorm",
                            "clipvalue")


def optimizer_settings(optimizer: Any) -> tuple[str | None, dict[str, Any]]:
    """(class name, the settings a report shows) of an optimizer, looking through a LossScaleOptimizer.

    `learning_rate` is always a number: under a LearningRateSchedule (or a callable) the rate at the optimizer's
    current step, which `nanscope.model.learning_rate` settles later at the step the report is about.
    """
    if optimizer is None:
        return None, {}
    inner = inner_optimizer(optimizer)
    config = inner.get_config()
    shown = {k: config[k] for k in SHOWN_OPTIMIZER_SETTINGS if config.get(k) is not None}
    if isinstance(shown.get("learning_rate"), (dict, str)):  # a serialised schedule or callable
        shown["learning_rate"] = _current_learning_rate(inner)
    return type(inner).__name__, {k: float(v) if isinstance(v, (int, float)) else v for k, v in shown.items()}


def _current_learning_rate(optimizer: Any) -> float | None:
    """The optimizer's learning rate now as a float; None when it cannot be evaluated eagerly."""
    try:
        return float(optimizer.learning_rate)
    except Exception:  # a user's schedule or callable that does not run eagerly
        return None


def _optimizer_class(keras: Any, name: str) -> str:
    known = {cls.lower(): cls for cls in dir(keras.optimizers) if cls[:1].isupper()}
    return known.get(name.lower().replace("_", ""), name)


def set_overrides(optimizer: Any, overrides: dict[str, Any],
                  retrace: Callable[[], object] | None = None) -> Callable[[], None]:
    """Set `overrides` on `optimizer` (the inner one under loss scaling), calling `retrace()` where the step's graph
    reads them (every setting but a float learning rate); return the callable that puts the settings back.

    The learning rate is put back as the number it was: Keras keeps it in a variable that its setter assigns in
    place, so keeping the variable itself would put back the new rate.
    """
    optimizer = inner_optimizer(optimizer)
    before = {key: _read(optimizer, key) for key in overrides}
    _set(optimizer, overrides, retrace)
    return lambda: _set(optimizer, before, retrace)


def _read(optimizer: Any, key: str) -> Any:
    value = getattr(optimizer, key, None)
    return float(np.asarray(value)) if key == "learning_rate" else value


def _set(optimizer: Any, values: dict[str, Any], retrace: Callable[[], object] | None) -> None:
    for key, value in values.items():
        setattr(optimizer, key, value)
    if retrace is not None and set(values) - {"learning_rate"}:
        retrace()
