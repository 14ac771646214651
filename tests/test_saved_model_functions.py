"""Inside SavedModel functions: the op that made the value is named inside the restored function's graph.

The expectation comes from plain TensorFlow: the same Keras model, before export, is
run layer by layer on the failing batch to see which op makes the first NaN and how
many of its denominators are 0.
"""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

from nanscope.spec.load import parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

SPECS = Path(__file__).parent / "specs"
sys.path.insert(0, str(SPECS))
import models  # noqa: E402  (the specs' model file: RatioFeatures divides by a relu output)
import saved_functions  # noqa: E402

BATCH = 16


def exported(factory, tmp_path):
    return saved_functions.export(tmp_path / "saved", factory)


def trace_saved(tmp_path):
    spec = parse_spec({"model": {"path": "saved"},
                       "data": {"factory": f"{SPECS / 'models.py'}:wide_data", "batch_size": BATCH, "shuffle": False},
                       "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.001}, "steps": 2}},
                      source=str(tmp_path / "run.yaml"))
    return run_trace(spec, TraceOptions(trace_path=tmp_path / "t.jsonl"))


def test_a_restored_functions_inner_division_is_named_with_its_inputs(tmp_path):
    model = exported("ratio_model", tmp_path)
    x = models.wide_data()[0][:BATCH]
    hidden = model.layers[0](x).numpy()
    ratio_graph = tf.function(lambda h: h / h[:, :1]).get_concrete_function(tf.TensorSpec([None, 4])).graph
    expected_op = next(op.type for op in ratio_graph.get_operations() if op.type in ("RealDiv", "Div"))
    with np.errstate(divide="ignore", invalid="ignore"):
        assert np.isfinite(hidden).all() and not np.isfinite(hidden / hidden[:, :1]).all()

    report = trace_saved(tmp_path)
    first = report.first_nonfinite
    assert (first.step, first.phase, first.op) == (0, "forward", expected_op)
    function = first.context["function"]
    assert function["call"].startswith("__forward_restored_function_body_")
    assert "ratio_features" in function["node"] and len(function["inputs"]) == 2
    assert first.inputs["operand"] == "denominator"
    assert first.inputs["zero_fraction"] == np.mean(hidden[:, :1] == 0)
    top = report.recommendations[0]
    assert top.id == "safe-division" and function["node"] in top.evidence[0]


def test_a_nan_gradient_inside_the_restored_backward_function_names_the_gradient_op(tmp_path):
    model = exported("root_model", tmp_path)
    x = tf.constant(models.wide_data()[0][:BATCH])
    relu = model.layers[0](x)
    with tf.GradientTape() as tape:
        tape.watch(relu)
        root = tf.sqrt(relu)
    assert np.isfinite(root.numpy()).all() and not np.isfinite(tape.gradient(root, relu).numpy()).all()

    report = trace_saved(tmp_path)
    first = report.first_nonfinite
    assert (first.phase, first.op, first.inputs["op"]) == ("backward", "SqrtGrad", "Sqrt")
    function = first.context["function"]
    assert "backward" in function["call"] and "root_features" in function["node"]
    assert first.inputs["zero_fraction"] == np.mean(relu.numpy() == 0)
    assert report.recommendations[0].id == "safe-sqrt"
