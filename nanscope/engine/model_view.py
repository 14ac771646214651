"""What the compiled step reads of a Keras model: the layers it probes, its variables' names, the loss terms its
layers own, and how the optimizer is handed its gradients.

The trace-steps step (`engine/step.py`), the guest (`keras/`) and the rules read a model through these, so a
layer or a variable has one name everywhere.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nanscope.internals import all_reduce_gradients_hooks, flatten_layers, own_losses
from nanscope.model.learning_rate import inner_optimizer
from nanscope.runtime import tensorflow
from nanscope.tf_types import KerasModel, Optimizer, Tensor


@dataclass
class LayerInfo:
    """A probed layer: its name, its class and the dtype it computes in."""

    name: str
    cls: str
    dtype: str = "float32"


def probed_layers(keras_model: KerasModel) -> list[Any]:
    """The layers of a Keras model to probe, nested ones included, input layers and looped RNN cells left out."""
    if keras_model is None:
        return []
    layers = flatten_layers(keras_model)
    looped = _looped_cells(layers)
    return [layer for layer in layers if type(layer).__name__ != "InputLayer" and id(layer) not in looped]


def _looped_cells(layers: list[Any]) -> set[int]:
    """ids of the cells (and the layers inside them) that an RNN layer steps through in a `tf.while_loop`.

    Their calls inside the loop live in the loop's graph, where a probe cannot reach; the one call the step's
    graph sees is Keras' call on the first time step, made to learn the output's shape and discarded
    (keras/src/backend/tensorflow/rnn.py, `output_time_zero`). Probed, it reported the first time step as the
    cell's (an IRNN's cell at max 0.78 while its layer reached 9e22) and ran only for the probe. The RNN
    layer's own output stands for them. An unrolled RNN calls its cell on every step in the step's graph, and
    keeps it.
    """
    looped: set[int] = set()
    for layer in layers:
        cell = getattr(layer, "cell", None)
        if cell is not None and callable(getattr(cell, "call", None)) and not getattr(layer, "unroll", False):
            looped.add(id(cell))
            looped.update(id(inner) for inner in flatten_layers(cell))
    return looped


def variable_name(variable: Any) -> str:
    """A variable's path-like name ("dense/kernel"), for Keras and plain tf.Variables alike."""
    name = getattr(variable, "path", None) or variable.name
    return name[:-2] if name.endswith(":0") else name


def keras_sum_skipped(optimizer: Optimizer) -> list[tuple[Any, str, Callable[[Any], Any]]]:
    """The `overridden` hooks that hand `optimizer` its gradients on as they are, in place of Keras' own sum of
    the replicas' gradients (a LossScaleOptimizer's: its inner optimizer's), for a step traced for one replica
    or one that hands every replica the sum itself (see engine/step.py's module doc)."""
    return all_reduce_gradients_hooks(inner_optimizer(optimizer), as_handed)


def as_handed(reduce: object) -> type[list[Any]]:
    """In place of the optimizer's all-reduce of the replicas' gradients: the (gradient, variable) pairs as handed."""
    del reduce  # Unused
    return list


def is_loss_scale_optimizer(optimizer: Optimizer) -> bool:
    """True for Keras' LossScaleOptimizer (dynamic loss scaling for float16)."""
    _, keras = tensorflow()
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def layer_loss_terms(layers: Sequence[Any], keras_model: KerasModel) -> list[Tensor]:
    """Per layer, then for the model itself, the sum of the loss terms it owns (add_loss, weight regularizers).

    Call inside the traced step, after the forward pass. Without a Keras model (a
    SavedModel) there are no layers and no terms.
    """
    tf, _ = tensorflow()
    if keras_model is None:
        return []
    rows = []
    for layer in [*layers, keras_model]:
        own = own_losses(layer, regularizers=layer is not keras_model)
        rows.append(tf.add_n([tf.cast(tf.reduce_sum(t), tf.float32) for t in own]) if own else tf.constant(0.0))
    return rows


def relative_variable_names(variables: Sequence[Any], keras_model: KerasModel) -> list[str]:
    """Variable names relative to the model ("dense/kernel", not "sequential/dense/kernel")."""
    names = [variable_name(v) for v in variables]
    prefix = f"{keras_model.name}/" if keras_model is not None else None
    if prefix and names and all(n.startswith(prefix) for n in names):
        return [n[len(prefix):] for n in names]
    return names


def keras_gradients(raw: Sequence[Any], dense: Sequence[Tensor]) -> list[Tensor]:
    """The gradients to hand the optimizer: an Embedding's IndexedSlices as the tape gave them, as Keras' own
    train step hands them (Adam and RMSprop update only the rows a sparse gradient names; a dense one of zeros
    moves the others by their moments), the dense ones (statistics, clipping, unscaling) for the rest."""
    tf, _ = tensorflow()
    return [g if isinstance(g, tf.IndexedSlices) else d for g, d in zip(raw, dense)]


def one_replica() -> bool:
    """True where the step is traced for one replica (no strategy, or one device): the sum of its gradients is
    the gradients themselves."""
    tf, _ = tensorflow()
    context = tf.distribute.get_replica_context()
    return context is None or context.num_replicas_in_sync == 1
