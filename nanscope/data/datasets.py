"""A data factory's tf.data.Dataset as arrays: finite ones whole, endless ones as far as the run needs.

A dataset ending in `.repeat()` never ends. Reading it whole would hang while its
memory grows, so a run takes the rows its steps need (steps x batch size). A held-out
validation part needs the dataset's end, so an endless dataset with
`data.validation.fraction` set is bad input, said in one line. A dataset whose length
TensorFlow cannot tell (after `filter` or `unbatch`) is read to its end, up to
UNKNOWN_LENGTH_ROWS rows; past that it is treated as endless.
"""

from typing import Any, NamedTuple

import numpy as np

from nanscope.data import inputs, targets
from nanscope.data.targets import Arrays
from nanscope.errors import DataError
from nanscope.runtime import tensorflow

UNKNOWN_LENGTH_ROWS = 1_000_000
READ_ROWS = 4096  # rows per read: one Python round trip per chunk, not per row


class DatasetRows(NamedTuple):
    """The rows read from a dataset: x and y arrays (or one per input / output), and whether it is endless."""

    x: Arrays
    y: Arrays
    endless: bool


# A tf.data.Dataset: TensorFlow ships no types (Any to mypy).
Dataset = Any


def materialize(dataset: Dataset, steps: int, batch_size: int, validation_fraction: float, where: str) -> DatasetRows:
    """The (x, y) rows of a dataset of (x, y) elements that a run of `steps` batches of `batch_size` needs.

    Args:
        dataset: tf.data.Dataset. Batched or not; a batched one is unbatched first.
        steps, batch_size: int. The run's steps and rows per step.
        validation_fraction: float. The spec's data.validation.fraction (needs a finite dataset).
        where: str. "<spec file>: data.factory", for error messages.

    Returns:
        DatasetRows.

    Raises:
        DataError: elements that are not (x, y), an empty dataset, or an endless one with validation.
    """
    tf, _ = tensorflow()
    element = dataset.element_spec
    if not (isinstance(element, tuple) and len(element) == 2):
        raise DataError(f"{where}: the dataset must yield (x, y) pairs. Received elements of {element}")
    first = targets.parts(element[0])[0]
    if first.shape.rank and first.shape[0] is None:
        dataset = dataset.unbatch()
    needed = steps * batch_size
    length = int(dataset.cardinality())
    if length == tf.data.INFINITE_CARDINALITY:
        _no_validation(validation_fraction, where)
        rows, endless = _read(dataset.take(needed)), True
    elif length == tf.data.UNKNOWN_CARDINALITY:
        limit = max(needed, UNKNOWN_LENGTH_ROWS)
        rows = _read(dataset.take(limit + 1))
        # The rows read, not len(x): a mapping or tuple of inputs has as many members as inputs.
        endless = rows is not None and inputs.rows(rows[0]) > limit
        if rows is not None and endless:
            _no_validation(validation_fraction, where, known=False)
            rows = [_head(part, needed) for part in rows]
    else:
        rows, endless = _read(dataset), False
    if rows is None:
        raise DataError(f"{where}: the dataset is empty")
    return DatasetRows(rows[0], rows[1], endless)


def _no_validation(fraction: float, where: str, known: bool = True) -> None:
    if fraction > 0:
        what = "endless (.repeat())" if known else f"longer than {UNKNOWN_LENGTH_ROWS:,} rows without a known end"
        raise DataError(f"{where}: the dataset is {what}, and data.validation.fraction: {fraction} needs its end; "
                        "set data.validation.fraction: 0 or give a finite dataset (drop .repeat())")


def _read(dataset: Dataset) -> list[Arrays] | None:
    """All elements of an unbatched dataset as [x, y] stacked along rows; None when it has none."""
    chunks = list(dataset.batch(READ_ROWS).as_numpy_iterator())
    if not chunks:
        return None
    return [_joined([chunk[i] for chunk in chunks]) for i in (0, 1)]


def _joined(parts: list[Any]) -> Arrays:
    """Chunks of rows joined: one array, or one per key (or position) of a mapping or tuple."""
    if isinstance(parts[0], (dict, tuple, list)):  # one per model input, or per output of a multi-output model
        keys = list(parts[0]) if isinstance(parts[0], dict) else range(len(parts[0]))
        joined: dict[Any, np.ndarray] = {k: np.concatenate([p[k] for p in parts]) for k in keys}
        return joined if isinstance(parts[0], dict) else tuple(joined.values())
    return np.concatenate(parts)


def _head(part: Arrays, rows: int) -> Arrays:
    """The first `rows` rows of an array, or of each member of a mapping or tuple."""
    if isinstance(part, dict):
        return {k: v[:rows] for k, v in part.items()}
    if isinstance(part, tuple):
        return tuple(v[:rows] for v in part)
    return part[:rows]
