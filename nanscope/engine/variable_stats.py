"""Per-variable statistics and the pre-step snapshot of the weights.

The healthy path costs one fused pass per statistic and variable: `tf.nn.l2_loss`
(sum of squares in one kernel, no temporary) for gradient, weight and update norms,
the update being the increment the optimizer wrote (`applied_updates`).
The exact non-finite counts, and norms that would overflow a float32 sum of squares,
are computed only when a sum shows there is something to count, for all variables at
once (`exact.segment_stats`); a small model gets them on every step instead.
"""

from collections.abc import Iterable, Sequence
from typing import Any

from nanscope.engine.exact import all_axes, constant, count_nonfinite, nonfinite_count, segment_stats, small
from nanscope.engine.schema import VARIABLE
from nanscope.runtime import tensorflow
from nanscope.tf_types import Tensor


class Snapshot:
    """One extra copy of the model's weights, taken before each update.

    Only the model's variables are copied (the issue's budget: one extra copy of the
    weights). The optimizer's slots are not, so replaying a step's update starts from
    the optimizer state as it was after that step.

    Args:
        variables: list of the model's variables (trainable first).
    """

    def __init__(self, variables: Iterable[Any]) -> None:
        tf, _ = tensorflow()
        self.variables = list(variables)
        self.copies = [tf.Variable(tf.convert_to_tensor(v), trainable=False, name="nanscope_snapshot")
                       for v in self.variables]

    def take(self) -> None:
        """Copy the variables' current values (inside the step, before the update)."""
        tf, _ = tensorflow()
        for copy, variable in zip(self.copies, self.variables):
            copy.assign(tf.convert_to_tensor(variable))

    def restore(self) -> None:
        """Put the copied values back into the variables."""
        for copy, variable in zip(self.copies, self.variables):
            variable.assign(copy)


# What `variable_rows` measures per variable, in the order it measures it: [norm, non-finite
# count] of the gradient, the weights after the update and the update. |dw|/|w| is taken
# against the weights after the update: one pass fewer than also measuring them before,
# and the same ratio to three digits whenever the ratio is small enough to be healthy.
_MEASURED = ("grad_norm", "grad_nonfinite", "weight_norm", "weight_nonfinite", "update_norm", "update_nonfinite")


