"""What a replay of one guest step needs, kept on the device: the state before the step and its batch.

Inside the compiled step, before the update, the snapshot copies every variable the
step changes (the model's weights and the optimizer's slots: one extra copy of each)
and the batch (the tensors handed to the step) into variables of its own. When a step
turns out non-finite, the host puts the copied state back, replays the step eagerly
and puts the state after the step back (`GuestReplay`).

With `steps_per_execution > 1` the host learns of a non-finite step only after the
execution: the snapshot then stops copying (`freeze`) once a step is non-finite, so it
still holds that step when the host looks. `not_absorbed` and `unexpected_layer_nonfinite` are that
test, in the graph.
"""

from collections.abc import Iterable
from typing import Any

import numpy as np

from nanscope.engine.schema import LAYER
from nanscope.engine.variable_stats import Snapshot
from nanscope.internals import untraced_variable
from nanscope.runtime import tensorflow
from nanscope.tf_types import Batch, Tensor, Variable

tf, keras = tensorflow()

# Tensors, tf.Variables and a batch as `train_step` received it (nested tensors): TensorFlow ships no types, so


class StepSnapshot:
    """State and batch of the latest step (or of the first non-finite one, once frozen).

    Args:
        variables: list of every variable a step changes (model, then optimizer).
        freezing: bool, default False. Stop copying after the first non-finite step (steps_per_execution > 1).
        extra: list of variables, default (). Copied with the state but kept apart from it (the metrics' totals,
            which the guard puts back with a skipped step; a repro bundle holds only `variables`).
    """

    def __init__(self, variables: Iterable[Variable], freezing: bool = False, extra: Iterable[Variable] = ()) -> None:
        self.variables = list(variables)
        self.state = Snapshot(self.variables)
        self.extra = Snapshot(list(extra)) if extra else None
        self.step = tf.Variable(tf.constant(-1, tf.int64), trainable=False, name="nanscope_snapshot_step")
        self.frozen = tf.Variable(False, trainable=False, name="nanscope_snapshot_frozen") if freezing else None
        self._batch: list[Variable | None] | None = None
        self._structure: Any = None

    def take(self, data: Batch, step: Tensor) -> None:
        """In the graph, before the update: copy the state and the batch (unless frozen)."""
        if self.frozen is None:
            self._copy(data, step)
            return
        tf.cond(self.frozen, tf.no_op, lambda: self._copy_op(data, step))

    def _copy_op(self, data: Batch, step: Tensor) -> Any:
        self._copy(data, step)
        return tf.no_op()

    def _copy(self, data: Batch, step: Tensor) -> None:
        self.state.take()
        if self.extra is not None:
            self.extra.take()
        flat = tf.nest.flatten(data)
        batch = self._batch_variables(flat)
        for variable, tensor in zip(batch, flat):
            if variable is not None:
                variable.assign(tensor)
        self.step.assign(tf.cast(step, tf.int64))

    def _batch_variables(self, flat: list[Tensor]) -> list[Variable | None]:
        if self._batch is None or len(self._batch) != len(flat):
            # Made outside the traced step, whichever trace first gets here, and not counted by it: the step is
            # traced as often as without nanscope (its unseeded random ops draw the same seeds).
            with tf.init_scope():
                self._batch = [None if not tf.is_tensor(t) else untraced_variable(
                    tf.zeros([0] * t.shape.rank if t.shape.rank is not None else [0], t.dtype),
                    shape=tf.TensorShape(None), trainable=False, name="nanscope_batch") for t in flat]
        return self._batch

    def remember_structure(self, data: Batch) -> None:
        """Keep the nesting of the step's batch (at trace time), to pack the copies back into it."""
        self._structure = tf.nest.map_structure(lambda _: 0, data)

    def freeze(self, bad: Tensor) -> None:
        """In the graph, after the step: stop copying once `bad` (a non-finite step) was seen."""
        if self.frozen is not None:
            self.frozen.assign(tf.logical_or(self.frozen, bad))

    def held_step(self) -> int:
        """The step whose state and batch the snapshot holds (-1: none yet)."""
        return int(self.step.numpy())

    def batch(self) -> Batch:
        """The held batch as eager tensors, nested as the step received it."""
        flat = [None if v is None else tf.convert_to_tensor(v) for v in self._batch or []]
        return tf.nest.pack_sequence_as(self._structure, flat) if self._structure is not None else None

    def read(self, variables: Iterable[Variable]) -> list[np.ndarray]:
        """The values of `variables` now, as numpy arrays (under a strategy, every device's: ReplicaStepSnapshot)."""
        return [np.array(v.numpy(), copy=True) for v in variables]

    def write(self, variables: Iterable[Variable], values: Iterable[np.ndarray]) -> None:
        """Put `read`'s values back into `variables`."""
        for variable, value in zip(variables, values):
            variable.assign(value)

    def nbytes(self) -> int:
        """Bytes the state copy takes on the device."""
        return sum(int(v.shape.num_elements() or 0) * v.dtype.size for v in self.state.copies)


def not_absorbed(values: dict[str, Tensor], layer_nonfinite: Tensor) -> Tensor:
    """In the graph: True when this step holds a non-finite value that loss scaling did not absorb.

    The same test as `StepRecord.phase`, for the snapshot to stop at the first such step, but for a collapsed
    loss scale (`engine.loss_scale`), which only the host sees over many steps: a skipped update is absorbed here.
    `layer_nonfinite` is the sum of the non-finite counts of layers not expected to have them.
    """
    counts = (values["x_nonfinite"] + values["y_nonfinite"] + values["output_nonfinite"] + values["loss_nonfinite"]
              + values["weights_nonfinite"] + layer_nonfinite
              + values["grad_nonfinite"] * (1.0 - values["update_skipped"]))
    return counts > 0


def unexpected_layer_nonfinite(stats: Tensor, layers: int, expected: Iterable[int]) -> Tensor:
    """In the graph: the non-finite counts of the `layers` rows of `stats` summed, but for the `expected` ones'."""
    keep = [i for i in range(layers) if i not in set(expected)]
    if not keep:
        return tf.constant(0.0)
    return tf.reduce_sum(tf.gather(stats[:, LAYER.at("nonfinite")], keep))
