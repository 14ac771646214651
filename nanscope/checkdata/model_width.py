"""The number of classes of each output, read from the spec's model when the spec does not state it.

A sparse categorical cross-entropy needs labels in [0, classes), and `classes` is the
width of the output the loss is applied to. When neither the command line nor the
spec says how many classes there are, check-data builds the spec's model (without
any data) and reads the last axis of each output. A model whose outputs are not known
before it is called (a subclassed model, a Sequential without an `Input`), a SavedModel,
or a model that fails to load gives nothing: the label check then runs without a
class count, and trace-steps reports the model's own problems.
"""

from typing import TYPE_CHECKING

from nanscope.errors import NanscopeError

if TYPE_CHECKING:
    from nanscope.spec.sections import RunSpec


def output_widths(spec: "RunSpec") -> dict[str | None, int | None]:
    """{output name: width of its last axis}; a single-output model's entry is under None. {} when unknown.

    Args:
        spec: RunSpec. Its `model` section is loaded (a factory is called, a file read).
    """
    from nanscope.model.models import load_model

    try:
        keras_model = load_model(spec).keras_model
        tensors = list(keras_model.outputs) if keras_model is not None else []
    except (NanscopeError, AttributeError, ValueError):
        return {}
    widths = [int(t.shape[-1]) if len(t.shape) >= 2 and t.shape[-1] is not None else None for t in tensors]
    if len(widths) == 1:
        return {None: widths[0]}
    names = list(getattr(keras_model, "output_names", None) or [])
    return dict(zip(names, widths)) if len(names) == len(widths) else {}
