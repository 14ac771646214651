"""The JSON-lines trace: a header line, every step's scalars, the full rows of the kept steps, flushed as made.

By default a trace holds, per step, its scalars (`history.SERIES`: loss, gradient norms,
non-finite counts, phase, ...) in compact `scalars` lines of a few steps each, and a
full `step` line (every layer and variable) for each step the run's `StepHistory`
keeps: the first steps, an even sample, the steps around an event, and at the end the
last steps, then an `aggregates` line (exact per-layer/variable/output tables) and the
`summary`. With `full=True` (`--trace-full`) every step gets a full `step` line instead.

An interrupted or killed run keeps every completed step's scalars. The reader streams
the file and tolerates a torn last line. This module does not import TensorFlow, so
`nanscope report` can redraw a report from a trace without it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator

from typing import Any
from pathlib import Path

import numpy as np

from nanscope.errors import NanscopeError
from nanscope.jsonio import dumps, encode_float
from nanscope.engine.records import StepRecord
from nanscope.store.history import StepHistory
from nanscope.store.lines import AggregatesLine, ErrorLine, HeaderLine, ScalarsLine, StepLine, SummaryLine
from nanscope.store.rows import scalar_row


class TraceWriter:
    """Appends records to a JSON-lines file, flushing every line.

    A flushed line is in the operating system's hands, so it survives the process
    being killed (even with SIGKILL); the file is fsynced once, on close. An fsync per
    line would also guard against a machine crash, at the cost of a disk round trip
    per step, which on a small model is slower than the step itself.

    Args:
        path: Path. Created (with its folder); an existing file is replaced.
        header: dict. Written as the first line (run description, layer and variable names).
        history: StepHistory, optional. The run's history: its scalar columns name the
            `scalars` lines' values. Without it every step is a full line.
        full: bool, default False. Write every step's full row, not only the kept ones.
    """

    _pending: list[str]
    _rows: list[str]

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any], history: StepHistory | None = None,
                 full: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.full = full or history is None
        self._history = history
        self._pending, self._rows = [], []
        # The writer owns the handle until close() (or the end of a `with` block).
        self._handle = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        self.write(HeaderLine.for_run(header, history, self.full))

    def write(self, line: HeaderLine | ScalarsLine | StepLine | ErrorLine | AggregatesLine | SummaryLine) -> None:
        """Write one line (a `nanscope.store.lines` class) after the steps added so far."""
        self.flush_steps()
        self._handle.write(dumps(line.to_json(), indent=None) + "\n")
        self._handle.flush()

    def step(self, record: StepRecord, kept: Iterable[StepRecord]) -> None:
        """Add one step: its scalars (or its full row with `full`), and the full rows `kept` (StepHistory.add).

        Nothing is written before `flush_steps`, which writes the scalars first: a file cut
        short by a kill never holds a step's full row without its scalars.
        """
        if self.full:
            self._rows.append(_full_line(record))
            return
        with np.errstate(over="ignore"):  # beyond float32's range is inf, as in the run's own columns
            row = np.array(scalar_row(record), np.float32).tolist()
        self._pending.append(f"[{record.step},{','.join(map(_number, row))}]")
        # Not `full`: the history is there.
        self._rows.extend(_full_line(row, self._history.why_kept(row.step)) for row in kept)  # type: ignore[union-attr]

    def rows(self, records: Iterable[StepRecord]) -> None:
        """Add full rows (the kept last steps, at the end) unless every row is written already."""
        if not self.full:
            self._rows.extend(_full_line(record, "last") for record in records)

    def flush_steps(self) -> None:
        """Write the steps added since the last flush: one line of scalars, then the full rows."""
        if self._pending:
            self._handle.write(ScalarsLine.text(self._pending) + "\n")
            self._pending = []
        if self._rows:
            self._handle.write("".join(self._rows))
            self._rows = []
        self._handle.flush()

    def close(self) -> None:
        if not self._handle.closed:
            self.flush_steps()
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _full_line(record: StepRecord, kept: str | None = None) -> str:
    """A step line; `kept` (a trace of the kept rows only) says why the run kept the row (StepHistory.why_kept)."""
    return dumps(StepLine(record, kept).to_json(), indent=None) + "\n"


def _number(value: float) -> str:
    """A float32 value as the JSON number that reads back as it, or "nan" / "inf" / "-inf" (jsonio's spelling).

    Nine significant digits give back every float32 exactly; the value must be a float32 already
    (`step` rounds the row once, as the run's columns do): nine digits of a float64 and a second
    rounding to float32 can land one float32 away. -0.0 keeps its sign.
    """
    if not math.isfinite(value):
        return f'"{encode_float(float(value))}"'
    if value == 0 and math.copysign(1.0, value) < 0:
        return "-0.0"  # "0" or "-0" would read back as the integer 0, which has no sign
    if value == int(value) and abs(value) < 2 ** 53:
        return str(int(value))
    return f"{value:.9g}"


def trace_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, dict) of each line of a trace file, streamed; the header comes first, a torn last line is dropped.

    Raises:
        NanscopeError: the file is missing, unreadable, not a trace, or a line other than
            the last is not a JSON object.
    """
    path = Path(path)
    if not path.is_file():
        raise NanscopeError(f"{path}: trace file not found")
    try:
        with open(path, encoding="utf-8") as handle:
            pending, first = None, True
            for number, text in enumerate(handle, start=1):
                if pending is not None:
                    yield from _parsed(path, *pending, last=False, first=first)
                    first = False
                pending = (number, text) if text.strip() else None
            if pending is not None:
                yield from _parsed(path, *pending, last=True, first=first)
            elif first:  # an empty file
                yield from _parsed(path, 0, "", last=True, first=True)
    except (OSError, UnicodeDecodeError) as exc:
        raise NanscopeError(f"{path}: cannot read the trace: {exc}") from exc


def _parsed(path: Path, number: int, text: str, last: bool, first: bool) -> Iterator[tuple[int, dict[str, Any]]]:
    """The line's JSON object (none for a torn last line), checked: a header first, step lines that rebuild."""
    try:
        value = json.loads(text) if text else None
    except (json.JSONDecodeError, RecursionError):
        if not last:
            raise NanscopeError(f"{path}: line {number} is not valid JSON") from None
        value = None  # a write cut short by a kill: every completed line before it stands
    if value is not None and not isinstance(value, dict):
        raise NanscopeError(f"{path}: line {number}: expected a JSON object. Received: a {type(value).__name__}")
    if first and (value is None or value.get("kind") != "header"):
        raise NanscopeError(f"{path}: not a nanscope trace (no header line); expected a file written by trace-steps")
    if value is not None:
        yield number, value


def read_trace(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(header, list of full step dicts, list of other lines but the scalars) of a whole trace file, in memory.

    `nanscope.report.redraw.load_trace` streams instead; this is for a short trace's lines as they are.
    """
    lines = trace_lines(path)
    header = next(lines)[1]
    steps, others = [], []
    for number, line in lines:
        if line.get("kind") == "step":
            step_record(path, number, line)
            steps.append(line)
        elif line.get("kind") != "scalars":
            others.append(line)
    return header, steps, others


def step_record(path: str | os.PathLike[str], number: int, line: dict[str, Any]) -> StepRecord:
    """The StepRecord of a step line; a tampered one is bad input, not a crash."""
    try:
        return StepLine.from_json(line).record
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise NanscopeError(f"{path}: line {number}: not a step record written by trace-steps ({exc})") from None
