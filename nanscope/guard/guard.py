"""`Guard`: reads each step's record and, where the user asked for it, skips, rolls back or stops.

A guest run (the `NanScope` callback, `instrument`) hands the guard its records after
each execution, once the recorder has attributed them. The guard:

- keeps an earlier state in the ring every `snapshot_every` healthy steps;
- on the first non-finite step, re-runs it for the verdicts (`verdicts.judge`);
- on a non-finite step, does what `on_nonfinite` says: stop, continue, skip (put back the state
  before the step) or rollback (put back an earlier state and lower the learning rate);
- scores each healthy step for a loss or gradient-norm spike, and under `skip_spikes` skips it too;
- stops the run past `max_skips` (consecutive or total) or `max_rollbacks`.

Every action is an `Intervention` in the report. A failure of the guard's own code is
the owner's to catch (one warning, a note); the guard never raises into the user's run.
"""

import math
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np

from nanscope.engine.records import StepRecord
from nanscope.guard.options import GuardOptions

from nanscope.guard.interventions import BoundedLog, Intervention, Spike
from nanscope.guard.ring import RingEntry, SnapshotRing
from nanscope.guard.spikes import SpikeDetector
from nanscope.guard.state import State
from nanscope.tf_types import Batch
from nanscope.guard.verdicts import judge

if TYPE_CHECKING:
    from nanscope.report.model import FirstNonfinite

JUMP = 3.0  # a variable's update ratio this many times its recent median counts as a jump at a spike
# The compiled step again on a batch, from the variables as they are; each batch row's loss.
Rerun: TypeAlias = Callable[[Batch], StepRecord]
RowLosses: TypeAlias = Callable[[Batch], np.ndarray]


class Fixer(Protocol):
    """What proves the fix a rollback applies (run.proven_fix.FixProver, keras.guest_fix: a layer up)."""

    def prove(self, start: int, failing: int, exclude: Collection[str] = ()
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]: ...


