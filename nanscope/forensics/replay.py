"""Replay one train step eagerly, op by op, to find the op that produced the first NaN/Inf.

The compiled step says *that* a phase went non-finite; the replay says *which op*,
in *which layer*, created by *which line*, fed *what*. It runs the same forward,
loss, backward and update as `InstrumentedStep`, eagerly, under an `OpWatch`. It
is slow and only ever runs for the one step that went wrong.
"""

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from nanscope.engine.model_view import probed_layers
from nanscope.forensics.random_state import random_state_kept
from nanscope.forensics.events import OpEvent
from nanscope.forensics.watch import OpWatch
from nanscope.runtime import tensorflow
from nanscope.tf_types import GradTransform, Optimizer

if TYPE_CHECKING:
    from nanscope.engine.step import InstrumentedStep
    from nanscope.model.models import LoadedModel



class _First(Protocol):
    """Where the first non-finite value appeared, as the replay fills it in (report.model.FirstNonfinite, a layer
    up)."""

    layer: str | None
    layer_class: str | None
    loss: str | None
    op: str | None
    source: str | None
    inputs: dict[str, Any] | None
    context: dict[str, Any]
    detail: list[Any]


First = TypeVar("First", bound=_First)


@dataclass
class Localization:
    """What a forensic replay found.

    Args:
        event: OpEvent or None. The producing op (None: the replay stayed finite).
        seconds: float. How long the replay took.
        state_before: list of np.ndarray. Model and optimizer state before the step (see `state_variables`).
    """

    event: OpEvent | None
    seconds: float
    state_before: list[np.ndarray] | None = None


def replay_step(model: "LoadedModel", loss: Any, optimizer: Optimizer, x: Any, y: Any,
                grad_transform: GradTransform | None = None) -> Localization:
    """Run one train step eagerly under an OpWatch and return the Localization.

    The model and optimizer state change as in a real step; callers that need the
    state back restore it themselves (see `localize_step`).

    Args:
        model: LoadedModel.
        loss: losses.Loss.
        optimizer: keras.Optimizer, built on the model's trainable variables.
        x, y: np.ndarray. The batch (y: a tuple of arrays for a multi-output model; x: one array per input
            for a model with several).
        grad_transform: callable(list of grads) -> list of grads, optional.
    """
    tf, _ = tensorflow()
    started = time.perf_counter()
    x, y = (tf.nest.map_structure(tf.convert_to_tensor, part) for part in (x, y))
    trainable = list(model.keras_model.trainable_variables if model.keras_model is not None
                     else model.trainable_variables)
    watch = OpWatch(probed_layers(model.keras_model))
    with watch.attached():
        _run_phases(watch, model, loss, optimizer, trainable, x, y, grad_transform)
    event = watch.first
    if event is None and not all(np.isfinite(v.numpy()).all() for v in trainable):
        event = OpEvent(op=None, phase="update")
    return Localization(event, time.perf_counter() - started)


def _run_phases(watch: OpWatch, model: "LoadedModel", loss: Any, optimizer: Optimizer, trainable: list[Any], x: Any,
                y: Any, grad_transform: GradTransform | None) -> None:
    tf, _ = tensorflow()
    with tf.GradientTape() as tape:
        watch.phase = "forward"
        y_pred = model.call(x, training=True)
        watch.phase = "loss"
        total = loss.total(loss.terms(y, y_pred))
        extra = list(model.keras_model.losses) if model.keras_model is not None else []
        if extra:
            total = total + tf.add_n([tf.cast(tf.reduce_sum(t), tf.float32) for t in extra])
        watch.settle(y_pred)
        watch.settle(total, loss=True)
    if watch.first is not None:
        return
    watch.phase = "backward"
    grads = tape.gradient(total, trainable)
    if watch.first is not None:
        return
    grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, trainable)]
    watch.phase = "update"
    applied = grad_transform(grads) if grad_transform is not None else grads
    optimizer.apply_gradients(zip(applied, trainable))


def state_variables(model: "LoadedModel", optimizer: Optimizer) -> list[Any]:
    """Every variable a step changes: the model's (trainable and not) and the optimizer's."""
    own = list(model.keras_model.variables) if model.keras_model is not None else list(model.variables)
    return own + list(optimizer.variables)


