"""The op rules' words where the golden cases leave a choice open, each pinned by an exact value: the op the replay
measured when it is not the producer (the gradient op on the backward pass), an operand measured without its
extremes or fractions, a backward operand inside its domain, the masked softmax's rows and positions, and the fix
bounded-activation gives per dtype.

Minimal one-step reports, no training (docs/mutation.md lists what each test here was written to catch)."""

import math
from types import SimpleNamespace

import keras
import numpy as np
import pytest

from boundary_runs import fired, first_at, report_of, step, up
from nanscope.engine.limits import ACTIVATION_LIMIT
from nanscope.report.model import FirstNonfinite
from nanscope.rules import double_where, safe_division, stable_exp
from nanscope.rules.evidence import RunEvidence
from nanscope.rules.operand import where

CRASH = [step(0, loss=math.inf, loss_nonfinite=True)]
SAYS = "step 0, {phase} pass, layer hidden: "


def found(first, evidence=None):
    return fired(report_of(CRASH, first), evidence or RunEvidence())


def gradient_of(op, phase="backward", **inputs):
    """The first non-finite value in the gradient op Mul (backward) or in `op` itself, whose operand the replay
    measured as `op`'s."""
    return first_at(0, phase, layer="hidden", op="Mul" if phase == "backward" else op, source=None,
                    inputs={"op": op, **inputs})


@pytest.mark.parametrize("first, rule, words", [
    pytest.param(gradient_of("Acos", min=-0.5, max=0.5), "clamp-inverse-trig",
                 "Mul (gradient of Acos) fed input min -0.5, max 0.5, 0.0% zeros, 0.0% negative (min -0.5, max 0.5); "
                 "domain -1 < x < 1 (-1/sqrt(1-x^2)): a cosine computed from normalised vectors can round past 1, "
                 "and reaches exactly 1 when an embedding lines up with its class centre", id="acos-inside"),
    pytest.param(gradient_of("Asin", "forward"), "clamp-inverse-trig",
                 "Asin fed input min nan, max nan, 0.0% zeros, 0.0% negative (min nan, max nan); domain -1 <= x <= 1: "
                 "a cosine computed from normalised vectors can round past 1, and reaches exactly 1 when an "
                 "embedding lines up with its class centre", id="asin-unmeasured"),
    pytest.param(gradient_of("Lgamma", min=0.5, max=2.0), "avoid-poles",
                 "Mul (gradient of Lgamma) fed input min 0.5, max 2, 0.0% zeros, 0.0% negative; lgamma has a pole "
                 "(+inf) at 0 and at every negative integer (domain x not 0, -1, -2, ... (digamma))",
                 id="lgamma-backward-inside"),
    pytest.param(gradient_of("Lgamma", "forward", min=0.5, max=2.0), "avoid-poles",
                 "Lgamma fed input min 0.5, max 2, 0.0% zeros, 0.0% negative; lgamma has a pole (+inf) at 0 and at "
                 "every negative integer (domain x not 0, -1, -2, ...)", id="lgamma-forward-inside"),
    pytest.param(gradient_of("Acosh", min=1.0, max=2.0), "guard-op",
                 "Mul (gradient of Acosh) fed input min 1, max 2, 0.0% zeros, 0.0% negative; outside its gradient's "
                 "domain x > 1", id="acosh-at-1-backward"),  # the gradient's domain is open at 1, the op's is not
    pytest.param(gradient_of("Acosh", "forward", min=1.0, max=2.0), "guard-op",
                 "Acosh fed input min 1, max 2, 0.0% zeros, 0.0% negative; inside its domain as measured (x >= 1): "
                 "the result overflowed", id="acosh-at-1-forward"),
    pytest.param(gradient_of("Pow", "forward", min=2.0, max=3.0), "safe-pow",
                 "Pow fed base input min 2, max 3, 0.0% zeros, 0.0% negative; the power overflows the dtype (domain "
                 "x > 0 for a non-integer exponent; x != 0 for a negative one)", id="pow-without-fractions"),
    pytest.param(gradient_of("Pow", min=2.0, max=3.0), "safe-pow",
                 "Mul (gradient of Pow) fed base input min 2, max 3, 0.0% zeros, 0.0% negative; its gradient is not "
                 "finite (domain x > 0 for an exponent below 1 (y * x^(y-1) is infinite at x = 0))",
                 id="pow-backward-without-fractions"),
    pytest.param(gradient_of("Pow", "forward", min=2.0, max=3.0, exponent_min=0.5), "safe-pow",
                 "Pow fed base input min 2, max 3, 0.0% zeros, 0.0% negative; the power overflows the dtype (domain "
                 "x > 0 for a non-integer exponent; x != 0 for a negative one)", id="pow-half-an-exponent-range"),
])
def test_an_op_rule_names_the_measured_op_and_its_domain(first, rule, words):
    rec = found(first)[rule]
    assert rec.evidence[0] == SAYS.format(phase=first.phase) + words


def test_the_fix_of_a_gradient_op_calls_the_measured_op():
    assert found(gradient_of("Atanh", min=-1.0, max=0.5))["clamp-inverse-trig"].fix == (
        "x = tf.clip_by_value(x, -1.0 + 1e-7, 1.0 - 1e-7)\ny = tf.atanh(x)")
    assert found(gradient_of("Acosh", min=0.5, max=2.0))["guard-op"].fix == "tf.acosh(tf.maximum(x, 1.0 + 1e-6))"


FILL_LINES = ("scores = tf.where(mask, scores, -1e+09)  # a finite fill, not -inf (float32)\n"
              "weights = tf.nn.softmax(scores, axis=-1)\n"
              "weights = tf.where(tf.reduce_any(mask, axis=-1, keepdims=True), weights, 0.0)  # rows with no valid "
              "position give 0")