def variable_rows(grads: Sequence[Tensor], before: Sequence[Tensor], after: Sequence[Tensor],
                  applied: Sequence[Tensor] | None = None, updates: Sequence[Tensor | None] | None = None
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """Per-variable statistics: ([n, 5] rows, global grad norm, global applied-grad norm).

    Row columns: schema.VARIABLE.

    Args:
        grads: list of gradient tensors, one per variable.
        before: list of the variables' values before the update (snapshot copies or tensors).
        after: list of the variables (or their values) after the update.
        applied: list of the gradients handed to the optimizer, when they differ from `grads`.
        updates: list, optional: per variable the change the optimizer wrote (`applied_updates`),
            or None where it is not known; the update is then `after - before`.
    """
    tf, _ = tensorflow()
    if not grads:
        return tf.zeros([0, len(VARIABLE)]), tf.constant(0.0), tf.constant(0.0)
    updates = updates or [None] * len(grads)
    # Per variable: the gradient, the weights after the update and the update itself.
    tensors = [
        t for g, b, v, d in zip(grads, before, after, updates)
        for t in (float32(g), float32(v), float32(v) - float32(b) if d is None else float32(d))
    ]
    if small(tensors):
        norms, nonfinite = _exact_norms(tensors)
    else:
        norms, nonfinite = _norms(tensors)
    # _MEASURED per variable, reordered to VARIABLE's columns.
    pairs = tf.reshape(tf.stack([norms, nonfinite], axis=1), constant((len(grads), len(_MEASURED)), "int32"))
    order = tuple(_MEASURED.index(name) for name in VARIABLE)
    rows = tf.gather(pairs, constant(order, "int32"), axis=constant(1, "int32"))
    grad_norm = combined_norm(tf.unstack(rows, axis=1)[VARIABLE.at("grad_norm")])
    applied_norm = (grad_norm if applied is None
                    else combined_norm(tf.sqrt(sum_of_squares([float32(a) for a in applied]))))
    return rows, grad_norm, applied_norm


def summary_stats(grads: Sequence[Tensor | None], after: Sequence[Tensor], applied: Sequence[Tensor] | None = None
                  ) -> tuple[dict[str, Tensor], Tensor]:
    """The sentinel's gradient and weight columns of SCALARS, over all variables at once (no per-variable rows).

    A healthy step costs one fused pass over the gradients and one over the updated weights
    (their sums of squares), and one `tf.cond`: only when either is not finite
    does its other branch count the non-finite entries of both and take the gradients'
    norm scaled by their largest entry (exact where the plain sum of squares overflows).
    `applied`, the gradients handed to the optimizer when they differ, costs one more norm.

    Returns:
        (the SCALARS columns by name, the updated weights' global norm).
    """
    tf, _ = tensorflow()
    grads = [float32(g) for g in grads if g is not None]
    weights = [float32(w) for w in after]
    squares = tf.add_n([tf.nn.l2_loss(g) for g in grads]) * constant(2.0) if grads else constant(0.0)
    probe = tf.add_n([tf.nn.l2_loss(w) for w in weights]) * constant(2.0) if weights else constant(0.0)

    def healthy() -> tuple[Tensor, Tensor, Tensor]:
        return tf.sqrt(squares), tf.constant(0.0), tf.constant(0.0)

    def exact() -> tuple[Tensor, Tensor, Tensor]:
        return _scaled_norm(grads), _count(grads), _count(weights)

    finite = tf.logical_and(tf.math.is_finite(squares), tf.math.is_finite(probe))
    grad_norm, grad_bad, weight_bad = tf.cond(finite, healthy, exact)
    return {"grad_global_norm": grad_norm,
            "applied_grad_global_norm": grad_norm if applied is None else global_norm(applied),
            "grad_nonfinite": grad_bad, "weights_nonfinite": weight_bad}, tf.sqrt(probe)


def global_norm(tensors: Iterable[Tensor | None]) -> Tensor:
    """The global L2 norm, one fused pass; a sum of squares that overflows is redone scaled by the largest entry."""
    tf, _ = tensorflow()
    tensors = [float32(t) for t in tensors if t is not None]
    if not tensors:
        return constant(0.0)
    norm = tf.sqrt(tf.add_n([2.0 * tf.nn.l2_loss(t) for t in tensors]))
    return tf.cond(tf.math.is_finite(norm), lambda: norm, lambda: _scaled_norm(tensors))


def _scaled_norm(tensors: Sequence[Tensor]) -> Tensor:
    """The global L2 norm of float32 tensors, scaled by their largest |entry| so that it overflows only when the
    norm does (NaN when an entry is not finite)."""
    tf, _ = tensorflow()
    if not tensors:
        return tf.constant(0.0)
    peak = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(t)) for t in tensors]))
    safe = tf.where(peak > 0, peak, 1.0)
    return peak * tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(t / safe)) for t in tensors]))


def _count(tensors: Sequence[Tensor]) -> Tensor:
    """Non-finite entries of the tensors, as one float32 scalar."""
    tf, _ = tensorflow()
    return tf.add_n([count_nonfinite(t) for t in tensors]) if tensors else tf.constant(0.0)


# Ops that use a variable's handle only to read it.
_READS = frozenset({"ReadVariableOp", "ResourceGather", "VariableShape"})
# Ops that change a variable by their second input: the sign of that change.
_INCREMENTS = {"AssignAddVariableOp": 1.0, "AssignSubVariableOp": -1.0}


def graph_position() -> int:
    """How many ops the graph being built holds: pass to `applied_updates` to look at the ops made since."""
    tf, _ = tensorflow()
    return len(tf.compat.v1.get_default_graph().get_operations())


