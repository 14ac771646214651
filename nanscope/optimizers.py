"""Resolve the optimizer of a run from the spec or a compiled model.

The spec wins; a compiled model's optimizer fills what the spec leaves out. Names
Keras does not know are bad input, reported against the spec field. The loss is
resolved in `nanscope.losses`.
"""

from nanscope.errors import SpecError, did_you_mean, first_line
from nanscope.runtime import tensorflow

__all__ = ["build_optimizer", "optimizer_settings"]


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


SHOWN_OPTIMIZER_SETTINGS = ("learning_rate", "momentum", "beta_1", "beta_2", "epsilon", "clipnorm", "global_clipnorm",
                            "clipvalue")


def optimizer_settings(optimizer):
    """(class name, the settings a report shows) of an optimizer, looking through a LossScaleOptimizer."""
    if optimizer is None:
        return None, {}
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    config = inner.get_config()
    shown = {k: config[k] for k in SHOWN_OPTIMIZER_SETTINGS if config.get(k) is not None}
    return type(inner).__name__, {k: float(v) if isinstance(v, (int, float)) else v for k, v in shown.items()}


def _optimizer_class(keras, name):
    known = {cls.lower(): cls for cls in dir(keras.optimizers) if cls[:1].isupper()}
    return known.get(name.lower().replace("_", ""), name)
