"""The guard inside a guest run (`NanScope`, `instrument`): built from its probe, fed its records, never its crash.

`GuestGuard` builds the `Guard` from what the guest run already keeps (the step
snapshot, the compiled step for re-runs), hands it each execution's records with the
run's first non-finite step, rewrites the logs of a step it skipped or rolled back (so
the user's other callbacks and the epoch's averages see a consistent run) and puts the
interventions and spikes into the report. A failure of its own code is one warning
line and a note; the guard then stands down and the run goes on as it would without it.
"""

import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from nanscope.engine.records import StepRecord
from nanscope.errors import first_line
from nanscope.guard.guard import Fixer, Guard, Rerun
from nanscope.guard.interventions import Intervention
from nanscope.guard.options import GuardOptions
from nanscope.guard.schedule import SampleSchedule
from nanscope.guard.state import GuestState, StepSnapshot
from nanscope.tf_types import Batch, KerasModel

if TYPE_CHECKING:
    from nanscope.report.model import FirstNonfinite, TraceReport

log = logging.getLogger("nanscope")
LOG_KEYS = {"skip": "nanscope_skipped", "rollback": "nanscope_rolled_back"}
# What builds the prover of a rollback's fix from the guard's state and re-run (`keras.guest_fix`).
MakeFixer: TypeAlias = Callable[[GuestState, Rerun], Fixer | None]


class Recorder(Protocol):
    """Whose first non-finite step the verdicts judge (keras.forensics.StepRecorder, run.guard_state.TraceView)."""

    @property
    def first_nonfinite(self) -> "FirstNonfinite | None": ...

    @property
    def expected(self) -> Collection[int]: ...


class Probe(Protocol):
    """What a `fit` keeps that its guard is built from (keras.probe.StepProbe, a layer up)."""

    @property
    def snapshot(self) -> StepSnapshot | None: ...

    @property
    def variable_names(self) -> list[str]: ...

    @property
    def sentinel(self) -> SampleSchedule | None: ...

    @property
    def state_off(self) -> str | None: ...

    def rerun(self, batch: Batch) -> StepRecord: ...


