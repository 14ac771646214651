"""Every intervention of the guard (a skip, a rollback, a stop) and every spike, bounded for any run length."""

from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

# Entries kept of each list; past it they are counted, not kept (memory stays flat over 10^5 steps).
KEPT = 200


class _Entry(Protocol):
    def to_json(self) -> dict[str, Any]: ...


E = TypeVar("E", bound=_Entry)


@dataclass
class Intervention:
    """One thing the guard did to the run.

    Args:
        step: int. The step it acted on.
        action: str. skip | rollback | stop.
        reason: str. Why, in words ("non-finite loss", "loss spike: z=9.1 over 128 steps").
        details: dict. What else it did: the step restored, the learning rate before and after, the steps undone.
    """

    step: int
    action: str
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "action": self.action, "reason": self.reason, **self.details}


@dataclass
class Spike:
    """A loss or gradient-norm spike: a robust z-score above the threshold.

    Args:
        step: int.
        metric: str. loss | grad_global_norm.
        value, median, z: float. The value, the window's median, and how many robust standard deviations above it.
        window: int. Steps the median was taken over.
        rows: list of dict. The batch rows with the largest loss ({row, loss}), when they could be measured.
        layers: list of dict. The variables whose update ratio jumped most ({variable, update_ratio, median}).
        skipped: bool. The step's update was undone (`skip_spikes`).
    """

    step: int
    metric: str
    value: float
    median: float
    z: float
    window: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    layers: list[dict[str, Any]] = field(default_factory=list)
    skipped: bool = False

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


class BoundedLog(Generic[E]):
    """The first KEPT entries of a list, and how many there were in all."""

    def __init__(self, kept: int = KEPT) -> None:
        self.entries: list[E] = []
        self.total, self.kept = 0, kept

    def add(self, entry: E) -> None:
        self.total += 1
        if len(self.entries) < self.kept:
            self.entries.append(entry)

    def __len__(self) -> int:
        return self.total

    def to_json(self) -> list[dict[str, Any]]:
        return [entry.to_json() for entry in self.entries]

    def note(self, what: str) -> str | None:
        """A report note when entries were left out, else None."""
        if self.total <= len(self.entries):
            return None
        return f"{what}: {self.total} in all; the first {len(self.entries)} are listed"
