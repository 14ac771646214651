"""Rules that fire on runs, not on a single op: where each must fire and where it must stay quiet."""

from pathlib import Path

import pytest

from nanscope.spec.load import load_spec, parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

SPECS = Path(__file__).parent / "specs"
CONFIGS = Path(__file__).parent.parent / "configs"


def run_document(tmp_path, model, optimizer, data_args=None, steps=5, loss="mse"):
    document = {
        "model": {"factory": f"{SPECS / 'phase_models.py'}:{model}"},
        "data": {"factory": f"{SPECS / 'data_factories.py'}:arrays", "args": data_args or {}, "batch_size": 16,
                 "shuffle": False},
        "train": {"loss": loss, "optimizer": optimizer, "steps": steps, "seed": 0},
    }
    spec = parse_spec(document, source=str(tmp_path / "spec.yaml"))
    return run_trace(spec, TraceOptions(trace_path=tmp_path / "t.jsonl"))


def ids(report):
    return [r.id for r in report.recommendations]


@pytest.fixture(scope="module")
def exploding(tmp_path_factory):
    path = tmp_path_factory.mktemp("exploding")
    return run_trace(load_spec(CONFIGS / "exploding-regression.yaml"), TraceOptions(trace_path=path / "t.jsonl"))


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    path = tmp_path_factory.mktemp("healthy")
    return run_trace(load_spec(CONFIGS / "healthy-classification.yaml"), TraceOptions(trace_path=path / "t.jsonl"))


def test_optimizer_epsilon_fires_on_a_nan_update_from_finite_gradients(tmp_path):
    # Adam with epsilon 0: a variable whose gradient is exactly 0 gets the update 0 / (sqrt(0) + 0) = NaN.
    report = run_document(tmp_path, "dead_relu", {"name": "adam", "learning_rate": 0.01, "epsilon": 0.0})
    assert report.first_nonfinite.phase == "update"
    assert report.records[report.first_nonfinite.step].grad_nonfinite == 0
    assert "optimizer-epsilon" in ids(report)[:2]
    assert any("epsilon 0" in line for line in report.recommendations[ids(report).index("optimizer-epsilon")].evidence)


def test_optimizer_epsilon_stays_quiet_with_a_normal_epsilon(tmp_path):
    report = run_document(tmp_path, "dead_relu", {"name": "adam", "learning_rate": 0.01, "epsilon": 1e-7})
    assert report.first_nonfinite is None and "optimizer-epsilon" not in ids(report)


def test_normalize_inputs_fires_on_large_features_only(tmp_path):
    large = run_document(tmp_path, "dense", {"name": "sgd", "learning_rate": 1e-9}, {"scale": 1000.0})
    assert "normalize-inputs" in ids(large)
    unit = run_document(tmp_path, "dense", {"name": "sgd", "learning_rate": 0.01})
    assert "normalize-inputs" not in ids(unit)


@pytest.mark.parametrize("rule", ["bounded-activation", "weight-constraint", "clip-gradients", "lower-learning-rate",
                                  "normalize-targets"])
def test_growth_rules_fire_on_exploding_regression_and_not_on_the_healthy_run(rule, exploding, healthy):
    assert rule in ids(exploding)
    fired = [r for r in healthy.recommendations if r.id == rule]
    assert all(r.severity == "info" for r in fired)  # nothing above info on a healthy run


def test_the_clipped_twin_stays_free_of_warnings(tmp_path):
    spec = load_spec(CONFIGS / "exploding-regression-clipnorm.yaml")
    spec.train.steps = 400
    report = run_trace(spec, TraceOptions(trace_path=tmp_path / "t.jsonl"))
    assert report.status == "healthy"
    assert all(r.severity == "info" for r in report.recommendations)


def test_unscaled_targets_come_first_when_the_loss_overflows_at_once(tmp_path):
    # Targets of 1e20: the squared error overflows float32 on the first step, before any trend exists.
    report = run_document(tmp_path, "dense", {"name": "sgd", "learning_rate": 0.01}, {"target_scale": 1e20})
    first = report.first_nonfinite
    assert (first.step, first.phase, first.op) == (0, "loss", "Square")
    assert ids(report)[0] == "normalize-targets" and report.recommendations[0].severity == "error"


def test_unscaled_inputs_rank_among_the_first_two(tmp_path):
    report = run_document(tmp_path, "dense", {"name": "sgd", "learning_rate": 0.01}, {"scale": 1e37})
    assert report.first_nonfinite.step == 0
    assert "normalize-inputs" in ids(report)[:2]


def test_weight_constraint_fires_when_a_loss_rewards_ever_larger_weights(tmp_path):
    loss = f"{SPECS / 'phase_models.py'}:reward_large_outputs"
    report = run_document(tmp_path, "dense", {"name": "sgd", "learning_rate": 0.5}, steps=40, loss=loss)
    assert report.first_nonfinite is None and report.status == "warning"
    assert "weight-constraint" in ids(report)[:2]
    quiet = run_document(tmp_path, "dense", {"name": "sgd", "learning_rate": 0.01}, steps=40)
    assert "weight-constraint" not in ids(quiet)


def test_bounded_activation_ranks_in_the_first_two_when_relu_outputs_grow_geometrically(tmp_path):
    # Each batch is twice the size of the last and the weights hardly move (lr 1e-12): the relu layer's
    # outputs double every step. The loss grows too, but not because of the learning rate.
    report = run_document(tmp_path, "dense", {"name": "sgd", "learning_rate": 1e-12},
                          {"rows": 320, "growth": 2.0}, steps=20)
    assert report.first_nonfinite is None and "bounded-activation" in ids(report)[:2]
    assert "lower-learning-rate" not in ids(report)
    quiet = run_document(tmp_path, "dense", {"name": "sgd", "learning_rate": 0.01}, {"rows": 320}, steps=20)
    assert "bounded-activation" not in ids(quiet)
