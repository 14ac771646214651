"""The JSON-lines trace: one header line, then one line per step, flushed as made.

An interrupted or killed run keeps every completed step. The reader tolerates a
torn last line. This module does not import TensorFlow, so `nanscope report` can
redraw a report from a trace without it.
"""

import json
import os
from pathlib import Path

from nanscope.errors import NanscopeError
from nanscope.jsonio import dumps

TRACE_SCHEMA = "nanscope.trace-lines/1"


class TraceWriter:
    """Appends records to a JSON-lines file, flushing and fsyncing every line.

    Args:
        path: Path. Created (with its folder); an existing file is replaced.
        header: dict. Written as the first line (run description, layer and variable names).
    """

    def __init__(self, path, header):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.path, "w", encoding="utf-8")
        self.write({"kind": "header", "schema": TRACE_SCHEMA, **header})

    def write(self, line):
        self._handle.write(dumps(line, indent=None) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self):
        if not self._handle.closed:
            self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_trace(path):
    """(header, list of step dicts, list of other lines) from a trace file; a torn last line is dropped."""
    path = Path(path)
    if not path.is_file():
        raise NanscopeError(f"{path}: trace file not found")
    lines = path.read_text(encoding="utf-8").splitlines()
    parsed = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break  # a write cut short by a kill: every completed line before it stands
            raise NanscopeError(f"{path}: line {number} is not valid JSON") from None
    if not parsed or parsed[0].get("kind") != "header":
        raise NanscopeError(f"{path}: not a nanscope trace (no header line)")
    steps = [p for p in parsed[1:] if p.get("kind") == "step"]
    others = [p for p in parsed[1:] if p.get("kind") != "step"]
    return parsed[0], steps, others
