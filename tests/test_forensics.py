"""Forensic replay: healthy steps stay compiled, the replayed step leaves the model as found, repros replay."""

import json
import os
import subprocess
import sys

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from nanscope.cli import app
from nanscope.forensics import localize_step
from nanscope.forensics.replay import state_variables
from nanscope.replay import replay_repro
from nanscope.run.session import open_session
from nanscope.spec.load import load_spec, parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

SPECS = Path(__file__).parent / "specs"


def test_localize_leaves_the_post_step_state_in_place():
    session = open_session(load_spec(SPECS / "exp-overflow.yaml"))
    engine = session.instrumented_step()
    x, y = session.batch(0)
    assert engine.run(0, x, y).phase == "forward"
    variables = state_variables(engine.model, engine.optimizer)
    after = [v.numpy() for v in variables]
    found = localize_step(engine, x, y)
    assert found.event.op == "Exp"
    for variable, value in zip(variables, after):
        np.testing.assert_array_equal(variable.numpy(), value)
    from tensorflow.python.framework import op_callbacks

    assert not op_callbacks.should_invoke_op_callbacks()
    assert all("call" not in layer.__dict__ for layer in engine.layers)


def test_an_op_the_callback_names_in_bytes_is_located(tmp_path):
    # TF's eager fast path hands some op types to op callbacks as bytes (b"Mean", b"Reshape"): a LayerNormalization
    # whose mean of rows at 3e37 overflows is named as the producer, where it used to raise a TypeError.
    document = {"model": {"factory": f"{SPECS / 'phase_models.py'}:layer_norm_first"},
                "data": {"factory": f"{SPECS / 'data_factories.py'}:constant_rows", "batch_size": 16,
                         "shuffle": False},
                "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.01}, "steps": 2, "seed": 0}}
    report = run_trace(parse_spec(document, source=str(tmp_path / "spec.yaml")),
                       TraceOptions(trace_path=tmp_path / "t.jsonl"))
    first = report.first_nonfinite
    assert (first.step, first.phase, first.layer, first.layer_class, first.op) == (
        0, "forward", "norm", "LayerNormalization", "Mean")


def test_save_repro_then_replay_finds_the_same_producer(tmp_path):
    report = run_trace(load_spec(SPECS / "division-by-zero.yaml"),
                       TraceOptions(trace_path=tmp_path / "t.jsonl", save_repro=tmp_path / "repro"))
    replayed = replay_repro(tmp_path / "repro")
    assert replayed.first_nonfinite.step == report.first_nonfinite.step
    assert (replayed.first_nonfinite.op, replayed.first_nonfinite.layer_class) == ("RealDiv", "RatioFeatures")
    assert replayed.recommendations[0].id == "safe-division"


def test_replay_command_prints_json(tmp_path):
    run_trace(load_spec(SPECS / "sqrt-at-zero.yaml"),
              TraceOptions(trace_path=tmp_path / "t.jsonl", save_repro=tmp_path / "repro"))
    result = CliRunner().invoke(app, ["replay", str(tmp_path / "repro"), "--json", "-"])
    document = json.loads(result.stdout[result.stdout.index("{"):])
    assert result.exit_code == 1
    assert document["schema"] == "nanscope.replay/1"
    assert (document["first_nonfinite"]["phase"], document["first_nonfinite"]["op"]) == ("backward", "SqrtGrad")


def test_verify_on_a_trace_steps_bundle_is_bad_input_that_names_the_command_that_verifies(tmp_path):
    run_trace(load_spec(SPECS / "division-by-zero.yaml"),
              TraceOptions(trace_path=tmp_path / "t.jsonl", save_repro=tmp_path / "repro"))
    assert json.loads((tmp_path / "repro" / "repro.json").read_text())["kind"] == "spec"
    result = CliRunner().invoke(app, ["replay", str(tmp_path / "repro"), "--verify"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "--verify replays fit bundles" in result.stderr and "trace-steps SPEC --verify" in result.stderr


def test_replay_of_a_folder_that_is_not_a_repro_is_bad_input(tmp_path):
    result = CliRunner().invoke(app, ["replay", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a repro folder" in result.stderr


def test_forensics_does_not_import_trace_steps():
    """The trace-steps loop calls forensics; forensics must not need it back (no import cycle)."""
    code = "import sys, nanscope.forensics, nanscope.forensics.repro; print('nanscope.run.trace' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_replay_checks_its_json_path_before_replaying(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    result = CliRunner().invoke(app, ["replay", str(tmp_path / "no-repro"),
                                      "--json", str(tmp_path / "a-file" / "r.json")])
    assert result.exit_code == 2
    assert "--json" in result.stderr and "no-repro" not in result.stderr
