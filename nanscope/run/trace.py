"""trace-steps: run instrumented steps, stop at the first non-finite, diagnose.

`run_trace(spec, options)` is the library entry point of the `trace-steps`
command. It opens a session, runs compiled instrumented steps, keeps every step in
a bounded `StepHistory` and the JSON-lines trace as it is made, attributes the
first non-finite value to a phase and a layer or variable, and asks the rule
catalogue what it means.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from nanscope import interrupt
from nanscope.engine.failures import step_failure
from nanscope.engine.loss_scale import LossScaleWatch
from nanscope.engine.cluster import collective_failure_message, is_collective_failure
from nanscope.engine.distributed import DistributedStep
from nanscope.engine.records import expected_layer_indices
from nanscope.errors import SpecError
from nanscope.finishing import optional_part
from nanscope.guard.trace_sentinel import trace_sentinel
from nanscope.run.describe import describe_run, run_notes, sentinel_notes
from nanscope.run.guard_state import prepare_guard, trace_guard
from nanscope.run.locate import locate_first_nonfinite
from nanscope.store.history import StepHistory
from nanscope.model.learning_rate import LearningRateView, settle_learning_rate
from nanscope.report.model import TraceReport
from nanscope.rules.diagnose import diagnose
from nanscope.rules.evidence import evidence_from_session
from nanscope.run.environment import start_up_failures
from nanscope.run.session import open_session
from nanscope.spec.options import TraceOptions
from nanscope.store.lines import AggregatesLine, ErrorLine, SummaryLine
from nanscope.store.tracefile import TraceWriter

if TYPE_CHECKING:
    from nanscope.engine.cluster import Cluster
    from nanscope.engine.records import StepRecord
    from nanscope.engine.chunk import ChunkRunner
    from nanscope.engine.step import InstrumentedStep
    from nanscope.guard.trace_sentinel import TraceSentinel
    from nanscope.report.tensorboard import TensorBoardLog
    from nanscope.run.guard_state import TraceGuard
    from nanscope.run.session import Session
    from nanscope.spec.sections import RunSpec

DEFAULT_RUNS_DIR = Path("nanscope-runs")
# Shorter runs take one compiled call per step instead of chunks of steps (engine/chunk.py):
# tracing and optimising the chunked loop costs about 0.05 s more than the single step,
# and a chunk saves about 0.13 ms a step, so it pays from roughly 500 steps on
# (2-vCPU CPU, configs/exploding-regression.yaml at 200-800 steps; bench/README.md).
CHUNK_MIN_STEPS = 500
STOPPED_BEFORE_TRAINING = "interrupted during start-up (loading the spec, the data or the model): no step ran"


def run_trace(spec: RunSpec, options: TraceOptions | None = None) -> TraceReport:
    """Run trace-steps for a validated RunSpec and return its TraceReport.

    A run that finds NaN is a result, not an error. Ctrl-C stops the loop; the
    report then covers the steps done and says it was interrupted.
    """
    options = options or TraceOptions()
    if spec.train.distribute == "multi_worker" and options.verify:
        raise SpecError(f"{spec.source}: train.distribute: multi_worker: --verify is not supported",
                        hint="run --verify on one machine (train.distribute: mirrored)")
    session = open_session(spec, unsafe=options.unsafe)
    options = _for_this_worker(options, session.cluster)
    with start_up_failures(session.cluster):
        engine = session.instrumented_step()
    prepare_guard(options.guard, engine)  # before the step is traced: it copies the optimizer's state too
    sentinel = trace_sentinel(options.guard, engine)
    expected = expected_layer_indices(spec.train.expect_nonfinite, [info.name for info in engine.layer_info])
    # Either way the step is traced once: here in the chunk, or for the report's layer order.
    chunked = spec.train.steps >= CHUNK_MIN_STEPS and sentinel is None
    runner = session.chunk_runner(engine, expected) if chunked else None
    learning_rate = LearningRateView(engine.optimizer)
    report = TraceReport(
        run=describe_run(session, engine, learning_rate),
        layers=[(info.name, info.cls) for info in engine.layer_info],
        layer_order=engine.layer_call_order,
        variables=engine.variable_names,
        history=StepHistory(len(engine.layer_info), len(engine.variable_names), len(session.loss.outputs),
                            options.keep_steps, options.sample_steps,
                            layer_dtypes=[info.dtype for info in engine.layer_info]),
        trace_path=str(options.trace_path or default_trace_path(spec)),
        cluster=session.cluster,
    )
    report.notes.extend(session.model.notes + run_notes(spec) + sentinel_notes(options.guard, sentinel))
    guard = trace_guard(options.guard, engine, session, report, expected)
    writes = session.cluster is None or session.cluster.is_chief
    trace = (TraceWriter(report.trace_path, report.trace_header(), report.history, options.trace_full)  # type: ignore[arg-type]
             if writes
             else _NoTrace())
    with trace as writer:
        try:
            _run_steps(session, engine, runner, report, writer, options, expected, guard, sentinel)
        except KeyboardInterrupt:
            report.interrupted = True
        if guard is not None:
            guard.finish(report)
            report.notes.extend(guard.notes())
        if sentinel is not None:
            report.notes.extend(sentinel.notes())
        with interrupt.deferred():
            report.interrupted = report.interrupted or interrupt.requested()
            _finish(session, engine, report, options, learning_rate)
            finish_trace(writer, report)
    if options.plot is not None:
        from nanscope.report.plotting import plot_trace

        with optional_part(report.notes, f"the plot {options.plot}"):
            plot_trace(report, options.plot)
    return report


def stopped_before_training(spec_source: str | os.PathLike) -> TraceReport:
    """The report of a run that a signal stopped during start-up (spec, data, model), before its first step."""
    return TraceReport(run={"spec": str(spec_source)}, layers=[], layer_order=[], variables=[],
                       interrupted=True, notes=[STOPPED_BEFORE_TRAINING])


def _for_this_worker(options: TraceOptions, cluster: Cluster | None) -> TraceOptions:
    """The options a worker other than the chief runs with: it writes nothing and replays nothing."""
    if cluster is None or cluster.is_chief:
        return options
    return replace(options, tensorboard=None, plot=None, save_repro=None, forensics=False)


class _NoTrace:
    """The trace of a worker other than the chief: only the chief writes one."""

    path = None

    def write(self, line: object) -> None:
        pass

    def step(self, record: StepRecord, kept: Iterable[StepRecord]) -> None:
        pass

    def rows(self, records: Iterable[StepRecord]) -> None:
        pass

    def flush_steps(self) -> None:
        pass

    def __enter__(self) -> _NoTrace:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


# Where a run's lines go: the trace file, or nowhere (a worker other than the chief).
Writer = TraceWriter | _NoTrace


def _run_steps(session: Session, engine: InstrumentedStep, runner: ChunkRunner | None, report: TraceReport,
               writer: Writer, options: TraceOptions, expected: list[int], guard: TraceGuard | None = None,
               sentinel: TraceSentinel | None = None) -> None:
    report.notes.extend(_expected_notes(session.spec.train.expect_nonfinite, engine, expected))
    board = _open_board(options.tensorboard, report)
    # Every worker takes part in every step's collectives: a signal must not stop one worker
    # between steps on its own. It rides the next step's all-reduce instead (DistributedStep).
    together = session.cluster is not None
    try:
        with interrupt.deferred() if together else contextlib.nullcontext():
            _run_step_loop(session, engine, runner, report, writer, options, expected, board, guard, sentinel)
    finally:
        if board is not None:
            board.close()


def _open_board(logdir: str | os.PathLike[str] | None, report: TraceReport) -> TensorBoardLog | None:
    if logdir is None:
        return None
    from nanscope.report.tensorboard import TensorBoardLog

    return TensorBoardLog(logdir, report.layers, report.variables, report.output_names)


def _expected_notes(patterns: Sequence[str], engine: InstrumentedStep, expected: list[int]) -> list[str]:
    if not patterns:
        return []
    names = [engine.layer_info[i].name for i in expected]
    if not names:
        return [f"train.expect_nonfinite: no layer matches {', '.join(patterns)}"]
    return [f"non-finite outputs of {', '.join(names)} are expected (train.expect_nonfinite) and not counted"]


def _run_step_loop(session: Session, engine: InstrumentedStep, runner: ChunkRunner | None, report: TraceReport,
                   writer: Writer, options: TraceOptions, expected: list[int], board: TensorBoardLog | None,
                   guard: TraceGuard | None, sentinel: TraceSentinel | None) -> None:
    step, total = 0, session.spec.train.steps
    # A guard that skips or rolls back needs the chunk to end at every non-finite step: the snapshot holds it then.
    every_bad_step = guard is not None and guard.guard.options.intervenes
    scale_watch = LossScaleWatch()
    cluster = session.cluster
    while step < total:
        if cluster is None:
            interrupt.check()
        # The sentinel stands in for the engine: it runs the full step or the light one.
        records, failure = session.next_records(sentinel or engine, runner, step, total,
                                                report.first_nonfinite is None or every_bad_step)
        if failure is not None and cluster is not None and is_collective_failure(failure):
            report.stopped = collective_failure_message(cluster, failure, step)
            writer.write(ErrorLine(step, report.stopped))
            return
        with interrupt.deferred():  # a step is in the history and the trace whole, or not at all
            for index, record in enumerate(records):
                record.expected_nonfinite = list(expected)
                if sentinel is not None:
                    record = records[index] = sentinel.completed(record, *session.batch(record.step),
                                                                 report.first_nonfinite is not None)
                scale_watch.see(record)
                keep(report.history, writer, record)
            writer.flush_steps()
        for record in records:
            if board is not None:
                board.write(record)
            if options.on_step is not None:
                options.on_step(record)
            if record.phase is not None and report.first_nonfinite is None:
                x, y = session.batch(record.step)
                report.first_nonfinite = locate_first_nonfinite(record, engine, session, x, y, options)
                if not options.keep_going:
                    return
        if guard is not None and guard.observe(records):
            if sentinel is not None:
                sentinel.around_event()
            if guard.stopped:
                return
        if cluster is not None and isinstance(engine, DistributedStep) and engine.stop_requested_by:
            report.interrupted = True
            report.notes.append(f"stopped after step {step} by a signal to "
                                f"{', '.join(cluster.describe(w) for w in engine.stop_requested_by)}")
            return
        step += len(records)
        if failure is not None:
            _raise_step_failure(failure, step, session.spec, writer)


def keep(history: StepHistory | None, writer: Writer, record: StepRecord) -> None:
    """Put one step in the history and the trace: its scalars, and its full row where the history keeps it."""
    assert history is not None  # a trace-steps report has its history from the start
    writer.step(record, history.add(record))


def finish_trace(writer: Writer, report: TraceReport) -> None:
    """End the trace: the last steps' full rows, the exact aggregates, the summary."""
    history = report.history
    assert history is not None  # a trace-steps report has its history from the start
    writer.rows(history.unwritten())
    writer.write(AggregatesLine.of(history))
    writer.write(SummaryLine.of(report))


