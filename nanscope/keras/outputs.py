"""Per-output losses of a compiled multi-output model, inside `model.fit`'s train step.

Keras sums the outputs' losses in `CompileLoss` and keeps the parts only in running
means over the epoch. The callback wants each step's own value per output, so after
Keras has computed the step's loss (and built its `CompileLoss`), this module pairs
targets with predictions the way `CompileLoss.call` does and evaluates each output's
loss once more: a few small ops per output, no second forward pass.
"""

from collections.abc import Sequence
from typing import Any

from nanscope.internals import compile_loss, compiled_output_losses, compiled_structures
from nanscope.run.losses import loss_name, unscaled_for_replicas
from nanscope.runtime import tensorflow

from nanscope.tf_types import KerasModel, Tensor


def output_loss_specs(model: KerasModel) -> list[tuple[str, str, float]]:
    """[(output name, loss name, weight)] of a compiled multi-output model; [] for one output or before the first
    step."""
    flat = compiled_output_losses(model)
    if len(flat) < 2:
        return []
    return [(str(entry.name), loss_name(entry.loss), 1.0 if entry.loss_weights is None else float(entry.loss_weights))
            for entry in flat]


def output_terms(model: KerasModel, y: Tensor, y_pred: Tensor, sample_weight: Tensor = None
                 ) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Per output of a compiled multi-output model: (its unweighted mean loss, its targets, its prediction).

    Call inside the traced train step, after `model.compute_loss`. Returns [] for a
    single-output model, or when the targets cannot be paired with the outputs.
    """
    tf, _ = tensorflow()
    flat = compiled_output_losses(model)
    if len(flat) < 2 or y is None or y_pred is None:
        return []
    try:
        y_true, y_pred = _paired(model, y, y_pred)
        terms = []
        for entry in flat:
            target, prediction = _at(entry.path, y_true), _at(entry.path, y_pred)
            weight = sample_weight if sample_weight is None or not tf.nest.is_nested(sample_weight) else _at(
                entry.path, sample_weight)
            value = tf.cast(entry.loss(target, prediction, weight), tf.float32)
            terms.append((unscaled_for_replicas(value, entry.loss), target, prediction))
        return terms
    except (KeyError, IndexError, TypeError, ValueError):
        return []


def _paired(model: KerasModel, y: Tensor, y_pred: Tensor) -> tuple[Tensor, Tensor]:
    """(y_true, y_pred) packed in the structures Keras built its losses on, as `CompileLoss.call` does."""
    tf, _ = tensorflow()
    names = compile_loss(model).output_names or []
    if isinstance(y_pred, (list, tuple)) and isinstance(y, dict) and set(y) == set(names):
        y = [y[name] for name in names]
    true_structure, pred_structure = compiled_structures(model)
    y_true = tf.nest.pack_sequence_as(true_structure, tf.nest.flatten(y))
    y_pred = tf.nest.pack_sequence_as(pred_structure, tf.nest.flatten(y_pred))
    return y_true, y_pred


def _at(path: Sequence[Any], structure: Tensor) -> Tensor:
    for key in path:
        structure = structure[key]
    return structure
