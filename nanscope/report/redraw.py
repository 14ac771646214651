"""A report redrawn from its trace file, streaming, in bounded memory and without TensorFlow (`nanscope report`).

The trace's `aggregates` line, which the redraw reads back exactly, is written from here too (`aggregates_json`).
"""

import os
from typing import Any
import numpy as np
from nanscope.engine.records import LayerStats, OutputStats, VariableStats
from nanscope.engine.schema import PHASES
from nanscope.spec.options import DEFAULT_KEEP, DEFAULT_SAMPLE
from nanscope.store.aggregates import LayerAggregate, OutputAggregate, VariableAggregate
from nanscope.store.history import StepHistory
from nanscope.store.rows import scalar_row
from nanscope.jsonio import decode_float, jsonable
from nanscope.rules.catalogue import Recommendation
from nanscope.store.series import TraceColumns
from nanscope.store.tracefile import step_record, trace_lines
from nanscope.report.model import FirstNonfinite, TraceReport


def load_trace(path: str | os.PathLike) -> TraceReport:
    """Rebuild a TraceReport from a trace file, streaming it: memory stays bounded whatever the run's length.

    Raises:
        NanscopeError: the file is not a readable trace (see tracefile.trace_lines).
    """
    lines = trace_lines(path)
    header = next(lines)[1]
    reader = _TraceReader(header, path)
    others = []
    for number, line in lines:
        kind = line.get("kind")
        if kind == "step":
            reader.step(step_record(path, number, line), line.get("kept"))
        elif kind == "scalars":
            reader.scalars(path, number, line)
        elif kind == "aggregates":
            reader.aggregates(line)
        else:
            others.append(line)
    summary: dict[str, Any] = next((line for line in reversed(others) if line.get("kind") == "summary"), {})
    first = summary.get("first_nonfinite")
    history = reader.finished()
    report = TraceReport(
        run={**header.get("run", {}), **summary.get("run", {})},
        layers=[tuple(pair) for pair in header.get("layers", [])],
        layer_order=header.get("layer_order", []),
        variables=header.get("variables", []),
        history=history,
        first_nonfinite=FirstNonfinite(**first) if first else None,
        recommendations=[Recommendation(**r) for r in summary.get("recommendations", [])],
        validation_loss=summary.get("validation_loss"),
        interrupted=bool(summary.get("interrupted", not summary)),  # no summary: the run was killed mid-way
        stopped=summary.get("stopped"),
        notes=summary.get("notes", []) + _trace_end_notes(summary, others) + reader.notes(),
        trace_path=str(path),
        interventions=summary.get("interventions", []),
        spikes=summary.get("spikes", []),
    )
    if first is None and not summary:
        report.first_nonfinite = _first_bad(history)
    return report


def _first_bad(history):
    """FirstNonfinite(step, phase) of the first non-finite step in a history's scalars, or None."""
    first = history.overview().first_nonfinite
    return FirstNonfinite(first[0], PHASES[first[1]]) if first else None


# Why a run kept a row it wrote to its trace (StepHistory.why_kept).
WHY_KEPT = ("head", "event", "sample", "last")


class _TraceReader:
    """Folds a trace's lines into a StepHistory: step lines into its kept rows and aggregates, scalars lines into
    its row count; the scalars stay in the file (series.TraceColumns), so memory does not grow with the trace."""

    def __init__(self, header, path):
        from nanscope.errors import NanscopeError

        self.path = path
        # A trace written before scalars lines existed has a full step line for every step.
        self.full = header.get("rows", "full") == "full"
        self.series = header.get("series")
        if not self.full and not (isinstance(self.series, list) and self.series[:1] == ["step"]
                                  and all(isinstance(n, str) for n in self.series)):
            raise NanscopeError(f"{path}: line 1: series: expected the names of the scalars columns, "
                                f"starting with 'step'. Received: {self.series!r}")
        self.keep, self.sample = header.get("keep", DEFAULT_KEEP), header.get("sample", DEFAULT_SAMPLE)
        self.layers, self.variables = len(header.get("layers", [])), len(header.get("variables", []))
        run = header.get("run")
        dtypes = run.get("layer_dtypes") if isinstance(run, dict) else None
        dtypes = dtypes if isinstance(dtypes, dict) else {}
        self.dtypes = [dtypes.get(pair[0]) if isinstance(pair, list) and pair else None
                       for pair in header.get("layers", [])]
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

    def _history(self, outputs):
        return StepHistory(self.layers, self.variables, outputs, self.keep, self.sample,
                           series=lambda columns: TraceColumns(self.path, columns, self.rows, trace_lines),
                           layer_dtypes=self.dtypes)

    def step(self, record, why=None):
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

    def scalars(self, path, number, line):
        self.history.series.extend(*self.rows(path, number, line))

    def rows(self, path, number, line):
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

    def aggregates(self, line):
        history = self.history
        if history is None:
            return
        history.layers = [_aggregate(LayerAggregate, row, LayerStats) for row in line.get("layers", [])]
        history.variables = [_aggregate(VariableAggregate, row, VariableStats) for row in line.get("variables", [])]
        history.outputs = [_aggregate(OutputAggregate, row, OutputStats, ("first", "last"))
                           for row in line.get("outputs", [])]
        history.thin_sample(line.get("sample_stride"))
        self.exact = True

    def finished(self):
        return self.history or StepHistory(self.layers, self.variables)

    def notes(self):
        if self.full or self.exact or self.history is None or self.history.count == len(self.history.kept()):
            return []
        return ["the trace has no aggregates line (the run ended early): the layer, variable and output tables are "
                "taken over the kept steps only"]


def _scalar_array(path, number, rows, series):
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


def _aggregate(cls, row, stats_cls, stats_fields=("last",)):
    values = {k: decode_float(v) for k, v in row.items()}
    for name in stats_fields:
        if values.get(name) is not None:
            values[name] = stats_cls(**{k: decode_float(v) for k, v in values[name].items()})
    return cls(**values)



def aggregates_json(history):
    """The trace's `aggregates` line: the history's exact per-layer, per-variable and per-output aggregates, and
    the sample's last stride (which the redraw takes, so it keeps the run's rows)."""
    return jsonable({"kind": "aggregates", "layers": history.layers, "variables": history.variables,
                     "outputs": history.outputs, "sample_stride": history.sample_stride})


def _trace_end_notes(summary, other_lines):
    """What a trace without a summary line says about how its run ended."""
    notes = [f"the run stopped on an error: {line.get('message', '')}"
             for line in other_lines if line.get("kind") == "error"]
    if not summary and not notes:
        notes.append("the run ended before writing its summary (killed?): the report covers the steps in the trace")
    return notes
