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

from nanscope.engine.records import StepRecord
from nanscope.engine.schema import OUTPUT, SCALARS, VARIABLE
from nanscope.keras.capture import StepCapture
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
AROUND = 16  # executions run in full after an event


class SentinelCapture(StepCapture):
    """A StepCapture whose per-variable part is one summary row: the global norms and non-finite totals."""

    def _variable_rows(self):
        grads = [self.grads[id(v)] for v in self.trainable if id(v) in self.grads]
        after = [self.after.get(id(v), v) for v in self.trainable]
        grad_norm = global_norm(grads)
        grad_bad = tf.cond(tf.math.is_finite(grad_norm), lambda: tf.constant(0.0), lambda: _count(grads))
        probe = tf.add_n([tf.reduce_sum(_f32(w)) for w in after]) if after else tf.constant(0.0)
        weight_bad = tf.cond(tf.math.is_finite(probe), lambda: tf.constant(0.0), lambda: _count(after))
        applied = grad_norm if self.applied is None else global_norm(self.applied)
        row = VARIABLE.pack({"grad_norm": grad_norm, "grad_nonfinite": grad_bad, "weight_norm": tf.constant(0.0),
                             "update_norm": tf.constant(0.0), "weight_nonfinite": weight_bad})
        return tf.stack(row)[None], grad_norm, applied


def global_norm(tensors):
    """The global L2 norm, one fused pass; a sum of squares that overflows is redone scaled by the largest entry."""
    tensors = [_f32(t) for t in tensors if t is not None]
    if not tensors:
        return tf.constant(0.0)
    norm = tf.sqrt(tf.add_n([2.0 * tf.nn.l2_loss(t) for t in tensors]))

    def scaled():
        peak = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(t)) for t in tensors]))
        safe = tf.where(peak > 0, peak, 1.0)
        return peak * tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(t / safe)) for t in tensors]))

    return tf.cond(tf.math.is_finite(norm), lambda: norm, scaled)


def _count(tensors):
    return tf.add_n([tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(_f32(t))), tf.float32))
                     for t in tensors]) if tensors else tf.constant(0.0)


def _f32(t):
    t = tf.convert_to_tensor(t)
    return t if t.dtype == tf.float32 else tf.cast(t, tf.float32)


class SentinelRows:
    """The sentinel steps' rows on the device (step, batch rows, SCALARS, OUTPUT per output) and their records.

    Args:
        counter: tf.Variable. The step counter the full rows count with (`RowBuffer.counter`).
        outputs: int. Outputs with their own loss columns.
        per_execution: int. Steps per compiled call.
        sample_every: int. Every Nth execution runs the full step.
    """

    def __init__(self, counter, outputs, per_execution, sample_every):
        self.counter, self.outputs, self.per_execution = counter, outputs, per_execution
        self.sample_every = sample_every
        self.width = 2 + len(SCALARS) + outputs * len(OUTPUT)
        self.buffer = tf.Variable(tf.fill([per_execution, self.width], -1.0), trainable=False,
                                  name="nanscope_sentinel_rows")
        self.full_now = True  # read while a step is traced: which of the two train functions is being traced
        self.calls, self.full_until, self.next_step = 0, 0, 0

    def write(self, batch_rows, scalars):
        """In the graph: one step's row, counted on the shared step counter."""
        step = self.counter.assign_add(1) - 1
        row = tf.concat([tf.cast(tf.stack([step]), tf.float32), tf.stack([batch_rows]), scalars], axis=0)
        self.buffer.scatter_nd_update(tf.reshape(step % self.per_execution, [1, 1]), row[None])

    def due_full(self):
        """Host, before each execution: True when this one runs the full step (sampled, or after an event)."""
        full = self.calls % self.sample_every == 0 or self.calls < self.full_until
        self.calls += 1
        return full

    def around_event(self):
        """The next AROUND executions run in full."""
        self.full_until = self.calls + AROUND

    def read(self, since):
        """StepRecords of the sentinel rows from step `since` on, in step order (no layers, no variables)."""
        rows = self.buffer.value().numpy()
        fresh = sorted((row for row in rows if row[0] >= since), key=lambda row: row[0])
        scalars = len(SCALARS) + self.outputs * len(OUTPUT)
        return [StepRecord.from_arrays(int(row[0]), int(row[1]), row[2:2 + scalars], [], [], []) for row in fresh]
