"""The feature matrix for `instrument`, compare-clipping, `--verify` and `replay` (docs/matrix.md).

instrument: the cell's model and optimizer in a user's own tf.function step, with and without
nanscope: the same losses and weights, a report that is right. compare-clipping, --verify and
replay run on the representative cells (schedules, AdamW, loss scaling), where the learning
rate and the optimizer's state matter most.
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

import nanscope
from matrix_cells import BATCH, CELLS, ROWS, STEPS, cell_data, dtype_policy, run_spec
from nanscope.cli import app
from nanscope.keras import NanScope
from nanscope.model.learning_rate import schedule_of
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
GUEST_CELLS = ["exponential-decay+adamw", "cosine-warmup+ema+global-clipnorm", "custom-schedule+accumulation",
               "float16+loss-scaling+batchnorm", "embedding+gru", "lstm+attention+custom-layer",
               "jit-compile+batchnorm+dropout"]


def custom_loop(cell, folder=None):
    """Train `cell` in a user's own loop (under `instrument` when `folder` is given); (losses, weights, step)."""
    keras.utils.set_random_seed(0)
    x, y = cell_data(cell)
    with dtype_policy(cell.policy):
        model = cell.model()
    optimizer = cell.optimizer()
    if cell.policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    loss_fn = keras.losses.get(cell.loss)

    @tf.function(jit_compile=cell.jit_compile)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(loss_fn(y, model(x, training=True)))
            scaled = optimizer.scale_loss(loss) if cell.policy == "mixed_float16" else loss
        optimizer.apply_gradients(zip(tape.gradient(scaled, model.trainable_variables), model.trainable_variables))
        return loss

    step = train_step
    if folder is not None:
        shown = open(folder / "shown.txt", "w")  # noqa: SIM115  (the report prints to it when the loop ends)
        step = nanscope.instrument(model, optimizer, report=folder / "report.json", verbose=1,
                                   console=Console(file=shown, width=80))(train_step)
    per_epoch, losses = ROWS // BATCH, []
    for index in range(STEPS):
        part = slice((index % per_epoch) * BATCH, (index % per_epoch + 1) * BATCH)
        losses.append(float(step(x[part], y[part])))
    return losses, [np.asarray(w) for w in model.get_weights()], step, optimizer


