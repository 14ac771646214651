"""`DataStream`: a data source opened for a chunked scan, whatever its kind."""

import dataclasses
from dataclasses import dataclass
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from nanscope.errors import DataError

if TYPE_CHECKING:
    from nanscope.checkdata.outputs import TargetPart

# One chunk of rows: {array name: array}.
Chunk = dict[str, np.ndarray]
# The output a target array belongs to: its name, or its position in output order.
Output = str | int


@dataclass
class DataStream:
    """A data source opened for a chunked scan.

    Args:
        description: str. One line for the report header.
        inputs: list of str. Names of the input arrays.
        targets: list of str. Names of the target arrays (may be empty).
        rows: int or None. Number of rows, when known before reading.
        chunks: callable(int) -> iterator of dict. Yields {array name: array} chunks.
        column_names: dict. Optional names for the last-axis columns of an array.
        origin: str. The file named in error messages (the spec, or the data file).
        field: str. The spec field the data comes from, for error messages.
        row_bytes: int. Bytes per row of all arrays together, when known (sizes the chunks).
        allow_nonfinite: set of str. Array or column names allowed to hold NaN (the spec's masks).
        outputs: dict. {target array name: output} for a multi-output model: the output's name, or its
            position when the targets are listed in output order. Empty for one target array.
    """

    description: str
    inputs: list[str]
    targets: list[str]
    rows: int | None
    chunks: Callable[[int], Iterator[Chunk]]
    column_names: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    origin: str = ""
    field: str = "data.path"
    row_bytes: int = 0
    allow_nonfinite: set[str] = dataclasses.field(default_factory=set)
    outputs: dict[str, Output] = dataclasses.field(default_factory=dict)


def outputs_of(named_parts: Mapping[str, "TargetPart"]) -> dict[str, Output]:
    """The `DataStream.outputs` of {array name: TargetPart}: the parts that belong to a named or numbered output."""
    return {name: part.output for name, part in named_parts.items() if part.output is not None}


def check_rows(shapes: Mapping[str, Sequence[int]], origin: str, field_name: str) -> int:
    """The common number of rows of arrays with these shapes; DataError when they disagree or are empty."""
    for name, shape in shapes.items():
        if len(shape) == 0:
            raise DataError(f"{origin}: {field_name}: `{name}` must be an array with rows on the first axis")
    counts = {name: shape[0] for name, shape in shapes.items()}
    if len(set(counts.values())) > 1:
        listed = " but ".join(f"{name} has {n} rows" for name, n in counts.items())
        raise DataError(f"{origin}: {field_name}: {listed}")
    rows = next(iter(counts.values()), 0)
    if rows == 0:
        raise DataError(f"{origin}: {field_name}: the dataset is empty (0 rows)")
    return rows
