"""`trace-steps --save-repro DIR` then `nanscope replay DIR`, through the CLI: the same step, op, layer and line."""

import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
from typer.testing import CliRunner

from nanscope.cli import app

SPECS = Path(__file__).parent / "specs"
SAME = ("step", "phase", "layer", "layer_class", "op", "source", "inputs", "loss")


def cli(*arguments):
    return CliRunner().invoke(app, [str(a) for a in arguments])


def test_a_mixed_float16_bundle_replays_its_step_with_the_loss_scale_it_ran_under(tmp_path):
    """Steps 0 and 1 overflow the scaled gradients and are skipped (the scale halves from 2^15); batch 4 is 40x
    larger and its float16 Exp overflows. The bundle holds the LossScaleOptimizer's own variables too."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {{factory: {SPECS / 'precision_models.py'}:exp_late_overflow}}\n"
                    f"data: {{factory: {SPECS / 'data_factories.py'}:late_spike, batch_size: 16, shuffle: false,\n"
                    "       args: {spike: 40.0, target_scale: 3.0}}\n"
                    "train: {loss: mse, optimizer: {name: sgd, learning_rate: 0.01}, steps: 6, seed: 0,\n"
                    "        mixed_precision: mixed_float16}\n")
    traced = cli("trace-steps", spec, "--save-repro", tmp_path / "repro", "--json", tmp_path / "trace.json",
                 "--trace", tmp_path / "t.jsonl")
    assert traced.exit_code == 1, traced.output
    trace = json.loads((tmp_path / "trace.json").read_text())
    with np.load(tmp_path / "repro" / "state.npz") as arrays:
        state = [arrays[f"state_{i}"] for i in range(json.loads((tmp_path / "repro" / "repro.json").read_text())
                                                            ["variables"])]
    step_4 = next(row for row in trace["steps"] if row["step"] == 4)
    assert step_4["loss_scale_before"] in [float(v) for v in state if v.shape == ()]  # the scale step 4 ran under

    result = cli("replay", tmp_path / "repro", "--json", "-")
    assert result.exit_code == 1, result.output
    replayed = json.loads(result.stdout)
    first, expected = replayed["first_nonfinite"], trace["first_nonfinite"]
    assert (first["step"], first["phase"], first["layer"], first["op"]) == (4, "forward", "exp", "Exp")
    assert {k: first[k] for k in SAME} == {k: expected[k] for k in SAME}
    assert (replayed["run"]["loss_scaling"], replayed["run"]["layer_dtypes"]) == (True, {"hidden": "float16",
                                                                                       "exp": "float16",
                                                                                       "out": "float32"})
    assert [r["id"] for r in replayed["recommendations"]] == [r["id"] for r in trace["recommendations"]]


LAYERS = """\
import keras
import tensorflow as tf


class LogGain(keras.layers.Layer):
    def build(self, input_shape):
        self.gain = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="gain")

    def call(self, x):
        return tf.math.log(x) * self.gain  # producer: log
"""
MODELS = """\
import keras

from layers import LogGain


def log_model():
    return keras.Sequential([keras.Input((4,)), LogGain(name="log_gain"), keras.layers.Dense(1, name="out")])
"""


def test_a_spec_bundle_replays_from_a_copy_of_its_folder_once_the_project_is_gone(tmp_path, monkeypatch):
    """The model factory, the layer file it imports and the data file are copied into the bundle; the spec in it
    names them relative to the bundle; the report names the user's file as in their project."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "layers.py").write_text(LAYERS)
    (project / "models.py").write_text(MODELS)
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 2.0, (64, 4)).astype(np.float32)
    x[2 * 16 + 7, 1] = -1.0  # step 2 takes the log of a negative number
    np.savez(project / "rows.npz", x=x, y=x.sum(1, keepdims=True))
    (project / "run.yaml").write_text("model: {factory: models.py:log_model}\n"
                                      "data: {path: rows.npz, batch_size: 16, shuffle: false}\n"
                                      "train: {loss: mse, optimizer: {name: adam}, steps: 4, seed: 0}\n")
    monkeypatch.chdir(tmp_path)
    traced = cli("trace-steps", "project/run.yaml", "--save-repro", "bundle", "--json", "trace.json",
                 "--trace", "t.jsonl")
    assert traced.exit_code == 1, traced.output
    expected = json.loads(Path("trace.json").read_text())["first_nonfinite"]
    line = LAYERS.splitlines().index("        return tf.math.log(x) * self.gain  # producer: log") + 1
    assert (expected["step"], expected["layer"], expected["op"], expected["source"]) == (2, "log_gain", "Log",
                                                                                         f"project/layers.py:{line}")
    document = json.loads(Path("bundle/repro.json").read_text())
    assert (document["spec"]["model"]["factory"], document["spec"]["data"]["path"]) == ("code/models.py:log_model",
                                                                                        "data/rows.npz")
    assert document["code_files"] == [{"file": "code/models.py", "origin": "project/models.py"},
                                      {"file": "code/layers.py", "origin": "project/layers.py"}]
    assert str(tmp_path) not in Path("bundle/repro.json").read_text()

    moved = shutil.copytree("bundle", tmp_path / "colleague" / "nan-step")
    shutil.rmtree("bundle")
    shutil.rmtree(project)
    monkeypatch.chdir(tmp_path / "colleague")
    monkeypatch.delitem(sys.modules, "layers", raising=False)  # a fresh process on the colleague's machine
    result = cli("replay", "nan-step", "--json", "-")
    assert result.exit_code == 1, result.output
    first = json.loads(result.stdout)["first_nonfinite"]
    assert {k: first[k] for k in SAME} == {k: expected[k] for k in SAME}
    assert "project/layers.py ran from the bundle's copy code/layers.py (the same lines)" in first["detail"]
    assert moved.is_dir()
