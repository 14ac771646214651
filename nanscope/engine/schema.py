"""The step row: one named layout for everything an instrumented step measures.

A compiled step returns a few small float32 arrays: the scalars (loss, global
gradient norms, non-finite counts per phase), then per output of a multi-output
model its own columns, a row per probed layer, the layers' loss terms and a row
per trainable variable. Producers (engine/step.py, engine/chunk.py, the Keras
callback's probe) build these arrays, and decoders (engine/records.py, the
record store) read them back. Both go through this module: a column is found
by its name, never by a number written somewhere else, so reordering or adding
a column changes every producer and decoder at once.

Adding a scalar column is one line: append its name to `SCALARS`. A producer that
does not measure it passes no value and gets 0 there (see `Columns.pack`), which
decoders read as "not measured".

Example:
    scalars = SCALARS.pack({"loss": loss, ...}, default=0.0)   # in the step, in column order
    layout = StepLayout(outputs=0, layers=3, terms=4, variables=6)
    scalars, layers, terms, variables = layout.split(row)      # a flattened row, back to its parts
    loss = scalars[..., SCALARS.at("loss")]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import tensorflow as tf


# A value to pack into a row: a float, or a tensor while the step is traced.
V = TypeVar("V")


class Columns(tuple):
    """An ordered tuple of column names whose offsets are looked up by name.

    Args:
        *names: str. The column names, in row order.
    """

    def __new__(cls, *names: str) -> Columns:
        if len(set(names)) != len(names):
            raise ValueError(f"column names must be unique. Received: {names}")
        return super().__new__(cls, names)

    def at(self, name: str) -> int:
        """The offset of column `name`; a name not in the row is an error, not a silent wrong column."""
        try:
            return self.index(name)
        except ValueError:
            raise KeyError(f"no column {name!r}; the columns are {', '.join(self)}") from None

    def pack(self, values: Mapping[str, V], default: V | None = None) -> list[V | None]:
        """`values` (a mapping name -> value) as a list in column order.

        A name that is not a column is an error. A column without a value gets `default`,
        or is an error when `default` is None.
        """
        unknown = set(values) - set(self)
        if unknown:
            raise KeyError(f"not columns: {', '.join(sorted(unknown))}; the columns are {', '.join(self)}")
        if default is None:
            missing = [name for name in self if name not in values]
            if missing:
                raise KeyError(f"no value for column(s) {', '.join(missing)}")
        return [values.get(name, default) for name in self]

    def named(self, row: Iterable[float]) -> dict[str, float]:
        """A mapping name -> value of one row (a sequence in column order)."""
        return dict(zip(self, row))


# A step's phase as a number in the scalar columns (the history's "phase"): 0 is a finite step.
PHASES = (None, "data", "forward", "loss", "backward", "update")
# The scalars of one step, in row order.
SCALARS = Columns(
    "loss", "data_loss", "x_nonfinite", "y_nonfinite", "output_nonfinite", "loss_nonfinite",
    "grad_global_norm", "grad_nonfinite", "weights_nonfinite", "applied_grad_global_norm", "loss_scale",
    "update_skipped", "loss_scale_before", "loss_missing",
)
# `loss_missing` is 1 where the step gave no loss to record (a custom step under `instrument` that returns
# none): `loss` and `data_loss` then hold NaN, which means "unknown", not a non-finite loss.
# Scalars that count non-finite entries (or flag a non-finite value) in some phase.
SCALAR_COUNTS = ("x_nonfinite", "y_nonfinite", "output_nonfinite", "loss_nonfinite", "grad_nonfinite",
                 "weights_nonfinite")
# A multi-output model appends these per output, in output order, after SCALARS.
OUTPUT = Columns("loss", "target_nonfinite", "prediction_nonfinite")
# A count a step may leave out (the layer's exact zeros, on a schedule): the row holds NOT_COUNTED there.
NOT_COUNTED = -1.0
# Smallest normal float16 (numpy.finfo(float16).tiny): non-zero magnitudes below it are subnormal and lose
# precision, and they flush to 0 a little further down.
FLOAT16_TINY = 6.103515625e-05


@dataclass(frozen=True)
class Statistic:
    """One column of a layer-stats row, declared once: what it measures of the values of a layer's outputs.

    The probes (engine/probes.py) compute it in the graph, the decoder (engine/records.layer_stats_of) reads
    it into LayerStats, calls and replicas combine by `combine`, and tests/test_perf_exact.py holds the
    probes to `reference` for every statistic declared here.

    Args:
        name: str. The column's name.
        combine: str. How the rows of several calls of the layer, or of several replicas, make one:
            "max", "sum", or "count" (a sum that is NOT_COUNTED where any part is).
        reference: callable (values) -> float. Its value in numpy over the outputs' values (float64,
            non-finite entries included).
        float16_only: bool. Measured only where the outputs compute in float16 (0 for other dtypes).
    """

    name: str
    combine: str
    reference: Callable[[np.ndarray], float]
    float16_only: bool = False

    def expected(self, values: np.ndarray, float16: bool) -> float:
        """The reference value over `values` (outputs in float16 if `float16`)."""
        return self.reference(values) if float16 or not self.float16_only else 0.0


def _magnitudes(values: np.ndarray) -> np.ndarray:
    return np.abs(values[np.isfinite(values)])


def _subnormal(values: np.ndarray) -> float:
    magnitudes = _magnitudes(values)
    return float(np.sum((magnitudes > 0) & (magnitudes < FLOAT16_TINY)))


LAYER_STATISTICS = (
    Statistic("max_abs", "max", lambda v: float(_magnitudes(v).max(initial=0.0))),   # of the finite entries
    Statistic("sum_abs", "sum", lambda v: float(_magnitudes(v).sum())),               # of the finite entries
    Statistic("nonfinite", "sum", lambda v: float(np.sum(~np.isfinite(v)))),
    Statistic("zeros", "count", lambda v: float(np.sum(v == 0))),                     # exact zeros
    Statistic("size", "sum", lambda v: float(v.size)),                                # entries
    # float16 underflows: non-zero magnitudes below float16's smallest normal.
    Statistic("tiny", "sum", _subnormal, float16_only=True),
)
# A layer-stats row: one column per statistic, in their order.
LAYER = Columns(*(statistic.name for statistic in LAYER_STATISTICS))


def combined_layer_rows(rows: npt.ArrayLike) -> np.ndarray:
    """One layer-stats row from rows `[n, ..., len(LAYER)]` (calls or replicas on the first axis), in numpy."""
    rows = np.asarray(rows)
    parts = []
    for i, statistic in enumerate(LAYER_STATISTICS):
        column = rows[..., i]
        if statistic.combine == "max":
            parts.append(column.max(axis=0))
        elif statistic.combine == "count":
            parts.append(np.where((column < 0).any(axis=0), NOT_COUNTED, column.sum(axis=0)))
        else:
            parts.append(column.sum(axis=0))
    return np.stack(parts, axis=-1)
# A variable-stats row. |dw| is `update_norm`; the record holds the ratio |dw|/|w|.
VARIABLE = Columns("grad_norm", "grad_nonfinite", "weight_norm", "update_norm", "weight_nonfinite")


@dataclass(frozen=True)
class StepLayout:
    """The shape of one step's outputs for a given model, and of the flattened row that joins them.

    Args:
        outputs: int. Outputs of a multi-output model (0 for a model with one output).
        layers: int. Probed layers.
        terms: int. Layer loss terms: one per layer and one for the model, or 0 without a Keras model.
        variables: int. Trainable variables.
    """

    outputs: int
    layers: int
    terms: int
    variables: int

    @property
    def scalar_width(self) -> int:
        """Length of the scalar vector: SCALARS, then OUTPUT per output."""
        return len(SCALARS) + len(OUTPUT) * self.outputs

    @property
    def shapes(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """Shapes of the four arrays a step returns: scalars, layer stats, layer terms, variable stats."""
        return ([self.scalar_width], [self.layers, len(LAYER)], [self.terms], [self.variables, len(VARIABLE)])

    @property
    def widths(self) -> list[int]:
        """Flattened length of each of the four arrays."""
        return [int(np.prod(shape)) for shape in self.shapes]

    @property
    def width(self) -> int:
        """Length of the flattened row."""
        return sum(self.widths)

    def split(self, rows: npt.ArrayLike) -> tuple[np.ndarray, ...]:
        """(scalars, layer stats, layer terms, variable stats) of flattened rows `[..., width]`, shaped back."""
        rows = np.asarray(rows)
        if rows.shape[-1] != self.width:
            raise ValueError(f"a step row has {self.width} columns for this layout. Received: {rows.shape[-1]}")
        parts = np.split(rows, np.cumsum(self.widths)[:-1], axis=-1)
        return tuple(part.reshape(*rows.shape[:-1], *shape) for part, shape in zip(parts, self.shapes))

def join(parts: Sequence[tf.Tensor]) -> tf.Tensor:
    """The output tensors of one step, in `StepLayout.shapes` order, joined into one flattened row tensor."""
    from nanscope.runtime import tensorflow

    tf, _ = tensorflow()
    return tf.concat([tf.reshape(part, [-1]) for part in parts], axis=0)


def output_offsets(name: str, outputs: int) -> list[int]:
    """Offsets in the scalar vector of OUTPUT column `name`, one per output."""
    return [len(SCALARS) + i * len(OUTPUT) + OUTPUT.at(name) for i in range(outputs)]
