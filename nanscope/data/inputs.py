"""Inputs of a model with one input or several: one array, or one array per model input.

A single-input model's `x` is one numpy array. A model with several inputs takes a
mapping from input name to array (as `model.fit` does) or a tuple of arrays in the
order of the model's inputs. Everything that takes rows, counts bytes or walks the
arrays goes through these functions (which share `targets`' structure handling).
"""

from typing import Any

from nanscope.data import targets
from nanscope.data.targets import Arrays
from nanscope.internals import flatten_layers, inbound_tensors, inputs_struct

parts = targets.parts
take = targets.take
nbytes = targets.nbytes
convert = targets.convert
is_multi = targets.is_multi


def rows(x: Arrays) -> int:
    """Rows of the inputs (every input array has the same number)."""
    return len(parts(x)[0])


def named(x: Arrays) -> list[tuple[str, Any]]:
    """[(label, array)]: ("x", x) for one array; ("x['tokens']", ...) or ("x[0]", ...) per input otherwise."""
    return targets.named(x, "x")


def row_shapes(x: Arrays) -> list[Any] | dict[str, list[int]]:
    """The shape of one row of each input: a list for one array, a mapping or a list of lists otherwise."""
    if isinstance(x, dict):
        return {k: list(v.shape[1:]) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return [list(v.shape[1:]) for v in x]
    return list(x.shape[1:])


def several(x: object, y_rows: int | None = None) -> bool:
    """True when a factory's `x` holds one array per model input: a list or tuple of tensors, or what
    `targets.one_per_member` takes for one array per member, with the targets' `y_rows` rows."""
    if isinstance(x, (tuple, list)) and x and all(
            hasattr(p, "shape") and hasattr(p, "dtype") and not hasattr(p, "__array_interface__") for p in x):
        return True  # tensors or TensorSpecs, one per input
    return targets.one_per_member(x, y_rows)


# Layers whose input is an index into a table, not a measurement: their input has no scale to normalise.
ID_LAYERS = ("Embedding", "IntegerLookup", "StringLookup", "CategoryEncoding", "Hashing", "Discretization")


def id_inputs(named_dtypes: list[tuple[str, Any]], keras_model: Any = None) -> set[str]:
    """The labels of the inputs that hold ids (token ids, category ids) rather than measurements.

    An input holds ids when its dtype is an integer (or bool) type, or when the model feeds
    it straight into an `Embedding` or a lookup layer (float token ids). Ids have no scale:
    standardising them is wrong, so the scale rules and `--verify` leave them alone. This is
    the one place that decides it, for trace-steps, check-data and the `NanScope` callback.

    Args:
        named_dtypes: list of (label, dtype). Labels as `named` gives them ("x", "x['tokens']",
            "x[1]"); dtypes as numpy dtypes, `tf.DType`s or strings (the dtype as the user gave it).
        keras_model: keras.Model, default None. The model, to find inputs that feed an `Embedding`.

    Returns:
        set of str.

    Example:
        id_inputs([("x['tokens']", "int32"), ("x['price']", "float32")])   # {"x['tokens']"}
    """
    found = {label for label, dtype in named_dtypes if _integer(dtype)}
    labels = [label for label, _ in named_dtypes]
    for index, name in _inputs_feeding_id_layers(keras_model):
        by_name = f"x[{name!r}]"
        if by_name in labels:
            found.add(by_name)
        elif index < len(labels) and not labels[index].startswith("x['"):
            found.add(labels[index])
    return found


def _integer(dtype: Any) -> bool:
    import numpy as np

    dtype = getattr(dtype, "as_numpy_dtype", dtype)
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return False
    return bool(np.issubdtype(dtype, np.integer) or dtype == np.bool_)


def _inputs_feeding_id_layers(keras_model: Any) -> set[tuple[int, Any]]:
    """(position, name) of each model input that an id layer reads directly; position in `model.inputs`,
    name its key in a mapping of inputs (or the Input's name)."""
    try:
        model_inputs = list(getattr(keras_model, "inputs", None) or [])
    except (AttributeError, ValueError):  # a subclassed or unbuilt model has no input graph
        return set()
    if not model_inputs:
        return set()
    struct = inputs_struct(keras_model)
    keys = {id(t): k for k, t in struct.items()} if isinstance(struct, dict) else {}
    positions = {id(tensor): index for index, tensor in enumerate(model_inputs)}
    fed: set[tuple[int, Any]] = set()
    for layer in flatten_layers(keras_model):
        if type(layer).__name__ not in ID_LAYERS:
            continue
        for tensor in inbound_tensors(layer):
            if id(tensor) in positions:
                fed.add((positions[id(tensor)], keys.get(id(tensor), getattr(tensor, "name", None))))
    return fed


def ids_of(data: Any, keras_model: Any = None) -> set[str]:
    """`id_inputs` of a LoadedData: its inputs' dtypes as the source gave them, and the model."""
    dtypes = getattr(data, "input_dtypes", None) or {}
    return id_inputs([(label, dtypes.get(label, part.dtype)) for label, part in named(data.x)], keras_model)
