"""Resolve the loss and the optimizer of a run from the spec or a compiled model.

The spec wins; a compiled model's loss and optimizer fill what the spec leaves
out. Names Keras does not know are bad input, reported against the spec field.
"""

from dataclasses import dataclass
from typing import Any, Callable

from nanscope.errors import SpecError
from nanscope.factory import call_factory, load_callable
from nanscope.runtime import tensorflow


@dataclass
class Loss:
    """A resolved loss: `fn(y_true, y_pred) -> scalar`, its name and whether it expects logits."""

    fn: Callable
    name: str
    from_logits: bool = False
    config: Any = None


def resolve_loss(spec, loaded_model):
    """The run's Loss, from `train.loss` or the compiled model."""
    _, keras = tensorflow()
    loss_spec = spec.train.loss
    if loss_spec is None:
        compiled = loaded_model.compiled_loss
        if compiled is None:
            raise SpecError(f"{spec.source}: train.loss: missing, and the model is not compiled with a loss")
        return _wrap(keras.losses.get(compiled) if isinstance(compiled, str) else compiled)
    options = loss_spec.model_extra or {}
    if ":" in loss_spec.name:
        where = f"{spec.source}: train.loss"
        function = load_callable(loss_spec.name, spec.base_dir, where, SpecError)
        loss = call_factory(function, options, where, SpecError) if options else function
        return Loss(loss, loss_spec.name.rpartition(":")[2], bool(options.get("from_logits", False)))
    try:
        loss = keras.losses.get({"class_name": _class_name(keras, loss_spec.name), "config": options})
    except (ValueError, TypeError) as exc:
        raise SpecError(
            f"{spec.source}: train.loss: Keras has no loss {loss_spec.name!r} taking {sorted(options)} ({_first_line(exc)})"
        ) from exc
    return _wrap(loss)


def _class_name(keras, name):
    """The Loss class for a loss name given as a function name (`mse`, `sparse_categorical_crossentropy`)."""
    aliases = {
        "mse": "MeanSquaredError", "mae": "MeanAbsoluteError", "mape": "MeanAbsolutePercentageError",
        "msle": "MeanSquaredLogarithmicError", "kld": "KLDivergence", "kl_divergence": "KLDivergence",
        "logcosh": "LogCosh", "log_cosh": "LogCosh",
    }
    if name.lower() in aliases:
        return aliases[name.lower()]
    camel = "".join(part.capitalize() for part in name.split("_"))
    known = {cls.lower(): cls for cls in dir(keras.losses) if cls[:1].isupper()}
    return known.get(camel.lower(), known.get(name.lower(), name))


def _wrap(loss):
    config = loss.get_config() if hasattr(loss, "get_config") else {}
    name = config.get("name") or getattr(loss, "__name__", type(loss).__name__)
    return Loss(loss, name, bool(config.get("from_logits", False)), config)


def build_optimizer(spec, loaded_model, overrides=None):
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
        config.update(overrides or {})
        return type(compiled).from_config(config)
    kwargs = {**opt_spec.keras_kwargs(), **(overrides or {})}
    try:
        return keras.optimizers.get({"class_name": _optimizer_class(keras, opt_spec.name), "config": kwargs})
    except (ValueError, TypeError) as exc:
        raise SpecError(
            f"{spec.source}: train.optimizer: Keras cannot build optimizer {opt_spec.name!r} with {kwargs}: {_first_line(exc)}"
        ) from exc


def _optimizer_class(keras, name):
    known = {cls.lower(): cls for cls in dir(keras.optimizers) if cls[:1].isupper()}
    return known.get(name.lower().replace("_", ""), name)


def _first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
