"""Replay one step of a guest's training (`model.fit`, a custom loop) eagerly, op by op.

trace-steps replays a step it composed itself (`replay.replay_step`). Inside `fit` or a
user's own loop the step is the user's function (Keras' `train_step`, an override, or a
`tf.function` body): `replay_call` runs that Python function eagerly under the same
`OpWatch`, and tells the watch which phase is running from the calls it makes: a
model's call is the forward pass, what follows outside the model is the loss,
`GradientTape.gradient` is the backward pass and an optimizer's `apply` is the update.
Every hook is removed in `finally`.
"""

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from nanscope.forensics.replay import Localization
from nanscope.forensics.events import OpEvent
from nanscope.forensics.watch import OpWatch
from nanscope.internals import overridden
from nanscope.runtime import tensorflow


def replay_call(function: Callable[..., Any], args: tuple[Any, ...], layers: Sequence[Any], models: Sequence[Any],
                optimizers: Sequence[Any], trainable: Sequence[Any]) -> Localization:
    """Run `function(*args)` eagerly under an OpWatch; the Localization of its first non-finite op.

    The state changes as in the real step; the caller restores it (`GuestReplay`).

    Args:
        function: the step's Python function (not a compiled tf.function).
        args: tuple. Its arguments (eager tensors).
        layers: list of keras.Layer. Layers whose calls name the running layer.
        models, optimizers: lists. Their calls and `apply` mark the phases.
        trainable: list of variables. A replay that stays finite but leaves one of them non-finite is an update event.
    """
    started = time.perf_counter()
    watch = OpWatch(layers)
    with watch.attached(), _phases(watch, models, optimizers):
        # Outside every model call the step is computing its loss: a model's call marks the forward pass
        # (a model called inside another stays in it) and hands back to the loss when it returns.
        watch.phase = "loss"
        watch.settle(function(*args))
    event = watch.first
    if event is None and not all(np.isfinite(v.numpy()).all() for v in trainable):
        event = OpEvent(op=None, phase="update")
    return Localization(event, time.perf_counter() - started)


@contextlib.contextmanager
def _phases(watch: OpWatch, models: Sequence[Any], optimizers: Sequence[Any]) -> Iterator[None]:
    tf, _ = tensorflow()
    hooks = [(model, "call", _marking(watch, "forward", "loss", settle="result")) for model in models]
    hooks += [(optimizer, "apply", _marking(watch, "update", "update")) for optimizer in optimizers]
    # The tape's `gradient` is a method of the class: wrapped there for the replay, and put back.
    # What it differentiates (its first argument after the tape) is the loss: a result.
    tape_gradient = tf.GradientTape.gradient
    tf.GradientTape.gradient = _marking(watch, "backward", "loss", settle="target")(tape_gradient)
    try:
        with overridden(hooks):
            yield
    finally:
        tf.GradientTape.gradient = tape_gradient


def _marking(watch: OpWatch, during: str, after: str, settle: str | None = None
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A wrapper that sets the watch's phase to `during` for the call and to `after` once it returns.

    `settle` marks what reached a result for the watch: the call's "result" (a model's output) or its
    "target" (what a tape differentiates, the loss), before the call runs.
    """
    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def marked(*args: Any, **kwargs: Any) -> Any:
            if settle == "target" and len(args) > 1:
                watch.settle(args[1], loss=True)
            outer = watch.phase
            watch.phase = during
            try:
                result = function(*args, **kwargs)
            finally:
                watch.phase = after if outer != during else outer
            if settle == "result":
                watch.settle(result)
            return result

        return marked

    return wrap
