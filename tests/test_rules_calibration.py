"""Calibrated severity, on minimal runs at their thresholds.

- The update ratio is judged against the optimizer: above 1e-2 for SGD-like steps, above 2e-2 for the
  adaptive ones (Adam's normal band is 1e-3 to 1e-2 at its default rate).
- A trajectory finding (lower-learning-rate, clip-gradients, bounded-activation, weight-constraint) is at most a
  warning when another finding at error level names the producer of the first non-finite value.
- bounded-activation advises relu6 only for a relu-like layer, on a recurrent layer in its own class.

The thresholds are written out, not imported: a changed constant fails a test here.
"""

import math

import pytest

from boundary_runs import fired, first_at, report_of, step, up32
from nanscope.rules.evidence import RunEvidence
from nanscope.runtime import tensorflow

EXP = {"op": "Exp", "operand": "input", "dtype": "float32", "min": -3.0, "max": 200.0, "zero_fraction": 0.0,
       "negative_fraction": 0.5}


def ratio_run(ratio, optimizer, failed=False, inputs=None):
    records = [step(s, update_ratio=r) for s, r in enumerate([0.5, ratio, ratio])]
    if failed:
        records.append(step(3, loss=math.inf, loss_nonfinite=True))
    first = None
    if failed:
        first = first_at(3, "forward", layer="hidden", layer_class="Dense", op=(inputs or {}).get("op", "MatMul"),
                         inputs=dict(inputs) if inputs else None, source="model.py:3")
    report = report_of(records, first)
    if optimizer:
        report.run["optimizer"] = optimizer
    return report


UPDATE_RATIOS = [
    pytest.param(0.02, "Adam", False, id="adam-at-2e-2"),  # float32(0.02) is just below 0.02
    pytest.param(up32(0.02), "Adam", True, id="adam-above-2e-2"),
    pytest.param(0.010, "Adam", False, id="adam-0.010-normal"),
    pytest.param(0.017, "Adam", False, id="adam-0.017-normal"),
    pytest.param(up32(0.02), "RMSprop", True, id="rmsprop-above-2e-2"),
    pytest.param(0.017, "SGD", True, id="sgd-0.017"),
    pytest.param(0.01, "SGD", False, id="sgd-at-1e-2"),
    pytest.param(up32(0.01), None, True, id="unknown-optimizer-above-1e-2"),
]


@pytest.mark.parametrize("ratio, optimizer, fires", UPDATE_RATIOS)
def test_the_update_ratio_limit_follows_the_optimizer(ratio, optimizer, fires):
    rec = fired(ratio_run(ratio, optimizer)).get("lower-learning-rate")
    assert (rec is not None) == fires
    if fires:
        limit = "0.02" if optimizer in ("Adam", "RMSprop") else "0.01"
        assert rec.evidence[0].endswith(f"limit {limit})"), rec.evidence


def test_adam_at_ten_times_its_rate_is_a_warning_behind_the_exp_that_overflowed():
    # The float16 Exp output: Adam at 1e-2 measured 0.0236 and was an error; above 2e-2 it is a finding,
    # but the Exp names the producer, and a lower rate only delays it (tests/test_verify.py).
    found = fired(ratio_run(0.0236, "Adam", failed=True, inputs=EXP))
    assert found["lower-learning-rate"].severity == "warning"
    assert found["lower-learning-rate"].data["secondary_to"] == "stable-exp"


def test_large_updates_explain_a_failure_no_op_rule_names():
    rec = fired(ratio_run(0.05, "SGD", failed=True))["lower-learning-rate"]
    assert rec.severity == "error" and "secondary_to" not in rec.data


def test_large_updates_are_secondary_to_the_op_that_overflowed():
    found = fired(ratio_run(0.05, "SGD", failed=True, inputs=EXP))
    assert found["stable-exp"].severity == "error"
    rec = found["lower-learning-rate"]
    assert rec.severity == "warning" and rec.data["secondary_to"] == "stable-exp"
    assert rec.evidence[-1].startswith("secondary, so a warning: stable-exp names what produced")


def growing_layer_model(head_dtype, activation):
    _, keras = tensorflow()
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu", name="hidden"),
                             keras.layers.Dense(2, activation=activation, dtype=head_dtype, name="head")])


@pytest.mark.parametrize("dtype, activation, fix", [
    ("float32", "relu", "keras.layers.Dense(units, activation='relu6')"),
    ("float32", "exponential", "keras.layers.LayerNormalization()  # after layer head"),
    ("mixed_float16", "exponential", "keras.layers.Dense(..., dtype='float32')  # layer head"),
])
def test_bounded_activation_advises_relu6_only_for_a_relu_layer(dtype, activation, fix):
    # The head's outputs grow 1e4x a step for 6 steps to 1e20, past float32's warning bound (1.8e19), then the run
    # fails at a float16 MatMul overflow in the forward pass: float32-layer names that producer, relu6 would not
    # stop it.
    peaks = [10.0 ** (4 * s) for s in range(6)]
    records = [step(s, layer_max=(1.0, p)) for s, p in enumerate(peaks)]
    records.append(step(6, loss=math.inf, loss_nonfinite=True))
    overflow = {"op": "MatMul", "operand": "input", "dtype": "float16", "min": -3.0, "max": 3.0,
                "zero_fraction": 0.0, "negative_fraction": 0.5}
    report = report_of(records, first_at(6, "forward", layer="head", layer_class="Dense", op="MatMul",
                                         inputs=overflow, source="model.py:3"), dtype="float16")
    evidence = RunEvidence(keras_model=growing_layer_model(dtype, activation))
    found = fired(report, evidence)
    rec = found["bounded-activation"]
    assert rec.fix.startswith(fix), rec.fix
    assert rec.data["relu"] is (activation == "relu")
    assert found["float32-layer"].severity == "error" and "loss-scaling" not in found
    assert rec.severity == "warning" and rec.data["secondary_to"] == "float32-layer"


def test_bounded_activation_advises_relu6_in_a_recurrent_layers_own_class():
    # A relu SimpleRNN's state growing 1e4x a step for 6 steps to 1e20 (an IRNN): the fix names the SimpleRNN, and
    # not a LayerNormalization after it, which cannot bound the state it carries.
    _, keras = tensorflow()
    model = keras.Sequential([keras.Input((5, 3)), keras.layers.Dense(4, name="hidden"),
                              keras.layers.SimpleRNN(2, activation="relu", name="head")])
    report = report_of([step(s, layer_max=(1.0, 10.0 ** (4 * s))) for s in range(6)])
    report.layers = [("hidden", "Dense"), ("head", "SimpleRNN")]
    rec = fired(report, RunEvidence(keras_model=model))["bounded-activation"]
    assert rec.severity == "warning" and rec.data["relu"] is True
    assert rec.fix == ("keras.layers.SimpleRNN(units, activation='relu6')  # layer head; or tanh, Keras' default for "
                       "a recurrent layer")
