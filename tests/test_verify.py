"""--verify: applicable fixes are re-run from the same start; inapplicable ones stay unverified."""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

from pathlib import Path

from nanscope.spec import load_spec
from nanscope.trace import TraceOptions, run_trace

SPECS = Path(__file__).parent / "specs"


def test_exploding_regression_fixes_are_verified(tmp_path):
    report = run_trace(load_spec(SPECS / "exploding.yaml"), TraceOptions(trace_path=tmp_path / "t.jsonl", verify=True))
    by_id = {r.id: r for r in report.recommendations}
    assert by_id["clip-gradients"].verified is True
    assert by_id["lower-learning-rate"].verified is True
    assert by_id["normalize-targets"].verified is None
    rows = by_id["lower-learning-rate"].verification
    assert [row["fix"] for row in rows] == ["lr/10", "lr/100"]
    assert all(row["steps_run"] == 30 for row in rows if row["finite"])
    assert report.to_json()["recommendations"][0]["verification"]


def test_fix_in_user_code_is_not_applicable(tmp_path):
    report = run_trace(load_spec(SPECS / "log-of-softmax.yaml"), TraceOptions(trace_path=tmp_path / "t.jsonl", verify=True))
    stable_log = report.recommendations[0]
    assert stable_log.id == "stable-log" and stable_log.verified is None
    assert "models.py:" in stable_log.fix
