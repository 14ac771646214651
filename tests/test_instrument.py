"""nanscope.instrument around a user's own compiled train step: records, the first NaN raised, a GAN, the report."""

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest

import nanscope
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
REPO = Path(__file__).parent.parent
BATCH = 16


class Log(keras.layers.Layer):
    def call(self, x):
        return tf.math.log(x)  # negative inputs: NaN


def regression(lr=0.01, log_layer=False):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((8,)), keras.layers.Dense(8, activation="relu", name="hidden")]
    layers += [Log(name="log")] if log_layer else []
    model = keras.Sequential([*layers, keras.layers.Dense(1, name="out")])
    return model, keras.optimizers.SGD(lr)


def batches(count, poison_at=None):
    rng = np.random.default_rng(0)
    for step in range(count):
        x = rng.standard_normal((BATCH, 8)).astype(np.float32)
        if step == poison_at:
            x[3, 2] = np.nan
        yield x, (x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)


def step_function(model, optimizer):
    loss_fn = keras.losses.MeanSquaredError()

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


def reference_losses(steps):
    model, optimizer = regression()
    plain = step_function(model, optimizer)
    return [float(plain(x, y)) for x, y in batches(steps)]


def test_records_every_step_and_changes_nothing_of_the_training():
    model, optimizer = regression()
    train_step = nanscope.instrument(model, optimizer, verbose=0)(step_function(model, optimizer))
    losses = [float(train_step(x, y)) for x, y in batches(6)]
    np.testing.assert_allclose(losses, reference_losses(6), rtol=1e-5)
    report = train_step.nanscope.report
    assert [r.step for r in report.records] == list(range(6))
    np.testing.assert_allclose([r.loss for r in report.records], losses, rtol=1e-5)
    assert all(r.grad_global_norm > 0 and r.phase is None for r in report.records)
    assert [name for name, _ in report.layers] == ["hidden", "out"]
    assert report.variables == ["hidden/kernel", "hidden/bias", "out/kernel", "out/bias"]
    assert report.records[0].batch_rows == BATCH
    assert "call" not in model.layers[0].__dict__ and "apply" not in optimizer.__dict__


def test_a_failure_of_nanscope_itself_leaves_the_loop_training(monkeypatch, caplog):
    from nanscope.engine.probes import LayerRecorder

    def broken(*args, **kwargs):
        raise RuntimeError("forced failure inside nanscope")

    monkeypatch.setattr(LayerRecorder, "begin", broken)
    model, optimizer = regression()
    train_step = nanscope.instrument(model, optimizer, verbose=0)(step_function(model, optimizer))
    with caplog.at_level(logging.WARNING, logger="nanscope"):
        losses = [float(train_step(x, y)) for x, y in batches(4)]
    np.testing.assert_allclose(losses, reference_losses(4), rtol=1e-5)
    warnings = [r for r in caplog.records if r.name == "nanscope"]
    assert len(warnings) == 1 and "forced failure inside nanscope" in warnings[0].getMessage()
    assert any("forced failure inside nanscope" in note for note in train_step.nanscope.notes)
    assert "call" not in model.layers[0].__dict__ and "apply" not in optimizer.__dict__


def test_the_first_nonfinite_step_is_replayed_reported_and_raised(tmp_path):
    model, optimizer = regression(log_layer=True)
    path = tmp_path / "nanscope.json"
    train_step = nanscope.instrument(model, optimizer, report=path, verbose=0)(step_function(model, optimizer))
    with pytest.raises(nanscope.NonFiniteError) as raised:
        for x, y in batches(10):
            train_step(x, y)
    report = raised.value.report
    first = report.first_nonfinite
    assert (first.step, first.phase, first.layer, first.op) == (0, "forward", "log", "Log")
    assert first.source.endswith(f"test_instrument.py:{_line_of('return tf.math.log(x)')}")
    assert first.inputs["zero_fraction"] > 0  # relu's zeros: log(0) = -inf
    message = str(raised.value)
    assert "\n" not in message and "step 0" in message and "Log" in message and "stable-log" in message
    document = json.loads(path.read_text())
    assert document["status"] == "nonfinite" and document["first_nonfinite"]["op"] == "Log"
    assert train_step.nanscope.report is report


def test_a_nan_in_the_batch_names_the_argument_and_the_row():
    model, optimizer = regression()
    train_step = nanscope.instrument(model, optimizer, verbose=0)(step_function(model, optimizer))
    with pytest.raises(nanscope.NonFiniteError):
        for x, y in batches(6, poison_at=2):
            train_step(x, y)
    first = train_step.nanscope.report.first_nonfinite
    assert (first.step, first.phase) == (2, "data")
    assert first.detail == ["argument 0: 1 non-finite value(s) in value(s) argument 0[2]; rows within the batch 3",
                            "argument 1: 1 non-finite value(s) in value(s) argument 1[0]; rows within the batch 3"]


