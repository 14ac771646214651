"""Learning-rate schedules through every entry point: the report records the schedule and the rate in effect.

A schedule's rate at step N is the schedule evaluated at optimizer iteration N; the tests
compute it with numpy from the schedule's formula. Each run puts a NaN in the batch of a
known step (no shuffling), so the step the report is about is known exactly.
"""

import json
import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

import nanscope
from nanscope.cli import app
from nanscope.keras import NanScope
from nanscope.model.learning_rate import lowered_learning_rate_fix, scaled_schedule
from nanscope.report.redraw import load_trace
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
BATCH, NAN_STEP = 16, 5
DECAY = {"initial_learning_rate": 0.01, "decay_steps": 10, "decay_rate": 0.5}

DATA = '''
import numpy as np

def poisoned(rows=128, features=4, step=5, batch=16):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, features)).astype("float32")
    x[step * batch + 3, 1] = np.nan
    return x, (x[:, :1] * 0.5).astype("float32")
'''
MODEL = '''
import keras

def mlp(features=4):
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1)])

class Halving(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, rate=0.02, every=2):
        self.rate, self.every = rate, every

    def __call__(self, step):
        return self.rate * 0.5 ** keras.ops.cast(step // self.every, "float32")

    def get_config(self):
        return {"rate": self.rate, "every": self.every}
'''


def decayed(step):
    """ExponentialDecay(**DECAY) at `step`, as Keras computes it in float32."""
    return float(np.float32(0.01) * np.float32(0.5) ** (np.float32(step) / np.float32(10)))


def spec(learning_rate, steps=8):
    return {"model": {"factory": "model.py:mlp"},
            "data": {"factory": "data.py:poisoned", "batch_size": BATCH, "shuffle": False},
            "train": {"loss": "mse", "optimizer": {"name": "adam", "learning_rate": learning_rate}, "steps": steps,
                      "seed": 1}}


def trace_steps(write_spec, tmp_path, learning_rate, *options):
    path = write_spec(spec(learning_rate), files={"data.py": DATA, "model.py": MODEL})
    out = tmp_path / "report.json"
    result = CliRunner().invoke(app, ["trace-steps", str(path), "--json", str(out),
                                      "--trace", str(tmp_path / "t.jsonl"), *options])
    return result, json.loads(out.read_text()) if out.exists() else None


def test_trace_steps_records_the_schedule_and_the_rate_at_the_first_nonfinite_step(write_spec, tmp_path):
    result, doc = trace_steps(write_spec, tmp_path, {"class_name": "ExponentialDecay", "config": DECAY})
    assert result.exit_code == 1, result.output
    assert doc["first_nonfinite"]["step"] == NAN_STEP
    assert doc["run"]["learning_rate_schedule"] == {
        "class_name": "ExponentialDecay", "config": {**DECAY, "staircase": False, "name": "ExponentialDecay"},
        "first_step_learning_rate": pytest.approx(decayed(0), rel=1e-7), "step": NAN_STEP}
    assert doc["run"]["optimizer_config"]["learning_rate"] == pytest.approx(decayed(NAN_STEP), rel=1e-6)
    assert "lr schedule  ExponentialDecay: 0.01 at step 0, 0.007071 at step 5" in result.output
    assert "printed report failed" not in result.output
    # The trace's header was written when the run started; its summary carries the settled rate.
    rebuilt = load_trace(tmp_path / "t.jsonl")
    assert rebuilt.run["learning_rate_schedule"]["step"] == NAN_STEP
    assert rebuilt.run["optimizer_config"]["learning_rate"] == doc["run"]["optimizer_config"]["learning_rate"]


def test_trace_steps_takes_a_users_schedule_class_from_a_file(write_spec, tmp_path):
    result, doc = trace_steps(write_spec, tmp_path, {"class_name": "model.py:Halving", "config": {"rate": 0.02}})
    assert result.exit_code == 1, result.output
    schedule = doc["run"]["learning_rate_schedule"]
    assert (schedule["class_name"], schedule["config"], schedule["step"]) == ("Halving", {"rate": 0.02, "every": 2}, 5)
    assert doc["run"]["optimizer_config"]["learning_rate"] == pytest.approx(0.02 * 0.5 ** 2)  # step 5 // 2


@pytest.mark.parametrize(("learning_rate", "field"), [
    ({"class_name": "ExponentialDekay", "config": DECAY}, "train.optimizer.learning_rate.class_name"),
    ({"class_name": "ExponentialDecay", "config": {"initial_learning_rate": 0.01}},
     "train.optimizer.learning_rate.config"),
    ({"class_name": "ExponentialDecay", "config": DECAY, "steps": 3}, "train.optimizer.learning_rate"),
])
def test_a_bad_schedule_is_bad_input_naming_the_field(write_spec, tmp_path, learning_rate, field):
    result, doc = trace_steps(write_spec, tmp_path, learning_rate)
    assert result.exit_code == 2 and doc is None
    line = " ".join(result.stderr.split())
    assert field in line, line