def applied_updates(since: int, variables: Sequence[Any]) -> list[Tensor | None]:
    """Per variable, the change (up to its sign) the ops made since `since` (a `graph_position`) wrote into it, or None.

    Keras optimizers update a weight with `assign_add` or `assign_sub` of a tensor they
    compute anyway (Adam's m / (sqrt(v) + eps) times the learning rate, AdamW's decay
    too), so the norm of that tensor is |dw| at the cost of one pass, where
    `after - before` costs a subtraction over the whole weight first. A variable that
    those ops also overwrite, scatter into, or hand to a control-flow op or a function
    (a LossScaleOptimizer's conditional update, gradient accumulation, an EMA
    overwrite, a constraint) gets None: its change is then measured as `after - before`.
    So does a variable they do not write at all.

    Call inside the function being traced, right after the optimizer's update.
    """
    tf, _ = tensorflow()
    graph = tf.compat.v1.get_default_graph()
    handles = [graph.capture(v.handle) if getattr(v, "handle", None) is not None else None for v in variables]
    index = {id(h): i for i, h in enumerate(handles) if h is not None}
    users: list[list[Any]] = [[] for _ in variables]
    for op in graph.get_operations()[since:]:
        for i in {index[id(t)] for t in op.inputs if id(t) in index}:
            users[i].append(op)
    return [None if handle is None else _increment(ops, handle) for ops, handle in zip(users, handles)]


def _increment(ops: list[Any], handle: Tensor) -> Tensor | None:
    """The sum of the increments `ops` (each using `handle`) write into its variable, up to its sign, or None."""
    writes: list[tuple[float, Tensor]] = []
    for op in ops:
        if op.type in _READS:
            continue
        sign = _INCREMENTS.get(op.type)
        if sign is None or op.inputs[0] is not handle:
            return None
        writes.append((sign, float32(op.inputs[1])))
    if not writes:
        return None
    (first_sign, change), rest = writes[0], writes[1:]
    for sign, value in rest:  # the change times first_sign: the first write is not negated
        change = change + value if sign == first_sign else change - value
    return change


def _norms(tensors: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """(L2 norms, non-finite counts) of the tensors: one fused pass each, the exact path only when a sum is not
    finite."""
    tf, _ = tensorflow()
    squares = sum_of_squares(tensors)
    finite = tf.reduce_all(tf.math.is_finite(squares), constant((0,), "int32"))
    return tf.cond(finite, lambda: (tf.sqrt(squares), tf.zeros_like(squares)), lambda: _exact_norms(tensors))


def _exact_norms(tensors: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """(L2 norms, non-finite counts) by `segment_stats`: a norm over non-finite entries is NaN, and one over
    finite entries whose sum of squares overflows float32 is still exact."""
    tf, _ = tensorflow()
    _, _, nonfinite, _, norms = segment_stats(tensors)
    return tf.where(nonfinite > constant(0.0), constant(float("nan")), norms), nonfinite


def sum_of_squares(tensors: Sequence[Tensor]) -> Tensor:
    """[len(tensors)] float32: each tensor's sum of squares, by `tf.nn.l2_loss` (one fused pass, no temporary)."""
    tf, _ = tensorflow()
    return constant(2.0) * tf.stack([tf.nn.l2_loss(t) for t in tensors])


def combined_norm(norms: Tensor) -> Tensor:
    """sqrt(sum(n**2)) scaled by the largest norm, so it overflows only when the result does."""
    tf, _ = tensorflow()
    axis = constant((0,), "int32")
    peak = tf.reduce_max(norms, axis)
    return peak * tf.sqrt(tf.reduce_sum(tf.square(tf.math.divide_no_nan(norms, peak)), axis))


def any_nonfinite_count(tensor: Tensor) -> Tensor:
    """Number of non-finite entries of a tensor (0 for integer tensors), as float32.

    A small tensor (`exact.small`) is counted directly. A larger one costs one sum on
    the healthy path: a sum is finite only if every entry is, and the exact count runs
    in a `tf.cond` only when it is not (a sum of finite entries that overflows takes
    that branch too, which then counts 0).
    """
    tf, _ = tensorflow()
    tensor = tf.convert_to_tensor(tensor)
    if not tensor.dtype.is_floating:
        return tf.constant(0.0)
    if small([tensor]):
        return count_nonfinite(tensor)
    probe = tf.reduce_sum(tf.cast(tensor, tf.float32), all_axes(tensor))
    return nonfinite_count(tensor, tf.logical_not(tf.math.is_finite(probe)))


def float32(tensor: Tensor) -> Tensor:
    """`tensor` as a float32 tensor (cast where it is another dtype)."""
    tf, _ = tensorflow()
    tensor = tf.convert_to_tensor(tensor)
    return tensor if tensor.dtype == tf.float32 else tf.cast(tensor, tf.float32)

