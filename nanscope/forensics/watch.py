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
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from nanscope.forensics.events import (
    SECOND_OPERAND,
    SELECT_OPS,
    ForwardOp,
    OpEvent,
    where_trap,
    all_finite,
    exponent_stats,
    flat_tensors,
    introduces_nonfinite,
    is_float_tensor,
    operand_stats,
)
from nanscope.forensics.functions import InnerOp, is_function_call, localize_in_function
from nanscope.forensics.masks import masked_rows
from nanscope.forensics.sources import keras_loss_source, library_dirs, user_source
from nanscope.internals import differentiated_op, op_callback, overridden
from nanscope.tf_types import Tensor


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

    def __init__(self, layers: Iterable[Any]) -> None:
        self.layers = list(layers)
        self.phase = "forward"
        self.events: list[OpEvent] = []
        self._reached: set[int] = set()  # ids of the events whose values reached a result
        self._origin: dict[int, OpEvent] = {}  # by id of a non-finite tensor, the event that made it
        self._late: OpEvent | None = None
        self._stack: list[Any] = []  # the Keras layers running, outermost first
        self._forward: dict[int, ForwardOp] = {}  # by id of a tensor, the forward op that made it
        self._ops: list[ForwardOp] = []
        self._busy = False
        self._library_dirs = library_dirs()

    @property
    def first(self) -> OpEvent | None:
        """The producing OpEvent, or None while nothing non-finite reached a result."""
        reached = [event for event in self.events if id(event) in self._reached]
        made = [event for event in reached if event.introduced]
        if made or reached:
            return (made or reached)[0]
        return self._late

    def settle(self, results: Any, loss: bool = False) -> None:
        """Mark the events whose values reached `results` (a layer output, the model output, the loss).

        With `loss`, `results` is the loss: an event whose values reached it says so in its context
        (`reached_loss`), so that no line claims a tf.where threw those values away.
        """
        for tensor in flat_tensors(results):
            event = self._origin.get(id(tensor))
            if event is not None:
                self._reached.add(id(event))
                if loss:
                    event.context["reached_loss"] = True

    @contextlib.contextmanager
    def attached(self) -> Iterator["OpWatch"]:
        """Register the op callback and wrap the layers; always undo both."""
        with op_callback(self._callback), overridden(
                [(layer, "call", functools.partial(self._wrap, layer)) for layer in self.layers]):
            yield self

    def _wrap(self, layer: Any, call: Callable[..., Any]) -> Callable[..., Any]:
        def watched_call(*args: Any, **kwargs: Any) -> Any:
            self._stack.append(layer)
            try:
                result = call(*args, **kwargs)
            finally:
                self._stack.pop()
            self.settle(result)
            return result

        return watched_call

    def _callback(self, op_type: str, inputs: Any, attrs: Any, outputs: Any, op_name: str | None = None,
                  graph: Any = None) -> None:
        del attrs, op_name  # Unused
        if graph is not None or self._busy or self._late is not None:
            return None
        if isinstance(op_type, bytes):  # TF's eager fast path names some ops in bytes (Mean, Reshape)
            op_type = op_type.decode()
        self._busy = True
        try:
            self._observe(op_type, list(inputs or ()), [t for t in (outputs or ()) if hasattr(t, "numpy")])
        finally:
            self._busy = False
        return None

    def _observe(self, op_type: str, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        if self.phase in ("forward", "loss"):
            self._observe_forward(op_type, inputs, outputs)
        elif not all_finite(outputs):
            self._late = self._event(op_type, inputs, outputs)

    def _observe_forward(self, op_type: str, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        record = self._remember_forward(op_type, inputs, outputs)
        origins = [self._origin[id(t)] for t in inputs if id(t) in self._origin]
        if op_type in SELECT_OPS:
            self._note_discards(record, inputs, origins, outputs)
        bad = [t for t in outputs if not all_finite([t])]
        if not bad:
            return
        # A value an earlier op made stays that op's (log(0) = -inf, then 0 * -inf = NaN: the Log made it);
        # only an operand no op made from finite values (an intended -inf fill) hands the blame on.
        made = next((event for event in origins if event.introduced), None)
        introduced = made is None and introduces_nonfinite(inputs, outputs)
        if made is None and (introduced or not origins):
            event = self._event(op_type, inputs, outputs)
            event.introduced = introduced
            record.event = event
            self.events.append(event)
        else:
            event = made or origins[0]
        for tensor in bad:
            self._origin[id(tensor)] = event

    def _note_discards(self, select: ForwardOp, inputs: list[Tensor], origins: list[OpEvent],
                       outputs: list[Tensor]) -> None:
        """A tf.where's branches: the ops whose values it threw away, where the gradient trap lies."""
        where = {"op": select.op, "source": select.source}
        for tensor in inputs[1:]:
            producer = self._forward.get(id(tensor))
            if producer is not None and producer.discarded_by is None:
                producer.discarded_by = where
        if all_finite(outputs):
            for event in origins:
                event.context.setdefault("discarded_by", where)

    def _remember_forward(self, op_type: str, inputs: list[Tensor], outputs: list[Tensor]) -> ForwardOp:
        layer = self._stack[-1] if self._stack else None
        record = ForwardOp(op_type, self.phase, layer, self.source(), inputs, outputs)
        self._ops.append(record)
        for output in outputs:
            self._forward[id(output)] = record
        return record

    def producer_of(self, tensor: Tensor) -> ForwardOp | None:
        """The ForwardOp that made `tensor` in the forward pass or the loss, or None."""
        return self._forward.get(id(tensor))

    def _event(self, op_type: str, inputs: list[Tensor], outputs: list[Tensor]) -> OpEvent:
        if is_function_call(op_type):
            inner = localize_in_function(op_type, inputs)
            if inner is not None:
                return self._function_event(op_type, inner, outputs)
        if self.phase == "backward":
            return self._gradient_event(op_type, outputs)
        layer = self._stack[-1] if self._stack else None
        index = 1 if op_type in SECOND_OPERAND and len(inputs) > 1 else 0
        floats = [t for t in inputs if is_float_tensor(t) and hasattr(t, "numpy")]
        operand = (inputs[index] if index < len(inputs) and is_float_tensor(inputs[index])
                   else (floats[0] if floats else None))
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

    def _function_event(self, op_type: str, inner: InnerOp, outputs: list[Tensor]) -> OpEvent:
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

    def _gradient_event(self, op_type: str, outputs: list[Tensor]) -> OpEvent:
        forward_op, forward_inputs, forward_outputs = differentiated_op(sys._getframe(0))
        event = OpEvent(op=op_type, phase="backward", forward_op=forward_op,
                        dtype=outputs[0].dtype.name if outputs else "float32")
        known = self._differentiated_record(forward_op, forward_inputs, forward_outputs)
        if known is not None:
            forward_inputs = [t for t in forward_inputs if t is not None] or known.inputs
            event.layer = known.layer.name if known.layer is not None else None
            event.layer_class = type(known.layer).__name__ if known.layer is not None else None
            event.source, event.forward_phase = known.source, known.phase
            event.context.update(where_trap(known))
        index = 1 if forward_op in SECOND_OPERAND and len(forward_inputs) > 1 else 0
        if index < len(forward_inputs) and is_float_tensor(forward_inputs[index]):
            event.inputs = {**operand_stats(forward_inputs[index].numpy()),
                            **exponent_stats(forward_op, forward_inputs)}
            # index 1 only for an op in SECOND_OPERAND, which names no None
            event.operand = SECOND_OPERAND[forward_op] if index == 1 and forward_op is not None else "input"
        return event

    def _differentiated_record(self, forward_op: str | None, forward_inputs: list[Tensor],
                               forward_outputs: list[Tensor]) -> ForwardOp | None:
        """The forward op being differentiated: by its outputs, else by its inputs, else the first of its type."""
        known = next((self._forward[id(t)] for t in forward_outputs if id(t) in self._forward), None)
        if known is not None or forward_op is None:
            return known
        wanted = [id(t) for t in forward_inputs if t is not None]
        same_type = [r for r in self._ops if r.op == forward_op]
        by_inputs = next((r for r in same_type if wanted and [id(t) for t in r.inputs] == wanted), None)
        return by_inputs or next(iter(same_type), None)

    def source(self) -> str | None:
        """The user line behind the op running now; in the loss, a Keras loss's own line when no user line is found."""
        found = self.user_source()
        if found is None and self.phase == "loss":
            found = keras_loss_source()
        return found

    def user_source(self) -> str | None:
        """`file:line` of the innermost user frame below nanscope's own replay frames, or None."""
        return user_source(self._library_dirs)
