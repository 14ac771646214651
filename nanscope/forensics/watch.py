"""Op-level watch of an eager replay: the op that produced the first non-finite value.

`OpWatch` registers a TensorFlow op callback (the hook `tf.debugging.enable_check_numerics`
is built on) and wraps every Keras layer's `call` to know which layer is running.
Every op executed eagerly while it is attached is checked with numpy (no TF op,
so the callback never re-enters itself). The producer is the op that turned finite
values into non-finite ones (or -inf into NaN, as a softmax over a fully masked row
does) and whose values went on to a result; a value a `tf.where` threw away is
remembered, not blamed. For a gradient op the forward op it differentiates is found
from TensorFlow's `_gradient_function` frame, and the forward op's layer and source
line are looked up from the forward pass. Everything is detached in `finally`; the
model keeps nothing.
"""

import contextlib
import functools
import sys
from dataclasses import dataclass, field

import numpy as np

from nanscope.forensics.functions import is_function_call, localize_in_function
from nanscope.forensics.masks import masked_rows
from nanscope.forensics.sources import keras_loss_source, library_dirs, user_source
from nanscope.internals import differentiated_op, op_callback, overridden
from nanscope.runtime import tensorflow

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

    op: str
    phase: str
    forward_op: str | None = None
    layer: str | None = None
    layer_class: str | None = None
    source: str | None = None
    inputs: dict = field(default_factory=dict)
    operand: str = "input"
    dtype: str = "float32"
    introduced: bool = True
    forward_phase: str | None = None
    context: dict = field(default_factory=dict)


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
    layer: object
    source: str | None
    inputs: list
    outputs: list
    event: OpEvent | None = None
    discarded_by: dict | None = None


def operand_stats(value):
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


def exponent_stats(op, operands):
    """{"exponent_min", "exponent_max"} of a Pow's exponent (a float array or tensor), else {}."""
    if op not in EXPONENT_OPS or len(operands) < 2 or operands[1] is None:
        return {}
    value = operands[1].numpy() if hasattr(operands[1], "numpy") else operands[1]
    stats = operand_stats(value)
    return {"exponent_min": stats["min"], "exponent_max": stats["max"]} if stats else {}


def _introduces(inputs, outputs):
    """Whether an op made non-finite values its operands did not hold: NaN from no NaN, or Inf from finite values."""
    operands = [t.numpy() for t in inputs if _is_float(t) and hasattr(t, "numpy")]
    results = [t.numpy() for t in outputs if _is_float(t)]
    if any(np.isnan(r).any() for r in results) and not any(np.isnan(o).any() for o in operands):
        return True
    return all(np.isfinite(o).all() for o in operands)


def _trap(record):
    """The tf.where gradient trap: the where that threw away the forward value of the op being differentiated."""
    where = record.discarded_by or (record.event.context.get("discarded_by") if record.event is not None else None)
    if where is None:
        return {}
    nonfinite = sum(int(np.size(t.numpy()) - np.isfinite(t.numpy()).sum()) for t in record.outputs if _is_float(t))
    return {"discarded_by": where, "forward_nonfinite": nonfinite}


def _flat(results):
    tf, _ = tensorflow()
    return [t for t in tf.nest.flatten(results) if hasattr(t, "numpy")]


def _is_float(tensor):
    dtype = getattr(tensor, "dtype", None)
    return dtype is not None and getattr(dtype, "is_floating", False)


def _all_finite(tensors):
    for tensor in tensors:
        if _is_float(tensor) and hasattr(tensor, "numpy") and not np.isfinite(tensor.numpy()).all():
            return False
    return True