class GuestGuard:
    """A Guard bound to one guest run.

    Args:
        guard: Guard.
        recorder: StepRecorder. Whose first non-finite step the verdicts judge.
        model: keras.Model, optional. Inside `fit`: whose metrics give the logs of an undone step.
    """

    def __init__(self, guard: Guard, recorder: Recorder, model: KerasModel = None,
                 sentinel: SampleSchedule | None = None) -> None:
        self.guard, self.recorder, self.model, self.sentinel = guard, recorder, model, sentinel
        self.made: Intervention | None = None  # the Intervention of the latest execution
        self.failure: Exception | None = None
        self._judged = False
        self._notes: list[str] = []

    @classmethod
    def for_fit(cls, options: GuardOptions, model: KerasModel, probe: Probe, recorder: Recorder,
                make_fixer: MakeFixer | None = None) -> "GuestGuard":
        """The guard of one `fit`, from its StepProbe.

        Args:
            make_fixer: callable(state, rerun) -> the prover of a rollback's fix, or None (`keras.guest_fix`).
        """
        from nanscope.guard.rows import fit_row_losses

        state = GuestState(probe.snapshot, [model.optimizer]) if probe.snapshot is not None else None
        rerun = (lambda batch: attributed(probe.rerun(batch), recorder)) if state is not None else None
        # Under tf.distribute the held batch is every replica's share: a spike names no rows there.
        one_device = model.distribute_strategy.num_replicas_in_sync == 1
        row_losses = fit_row_losses(model) if state is not None and one_device else None
        fixer = make_fixer(state, rerun) if state is not None and rerun is not None and make_fixer is not None else None
        made = cls(Guard(options, state, rerun, row_losses, probe.variable_names, fixer=fixer), recorder, model,
                   probe.sentinel)
        if state is None:
            made.no_state(options, probe.state_off or "forensics=False")
        elif not one_device and options.on_nonfinite == "rollback" and options.apply_fix:
            made.note("guard: under tf.distribute a rollback lowers the learning rate; it proves no fix on the "
                      "saved step")
        if options.mode == "sentinel":
            made.sentinel_notes(options, probe)
        return made

    def sentinel_notes(self, options: GuardOptions, probe: Probe) -> None:
        if probe.sentinel is None:
            self._notes.append("mode=sentinel: not under tf.distribute; every step was recorded in full")
            return
        self._notes.append(f"mode=sentinel: full statistics on every {options.sample_every}th execution and the "
                           "16 after an event; the other steps recorded the scalars only (layer and variable "
                           "tables are over the full steps)")

    def complete(self, records: list[StepRecord]) -> list[StepRecord]:
        """Sentinel mode: the run's first non-finite step re-run in full from the state before it, so it is
        attributed (layer, variable, phase) as in full mode; an event also runs the next executions in full."""
        if self.sentinel is None or self.failure is not None:
            return records
        try:
            return [self._completed(record, self.sentinel) for record in records]
        except Exception as exc:
            self._stand_down(records[-1].step, exc)
            return records

    def _completed(self, record: StepRecord, sentinel: SampleSchedule) -> StepRecord:
        if record.layers or attributed(record, self.recorder).phase is None:
            return record
        sentinel.around_event()
        state, rerun = self.guard.state, self.guard.rerun
        if (self.recorder.first_nonfinite is not None or state is None or rerun is None
                or state.held_step() != record.step):
            return record
        with state.before_step():
            full = rerun(state.batch())
        if full.phase is None:  # a transient fault: the sentinel's own record is all there is
            return record
        full.step = record.step
        return full

    def note(self, line: str) -> None:
        """Add a line to the report's notes."""
        self._notes.append(line)

    def no_state(self, options: GuardOptions, why: str) -> None:
        """Note what the guard cannot do without the step snapshot."""
        if options.intervenes:
            self._notes.append(f"guard: on_nonfinite={options.on_nonfinite!r}: no state is kept ({why}), so a step "
                               "that needs it stops the run instead")
        self._notes.append(f"verdicts: not checked: no state is kept ({why})")

    def observe(self, records: list[StepRecord]) -> bool:
        """Let the guard act on one execution's records; True when it did something."""
        self.made = None
        if self.failure is not None or not records:
            return False
        first = self.recorder.first_nonfinite
        if first is not None and self._judged:
            first = None
        spikes = self.guard.spikes.total
        try:
            self._judged = self._judged or first is not None
            self.made = self.guard.observe(records, first)
        except Exception as exc:
            self._stand_down(records[-1].step, exc)
        if self.sentinel is not None and (self.made is not None or self.guard.spikes.total > spikes):
            self.sentinel.around_event()
        return self.made is not None

    def _stand_down(self, step: int, exc: Exception) -> None:
        self.failure = exc
        log.warning("nanscope: the guard stopped at step %d (%s: %s); training goes on without it",
                    step, type(exc).__name__, first_line(exc))
        self._notes.append(f"guard: its own code failed at step {step} ({type(exc).__name__}: "
                           f"{first_line(exc)}); it stood down there and training went on without it")

    @property
    def stopped(self) -> bool:
        return self.guard.stop_reason is not None

    def logs(self, logs: Any) -> Any:
        """The logs of the latest execution; after a skip or a rollback, its metrics as put back, and a flag."""
        made = self.made
        if made is None or made.action not in LOG_KEYS or not isinstance(logs, dict):
            return logs
        logs = dict(logs)
        if self.model is not None:
            try:
                results = self.model.get_metrics_result()
            except Exception:  # a custom train_step's logs that are not metrics: keep them
                results = {}
            logs.update({key: value for key, value in results.items() if key in logs})
        logs[LOG_KEYS[made.action]] = 1.0
        return logs

    def finish(self, report: "TraceReport") -> None:
        """Put the interventions and spikes into `report`."""
        report.interventions = self.guard.interventions.to_json()
        report.spikes = self.guard.spikes.to_json()

    def notes(self) -> list[str]:
        return self._notes + self.guard.report_notes()


def attributed(record: StepRecord, recorder: Recorder) -> StepRecord:
    """`record` read as the recorder reads its own: with the expected layers set, so `phase` is the same."""
    record.expected_nonfinite = list(recorder.expected)
    return record
