"""Every step's scalars: held in memory while a run records them, or folded as a trace streams past.

A `StepHistory` keeps one scalar row per step (loss, gradient norms, non-finite
counts, phase, ...; see history.series_columns). A running `trace-steps`, the
callback and `instrument` hold them in `ScalarColumns`, float32 blocks a few dozen
bytes a step, because the plot, TensorBoard and the rules read them whole.
`nanscope report TRACE` needs only what the report shows of them (`Overview`: the
curves' sparklines, first and last values, the last loss scale, the skipped
updates, the first non-finite step), so it holds `TraceColumns`, which folds the
rows into an Overview as the trace streams past and reads them back from the file
only for a caller that asks for whole columns: its memory does not grow with the
run's length.

Both fold their rows with the same `OverviewFold` (nanscope/store/overview.py), in
constant memory, so a report redrawn from its trace shows what the run showed.

Example:
    columns = ScalarColumns(series_columns(0))
    columns.append(0, row)
    columns.overview().curves["loss"].points      # at most 2 * OVERVIEW_WIDTH values
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
import os
from typing import Any

import numpy as np
import numpy.typing as npt

from nanscope.engine.schema import Columns
from nanscope.store.overview import OVERVIEW_WIDTH, Overview, OverviewFold, fold_overview

# Rows of the scalar columns' first preallocated block; each next block doubles the rows, up to BLOCK_ROWS.
FIRST_BLOCK_ROWS = 1 << 10
BLOCK_ROWS = 1 << 16
# Rows per chunk that TraceColumns reads back from a trace.
READ_ROWS = 1 << 10


class ScalarColumns:
    """Float32 rows in preallocated blocks, plus an int64 step per row: append one, read a column whole.

    Args:
        columns: Columns. The names of a row's values.
        only: sequence of str, optional. Hold only these columns of each row (`columns` then
            names them); a caller that reads a few columns holds a few.
    """

    _values: list[np.ndarray]
    _steps: list[np.ndarray]

    def __init__(self, columns: Columns, only: Sequence[str] | None = None) -> None:
        self._pick = [columns.at(name) for name in only] if only is not None else None
        self.columns = Columns(*only) if only is not None else columns
        self.count = 0
        self._values, self._steps = [], []
        self._at = self._size = 0  # rows filled in the last block, and its size

    def append(self, step: int, row: Sequence[float | None]) -> None:
        if self._at == self._size:
            self._size = min(BLOCK_ROWS, max(FIRST_BLOCK_ROWS, self.count))
            self._values.append(np.empty((self._size, len(self.columns)), np.float32))
            self._steps.append(np.empty(self._size, np.int64))
            self._at = 0
        self._values[-1][self._at] = row if self._pick is None else [row[i] for i in self._pick]
        self._steps[-1][self._at] = step
        self._at += 1
        self.count += 1

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(steps int64, values float32 [rows, columns]) of every row, in blocks, in order."""
        for index, (steps, values) in enumerate(zip(self._steps, self._values)):
            rows = self._at if index == len(self._steps) - 1 else len(steps)
            yield steps[:rows], values[:rows]

    def steps(self) -> np.ndarray:
        """Every row's step, as an int64 array."""
        return _joined([steps for steps, _ in self.chunks()], np.int64)

    def column(self, name: str) -> np.ndarray:
        """Every row's value of column `name`, as a float64 array."""
        index = self.columns.at(name)
        return _joined([values[:, index] for _, values in self.chunks()], np.float32).astype(np.float64)

    def overview(self, width: int = OVERVIEW_WIDTH) -> Overview:
        """The Overview of every row."""
        return fold_overview(self, width)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._values) + sum(b.nbytes for b in self._steps)


class TraceColumns:
    """The scalar rows of a trace file: folded into an Overview as the reader streams past them, read back from
    the file in chunks only when a caller asks for whole columns.

    Nothing per step stays in memory.

    Args:
        path: Path. The trace file.
        columns: Columns. The names of a row's values, as StepHistory wants them.
        rows: callable(path, number, line) -> (steps, float32 values) or None. Decodes one
            trace line into rows in `columns` order (None for a line without rows); the
            reader that streamed the file first gives the same decoder.
        lines: callable(path) -> iterator of (line number, dict), header first. Streams the
            file's lines again (the trace reader's `trace_lines`): the store's file format is
            the trace file's, one layer up.
    """

    _pending: list[tuple[np.ndarray, np.ndarray]]

    def __init__(self, path: str | os.PathLike[str], columns: Columns,
                 rows: Callable[[str | os.PathLike[str], int, dict[str, Any]], tuple[np.ndarray, np.ndarray] | None],
                 lines: Callable[[str | os.PathLike[str]], Iterator[tuple[int, dict[str, Any]]]]) -> None:
        self.columns, self.count = columns, 0
        self._path, self._rows, self._lines = path, rows, lines
        self._fold, self._pending, self._held = OverviewFold(columns), [], 0

    def append(self, step: int, row: Sequence[float | None]) -> None:
        """Add one row (a trace whose every step is a full row)."""
        self.extend(np.array([step], np.int64), np.array([row], np.float32))

    def extend(self, steps: np.ndarray, values: np.ndarray) -> None:
        """Add the rows of one trace line: (steps int64, float32 values [rows, columns])."""
        self.count += len(steps)
        self._pending.append((steps, values))
        self._held += len(steps)
        if self._held >= READ_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._fold.add(np.concatenate([s for s, _ in self._pending]), np.concatenate([v for _, v in self._pending]))
            self._pending, self._held = [], 0

    def overview(self, width: int = OVERVIEW_WIDTH) -> Overview:
        """The Overview of the rows added so far (read back from the file for another width)."""
        if width != self._fold.width:
            return fold_overview(self, width)
        self._flush()
        return self._fold.overview()

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(steps int64, values float32 [rows, columns]) of the first `count` rows of the file, in order."""
        lines = self._lines(self._path)
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

    def steps(self) -> np.ndarray:
        return _joined([steps for steps, _ in self.chunks()], np.int64)

    def column(self, name: str) -> np.ndarray:
        index = self.columns.at(name)
        return _joined([values[:, index] for _, values in self.chunks()], np.float32).astype(np.float64)

    @property
    def nbytes(self) -> int:
        return 0


def _joined(blocks: Sequence[np.ndarray], dtype: npt.DTypeLike) -> np.ndarray:
    return np.concatenate(blocks) if blocks else np.empty(0, dtype)
