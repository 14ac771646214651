"""Every step's scalars: held in memory while a run records them, or read back from its trace in chunks.

A `StepHistory` keeps one scalar row per step (loss, gradient norms, non-finite
counts, phase, ...; see history.series_columns). A running `trace-steps`, the
callback and `instrument` hold them in `ScalarColumns`, float32 blocks a few dozen
bytes a step, because the plot, TensorBoard and the rules read them whole.
`nanscope report TRACE` needs only a few reductions of them (`Overview`: the
curves' sparklines, first and last values, the last loss scale, the skipped
updates), so it holds `TraceColumns`, which counts the rows as the trace streams
past and reads them back from the file, chunk by chunk, when asked: its memory
does not grow with the run's length.

Both give their rows as chunks of (steps, float32 values); `overview` reduces
chunks, so a report redrawn from its trace shows what the run showed.

Example:
    columns = ScalarColumns(series_columns(0))
    columns.append(0, row)
    overview(columns).curves["loss"].points      # at most OVERVIEW_WIDTH values
"""

import math
from dataclasses import dataclass, field

import numpy as np

# Rows of the scalar columns' first preallocated block; each next block doubles the rows, up to BLOCK_ROWS.
FIRST_BLOCK_ROWS = 1 << 10
BLOCK_ROWS = 1 << 16
# Rows per chunk that TraceColumns reads back from a trace.
READ_ROWS = 1 << 10
# Points of an overview curve (the report's sparkline width).
OVERVIEW_WIDTH = 60
CURVES = ("loss", "grad_global_norm")


class ScalarColumns:
    """Float32 rows in preallocated blocks, plus an int64 step per row: append one, read a column whole.

    Args:
        columns: Columns. The names of a row's values.
    """

    def __init__(self, columns):
        self.columns = columns
        self.count = 0
        self._values, self._steps = [], []
        self._at = self._size = 0  # rows filled in the last block, and its size

    def append(self, step, row):
        if self._at == self._size:
            self._size = min(BLOCK_ROWS, max(FIRST_BLOCK_ROWS, self.count))
            self._values.append(np.empty((self._size, len(self.columns)), np.float32))
            self._steps.append(np.empty(self._size, np.int64))
            self._at = 0
        self._values[-1][self._at] = row
        self._steps[-1][self._at] = step
        self._at += 1
        self.count += 1

    def chunks(self):
        """(steps int64, values float32 [rows, columns]) of every row, in blocks, in order."""
        for index, (steps, values) in enumerate(zip(self._steps, self._values)):
            rows = self._at if index == len(self._steps) - 1 else len(steps)
            yield steps[:rows], values[:rows]

    def steps(self):
        """Every row's step, as an int64 array."""
        return _joined([steps for steps, _ in self.chunks()], np.int64)

    def column(self, name):
        """Every row's value of column `name`, as a float64 array."""
        index = self.columns.at(name)
        return _joined([values[:, index] for _, values in self.chunks()], np.float32).astype(np.float64)

    @property
    def nbytes(self):
        return sum(b.nbytes for b in self._values) + sum(b.nbytes for b in self._steps)


class TraceColumns:
    """The scalar rows of a trace file: counted as the reader streams past them, read back in chunks on demand.

    Nothing per step stays in memory. `column` and `steps` still give whole arrays, for a
    caller that asks for them; `overview` reads the file once more, in chunks.

    Args:
        path: Path. The trace file.
        columns: Columns. The names of a row's values, as StepHistory wants them.
        rows: callable(path, number, line) -> (steps, float32 values) or None. Decodes one
            trace line into rows in `columns` order (None for a line without rows); the
            reader that streamed the file first gives the same decoder.
    """

    def __init__(self, path, columns, rows):
        self.columns, self.count = columns, 0
        self._path, self._rows = path, rows

    def append(self, step, row):
        """Count one row (the reader gives it back from the file when asked)."""
        self.count += 1

    def extend(self, steps):
        """Count the rows of one trace line."""
        self.count += len(steps)

    def chunks(self):
        """(steps int64, values float32 [rows, columns]) of the first `count` rows of the file, in order."""
        from nanscope.tracefile import trace_lines

        lines = trace_lines(self._path)
        next(lines)
        left, steps, values, held = self.count, [], [], 0
        for number, line in lines:
            if left <= 0:
                break
            decoded = self._rows(self._path, number, line)
            if decoded is None:
                continue
            steps.append(decoded[0][:left])
            values.append(decoded[1][:left])
            held += len(steps[-1])
            left -= len(steps[-1])
            if held >= READ_ROWS:
                yield np.concatenate(steps), np.concatenate(values)
                steps, values, held = [], [], 0
        if held:
            yield np.concatenate(steps), np.concatenate(values)

    def steps(self):
        return _joined([steps for steps, _ in self.chunks()], np.int64)

    def column(self, name):
        index = self.columns.at(name)
        return _joined([values[:, index] for _, values in self.chunks()], np.float32).astype(np.float64)

    @property
    def nbytes(self):
        return 0


