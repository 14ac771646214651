"""Fully masked softmax rows: the rows of a masked softmax that have no valid position left.

A softmax over a row masked at every position is 0/0. With a -inf fill the Softmax
(or the `x - max(x)` of a hand-written one) turns the row of -inf into NaN; with a
multiplicative mask the hand-written `exp(x) * mask / sum(...)` divides 0 by 0.
`masked_rows` recognises both at the op that made the NaN and says which rows they were.
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nanscope.forensics.events import ForwardOp
from nanscope.tf_types import Tensor

# The op that made a tensor earlier in the pass (OpWatch.producer_of).
ProducerOf = Callable[[Tensor], ForwardOp | None]

# Ops whose 0/0 is a hand-written softmax's normalisation when the numerator comes from exp().
DIVISION_OPS = {"RealDiv", "Div"}
EXP_OPS = {"Exp"}
# `scores + bias`: an additive mask, whose -inf comes from the op that made the bias.
ADD_OPS = {"Add", "AddV2"}
# How far back from the division to look for the exp() (exp -> mask multiply -> cast is 2-3 ops).
EXP_SEARCH_DEPTH = 4
# How many positions inside a batch row (query indices, head and query pairs) to name.
MAX_POSITIONS = 8


def masked_rows(op_type: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor], producer_of: ProducerOf
                ) -> dict[str, Any]:
    """{"masked_rows", "softmax_rows", "batch_rows"[, "positions", "fill"]} when this op turned fully masked
    softmax rows into NaN, else {}. `fill` is the op (and line) that made the masked operand: the -inf fill,
    or the multiply by the mask.

    Args:
        op_type: str. The op that made non-finite values.
        inputs, outputs: list of eager tensors. Its operands and results.
        producer_of: callable(tensor) -> ForwardOp or None. The op that made a tensor earlier in the pass.
    """
    if not any(_is_float(t) and np.isnan(t.numpy()).any() for t in outputs):
        return {}
    if op_type in DIVISION_OPS and len(inputs) == 2:
        rows, masked_by = _zero_sum_rows(inputs[0], inputs[1], producer_of), inputs[0]
    else:
        rows, masked_by = _all_neginf_rows(inputs)
    if rows is None or not rows.any():
        return {}
    by_batch_row = rows.reshape(rows.shape[0], -1).any(axis=1) if rows.ndim else np.array([True])
    found: dict[str, Any] = {"masked_rows": int(rows.sum()), "softmax_rows": int(rows.size),
             "batch_rows": [int(i) for i in np.flatnonzero(by_batch_row)]}
    fill = _fill_of(masked_by, producer_of)
    if fill is not None:
        found["fill"] = {"op": fill.op, "source": fill.source}
    if rows.ndim >= 2:
        # Inside each batch row (attention: heads, queries), which softmax rows: a wrong causal mask shows here.
        inner = np.argwhere(rows.any(axis=0))[:MAX_POSITIONS]
        found["positions"] = [[int(i) for i in index] for index in inner]
    return found


def _all_neginf_rows(inputs: Sequence[Tensor]) -> tuple[np.ndarray | None, Tensor]:
    """(per softmax row, whether every position is -inf; that operand) for the first operand with such a row."""
    for tensor in inputs:
        if not _is_float(tensor) or len(tensor.shape) == 0 or tensor.shape[-1] < 2:
            continue
        rows = np.all(np.isneginf(tensor.numpy()), axis=-1)
        if rows.any():
            return rows, tensor
    return None, None


def _fill_of(tensor: Tensor, producer_of: ProducerOf) -> ForwardOp | None:
    """The op that put -inf (or the zeros of a mask) into `tensor`: through `scores + bias` to the bias's fill."""
    record = producer_of(tensor)
    for _ in range(EXP_SEARCH_DEPTH):
        if record is None or record.op not in ADD_OPS:
            break
        masked = [t for t in record.inputs if _is_float(t) and np.isneginf(t.numpy()).any()]
        earlier = producer_of(masked[0]) if len(masked) == 1 else None
        if earlier is None:
            break
        record = earlier
    return record


def _zero_sum_rows(numerator: Tensor, denominator: Tensor, producer_of: ProducerOf) -> np.ndarray | None:
    """Per row, whether a hand-written softmax's sum is 0 (every exp() masked out): exp(x) * mask / sum(...)."""
    if not (_is_float(numerator) and _is_float(denominator)) or not _comes_from_exp(numerator, producer_of):
        return None
    num, den = numerator.numpy(), denominator.numpy()
    if den.ndim == num.ndim and den.ndim and den.shape[-1] == 1:
        den = den[..., 0]
    elif den.ndim != num.ndim - 1:
        return None
    return den == 0


def _comes_from_exp(tensor: Tensor, producer_of: ProducerOf) -> bool:
    """Whether an exp() is among the ops that made `tensor`, within EXP_SEARCH_DEPTH ops."""
    frontier = [tensor]
    for _ in range(EXP_SEARCH_DEPTH):
        records = [r for r in (producer_of(t) for t in frontier) if r is not None]
        if any(r.op in EXP_OPS for r in records):
            return True
        frontier = [t for r in records for t in r.inputs if _is_float(t)]
    return False


def _is_float(tensor: Any) -> bool:
    dtype = getattr(tensor, "dtype", None)
    return dtype is not None and getattr(dtype, "is_floating", False) and hasattr(tensor, "numpy")
