"""--verify: applicable fixes are re-run from the same start; inapplicable ones stay unverified."""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

from pathlib import Path

import numpy as np
import pytest

from nanscope.runtime import tensorflow
from nanscope.spec.load import load_spec, parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

tf, keras = tensorflow()

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
    # The unfixed run fails at step 7: lr/10 must stay finite for 70 steps, lr/100 for 700 (k times the step).
    assert [(row["horizon"], row["steps_run"]) for row in rows] == [(70, 70), (700, 700)]
    assert [row["verdict"] for row in rows] == ["stays finite but does not learn", "trains"]
    assert rows[0]["learns"] is False and rows[0]["judged_loss"] > rows[0]["baseline"]
    assert by_id["normalize-targets"].verification[0]["horizon"] == 30  # 4 x 7 < the run's 30 steps
    assert by_id["bounded-activation"].verified is False
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
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.01}, "steps": 60, "seed": 0},
    }
    report = run_trace(parse_spec(document, source=str(tmp_path / "spec.yaml")),
                       TraceOptions(trace_path=tmp_path / "t.jsonl", verify=True))
    assert report.first_nonfinite is not None
    inputs = next(r for r in report.recommendations if r.id == "normalize-inputs")
    row = inputs.verification[0]
    assert inputs.verified is True and row["fix"] == "standardise x" and row["finite"] and row["steps_run"] == 60
    # It learns: below predicting the targets' mean (after 20 steps it was not yet: 3.81 against 3.50).
    assert row["verdict"] == "trains" and row["judged_loss"] < 0.99 * row["baseline"]
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
    from nanscope.run.verify import FIXES

    assert set(FIXES) <= set(RULES), f"verify.FIXES names rules the catalogue lacks: {set(FIXES) - set(RULES)}"


def test_a_fix_that_only_delays_a_float16_exp_overflow_is_not_verified_and_does_not_rank_first(tmp_path):
    """mixed_float16, a float16 exp output layer, counts near e^11.5: the unfixed run overflows at step 50.
    lr/10 stays finite for the run's 64 steps but overflows at step 409 of its 500-step horizon (10 x 50):
    it delays the failure; lr/100 stays finite for its 2000 steps (capped from 5000) but does not learn."""
    document = {
        "model": {"factory": f"{SPECS / 'precision_models.py'}:exp_rate"},
        "data": {"factory": f"{SPECS / 'data_factories.py'}:exp_counts", "batch_size": 32, "shuffle": True},
        "train": {"loss": "msle", "optimizer": {"name": "adam", "learning_rate": 0.01}, "steps": 64, "seed": 0,
                  "mixed_precision": "mixed_float16"},
    }
    report = run_trace(parse_spec(document, source=str(tmp_path / "spec.yaml")),
                       TraceOptions(trace_path=tmp_path / "t.jsonl", verify=True))
    first = report.first_nonfinite
    assert (first.step, first.phase, first.layer, first.op) == (50, "forward", "rate", "Exp")
    ids = [r.id for r in report.recommendations]
    rate = report.recommendations[ids.index("lower-learning-rate")]
    rows = {row["fix"]: row for row in rate.verification}
    assert rows["lr/10"]["verdict"] == "delays the failure to step 409"
    assert (rows["lr/10"]["horizon"], rows["lr/10"]["learns"], rows["lr/10"]["helped"]) == (500, None, False)
    assert (rows["lr/100"]["horizon"], rows["lr/100"]["horizon_wanted"], rows["lr/100"]["horizon_capped"]) == (
        2000, 5000, True)
    assert rows["lr/100"]["verdict"] == "stays finite but does not learn" and rows["lr/100"]["learns"] is False
    assert rows["lr/100"]["judged_loss"] > rows["lr/100"]["baseline"] * 0.99
    assert rate.verified is False and ids[0] != "lower-learning-rate"
    assert ids.index("float32-layer") < ids.index("lower-learning-rate")
    doc = report.to_json()
    row = next(r for r in doc["recommendations"] if r["id"] == "lower-learning-rate")["verification"][0]
    assert {"horizon", "learns", "final_loss", "baseline"} <= set(row)


@pytest.mark.parametrize("loss_scaled", [False, True])
def test_a_setting_a_fix_changes_on_the_saved_step_is_put_back(loss_scaled):
    # Keras keeps the learning rate in a variable that its setter assigns in place: the undo must put back the
    # value it held, not the variable (which by then holds the fix's rate).
    from nanscope.rules.fixes import optimizer_setting

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(0.01, epsilon=1e-7)
    model.compile(keras.optimizers.LossScaleOptimizer(optimizer) if loss_scaled else optimizer, "mse")
    undo = optimizer_setting("learning_rate", 0.001, {"epsilon": 1e-3})(model)
    assert (optimizer.learning_rate.numpy(), optimizer.epsilon) == (np.float32(0.001), 1e-3)
    undo()
    assert (optimizer.learning_rate.numpy(), optimizer.epsilon) == (np.float32(0.01), 1e-7)
