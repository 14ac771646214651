"""`NanScope`: nanscope's per-step measurements inside `model.fit`, as a Keras callback.

A callback cannot see gradients, so `NanScope` wraps the model's `train_step` for the
duration of `fit`. The wrapper calls the original `train_step` (Keras' own or the
user's override, so `compute_loss`, metrics, clipping and loss scaling stay Keras'),
and while it is traced it listens in on `compute_loss` (loss, model output),
`optimizer.apply` (gradients, weights before and after), `_clip_gradients` (the
gradients actually applied) and every layer's `call` (`LayerRecorder`). The compiled
step writes one row of reduced statistics into a buffer variable with one row per
step of an execution, so `steps_per_execution > 1` still records every step;
`on_train_batch_end` reads the buffer (one small host transfer) and turns its new
rows into `StepRecord`s. When `fit` ends, `train_step` and `train_function` are put
back and the trace-steps report is built, printed and written.
"""

from nanscope.keras.callback import NanScope

__all__ = ["NanScope"]