def _joined(blocks, dtype):
    return np.concatenate(blocks) if blocks else np.empty(0, dtype)


@dataclass
class Curve:
    """A column over the whole run, for a sparkline.

    Args:
        points: list of float. Every value for a run of at most `width` steps; else `width`
            buckets of consecutive steps, each its largest |value|, or NaN where it holds a
            non-finite one.
        first_finite: float or None. The first finite value (the first value when none is finite).
        last: float or None. The last value.
    """

    points: list = field(default_factory=list)
    first_finite: float | None = None
    last: float | None = None


@dataclass
class Overview:
    """What a report shows of every step's scalars, in bounded size.

    Args:
        steps: int. Rows reduced.
        curves: dict of str -> Curve. The CURVES columns.
        last_loss_scale: float or None. The last non-zero loss scale (0 is a step without loss scaling).
        skipped_updates: int. Steps whose update was skipped.
        loss_missing: int. Steps that gave no loss to record (`instrument` around a step that returns none).
        first_nonfinite: (int, int) or None. (step, phase code) of the first step with a non-zero phase.
    """

    steps: int = 0
    curves: dict = field(default_factory=dict)
    last_loss_scale: float | None = None
    skipped_updates: int = 0
    loss_missing: int = 0
    first_nonfinite: tuple | None = None


def overview(series, width=OVERVIEW_WIDTH):
    """The Overview of `series` (ScalarColumns or TraceColumns), in one pass over its chunks."""
    count = series.count
    at = {name: series.columns.at(name) for name in (*CURVES, "loss_scale", "update_skipped", "phase")}
    curves = {name: _CurveReducer(count, width) for name in CURVES}
    missing = series.columns.at("loss_missing") if "loss_missing" in series.columns else None
    result, start = Overview(), 0
    for steps, values in series.chunks():
        for name, reducer in curves.items():
            reducer.add(start, values[:, at[name]].astype(np.float64))
        scales = values[:, at["loss_scale"]]
        nonzero = np.flatnonzero(scales != 0)
        if len(nonzero):
            result.last_loss_scale = float(scales[nonzero[-1]])
        result.skipped_updates += int(np.count_nonzero(values[:, at["update_skipped"]] != 0))
        if missing is not None:  # a trace written before the column existed has none
            result.loss_missing += int(np.count_nonzero(values[:, missing] != 0))
        bad = np.flatnonzero(values[:, at["phase"]] != 0)
        if result.first_nonfinite is None and len(bad):
            result.first_nonfinite = (int(steps[bad[0]]), int(values[bad[0], at["phase"]]))
        start += len(steps)
    result.steps = start
    result.curves = {name: reducer.curve() for name, reducer in curves.items()}
    return result


class _CurveReducer:
    """Folds chunks of one column into a Curve; the buckets are render.format.sparkline's for `count` values."""

    def __init__(self, count, width):
        self.resampled = count > width
        bucket = count / width
        self.edges = np.array([int(i * bucket) for i in range(width + 1)], np.int64) if self.resampled else None
        self.peak = np.zeros(width)
        self.bad = np.zeros(width, bool)
        self.points, self.first_finite, self.first, self.last = [], None, None, None

    def add(self, start, values):
        if not len(values):
            return
        self.first = values[0] if self.first is None else self.first
        self.last = values[-1]
        finite = np.isfinite(values)
        if self.first_finite is None and finite.any():
            self.first_finite = values[np.argmax(finite)]
        if not self.resampled:
            self.points.extend(values.tolist())
            return
        bucket = np.searchsorted(self.edges, np.arange(start, start + len(values)), side="right") - 1
        inside = bucket < len(self.peak)  # a value past the last edge is in no bucket (as in sparkline)
        np.maximum.at(self.peak, bucket[inside & finite], np.abs(values[inside & finite]))
        self.bad[bucket[inside & ~finite]] = True

    def curve(self):
        points = self.points if not self.resampled else np.where(self.bad, math.nan, self.peak).tolist()
        first = self.first_finite if self.first_finite is not None else self.first
        return Curve(points, None if first is None else float(first), None if self.last is None else float(self.last))
