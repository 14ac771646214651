"""The run's loss: one Keras loss, or one per output of a multi-output model.

`resolve_loss` builds it from `train.loss` (and `train.loss_weights`), or from a
compiled model's loss where the spec gives none. Names Keras does not know, and
per-output losses that do not match the model's outputs, are bad input reported
against the spec field. `check_labels_fit` rejects targets the loss cannot take.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from nanscope.errors import DataError, SpecError, did_you_mean, first_line
from nanscope.model.factory import call_factory, load_callable
from nanscope.runtime import tensorflow
from nanscope.tf_types import Tensor

if TYPE_CHECKING:
    from nanscope.model.models import LoadedModel
    from nanscope.spec.sections import RunSpec

# A Keras loss (a Loss object or a function) or the spec's entry for one: Keras ships no types (Any to mypy).
LossFn = Callable[..., Any]


@dataclass
class Loss:
    """A resolved loss: `fn(y_true, y_pred) -> scalar`, its name and whether it expects logits.

    For a multi-output model, `outputs` holds one OutputLoss per model output, in the
    order of the flattened outputs; `fn` then takes the tuple of targets and the model's
    outputs and returns the weighted sum, as `model.compile(loss={...})` does.
    """

    fn: LossFn
    name: str
    from_logits: bool = False
    config: Any = None
    outputs: list[OutputLoss] = field(default_factory=list)

    @property
    def multi_output(self) -> bool:
        """True when this is one loss per output of a multi-output model."""
        return bool(self.outputs)

    def terms(self, y: Any, y_pred: Any) -> list[Tensor]:
        """Per output, the mean loss as a float32 scalar tensor; one term for a single-output model."""
        tf, _ = tensorflow()
        if not self.outputs:
            return [mean_loss(self.fn, y, y_pred)]
        targets, predictions = tf.nest.flatten(y), tf.nest.flatten(y_pred)
        return [mean_loss(o.loss.fn, t, p) for o, t, p in zip(self.outputs, targets, predictions)]

    def total(self, terms: list[Tensor]) -> Tensor:
        """The weighted sum of `terms` (from `terms()`): the data loss that is minimised."""
        tf, _ = tensorflow()
        if not self.outputs:
            return terms[0]
        return tf.add_n([t * o.weight if o.weight != 1.0 else t for o, t in zip(self.outputs, terms)])


@dataclass
class OutputLoss:
    """The loss of one output of a multi-output model: the output's name, its Loss and its weight."""

    name: str
    loss: Loss
    weight: float = 1.0


def mean_loss(fn: LossFn, y: Any, y_pred: Tensor) -> Tensor:
    """mean(fn(y, y_pred)) as float32, the prediction cast to float32 first (mixed precision).

    Keras losses divide by the number of replicas when called under a tf.distribute
    strategy (`scale_loss_for_distribution`); that factor is taken out again, so the
    value is the replica's own mean loss.
    """
    tf, _ = tensorflow()
    y_pred = tf.cast(y_pred, tf.float32) if y_pred.dtype != tf.float32 else y_pred
    value = tf.reduce_mean(tf.cast(fn(y, y_pred), tf.float32))  # loss functions may return per-sample values
    return unscaled_for_replicas(value, fn)


def unscaled_for_replicas(value: Tensor, loss_fn: LossFn) -> Tensor:
    """`value` of `loss_fn` without the 1 / replicas factor a Keras Loss applies under a tf.distribute strategy."""
    tf, _ = tensorflow()
    if divides_by_replicas(loss_fn) and tf.distribute.has_strategy():
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1:
            return value * float(replicas)
    return value


# Keras losses with these reductions divide their value by the number of replicas
# when called under a strategy (keras.src.losses.loss.scale_loss_for_distribution).
_REPLICA_SCALED_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight")


def divides_by_replicas(loss_fn: LossFn) -> bool:
    """True when a loss callable is a Keras Loss that scales its value by 1 / replicas under tf.distribute."""
    _, keras = tensorflow()
    return isinstance(loss_fn, keras.losses.Loss) and getattr(loss_fn, "reduction", None) in _REPLICA_SCALED_REDUCTIONS


