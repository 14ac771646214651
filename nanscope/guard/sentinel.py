"""`mode="sentinel"`: per step only what detection needs; the full statistics sampled and around events.

A sentinel step runs the user's step with the optimizer and `compute_loss` hooks only:
no layer probes, no per-variable rows. It writes one short row, the scalars trace-steps
records (loss, the global gradient norm, the non-finite counts of the batch, the model
output, the loss, the gradients and the weights after the update, the loss scale),
into a buffer of its own, and still copies the state before the step and its batch
(the step snapshot), so a non-finite step is replayed and localized as in full mode:
the host re-runs it, compiled and in full, from that copy (`StepProbe.rerun`) and then
op by op. Every `sample_every`-th execution, and the `AROUND` executions after an
event, run the full step instead.

What a sentinel step cannot see: a non-finite layer output that later ops discard
(a `tf.where` that drops it) leaves the loss, the output and the gradients finite;
and without layer rows it cannot tell an expected `-inf` (`expect_nonfinite`) from an
unexpected one in the model output, which it counts as non-finite.
"""

from typing import Any

from nanscope.engine.records import StepRecord
from nanscope.engine.schema import OUTPUT, SCALARS, VARIABLE
from nanscope.engine.variable_stats import global_norm, summary_stats
from nanscope.guard.schedule import SampleSchedule
from nanscope.keras.capture import StepCapture
from nanscope.runtime import tensorflow
from nanscope.tf_types import Tensor, Variable

tf, keras = tensorflow()
NORMS = 2  # |w| and |dw| over all trainable weights, at the end of a sentinel row


def _f32(tensor: Tensor) -> Tensor:
    tensor = tf.convert_to_tensor(tensor)
    return tensor if tensor.dtype == tf.float32 else tf.cast(tensor, tf.float32)


class SentinelCapture(StepCapture):
    """A StepCapture whose per-variable part is one summary row: the global norms and non-finite totals.

    Its row ends with |w| and |dw| over all trainable weights (`NORMS`), as trace-steps' light step measures them,
    so the rules that read every step's weight norm and update ratio see them on light steps too.
    """

    def _variable_rows(self) -> tuple[Tensor, Tensor, Tensor]:
        grads = [self.grads[id(v)] for v in self.trainable if id(v) in self.grads]
        after = [self.after.get(id(v), v) for v in self.trainable]
        measured, weight_norm = summary_stats(grads, after, self.applied)
        # The update as the optimizer made it: the weights after its `apply` less the weights before it.
        changes = [_f32(a) - _f32(self.before[id(v)]) for v, a in zip(self.trainable, after) if id(v) in self.before]
        self.norms = tf.stack([weight_norm, global_norm(changes) if changes else tf.constant(0.0)])
        grad_norm = measured["grad_global_norm"]
        row = VARIABLE.pack({"grad_norm": grad_norm, "grad_nonfinite": measured["grad_nonfinite"],
                             "weight_norm": weight_norm, "update_norm": self.norms[1],
                             "weight_nonfinite": measured["weights_nonfinite"]})
        return tf.stack(row)[None], grad_norm, measured["applied_grad_global_norm"]

    def scalars(self, values: dict[str, Tensor], y: Any, sample_weight: Any) -> Tensor:
        """SCALARS, OUTPUT's columns per output, then |w| and |dw| (`values` must come first: it measures them)."""
        return tf.concat([super().scalars(values, y, sample_weight), self.norms], axis=0)


class SentinelRows(SampleSchedule):
    """The sentinel steps' rows on the device (step, batch rows, SCALARS, OUTPUT per output) and their records.

    Args:
        counter: tf.Variable. The step counter the full rows count with (`RowBuffer.counter`).
        outputs: int. Outputs with their own loss columns.
        per_execution: int. Steps per compiled call.
        sample_every: int. Every Nth execution runs the full step.
    """

    def __init__(self, counter: Variable, outputs: int, per_execution: int, sample_every: int) -> None:
        super().__init__(sample_every)
        self.counter, self.outputs, self.per_execution = counter, outputs, per_execution
        self.width = 2 + len(SCALARS) + outputs * len(OUTPUT) + NORMS
        self.buffer = tf.Variable(tf.fill([per_execution, self.width], -1.0), trainable=False,
                                  name="nanscope_sentinel_rows")
        self.full_now = True  # read while a step is traced: which of the two train functions is being traced
        self.next_step = 0

    def write(self, batch_rows: Tensor, scalars: Tensor) -> None:
        """In the graph: one step's row, counted on the shared step counter."""
        step = self.counter.assign_add(1) - 1
        row = tf.concat([tf.cast(tf.stack([step]), tf.float32), tf.stack([batch_rows]), scalars], axis=0)
        self.buffer.scatter_nd_update(tf.reshape(step % self.per_execution, [1, 1]), row[None])

    def read(self, since: int) -> list[StepRecord]:
        """StepRecords of the sentinel rows from step `since` on, in step order (no layers, no variables)."""
        rows = self.buffer.value().numpy()
        fresh = sorted((row for row in rows if row[0] >= since), key=lambda row: row[0])
        scalars = len(SCALARS) + self.outputs * len(OUTPUT)
        records = []
        for row in fresh:
            record = StepRecord.from_arrays(int(row[0]), int(row[1]), row[2:2 + scalars], [], [], [])
            record.overall_norms = (float(row[2 + scalars]), float(row[3 + scalars]))
            records.append(record)
        return records
