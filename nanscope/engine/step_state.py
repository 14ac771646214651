"""The state before the last step, copied on the device: the model's always, the optimizer's under the guard.

The instrumented step (engine/step.py) copies the model's variables before each update (one extra copy of the
weights, and a LossScaleOptimizer's scale and counter), so the step can be replayed from where it started.
Under the guard it copies the optimizer's variables too (its counter and slots), so a skipped step can be
undone whole. `StepState` holds both copies and puts them back.

Example:
    state = StepState(model_variables)
    state.keep_optimizer(optimizer.variables)     # before the step is traced
    ...                                           # the traced step calls state.take() before its update
    with state.kept():
        state.restore(optimizer=True)             # re-run the step from before it; the variables come back after
"""

import contextlib
from collections.abc import Iterable, Iterator

import numpy as np

from nanscope.engine.variable_stats import Snapshot
from nanscope.tf_types import Variable


class StepState:
    """The copies of the state before the last step.

    Args:
        model: list of Variable. The model's state: its trainable variables first, then the others it owns.
    """

    optimizer: Snapshot | None

    def __init__(self, model: Iterable[Variable]) -> None:
        self.model = Snapshot(model)
        self.optimizer = None  # `keep_optimizer`

    def keep_optimizer(self, variables: Iterable[Variable]) -> None:
        """Copy the optimizer's `variables` too (those not already in the model's copy). Before the step is traced."""
        if self.optimizer is None:
            kept = {id(v) for v in self.model.variables}
            self.optimizer = Snapshot([v for v in variables if id(v) not in kept])

    def snapshots(self) -> list[Snapshot]:
        """The model's copy, then the optimizer's (when kept)."""
        return [self.model] if self.optimizer is None else [self.model, self.optimizer]

    def take(self) -> None:
        """Copy every kept variable's current value (inside the traced step, before the update)."""
        for snapshot in self.snapshots():
            snapshot.take()

    def restore(self, optimizer: bool = False) -> None:
        """Put the model's state back as it was before the last step; the optimizer's too with `optimizer=True`."""
        self.model.restore()
        if optimizer and self.optimizer is not None:
            self.optimizer.restore()

    def variables(self) -> list[Variable]:
        """Every variable copied: the model's state, then the optimizer's."""
        return [v for snapshot in self.snapshots() for v in snapshot.variables]

    def copies(self) -> list[Variable]:
        """The copies themselves (a re-run through the step overwrites them)."""
        return [c for snapshot in self.snapshots() for c in snapshot.copies]

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        """For the block: anything; afterwards every variable copied, and the copies, as they were."""
        kept = self.variables() + self.copies()
        live = [np.array(v.numpy(), copy=True) for v in kept]
        try:
            yield
        finally:
            for variable, value in zip(kept, live):
                variable.assign(value)
