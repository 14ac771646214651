"""Ops outside every layer: a producer inside the loss is the loss's, not the last layer's before it.

The expectations come from plain TensorFlow: the loss is evaluated on the failing batch
under a GradientTape, to see which of its ops' gradient is non-finite and that the layer
before it computes finite values and finite gradients of its own.
"""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import json
import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from typer.testing import CliRunner

from nanscope.cli import app
from nanscope.spec.load import load_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

SPECS = Path(__file__).parent / "specs"
sys.path.insert(0, str(SPECS))
import loss_ops  # noqa: E402  (the specs' own model and loss file)

BATCH = 16


def trace(name, tmp_path):
    return run_trace(load_spec(SPECS / f"{name}.yaml"), TraceOptions(trace_path=tmp_path / "t.jsonl"))


def tagged_line(tag):
    lines = (SPECS / "loss_ops.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if f"# {tag}" in line)


def test_the_norm_in_a_loss_file_is_blamed_on_the_loss_not_the_projection(tmp_path):
    x, y = (tf.constant(a[:BATCH]) for a in loss_ops.matched_rows())
    keras.utils.set_random_seed(1)
    model = loss_ops.projection()
    with tf.GradientTape(persistent=True) as tape:
        y_pred = model(x)
        squares = tf.reduce_sum(tf.square(y_pred - y), axis=-1)
        tape.watch(squares)
        loss = tf.reduce_mean(tf.sqrt(squares))
    # Plain TF: the projection and the loss are finite, the Sqrt's gradient is not, and the
    # projection's own gradient for a finite upstream gradient is finite.
    assert np.isfinite(y_pred.numpy()).all() and np.isfinite(loss.numpy())
    assert not np.isfinite(tape.gradient(loss, squares).numpy()).all()
    assert np.isfinite(tape.gradient(y_pred, model.trainable_variables[0]).numpy()).all()

    report = trace("loss-norm-gradient", tmp_path)
    first = report.first_nonfinite
    assert (first.phase, first.op, first.inputs["op"]) == ("backward", "SqrtGrad", "Sqrt")
    assert first.layer is None and first.layer_class is None
    assert first.loss == "distance_loss"
    assert first.source == f"tests/specs/loss_ops.py:{tagged_line('producer: norm')}"
    top = report.recommendations[0]
    assert top.id == "safe-sqrt" and "loss distance_loss" in top.evidence[0] and "projection" not in top.evidence[0]


def test_a_keras_loss_op_names_the_loss_and_its_line_in_keras(tmp_path):
    x, y = (tf.constant(a[:BATCH]) for a in loss_ops.matched_rows())
    keras.utils.set_random_seed(1)
    y_pred = loss_ops.projection(scale=1.0e19)(x)
    assert np.isfinite(y_pred.numpy()).all()  # the layer's output is finite...
    assert not np.isfinite(tf.square(y_pred - y).numpy()).all()  # ...its square in the MSE is not

    report = trace("loss-keras-overflow", tmp_path)
    first = report.first_nonfinite
    assert (first.phase, first.op, first.layer, first.loss) == ("loss", "Square", None, "mean_squared_error")
    path, line = first.source.rsplit(":", 1)
    assert path == "keras/src/losses/losses.py"
    assert "square" in (Path(keras.__file__).parent / "src" / "losses" / "losses.py").read_text().splitlines()[
        int(line) - 1]


def test_the_report_and_json_show_the_loss(tmp_path):
    out = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["trace-steps", str(SPECS / "loss-norm-gradient.yaml"), "--json", str(out),
                                      "--trace", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 1
    first = json.loads(out.read_text())["first_nonfinite"]
    assert first["loss"] == "distance_loss" and first["layer"] is None
    assert "distance_loss" in result.output