def resolve_loss(spec: RunSpec, loaded_model: LoadedModel, output_names: list[str] | None = None) -> Loss:
    """The run's Loss, from `train.loss` or the compiled model.

    Args:
        spec: RunSpec.
        loaded_model: LoadedModel. Its compiled loss fills in a missing `train.loss`.
        output_names: list of str, optional. The model's outputs, flattened; more than
            one makes a multi-output Loss with one term per output.

    Raises:
        SpecError: naming `train.loss` (or `train.loss_weights`) and what does not fit.
    """
    loss_spec: Any = spec.train.loss
    where = f"{spec.source}: train.loss"
    if loss_spec is None:
        compiled = loaded_model.compiled_loss
        if compiled is None:
            raise SpecError(f"{where}: missing, and the model is not compiled with a loss")
        loss_spec, where = compiled, f"{spec.source}: model: the compiled loss"
    names = list(output_names or [])
    entries = _per_output(loss_spec, names, where)
    weights = _loss_weights(spec, loaded_model, names, len(names) > 1)
    if len(names) <= 1:
        return _one_loss(spec, entries[0], where)
    outputs = [OutputLoss(name, _one_loss(spec, entry, f"{where}.{name}"), weight)
               for name, entry, weight in zip(names, entries, weights)]
    return _combined(outputs)


def _per_output(loss_spec: Any, names: list[str], where: str) -> list[Any]:
    """The loss entries in output order: one per name in `names` (one entry when there is at most one output)."""
    count = max(len(names), 1)
    if isinstance(loss_spec, dict):
        unknown = [k for k in loss_spec if k not in names]
        missing = [n for n in names if n not in loss_spec]
        if unknown or missing:
            problems = ([f"no model output named {', '.join(map(repr, unknown))}"] if unknown else []) + (
                [f"no loss for output(s) {', '.join(map(repr, missing))}"] if missing else [])
            raise SpecError(f"{where}: {'; '.join(problems)}; the model's outputs are {names}")
        return [loss_spec[n] for n in names]
    if isinstance(loss_spec, (list, tuple)):
        if len(loss_spec) != count:
            raise SpecError(f"{where}: {len(loss_spec)} losses for the model's {count} output(s)"
                            + (f" {names}" if names else ""))
        return list(loss_spec)
    # One loss for a multi-output model applies to every output, as in Keras.
    return [loss_spec] * count


def _loss_weights(spec: RunSpec, loaded_model: LoadedModel, names: list[str], multi: bool) -> list[float]:
    """One weight per output (1.0 where none is given), from `train.loss_weights` or the compiled model."""
    weights: Any = spec.train.loss_weights
    where = f"{spec.source}: train.loss_weights"
    if weights is None and spec.train.loss is None:
        weights, where = loaded_model.compiled_loss_weights, f"{spec.source}: model: the compiled loss_weights"
    if weights is None:
        return [1.0] * len(names)
    if not multi:
        raise SpecError(f"{where}: the model has one output; loss_weights weighs the losses of a multi-output model")
    if isinstance(weights, dict):
        unknown = [k for k in weights if k not in names]
        if unknown:
            raise SpecError(f"{where}: no model output named {', '.join(map(repr, unknown))}; "
                            f"the model's outputs are {names}")
        return [float(weights.get(n, 1.0)) for n in names]
    if len(weights) != len(names):
        raise SpecError(f"{where}: {len(weights)} weights for the model's {len(names)} outputs {names}")
    return [float(w) for w in weights]


def _combined(outputs: list[OutputLoss]) -> Loss:
    """A multi-output Loss: `fn` sums the weighted per-output mean losses."""
    loss = Loss(fn=lambda y, y_pred: loss.total(loss.terms(y, y_pred)),
                name=", ".join(f"{o.name}: {o.loss.name}" for o in outputs),
                from_logits=any(o.loss.from_logits for o in outputs), outputs=outputs)
    return loss