def localize_step(engine: "InstrumentedStep", x: Any, y: Any) -> Localization:
    """Replay the engine's last step from the state before it; leave the state as after the step.

    Args:
        engine: InstrumentedStep that has just run the step to explain.
        x, y: np.ndarray. That step's batch.
    """
    variables = state_variables(engine.model, engine.optimizer)
    after = [v.numpy() for v in variables]
    engine.state.restore()
    before = [v.numpy() for v in variables]
    try:
        with random_state_kept():
            found = replay_step(engine.model, engine.loss, engine.optimizer, x, y, engine.grad_transform)
        found.state_before = before
        return found
    finally:
        for variable, value in zip(variables, after):
            variable.assign(value)


def describe_event(first: First, event: OpEvent | None, record_phase: str | None = None,
                   loss_name: str | None = None) -> First:
    """Fill a FirstNonfinite with what the replay found about the producing op.

    An op of the loss (or the gradient of one) belongs to no layer: `first.layer` is then
    None and `first.loss` names the loss (`loss_name`, e.g. "mse"), whatever layer the
    compiled step's per-variable attribution pointed at.
    """
    if event is None:
        first.detail.append("the eager replay of this step stayed finite: the value was a reduction nanscope took "
                            "(e.g. the gradient norm overflowing) or came from a non-deterministic op (dropout)")
        return first
    if "loss" in (event.phase, event.forward_phase):
        first.layer, first.layer_class, first.loss = None, None, loss_name or "the loss"
        named = f"the loss {loss_name}" if loss_name and loss_name != "the loss" else "the loss"
        first.detail.append(f"{event.forward_op or event.op} is part of {named}, outside any layer")
    elif event.layer is not None:
        first.layer, first.layer_class = event.layer, event.layer_class
    first.op, first.source = event.op, event.source
    if event.inputs:
        described = {"op": event.forward_op or event.op, "operand": event.operand, "dtype": event.dtype}
        first.inputs = {**described, **event.inputs}
    first.context = dict(event.context)
    if event.forward_op:
        first.detail.append(f"backward pass: {event.op} is the gradient of {event.forward_op}")
    first.detail.extend(_context_lines(event))
    if record_phase is not None and event.phase != record_phase:
        first.detail.append(f"the eager replay first went non-finite in phase {event.phase}, "
                            f"the compiled step in {record_phase}")
    return first


def _context_lines(event: OpEvent) -> list[str]:
    context, lines = event.context, list[str]()
    if "masked_rows" in context:
        lines.append(f"{context['masked_rows']} of {context['softmax_rows']} softmax rows are masked at every "
                     f"position (batch rows {_listed(context['batch_rows'])})")
    where = context.get("discarded_by")
    if where is not None:
        at = f" at {where['source']}" if where.get("source") else ""
        op = event.forward_op or event.op
        if context.get("reached_loss"):
            lines.append(f"the non-finite values of {op} reached the loss; a tf.where ({where['op']}{at}) "
                         "dropped only those that came to it")
        else:
            thrown = f" ({context['forward_nonfinite']} non-finite)" if context.get("forward_nonfinite") else ""
            lines.append(f"a tf.where ({where['op']}{at}) threw away the forward value of {op}{thrown}")
    function = context.get("function")
    if function is not None:
        lines.append(f"inside the function call {function['call']}: node {function['node']} "
                     f"({event.op}) of {' -> '.join(function['functions'])}, inputs {', '.join(function['inputs'])}")
    if not event.introduced:
        lines.append(f"{event.op} passed on a non-finite operand it was given; no op made the value from finite ones")
    return lines


def _listed(values: list[Any], shown: int = 8) -> str:
    return ", ".join(map(str, values[:shown])) + (" ..." if len(values) > shown else "")


def state_before_step(engine: "InstrumentedStep") -> list[np.ndarray]:
    """numpy copies of the model and optimizer state before the engine's last step; the state is left as after it."""
    variables = state_variables(engine.model, engine.optimizer)
    after = [v.numpy() for v in variables]
    engine.state.restore()
    try:
        return [v.numpy() for v in variables]
    finally:
        for variable, value in zip(variables, after):
            variable.assign(value)
