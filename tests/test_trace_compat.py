"""Traces written by an earlier version still load: `nanscope report` redraws the report that run printed.

tests/golden/trace-0.1.0/ holds the trace and the JSON report of `nanscope trace-steps
configs/exploding-regression.yaml` as nanscope 0.1.0 wrote them (main at 6119a44, before the
modules moved into packages). A change to the trace's line kinds, its NaN/Inf spelling or the
record's fields that an old trace cannot follow fails here.
"""

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from nanscope.cli import app

GOLDEN = Path(__file__).parent / "golden" / "trace-0.1.0"


def test_a_trace_of_version_0_1_0_redraws_the_report_its_run_wrote(tmp_path):
    trace = tmp_path / "trace.jsonl"
    shutil.copy(GOLDEN / "trace.jsonl", trace)
    result = CliRunner().invoke(app, ["report", str(trace), "--json", "-"])
    assert result.exit_code == 1, result.stderr  # the run found a NaN: the redraw says so too
    redrawn = json.loads(result.stdout)
    written = json.loads((GOLDEN / "report.json").read_text())
    assert redrawn["trace"] == str(trace)
    del redrawn["trace"], written["trace"]
    assert redrawn == written
    first = redrawn["first_nonfinite"]
    assert (first["step"], first["phase"], first["op"]) == (8, "loss", "Square")
    assert [r["id"] for r in redrawn["recommendations"]][:2] == ["clip-gradients", "lower-learning-rate"]
