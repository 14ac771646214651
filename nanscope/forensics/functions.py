"""Inside a function call: which op of a restored SavedModel function made the non-finite value.

Eagerly, a SavedModel's restored function (`__inference_*`, or `__forward_*` /
`__backward_*` under a gradient tape) runs as one op, so the op watch sees only the
call. `localize_in_function` re-runs that call's graph op by op, eagerly, on the
call's own inputs (its captured variable handles included), and returns the first
inner op whose output is not finite from finite inputs, with its node name (which
carries the layer's name scope) and its inputs. Nested calls are followed.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nanscope.internals import execute_op, function_graph
from nanscope.runtime import tensorflow
from nanscope.tf_types import Tensor

# A graph op of a FuncGraph, and an attribute value of its NodeDef (a protobuf): Any to mypy.
GraphOp = Any

# Ops that call another function by its `f` attribute.
CALL_OPS = {"PartitionedCall", "StatefulPartitionedCall"}
# How deep to follow nested function calls.
MAX_DEPTH = 4


@dataclass
class InnerOp:
    """The op inside a function that made the non-finite value.

    Args:
        op: str. Its type ("RealDiv").
        node: str. Its node name in the function's graph (name scopes name the layer).
        functions: list of str. The function names from the outer call inward.
        inputs: list of str. Its input tensors' names.
        operands: list of np.ndarray. Its input values (floats only; others are None).
    """

    op: str
    node: str
    functions: list[str]
    inputs: list[str] = field(default_factory=list)
    operands: list[np.ndarray | None] = field(default_factory=list)


def is_function_call(op_type: str) -> bool:
    """Whether an eager op type is a call of a traced or restored function."""
    return op_type.startswith("__") or op_type in CALL_OPS


def localize_in_function(function_name: str, inputs: Sequence[Tensor], depth: int = 0) -> InnerOp | None:
    """The InnerOp of `function_name` that made a non-finite value from finite inputs, or None.

    Args:
        function_name: str. A function registered in the eager context (the call op's type).
        inputs: list of eager tensors. The call's inputs, in order.
    """
    try:
        graph = function_graph(function_name)
    except Exception:  # a function the context does not hold: nothing to say, not a crash
        return None
    by_name = {placeholder.name: value for placeholder, value in zip(graph.inputs, inputs)}
    for op in graph.get_operations():
        if op.type == "Placeholder":
            continue
        if any(t.name not in by_name for t in op.inputs):
            return None
        operands = [by_name[t.name] for t in op.inputs]
        outputs = _run(op, operands)
        if outputs is None:
            return None
        for tensor, value in zip(op.outputs, outputs):
            by_name[tensor.name] = value
        if not _all_finite(outputs) and _all_finite(operands):
            inner = _nested(op, operands, depth)
            if inner is not None:
                inner.functions.insert(0, function_name)
                return inner
            return InnerOp(op.type, op.name, [function_name], [t.name for t in op.inputs],
                           [v.numpy() if _is_float(v) else None for v in operands])
    return None


def _nested(op: GraphOp, operands: list[Tensor], depth: int) -> InnerOp | None:
    if op.type not in CALL_OPS or depth >= MAX_DEPTH:
        return None
    return localize_in_function(op.get_attr("f").name, operands, depth + 1)


def _run(op: GraphOp, operands: list[Tensor]) -> list[Tensor] | None:
    """Run one graph op eagerly on `operands`; its outputs, or None when it cannot be run alone."""
    tf, _ = tensorflow()
    try:
        if op.type == "Const":
            return [tf.constant(tf.make_ndarray(op.get_attr("value")))]
        results = execute_op(op.type, len(op.outputs), operands, _attrs(op))
    except Exception:  # an op that needs its graph: stop here, report the call itself
        return None
    return list(results) if results is not None else []


def _attrs(op: GraphOp) -> tuple[Any, ...]:
    """The op's attributes as the flat (name, value, ...) tuple eager execution takes."""
    flat: list[Any] = []
    for name, value in op.node_def.attr.items():
        if name.startswith("_"):
            continue
        flat.extend((name, _attr_value(value)))
    return tuple(flat)


def _attr_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "list":
        listed = value.list
        for part in ("type", "shape", "i", "f", "b", "s", "func"):
            items = getattr(listed, part)
            if items:
                return [_scalar(part, item) for item in items]
        return []
    return _scalar(kind, getattr(value, kind))


def _scalar(kind: str, item: Any) -> Any:
    if kind == "shape":
        return None if item.unknown_rank else [d.size for d in item.dim]
    if kind == "func":
        return item.name
    return item


def _is_float(value: Any) -> bool:
    dtype = getattr(value, "dtype", None)
    return dtype is not None and getattr(dtype, "is_floating", False) and hasattr(value, "numpy")


def _all_finite(values: Sequence[Any]) -> bool:
    return all(np.isfinite(v.numpy()).all() for v in values if _is_float(v))
