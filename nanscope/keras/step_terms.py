"""A step's layer loss terms and non-finite counts, as float32 scalars in the step's graph."""

from collections.abc import Iterable, Sequence

from nanscope.engine.model_view import layer_loss_terms
from nanscope.engine.variable_stats import any_nonfinite_count
from nanscope.runtime import tensorflow
from nanscope.tf_types import KerasModel, Layer, Tensor

tf, keras = tensorflow()


def loss_terms(layers: Sequence[Layer], keras_models: Sequence[KerasModel]) -> list[Tensor]:
    """Per probed layer the loss terms it owns, then the models' own terms summed (`layer_loss_terms`)."""
    if not keras_models:
        return [tf.constant(0.0)] * (len(layers) + 1)
    terms = layer_loss_terms(layers, keras_models[0])
    for other in keras_models[1:]:
        terms[-1] = terms[-1] + layer_loss_terms([], other)[-1]
    return terms


def count_nonfinite(tensors: Iterable[Tensor | None]) -> Tensor:
    """Non-finite entries over a list of tensors, as one float32 scalar."""
    counts = [any_nonfinite_count(t) for t in tensors if t is not None]
    return tf.add_n(counts) if counts else tf.constant(0.0)
