"""A bounded ring of earlier states, kept on the host every `snapshot_every` steps, for rollback and verdicts."""

from collections import deque
from dataclasses import dataclass


@dataclass
class RingEntry:
    """The state before `step`: the values of the guarded variables, in their order (numpy arrays)."""

    step: int
    values: list

    def nbytes(self):
        return sum(int(getattr(value, "nbytes", 0)) for value in self.values)


class SnapshotRing:
    """The last `size` states taken, oldest first; a new one pushes the oldest out.

    Args:
        size: int. States kept.
        every: int. Steps between two states.
    """

    def __init__(self, size, every):
        self.entries, self.every = deque(maxlen=size), every
        self._last = None

    def due(self, next_step):
        """True when the state before `next_step` should be taken (none yet, or `every` steps since the last)."""
        return self._last is None or next_step - self._last >= self.every

    def take(self, next_step, values):
        """Keep `values` as the state before `next_step`."""
        self.entries.append(RingEntry(next_step, values))
        self._last = next_step

    def before(self, step, newest=True):
        """The newest (or oldest) entry taken strictly before `step`, or None."""
        earlier = [entry for entry in self.entries if entry.step < step]
        if not earlier:
            return None
        return earlier[-1] if newest else earlier[0]

    def drop_from(self, entry):
        """Forget `entry` and every newer one (a rollback went past them)."""
        while self.entries and self.entries[-1].step >= entry.step:
            self.entries.pop()
        self._last = self.entries[-1].step if self.entries else None

    def restart(self, next_step):
        """After a rollback to the state before `next_step`: the next state is due `every` steps from there."""
        self._last = next_step

    def nbytes(self):
        return sum(entry.nbytes() for entry in self.entries)
