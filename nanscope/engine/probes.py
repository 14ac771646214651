"""In-graph probes: small reductions of tensors, and the layer-output recorder.

`LayerRecorder` wraps each Keras layer's `call` while the train step is being
traced, so the compiled step computes, per layer, a handful of reductions of the
layer's output. The wrapping lives only for the trace (`attached()` restores every
layer in `finally`); the compiled graph keeps the reductions, the model keeps
nothing. This works the same for Sequential, functional and subclassed models,
because every layer call goes through `Layer.__call__` -> `self.call`.

Under `tf.distribute`, the replica function is traced once per replica, each in its
own Python thread; `begin_replica` files that thread's rows under its replica id, and
`stats_matrix` returns the rows of the calling thread's replica. On one device every
row is replica 0's: the bookkeeping is Python at trace time and adds no op.
"""

import contextlib
import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from nanscope.engine.exact import all_axes, constant, finite_stats, small
from nanscope.engine.schema import FLOAT16_TINY, LAYER, LAYER_STATISTICS, NOT_COUNTED
from nanscope.internals import overridden
from nanscope.runtime import tensorflow
from nanscope.tf_types import Tensor

# Ops whose output is never negative: |x| is x, and the probe skips the abs.
NONNEGATIVE_OPS = frozenset({"Relu", "Relu6", "Softmax", "Sigmoid", "Softplus", "Exp"})
# Ops whose output holds exactly the values of their first input, rearranged.
RESHAPING_OPS = frozenset({"Reshape", "Identity", "Squeeze", "ExpandDims"})
# Exact zeros of a large layer output cost a sign and a third full reduction: about a
# tenth of a small CNN's step on CPU (bench/README.md), for a column only the layer
# table shows. They are counted on every ZEROS_EVERY-th step, the first included, and
# on every step with a non-finite output; other steps write NOT_COUNTED.
ZEROS_EVERY = 16
ZEROS = LAYER.at("zeros")


def tensor_stats(tensors: Sequence[Tensor], count_zeros: Tensor | None = None) -> Tensor:
    """[max |x|, sum |x|, non-finite count, exact zeros, size, float16 underflows] over float tensors, as float32.

    The last column counts non-zero magnitudes below float16's smallest normal, and
    is computed only for float16 tensors (0 otherwise).

    `count_zeros` (a boolean scalar tensor, or None for always) says whether this step
    counts the exact zeros of a large output; when it does not, the zeros column is
    NOT_COUNTED (-1). Small outputs always get every column.

    The healthy path costs, per tensor, an abs (none for the output of an op that is
    never negative, such as relu or softmax) and two reductions, and the outputs of a
    layer with several are reduced one by one, not concatenated, so no output is
    copied. The exact non-finite count, the zeros and the statistics of the finite
    entries are computed in a `tf.cond` only when the sum is not finite or the step
    counts zeros. That branch sits right after the layer, so the step
    keeps no output alive longer than the backward pass needs it. Small outputs
    (`exact.small`) get the exact statistics directly, with no `tf.cond`. A softmax
    output is measured on its recomputation (`_measured`).
    """
    tf, _ = tensorflow()
    measured = [_measured(t) for t in tensors if t.dtype.is_floating]
    floats = [t for t, _ in measured]
    if not floats:
        return tf.zeros([len(LAYER)], tf.float32)
    half = [t for t in floats if t.dtype == tf.float16]
    tiny = tf.add_n([_underflow_count(t) for t in half]) if half else constant(0.0)
    if small(floats):
        return _exact_row(floats, tiny)
    magnitudes = [_magnitude(t, nonnegative) for t, nonnegative in measured]
    parts = [_healthy_part(a) for a in magnitudes]
    peak, total, size = parts[0] if len(parts) == 1 else _combined(parts)
    # Without a schedule (one per replica under tf.distribute) every step counts its zeros, on the
    # healthy path as size - sum(sign(|x|)): half the cost of `count_nonzero` (a compare, a cast, a sum).
    zeros = constant(NOT_COUNTED) if count_zeros is not None else size - tf.add_n(
        [tf.reduce_sum(tf.sign(a), all_axes(a)) for a in magnitudes])

    def healthy() -> Tensor:
        # max of an empty tensor is -inf; a |x| maximum is never below 0.
        return tf.stack(LAYER.pack({"max_abs": tf.maximum(peak, constant(0.0)), "sum_abs": total,
                                    "nonfinite": constant(0.0), "zeros": zeros, "size": size, "tiny": tiny}))

    cheap = tf.math.is_finite(total)
    if count_zeros is not None:
        cheap = tf.logical_and(cheap, tf.logical_not(count_zeros))
    return tf.cond(cheap, healthy, lambda: _exact_row(floats, tiny))


