"""The variables the guard puts back: the state before the held step, an earlier state, the learning rate.

The step snapshot (`keras/snapshot.py`) already holds, on the device, the weights and
the optimizer's variables (its iteration counter, its slots and, under mixed precision,
the loss scale and its counter) as they were before the latest step, and that step's
batch. The guard reuses it: a skip puts it back. The metrics' totals are copied with
it (`extra`), so the logs and the epoch's averages leave the skipped step out.
"""

import contextlib

import numpy as np


class LearningRates:
    """The learning rates a rollback lowers: each optimizer's, read and set as floats.

    Args:
        optimizers: list of keras.Optimizer.
    """

    def __init__(self, optimizers=()):
        self.optimizers = [o for o in optimizers if o is not None]

    def learning_rates(self):
        """Each optimizer's learning rate now (float), None where it cannot be read."""
        return [_read_rate(o) for o in self.optimizers]

    def set_learning_rates(self, rates):
        """Set each optimizer's learning rate; the ones that cannot be set (a schedule) are named in the result."""
        refused = []
        for optimizer, rate in zip(self.optimizers, rates):
            if rate is None:
                continue
            try:
                optimizer.learning_rate = rate
            except (TypeError, AttributeError, ValueError) as exc:
                refused.append(f"{optimizer.name}: {type(exc).__name__}")
        return refused


class GuestState(LearningRates):
    """What the guard can read and put back in a guest run.

    Args:
        snapshot: StepSnapshot. Its `variables` are the model's and the optimizers' variables.
        optimizers: list of keras.Optimizer. Whose learning rate a rollback lowers.
    """

    def __init__(self, snapshot, optimizers=()):
        super().__init__(optimizers)
        self.snapshot = snapshot

    def held_step(self):
        return self.snapshot.held_step()

    def batch(self):
        return self.snapshot.batch()

    def current(self):
        """The guarded variables' values now, as numpy arrays (a ring entry)."""
        return [np.array(v.numpy(), copy=True) for v in self.snapshot.variables]

    def live(self):
        """Every variable a re-run changes (the guarded ones, then the metrics), as numpy arrays."""
        return [np.array(v.numpy(), copy=True) for v in self.snapshot.variables + self._metrics()]

    def put_live(self, values):
        for variable, value in zip(self.snapshot.variables + self._metrics(), values):
            variable.assign(value)

    def put(self, values):
        """Put a ring entry's values back into the guarded variables."""
        for variable, value in zip(self.snapshot.variables, values):
            variable.assign(value)

    def restore_before_step(self):
        """Put back the state before the held step, the metrics' totals too, and let the snapshot copy again."""
        self.snapshot.state.restore()
        if self.snapshot.extra is not None:
            self.snapshot.extra.restore()
        self.thaw()

    def thaw(self):
        """Let the snapshot copy again (it froze at the non-finite step of an execution)."""
        if self.snapshot.frozen is not None:
            self.snapshot.frozen.assign(False)

    @contextlib.contextmanager
    def before_step(self, values=None):
        """For the block: the state before the held step (or the ring entry `values`, with the metrics from before
        the held step); afterwards everything as it was, the snapshot's freeze flag included."""
        live = self.live()
        frozen = bool(self.snapshot.frozen.numpy()) if self.snapshot.frozen is not None else None
        try:
            self.snapshot.state.restore()
            self.restore_metrics()
            if values is not None:
                self.put(values)
            yield
        finally:
            self.put_live(live)
            if frozen is not None:
                self.snapshot.frozen.assign(frozen)

    def restore_metrics(self):
        if self.snapshot.extra is not None:
            self.snapshot.extra.restore()

    def _metrics(self):
        return list(self.snapshot.extra.variables) if self.snapshot.extra is not None else []

    def nbytes(self):
        return sum(int(v.shape.num_elements() or 0) * v.dtype.size for v in self.snapshot.variables)


def _read_rate(optimizer):
    try:
        return float(np.asarray(optimizer.learning_rate))
    except (TypeError, ValueError, AttributeError):
        return None