def poisoned_fit_data(rows=128):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    x[NAN_STEP * BATCH + 3, 1] = np.nan
    return x, (x[:, :1] * 0.5).astype(np.float32)


def compiled_mlp(learning_rate):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="mse")
    return model


def test_the_callback_writes_the_report_with_the_schedule_and_its_rate(tmp_path):
    model = compiled_mlp(keras.optimizers.schedules.ExponentialDecay(**DECAY))
    shown = tmp_path / "shown.txt"
    with open(shown, "w") as console_file:
        scope = NanScope(report=tmp_path / "r.json", console=Console(file=console_file, width=80))
        model.fit(*poisoned_fit_data(), batch_size=BATCH, shuffle=False, epochs=1, callbacks=[scope], verbose=0)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["first_nonfinite"]["step"] == NAN_STEP
    assert doc["run"]["learning_rate_schedule"]["step"] == NAN_STEP
    assert doc["run"]["optimizer_config"]["learning_rate"] == pytest.approx(decayed(NAN_STEP), rel=1e-6)
    assert "lr schedule  ExponentialDecay: 0.01 at step 0, 0.007071 at step 5" in shown.read_text()


def test_instrument_reports_the_schedule_and_finish_never_raises_into_the_loop(tmp_path, caplog):
    model = compiled_mlp(keras.optimizers.schedules.ExponentialDecay(**DECAY))
    optimizer = model.optimizer
    loss_fn = keras.losses.MeanSquaredError()

    @nanscope.instrument(model, optimizer, report=tmp_path / "r.json", verbose=0)
    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    x, y = poisoned_fit_data()
    with pytest.raises(nanscope.NonFiniteError):  # the designed stop at the first NaN
        for step in range(8):
            train_step(x[step * BATCH:(step + 1) * BATCH], y[step * BATCH:(step + 1) * BATCH])
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["run"]["optimizer_config"]["learning_rate"] == pytest.approx(decayed(NAN_STEP), rel=1e-6)
    # A report that cannot be written (its folder is a file) is one warning, never an exception in the loop.
    train_step.nanscope.options.report = tmp_path / "r.json" / "inside.json"
    with caplog.at_level(logging.WARNING, logger="nanscope"):
        report = train_step.nanscope.finish()
    assert report is not None and report.run["learning_rate_schedule"]["step"] == NAN_STEP
    assert [r.getMessage() for r in caplog.records if "could not be built" in r.getMessage()]


def test_the_lowered_rate_scales_the_schedule_and_keeps_its_shape():
    schedule = keras.optimizers.schedules.CosineDecay(0.0, 100, warmup_target=0.1, warmup_steps=10)
    lowered = scaled_schedule(schedule, 0.1)
    assert type(lowered) is keras.optimizers.schedules.CosineDecay
    for step in (0, 5, 10, 60):
        assert float(lowered(step)) == pytest.approx(float(schedule(step)) * 0.1, rel=1e-6, abs=1e-12)
    custom = scaled_schedule(_Constant(), 0.5)
    assert float(custom(3)) == pytest.approx(0.25)
    run = {"optimizer_config": {"learning_rate": 0.05}, "learning_rate_schedule": {
        "class_name": "CosineDecay", "config": schedule.get_config(), "step": 12}}
    assert lowered_learning_rate_fix(run) == (
        "train:\n  optimizer:\n    learning_rate:   # 10x lower, the same CosineDecay\n"
        "      class_name: CosineDecay\n      config: {initial_learning_rate: 0, decay_steps: 100, alpha: 0, "
        "warmup_target: 0.01, warmup_steps: 10}")
    assert lowered_learning_rate_fix({"optimizer_config": {"learning_rate": 0.05}}) == (
        "train:\n  optimizer: {learning_rate: 0.005}   # 10x lower")


class _Constant(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return keras.ops.convert_to_tensor(0.5)


def test_a_rate_that_reduce_lr_on_plateau_lowered_is_reported_at_the_first_nonfinite_step(tmp_path):
    """ReduceLROnPlateau halves a constant 0.01 after the second epoch of 2 steps (the first sets its best loss,
    the second does not beat it by 10); the NaN batch is step 5, in the third: the rate in effect there is
    0.005, and the report said 0.01 (the rate when `fit` started)."""
    model = compiled_mlp(0.01)
    x, y = poisoned_fit_data()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    shown = tmp_path / "shown.txt"
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=10.0)
    with open(shown, "w") as console_file:
        scope = NanScope(report=tmp_path / "r.json", console=Console(file=console_file, width=80))
        model.fit(data, steps_per_epoch=2, epochs=3, callbacks=[plateau, scope], verbose=0)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["first_nonfinite"]["step"] == NAN_STEP
    assert doc["run"]["optimizer_config"]["learning_rate"] == pytest.approx(0.005, rel=1e-6)
    assert doc["run"]["learning_rate_changed"] == {"start": pytest.approx(0.01, rel=1e-6),
                                                   "at_step": pytest.approx(0.005, rel=1e-6), "step": NAN_STEP}
    assert "lr changed  0.01 at step 0, 0.005 at step 5 (assigned during the run)" in shown.read_text()
