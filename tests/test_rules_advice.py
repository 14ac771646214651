"""What the op rules advise, where it used to be wrong (#22): each case is a first non-finite value with a known op,
phase and operand, and the fix or evidence the rule must give for it."""

import math

import pytest

from boundary_runs import fired, first_at, report_of, step

CRASH = [step(0, loss=math.inf, loss_nonfinite=True)]


def producer(op, phase="forward", dtype="float32", context=None, **measured):
    inputs = {"op": op, "dtype": dtype, "min": 0.0, "max": 4.0, "zero_fraction": 0.25, "negative_fraction": 0.0,
              **measured}
    return first_at(0, phase, layer="hidden", layer_class="Dense", op=op, inputs=inputs, source="model.py:3",
                    context=context or {})


@pytest.mark.parametrize("op, call, guard", [("Rsqrt", "tf.math.rsqrt", "x > 0"), ("Log", "tf.math.log", "x > 0"),
                                             ("Reciprocal", "tf.math.reciprocal", "x != 0")])
def test_the_double_where_of_an_op_of_one_operand_guards_that_op(op, call, guard):
    # Rsqrt is a division-like op for safe-division, but inside a tf.where it has one operand: the snippet is its
    # own call with the operand made safe, not `total / count` (the old "Rsqrt" entry was never reached).
    first = producer(op, "backward", context={"discarded_by": {"op": "SelectV2", "source": "model.py:9"}})
    rec = fired(report_of(CRASH, first))["double-where"]
    assert rec.fix.endswith(f"safe = tf.where({guard}, x, 1.0)  # make the input safe inside the branch first\n"
                            f"y = tf.where({guard}, {call}(safe), 0.0)"), rec.fix
    assert "count" not in rec.fix


def test_the_double_where_of_a_division_makes_its_denominator_safe():
    first = producer("RealDiv", "backward", context={"discarded_by": {"op": "SelectV2"}})
    assert fired(report_of(CRASH, first))["double-where"].fix.endswith(
        "safe = tf.where(count > 0, count, 1.0)  # make the input safe inside the branch first\n"
        "mean = tf.where(count > 0, total / safe, 0.0)")


@pytest.mark.parametrize("phase, domain", [
    ("forward", "domain x > 0 for a non-integer exponent; x != 0 for a negative one"),
    ("backward", "domain x > 0 for an exponent below 1 (y * x^(y-1) is infinite at x = 0)"),
])
def test_safe_pow_cites_the_domain_of_the_pass_it_failed_in(phase, domain):
    # A base of 1-4 with no zeros is inside both domains: the rule names the domain it checked, the gradient's on
    # the backward pass (it cited the forward one there before).
    first = producer("Pow", phase, min=1.0, zero_fraction=0.0, exponent_min=0.5, exponent_max=0.5)
    (line,) = fired(report_of(CRASH, first))["safe-pow"].evidence
    assert line.endswith(f"({domain})"), line
    assert ("(gradient of Pow)" in line) == (phase == "backward")


@pytest.mark.parametrize("phase, loss, first_line", [
    ("loss", None, "keep = tf.not_equal(b, 0.0)  # leave the zero denominators out of the mean"),
    ("backward", "the loss", "keep = tf.not_equal(b, 0.0)  # leave the zero denominators out of the mean"),
    ("forward", None, "keep = tf.not_equal(b, 0.0)"),
])
def test_safe_division_leaves_zero_denominators_out_instead_of_adding_an_epsilon(phase, loss, first_line):
    first = producer("RealDiv", phase)
    first.loss = loss
    fix = fired(report_of(CRASH, first))["safe-division"].fix
    lines = fix.splitlines()
    assert lines[:2] == ["# model.py:3: change this line", first_line]
    assert lines[2].startswith("ratio = tf.where(keep, a / tf.where(keep, b, 1.0), 0.0)")
    # The mean over the kept rows is the code to run in a loss; a layer passes the ratio on (0 where b is 0).
    assert lines[3].startswith("mean = " if first_line.endswith("of the mean") else "# in a mean over ratios")
    assert "1e-7" not in fix and "unit)" not in fix


def test_a_product_in_log_space_keeps_the_products_shape():
    fix = fired(report_of(CRASH, producer("Prod", max=3e38, zero_fraction=0.0)))["guard-op"].fix
    assert "tf.reduce_sum(tf.math.log(x), axis=-1, keepdims=True)" in fix
