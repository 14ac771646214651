"""Inputs of a model with one input or several: one array, or one array per model input.

A single-input model's `x` is one numpy array. A model with several inputs takes a
mapping from input name to array (as `model.fit` does) or a tuple of arrays in the
order of the model's inputs. Everything that takes rows, counts bytes or walks the
arrays goes through these functions (which share `targets`' structure handling).
"""

from nanscope.data import targets

parts = targets.parts
take = targets.take
nbytes = targets.nbytes
convert = targets.convert
is_multi = targets.is_multi


def rows(x):
    """Rows of the inputs (every input array has the same number)."""
    return len(parts(x)[0])


def named(x):
    """[(label, array)]: ("x", x) for one array; ("x['tokens']", ...) or ("x[0]", ...) per input otherwise."""
    return targets.named(x, "x")


def row_shapes(x):
    """The shape of one row of each input: a list for one array, a mapping or a list of lists otherwise."""
    if isinstance(x, dict):
        return {k: list(v.shape[1:]) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return [list(v.shape[1:]) for v in x]
    return list(x.shape[1:])


def several(x, y_rows=None):
    """True when a factory's `x` holds one array per model input: a list or tuple of tensors, or what
    `targets.one_per_member` takes for one array per member, with the targets' `y_rows` rows."""
    if isinstance(x, (tuple, list)) and x and all(
            hasattr(p, "shape") and hasattr(p, "dtype") and not hasattr(p, "__array_interface__") for p in x):
        return True  # tensors or TensorSpecs, one per input
    return targets.one_per_member(x, y_rows)
