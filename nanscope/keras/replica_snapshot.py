"""The step snapshot under `tf.distribute.MirroredStrategy`: each replica's state and its share of the batch.

Keras runs `train_step` once per replica, in replica context, on that replica's share of the batch. There the
snapshot steps out to the cross-replica context (`merge_call`: a step of the tracing threads, no collective) and
copies, as trace-steps' `DistributedStep` does, each device's own component of every variable into its own
component of a mirrored copy (`strategy.extended.update`, `group=False`): nothing moves between devices. Each
replica's share of the batch goes the same way into a mirrored variable of any shape, so the host can read every
replica's batch back and re-run the step on the same split. On the host each copy is put back component by
component: the metrics' totals (on-read variables, one per replica) come back per replica too.

It is kept under the guard only (`skip`, `rollback`, a ring, `skip_spikes`): the forensic replay op by op,
which one device's snapshot also serves, does not run under a strategy.
"""

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from nanscope.keras.snapshot import StepSnapshot
from nanscope.runtime import tensorflow
from nanscope.tf_types import Batch, Strategy, Tensor, Variable

tf, keras = tensorflow()


def components(variable: Variable, strategy: Strategy) -> Sequence[Any]:
    """The per-device components of a (Keras) variable under `strategy`, in replica order."""
    held = variable.value if isinstance(variable, keras.Variable) else variable
    return strategy.experimental_local_results(held)


def _assign_local(copy: Variable, value: Any) -> Any:
    return copy.assign(tf.convert_to_tensor(value))  # read in the update context: this device's component


class ReplicaCopies:
    """Mirrored copies of some variables, each device's component copied from its own (engine Snapshot's interface).

    Args:
        variables: list of variables made under `strategy`'s scope (mirrored or on-read).
        strategy: tf.distribute.MirroredStrategy.
    """

    def __init__(self, variables: Iterable[Variable], strategy: Strategy) -> None:
        self.variables = list(variables)
        self.strategy = strategy
        self._held = [v.value if isinstance(v, keras.Variable) else v for v in self.variables]
        with strategy.scope():
            self.copies = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="nanscope_snapshot")
                           for v in self._held]

    def take(self) -> None:
        """In cross-replica context, inside the step: copy every device's values on that device."""
        for copy, variable in zip(self.copies, self._held):
            self.strategy.extended.update(copy, _assign_local, args=(variable,), group=False)

    def restore(self) -> None:
        """On the host: put every device's copied values back into its component of each variable."""
        for variable, copy in zip(self._held, self.copies):
            for target, source in zip(self.strategy.experimental_local_results(variable),
                                      self.strategy.experimental_local_results(copy)):
                target.assign(source)

    def nbytes(self) -> int:
        return sum(int(v.shape.num_elements() or 0) * v.dtype.size for v in self.copies) * self.replicas

    @property
    def replicas(self) -> int:
        return int(self.strategy.num_replicas_in_sync)


class ReplicaStepSnapshot(StepSnapshot):
    """The state before the latest step and each replica's share of its batch, per device.

    `batch()` is a tuple of the replicas' batches, in replica order, each nested as the step received it.

    Args:
        variables: list of every variable a step changes (model, then optimizer), made under `strategy`'s scope.
        strategy: tf.distribute.MirroredStrategy, with one worker.
        extra: list of variables, default (). The metrics' totals, copied with the state but kept apart from it.
    """

    def __init__(self, variables: Iterable[Variable], strategy: Strategy, extra: Iterable[Variable] = ()) -> None:
        # Not StepSnapshot's own copies: one device's.
        self.strategy = strategy
        self.variables = list(variables)
        self.copies = ReplicaCopies(self.variables, strategy)
        self.state = self.copies  # type: ignore[assignment]  # engine Snapshot's interface, per device
        extra = list(extra)
        self.extra = ReplicaCopies(extra, strategy) if extra else None  # type: ignore[assignment]
        self.step = tf.Variable(tf.constant(-1, tf.int64), trainable=False, name="nanscope_snapshot_step")
        self.frozen = None  # one step an execution: the host sees every step before the next is copied
        self._batch: list[Variable | None] | None = None
        self._structure: Any = None

    def take(self, data: Batch, step: Tensor) -> None:
        """In a replica function, before the update: copy the state and this replica's batch on its device."""
        tf.distribute.get_replica_context().merge_call(self._copy_replicas, args=(tf.nest.flatten(data), step))

    def _copy_replicas(self, strategy: Strategy, flat: list[Any], step: Any) -> None:
        self.state.take()
        if self.extra is not None:
            self.extra.take()
        for variable, value in zip(self._replica_batch(strategy, flat), flat):
            if variable is not None:
                strategy.extended.update(variable, _assign_local, args=(value,), group=False)
        self.step.assign(tf.cast(strategy.experimental_local_results(step)[0], tf.int64))

    def _replica_batch(self, strategy: Strategy, flat: list[Any]) -> list[Variable | None]:
        firsts = [None if value is None else strategy.experimental_local_results(value)[0] for value in flat]
        if self._batch is None or [getattr(v, "dtype", None) for v in self._batch] != [
                getattr(first, "dtype", None) for first in firsts]:
            # Made while the step traces (no iterator's spec came first, or another): TensorFlow traces it once more.
            with tf.init_scope():
                self._batch = self._batch_variables(firsts)
        return self._batch

    def make_batch(self, element_spec: Any) -> None:
        """Before the step's first trace (a variable made in it would have it traced twice): the batch copies, from
        the element spec of the train function's iterator (one per-replica spec for each tensor of the batch)."""
        if self._batch is not None or element_spec is None:
            return
        try:
            self._batch = self._batch_variables(
                [tf.nest.flatten(spec, expand_composites=True)[0] for spec in tf.nest.flatten(element_spec)])
        except (TypeError, ValueError, IndexError):  # a spec of another make: the step's trace makes them instead
            self._batch = None

    def _batch_variables(self, firsts: list[Any]) -> list[Variable | None]:
        """A mirrored variable of any shape for each tensor (or TensorSpec) of one replica's batch."""
        with self.strategy.scope():
            return [None if first is None or not hasattr(first, "dtype") else tf.Variable(
                tf.zeros([0] * first.shape.rank if first.shape.rank is not None else [0], first.dtype),
                shape=tf.TensorShape(None), trainable=False, name="nanscope_batch") for first in firsts]

    def batch(self) -> Batch:
        """Each replica's held batch as eager tensors on its device, nested as the step received it (a tuple)."""
        flats = [[None if v is None else tf.convert_to_tensor(self.strategy.experimental_local_results(v)[replica])
                  for v in self._batch or []] for replica in range(self.copies.replicas)]
        if self._structure is None:
            return None
        return tuple(tf.nest.pack_sequence_as(self._structure, flat) for flat in flats)

    def read(self, variables: Iterable[Variable]) -> list[np.ndarray]:
        """Every device's values of each variable, stacked on a replica axis."""
        return [np.stack([c.numpy() for c in components(v, self.strategy)]) for v in variables]

    def write(self, variables: Iterable[Variable], values: Iterable[np.ndarray]) -> None:
        """Put `read`'s values back, each device's into its own component."""
        for variable, stacked in zip(variables, values):
            for component, value in zip(components(variable, self.strategy), stacked):
                component.assign(value)

    def nbytes(self) -> int:
        return self.copies.nbytes()
