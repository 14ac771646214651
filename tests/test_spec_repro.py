"""`trace-steps --save-repro DIR` then `nanscope replay DIR`, through the CLI: the same step, op, layer and line."""

import json
import os
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
