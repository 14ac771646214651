"""Models with several inputs: x as a mapping, a list or a tf.data.Dataset, through every path of a run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from nanscope.run import trace as trace_module
from nanscope.cli import app
from nanscope.runtime import tensorflow
from nanscope.run.session import open_session
from nanscope.spec.load import parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

tf, keras = tensorflow()
MODELS = Path(__file__).parent / "specs" / "multi_input.py"
runner = CliRunner()


def spec_dict(model="by_name", steps=4, **args):
    return {
        "model": {"factory": f"{MODELS}:{model}"},
        "data": {"factory": f"{MODELS}:arrays", "args": args, "batch_size": 16, "shuffle": False},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.01}, "steps": steps, "seed": 0},
    }


def trace(tmp_path, document, **options):
    spec = parse_spec(document, source=str(tmp_path / "spec.yaml"))
    return run_trace(spec, TraceOptions(trace_path=tmp_path / "trace.jsonl", **options))


def test_a_step_on_a_mapping_of_inputs_equals_an_eager_reference(tmp_path):
    session = open_session(parse_spec(spec_dict(), source=str(tmp_path / "spec.yaml")))
    x, y = session.batch(0)
    assert isinstance(x, dict) and x["tokens"].shape == (16, 3) and x["numbers"].shape == (16, 2)
    model = session.model.keras_model
    weights = [v.numpy() for v in model.trainable_variables]
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, model(x, training=True))
    grads = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]

    record = session.instrumented_step().run(0, x, y)

    assert record.batch_rows == 16 and record.x_nonfinite == 0
    assert record.loss == pytest.approx(float(loss), rel=1e-5)
    for stats, g, w in zip(record.variables, grads, weights):
        assert stats.grad_norm == pytest.approx(np.linalg.norm(g), rel=1e-5)
        assert stats.weight_norm == pytest.approx(np.linalg.norm(w - 0.01 * g), rel=1e-5)


@pytest.mark.parametrize("model, form", [("by_name", "mapping"), ("in_order", "list"), ("by_name", "dataset")])
def test_each_form_runs_and_reports_the_input_shapes(tmp_path, model, form):
    report = trace(tmp_path, spec_dict(model, form=form))
    assert report.first_nonfinite is None and len(report.records) == 4
    expected = {"tokens": [3], "numbers": [2]} if form != "list" else [[3], [2]]
    assert report.run["input_shape"] == expected


def test_a_non_finite_input_is_named_with_its_row(tmp_path):
    report = trace(tmp_path, spec_dict(nan_row=20))
    first = report.first_nonfinite
    assert (first.step, first.phase) == (1, "data")
    assert first.detail[0].startswith("x['numbers']: 1 non-finite value(s) in feature(s) x['numbers'][1]")
    assert "dataset rows 20" in first.detail[0]


def test_chunked_and_single_step_runs_record_the_same(tmp_path, monkeypatch):
    single = trace(tmp_path / "a", spec_dict("in_order", steps=12, form="list"))
    monkeypatch.setattr(trace_module, "CHUNK_MIN_STEPS", 0)
    chunked = trace(tmp_path / "b", spec_dict("in_order", steps=12, form="list"))
    assert [r.loss for r in chunked.records] == pytest.approx([r.loss for r in single.records], rel=1e-6)
    assert [r.grad_global_norm for r in chunked.records] == pytest.approx(
        [r.grad_global_norm for r in single.records], rel=1e-6)


def test_an_input_far_from_unit_scale_is_found_and_standardised_by_verify(tmp_path):
    # 60 steps: on standardised inputs the run must learn, not only stay finite (after 30 it is still at 2.84,
    # above predicting the targets' mean, 1.73; after 60, 1.42).
    report = trace(tmp_path, spec_dict(scale=1e4, steps=60), verify=True)
    found = next(r for r in report.recommendations if r.id == "normalize-inputs")
    assert "x['tokens'][0]" in found.evidence[0]
    assert found.data["features"][:3] == ["x['tokens'][0]", "x['tokens'][1]", "x['tokens'][2]"]
    # Unfixed, the run goes non-finite at step 2; on standardised inputs all 60 steps stay finite and it learns.
    assert report.first_nonfinite is not None and report.first_nonfinite.step == 2
    assert found.verified is True
    (row,) = found.verification
    assert row["fix"] == "standardise x" and row["finite"] and row["steps_run"] == 60 and row["helped"]
    assert row["verdict"] == "trains" and row["judged_loss"] < 0.99 * row["baseline"]


def test_a_repro_of_a_mapping_of_inputs_replays(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_dict(nan_row=20)))
    result = runner.invoke(app, ["trace-steps", str(spec), "--trace", str(tmp_path / "t.jsonl"),
                                 "--save-repro", str(tmp_path / "repro")])
    assert result.exit_code == 1
    assert json.loads((tmp_path / "repro" / "repro.json").read_text())["inputs"] == ["tokens", "numbers"]
    replayed = runner.invoke(app, ["replay", str(tmp_path / "repro"), "--json", "-"])
    assert replayed.exit_code == 1
    document = json.loads(replayed.stdout)
    assert document["first_nonfinite"]["phase"] == "data"
    assert "x['numbers']" in document["first_nonfinite"]["detail"][0]


def test_inputs_of_different_lengths_are_bad_input(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_dict(numbers_rows=60)))
    result = runner.invoke(app, ["trace-steps", str(spec), "--trace", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2
    assert "x['tokens'] has 64 rows but x['numbers'] has 60" in result.stderr


def test_two_replicas_split_every_input(tmp_path):
    spec = tmp_path / "spec.yaml"
    document = spec_dict(nan_row=20)
    document["train"]["distribute"] = "mirrored"
    spec.write_text(yaml.safe_dump(document))
    env = {**os.environ, "NANSCOPE_CPU_REPLICAS": "2", "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-m", "nanscope", "trace-steps", str(spec), "--trace",
                             str(tmp_path / "t.jsonl"), "--json", "-"], env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 1, result.stderr
    first = json.loads(result.stdout)["first_nonfinite"]
    # Batch 1 holds rows 16-31: row 20 is in the first replica's half.
    assert (first["step"], first["phase"], first["replica"]) == (1, "data", 0)


def test_which_x_is_several_inputs():
    from nanscope.data.inputs import several

    tokens, numbers = np.zeros((64, 3)), np.zeros((64, 2))
    assert several({"tokens": tokens, "numbers": numbers})
    assert several([tokens, numbers], y_rows=64)
    assert several((tf.constant(tokens), tf.constant(numbers)))
    # Rows given as a list: one array, whether of numpy rows or of plain lists.
    assert not several(list(tokens), y_rows=64)
    assert not several(tokens.tolist(), y_rows=64)
    assert not several(tokens, y_rows=64)


def test_the_validation_loss_of_a_mapping_of_inputs_weights_each_batch_by_its_rows(tmp_path):
    # Batches of 24, 24 and 16 rows: each batch's mean weighs by its rows (it weighed by the number of inputs, 2).
    from nanscope.run.session import evaluate_loss

    session = open_session(parse_spec(spec_dict(), source=str(tmp_path / "spec.yaml")))
    data = session.train
    assert data.rows == 64 and isinstance(data.x, dict)
    whole = keras.losses.MeanSquaredError()(data.y, session.model.keras_model(data.x, training=False))
    assert evaluate_loss(session.instrumented_step(), data, batch_size=24) == pytest.approx(float(whole), rel=1e-5)


@pytest.mark.parametrize("form", ["array", "mapping", "tuple"])
def test_a_dataset_of_unknown_length_past_the_read_limit_is_endless_whatever_the_form_of_x(form, monkeypatch):
    # The rows read are counted, not the members of x (a mapping or tuple of two inputs counted as 2 rows).
    from nanscope.data import datasets, targets
    from nanscope.errors import DataError

    monkeypatch.setattr(datasets, "UNKNOWN_LENGTH_ROWS", 50)
    rng = np.random.default_rng(0)
    a, b, y = (rng.standard_normal((200, n)).astype(np.float32) for n in (3, 2, 1))
    x = {"array": a, "mapping": {"tokens": a, "numbers": b}, "tuple": (a, b)}[form]
    unknown = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True)
    assert int(unknown.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    rows = datasets.materialize(unknown, steps=2, batch_size=16, validation_fraction=0.0, where="spec.yaml: data")
    assert rows.endless and all(len(part) == 32 for part in [*targets.parts(rows.x), rows.y])
    with pytest.raises(DataError, match="longer than 50 rows without a known end"):
        datasets.materialize(unknown, steps=2, batch_size=16, validation_fraction=0.25, where="spec.yaml: data")