class OpWatch:
    """Watches eager ops for the op that produced a non-finite value, and attributes it.

    In the forward pass and the loss every op is followed: an op that makes non-finite
    values its operands did not hold (NaN from no NaN, Inf from finite values) is a
    candidate producer, and the values it made are followed through the ops that pass
    them on. A candidate whose values reach a layer output, the model output or the loss
    is a producer; one whose values a `tf.where` threw away is not, and is remembered
    for the gradient it may still poison. An op that only passes on a non-finite operand
    (an intended -inf mask fill) ranks below one that made the value. In the backward
    pass and the update the first op with a non-finite output is the producer.

    Args:
        layers: list of keras.Layer. The layers whose calls mark which layer is running.

    Example:
        watch = OpWatch(layers)
        with watch.attached():
            watch.phase = "forward"
            y_pred = model(x, training=True)
            watch.settle([y_pred])
        watch.first  # OpEvent or None
    """

    def __init__(self, layers):
        self.layers = list(layers)
        self.phase = "forward"
        self.events = []
        self._reached = set()
        self._origin = {}
        self._late = None
        self._stack = []
        self._forward = {}
        self._ops = []
        self._busy = False
        self._library_dirs = library_dirs()

    @property
    def first(self):
        """The producing OpEvent, or None while nothing non-finite reached a result."""
        reached = [event for event in self.events if id(event) in self._reached]
        made = [event for event in reached if event.introduced]
        if made or reached:
            return (made or reached)[0]
        return self._late

    def settle(self, results, loss=False):
        """Mark the events whose values reached `results` (a layer output, the model output, the loss).

        With `loss`, `results` is the loss: an event whose values reached it says so in its context
        (`reached_loss`), so that no line claims a tf.where threw those values away.
        """
        for tensor in _flat(results):
            event = self._origin.get(id(tensor))
            if event is not None:
                self._reached.add(id(event))
                if loss:
                    event.context["reached_loss"] = True

    @contextlib.contextmanager
    def attached(self):
        """Register the op callback and wrap the layers; always undo both."""
        with op_callback(self._callback), overridden(
                [(layer, "call", functools.partial(self._wrap, layer)) for layer in self.layers]):
            yield self

    def _wrap(self, layer, call):
        def watched_call(*args, **kwargs):
            self._stack.append(layer)
            try:
                result = call(*args, **kwargs)
            finally:
                self._stack.pop()
            self.settle(result)
            return result

        return watched_call

    def _callback(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        del attrs, op_name  # Unused
        if graph is not None or self._busy or self._late is not None:
            return None
        self._busy = True
        try:
            self._observe(op_type, list(inputs or ()), [t for t in (outputs or ()) if hasattr(t, "numpy")])
        finally:
            self._busy = False
        return None

    def _observe(self, op_type, inputs, outputs):
        if self.phase in ("forward", "loss"):
            self._observe_forward(op_type, inputs, outputs)
        elif not _all_finite(outputs):
            self._late = self._event(op_type, inputs, outputs)

    def _observe_forward(self, op_type, inputs, outputs):
        record = self._remember_forward(op_type, inputs, outputs)
        origins = [self._origin[id(t)] for t in inputs if id(t) in self._origin]
        if op_type in SELECT_OPS:
            self._note_discards(record, inputs, origins, outputs)
        bad = [t for t in outputs if not _all_finite([t])]
        if not bad:
            return
        # A value an earlier op made stays that op's (log(0) = -inf, then 0 * -inf = NaN: the Log made it);
        # only an operand no op made from finite values (an intended -inf fill) hands the blame on.
        made = next((event for event in origins if event.introduced), None)
        introduced = made is None and _introduces(inputs, outputs)
        if made is None and (introduced or not origins):
            event = self._event(op_type, inputs, outputs)
            event.introduced = introduced
            record.event = event
            self.events.append(event)
        else:
            event = made or origins[0]
        for tensor in bad:
            self._origin[id(tensor)] = event

    def _note_discards(self, select, inputs, origins, outputs):
        """A tf.where's branches: the ops whose values it threw away, where the gradient trap lies."""
        where = {"op": select.op, "source": select.source}
        for tensor in inputs[1:]:
            producer = self._forward.get(id(tensor))
            if producer is not None and producer.discarded_by is None:
                producer.discarded_by = where
        if _all_finite(outputs):
            for event in origins:
                event.context.setdefault("discarded_by", where)

    def _remember_forward(self, op_type, inputs, outputs):
        layer = self._stack[-1] if self._stack else None
        record = ForwardOp(op_type, self.phase, layer, self.source(), inputs, outputs)
        self._ops.append(record)
        for output in outputs:
            self._forward[id(output)] = record
        return record

    def producer_of(self, tensor):
        """The ForwardOp that made `tensor` in the forward pass or the loss, or None."""
        return self._forward.get(id(tensor))

    def _event(self, op_type, inputs, outputs):
        if is_function_call(op_type):
            inner = localize_in_function(op_type, inputs)
            if inner is not None:
                return self._function_event(op_type, inner, outputs)
        if self.phase == "backward":
            return self._gradient_event(op_type, outputs)
        layer = self._stack[-1] if self._stack else None
        index = 1 if op_type in SECOND_OPERAND and len(inputs) > 1 else 0
        floats = [t for t in inputs if _is_float(t) and hasattr(t, "numpy")]
        operand = inputs[index] if index < len(inputs) and _is_float(inputs[index]) else (floats[0] if floats else None)
        event = OpEvent(
            op=op_type, phase=self.phase, layer=layer.name if layer is not None else None,
            layer_class=type(layer).__name__ if layer is not None else None, source=self.source(),
            inputs=operand_stats(operand.numpy()) if operand is not None else {},
            operand=SECOND_OPERAND[op_type] if index == 1 and operand is inputs[index] else "input",
            dtype=outputs[0].dtype.name if outputs else "float32",
        )
        if event.inputs:
            event.inputs.update(exponent_stats(op_type, inputs))
        if self.phase in ("forward", "loss"):
            event.context.update(masked_rows(op_type, inputs, outputs, self.producer_of))
        return event

    def _function_event(self, op_type, inner, outputs):
        """The op inside a function call (a SavedModel's restored function) that made the value."""
        index = 1 if inner.op in SECOND_OPERAND and len(inner.operands) > 1 else 0
        operand = inner.operands[index] if index < len(inner.operands) else None
        layer = self._stack[-1] if self._stack else None
        event = OpEvent(op=inner.op, phase=self.phase, layer=layer.name if layer is not None else None,
                        layer_class=type(layer).__name__ if layer is not None else None, source=self.source(),
                        inputs=operand_stats(operand) if operand is not None else {},
                        operand=SECOND_OPERAND[inner.op] if index == 1 else "input",
                        dtype=outputs[0].dtype.name if outputs else "float32")
        if event.inputs:
            event.inputs.update(exponent_stats(inner.op, inner.operands))
        event.context["function"] = {"call": op_type, "functions": inner.functions, "node": inner.node,
                                     "inputs": inner.inputs}
        if self.phase == "backward" and inner.op.endswith("Grad"):
            event.forward_op = inner.op[: -len("Grad")]  # SqrtGrad differentiates Sqrt, RsqrtGrad Rsqrt
        return event

    def _gradient_event(self, op_type, outputs):
        forward_op, forward_inputs, forward_outputs = differentiated_op(sys._getframe(0))
        event = OpEvent(op=op_type, phase="backward", forward_op=forward_op,
                        dtype=outputs[0].dtype.name if outputs else "float32")
        known = self._differentiated_record(forward_op, forward_inputs, forward_outputs)
        if known is not None:
            forward_inputs = [t for t in forward_inputs if t is not None] or known.inputs
            event.layer = known.layer.name if known.layer is not None else None
            event.layer_class = type(known.layer).__name__ if known.layer is not None else None
            event.source, event.forward_phase = known.source, known.phase
            event.context.update(_trap(known))
        index = 1 if forward_op in SECOND_OPERAND and len(forward_inputs) > 1 else 0
        if index < len(forward_inputs) and _is_float(forward_inputs[index]):
            event.inputs = {**operand_stats(forward_inputs[index].numpy()),
                            **exponent_stats(forward_op, forward_inputs)}
            event.operand = SECOND_OPERAND[forward_op] if index == 1 else "input"
        return event

    def _differentiated_record(self, forward_op, forward_inputs, forward_outputs):
        """The forward op being differentiated: by its outputs, else by its inputs, else the first of its type."""
        known = next((self._forward[id(t)] for t in forward_outputs if id(t) in self._forward), None)
        if known is not None or forward_op is None:
            return known
        wanted = [id(t) for t in forward_inputs if t is not None]
        same_type = [r for r in self._ops if r.op == forward_op]
        by_inputs = next((r for r in same_type if wanted and [id(t) for t in r.inputs] == wanted), None)
        return by_inputs or next(iter(same_type), None)

    def source(self):
        """The user line behind the op running now; in the loss, a Keras loss's own line when no user line is found."""
        found = self.user_source()
        if found is None and self.phase == "loss":
            found = keras_loss_source()
        return found

    def user_source(self):
        """`file:line` of the innermost user frame below nanscope's own replay frames, or None."""
        return user_source(self._library_dirs)
