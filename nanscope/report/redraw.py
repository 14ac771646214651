"""A report redrawn from its trace file, streaming, in bounded memory and without TensorFlow (`nanscope report`).

Each line is read through its class in `nanscope.store.lines`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from nanscope.engine.schema import PHASES
from nanscope.report.model import FirstNonfinite, TraceReport
from nanscope.rules.catalogue import Recommendation
from nanscope.store.history import StepHistory
from nanscope.store.lines import AggregatesLine, ErrorLine, HeaderLine, ScalarsLine, StepLine, SummaryLine
from nanscope.store.rows import scalar_row
from nanscope.engine.records import StepRecord
from nanscope.store.series import TraceColumns
from nanscope.store.tracefile import step_record, trace_lines


def load_trace(path: str | os.PathLike) -> TraceReport:
    """Rebuild a TraceReport from a trace file, streaming it: memory stays bounded whatever the run's length.

    Raises:
        NanscopeError: the file is not a readable trace (see tracefile.trace_lines).
    """
    lines = trace_lines(path)
    header = HeaderLine.from_json(next(lines)[1])
    reader = _TraceReader(header, path)
    summary, errors = None, []
    for number, line in lines:
        kind = line.get("kind")
        if kind == StepLine.KIND:
            reader.step(step_record(path, number, line), line.get("kept"))
        elif kind == ScalarsLine.KIND:
            reader.scalars(path, number, line)
        elif kind == AggregatesLine.KIND:
            reader.aggregates(AggregatesLine.from_json(line))
        elif kind == SummaryLine.KIND:
            summary = SummaryLine.from_json(line)  # the last one counts
        elif kind == ErrorLine.KIND:
            errors.append(ErrorLine.from_json(line))
    ended = summary or SummaryLine(interrupted=True)  # no summary: the run was killed mid-way
    first = ended.first_nonfinite
    history = reader.finished()
    report = TraceReport(
        run={**header.run, **ended.run},
        layers=[tuple(pair) for pair in header.layers],
        layer_order=header.layer_order,
        variables=header.variables,
        history=history,
        first_nonfinite=FirstNonfinite(**first) if first else None,
        recommendations=[Recommendation(**r) for r in ended.recommendations],
        validation_loss=ended.validation_loss,
        interrupted=bool(ended.interrupted),
        stopped=ended.stopped,
        notes=ended.notes + _trace_end_notes(summary, errors) + reader.notes(),
        trace_path=str(path),
        interventions=ended.interventions,
        spikes=ended.spikes,
    )
    if first is None and summary is None:
        report.first_nonfinite = _first_bad(history)
    return report


def _first_bad(history: StepHistory) -> FirstNonfinite | None:
    """FirstNonfinite(step, phase) of the first non-finite step in a history's scalars, or None."""
    first = history.overview().first_nonfinite
    return FirstNonfinite(first[0], PHASES[first[1]]) if first else None  # type: ignore[arg-type]  # a phase code > 0


# Why a run kept a row it wrote to its trace (StepHistory.why_kept).
WHY_KEPT = ("head", "event", "sample", "last")


