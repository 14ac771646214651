"""The forensic replay of a guest's first non-finite step, from the snapshot kept on the device.

Shared by the `NanScope` callback and `instrument`: put the state from before the
step back, replay the step's own Python function eagerly under the op watch
(`forensics.guest.replay_call`), put the state from after the step back, and fill the
FirstNonfinite with the op, layer, source line and operand statistics, as trace-steps
does. For a non-finite batch, name the columns and the rows within the batch instead.
"""

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from nanscope.run.attribution import bad_values_line
from nanscope.forensics.guest import replay_call
from nanscope.forensics.random_state import random_state_kept
from nanscope.forensics.replay import describe_event
from nanscope.runtime import tensorflow
from nanscope.tf_types import Batch, KerasModel, Layer, Optimizer, Variable

if TYPE_CHECKING:
    from nanscope.engine.records import StepRecord
    from nanscope.forensics.replay import Localization
    from nanscope.keras.snapshot import StepSnapshot
    from nanscope.report.model import FirstNonfinite

# A batch as the step received it (nested tensors), Keras layers, models, optimizers and variables: Keras and
# A batch's parts: (label, values, kind), kind as `run.attribution.bad_values_line` words it.
Labelled: TypeAlias = list[tuple[str, np.ndarray, str]]


class GuestForensics:
    """Replays the first non-finite step of a guest run.

    Args:
        snapshot: StepSnapshot. Holds the state before the step and its batch.
        function: callable(batch) -> None. Runs the step's Python function eagerly on a held batch.
        labelled: callable(batch) -> list of (label, array, kind). The batch's parts, for a data-phase finding.
        layers, models, optimizers, trainable: what the op watch and the phase hooks attach to.
        extra_state: list of variables the replay changes besides the snapshot's (metrics), put back after it.
        expected: list of str. Names of layers whose non-finite outputs are intended: an op there names nothing.
    """

    def __init__(self, snapshot: "StepSnapshot", function: Callable[[Batch], Any],
                 labelled: Callable[[Batch], Labelled], layers: list[Layer], models: list[KerasModel],
                 optimizers: list[Optimizer], trainable: list[Variable], extra_state: Iterable[Variable] = (),
                 expected: Iterable[str] = ()) -> None:
        self.snapshot, self.function, self.labelled = snapshot, function, labelled
        self.expected = set(expected)
        self.layers, self.models, self.optimizers, self.trainable = layers, models, optimizers, trainable
        self.extra_state = list(extra_state)
        self.state_before: list[np.ndarray] | None = None

    def locate(self, record: "StepRecord", first: "FirstNonfinite") -> None:
        """Fill `first` (attributed from `record`) with what the held batch and a replay show."""
        held = self.snapshot.held_step()
        if held != record.step:
            first.detail.append(f"no snapshot of step {record.step} on the device (it holds step {held}): not replayed")
            return
        batch = self.snapshot.batch()
        if first.phase == "data":
            first.detail = self.describe_batch(batch)
            return
        try:
            found = self.replay(batch)
        except Exception as exc:
            first.detail.append(f"the forensic replay of step {record.step} failed: {type(exc).__name__}: {exc}")
            return
        if found.event is not None and found.event.layer in self.expected:
            first.detail.append(f"the replay's first non-finite op, {found.event.op}, is in layer {found.event.layer}, "
                                "whose non-finite outputs are expected: the op that spread them is not named")
            return
        describe_event(first, found.event, first.phase)
        outside = f"{first.op} is part of the loss, outside any layer"
        if first.phase == "loss" and first.layer is None and first.op is not None and outside not in first.detail:
            first.detail.append(outside)  # unless the replay's own description already said so
        first.detail.append(f"forensic replay of step {record.step}: {found.seconds:.3f} s")

    def describe_batch(self, batch: Batch) -> list[str]:
        """Lines naming the non-finite columns and the rows within the batch."""
        return batch_lines(self.labelled(batch))

    def replay(self, batch: Batch) -> "Localization":
        """Replay the held step from the held state; the state is left as it was after the step."""
        variables = self.snapshot.variables + self.extra_state
        after = [v.numpy() for v in variables]
        self.snapshot.state.restore()
        self.state_before = [v.numpy() for v in self.snapshot.variables]
        try:
            with random_state_kept():
                return replay_call(self.function, (batch,), self.layers, self.models, self.optimizers, self.trainable)
        finally:
            for variable, value in zip(variables, after):
                variable.assign(value)


def batch_lines(labelled: Labelled) -> list[str]:
    """Lines naming the non-finite columns and the rows within a batch, from its (label, array, kind) parts."""
    lines = []
    for label, array, kind in labelled:
        line = bad_values_line(label, array, np.arange(len(array)) if array.ndim else [], kind=kind,
                               rows_are="rows within the batch")
        if line is not None:
            lines.append(line)
    return lines


def labelled_fit_batch(batch: Batch) -> Labelled:
    """(label, array, kind) for the x, y and sample weights of a `fit` batch."""
    _, keras = tensorflow()
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    parts = []
    for label, value, kind in (("x", x, "feature"), ("y", y, "target"), ("sample_weight", sample_weight, "value")):
        flat = [t for t in _flat(value) if t is not None]
        for i, tensor in enumerate(flat):
            parts.append((label if len(flat) == 1 else f"{label}[{i}]", np.asarray(tensor), kind))
    return parts


def labelled_arguments(batch: Batch) -> Labelled:
    """(label, array, kind) for the tensor arguments of an instrumented step function."""
    flat = [t for t in _flat(batch) if t is not None]
    return [(f"argument {i}", np.asarray(t), "value") for i, t in enumerate(flat)]


def _flat(value: Batch) -> list[Any]:
    tf, _ = tensorflow()
    return [t for t in tf.nest.flatten(value) if t is None or tf.is_tensor(t)]
