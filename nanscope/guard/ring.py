"""A bounded ring of earlier states, kept on the host every `snapshot_every` steps, for rollback and verdicts."""

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass
class RingEntry:
    """The state before `step`: the values of the guarded variables, in their order (numpy arrays)."""

    step: int
    values: list[np.ndarray]

    def nbytes(self) -> int:
        return sum(int(getattr(value, "nbytes", 0)) for value in self.values)


class SnapshotRing:
    """The last `size` states taken, oldest first; a new one pushes the oldest out.

    Args:
        size: int. States kept.
        every: int. Steps between two states.
    """

    def __init__(self, size: int, every: int) -> None:
        self.entries: deque[RingEntry] = deque(maxlen=size)
        self.every = every
        self._last: int | None = None

    def due(self, next_step: int) -> bool:
        """True when the state before `next_step` should be taken (none yet, or `every` steps since the last)."""
        return self._last is None or next_step - self._last >= self.every

    def take(self, next_step: int, values: list[np.ndarray]) -> None:
        """Keep `values` as the state before `next_step`."""
        self.entries.append(RingEntry(next_step, values))
        self._last = next_step

    def before(self, step: int, newest: bool = True) -> RingEntry | None:
        """The newest (or oldest) entry taken strictly before `step`, or None."""
        earlier = [entry for entry in self.entries if entry.step < step]
        if not earlier:
            return None
        return earlier[-1] if newest else earlier[0]

    def drop_from(self, entry: RingEntry) -> None:
        """Forget `entry` and every newer one (a rollback went past them)."""
        while self.entries and self.entries[-1].step >= entry.step:
            self.entries.pop()
        self._last = self.entries[-1].step if self.entries else None

    def restart(self, next_step: int) -> None:
        """After a rollback to the state before `next_step`: the next state is due `every` steps from there."""
        self._last = next_step

    def nbytes(self) -> int:
        return sum(entry.nbytes() for entry in self.entries)
