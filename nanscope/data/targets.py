"""Targets of one output or of several: one array, or a tuple of arrays in model output order.

A single-output model's targets are one numpy array. A multi-output model's are one
array per output: sources load them as a mapping from output name (or a list in
output order), and `arrange` puts them in the order of the model's flattened
outputs once the model is known. Everything after that sees either an array or a
tuple of arrays with the same number of rows, and goes through these functions to
take rows or count bytes.
"""

from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import numpy as np

from nanscope.errors import DataError

T = TypeVar("T")
# One value, or one per member (per model output, or per model input): a tuple or list in order, a mapping by
# name. The functions below take any leaves (arrays, paths, dtypes).
Members: TypeAlias = T | tuple[T, ...] | list[T] | dict[str, T]
# Members that are arrays: numpy arrays, or TF tensors from a factory (Any to mypy, so those fit too).
Arrays: TypeAlias = Members[np.ndarray]
# Rows to take: an index array or a slice.
Rows: TypeAlias = np.ndarray | slice


def parts(y: Members[T]) -> list[T]:
    """The target arrays: [y] for one array, the members of a tuple, list or mapping otherwise."""
    if isinstance(y, dict):
        return list(y.values())
    if isinstance(y, (tuple, list)):
        return list(y)
    return [y]


def named(value: Members[T], label: str = "y") -> list[tuple[str, T]]:
    """[(name, array)]: (label, value) for one array; ("y['price']", ...) or ("y[0]", ...) per member otherwise."""
    if isinstance(value, dict):
        return [(f"{label}[{k!r}]", v) for k, v in value.items()]
    if isinstance(value, (tuple, list)):
        return [(f"{label}[{i}]", v) for i, v in enumerate(value)]
    return [(label, value)]


def one_per_member(value: object, rows: int | None) -> bool:
    """True when a factory's `value` holds one array per member (per model output, or per model input): a
    mapping, or a list or tuple of arrays that each have `rows` rows.

    A list of per-row values (`[0, 1, 1, ...]` or one small array per row) is one array.
    """
    if isinstance(value, dict):
        return True
    return (isinstance(value, (tuple, list)) and len(value) > 0 and rows is not None and len(value) != rows
            and all(np.ndim(part) >= 1 and len(part) == rows for part in value))


def is_multi(y: object) -> bool:
    """True for the targets of a multi-output model (a tuple, list or mapping of arrays)."""
    return isinstance(y, (tuple, list, dict))


def take(y: Arrays, rows: Rows) -> Arrays:
    """The rows `rows` (an index array or a slice) of every target array, in the same structure."""
    if isinstance(y, dict):
        return {k: v[rows] for k, v in y.items()}
    if isinstance(y, (tuple, list)):
        return tuple(v[rows] for v in y)
    return y[rows]


def nbytes(y: Arrays) -> int:
    """Bytes held by all the target arrays."""
    return sum(part.nbytes for part in parts(y))


def convert(y: Members[T], fn: Callable[[T], Any]) -> Members[Any]:
    """`fn` applied to every target array, keeping the structure."""
    if isinstance(y, dict):
        return {k: fn(v) for k, v in y.items()}
    if isinstance(y, (tuple, list)):
        return tuple(fn(v) for v in y)
    return fn(y)


def arrange(y: Arrays, names: list[str], where: str) -> Arrays:
    """Targets in the order of the model's outputs `names`: one array for one output, else a tuple.

    Args:
        y: np.ndarray, tuple/list of arrays, or dict from output name to array.
        names: list of str. The model's flattened output names.
        where: str. The spec file and field, for messages.

    Raises:
        DataError: when the targets do not match the model's outputs.
    """
    count = max(len(names), 1)
    if isinstance(y, dict):
        unknown, missing = [k for k in y if k not in names], [n for n in names if n not in y]
        if unknown or missing:
            raise DataError(f"{where}: the targets are named {list(y)} but the model's outputs are {names}"
                            + (f"; no targets for {missing}" if missing else ""))
        y = [y[n] for n in names]
    if isinstance(y, (tuple, list)):
        if len(y) != count:
            raise DataError(f"{where}: {len(y)} target arrays for the model's {count} output(s) {names}")
        return y[0] if count == 1 else tuple(y)
    if count > 1:
        raise DataError(
            f"{where}: the model has {count} outputs {names} but the data gives one target array; give one per "
            "output: `y` (npz, npy) or `target` (csv, TFRecord) as a mapping from output name, or a factory "
            "returning (x, {output name: targets})")
    return y


def as_float32(array: np.ndarray) -> np.ndarray:
    """float64 targets become float32 (the model's dtype); other dtypes are kept."""
    return array.astype(np.float32) if array.dtype == np.float64 else array
