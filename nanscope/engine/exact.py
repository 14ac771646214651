"""Exact statistics for a step that saw a non-finite value, in few ops.

On a healthy step one sum per tensor is enough: a sum is finite only if every entry
is. When one is not, the record needs exact counts of the non-finite entries and the
statistics of the finite ones. `segment_stats` computes those for any number of
tensors (a model's variables) with one set of segment reductions over their
concatenation, so the branch grows by a few ops per tensor, not a dozen;
`finite_stats` does the same for the few tensors of one layer output.

Few ops matter: every op costs about 0.1 ms to trace and a node for grappler to
optimise, and the statistics used to be more than half of the step's graph. The
exact path stays in a `tf.cond`: its untaken branch costs the executor little on a
healthy step, less than running the same ops on empty tensors (tried: about 5%
slower per step on a small MLP), and XLA needs the static shapes a `tf.cond` keeps.
Small tensors (`small`) skip the `tf.cond` and get the exact statistics on every
step: on so few entries they cost about what the healthy ones do, while a `tf.cond`
costs two branch graphs to trace (a few ms each) and a handful of nodes per step.
"""

import weakref
from collections.abc import Sequence
from typing import Any

from nanscope.runtime import tensorflow
from nanscope.tf_types import Tensor

# Per graph: (value, dtype) -> the constant made in it.
_CONSTANTS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, str], Any]] = weakref.WeakKeyDictionary()

# Tensors of a known shape are small with at most this many entries; tensors whose first
# axis is a batch of unknown size are small with at most SMALL_ROW_SIZE entries per row.
# Measured (bench/README.md): the 551 weights of configs/exploding-regression.yaml (x3:
# gradient, weights, update) and its 25-wide layer outputs save 0.05 s of tracing and cost
# nothing per step; a 64-wide LSTM output on the exact path cost 10% more per step.
SMALL_SIZE = 4096
SMALL_ROW_SIZE = 32


def small(tensors: Sequence[Tensor]) -> bool:
    """True when the exact statistics of these tensors are cheap enough to compute on every step."""
    if all(t.shape.is_fully_defined() for t in tensors):
        return sum(t.shape.num_elements() for t in tensors) <= SMALL_SIZE
    return all(_row_size(t) <= SMALL_ROW_SIZE for t in tensors)


def _row_size(tensor: Tensor) -> float:
    """Entries per row of a tensor whose first axis is an unknown batch (inf when more is unknown)."""
    size = tensor.shape[1:].num_elements() if tensor.shape.rank else None
    return float("inf") if size is None else size


def constant(value: Any, dtype: str = "float32") -> Tensor:
    """A constant of the graph being built, made once per graph and then reused (a `tf.constant` is an op)."""
    tf, _ = tensorflow()
    # The constants are held weakly (their graph's op holds them while the graph lives): a tensor holds its
    # graph, so a strong one would keep every graph nanscope ever traced alive through `_CONSTANTS`.
    made = _CONSTANTS.setdefault(tf.compat.v1.get_default_graph(), {})
    key = (value, dtype)
    held = made.get(key)
    tensor = held() if held is not None else None
    if tensor is None:
        with tf.control_dependencies(None):  # a shared constant must not inherit where it was first used
            tensor = tf.constant(value, dtype)
        made[key] = weakref.ref(tensor)
    return tensor


def flat(tensor: Tensor) -> Tensor:
    """The tensor as a vector (a view: no copy)."""
    tf, _ = tensorflow()
    return tensor if tensor.shape.rank == 1 else tf.reshape(tensor, constant((-1,), "int32"))


def all_axes(tensor: Tensor) -> Tensor | None:
    """The axes to reduce a whole tensor over, as a shared constant (None when the rank is unknown)."""
    rank = tensor.shape.rank
    return None if rank is None else constant(tuple(range(rank)), "int32")


def nonfinite_count(tensor: Tensor, when: Tensor) -> Tensor:
    """Non-finite entries of a tensor when the boolean tensor `when` is true, else 0, as float32."""
    tf, _ = tensorflow()
    return tf.cond(when, lambda: count_nonfinite(tensor), lambda: constant(0.0))