TURNED = ("Softmax turned 1 of 4 softmax rows into NaN: every position of those rows is masked, and a softmax over no "
          "position is 0/0")
CAUSES = "; empty sequences, padding-only rows or a causal mask that masks every key"


def masked(context, batch_rows=None, at=0, inputs=None, source="attn.py:4"):
    first = first_at(at, "forward", layer="attention", op="Softmax", source=source, context=context,
                     inputs={"op": "Softmax", "dtype": "float32"} if inputs is None else inputs)
    records = [step(s) for s in range(at)] + [step(at, loss=math.inf, loss_nonfinite=True)]
    return fired(report_of(records, first), RunEvidence(batch_rows=batch_rows))["masked-softmax"]


def test_a_masked_softmax_without_a_batch_order_names_batch_rows_and_single_axis_positions():
    rec = masked({"masked_rows": 1, "softmax_rows": 4, "batch_rows": [0, 2], "positions": [[3], [1]]})
    assert rec.evidence == [f"step 0, forward pass, layer attention, attn.py:4: {TURNED}",
                            f"fully masked in 2 batch row(s): 0, 2{CAUSES}",
                            "inside a batch row, the fully masked softmax rows are at index 3, 1 (after the batch "
                            "axis: heads, queries)"]
    assert rec.fix == "# attn.py:4: the softmax\n" + FILL_LINES
    assert "dataset_rows" not in rec.data and rec.data["batch_rows"] == [0, 2]


def test_a_masked_softmax_reads_the_dataset_rows_of_its_own_step_and_skips_rows_past_the_batch():
    # The batch of step 2 is dataset rows 20 and 21: batch row 2 is past it (a last, shorter batch).
    rec = masked({"masked_rows": 1, "softmax_rows": 4, "batch_rows": [0, 2]},
                 batch_rows=lambda s: np.arange(10 * s, 10 * s + 2), at=2)
    assert rec.evidence[1] == f"fully masked in 2 batch row(s): 0, 2 (dataset rows 20){CAUSES}"
    assert rec.data["dataset_rows"] == [20]


def test_a_masked_softmax_without_batch_rows_a_dtype_or_a_source_says_only_what_it_knows():
    rec = masked({"masked_rows": 1, "softmax_rows": 4}, batch_rows=lambda s: np.arange(4), inputs={}, source=None)
    assert rec.evidence == [f"step 0, forward pass, layer attention: {TURNED}"]
    assert rec.fix == FILL_LINES  # float32's fill where the dtype was not measured
    assert rec.data == {"step": 0, "op": "Softmax", "layer": "attention", "source": None, "masked_rows": 1,
                        "softmax_rows": 4, "batch_rows": [], "fill": -1e9, "dataset_rows": []}


def model(head_dtype):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(2, activation="relu", name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, name="head", dtype=head_dtype)(hidden))


@pytest.mark.parametrize("dtype, fix", [
    ("float16", "keras.layers.Dense(..., dtype='float32')  # layer head: compute it in float32"),
    ("bfloat16", "keras.layers.Dense(..., dtype='float32')  # layer head: compute it in float32"),
    ("float32", "keras.layers.LayerNormalization()  # after layer head: its outputs are not bounded"),
])
def test_bounded_activation_computes_a_half_precision_linear_layer_in_float32_and_normalizes_a_float32_one(dtype, fix):
    report = report_of([step(0, layer_max=(1.0, up(ACTIVATION_LIMIT[dtype])))])
    rec = fired(report, RunEvidence(keras_model=model(dtype)))["bounded-activation"]
    assert rec.fix == fix and rec.data["relu"] is False


def test_an_exp_without_a_measured_max_is_not_stable_exps():
    found_here = found(gradient_of("Exp", "forward", min=0.0))
    assert "stable-exp" not in found_here and "guard-op" in found_here


def test_where_names_only_what_a_bare_first_value_holds():
    bare = SimpleNamespace(step=3, phase="forward", layer=None, source=None)  # no loss, output or context
    assert where(bare) == "step 3, forward pass"


def test_a_double_where_without_a_forward_op_guards_a_generic_f_of_x_above_0():
    first = FirstNonfinite(step=0, phase="backward", layer="hidden", op=None, source=None,
                           context={"discarded_by": {"op": "SelectV2"}})
    rec = double_where.finding(None, first, "step 0, backward pass", {})
    assert rec.fix == ("safe = tf.where(x > 0, x, 1.0)  # make the input safe inside the branch first\n"
                       "y = tf.where(x > 0, f(safe), 0.0)")


def test_a_division_is_in_the_loss_in_the_loss_phase_or_where_the_replay_named_its_loss():
    assert safe_division.in_loss(FirstNonfinite(step=0, phase="loss")) is True
    assert safe_division.in_loss(FirstNonfinite(step=0, phase="backward", loss="mse")) is True
    assert safe_division.in_loss(FirstNonfinite(step=0, phase="backward")) is False
    snippets = safe_division.SNIPPETS
    layer = safe_division.finding(None, FirstNonfinite(step=0, phase="forward", op="RealDiv"), "step 0", {})
    assert layer.fix == snippets["layer"] != snippets["loss"]
    loss = safe_division.finding(None, FirstNonfinite(step=0, phase="backward", op="RealDiv", loss="mse"), "step 0", {})
    assert loss.fix == snippets["loss"]


def test_an_exp_of_a_dtype_without_a_clamp_is_clamped_as_float32():
    first = FirstNonfinite(step=0, phase="forward", op="Exp")
    rec = stable_exp.finding(None, first, "step 0", {"op": "Exp", "dtype": "int32", "max": 100.0})
    assert "# a clamp last: tf.exp(tf.minimum(x, 80.0))  # int32: log(max) = 88.72" in rec.fix