def _exact_row(floats: Sequence[Tensor], tiny: Tensor) -> Tensor:
    """The row of `tensor_stats` from `finite_stats`: statistics of the finite entries, exact counts."""
    tf, _ = tensorflow()
    size = tf.cast(tf.add_n([tf.size(t) for t in floats]), tf.float32)
    peak, total, nonfinite, zeros = finite_stats(floats)
    return tf.stack(LAYER.pack({"max_abs": peak, "sum_abs": total, "nonfinite": nonfinite, "zeros": zeros,
                                "size": size, "tiny": tiny}))


def _measured(tensor: Tensor) -> tuple[Tensor, bool]:
    """(the tensor whose statistics stand for a layer output, whether it is never negative).

    That tensor is the output itself, or for a softmax its recomputation from the logits.

    A Keras loss fed a softmax output reads the logits behind it (`from_logits` is
    implied), so the train step never runs the Softmax op; probing the output would
    make it run, and on CPU oneDNN's softmax primitive costs 70-90 us even for 128x10.
    The same function in five elementwise and reduction ops (max, subtract, exp, sum,
    divide, which is how TensorFlow's own kernel computes it) costs a few us. Its
    values agree with oneDNN's to an ulp; an entry right at float32's underflow
    threshold can come out 0 in one and not in the other. A Softmax op is always over
    the last axis.
    """
    tf, _ = tensorflow()
    if tensor.op.type != "Softmax":
        return tensor, tensor.op.type in NONNEGATIVE_OPS
    logits = tensor.op.inputs[0]
    last = constant((-1,), "int32")
    exp = tf.exp(logits - tf.reduce_max(logits, last, keepdims=True))
    return exp / tf.reduce_sum(exp, last, keepdims=True), True


def _magnitude(tensor: Tensor, nonnegative: bool) -> Tensor:
    """|x| of one float tensor, in float32; `nonnegative` skips the abs."""
    tf, _ = tensorflow()
    x = tf.cast(tensor, tf.float32)
    return x if nonnegative else tf.abs(x)