def _one_loss(spec: RunSpec, loss_spec: Any, where: str) -> Loss:
    """One Loss from a LossSpec, a Keras loss object or name, or a function."""
    _, keras = tensorflow()
    if not hasattr(loss_spec, "model_extra"):  # a compiled model's loss: a name, a Loss object or a function
        return _wrap(keras.losses.get(loss_spec) if isinstance(loss_spec, str) else loss_spec)
    options = loss_spec.model_extra or {}
    if ":" in loss_spec.name:
        function = load_callable(loss_spec.name, spec.base_dir, where, SpecError)
        loss = call_factory(function, options, where, SpecError) if options else function
        return Loss(loss, loss_spec.name.rpartition(":")[2], bool(options.get("from_logits", False)))
    class_name = _class_name(keras, loss_spec.name)
    try:
        loss = keras.losses.get({"class_name": class_name, "config": options})
    except (ValueError, TypeError) as exc:
        if not isinstance(getattr(keras.losses, class_name, None), type):
            raise SpecError(
                f"{where}: Keras has no loss {loss_spec.name!r}"
                + did_you_mean(loss_spec.name.lower(), _loss_names(keras))
                + "; expected a Keras loss name (mse, sparse_categorical_crossentropy, ...) or `file.py:function`"
            ) from exc
        raise SpecError(
            f"{where}: Keras cannot build loss {loss_spec.name!r} with {options}: {first_line(exc)}"
        ) from exc
    return _wrap(loss)


def _loss_names(keras: Any) -> list[str]:
    return [n for n in dir(keras.losses) if n[:1].islower() and n not in ("get", "serialize", "deserialize")] + [
        "mse", "mae", "mape", "msle", "kld", "logcosh"]


def _class_name(keras: Any, name: str) -> str:
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


def _wrap(loss: LossFn) -> Loss:
    config = loss.get_config() if hasattr(loss, "get_config") else {}
    return Loss(loss, loss_name(loss), bool(config.get("from_logits", False)), config)


def loss_name(loss: LossFn) -> str:
    """The name of a Keras Loss object (its config's `name`) or of a loss function."""
    config: dict[str, Any] = loss.get_config() if hasattr(loss, "get_config") else {}
    return str(config.get("name") or getattr(loss, "__name__", type(loss).__name__))


def check_labels_fit(spec: RunSpec, loss: Loss, output: Any, y: Any) -> None:
    """Reject targets that cannot fit the loss and the model's output width, before any step runs.

    A sparse categorical cross-entropy needs integer labels in [0, outputs); a label
    outside that range makes TensorFlow raise on CPU and return NaN on GPU. A
    categorical one needs one target column per output. A multi-output model's
    outputs are checked one by one against their own loss.

    Args:
        spec: RunSpec. For the file name in the message.
        loss: Loss. Its name decides the check; losses nanscope does not know are not checked.
        output: the model's output on a sample batch (a tensor with the output width last, or
            a structure of them for a multi-output model).
        y: np.ndarray, or a tuple of them for a multi-output model. All targets, rows numbered as in the dataset.

    Raises:
        DataError: naming `data`, the output, the offending label value and its row.
    """
    tf, _ = tensorflow()
    if not loss.multi_output:
        _check_output_labels(f"{spec.source}: data", loss, output, y)
        return
    for part, prediction, targets in zip(loss.outputs, tf.nest.flatten(output), y):
        _check_output_labels(f"{spec.source}: data (output {part.name!r})", part.loss, prediction, targets)


def _check_output_labels(where: str, loss: Loss, output: Any, y: Any) -> None:
    import numpy as np

    from nanscope.checkdata.labels import label_kind

    shape = getattr(output, "shape", None)
    if shape is None or len(shape) < 2 or shape[-1] is None:
        return
    width, kind = int(shape[-1]), label_kind(loss.name)
    if kind == "sparse":
        labels = np.asarray(y).reshape(len(y), -1)
        if not (np.issubdtype(labels.dtype, np.number) or labels.dtype == bool):
            raise DataError(f"{where}: {loss.name} expects integer class labels. Received dtype {labels.dtype}")
        bad = np.isfinite(labels) & ((labels < 0) | (labels >= width)) if labels.dtype.kind == "f" else (
            (labels < 0) | (labels >= width))
        rows = np.flatnonzero(bad.any(axis=1))
        if len(rows):
            value = labels[rows[0]][bad[rows[0]]][0].item()
            value = int(value) if float(value).is_integer() else value
            raise DataError(
                f"{where}: label {value} in row {int(rows[0])} is outside [0, {width}): "
                f"{loss.name} expects class indices below the model's {width} outputs ({len(rows)} row(s) affected)"
            )
    elif kind == "onehot" and np.ndim(y) >= 2 and np.shape(y)[-1] != width:
        raise DataError(
            f"{where}: the targets have {np.shape(y)[-1]} columns but the model has {width} outputs; "
            f"{loss.name} expects one target column per output"
        )