def _raise_step_failure(exc: BaseException, step: int, spec: RunSpec, writer: Writer) -> None:
    """End the run on a TensorFlow failure inside `step` (XLA, out of memory, a failed op) with one clear line.

    The steps done are already in the trace; an `error` line records why the run stopped.
    """
    error = step_failure(exc, step, spec.source, spec.train.jit_compile)
    if error is None:
        raise exc
    writer.write(ErrorLine(step, str(error)))
    if step and writer.path is not None:  # a worker other than the chief keeps no trace
        error.message += f"; steps 0-{step - 1} are kept in {writer.path}"
    raise error from exc


def _finish(session: Session, engine: InstrumentedStep, report: TraceReport, options: TraceOptions | None = None,
            learning_rate: LearningRateView | None = None) -> None:
    settle_learning_rate(report, learning_rate)
    if report.first_nonfinite is None and report.steps_run:
        with optional_part(report.notes, "the validation loss"):
            report.validation_loss = session.evaluate(engine)
    report.recommendations = diagnose(report, evidence_from_session(session))
    if options is not None and options.verify and report.steps_run and not report.interrupted:
        from nanscope.run.verify import verify_recommendations

        try:
            with optional_part(report.notes, "--verify"):
                verify_recommendations(session, report)
        except KeyboardInterrupt:
            report.interrupted = True
            report.notes.append("--verify was interrupted: recommendations not yet re-run stay unverified")


def default_trace_path(spec: RunSpec) -> Path:
    """nanscope-runs/<spec file stem>/trace.jsonl, under the current folder."""
    stem = Path(spec.source).stem if spec.source else "run"
    return DEFAULT_RUNS_DIR / re.sub(r"[^A-Za-z0-9_.-]+", "_", stem) / "trace.jsonl"