def _healthy_part(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(max, sum, size) of the magnitudes `a`, in float32."""
    tf, _ = tensorflow()
    axes = all_axes(a)
    return tf.reduce_max(a, axes), tf.reduce_sum(a, axes), tf.cast(tf.size(a), tf.float32)


def _combined(parts: Sequence[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
    tf, _ = tensorflow()
    peaks, totals, sizes = zip(*parts)
    return tf.reduce_max(tf.stack(peaks), constant((0,), "int32")), tf.add_n(totals), tf.add_n(sizes)


def _underflow_count(tensor: Tensor) -> Tensor:
    tf, _ = tensorflow()
    a = tf.abs(tf.cast(tensor, tf.float32))
    return tf.reduce_sum(tf.cast(tf.logical_and(a > 0.0, a < FLOAT16_TINY), tf.float32))


def combine_layer_rows(rows: Tensor) -> Tensor:
    """One layer row from several `[n, len(LAYER)]` (calls of one layer), each column as its Statistic combines."""
    tf, _ = tensorflow()
    combined = []
    for i, statistic in enumerate(LAYER_STATISTICS):
        column = rows[:, i]
        if statistic.combine == "max":
            combined.append(tf.reduce_max(column, axis=0))
        elif statistic.combine == "count":
            combined.append(tf.where(tf.reduce_min(column) < 0, constant(NOT_COUNTED), tf.reduce_sum(column)))
        else:
            combined.append(tf.reduce_sum(column, axis=0))
    return tf.stack(combined)


class LayerRecorder:
    """Collects per-layer output statistics while a step function is traced.

    Args:
        layers: list of keras.Layer. The layers to probe, in a stable order.

    Example:
        recorder = LayerRecorder(layers)
        with recorder.attached():
            ...  # inside the tf.function being traced:
            recorder.begin()
            y_pred = model(x, training=True)
        stats = recorder.stats_matrix()        # [len(layers), len(LAYER)]
    """

    def __init__(self, layers: Iterable[Any]) -> None:
        self.layers = list(layers)
        self._rows: dict[tuple[int, int], list[Tensor]] = {}  # (replica, layer index) -> rows of its calls
        # id(output) -> (output, its row), for layer calls with one float output
        self._single: dict[int, tuple[Tensor, Tensor]] = {}
        self.call_order: list[int] = []
        self.traced = False  # set once a step function has been traced with the probes attached
        self._graph: Any = None
        self._thread = threading.local()
        # Steps begun, for the zeros schedule. Made here, not on first use: a variable made while a tf.function
        # traces its first call makes TensorFlow trace that function a second time (`_created_variables`), which
        # doubled the tracing of every instrumented step.
        tf, _ = tensorflow()
        with tf.init_scope():
            self._steps = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="nanscope_probe_steps")

    @contextlib.contextmanager
    def attached(self) -> Iterator["LayerRecorder"]:
        """Wrap every layer's `call`; always restore them, even when tracing fails."""
        self._rows, self._single, self.call_order = {}, {}, []
        hooks = [(layer, "call", functools.partial(self._wrap, index)) for index, layer in enumerate(self.layers)]
        with overridden(hooks):
            yield self
            self.traced = True

    def begin(self) -> None:
        """Mark the graph being traced; call first thing inside the step function."""
        tf, _ = tensorflow()
        self._rows, self._single, self.call_order = {}, {}, []
        self._graph = tf.compat.v1.get_default_graph()
        self._thread.replica, self._thread.graph = 0, self._graph
        self._thread.count_zeros = self._zeros_due()

    def _zeros_due(self) -> Tensor:
        """A boolean scalar: this step counts the exact zeros (one step in ZEROS_EVERY, the first included)."""
        tf, _ = tensorflow()
        begun = self._steps.assign_add(constant(1, "int64"))
        return tf.equal(tf.math.floormod(begun - constant(1, "int64"), constant(ZEROS_EVERY, "int64")),
                        constant(0, "int64"))

    def begin_replica(self, replica: int) -> None:
        """File the calling thread's layer rows under `replica` (inside a replica function, before the forward pass)."""
        tf, _ = tensorflow()
        self._thread.replica, self._thread.graph = replica, tf.compat.v1.get_default_graph()
        self._thread.count_zeros = None  # per replica, every step: one schedule variable cannot serve all replicas
        self._rows.update({key: [] for key in self._rows if key[0] == replica})

    def _replica(self) -> Any:
        return getattr(self._thread, "replica", 0)

    def _wrap(self, index: int, call: Callable[..., Any]) -> Callable[..., Any]:
        tf, _ = tensorflow()

        def probed_call(*args: Any, **kwargs: Any) -> Any:
            outputs = call(*args, **kwargs)
            # Layers called inside a while loop (an RNN's cell) live in another graph:
            # their outputs cannot leave it, and the enclosing layer's output is probed instead.
            if tf.compat.v1.get_default_graph() is getattr(self._thread, "graph", self._graph):
                flat = [t for t in tf.nest.flatten(outputs) if tf.is_tensor(t)]
                row = self._reshaped_row(flat)
                if row is None:
                    row = tensor_stats(flat, getattr(self._thread, "count_zeros", None))
                self._rows.setdefault((self._replica(), index), []).append(row)
                floats = [t for t in flat if t.dtype.is_floating]
                if len(floats) == 1:
                    self._single[id(floats[0])] = (floats[0], row)
                if index not in self.call_order:
                    self.call_order.append(index)
            return outputs

        return probed_call

    def _reshaped_row(self, flat: list[Tensor]) -> Tensor | None:
        """The row already taken of the tensor that `flat`'s only output reshapes (a Flatten), or None.

        A reshape keeps every value, so its statistics are its input's: reducing it again
        would only cost another pass over the output.
        """
        if len(flat) != 1 or flat[0].op.type not in RESHAPING_OPS or not flat[0].op.inputs:
            return None
        seen = self._single.get(id(flat[0].op.inputs[0]))
        return seen[1] if seen is not None and seen[0] is flat[0].op.inputs[0] else None

    def nonfinite_count(self, tensor: Tensor) -> Tensor | None:
        """The non-finite count a probe already took of `tensor` (a layer call's only float output), or None."""
        seen = self._single.get(id(tensor))
        if seen is None or seen[0] is not tensor:
            return None
        return seen[1][LAYER.at("nonfinite")]

    def stats_matrix(self) -> Tensor:
        """[len(layers), len(LAYER)] float32: one row of `tensor_stats` per layer (0 if never called).

        A layer called more than once gets the max of its calls' max |x| and the sum of
        their other columns. The rows are the calling thread's replica's (see `begin_replica`).
        """
        tf, _ = tensorflow()
        rows = []
        replica = self._replica()
        for index in range(len(self.layers)):
            calls = self._rows.get((replica, index))
            if not calls:
                rows.append(tf.zeros([len(LAYER)], tf.float32))
            elif len(calls) == 1:
                rows.append(calls[0])
            else:
                rows.append(combine_layer_rows(tf.stack(calls)))
        return tf.stack(rows) if rows else tf.zeros([0, len(LAYER)], tf.float32)
