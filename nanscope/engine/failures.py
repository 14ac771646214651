"""What can go wrong around the train step, as one line naming the spec field: tracing
the step, and TensorFlow ops that fail inside it.

A model, loss or optimizer that raises while the step is traced, an op that fails (out
of memory, XLA, an assert in a layer) are the user's input or environment, not
nanscope crashes: each becomes a `ModelError` (exit 2). A row shape that does not fit
the model is caught where the model is built (`models.build_model`).
"""

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from nanscope.errors import ModelError, NanscopeError, first_line
from nanscope.runtime import tensorflow
from nanscope.model.usercode import where_suffix


@contextlib.contextmanager
def raised_while_tracing(where: str) -> Iterator[None]:
    """Turn an exception that user code (the model's call, a loss, an optimizer) raises while TensorFlow traces
    the step into a ModelError naming `where` (the spec file and field): bad input, not a crash."""
    try:
        yield
    except NanscopeError:
        raise
    except Exception as exc:
        raise ModelError(f"{where}raised {type(exc).__name__} while the train step was traced: {first_line(exc)}"
                         f"{where_suffix(exc)}",
                         hint="NANSCOPE_DEBUG=1 shows the traceback") from exc


def model_outputs(y_pred: Any, where: str) -> Any:
    """`y_pred`, the model's output, checked: tensors (one, or a list or dict of them), not None or plain values;
    else a ModelError naming `where` (the spec file and field)."""
    tf, _ = tensorflow()
    parts = tf.nest.flatten(y_pred)
    if not parts or not all(tf.is_tensor(part) for part in parts):
        kind = "None" if y_pred is None else f"a {type(y_pred).__name__}"
        raise ModelError(f"{where}the model's call returned {kind}; expected a tensor, or a list or "
                         "dict of tensors (one per output)")
    return y_pred


def step_failure(exc: BaseException, step: int, source: str | None = None, jit_compile: bool = False
                 ) -> ModelError | None:
    """A ModelError that says why TensorFlow failed inside step `step`, or None when `exc` is not a TF op error.

    Out of memory, an XLA compilation failure and any other failed op (a
    `tf.debugging.assert_*` in a layer, for example) become one line naming the
    step, what failed and what to try; they are not crashes.
    """

    tf, _ = tensorflow()
    if not isinstance(exc, tf.errors.OpError):
        return None
    where = (f"{source}: " if source else "") + f"step {step}"
    detail = f"{type(exc).__name__}: {_op_error_summary(exc)}"
    if isinstance(exc, tf.errors.ResourceExhaustedError):
        return ModelError(f"{where}: out of memory inside the train step ({detail})",
                          hint="try a smaller --batch-size or a smaller model")
    if jit_compile and ("XLA" in str(exc) or "compil" in str(exc).lower()):
        return ModelError(f"{where}: XLA could not compile or run the train step ({detail})",
                          hint="set train.jit_compile: false")
    return ModelError(f"{where}: a TensorFlow op failed inside the train step ({detail})")


_OP_ERROR_NOISE = ("Graph execution error", "Detected at node", "File ", "Traceback", "The op is created at", "Hint:",
                   "tf2xla conversion failed", "[[{{node", "^")


def _op_error_summary(exc: BaseException) -> str:
    """What a TensorFlow op error says went wrong, and at which node, without its creation traceback."""
    text = getattr(exc, "message", None) or str(exc)
    node = re.search(r"\{\{node ([^}]+)\}\}", text) or re.search(r"Detected at node '?([^\s']+)", text)
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith(_OP_ERROR_NOISE) and not line[:1].isspace()]
    what = lines[0] if lines else type(exc).__name__
    what = re.sub(r"\[_Xla[^\]]*\]|\{\{node [^}]*\}\}|\[Op:[^\]]*\]", "", what).strip()[:240]
    return what + (f" at node {node.group(1)}" if node and node.group(1) not in what else "")