def test_stop_on_nonfinite_false_records_and_goes_on():
    model, optimizer = regression()
    train_step = nanscope.instrument(model, optimizer, verbose=0, stop_on_nonfinite=False)(
        step_function(model, optimizer))
    for x, y in batches(5, poison_at=1):
        train_step(x, y)
    report = train_step.nanscope.report
    assert report.steps_run == 5 and report.first_nonfinite.step == 1


def _line_of(text):
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


def docs_example(title):
    """The python block that follows `title` in docs/integrations.md."""
    text = (REPO / "docs" / "integrations.md").read_text()
    at = text.index(title)
    return re.search(r"```python\n(.*?)```", text[at:], re.S).group(1)


def test_the_gan_example_of_the_docs_runs_and_records_both_models(tmp_path):
    code = docs_example("### A GAN")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads((tmp_path / "gan.json").read_text())  # written at interpreter exit
    assert document["steps_run"] == 20 and document["status"] in ("healthy", "warning")
    layers = [row["name"] for row in document["layers"]]
    assert {"g_hidden", "g_out", "d_hidden", "d_out"} <= set(layers)
    variables = [row["name"] for row in document["variables"]]
    assert any("generator" in v for v in variables) and any("discriminator" in v for v in variables)
    assert "steps: 20" in result.stdout


def test_a_gan_whose_generator_goes_nonfinite_names_it():
    keras.utils.set_random_seed(0)
    generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="g_hidden"), Log(name="g_log"),
                                  keras.layers.Dense(2, name="g_out")], name="generator")
    discriminator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d_out")], name="discriminator")
    g_opt, d_opt = keras.optimizers.SGD(0.01), keras.optimizers.SGD(0.01)

    @nanscope.instrument([generator, discriminator], [g_opt, d_opt], verbose=0)
    @tf.function
    def train_step(noise, real):
        with tf.GradientTape() as g_tape, tf.GradientTape() as d_tape:
            fake_logits = discriminator(generator(noise, training=True), training=True)
            real_logits = discriminator(real, training=True)
            d_loss = tf.reduce_mean(tf.nn.softplus(fake_logits) + tf.nn.softplus(-real_logits))
            g_loss = tf.reduce_mean(tf.nn.softplus(-fake_logits))
        d_opt.apply_gradients(zip(d_tape.gradient(d_loss, discriminator.trainable_variables),
                                  discriminator.trainable_variables))
        g_opt.apply_gradients(zip(g_tape.gradient(g_loss, generator.trainable_variables),
                                  generator.trainable_variables))
        return d_loss + g_loss, d_loss, g_loss

    rng = np.random.default_rng(0)
    with pytest.raises(nanscope.NonFiniteError):
        train_step(rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32))
    first = train_step.nanscope.report.first_nonfinite
    assert (first.step, first.phase, first.layer, first.op) == (0, "forward", "g_log", "Log")


def test_a_step_that_returns_no_loss_records_it_as_unknown_not_as_a_value(tmp_path):
    model, optimizer = regression()
    loss_fn = keras.losses.MeanSquaredError()

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    path = tmp_path / "nanscope.json"
    instrumented = nanscope.instrument(model, optimizer, report=path, verbose=0)(train_step)
    for x, y in batches(3):
        instrumented(x, y)
    report = instrumented.nanscope.finish()
    assert all(r.loss_missing and np.isnan(r.loss) and r.phase is None for r in report.records)
    assert report.first_nonfinite is None and report.status == "healthy"
    assert all(r.grad_global_norm > 0 for r in report.records)  # the rest is still measured
    assert any("returned no loss on 3 of 3 step(s)" in note for note in report.notes)
    document = json.loads(path.read_text())
    assert [(s["loss"], s["loss_missing"]) for s in document["steps"]] == [(None, True)] * 3
    from rich.console import Console

    from nanscope.render.trace_report import render_trace_report

    console = Console(width=120, record=True)
    render_trace_report(report, console)
    text = console.export_text()
    assert "unknown: the step returned no loss" in text and "none returned" in text


class SqrtAtZero(keras.layers.Layer):
    def call(self, x):
        return tf.sqrt(tf.nn.relu(x))  # finite at 0, its gradient is not


def test_without_a_returned_loss_a_nonfinite_gradient_is_still_found():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3, kernel_initializer="zeros", name="hidden"),
                              SqrtAtZero(name="sqrt"), keras.layers.Dense(1, name="out")])
    optimizer = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.MeanSquaredError()

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return {"grad_norm": tf.linalg.global_norm(grads)}  # a structure without a "loss" key

    instrumented = nanscope.instrument(model, optimizer, verbose=0)(train_step)
    with pytest.raises(nanscope.NonFiniteError):
        for x, y in batches(3):
            instrumented(x, y)
    report = instrumented.nanscope.report
    first = report.first_nonfinite
    assert (first.step, first.phase, first.layer, first.op) == (0, "backward", "sqrt", "SqrtGrad")
    assert report.records[0].loss_missing and not report.records[0].loss_nonfinite
