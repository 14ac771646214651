"""Thresholds of the rules that read the producing op and the layers: exp's overflow bound per dtype, the
optimizer update, the masked softmax, and bounded-activation's dtype bounds and ReLU growth.

The bounds are numpy's: exp overflows past log(finfo(dtype).max); a float32 layer output warns
past sqrt(finfo(float32).max) (its square overflows), a float16 one past finfo(float16).max / 100.
"""

import math

import keras
import numpy as np
import pytest

from boundary_runs import down, fired, first_at, report_of, step, up
from nanscope.rules.evidence import RunEvidence

EXP_BOUND = {dtype: math.log(float(np.finfo(dtype).max)) for dtype in ("float16", "float32", "float64")}


def producer(op, dtype, peak, phase="forward"):
    inputs = {"op": op, "dtype": dtype, "min": 0.0, "max": peak, "zero_fraction": 0.0, "negative_fraction": 0.0}
    return first_at(0, phase, layer="hidden", layer_class="Dense", op=op, inputs=inputs, source="model.py:3")


@pytest.mark.parametrize("dtype, bound", [
    ("float16", EXP_BOUND["float16"]), ("float32", EXP_BOUND["float32"]), ("float64", EXP_BOUND["float64"]),
    ("bfloat16", EXP_BOUND["float32"]),  # bfloat16 has float32's exponent range
    ("int8", EXP_BOUND["float32"]),  # a dtype the rule does not know: float32's
])
@pytest.mark.parametrize("where, fires", [(down, False), (lambda b: b, False), (up, True)])
def test_stable_exp_fires_past_log_of_the_dtype_max(dtype, bound, where, fires):
    report = report_of([step(0, loss=math.inf, loss_nonfinite=True)], producer("Exp", dtype, where(bound)))
    rec = fired(report).get("stable-exp")
    assert (rec is not None) == fires
    if fires:
        assert rec.data["max"] == where(bound) and rec.data["step"] == 0 and rec.data["layer"] == "hidden"


@pytest.mark.parametrize("op, rule", [("Log", "stable-log"), ("Xlogy", "avoid-poles"), ("RealDiv", "safe-division"),
                                      ("Rsqrt", "safe-division"), ("Sqrt", "safe-sqrt"), ("MatMul", None)])
@pytest.mark.parametrize("phase", ["forward", "loss", "backward"])
def test_the_producing_op_names_the_rule_in_every_phase_after_the_data(op, rule, phase):
    report = report_of([step(0, loss=math.inf, loss_nonfinite=True)], producer(op, "float32", 1.0, phase))
    found = set(fired(report)) & {"stable-log", "avoid-poles", "safe-division", "safe-sqrt", "stable-exp",
                                  "optimizer-epsilon"}
    assert found == ({rule} if rule else set())
    data_phase = report_of([step(0, loss=math.inf, loss_nonfinite=True)], producer(op, "float32", 1.0, "data"))
    assert not set(fired(data_phase)) & {"stable-log", "safe-division", "safe-sqrt"}


def test_an_update_with_finite_gradients_is_the_optimizer_epsilon_and_with_bad_ones_the_op():
    finite = report_of([step(0, weights_nonfinite=1)], producer("Sqrt", "float32", 1.0, "update"))
    assert "optimizer-epsilon" in fired(finite) and "safe-sqrt" not in fired(finite)
    bad = report_of([step(0, weights_nonfinite=1, grad_nonfinite=1)], producer("Sqrt", "float32", 1.0, "update"))
    assert "safe-sqrt" in fired(bad) and "optimizer-epsilon" not in fired(bad)


@pytest.mark.parametrize("phase, rule", [("forward", "float32-layer"), ("loss", "float32-layer"),
                                         ("backward", "loss-scaling"), ("update", None)])
def test_a_float16_producer_asks_for_loss_scaling_for_a_gradient_and_a_float32_layer_before_one(phase, rule):
    # Without a LossScaleOptimizer: loss scaling multiplies the loss's gradients, so it can keep a float16 gradient
    # in range but not a value of the forward pass or the loss, which must be computed in float32.
    report = report_of([step(0, loss=math.inf, loss_nonfinite=True)], producer("MatMul", "float16", 1.0, phase))
    assert set(fired(report)) & {"loss-scaling", "float32-layer"} == ({rule} if rule else set())


