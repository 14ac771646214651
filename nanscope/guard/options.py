"""What the guard does at a non-finite step or a loss spike, validated once, at the edge."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ON_NONFINITE = ("stop", "continue", "skip", "rollback")
MODES = ("full", "sentinel")


@dataclass(frozen=True)
class GuardOptions:
    """The guard's settings (`NanScope(guard=...)`, `instrument(guard=...)`).

    Args:
        on_nonfinite: str, default "stop". stop | continue | skip | rollback.
        max_skips: (int, int), default (10, 100). Consecutive and total skipped steps; past either the run stops.
        snapshot_every: int, default None. Steps between the earlier states the ring keeps on the host
            (0: none). None: 100 under "rollback", else none (each state is a host copy of the weights and
            the optimizer's state; `origin` needs one).
        snapshots: int, default 2. Earlier states kept on the host (the ring's size).
        max_rollbacks: int, default 5. Rollbacks; one more non-finite step stops the run.
        lr_factor: float, default 0.1. A rollback multiplies the learning rate by this.
        skip_spikes: bool, default False. Skip a loss or gradient-norm spike's update too.
        spike_sigma: float, default 6.0. A spike is this many robust standard deviations above the median.
        spike_window: int, default 128. Steps the median and the spread are taken over.
        mode: str, default "full". full | sentinel (per step only what detection needs).
        sample_every: int, default 100. In sentinel mode, every Nth step is recorded in full.
        verdicts: bool, default True. Re-run the first non-finite step to say whether it reproduces and why.
        apply_fix: bool, default True. Under "rollback": apply the fix that the rolled-back steps prove (trace-steps)
            or the saved step's batch does (`NanScope`, `instrument`): the rules' learning-rate, clipping or epsilon
            fix under which they stay finite and the loss falls; lower the learning rate only when none is proven.

    Example:
        NanScope(on_nonfinite="skip", guard=GuardOptions(max_skips=(3, 20)))
    """

    on_nonfinite: str = "stop"
    max_skips: tuple = (10, 100)
    snapshot_every: int | None = None
    snapshots: int = 2
    max_rollbacks: int = 5
    lr_factor: float = 0.1
    skip_spikes: bool = False
    spike_sigma: float = 6.0
    spike_window: int = 128
    mode: str = "full"
    sample_every: int = 100
    verdicts: bool = True
    apply_fix: bool = True

    def __post_init__(self) -> None:
        _one_of("on_nonfinite", self.on_nonfinite, ON_NONFINITE)
        _one_of("mode", self.mode, MODES)
        skips = self.max_skips
        if isinstance(skips, int) and not isinstance(skips, bool):
            skips = (skips, skips)
        if (not isinstance(skips, (tuple, list)) or len(skips) != 2
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in skips)):
            raise ValueError("`max_skips` must be an int >= 1 or a pair (consecutive, total) of them. "
                             f"Received: max_skips={self.max_skips!r}")
        object.__setattr__(self, "max_skips", tuple(skips))
        for name, low in (("snapshot_every", 0), ("snapshots", 1), ("max_rollbacks", 1), ("spike_window", 8),
                          ("sample_every", 1)):
            value = getattr(self, name)
            if name == "snapshot_every" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"`{name}` must be an int >= {low}. Received: {name}={value!r}")
        if not 0.0 < float(self.lr_factor) < 1.0:
            raise ValueError(f"`lr_factor` must be > 0 and < 1. Received: lr_factor={self.lr_factor!r}")
        if not float(self.spike_sigma) > 0.0:
            raise ValueError(f"`spike_sigma` must be > 0. Received: spike_sigma={self.spike_sigma!r}")

    @property
    def ring_every(self) -> int:
        """Steps between the ring's states: `snapshot_every`, or by default 100 under rollback and 0 (none) else."""
        if self.snapshot_every is not None:
            return self.snapshot_every
        return 100 if self.on_nonfinite == "rollback" else 0

    @property
    def intervenes(self) -> bool:
        """True when the guard may change the run: skip, rollback or skipping spikes (the user asked for it)."""
        return self.on_nonfinite in ("skip", "rollback") or self.skip_spikes

    @property
    def stops(self) -> bool:
        return self.on_nonfinite == "stop"


def resolve_on_nonfinite(on_nonfinite: str | None, stop_on_nonfinite: bool | None) -> str | None:
    """`on_nonfinite`, with `stop_on_nonfinite` as its alias (True: "stop", False: "continue"); None if neither."""
    if stop_on_nonfinite is None:
        return on_nonfinite
    alias = "stop" if stop_on_nonfinite else "continue"
    if on_nonfinite is not None and on_nonfinite != alias:
        raise ValueError("`stop_on_nonfinite` is an alias of `on_nonfinite`; give one. "
                         f"Received: on_nonfinite={on_nonfinite!r}, stop_on_nonfinite={stop_on_nonfinite!r}")
    return alias


def guard_options(guard: "GuardOptions | None" = None, **fields: Any) -> "GuardOptions":
    """`guard` (default GuardOptions()) with the fields given (not None) replaced; validated."""
    import dataclasses

    if guard is not None and not isinstance(guard, GuardOptions):
        raise ValueError(f"`guard` must be a nanscope.guard.GuardOptions. Received: guard={guard!r}")
    given = {name: value for name, value in fields.items() if value is not None}
    return dataclasses.replace(guard or GuardOptions(), **given)


def _one_of(name: str, value: object, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"`{name}` must be one of {', '.join(allowed)}. Received: {name}={value!r}")