class Guard:
    """The guard of one guest run.

    Args:
        options: GuardOptions.
        state: GuestState or None (no snapshot: no skip, rollback or verdict can be made).
        rerun: callable(batch) -> StepRecord, optional. The compiled step again, for the verdicts.
        row_losses: callable(batch) -> 1-D array, optional. Each batch row's loss, for a spike's rows.
        variable_names: list of str. The trainable variables' names, in record order.
        fixer: FixProver, optional. Finds the fix a rollback applies instead of lowering the learning rate
            (trace-steps, `GuardOptions.apply_fix`).
    """

    def __init__(self, options: GuardOptions, state: State | None = None, rerun: Rerun | None = None,
                 row_losses: RowLosses | None = None, variable_names: Iterable[str] = (),
                 fixer: Fixer | None = None) -> None:
        self.options, self.state, self.rerun, self.row_losses = options, state, rerun, row_losses
        self.fixer = fixer if options.apply_fix else None
        self.applied_fixes: list[str] = []
        self.variable_names = list(variable_names)
        self.ring = (SnapshotRing(options.snapshots, options.ring_every)
                     if state is not None and options.ring_every else None)
        self.detector = SpikeDetector(options.spike_sigma, options.spike_window)
        self.interventions: BoundedLog[Intervention] = BoundedLog()
        self.spikes: BoundedLog[Spike] = BoundedLog()
        self.skips = self.consecutive = self.rollbacks = 0
        self.stop_reason: str | None = None
        self.notes: list[str] = []
        self._ratios: np.ndarray | None = None  # [window, variables] update ratios of the last healthy steps
        self._ratio_count = 0
        self._rolled_to: int | None = None

    def observe(self, records: list[StepRecord], first: "FirstNonfinite | None" = None) -> Intervention | None:
        """Act on the records of one execution; return the Intervention made on it (None: the run went on as is).

        Args:
            records: list of StepRecord, in step order, attributed (`expected_nonfinite` set).
            first: FirstNonfinite, when one of these records is the run's first non-finite step.
        """
        if first is not None and self.options.verdicts:
            self._verdicts(first)
        for index, record in enumerate(records):
            undone = len(records) - index - 1
            if record.phase is not None:
                return self._nonfinite(record, undone)
            spike = self._spike(record)
            if spike is not None and self.options.skip_spikes:
                made = self._skip(record, f"{spike.metric} spike: z={spike.z:.1f} over {spike.window} steps", undone)
                spike.skipped = made is not None and made.action == "skip"
                return made
            self.consecutive = 0
        if records and self.ring is not None and self.state is not None and self.ring.due(records[-1].step + 1):
            self.ring.take(records[-1].step + 1, self.state.current())
        return None

    def _verdicts(self, first: "FirstNonfinite") -> None:
        if self.state is None or self.rerun is None:
            return
        self.notes.extend(judge(first, self.state, self.rerun, self.ring))

    def _nonfinite(self, record: StepRecord, undone: int) -> Intervention | None:
        reason = f"non-finite {record.phase} pass"
        action = self.options.on_nonfinite
        if action == "skip":
            return self._skip(record, reason, undone)
        if action == "rollback":
            return self._rollback(record, reason, undone)
        return None

    def _add(self, intervention: Intervention) -> Intervention:
        self.interventions.add(intervention)
        return intervention

    def _stop(self, record: StepRecord, reason: str) -> Intervention:
        self.stop_reason = reason
        return self._add(Intervention(record.step, "stop", reason))

    def _skip(self, record: StepRecord, reason: str, undone: int) -> Intervention:
        """Put back the state before `record`'s step, unless a bound is past; the Intervention made."""
        consecutive, total = self.options.max_skips
        if self.consecutive >= consecutive or self.skips >= total:
            bound = (f"{consecutive} consecutive" if self.consecutive >= consecutive else f"{total} in all")
            return self._stop(record, f"{reason}; max_skips reached ({bound})")
        if self.state is None or self.state.held_step() != record.step:
            held = self.state.held_step() if self.state is not None else None
            return self._stop(record, f"{reason}; cannot skip: the device holds the state before step {held}")
        self.state.restore_before_step()
        self.skips += 1
        self.consecutive += 1
        details: dict[str, Any] = {"skips": self.skips, "consecutive": self.consecutive}
        if undone:
            details["undone_steps"] = undone  # later steps of the same execution ran from the bad state
        return self._add(Intervention(record.step, "skip", reason, details))

    def _rollback(self, record: StepRecord, reason: str, undone: int) -> Intervention:
        """Put back the newest earlier state (an older one when the last rollback led here again), lower the
        learning rate; past `max_rollbacks`, stop."""
        if self.rollbacks >= self.options.max_rollbacks:
            return self._stop(record, f"{reason}; max_rollbacks reached ({self.options.max_rollbacks})")
        if self.state is None:
            return self._stop(record, f"{reason}; cannot roll back: no state is kept")
        ring = self.ring
        entry = ring.before(record.step) if ring is not None else None
        if ring is not None and entry is not None and self._rolled_to is not None and entry.step == self._rolled_to:
            older = ring.before(entry.step)
            if older is not None:  # the last rollback came back here: go further back
                ring.drop_from(entry)
                entry = older
        rates = self.state.learning_rates()
        details: dict[str, Any] = {}
        if ring is not None and entry is not None:
            self.state.put(entry.values)
            self.state.restore_metrics()
            ring.drop_from(_after(entry))
            ring.restart(entry.step)
            self._rolled_to = entry.step
            details["restored_step"] = entry.step
        elif self.state.held_step() == record.step:
            self.state.restore_before_step()
            details["restored_step"] = record.step
            details["note"] = "no earlier state kept yet: the state before this step was put back"
        else:
            return self._stop(record, f"{reason}; cannot roll back: no earlier state kept")
        self.state.thaw()
        if not self._apply_fix(record, details):
            lowered = [r * self.options.lr_factor if r is not None else None for r in rates]
            refused = self.state.set_learning_rates(lowered)
            details["learning_rate"] = [_rate_pair(before, after) for before, after in zip(rates, lowered)]
            if refused:
                details["learning_rate_not_lowered"] = refused
        if undone:
            details["undone_steps"] = undone
        self.rollbacks += 1
        details["rollbacks"] = self.rollbacks
        return self._add(Intervention(record.step, "rollback", reason, details))

    def _apply_fix(self, record: StepRecord, details: dict[str, Any]) -> bool:
        """Apply the fix proven on the rolled-back steps (`proven_fix`), one not applied before; True when one
        was. The fixes tried go in `details` either way."""
        if self.fixer is None:
            return False
        fix, tried = self.fixer.prove(details["restored_step"], record.step, exclude=self.applied_fixes)
        if tried:
            details["fixes_tried"] = tried
        if not fix:
            return False
        details["fix"] = fix
        self.applied_fixes.append(fix["name"])
        return True

    def _spike(self, record: StepRecord) -> Spike | None:
        """The Spike this healthy step is, or None; keeps the update-ratio window."""
        found = self.detector.score(record)
        if found is None:
            self._keep_ratios(record)
            return None
        metric, value, median, z = found
        full = self._full(record)
        spike = Spike(record.step, metric, value, median, z, self.detector.window,
                      layers=self._jumped(full) if full is not None else [])
        spike.rows = self._rows(record.step)
        self.spikes.add(spike)
        return spike

    def _full(self, record: StepRecord) -> StepRecord | None:
        """`record` when it has per-variable rows, else (sentinel mode) the step re-run in full from the state
        before it, or None when that state is not held."""
        if record.variables:
            return record
        if self.rerun is None or self.state is None or self.state.held_step() != record.step:
            return None
        with self.state.before_step():
            return self.rerun(self.state.batch())

    def _keep_ratios(self, record: StepRecord) -> None:
        ratios = [v.update_ratio for v in record.variables]
        if not ratios:
            return
        if self._ratios is None or self._ratios.shape[1] != len(ratios):
            self._ratios, self._ratio_count = np.zeros((self.options.spike_window, len(ratios))), 0
        self._ratios[self._ratio_count % len(self._ratios)] = ratios
        self._ratio_count += 1

    def _jumped(self, record: StepRecord) -> list[dict[str, Any]]:
        """The variables whose update ratio jumped most against their recent median (at most 3)."""
        if self._ratios is None or not record.variables or self._ratio_count == 0:
            return []
        medians = np.median(self._ratios[:min(self._ratio_count, len(self._ratios))], axis=0)
        jumps = []
        for index, (stats, median) in enumerate(zip(record.variables, medians)):
            ratio = stats.update_ratio
            if math.isfinite(ratio) and median > 0 and ratio >= JUMP * median:
                jumps.append((ratio / median, index, ratio, float(median)))
        return [{"variable": self._name(index), "update_ratio": ratio, "median": median}
                for _, index, ratio, median in sorted(jumps, reverse=True)[:3]]

    def _name(self, index: int) -> str:
        return self.variable_names[index] if index < len(self.variable_names) else f"variable {index}"

    def _rows(self, step: int) -> list[dict[str, Any]]:
        """The three batch rows with the largest loss, from the state before the step (when it is held)."""
        if self.row_losses is None or self.state is None or self.state.held_step() != step:
            return []
        with self.state.before_step():
            losses = np.asarray(self.row_losses(self.state.batch()), np.float64).reshape(-1)
        if not losses.size:
            return []
        order = np.argsort(-np.nan_to_num(losses, nan=np.inf))[:3]
        return [{"row": int(i), "loss": float(losses[i]), "median": float(np.median(losses))} for i in order]

    def report_notes(self) -> list[str]:
        """What the guard adds to the report's notes."""
        notes = list(self.notes)
        for action in ("skip", "rollback"):
            steps = [i.step for i in self.interventions.entries if i.action == action]
            if steps:
                shown = ", ".join(map(str, steps[:8])) + (", ..." if len(steps) > 8 else "")
                notes.append(f"guard: {action} at {len(steps)} step(s): {shown} (`interventions` in the JSON)")
        for entry in self.interventions.entries:
            fix = entry.details.get("fix")
            if fix:
                notes.append(f"guard: the rollback at step {entry.step} applied {fix['name']} ({fix['rule']}): "
                             f"{fix['why']}")
        if self.spikes.total:
            notes.append(f"guard: {self.spikes.total} loss or gradient-norm spike(s), the first at step "
                         f"{self.spikes.entries[0].step} (`spikes` in the JSON)")
        for what, log in (("interventions", self.interventions), ("spikes", self.spikes)):
            note = log.note(what)
            if note:
                notes.append(note)
        if self.ring is not None and self.ring.entries:
            notes.append(f"guard: {len(self.ring.entries)} earlier state(s) kept on the host every "
                         f"{self.ring.every} steps ({self.ring.nbytes() / 2**20:.1f} MiB)")
        if self.stop_reason:
            notes.append(f"guard: stopped the run: {self.stop_reason}")
        return notes


def _after(entry: RingEntry) -> RingEntry:
    """A marker one step past `entry`, so `drop_from` forgets only what is newer than it."""
    return RingEntry(entry.step + 1, [])


def _rate_pair(before: float | None, after: float | None) -> dict[str, float | None]:
    return {"before": before, "after": after}
