"""Gradient transforms for the step's `grad_transform` hook: clip (manual modes) and measure.

`ClipMonitor` is the `grad_transform` of every clipping strategy. Inside the
compiled step it measures the raw gradient and the gradient the update uses, and
writes the numbers into a small on-device buffer that is read once, after the run,
so no per-step host transfer is added:

  manual modes   it clips (`tf.clip_by_norm`, `tf.clip_by_global_norm`) and hands the
                 clipped gradient to the optimizer; what it measures is what is applied.
  Keras modes    it hands the raw gradient on (the optimizer clips) and measures
                 `keras_clip`, a copy of Keras' `_clip_gradients` semantics. That the
                 optimizer really applies it is checked separately on real gradients
                 (`nanscope.run.clipping.effect.verify_optimizer_clip`), not taken on trust.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from nanscope.runtime import tensorflow
from nanscope.tf_types import Tensor

if TYPE_CHECKING:
    from nanscope.run.clipping.strategies import Strategy

# Per step: raw and clipped global norm, max per-variable norm, max |element|.
STAT_COLUMNS = (
    "raw_global_norm", "raw_max_variable_norm", "raw_max_abs",
    "global_norm", "max_variable_norm", "max_abs",
)


def keras_clip(grads: list[Tensor], mode: str, threshold: float | None) -> list[Tensor]:
    """The gradients as Keras 3's optimizer `_clip_gradients` leaves them for `mode` at `threshold`.

    clipnorm per variable (g * c / max(|g|, c)); global_clipnorm over all, a non-finite
    global norm turning every gradient into NaN; clipvalue per element.
    """
    tf, _ = tensorflow()
    c = tf.constant(threshold, tf.float32)
    if mode == "clipnorm":
        return [g * tf.cast(c, g.dtype) / tf.maximum(tf.cast(tf.norm(g), g.dtype), tf.cast(c, g.dtype)) for g in grads]
    if mode == "global_clipnorm":
        norm = tf.linalg.global_norm(grads)
        scale = c * tf.minimum(1.0 / norm, 1.0 / c) + (norm - norm)
        return [g * tf.cast(scale, g.dtype) for g in grads]
    if mode == "clipvalue":
        return [tf.clip_by_value(g, -tf.cast(c, g.dtype), tf.cast(c, g.dtype)) for g in grads]
    raise ValueError(f"not a Keras clip mode: {mode!r}")


def manual_clip(grads: list[Tensor], mode: str, threshold: float | None) -> list[Tensor]:
    """The gradients clipped as a custom training loop does: `tf.clip_by_norm` or `tf.clip_by_global_norm`."""
    tf, _ = tensorflow()
    if mode == "manual_clip_by_norm":
        return [tf.clip_by_norm(g, threshold) for g in grads]
    if mode in ("manual_clip_by_global_norm", "auto"):
        return tf.clip_by_global_norm(grads, threshold)[0]
    raise ValueError(f"not a manual clip mode: {mode!r}")


def gradient_stats(grads: list[Tensor]) -> list[Tensor]:
    """[global norm, max per-variable norm, max |element|] of a list of gradients, as float32 tensors."""
    tf, _ = tensorflow()
    as_f32 = [tf.cast(g, tf.float32) for g in grads]
    norms = tf.stack([tf.norm(g) for g in as_f32])
    max_abs = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(g)) for g in as_f32]))
    return [tf.sqrt(tf.reduce_sum(tf.square(norms))), tf.reduce_max(norms), max_abs]


class ClipMonitor:
    """A `grad_transform` that clips (manual modes) or passes through (Keras modes) and records statistics.

    Args:
        strategy: Strategy. With its threshold set.
        steps: int. Rows of the on-device statistics buffer.

    Example:
        monitor = ClipMonitor(Strategy("manual_clip_by_norm", 1.0), steps=100)
        change = Change("manual_clip_by_norm=1", grad_transform=monitor)
        ...; monitor.read(result.steps_run)  # (steps, 6) numpy array
    """

    def __init__(self, strategy: Strategy, steps: int) -> None:
        tf, _ = tensorflow()
        self.strategy = strategy
        self._stats = tf.Variable(tf.zeros([max(1, steps), len(STAT_COLUMNS)]), trainable=False,
                                  name="nanscope_clip_stats")
        self._row = tf.Variable(0, trainable=False, dtype=tf.int32, name="nanscope_clip_row")

    def __call__(self, grads: list[Tensor]) -> list[Tensor]:
        tf, _ = tensorflow()
        kind, threshold = self.strategy.kind, self.strategy.threshold
        if self.strategy.is_keras_option:
            applied, effective = grads, keras_clip(grads, kind, threshold)
        else:
            applied = effective = manual_clip(grads, kind, threshold)
        row = tf.stack(gradient_stats(grads) + gradient_stats(effective))
        index = tf.minimum(self._row, tf.shape(self._stats)[0] - 1)
        self._stats.scatter_nd_update(tf.reshape(index, [1, 1]), tf.reshape(row, [1, -1]))
        self._row.assign_add(1)
        return applied

    def read(self, steps: int) -> np.ndarray:
        """The statistics of the first `steps` steps, one row per step (columns: STAT_COLUMNS)."""
        return self._stats.numpy()[:steps]
