"""The on-device buffer a guest step writes its statistics row into, and the host side that decodes it.

One row per step of an execution (so `steps_per_execution > 1` keeps every step), a
step counter, and under tf.distribute an on-read copy per replica with a replica axis
(the host reads replica 0's copy and merges the rows with `combine_replicas`). A row is HEAD
(step, batch rows), then the step's outputs joined as `engine/schema.py` lays them out,
plus under tf.distribute the replica's own gradients' non-finite count.
"""

from nanscope.engine.distributed import combine_replicas
from nanscope.engine.records import StepRecord
from nanscope.engine.schema import Columns, StepLayout
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
# The columns a buffer row starts with, before the step's outputs (engine/schema.py).
HEAD = Columns("step", "batch_rows")


class RowBuffer:
    """Rows of per-step statistics on the device, read by the host after each execution.

    Args:
        layers: int. Probed layers.
        variables: int. Trainable variables.
        outputs: int. Outputs with their own loss columns (0 for one output).
        per_execution: int, default 1. Steps per compiled call.
        strategy: tf.distribute.Strategy, optional. With more than one replica, a row per replica.
    """

    def __init__(self, layers, variables, outputs=0, per_execution=1, strategy=None):
        self.per_execution = per_execution
        self.layout = StepLayout(outputs=outputs, layers=layers, terms=layers + 1, variables=variables)
        self.width = len(HEAD) + self.layout.width
        self.strategy = strategy
        self.replicas = strategy.num_replicas_in_sync if strategy is not None else 1
        if self.replicas == 1:
            self.buffer = tf.Variable(tf.fill([per_execution, self.width], -1.0), trainable=False, name="nanscope_rows")
            self.counter = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="nanscope_step")
        else:
            on_read = {"trainable": False, "synchronization": tf.VariableSynchronization.ON_READ,
                       "aggregation": tf.VariableAggregation.ONLY_FIRST_REPLICA}
            # A row per replica, each one column wider: its own gradients' non-finite count.
            with strategy.scope():
                self.buffer = tf.Variable(tf.fill([per_execution, self.replicas, self.width + 1], -1.0),
                                          name="nanscope_rows", **on_read)
                self.counter = tf.Variable(tf.constant(0, tf.int64), name="nanscope_step", **on_read)
        self.next_step = 0  # the first step not read yet

    def write(self, stats):
        """In the graph: append one step's row (without its step number) and count the step."""
        step = self.counter.assign_add(1) - 1
        row = tf.concat([tf.cast(tf.stack([step]), tf.float32), stats], axis=0)
        slot = tf.reshape(step % self.per_execution, [1, 1])
        self.buffer.scatter_nd_update(slot, row[None])

    def write_replicas(self, context, row):
        """In a replica function: gather every replica's row and write them all into this replica's copy."""
        rows = context.all_gather(row[None], axis=0)
        step = self.counter.assign_add(1) - 1
        rows = tf.concat([tf.fill([self.replicas, 1], tf.cast(step, tf.float32)), rows], axis=1)
        slot = tf.reshape(step % self.per_execution, [1, 1])
        # On-read variables take whole assignments only (no scatter) in a replica.
        self.buffer.assign(tf.tensor_scatter_nd_update(tf.convert_to_tensor(self.buffer), slot, rows[None]))

    def read(self):
        """(step, row) pairs of the steps finished since the last read, in step order."""
        # `value()` is one read; `numpy()` on the variable adds an identity op, which costs as
        # much again on every step. Under tf.distribute, `numpy()` reads replica 0's copy.
        rows = self.buffer.value().numpy() if self.replicas == 1 else self.buffer.numpy()
        fresh = sorted(((int(row.flat[0]), row) for row in rows if row.flat[0] >= self.next_step),
                       key=lambda pair: pair[0])
        if fresh:
            self.next_step = fresh[-1][0] + 1
        return fresh

    def record(self, step, row):
        """A StepRecord from one row (under tf.distribute: one row per replica, merged)."""
        if row.ndim == 2:
            # Each replica's row ends in one more column: its own gradients' non-finite count.
            scalars, layer_stats, terms, var_stats = self.layout.split(row[:, len(HEAD):-1])
            counts = row[:, [HEAD.at("batch_rows"), -1]]
            return combine_replicas(step, int(counts[:, 0].sum()), scalars, layer_stats, terms, var_stats, counts)
        scalars, layer_stats, terms, var_stats = self.layout.split(row[len(HEAD):])
        return StepRecord.from_arrays(step, int(row[HEAD.at("batch_rows")]), scalars, layer_stats, terms, var_stats)
