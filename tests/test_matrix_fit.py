"""The feature matrix for the NanScope callback in `fit` (docs/matrix.md): every cell of tests/matrix_cells.py.

Per cell: fit finishes, the report prints and its JSON is right (every step recorded, the
optimizer, the precision, the schedule's rate at the reported step, the validation loss),
and nanscope changes nothing of the user's training: the same logged losses and the same
final weights as the same seeded fit without it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest
from rich.console import Console

from matrix_cells import BATCH, CELLS, EPOCHS, ROWS, STEPS, fit_cell
from nanscope.keras import NanScope
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
HERE = Path(__file__).parent


def fit_with_and_without(cell, tmp_path, steps_per_execution=1):
    shown = tmp_path / "shown.txt"
    with open(shown, "w") as console_file:
        scope = NanScope(report=tmp_path / "report.json", console=Console(file=console_file, width=80))
        history, logged, weights, model = fit_cell(cell, tmp_path / "with", scope, steps_per_execution)
    plain_history, plain_logged, plain_weights, _ = fit_cell(cell, tmp_path / "without",
                                                             steps_per_execution=steps_per_execution)
    return scope, json.loads((tmp_path / "report.json").read_text()), shown.read_text(), model, (
        history, logged, weights), (plain_history, plain_logged, plain_weights)


def assert_same_training(seen, plain):
    (history, logged, weights), (plain_history, plain_logged, plain_weights) = seen, plain
    assert history.keys() == plain_history.keys()
    for key in history:
        np.testing.assert_allclose(history[key], plain_history[key], rtol=1e-6, err_msg=key)
    np.testing.assert_allclose(logged, plain_logged, rtol=1e-6)
    for a, b in zip(weights, plain_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


def assert_report_right(cell, doc, shown, model, steps=STEPS):
    assert doc["schema"] == "nanscope.trace/1" and doc["status"] == "healthy", (
        doc["notes"], [(r["id"], r["evidence"]) for r in doc["recommendations"]])
    assert doc["steps_run"] == steps and [s["step"] for s in doc["steps"]] == list(range(steps))
    assert not [note for note in doc["notes"] if "failed" in note or "stopped" in note], doc["notes"]
    run = doc["run"]
    assert run["optimizer"] == cell.optimizer_class
    assert run["mixed_precision"] == (cell.policy if cell.policy else None)
    assert run["loss_scaling"] == (cell.policy == "mixed_float16")
    assert [layer["name"] for layer in doc["layers"]] == [layer.name for layer in flat_layers(model)]
    schedule = run.get("learning_rate_schedule")
    given = model.optimizer.inner_optimizer if hasattr(model.optimizer, "inner_optimizer") else model.optimizer
    from nanscope.model.learning_rate import schedule_of

    if schedule_of(given) is None:
        assert schedule is None
        assert run["optimizer_config"]["learning_rate"] > 0
    else:
        assert schedule["class_name"] == type(schedule_of(given)).__name__ and schedule["step"] == steps - 1
        # The schedule at the last step's raw optimizer iteration (every apply counts, accumulated or not).
        expected = float(schedule_of(given)(steps - 1))
        assert run["optimizer_config"]["learning_rate"] == pytest.approx(expected, rel=1e-6)
    assert "nanscope" in shown and "HEALTHY" in shown
    assert max(len(line) for line in shown.splitlines()) <= 80


def flat_layers(model):
    from nanscope.engine.model_view import probed_layers

    return probed_layers(model)


@pytest.mark.parametrize("name", list(CELLS))
def test_the_callback_in_fit(name, tmp_path):
    cell = CELLS[name]
    _, doc, shown, model, seen, plain = fit_with_and_without(cell, tmp_path)
    assert_same_training(seen, plain)
    assert_report_right(cell, doc, shown, model)
    losses = np.array([step["loss"] for step in doc["steps"]], dtype=np.float64).reshape(EPOCHS, ROWS // BATCH)
    # fit's logged loss is the running mean of the step losses nanscope recorded (equal batches).
    running = np.cumsum(losses, axis=1) / np.arange(1, ROWS // BATCH + 1)
    np.testing.assert_allclose(running.ravel(), seen[1], rtol=2e-3 if cell.policy else 1e-5)
    if "val_loss" in seen[0]:
        assert doc["validation_loss"] == pytest.approx(seen[0]["val_loss"][-1], rel=1e-6)


@pytest.mark.parametrize("name", ["exponential-decay+adamw", "float16+loss-scaling+batchnorm", "other-callbacks"])
def test_the_callback_with_steps_per_execution(name, tmp_path):
    cell = CELLS[name]
    _, doc, shown, model, seen, plain = fit_with_and_without(cell, tmp_path, steps_per_execution=3)
    assert_same_training(seen, plain)
    assert_report_right(cell, doc, shown, model)
    assert doc["run"]["steps_per_execution"] == 3


def run_cell_process(name, tmp_path, how, env=None):
    return subprocess.run([sys.executable, str(HERE / "matrix_cells.py"), name, str(tmp_path), how], cwd=tmp_path,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}, capture_output=True,
                          text=True, timeout=240, check=False)


@pytest.mark.parametrize("name", ["exponential-decay+adamw", "float16+loss-scaling+batchnorm"])
def test_the_callback_under_mirrored_strategy(name, tmp_path):
    done = run_cell_process(name, tmp_path, "mirrored", {"NANSCOPE_CPU_REPLICAS": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for key in seen["history"]:
        np.testing.assert_allclose(seen["history"][key], seen["plain_history"][key], rtol=1e-6)
    assert seen["weights_equal"]
    doc = json.loads((tmp_path / "w0" / "report.json").read_text())
    assert doc["run"]["distribute"] == {"strategy": "MirroredStrategy", "replicas": 2}
    assert doc["status"] == "healthy" and doc["steps_run"] == STEPS, doc["notes"]
    assert doc["run"]["optimizer"] == CELLS[name].optimizer_class
    assert "HEALTHY" in (tmp_path / "w0.txt").read_text()


def test_the_callback_under_multi_worker_mirrored_strategy(tmp_path):
    from test_matrix_trace import two_workers

    name = "exponential-decay+adamw"
    done = two_workers([str(HERE / "matrix_cells.py"), name, str(tmp_path), "multi_worker"], tmp_path)
    for code, _, err in done:
        assert code == 0, err[-3000:]
    for _, out, _ in done:
        seen = json.loads(out.strip().splitlines()[-1])
        for key in seen["history"]:
            np.testing.assert_allclose(seen["history"][key], seen["plain_history"][key], rtol=1e-6)
        assert seen["weights_equal"]
    doc = json.loads((tmp_path / "w0" / "report.json").read_text())
    assert doc["run"]["distribute"]["strategy"] == "MultiWorkerMirroredStrategy"
    assert doc["status"] == "healthy" and doc["steps_run"] == STEPS, doc["notes"]
    assert doc["run"]["learning_rate_schedule"]["step"] == STEPS - 1
    assert not (tmp_path / "w1" / "report.json").exists()