class _TraceReader:
    """Folds a trace's lines into a StepHistory: step lines into its kept rows and aggregates, scalars lines into
    its row count; the scalars stay in the file (series.TraceColumns), so memory does not grow with the trace."""

    def __init__(self, header: HeaderLine, path: str | os.PathLike[str]) -> None:
        from nanscope.errors import NanscopeError

        self.path = path
        # A trace written before scalars lines existed has a full step line for every step.
        self.full = header.rows == "full"
        self.series = header.series
        if not self.full and not (isinstance(self.series, list) and self.series[:1] == ["step"]
                                  and all(isinstance(n, str) for n in self.series)):
            raise NanscopeError(f"{path}: line 1: series: expected the names of the scalars columns, "
                                f"starting with 'step'. Received: {self.series!r}")
        self.keep, self.sample = header.keep, header.sample
        self.layers, self.variables = len(header.layers), len(header.variables)
        run = header.run
        dtypes = run.get("layer_dtypes") if isinstance(run, dict) else None
        dtypes = dtypes if isinstance(dtypes, dict) else {}
        self.dtypes = [dtypes.get(pair[0]) if isinstance(pair, list) and pair else None
                       for pair in header.layers]
        self.history, self.exact = None, False
        if not self.full:
            outputs = sum(1 for name in self.series if name.endswith("/loss"))
            self.history = self._history(outputs)
            # A trace written with other scalar columns (an older or newer nanscope) is read by name;
            # a column it lacks reads 0, which the columns' readers take as "not measured".
            names = self.series[1:]
            wanted = list(self.history.series.columns)
            self.take = np.array([names.index(n) if n in names else 0 for n in wanted], np.int64)
            self.lacking = np.array([n not in names for n in wanted])

    def _history(self, outputs: int) -> StepHistory:
        return StepHistory(self.layers, self.variables, outputs, self.keep, self.sample,
                           series=lambda columns: TraceColumns(self.path, columns, self.rows, trace_lines),
                           layer_dtypes=self.dtypes)

    def step(self, record: StepRecord, why: str | None = None) -> None:
        if self.history is None:
            self.history = self._history(len(record.outputs))
        if self.full:
            self.history.add(record)
            return
        self.history.aggregate(record)  # replaced by the exact aggregates line when the run wrote one
        if why in WHY_KEPT:
            self.history.keep_read_row(record, why)
        else:  # a trace written before its rows said why they were kept
            self.history.keep_row(record)

    def scalars(self, path: str | os.PathLike[str], number: int, line: dict[str, Any]) -> None:
        self.history.series.extend(*self.rows(path, number, line))  # type: ignore[union-attr,misc]  # not `full`: TraceColumns

    def rows(self, path: str | os.PathLike[str], number: int,
             line: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
        """(steps, float32 values in the history's column order) of one line's scalar rows, or None."""
        if self.full:
            if line.get("kind") != "step":
                return None
            record = step_record(path, number, line)
            return np.array([record.step], np.int64), np.array([scalar_row(record)], np.float32)
        if line.get("kind") != "scalars":
            return None
        array = _scalar_array(path, number, line.get("rows", []), self.series)
        values = array[:, 1:][:, self.take]
        values[:, self.lacking] = 0.0
        with np.errstate(over="ignore"):  # beyond float32's range reads inf, as the run's own columns hold it
            return array[:, 0].astype(np.int64), values.astype(np.float32)

    def aggregates(self, line: AggregatesLine) -> None:
        history = self.history
        if history is None:
            return
        history.layers, history.variables, history.outputs = line.layers, line.variables, line.outputs
        history.thin_sample(line.sample_stride)
        self.exact = True

    def finished(self) -> StepHistory:
        return self.history or StepHistory(self.layers, self.variables)

    def notes(self) -> list[str]:
        if self.full or self.exact or self.history is None or self.history.count == len(self.history.kept()):
            return []
        return ["the trace has no aggregates line (the run ended early): the layer, variable and output tables are "
                "taken over the kept steps only"]


def _scalar_array(path: str | os.PathLike[str], number: int, rows: Any, series: list[str]) -> np.ndarray:
    """The rows of a scalars line as one float64 array [rows, len(series)], checked.

    Raises:
        NanscopeError: a row of another width, or a value that is not a number.
    """
    from nanscope.errors import NanscopeError

    width, where = len(series), f"{path}: line {number}"
    if isinstance(rows, list) and not rows:
        return np.empty((0, width))
    try:
        array = np.array(rows, dtype=np.float64)
    except (TypeError, ValueError):
        array = None
    if array is None or array.ndim != 2 or array.shape[1] != width:
        if not isinstance(rows, list) or any(not isinstance(row, list) or len(row) != width for row in rows):
            raise NanscopeError(f"{where}: a scalars row has {width} values ({', '.join(series)})")
        array = None
    # numpy reads null as NaN; the trace spells a NaN "nan", so a null is not a number.
    if array is None or (np.isnan(array).any() and any(v is None for row in rows for v in row)):
        raise NanscopeError(f"{where}: a scalars row holds a value that is not a number")
    return array


def _trace_end_notes(summary: SummaryLine | None, errors: list[ErrorLine]) -> list[str]:
    """What a trace without a summary line says about how its run ended."""
    notes = [f"the run stopped on an error: {line.message}" for line in errors]
    if summary is None and not notes:
        notes.append("the run ended before writing its summary (killed?): the report covers the steps in the trace")
    return notes
