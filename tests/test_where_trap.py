"""double-where: a NaN gradient from an op whose forward value a tf.where threw away.

The expectations come from plain TensorFlow: the layer's computation is evaluated on
the failing batch under a GradientTape, showing a finite forward value, a non-finite
value in the discarded branch and a NaN gradient, and a finite gradient with the fix.
"""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from nanscope.spec.load import load_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

SPECS = Path(__file__).parent / "specs"
sys.path.insert(0, str(SPECS))
import where_trap  # noqa: E402  (the specs' own model file)

BATCH = 16


def trace(name, tmp_path):
    return run_trace(load_spec(SPECS / f"{name}.yaml"), TraceOptions(trace_path=tmp_path / "t.jsonl"))


def tagged_line(tag):
    lines = (SPECS / "where_trap.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if f"# {tag}" in line)


def branch_gradient(variant, h):
    """Plain TF: (forward output, the discarded branch's value, gradient wrt h) of the PositiveMean layer."""
    h = tf.constant(h)
    with tf.GradientTape() as tape:
        tape.watch(h)
        positive = tf.cast(h > 0, h.dtype)
        total = tf.reduce_sum(h * positive, axis=-1, keepdims=True)
        count = tf.reduce_sum(positive, axis=-1, keepdims=True)
        branch = total / count if variant == "divide" else tf.math.log(total)
        out = tf.where((count if variant == "divide" else total) > 0, branch, 0.0)
    return out.numpy(), branch.numpy(), tape.gradient(out, h).numpy()


@pytest.mark.parametrize("variant,forward_op", [("divide", "RealDiv"), ("log", "Log")])
def test_the_gradient_of_a_discarded_branch_is_the_double_where_trap(variant, forward_op, tmp_path):
    x, _ = where_trap.rows_with_empty_groups()
    h = where_trap.trap_model(variant).get_layer("hidden")(x[:BATCH]).numpy()  # the pooled layer's input at step 0
    out, branch, grad = branch_gradient(variant, h)
    assert np.isfinite(out).all() and np.isnan(grad).any()
    discarded = np.flatnonzero(~np.isfinite(branch).ravel())
    assert discarded.tolist() == [r for r in where_trap.EMPTY_ROWS if r < BATCH]

    report = trace(f"where-trap-{variant}", tmp_path)
    first = report.first_nonfinite
    assert (first.step, first.phase, first.layer_class, first.inputs["op"]) == (0, "backward", "PositiveMean",
                                                                                forward_op)
    assert first.source.endswith(f"where_trap.py:{tagged_line(f'producer: {variant}')}")
    where = first.context["discarded_by"]
    assert where["op"] == "SelectV2" and where["source"].endswith(f"where_trap.py:{tagged_line(f'where: {variant}')}")
    assert first.context["forward_nonfinite"] == len(discarded) and "reached_loss" not in first.context
    assert f"threw away the forward value of {forward_op} ({len(discarded)} non-finite)" in " ".join(first.detail)
    top = report.recommendations[0]
    assert (top.id, top.severity) == ("double-where", "error")
    assert "thrown away by a tf.where" in top.evidence[0] and "tf.where(" in top.fix and "safe" in top.fix


def test_the_double_where_fix_has_a_finite_gradient_and_stays_healthy(tmp_path):
    h = np.zeros((4, 6), "float32")
    h[:2] = 1.0
    with tf.GradientTape() as tape:
        hv = tf.constant(h)
        tape.watch(hv)
        count = tf.reduce_sum(tf.cast(hv > 0, hv.dtype), axis=-1, keepdims=True)
        safe = tf.where(count > 0, count, 1.0)
        out = tf.where(count > 0, tf.reduce_sum(hv, axis=-1, keepdims=True) / safe, 0.0)
    assert np.isfinite(tape.gradient(out, hv).numpy()).all()
    report = trace("where-trap-double", tmp_path)
    assert report.first_nonfinite is None
    assert "double-where" not in [r.id for r in report.recommendations]


def test_a_plain_zero_denominator_stays_safe_division(tmp_path):
    """RatioFeatures divides by a relu output with no tf.where: the forward value is not discarded."""
    report = trace("division-by-zero", tmp_path)
    assert report.first_nonfinite.context.get("discarded_by") is None
    assert report.recommendations[0].id == "safe-division"


def test_a_float16_overflow_that_reaches_the_loss_is_not_said_to_be_thrown_away(tmp_path):
    """A float16 Dense overflows and its inf reaches the BCE loss (NaN), though a tf.where inside Keras'
    binary cross-entropy dropped the copies it was given: the detail line says it reached the loss."""
    from nanscope.spec.load import parse_spec

    spec = parse_spec({
        "model": {"factory": f"{SPECS / 'precision_models.py'}:sigmoid_classifier"},
        "data": {"factory": f"{SPECS / 'data_factories.py'}:arrays", "batch_size": 16, "shuffle": False,
                 "args": {"scale": 1e5, "target_scale": 0.0}},
        "train": {"loss": "binary_crossentropy", "optimizer": {"name": "sgd", "learning_rate": 0.01}, "steps": 1,
                  "seed": 0, "mixed_precision": "mixed_float16"},
    }, source=str(tmp_path / "spec.yaml"))
    report = run_trace(spec, TraceOptions(trace_path=tmp_path / "t.jsonl"))
    first = report.first_nonfinite
    assert (first.step, first.phase, first.layer) == (0, "forward", "hidden")
    assert not np.isfinite(report.records[0].loss)
    assert first.context["reached_loss"] is True and first.context["discarded_by"]["op"] == "Select"
    detail = " ".join(first.detail)
    assert "threw away" not in detail
    assert f"the non-finite values of {first.op} reached the loss; a tf.where (Select" in detail