def count_nonfinite(tensor: Tensor) -> Tensor:
    """Non-finite entries of a tensor, as float32."""
    tf, _ = tensorflow()
    bad = tf.cast(tf.logical_not(tf.math.is_finite(tensor)), tf.float32)
    return tf.reduce_sum(bad, all_axes(tensor))


def finite_stats(tensors: Sequence[Tensor]) -> list[Tensor]:
    """[max finite |x|, sum finite |x|, non-finite count, exact zeros] over float tensors, as four float32 scalars.

    Plain reductions per tensor, no concatenation: for the few tensors of one layer
    output they cost less than segment reductions (some 30 us each however small).
    """
    tf, _ = tensorflow()
    parts = [_finite_part(tf.cast(t, tf.float32)) for t in tensors]
    if len(parts) == 1:
        return list(parts[0])
    peaks, totals, nonfinite, zeros = zip(*parts)
    return [tf.reduce_max(tf.stack(peaks), constant((0,), "int32")), tf.add_n(totals), tf.add_n(nonfinite),
            tf.add_n(zeros)]


def _finite_part(x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    tf, _ = tensorflow()
    axes = all_axes(x)
    finite = tf.math.is_finite(x)
    a = tf.where(finite, tf.abs(x), constant(0.0))

    def count(mask: Tensor) -> Tensor:
        return tf.reduce_sum(tf.cast(mask, tf.float32), axes)

    # The max over no entries is -inf; |x| is never below 0.
    peak = tf.maximum(tf.reduce_max(a, axes), constant(0.0))
    return peak, tf.reduce_sum(a, axes), count(tf.logical_not(finite)), count(tf.equal(x, constant(0.0)))


def segment_stats(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Per tensor: [max finite |x|, sum finite |x|, non-finite count, exact zeros, L2 norm of finite entries].

    One set of segment reductions over the tensors' concatenation: a fixed dozen ops
    however many tensors there are. Counts add up in int32, exactly; sums in float64,
    because a segment sum adds one element after another, and float64 keeps it exact
    to float32 precision and free of overflow (a norm past float32's range comes out
    as inf).

    Returns:
        list of 5 float32 tensors [len(tensors)], in the order above.
    """
    tf, _ = tensorflow()
    if not tensors:
        return [tf.zeros([0], tf.float32)] * 5
    x, ids = _joined(tensors)
    segments = constant(len(tensors), "int32")
    finite = tf.math.is_finite(x)
    a = tf.where(finite, tf.abs(x), constant(0.0))
    flags = tf.cast(tf.stack([tf.logical_not(finite), tf.equal(x, constant(0.0))], axis=1), tf.int32)
    nonfinite, zeros = tf.unstack(tf.cast(tf.math.unsorted_segment_sum(flags, ids, segments), tf.float32), axis=1)
    wide = tf.cast(a, tf.float64)
    sums = tf.math.unsorted_segment_sum(tf.stack([wide, wide * wide], axis=1), ids, segments)
    total, squares = tf.unstack(sums, axis=1)
    # An empty segment's max is the lowest float; |x| is never below 0.
    peak = tf.maximum(tf.math.unsorted_segment_max(a, ids, segments), constant(0.0))
    return [peak, tf.cast(total, tf.float32), nonfinite, zeros, tf.cast(tf.sqrt(squares), tf.float32)]


def _joined(tensors: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """(all entries as one float32 vector, the index of the tensor each entry comes from).

    The indices come from one sorted search over the tensors' end offsets, a fixed
    handful of ops however many tensors there are.
    """
    tf, _ = tensorflow()
    vectors = [flat(t) for t in tensors]
    zero = constant(0, "int32")
    x = tf.concat([tf.cast(v, tf.float32) for v in vectors], axis=zero)
    static = [v.shape.num_elements() for v in vectors]
    sizes = tf.constant(static, tf.int32) if None not in static else tf.stack([tf.size(v) for v in vectors])
    ends = tf.expand_dims(tf.cumsum(sizes, axis=zero), zero)
    positions = tf.expand_dims(tf.range(zero, tf.size(x), constant(1, "int32")), zero)
    # The raw op: tf.searchsorted wraps it in some twenty shape ops.
    ids = tf.raw_ops.UpperBound(sorted_inputs=ends, values=positions, out_type=tf.int32)
    return x, tf.reshape(ids, constant((-1,), "int32"))
