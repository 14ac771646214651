"""The on-device buffer a guest step writes its statistics row into, and the host side that decodes it.

One row per step of an execution (so `steps_per_execution > 1` keeps every step), a
step counter, and under tf.distribute an on-read copy per replica with a replica axis
(the host merges the replicas' rows with `combine_replicas`). A row is HEAD
(step, batch rows), then the step's outputs joined as `engine/schema.py` lays them out,
plus under tf.distribute the replica's own gradients' non-finite count.
"""


import numpy as np

from nanscope.engine.distributed import combine_replicas
from nanscope.engine.records import StepRecord
from nanscope.engine.schema import SCALARS, Columns, StepLayout
from nanscope.runtime import tensorflow
from nanscope.tf_types import ReplicaContext, Strategy, Tensor

tf, keras = tensorflow()
# The columns a buffer row starts with, before the step's outputs (engine/schema.py).
HEAD = Columns("step", "batch_rows")
# The SCALARS that are the same on every replica: of the summed gradients and the mirrored weights after the update
# (with the variable rows). The rest of a replica's row is known before the update (`RowBuffer.slotted`).
SHARED_SCALARS = ("grad_global_norm", "grad_nonfinite", "weights_nonfinite", "applied_grad_global_norm", "loss_scale")


class RowBuffer:
    """Rows of per-step statistics on the device, read by the host after each execution.

    Args:
        layers: int. Probed layers.
        variables: int. Trainable variables.
        outputs: int. Outputs with their own loss columns (0 for one output).
        per_execution: int, default 1. Steps per compiled call.
        strategy: tf.distribute.Strategy, optional. With more than one replica, a row per replica.
    """

    def __init__(self, layers: int, variables: int, outputs: int = 0, per_execution: int = 1,
                 strategy: Strategy = None) -> None:
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
            # Every execution of a cross-replica collective keeps ~1.5 KB in TensorFlow (an all-gather
            # twice that), for good: where every replica's copy is on this host, each replica writes
            # only its own row and the host reads every copy. A worker of a MultiWorkerMirroredStrategy
            # holds its own replicas' copies only, so there each copy holds every replica's row.
            self.gathered = len(strategy.extended.worker_devices) < self.replicas
            self.shared = self._shared_columns()
            held = self.replicas if self.gathered else 1
            # Rows one column wider than on one device: the replica's own gradients' non-finite count.
            with strategy.scope():
                self.buffer = tf.Variable(tf.fill([per_execution, held, self.width + 1], -1.0),
                                          name="nanscope_rows", **on_read)
                self.counter = tf.Variable(tf.constant(0, tf.int64), name="nanscope_step", **on_read)
        self.next_step = 0  # the first step not read yet

    def write(self, stats: Tensor) -> None:
        """In the graph: append one step's row (without its step number) and count the step."""
        step = self.counter.assign_add(1) - 1
        row = tf.concat([tf.cast(tf.stack([step]), tf.float32), stats], axis=0)
        slot = tf.reshape(step % self.per_execution, [1, 1])
        self.buffer.scatter_nd_update(slot, row[None])

    def _shared_columns(self) -> np.ndarray:
        """[width] bool: the columns of a replica's row (without its step) the same on every replica."""
        shared = np.zeros(self.width, bool)
        shared[[1 + SCALARS.at(name) for name in SHARED_SCALARS]] = True
        start = 1 + sum(self.layout.widths[:3])
        shared[start:start + self.layout.widths[3]] = True
        return shared

    def slotted(self, context: ReplicaContext, row: Tensor) -> Tensor:
        """[replicas, width]: this replica's row (without its step) in its own slot of a zero matrix, which summed
        over the replicas gives every worker every replica's row."""
        replica = int(tf.get_static_value(context.replica_id_in_sync_group))
        return tf.scatter_nd([[replica]], row[None], [self.replicas, row.shape[0]])

    def write_replicas(self, context: ReplicaContext, row: Tensor, folded: Tensor | None = None) -> None:
        """In a replica function: write this replica's row into its own copy (on a multi-worker cluster, every
        replica's row: `folded`, the `slotted` rows summed by the optimizer's own all-reduce before the update,
        with this replica's shared columns; without it, `slotted` summed here, one collective more a step)."""
        rows = row[None]
        if self.gathered and folded is not None:
            rows = tf.where(self.shared[None], rows, folded)  # a NaN times 0 would be NaN: pick, not mask
        elif self.gathered:
            rows = context.all_reduce(tf.distribute.ReduceOp.SUM, self.slotted(context, row))
        step = self.counter.assign_add(1) - 1
        rows = tf.concat([tf.fill([rows.shape[0], 1], tf.cast(step, tf.float32)), rows], axis=1)
        slot = tf.reshape(step % self.per_execution, [1, 1])
        # On-read variables take whole assignments only (no scatter) in a replica.
        self.buffer.assign(tf.tensor_scatter_nd_update(tf.convert_to_tensor(self.buffer), slot, rows[None]))

    def read(self) -> list[tuple[int, np.ndarray]]:
        """(step, row) pairs of the steps finished since the last read, in step order."""
        # `value()` is one read; `numpy()` on the variable adds an identity op, which costs as
        # much again on every step.
        if self.replicas == 1:
            rows = self.buffer.value().numpy()
        elif self.gathered:
            rows = self.buffer.numpy()  # replica 0's copy, which holds every replica's row
        else:
            rows = np.concatenate([copy.value().numpy() for copy in self.strategy.experimental_local_results(
                self.buffer)], axis=1)
        fresh = sorted(((int(row.flat[0]), row) for row in rows if row.flat[0] >= self.next_step),
                       key=lambda pair: pair[0])
        if fresh:
            self.next_step = fresh[-1][0] + 1
        return fresh

    def record(self, step: int, row: np.ndarray) -> StepRecord:
        """A StepRecord from one row (under tf.distribute: one row per replica, merged)."""
        if row.ndim == 2:
            # Each replica's row ends in one more column: its own gradients' non-finite count.
            scalars, layer_stats, terms, var_stats = self.layout.split(row[:, len(HEAD):-1])
            counts = row[:, [HEAD.at("batch_rows"), -1]]
            return combine_replicas(step, int(counts[:, 0].sum()), scalars, layer_stats, terms, var_stats, counts)
        scalars, layer_stats, terms, var_stats = self.layout.split(row[len(HEAD):])
        return StepRecord.from_arrays(step, int(row[HEAD.at("batch_rows")]), scalars, layer_stats, terms, var_stats)