def test_a_masked_softmax_and_a_double_where_take_the_finding_whole():
    masked = producer("Softmax", "float32", 1.0)
    masked.context = {"masked_rows": 2, "softmax_rows": 8, "batch_rows": [1, 3]}
    found = fired(report_of([step(0, loss=math.inf, loss_nonfinite=True)], masked),
                  RunEvidence(batch_rows=lambda s: np.arange(40, 48)))
    assert found["masked-softmax"].data["dataset_rows"] == [41, 43]
    assert found["masked-softmax"].data["fill"] == -1e9
    where = producer("Log", "float32", 1.0, "backward")
    where.context = {"discarded_by": {"op": "SelectV2", "source": "model.py:9"}, "forward_nonfinite": 3}
    assert "double-where" in fired(report_of([step(0, loss=math.inf, loss_nonfinite=True)], where))
    where.phase = "forward"  # a tf.where only hides a gradient: in the forward pass the op's own rule stands
    assert set(fired(report_of([step(0, loss=math.inf, loss_nonfinite=True)], where))) >= {"stable-log"}


def model(head_dtype="float32"):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(2, activation="relu", name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, name="head", dtype=head_dtype)(hidden))


FLOAT32_MODEL, FLOAT16_MODEL = model(), model("float16")
FLOAT32_BOUND = math.sqrt(float(np.finfo(np.float32).max))  # 1.8e19
FLOAT16_BOUND = float(np.finfo(np.float16).max) / 100  # 655.04


@pytest.mark.parametrize("keras_model, bound", [(FLOAT32_MODEL, FLOAT32_BOUND), (FLOAT16_MODEL, FLOAT16_BOUND)])
@pytest.mark.parametrize("where, fires", [(down, False), (lambda b: b, False), (up, True)])
def test_bounded_activation_fires_past_the_dtype_bound(keras_model, bound, where, fires):
    report = report_of([step(0, layer_max=(1.0, where(bound)))])
    rec = fired(report, RunEvidence(keras_model=keras_model)).get("bounded-activation")
    assert (rec is not None) == fires
    if fires:
        assert rec.data == {"layer": "head", "max_abs": where(bound), "limit": bound, "relu": False}


def test_bounded_activation_reads_the_healthy_steps_only():
    records = [step(0), step(1, layer_max=(1.0, 1e30), loss=math.nan, loss_nonfinite=True)]
    assert "bounded-activation" not in fired(report_of(records, first_at(1)), RunEvidence(keras_model=FLOAT32_MODEL))


def reaching(n, total):
    return [1.0 if s == 0 else total if s == n - 1 else total ** (s / (n - 1)) for s in range(n)]


# A ReLU-like layer's output growing > 1.5x a step (fitted) over >= 5 healthy steps and > 1e4x overall warns below
# the bound too; a linear layer's does not.
RELU_GROWTH = [
    pytest.param([1.49 ** s for s in range(30)], False, id="rate-1.49"),
    pytest.param([1.51 ** s for s in range(30)], True, id="rate-1.51"),
    pytest.param(reaching(5, 1e4), False, id="total-at-1e4"),
    pytest.param(reaching(5, up(1e4) * (1 + 1e-6)), True, id="total-above-1e4"),
    pytest.param([11.0 ** s for s in range(4)], False, id="4-steps"),
    pytest.param([11.0 ** s for s in range(5)], True, id="5-steps"),
]


@pytest.mark.parametrize("values, fires", RELU_GROWTH)
def test_bounded_activation_growth_of_a_relu_layer(values, fires):
    report = report_of([step(s, layer_max=(value, 1.0)) for s, value in enumerate(values)])
    rec = fired(report, RunEvidence(keras_model=FLOAT32_MODEL)).get("bounded-activation")
    assert (rec is not None) == fires
    if fires:
        assert rec.data["layer"] == "hidden" and rec.data["relu"] is True
        assert rec.evidence[-1].endswith("per step from step 0")
    linear = report_of([step(s, layer_max=(1.0, value)) for s, value in enumerate(values)])
    assert "bounded-activation" not in fired(linear, RunEvidence(keras_model=FLOAT32_MODEL))