@pytest.mark.parametrize("name", GUEST_CELLS)
def test_instrument(name, tmp_path):
    cell = CELLS[name]
    losses, weights, step, optimizer = custom_loop(cell, tmp_path)
    report = step.nanscope.finish()
    plain_losses, plain_weights, _, _ = custom_loop(cell)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    for a, b in zip(weights, plain_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["status"] == "healthy" and doc["steps_run"] == STEPS, doc["notes"]
    assert [s["loss"] for s in doc["steps"]] == pytest.approx(losses, rel=1e-6)
    assert doc["run"]["optimizer"] == cell.optimizer_class
    assert doc["run"]["loss_scaling"] == (cell.policy == "mixed_float16")
    schedule = schedule_of(optimizer)
    if schedule is not None:
        assert doc["run"]["learning_rate_schedule"]["step"] == STEPS - 1
        assert doc["run"]["optimizer_config"]["learning_rate"] == pytest.approx(float(schedule(STEPS - 1)), rel=1e-6)
    assert report.steps_run == STEPS
    assert any(note.startswith("forensics off: the step is compiled with jit_compile=True") for note in doc["notes"]) \
        == cell.jit_compile
    shown = (tmp_path / "shown.txt").read_text()
    assert "HEALTHY" in shown and max(len(line) for line in shown.splitlines()) <= 80


@pytest.mark.parametrize("name", ["exponential-decay+adamw", "float16+loss-scaling+batchnorm"])
def test_compare_clipping(name, write_spec, tmp_path):
    result = CliRunner().invoke(app, ["compare-clipping", str(write_spec(run_spec(name))), "--strategies",
                                      "none,auto,clipnorm", "--json", str(tmp_path / "c.json")])
    assert result.exit_code == 0, result.output[-3000:]
    doc = json.loads((tmp_path / "c.json").read_text())
    by_name = {s["name"]: s for s in doc["strategies"]}
    assert by_name["none"]["steps_run"] == STEPS and by_name["none"]["first_nonfinite_step"] is None
    assert all(s["steps_run"] == STEPS for s in doc["strategies"])
    assert "failed" not in " ".join(doc.get("notes", []))


EXPLODING = {"model": {"factory": f"{os.path.dirname(__file__)}/../configs/models.py:exploding_mlp",
                       "args": {"features": 20, "units": 25}},
             "data": {"synthetic": {"kind": "regression", "samples": 256, "features": 20, "noise": 0.1, "seed": 1},
                      "batch_size": 32},
             "train": {"loss": "mse", "steps": 30, "seed": 1, "optimizer": {
                 "name": "sgd", "momentum": 0.9, "learning_rate": {
                     "class_name": "ExponentialDecay",
                     "config": {"initial_learning_rate": 0.01, "decay_steps": 100, "decay_rate": 0.5}}}}}


def test_verify_lowers_the_schedule_not_a_constant(write_spec, tmp_path):
    out = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["trace-steps", str(write_spec(EXPLODING)), "--verify", "--json", str(out)])
    assert result.exit_code == 1, result.output[-3000:]
    doc = json.loads(out.read_text())
    step = doc["first_nonfinite"]["step"]
    assert doc["run"]["learning_rate_schedule"]["step"] == step
    assert doc["run"]["optimizer_config"]["learning_rate"] == pytest.approx(0.01 * 0.5 ** (step / 100), rel=1e-6)
    lowered = next(r for r in doc["recommendations"] if r["id"] == "lower-learning-rate")
    assert [row["params"] for row in lowered["verification"]] == [
        {"learning_rate": "ExponentialDecay x 1/10"}, {"learning_rate": "ExponentialDecay x 1/100"}]
    assert lowered["verified"] is True
    assert "class_name: ExponentialDecay" in lowered["fix"] and "initial_learning_rate: 0.001" in lowered["fix"]


def exploding_fit(folder):
    """A schedule-driven fit that goes non-finite, with NanScope saving the step as a repro bundle."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, 6)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) * 300.0).astype("float32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.05, 10, 0.9),
                                                 momentum=0.9), loss="mse")
    scope = NanScope(report=folder / "fit.json", repro=folder / "bundle", verbose=0)
    model.fit(x, y, batch_size=BATCH, epochs=4, shuffle=False, verbose=0, callbacks=[scope])
    return json.loads((folder / "fit.json").read_text())


def test_replay_of_a_schedule_bundle_and_its_verify(tmp_path):
    fit = exploding_fit(tmp_path)
    step = fit["first_nonfinite"]["step"]
    assert fit["run"]["optimizer_config"]["learning_rate"] == pytest.approx(0.05 * 0.9 ** (step / 10), rel=1e-6)
    result = CliRunner().invoke(app, ["replay", str(tmp_path / "bundle"), "--verify", "--json",
                                      str(tmp_path / "replay.json")])
    assert result.exit_code == 1, result.output[-3000:]
    doc = json.loads((tmp_path / "replay.json").read_text())
    assert doc["run"]["learning_rate_schedule"]["class_name"] == "ExponentialDecay"
    assert doc["run"]["optimizer_config"]["learning_rate"] == pytest.approx(0.05 * 0.9 ** (step / 10), rel=1e-6)
    for rec in (r for r in doc["recommendations"] if r["id"] == "lower-learning-rate" and r["verification"]):
        assert [row["fix"] for row in rec["verification"]] == ["lr/10", "lr/100"]
        assert [row["params"] for row in rec["verification"]] == [
            {"learning_rate": "ExponentialDecay x 1/10"}, {"learning_rate": "ExponentialDecay x 1/100"}]
