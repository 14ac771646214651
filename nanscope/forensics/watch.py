"""Op-level watch of an eager replay: the first op whose output is not finite.

`OpWatch` registers a TensorFlow op callback (the hook `tf.debugging.enable_check_numerics`
is built on) and wraps every Keras layer's `call` to know which layer is running.
Every op executed eagerly while it is attached is checked with numpy (no TF op,
so the callback never re-enters itself); the first op that turns finite inputs
into a non-finite output is the producer. For a gradient op the forward op it
differentiates is found from TensorFlow's `_gradient_function` frame, and the
forward op's layer and source line are looked up from the forward pass.
Everything is detached in `finally`; the model keeps nothing.
"""

import contextlib
import functools
import os
import sys
import sysconfig
from dataclasses import dataclass, field

import numpy as np

from nanscope.internals import differentiated_op, op_callback, overridden
from nanscope.runtime import tensorflow

# For these ops the second input is the denominator: that is the operand to describe.
DENOMINATOR_OPS = {"RealDiv", "Div", "DivNoNan", "FloorDiv", "TruncateDiv", "Xdivy"}


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


def _is_float(tensor):
    dtype = getattr(tensor, "dtype", None)
    return dtype is not None and getattr(dtype, "is_floating", False)


def _all_finite(tensors):
    for tensor in tensors:
        if _is_float(tensor) and hasattr(tensor, "numpy") and not np.isfinite(tensor.numpy()).all():
            return False
    return True


class OpWatch:
    """Watches eager ops for the first non-finite output and attributes it.

    Args:
        layers: list of keras.Layer. The layers whose calls mark which layer is running.

    Example:
        watch = OpWatch(layers)
        with watch.attached():
            watch.phase = "forward"
            y_pred = model(x, training=True)
        watch.first  # OpEvent or None
    """

    def __init__(self, layers):
        self.layers = list(layers)
        self.phase = "forward"
        self.first = None
        self._stack = []
        self._forward = {}
        self._keep = []
        self._busy = False
        self._library_dirs = _library_dirs()

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
                return call(*args, **kwargs)
            finally:
                self._stack.pop()

        return watched_call

    def _callback(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if graph is not None or self._busy or self.first is not None:
            return None
        self._busy = True
        try:
            self._observe(op_type, inputs, outputs)
        finally:
            self._busy = False
        return None

    def _observe(self, op_type, inputs, outputs):
        outputs = [t for t in (outputs or ()) if hasattr(t, "numpy")]
        if self.phase in ("forward", "loss"):
            self._remember_forward(op_type, inputs, outputs)
        if self.first is not None or _all_finite(outputs):
            return
        self.first = self._event(op_type, list(inputs or ()), outputs)

    def _remember_forward(self, op_type, inputs, outputs):
        layer = self._stack[-1] if self._stack else None
        source = None
        for output in outputs:
            self._keep.append(output)
            if source is None:
                source = self.user_source()
            self._forward[id(output)] = (op_type, layer, source, list(inputs or ()))

    def _event(self, op_type, inputs, outputs):
        if self.phase == "backward":
            return self._gradient_event(op_type, outputs)
        layer = self._stack[-1] if self._stack else None
        index = 1 if op_type in DENOMINATOR_OPS and len(inputs) > 1 else 0
        floats = [t for t in inputs if _is_float(t) and hasattr(t, "numpy")]
        operand = inputs[index] if index < len(inputs) and _is_float(inputs[index]) else (floats[0] if floats else None)
        return OpEvent(
            op=op_type, phase=self.phase, layer=layer.name if layer is not None else None,
            layer_class=type(layer).__name__ if layer is not None else None, source=self.user_source(),
            inputs=operand_stats(operand.numpy()) if operand is not None else {},
            operand="denominator" if index == 1 and operand is inputs[index] else "input",
            dtype=outputs[0].dtype.name if outputs else "float32",
        )

    def _gradient_event(self, op_type, outputs):
        forward_op, forward_inputs, forward_outputs = _differentiated_op()
        event = OpEvent(op=op_type, phase="backward", forward_op=forward_op,
                        dtype=outputs[0].dtype.name if outputs else "float32")
        known = next((self._forward[id(t)] for t in forward_outputs if id(t) in self._forward), None)
        if known is None and forward_op is not None:
            known = next((v for v in self._forward.values() if v[0] == forward_op), None)
        if known is not None:
            _, layer, event.source, recorded_inputs = known
            forward_inputs = [t for t in forward_inputs if t is not None] or recorded_inputs
            event.layer = layer.name if layer is not None else None
            event.layer_class = type(layer).__name__ if layer is not None else None
        index = 1 if forward_op in DENOMINATOR_OPS and len(forward_inputs) > 1 else 0
        if index < len(forward_inputs) and _is_float(forward_inputs[index]):
            event.inputs = operand_stats(forward_inputs[index].numpy())
            event.operand = "denominator" if index == 1 else "input"
        return event

    def user_source(self):
        """`file:line` of the innermost user frame below nanscope's own replay frames, or None."""
        frames = _stack_frames()
        while frames and _in_dir(frames[-1][0], _NANSCOPE_DIR):
            frames.pop()
        last_own = max((i for i, (f, _) in enumerate(frames) if _in_dir(f, _NANSCOPE_DIR)), default=-1)
        for filename, line in reversed(frames[last_own + 1:]):
            if not any(_in_dir(filename, d) for d in self._library_dirs) and not filename.startswith("<"):
                return f"{_shown_path(filename)}:{line}"
        return None


_NANSCOPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _stack_frames():
    frames, frame = [], sys._getframe(1)
    while frame is not None:
        frames.append((os.path.abspath(frame.f_code.co_filename), frame.f_lineno))
        frame = frame.f_back
    return frames[::-1]


def _differentiated_op():
    """(op type, inputs, outputs) of the forward op whose gradient is being computed, from TF's frame."""
    return differentiated_op(sys._getframe(1))


def _library_dirs():
    tf, keras = tensorflow()
    dirs = {os.path.dirname(os.path.abspath(m.__file__)) for m in (tf, keras, np)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(os.path.abspath(path))
    return dirs


def _in_dir(filename, directory):
    return filename == directory or filename.startswith(directory + os.sep)


def _shown_path(filename):
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative
