"""The host side of nanscope as a guest in someone else's training: records, the first non-finite step, the report.

One class, `StepRecorder`, serves the `NanScope` callback and `instrument` alike: it
turns the rows their compiled steps write into `StepRecord`s, writes the trace and
TensorBoard as it goes, attributes the first non-finite step (its record, then the
forensic replay its owner supplies), and builds, prints and writes the report.
"""

import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nanscope.run.attribution import attribute_from_record
from nanscope.engine.loss_scale import LossScaleWatch
from nanscope.engine.records import expected_layer_indices
from nanscope.guard.options import GuardOptions
from nanscope.spec.options import DEFAULT_KEEP, DEFAULT_SAMPLE
from nanscope.store.history import StepHistory
from nanscope.keras.workers import WorkerRole
from nanscope.report.model import FirstNonfinite, TraceReport

if TYPE_CHECKING:
    from rich.console import Console

    from nanscope.engine.records import StepRecord
    from nanscope.model.learning_rate import LearningRateView
    from nanscope.report.tensorboard import TensorBoardLog
    from nanscope.rules.evidence import RunEvidence
    from nanscope.run.attribution import StepNames
    from nanscope.store.tracefile import TraceWriter


@dataclass
class GuestOptions:
    """What a guest run records and where it reports (the options of `NanScope` and `instrument`).

    Args:
        report: str or os.PathLike, optional. Write the `nanscope.trace/1` JSON here.
        stop_on_nonfinite: bool, default True.
        verbose: int, default 1. 0 prints nothing; 1 prints the report when the run ends.
        console: rich.console.Console, optional. Where to print (default: stderr).
        tensorboard: str or os.PathLike, optional. Per-step scalars to this TensorBoard folder.
        trace: str or os.PathLike, optional. Every step's record to this JSON-lines trace.
        expect_nonfinite: list of str. Layer-name patterns whose non-finite outputs are intended.
        forensics: bool, default True. Keep what a replay needs on the device and replay the first non-finite step.
        keep_steps, sample_steps: int. Full rows the bounded history keeps (`nanscope.store.history`).
        trace_full: bool, default False. Write every step's full row to the trace.
        repro: Path, optional. Write the repro bundle of the first non-finite step to this folder (`fit` only).
        guard: GuardOptions. What happens at a non-finite step or a spike (`stop_on_nonfinite` is its "stop").
    """

    report: str | os.PathLike[str] | None = None
    stop_on_nonfinite: bool = True
    verbose: int = 1
    console: "Console | None" = None
    tensorboard: str | os.PathLike[str] | None = None
    trace: str | os.PathLike[str] | None = None
    expect_nonfinite: list = field(default_factory=list)
    forensics: bool = True
    keep_steps: int = DEFAULT_KEEP
    sample_steps: int = DEFAULT_SAMPLE
    trace_full: bool = False
    repro: Path | None = None
    guard: GuardOptions = field(default_factory=GuardOptions)


class StepRecorder:
    """Records of a guest run as they arrive, the first non-finite one attributed, and the report.

    Args:
        options: GuestOptions.
        run: dict. The report's run header.
        names: StepNames (`nanscope.run.attribution`), without the call order.
        call_order: callable() -> list of layer names in call order (known once the step is traced).
        locate: callable(record, FirstNonfinite), optional. Fills in what a forensic replay finds.
        role: WorkerRole, default one worker. Under MultiWorkerMirroredStrategy, only the chief
            prints and writes the report, the trace and the TensorBoard log.
        learning_rate: LearningRateView, optional. The optimizer's learning rate as the run started; under a
            schedule the report gives the rate in effect at its first non-finite (else last) step.
    """

    def __init__(self, options: GuestOptions, run: dict, names: "StepNames", call_order: Callable[[], list[str]],
                 locate: Callable[["StepRecord", FirstNonfinite], None] | None = None, role: WorkerRole | None = None,
                 learning_rate: "LearningRateView | None" = None) -> None:
        self.options, self.names, self.call_order, self.locate = options, names, call_order, locate
        self.learning_rate = learning_rate
        self.role = role or WorkerRole()
        self.first_nonfinite: FirstNonfinite | None = None
        self.dropped = 0
        self.scale_watch = LossScaleWatch()
        self.expected = expected_layer_indices(options.expect_nonfinite, [name for name, _ in names.layers])
        dtypes = run.get("layer_dtypes") or {}
        self.history = StepHistory(len(names.layers), len(names.variables), len(names.outputs), options.keep_steps,
                                   options.sample_steps, layer_dtypes=[dtypes.get(name) for name, _ in names.layers])
        self.report = TraceReport(run=run, history=self.history, layers=list(names.layers), layer_order=[],
                                  variables=list(names.variables),
                                  trace_path=str(options.trace) if options.trace else None)
        self.board = self._open_board(options.tensorboard) if options.tensorboard and self.role.chief else None
        self.writer: TraceWriter | None = None

    @property
    def steps_seen(self) -> int:
        return self.history.count

    def _open_board(self, folder: str | os.PathLike[str]) -> "TensorBoardLog":
        from nanscope.report.tensorboard import TensorBoardLog

        return TensorBoardLog(folder, self.report.layers, self.report.variables,
                              self.names.outputs)

    def collect(self, records: Iterable["StepRecord"]) -> None:
        """Take fresh StepRecords in step order; attribute the first non-finite one."""
        for record in records:
            if self.first_nonfinite is not None and self.options.stop_on_nonfinite:
                self.dropped += 1
                continue
            record.expected_nonfinite = list(self.expected)
            record.worker_nonfinite = self.role.per_worker(record.replica_nonfinite)
            self.scale_watch.see(record)
            if record.phase is not None and self.first_nonfinite is None:
                self.names.call_order = self.call_order()
                self.first_nonfinite = attribute_from_record(record, self.names)
                self.report.first_nonfinite = self.first_nonfinite  # the report so far says it at once
                if self.learning_rate is not None:
                    self.learning_rate.mark()  # a rate a callback lowered is the one in effect here
                if self.locate is not None:
                    self.locate(record, self.first_nonfinite)
            self._keep(record)
        if self.writer is not None:
            self.writer.flush_steps()  # the trace holds every collected step, a line per collection

    def _keep(self, record: "StepRecord") -> None:
        """Put one step in the history, the trace and TensorBoard."""
        kept = self.history.add(record)
        if self.board is not None:
            self.board.write(record)
        if self.options.trace and self.role.chief:
            from nanscope.store.tracefile import TraceWriter

            if self.writer is None:
                self.report.layer_order = self.call_order()
                self.writer = TraceWriter(self.options.trace, self.report.trace_header(), self.history,
                                          self.options.trace_full)
            self.writer.step(record, kept)

    def finish(self, evidence: "RunEvidence", notes: Sequence[str] = (), validation_loss: float | None = None
               ) -> TraceReport:
        """Build the report, print it and write its JSON; close the outputs.

        Args:
            evidence: RunEvidence for the rules.
            notes: list of str. What the owner adds about how the run was recorded.
            validation_loss: float, optional. The last validation loss, reported for a run that stayed finite.
        """
        from nanscope.model.learning_rate import settle_learning_rate
        from nanscope.rules.diagnose import diagnose

        report = self.report
        report.layer_order = self.call_order()
        report.first_nonfinite = self.first_nonfinite
        if self.first_nonfinite is None and validation_loss is not None and math.isfinite(validation_loss):
            report.validation_loss = float(validation_loss)
        report.notes.extend(list(notes) + self._notes())
        settle_learning_rate(report, self.learning_rate)
        report.recommendations = diagnose(report, evidence)
        self._close(report)
        self.render()
        if self.options.report is not None and self.role.chief:
            from nanscope.jsonio import write_json

            write_json(str(self.options.report), report.to_json())
        return report

    def render(self) -> None:
        """Print the report (verbose runs only)."""
        if self.options.verbose and self.role.chief:
            from rich.console import Console

            from nanscope.render.trace_report import render_trace_report

            render_trace_report(self.report, self.options.console or Console(stderr=True, soft_wrap=False))

    def _close(self, report: TraceReport) -> None:
        if self.board is not None:
            self.board.close()
            self.board = None
        if self.writer is not None:
            from nanscope.run.trace import finish_trace

            finish_trace(self.writer, report)
            self.writer.close()
            self.writer = None

    def _notes(self) -> list[str]:
        notes: list[str] = []
        missing = self.history.overview().loss_missing
        if missing:
            notes.append(f"the step returned no loss on {missing} of {self.history.count} step(s) (None, or nothing "
                         "that is a tensor or has a \"loss\" key): the loss is unknown there (null in the JSON) and "
                         "not counted as non-finite; non-finite values are still found in the batch, the layers, "
                         "the gradients and the weights")
        if self.dropped:
            notes.append(f"{self.dropped} step(s) after the first non-finite one ran in the same execution "
                         "(steps_per_execution) before training could stop; their records are left out")
        for index in self.expected:
            bad = self.history.layers[index].nonfinite_steps
            if bad:
                notes.append(f"layer {self.names.layers[index][0]}: non-finite outputs on {bad} step(s), expected "
                             "(expect_nonfinite), not counted as a problem")
        return notes
