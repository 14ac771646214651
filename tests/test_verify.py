"""--verify: applicable fixes are re-run from the same start; inapplicable ones stay unverified."""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

from pathlib import Path

from nanscope.spec import load_spec, parse_spec
from nanscope.trace import TraceOptions, run_trace

SPECS = Path(__file__).parent / "specs"


def test_exploding_regression_fixes_are_verified(tmp_path):
    report = run_trace(load_spec(SPECS / "exploding.yaml"), TraceOptions(trace_path=tmp_path / "t.jsonl", verify=True))
    by_id = {r.id: r for r in report.recommendations}
    assert by_id["clip-gradients"].verified is True
    assert by_id["lower-learning-rate"].verified is True
    # Standardised targets (std ~210 -> 1) stay finite and train: the loss is then in standardised units.
    assert by_id["normalize-targets"].verified is True
    assert by_id["normalize-targets"].verification[0]["fix"] == "standardise y"
    rows = by_id["lower-learning-rate"].verification
    assert [row["fix"] for row in rows] == ["lr/10", "lr/100"]
    assert all(row["steps_run"] == 30 for row in rows if row["finite"])
    assert report.to_json()["recommendations"][0]["verification"]


def test_fix_in_user_code_is_not_applicable(tmp_path):
    report = run_trace(load_spec(SPECS / "log-of-softmax.yaml"),
                       TraceOptions(trace_path=tmp_path / "t.jsonl", verify=True))
    stable_log = report.recommendations[0]
    assert stable_log.id == "stable-log" and stable_log.verified is None
    assert "models.py:" in stable_log.fix


def test_standardised_inputs_are_verified_and_the_unscaled_run_is_not_touched(tmp_path):
    document = {
        "model": {"factory": f"{SPECS / 'phase_models.py'}:dense"},
        "data": {"factory": f"{SPECS / 'data_factories.py'}:arrays", "args": {"scale": 1e4, "target_scale": 1e-4},
                 "batch_size": 16,
                 "shuffle": False},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.01}, "steps": 20, "seed": 0},
    }
    report = run_trace(parse_spec(document, source=str(tmp_path / "spec.yaml")),
                       TraceOptions(trace_path=tmp_path / "t.jsonl", verify=True))
    assert report.first_nonfinite is not None
    inputs = next(r for r in report.recommendations if r.id == "normalize-inputs")
    row = inputs.verification[0]
    assert inputs.verified is True and row["fix"] == "standardise x" and row["finite"] and row["steps_run"] == 20
    # The data change lived only for its experiment: the session's data is the unscaled data again.
    assert report.records[0].x_nonfinite == 0 and report.run["data"].startswith(str(SPECS / "data_factories.py"))


def test_the_multi_output_example_proves_standardised_price_targets_and_refutes_a_lower_rate(tmp_path):
    report = run_trace(load_spec(Path(__file__).parent.parent / "configs" / "multi-output.yaml"),
                       TraceOptions(trace_path=tmp_path / "t.jsonl", verify=True))
    first, second = report.recommendations[:2]
    assert (first.id, first.verified) == ("normalize-targets", True)
    assert first.verification[0]["fix"] == "standardise y[price]"
    assert (second.id, second.verified) == ("lower-learning-rate", False)


def test_every_fix_verify_can_apply_belongs_to_a_catalogued_rule():
    from nanscope.rules.catalogue import RULES
    from nanscope.verify import FIXES

    assert set(FIXES) <= set(RULES), f"verify.FIXES names rules the catalogue lacks: {set(FIXES) - set(RULES)}"
