"""What the op watch records of an eager replay: one event per non-finite producer, the forward ops a gradient
op is traced back to, and the statistics of an op's operand against its domain."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from nanscope.runtime import tensorflow
from nanscope.tf_types import Tensor


# For these ops the second input is the denominator: that is the operand to describe.
DENOMINATOR_OPS = {"RealDiv", "Div", "DivNoNan", "FloorDiv", "TruncateDiv", "Xdivy"}
# For these the second input is the argument of the log (x * log(y)): the operand to describe.
LOG_ARGUMENT_OPS = {"Xlogy", "Xlog1py"}
# The name of the described second operand, by op.
SECOND_OPERAND = {**{op: "denominator" for op in DENOMINATOR_OPS}, **{op: "log argument" for op in LOG_ARGUMENT_OPS}}
# Ops whose second input is an exponent: its range is kept beside the base's statistics.
EXPONENT_OPS = {"Pow"}
# tf.where: the op that picks between two branches and throws the other away.
SELECT_OPS = {"Select", "SelectV2"}


@dataclass
class OpEvent:
    """The producing op: what it was, where it ran, and what it was fed.

    Args:
        op: str. TF op type ("Log", "Exp", "RealDiv"; for the backward pass "SqrtGrad" etc.).
        forward_op: str or None. For a gradient op, the forward op it differentiates.
        phase: str. forward | loss | backward | update.
        layer: str or None. Innermost Keras layer running when the (forward) op ran.
        layer_class: str or None.
        source: str or None. `file:line` of the user code that created the (forward) op.
        inputs: dict. min, max, zero_fraction, negative_fraction of the operand.
        operand: str. Which input `inputs` describes ("input", "denominator").
        dtype: str. The op output's dtype.
        introduced: bool, default True. The op made the non-finite values (False: it passed on a non-finite
            operand, such as an intended -inf mask fill).
        forward_phase: str or None. For a gradient op, the phase its forward op ran in (forward | loss).
        context: dict. What the replay found around the op: fully masked softmax rows (`masked_rows`,
            `softmax_rows`, `batch_rows`), the tf.where that threw the op's forward value away (`discarded_by`).
    """

    op: str | None  # None for an update event: the replay stayed finite but left a weight non-finite
    phase: str
    forward_op: str | None = None
    layer: str | None = None
    layer_class: str | None = None
    source: str | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    operand: str = "input"
    dtype: str = "float32"
    introduced: bool = True
    forward_phase: str | None = None
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class ForwardOp:
    """One op of the forward pass or the loss, kept for attributing its gradient and tracing values back.

    Args:
        op: str. TF op type.
        phase: str. forward | loss.
        layer: keras.Layer or None. Innermost layer running when it ran.
        source: str or None. `file:line` behind it.
        inputs, outputs: list of tensors. Held so their ids stay theirs for the replay's length.
        event: OpEvent or None. The candidate producer this op was, if it made non-finite values.
        discarded_by: dict or None. The tf.where (`op`, `source`) that took this op's output as a branch.
    """

    op: str
    phase: str
    layer: Any
    source: str | None
    inputs: list[Tensor]
    outputs: list[Tensor]
    event: OpEvent | None = None
    discarded_by: dict[str, Any] | None = None


def operand_stats(value: Any) -> dict[str, Any]:
    """min, max, fraction of exact zeros, fraction of negatives of a float array (finite entries for min/max)."""
    array = np.asarray(value, dtype=np.float64).reshape(-1)
    if array.size == 0:
        return {}
    finite = array[np.isfinite(array)]
    return {
        "min": float(finite.min()) if finite.size else float("nan"),
        "max": float(finite.max()) if finite.size else float("nan"),
        "zero_fraction": float(np.mean(array == 0.0)),
        "negative_fraction": float(np.mean(array < 0.0)),
        "nonfinite": int(array.size - finite.size),
    }


def exponent_stats(op: str | None, operands: Sequence[Any]) -> dict[str, float]:
    """{"exponent_min", "exponent_max"} of a Pow's exponent (a float array or tensor), else {}."""
    if op not in EXPONENT_OPS or len(operands) < 2 or operands[1] is None:
        return {}
    value = operands[1].numpy() if hasattr(operands[1], "numpy") else operands[1]
    stats = operand_stats(value)
    return {"exponent_min": stats["min"], "exponent_max": stats["max"]} if stats else {}


def introduces_nonfinite(inputs: Iterable[Tensor], outputs: Iterable[Tensor]) -> bool:
    """Whether an op made non-finite values its operands did not hold: NaN from no NaN, or Inf from finite values."""
    operands = [t.numpy() for t in inputs if is_float_tensor(t) and hasattr(t, "numpy")]
    results = [t.numpy() for t in outputs if is_float_tensor(t)]
    if any(np.isnan(r).any() for r in results) and not any(np.isnan(o).any() for o in operands):
        return True
    return all(np.isfinite(o).all() for o in operands)


def where_trap(record: ForwardOp) -> dict[str, Any]:
    """The tf.where gradient trap: the where that threw away the forward value of the op being differentiated."""
    where = record.discarded_by or (record.event.context.get("discarded_by") if record.event is not None else None)
    if where is None:
        return {}
    nonfinite = sum(int(np.size(t.numpy()) - np.isfinite(t.numpy()).sum())
                    for t in record.outputs if is_float_tensor(t))
    return {"discarded_by": where, "forward_nonfinite": nonfinite}


def flat_tensors(results: Any) -> list[Tensor]:
    """The eager tensors in an op's (nested) results."""
    tf, _ = tensorflow()
    return [t for t in tf.nest.flatten(results) if hasattr(t, "numpy")]


def is_float_tensor(tensor: Any) -> bool:
    """True for a floating-point tensor."""
    dtype = getattr(tensor, "dtype", None)
    return dtype is not None and getattr(dtype, "is_floating", False)


def all_finite(tensors: Iterable[Tensor]) -> bool:
    """True when every floating-point tensor of `tensors` holds only finite values."""
    for tensor in tensors:
        if is_float_tensor(tensor) and hasattr(tensor, "numpy") and not np.isfinite(tensor.numpy()).all():
            return False
    return True
