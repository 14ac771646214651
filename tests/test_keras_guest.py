"""NanScope as a guest in the user's fit: every model kind, internal failures, mixed precision, forensics."""

import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest

from nanscope.keras import NanScope
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
ROWS, BATCH = 64, 16
STEPS = ROWS // BATCH


def data(scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, 8)).astype(np.float32)
    return x, (x @ rng.standard_normal((8, 1)) * scale).astype(np.float32)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="relu", name="hidden")
        self.out = keras.layers.Dense(1, name="out")

    def call(self, x):
        return self.out(self.hidden(x))


class OwnStep(keras.Model):
    """A model with its own train_step (plain tape, apply_gradients)."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1, name="dense")

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def two_in_two_out():
    a, b = keras.Input((8,), name="a"), keras.Input((4,), name="b")
    h = keras.layers.Dense(8, activation="relu", name="mix")(keras.layers.Concatenate()([a, b]))
    return keras.Model([a, b], [keras.layers.Dense(1, name="p")(h), keras.layers.Dense(1, name="q")(h)])


def fit(model, x, y, scope, epochs=1, **kwargs):
    keras.utils.set_random_seed(0)
    return model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=[scope], **kwargs)


@pytest.mark.parametrize("kind", ["subclassed", "sequential-no-input", "own-train-step"])
def test_unbuilt_models_are_built_from_the_first_batch_and_every_step_is_recorded(kind):
    keras.utils.set_random_seed(0)
    model = {"subclassed": Subclassed, "own-train-step": OwnStep,
             "sequential-no-input": lambda: keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(1)])}[kind]()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    assert not model.built
    scope = NanScope(verbose=0)
    x, y = data()
    fit(model, x, y, scope, epochs=2)
    report = scope.report
    assert [r.step for r in report.records] == list(range(2 * STEPS))
    assert report.run["parameters"] == model.count_params() > 0
    assert report.run["batch_size"] == BATCH
    assert all(r.grad_global_norm > 0 and r.phase is None for r in report.records)
    assert len(report.variables) == len(model.trainable_variables) and report.layers
    assert "train_step" not in model.__dict__


def test_functional_model_with_two_inputs_and_two_outputs():
    keras.utils.set_random_seed(0)
    model = two_in_two_out()
    model.compile(optimizer="sgd", loss={"p": "mse", "q": "mae"})
    x, y = data()
    inputs = {"a": x, "b": x[:, :4]}
    scope = NanScope(verbose=0)
    fit(model, inputs, {"p": y, "q": -y}, scope)
    report = scope.report
    assert report.steps_run == STEPS and report.first_nonfinite is None
    assert [o["name"] for o in report.run["outputs"]] == ["p", "q"] and len(report.records[0].outputs) == 2


@pytest.mark.parametrize("where", ["traced step", "layer probe", "host"])
def test_a_failure_of_nanscope_itself_leaves_fit_running(monkeypatch, caplog, where):
    from nanscope.engine.probes import LayerRecorder
    from nanscope.keras.capture import StepCapture
    from nanscope.keras.rows import RowBuffer

    def broken(*args, **kwargs):
        raise RuntimeError("forced failure inside nanscope")

    owner, method = {"traced step": (StepCapture, "values"), "layer probe": (LayerRecorder, "begin"),
                     "host": (RowBuffer, "record")}[where]
    monkeypatch.setattr(owner, method, broken)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = data()
    scope = NanScope(verbose=0)
    with caplog.at_level(logging.WARNING, logger="nanscope"):
        history = fit(model, x, y, scope, epochs=3)
    assert len(history.history["loss"]) == 3 and np.isfinite(history.history["loss"]).all()
    warnings = [r for r in caplog.records if r.name == "nanscope"]
    assert len(warnings) == 1 and "forced failure inside nanscope" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()
    assert any("forced failure inside nanscope" in note and "training went on" in note for note in scope.report.notes)
    assert "train_step" not in model.__dict__


def test_sqrt_in_a_loss_file_is_named_with_its_line(tmp_path, monkeypatch):
    module = tmp_path / "my_losses.py"
    module.write_text("import tensorflow as tf\n\n\ndef root_loss(y, p):\n"
                      "    return tf.reduce_mean(tf.sqrt(p - y))  # negative for some rows: NaN\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from my_losses import root_loss

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, name="out")])
    model.compile(optimizer="sgd", loss=root_loss)
    x, y = data()
    scope = NanScope(verbose=0)
    fit(model, x, y, scope, epochs=2)
    first = scope.report.first_nonfinite
    assert (first.step, first.phase, first.op) == (0, "loss", "Sqrt")
    assert first.source.endswith("my_losses.py:5")
    assert first.inputs["negative_fraction"] > 0
    assert scope.report.recommendations[0].id == "safe-sqrt"
    assert scope.report.steps_run == 1


class Exp(keras.layers.Layer):
    def call(self, x):
        return tf.exp(x)


def mixed_model():
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="proj"), Exp(name="exp"),
                                  keras.layers.Dense(1, name="out", dtype="float32")])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
    return model


def test_mixed_float16_skipped_updates_are_not_the_failure():
    x, y = data(scale=20.0)
    x, y = np.concatenate([x, x]), np.concatenate([y, y])
    x[4 * BATCH + 3] *= 40.0  # a row of step 4 drives exp past float16's range
    scope = NanScope(verbose=0)
    model = mixed_model()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[scope])
    report = scope.report
    first_step = report.records[0]
    assert first_step.update_skipped and first_step.phase is None
    assert (first_step.loss_scale_before, first_step.loss_scale) == (32768.0, 16384.0)
    first = report.first_nonfinite
    assert (first.step, first.phase, first.layer, first.op) == (4, "forward", "exp", "Exp")
    assert report.run["loss_scaling"] is True and report.run["layer_dtypes"]["exp"] == "float16"
    ids = [r.id for r in report.recommendations]
    assert "loss-scaling" not in ids and "float32-layer" in ids
    assert "tf.exp(tf.minimum(x, 11.0))" in next(r for r in report.recommendations if r.id == "stable-exp").fix


def test_steps_per_execution_replays_the_failing_step_of_an_execution():
    x, y = data()
    x[2 * BATCH + 1, 0] = np.nan  # step 2, the first of the second execution ... then step 3 is poisoned too
    x[1 * BATCH + 5, 3] = np.inf  # step 1: the second step of the first execution
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
    scope = NanScope(verbose=0)
    fit(model, x, y, scope)
    first = scope.report.first_nonfinite
    assert (first.step, first.phase) == (1, "data")
    assert first.detail == ["x: 1 non-finite value(s) in feature(s) x[3]; rows within the batch 5"]
    assert scope.report.recommendations[0].id == "clean-input-data"


def test_forensics_off_keeps_no_copy_and_names_no_op():
    x, y = data()
    x[BATCH + 2] = 1e30  # the loss overflows at step 1
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="a"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    scope = NanScope(verbose=0, forensics=False)
    fit(model, x, y, scope)
    first = scope.report.first_nonfinite
    assert first is not None and first.op is None
    assert any(note.startswith("forensics=False") for note in scope.report.notes)


def test_data_scale_rules_fire_from_fit_with_the_features_named():
    x, y = data(scale=300.0)
    x[:, 2] = x[:, 2] * 50.0 + 400.0  # feature 2 far from unit scale
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(1e-6), loss="mse")
    scope = NanScope(verbose=0)
    fit(model, x, y, scope, epochs=2)
    found = {rec.id: rec for rec in scope.report.recommendations}
    assert found["normalize-inputs"].data["features"] == [2]
    reference = x[:, 2].astype(np.float64)
    assert f"x[2] (std {reference.std():.3g})" in found["normalize-inputs"].evidence[0]
    assert found["normalize-targets"].data["y_std"] == pytest.approx(float(y.astype(np.float64).std()), rel=1e-3)
