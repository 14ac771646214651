"""The variables the guard puts back: the state before the held step, an earlier state, the learning rate.

The step snapshot (`keras/snapshot.py`) already holds, on the device, the weights and
the optimizer's variables (its iteration counter, its slots and, under mixed precision,
the loss scale and its counter) as they were before the latest step, and that step's
batch. The guard reuses it: a skip puts it back. The metrics' totals are copied with
it (`extra`), so the logs and the epoch's averages leave the skipped step out.
"""

import contextlib
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np

from nanscope.tf_types import Batch, Optimizer, Variable


class _Copy(Protocol):
    """Device copies of some variables (keras.snapshot.Snapshot, a layer up)."""

    @property
    def variables(self) -> list[Variable]: ...

    def restore(self) -> None: ...


class StepSnapshot(Protocol):
    """The state before the latest step and its batch, on the device (keras.snapshot.StepSnapshot, a layer up)."""

    @property
    def variables(self) -> list[Variable]: ...

    @property
    def state(self) -> _Copy: ...

    @property
    def extra(self) -> _Copy | None: ...

    @property
    def frozen(self) -> Variable | None: ...

    def held_step(self) -> int: ...

    def batch(self) -> Batch: ...

    def read(self, variables: Iterable[Variable]) -> list[np.ndarray]: ...

    def write(self, variables: Iterable[Variable], values: Iterable[np.ndarray]) -> None: ...


class State(Protocol):
    """What the guard reads and puts back: a GuestState, or trace-steps' TraceState (run.guard_state, a layer up)."""

    def held_step(self) -> int: ...

    def batch(self) -> Batch: ...

    def current(self) -> list[np.ndarray]: ...

    def put(self, values: Iterable[np.ndarray]) -> None: ...

    def restore_before_step(self) -> None: ...

    def restore_metrics(self) -> None: ...

    def thaw(self) -> None: ...

    def before_step(self, values: Iterable[np.ndarray] | None = None) -> AbstractContextManager[None]: ...

    def learning_rates(self) -> list[float | None]: ...

    def set_learning_rates(self, rates: Iterable[float | None]) -> list[str]: ...

    def nbytes(self) -> int: ...


class LearningRates:
    """The learning rates a rollback lowers: each optimizer's, read and set as floats.

    Args:
        optimizers: list of keras.Optimizer.
    """

    def __init__(self, optimizers: Iterable[Optimizer | None] = ()) -> None:
        self.optimizers = [o for o in optimizers if o is not None]

    def learning_rates(self) -> list[float | None]:
        """Each optimizer's learning rate now (float), None where it cannot be read."""
        return [_read_rate(o) for o in self.optimizers]

    def set_learning_rates(self, rates: Iterable[float | None]) -> list[str]:
        """Set each optimizer's learning rate; the ones that cannot be set (a schedule) are named in the result."""
        refused: list[str] = []
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

    def __init__(self, snapshot: StepSnapshot, optimizers: Iterable[Optimizer | None] = ()) -> None:
        super().__init__(optimizers)
        self.snapshot = snapshot

    def held_step(self) -> int:
        return self.snapshot.held_step()

    def batch(self) -> Batch:
        return self.snapshot.batch()

    def current(self) -> list[np.ndarray]:
        """The guarded variables' values now, as numpy arrays (a ring entry)."""
        return [np.array(v.numpy(), copy=True) for v in self.snapshot.variables]

    def live(self) -> list[np.ndarray]:
        """Every variable a re-run changes (the guarded ones, then the metrics), as numpy arrays."""
        return self.snapshot.read(self.snapshot.variables + self._metrics())

    def put_live(self, values: Iterable[np.ndarray]) -> None:
        self.snapshot.write(self.snapshot.variables + self._metrics(), values)

    def put(self, values: Iterable[np.ndarray]) -> None:
        """Put a ring entry's values back into the guarded variables."""
        for variable, value in zip(self.snapshot.variables, values):
            variable.assign(value)

    def restore_before_step(self) -> None:
        """Put back the state before the held step, the metrics' totals too, and let the snapshot copy again."""
        self.snapshot.state.restore()
        if self.snapshot.extra is not None:
            self.snapshot.extra.restore()
        self.thaw()

    def thaw(self) -> None:
        """Let the snapshot copy again (it froze at the non-finite step of an execution)."""
        if self.snapshot.frozen is not None:
            self.snapshot.frozen.assign(False)

    @contextlib.contextmanager
    def before_step(self, values: Iterable[np.ndarray] | None = None) -> Iterator[None]:
        """For the block: the state before the held step (or the ring entry `values`, with the metrics from before
        the held step); afterwards everything as it was, the snapshot's freeze flag included."""
        live = self.live()
        flag = self.snapshot.frozen
        frozen = bool(flag.numpy()) if flag is not None else None
        try:
            self.snapshot.state.restore()
            self.restore_metrics()
            if values is not None:
                self.put(values)
            yield
        finally:
            self.put_live(live)
            if flag is not None:
                flag.assign(frozen)

    def restore_metrics(self) -> None:
        if self.snapshot.extra is not None:
            self.snapshot.extra.restore()

    def _metrics(self) -> list[Variable]:
        return list(self.snapshot.extra.variables) if self.snapshot.extra is not None else []

    def nbytes(self) -> int:
        return sum(int(v.shape.num_elements() or 0) * v.dtype.size for v in self.snapshot.variables)


def _read_rate(optimizer: Optimizer) -> float | None:
    try:
        return float(np.asarray(optimizer.learning_rate))
    except (TypeError, ValueError, AttributeError):
        return None
