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
import threading

from nanscope.runtime import tensorflow

# Columns of a layer-stats row, in order.
LAYER_COLUMNS = ("max_abs", "sum_abs", "nonfinite", "zeros", "size", "tiny")
# Smallest normal float16 (numpy.finfo(float16).tiny): non-zero magnitudes below it
# are subnormal and lose precision, and they flush to 0 a little further down.
FLOAT16_TINY = 6.103515625e-05


def tensor_stats(tensors):
    """[max |x|, sum |x|, non-finite count, exact zeros, size, float16 underflows] over float tensors, as float32.

    The last column counts non-zero magnitudes below float16's smallest normal, and
    is computed only for float16 tensors (0 otherwise).

    The healthy path costs an abs, a sign and three reductions: zeros are counted as
    size - sum(sign(|x|)), which is half the cost of `count_nonzero` (a compare, a
    cast to int64 and a sum). The exact non-finite count and the finite-only statistics
    are computed only when the sum is not finite.
    """
    tf, _ = tensorflow()
    floats = [t for t in tensors if t.dtype.is_floating]
    half = [t for t in floats if t.dtype == tf.float16]
    flat = [tf.reshape(tf.cast(t, tf.float32), [-1]) for t in floats]
    if not flat:
        return tf.zeros([len(LAYER_COLUMNS)], tf.float32)
    x = flat[0] if len(flat) == 1 else tf.concat(flat, axis=0)
    size = tf.cast(tf.size(x), tf.float32)
    a = tf.abs(x)
    total = tf.reduce_sum(a)

    def healthy():
        return tf.stack([_safe_max(a), total, 0.0, size - tf.reduce_sum(tf.sign(a))])

    def unhealthy():
        finite = tf.math.is_finite(x)
        a_finite = tf.where(finite, a, tf.zeros_like(a))
        nonfinite = size - tf.reduce_sum(tf.cast(finite, tf.float32))
        zeros = tf.reduce_sum(tf.cast(tf.equal(x, 0.0), tf.float32))
        return tf.stack([_safe_max(a_finite), tf.reduce_sum(a_finite), nonfinite, zeros])

    head = tf.cond(tf.math.is_finite(total), healthy, unhealthy)
    tiny = tf.add_n([_underflow_count(t) for t in half]) if half else tf.constant(0.0)
    return tf.concat([head, tf.stack([size, tiny])], axis=0)


def _underflow_count(tensor):
    tf, _ = tensorflow()
    a = tf.abs(tf.cast(tensor, tf.float32))
    return tf.reduce_sum(tf.cast(tf.logical_and(a > 0.0, a < FLOAT16_TINY), tf.float32))


def _safe_max(a):
    tf, _ = tensorflow()
    # max of an empty tensor is -inf; a |x| maximum is never below 0.
    return tf.maximum(tf.reduce_max(a), 0.0)


def nonfinite_count(tensor):
    """Number of non-finite entries of a tensor (0 for integer tensors), as float32."""
    tf, _ = tensorflow()
    tensor = tf.convert_to_tensor(tensor)
    if not tensor.dtype.is_floating:
        return tf.constant(0.0)
    return tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(tensor)), tf.float32))


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
        stats = recorder.stats_matrix()        # [len(layers), len(LAYER_COLUMNS)]
    """

    def __init__(self, layers):
        self.layers = list(layers)
        self._rows = {}
        self.call_order = []
        self.traced = False  # set once a step function has been traced with the probes attached
        self._graph = None
        self._thread = threading.local()

    @contextlib.contextmanager
    def attached(self):
        """Wrap every layer's `call`; always restore them, even when tracing fails."""
        self._rows, self.call_order = {}, []
        saved = []
        try:
            for index, layer in enumerate(self.layers):
                saved.append((layer, layer.__dict__.get("call")))
                object.__setattr__(layer, "call", self._wrap(index, layer.call))
            yield self
            self.traced = True
        finally:
            for layer, previous in saved:
                if previous is None:
                    object.__delattr__(layer, "call")
                else:
                    object.__setattr__(layer, "call", previous)

    def begin(self):
        """Mark the graph being traced; call first thing inside the step function."""
        tf, _ = tensorflow()
        self._rows, self.call_order = {}, []
        self._graph = tf.compat.v1.get_default_graph()
        self._thread.replica, self._thread.graph = 0, self._graph

    def begin_replica(self, replica):
        """File the calling thread's layer rows under `replica` (inside a replica function, before the forward pass)."""
        tf, _ = tensorflow()
        self._thread.replica, self._thread.graph = replica, tf.compat.v1.get_default_graph()
        self._rows.update({key: [] for key in self._rows if key[0] == replica})

    def _replica(self):
        return getattr(self._thread, "replica", 0)

    def _wrap(self, index, call):
        tf, _ = tensorflow()

        def probed_call(*args, **kwargs):
            outputs = call(*args, **kwargs)
            # Layers called inside a while loop (an RNN's cell) live in another graph:
            # their outputs cannot leave it, and the enclosing layer's output is probed instead.
            if tf.compat.v1.get_default_graph() is getattr(self._thread, "graph", self._graph):
                flat = [t for t in tf.nest.flatten(outputs) if tf.is_tensor(t)]
                self._rows.setdefault((self._replica(), index), []).append(tensor_stats(flat))
                if index not in self.call_order:
                    self.call_order.append(index)
            return outputs

        return probed_call

    def stats_matrix(self):
        """[len(layers), len(LAYER_COLUMNS)] float32: one row of `tensor_stats` per layer (0 if never called).

        The rows are the calling thread's replica's (see `begin_replica`).
        """
        tf, _ = tensorflow()
        rows = []
        replica = self._replica()
        for index in range(len(self.layers)):
            calls = self._rows.get((replica, index))
            if not calls:
                rows.append(tf.zeros([len(LAYER_COLUMNS)], tf.float32))
                continue
            stacked = tf.stack(calls)
            rows.append(tf.concat([tf.reduce_max(stacked[:, :1], axis=0), tf.reduce_sum(stacked[:, 1:], axis=0)], 0))
        return tf.stack(rows) if rows else tf.zeros([0, len(LAYER_COLUMNS)], tf.float32)
