"""Resolve the loss and the optimizer of a run from the spec or a compiled model.

The spec wins; a compiled model's loss and optimizer fill what the spec leaves
out. Names Keras does not know are bad input, reported against the spec field.
"""

from dataclasses import dataclass
from typing import Any, Callable

from nanscope.errors import DataError, SpecError, first_line
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
    class_name = _class_name(keras, loss_spec.name)
    try:
        loss = keras.losses.get({"class_name": class_name, "config": options})
    except (ValueError, TypeError) as exc:
        if not isinstance(getattr(keras.losses, class_name, None), type):
            raise SpecError(
                f"{spec.source}: train.loss: Keras has no loss {loss_spec.name!r}"
                + _did_you_mean(loss_spec.name, _loss_names(keras))
                + "; expected a Keras loss name (mse, sparse_categorical_crossentropy, ...) or `file.py:function`"
            ) from exc
        raise SpecError(
            f"{spec.source}: train.loss: Keras cannot build loss {loss_spec.name!r} with {options}: {first_line(exc)}"
        ) from exc
    return _wrap(loss)


def _loss_names(keras):
    return [n for n in dir(keras.losses) if n[:1].islower() and n not in ("get", "serialize", "deserialize")] + [
        "mse", "mae", "mape", "msle", "kld", "logcosh"]


def _did_you_mean(name, candidates):
    """"; did you mean `x`?" for the closest known name, or ""."""
    import difflib

    matches = difflib.get_close_matches(name.lower(), candidates, n=1, cutoff=0.6)
    return f"; did you mean `{matches[0]}`?" if matches else ""


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
    class_name = _optimizer_class(keras, opt_spec.name)
    try:
        return keras.optimizers.get({"class_name": class_name, "config": kwargs})
    except (ValueError, TypeError) as exc:
        if not isinstance(getattr(keras.optimizers, class_name, None), type):
            raise SpecError(
                f"{spec.source}: train.optimizer.name: Keras has no optimizer {opt_spec.name!r}"
                + _did_you_mean(opt_spec.name, sorted(n.lower() for n in dir(keras.optimizers) if n[:1].isupper()))
                + "; expected a Keras optimizer name (sgd, adam, rmsprop, ...)"
            ) from exc
        raise SpecError(
            f"{spec.source}: train.optimizer: Keras cannot build optimizer {opt_spec.name!r} with {kwargs}: {first_line(exc)}"
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


def check_labels_fit(spec, loss, output, y):
    """Reject targets that cannot fit the loss and the model's output width, before any step runs.

    A sparse categorical cross-entropy needs integer labels in [0, outputs); a label
    outside that range makes TensorFlow raise on CPU and return NaN on GPU. A
    categorical one needs one target column per output.

    Args:
        spec: RunSpec. For the file name in the message.
        loss: Loss. Its name decides the check; losses nanscope does not know are not checked.
        output: the model's output on a sample batch (a tensor with the output width last).
        y: np.ndarray. All targets, rows numbered as in the dataset.

    Raises:
        DataError: naming `data`, the offending label value and its row.
    """
    import numpy as np

    from nanscope.checkdata.labels import label_kind

    shape = getattr(output, "shape", None)
    if shape is None or len(shape) < 2 or shape[-1] is None:
        return
    width, kind = int(shape[-1]), label_kind(loss.name)
    if kind == "sparse":
        labels = np.asarray(y).reshape(len(y), -1)
        if not (np.issubdtype(labels.dtype, np.number) or labels.dtype == bool):
            raise DataError(f"{spec.source}: data: {loss.name} expects integer class labels. Received dtype {labels.dtype}")
        bad = np.isfinite(labels) & ((labels < 0) | (labels >= width)) if labels.dtype.kind == "f" else (
            (labels < 0) | (labels >= width))
        rows = np.flatnonzero(bad.any(axis=1))
        if len(rows):
            value = labels[rows[0]][bad[rows[0]]][0].item()
            value = int(value) if float(value).is_integer() else value
            raise DataError(
                f"{spec.source}: data: label {value} in row {int(rows[0])} is outside [0, {width}): "
                f"{loss.name} expects class indices below the model's {width} outputs ({len(rows)} row(s) affected)"
            )
    elif kind == "onehot" and np.ndim(y) >= 2 and np.shape(y)[-1] != width:
        raise DataError(
            f"{spec.source}: data: the targets have {np.shape(y)[-1]} columns but the model has {width} outputs; "
            f"{loss.name} expects one target column per output"
        )
