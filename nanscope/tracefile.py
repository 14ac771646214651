"""The JSON-lines trace: one header line, then one line per step, flushed as made.

An interrupted or killed run keeps every completed step. The reader tolerates a
torn last line. This module does not import TensorFlow, so `nanscope report` can
redraw a report from a trace without it.
"""

import json
import os
from pathlib import Path

from nanscope.errors import NanscopeError
from nanscope.jsonio import dumps, jsonable

TRACE_SCHEMA = "nanscope.trace-lines/1"


class TraceWriter:
    """Appends records to a JSON-lines file, flushing every line.

    A flushed line is in the operating system's hands, so it survives the process
    being killed (even with SIGKILL); the file is fsynced once, on close. An fsync per
    line would also guard against a machine crash, at the cost of a disk round trip
    per step, which on a small model is slower than the step itself.

    Args:
        path: Path. Created (with its folder); an existing file is replaced.
        header: dict. Written as the first line (run description, layer and variable names).
    """

    def __init__(self, path, header):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # The writer owns the handle until close() (or the end of a `with` block): one line per step, flushed.
        self._handle = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        self.write({"kind": "header", "schema": TRACE_SCHEMA, **header})

    def write(self, line):
        self._handle.write(dumps(line, indent=None) + "\n")
        self._handle.flush()

    def close(self):
        if not self._handle.closed:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def step_fields(record):
    """A StepRecord's fields as its trace line holds them (made JSON-safe by the writer)."""
    return {**vars(record), "phase": record.phase}


def step_line(record):
    """The trace line of one step."""
    return {"kind": "step", **step_fields(record)}


def summary_fields(report):
    """What a TraceReport found, as the trace's last line holds it (JSON-safe)."""
    return jsonable({
        "first_nonfinite": report.first_nonfinite,
        "recommendations": report.recommendations,
        "validation_loss": report.validation_loss,
        "interrupted": report.interrupted,
        "notes": report.notes,
        **({"stopped": report.stopped} if getattr(report, "stopped", None) else {}),
    })


def summary_line(report):
    """The trace's last line: the first non-finite step, the findings and how the run ended."""
    return {"kind": "summary", **summary_fields(report)}


def read_trace(path):
    """(header, list of step dicts, list of other lines) from a trace file; a torn last line is dropped."""
    path = Path(path)
    if not path.is_file():
        raise NanscopeError(f"{path}: trace file not found")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise NanscopeError(f"{path}: cannot read the trace: {exc}") from exc
    parsed = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            if number == len(lines):
                break  # a write cut short by a kill: every completed line before it stands
            raise NanscopeError(f"{path}: line {number} is not valid JSON") from None
        if not isinstance(value, dict):
            raise NanscopeError(f"{path}: line {number}: expected a JSON object. Received: a {type(value).__name__}")
        parsed.append((number, value))
    if not parsed or parsed[0][1].get("kind") != "header":
        raise NanscopeError(f"{path}: not a nanscope trace (no header line); expected a file written by trace-steps")
    for number, line in parsed[1:]:
        if line.get("kind") == "step":
            _check_step_line(path, number, line)
    steps = [p for _, p in parsed[1:] if p.get("kind") == "step"]
    others = [p for _, p in parsed[1:] if p.get("kind") != "step"]
    return parsed[0][1], steps, others


def _check_step_line(path, number, line):
    """A step line must rebuild into a StepRecord; a tampered one is bad input, not a crash."""
    from nanscope.engine.records import record_from_dict

    try:
        record_from_dict(line)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise NanscopeError(f"{path}: line {number}: not a step record written by trace-steps ({exc})") from None
